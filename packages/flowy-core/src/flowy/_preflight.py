"""The preflight of every run: token validation, load and OCC, the decision
``evaluate_resume`` shares with ``resume``, the steps of the resume pipeline (after_load,
overlay, segment reset, run-metadata merge, resume-target policy, pointer validation),
registration of the thread in this process and its run lease.

``Runner`` (``_runner``) composes a :class:`RunPreparation`; nothing here awaits a node.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Generic, cast

from . import _tracing
from ._context import RunBindings, RunMetadata, RunMetadataInput, current_run
from ._errors import (
    ConcurrencyConflictError,
    GraphVersionMismatchError,
    HandoffAlreadyEnqueuedError,
    HandoffNotRecoverableError,
    HandoffOrphanedError,
    HandoffPendingError,
    InvalidResumePlanError,
    InvalidResumeTokenError,
    LeaseRequiredError,
    ThreadAlreadyRunningError,
    ThreadCompletedError,
    ThreadLeaseBusyError,
    ThreadNotFoundError,
    UnknownNodeError,
)
from ._events import EventSink
from ._execution import Execution
from ._graph import Graph, MigrationStep
from ._observer import LifecycleEvent, LifecycleEventType, Telemetry
from ._plan import ResumePlan, ResumeTargetPolicy
from ._results import ResumeDecision, ResumeDecisionKind
from ._segment import (
    UNREAD,
    Held,
    InvariantValidator,
    Loaded,
    Services,
    held_run,
    maybe_await,
    register_run,
    unregister_run,
)
from ._types import E, ResumeToken, S
from ._waits import Wake, merge_update, take_signal, wake_from
from .storage import Checkpointer, HandoffStatus, Lease, LeaseManager, RunStatus, Snapshot
from .storage._adapt import Merge
from .storage.dialect import validate_thread_id

if TYPE_CHECKING:
    from .storage.dialect import BaseCheckpointer

__all__ = ["AfterLoad", "RunPreparation", "StateMerge", "check_run_lease"]

logger = logging.getLogger("flowy")

StateMerge = Callable[[S, S], S]
"""``merge(loaded_state, overlay) -> state`` for ``resume(state_overlay=...)``."""

AfterLoad = Callable[[S], "S | Awaitable[S]"]
"""``after_load(state) -> state`` (sync or async), applied to every loaded state."""


@dataclass(frozen=True, slots=True)
class _Preflight(Generic[S]):
    decision: ResumeDecision
    snapshot: Snapshot[S] | None
    revision: int


def _renamed(path: list[MigrationStep], pointer: str) -> str:
    """``pointer`` after the node renames of ``path``."""
    for step in path:
        pointer = step.renames.get(pointer, pointer)
    return pointer


def check_run_lease(run_lease: object, lease_manager: LeaseManager | None) -> None:
    """Refuse a ``run_lease`` without a lease manager, or not ``(owner, ttl)``."""
    if lease_manager is None:
        raise ValueError(
            "run_lease was given but this Runner has no lease manager, so nothing would "
            "be leased; build the Runner on a Backend or pass lease_manager=..."
        )
    if (
        not isinstance(run_lease, tuple)
        or len(cast(tuple[object, ...], run_lease)) != 2
        or not isinstance(run_lease[0], str)
        or not run_lease[0]
        or isinstance(run_lease[1], bool)
        or not isinstance(run_lease[1], int | float)
        or not run_lease[1] > 0
    ):
        raise LeaseRequiredError(
            f"run_lease needs a non-empty owner and a positive ttl, got {run_lease!r:.200}"
        )


class RunPreparation(Generic[S, E]):
    """The checks and steps before a run starts; ``Runner`` composes one, built from its
    own settings, and asks it for each ``Execution`` it runs.

    Args:
        graph: the graph runs execute.
        services: what every segment of a run uses (store, leases, clock, telemetry).
        store_key: the identity of the store, with a thread id the key of a run
            registered in this process.
        run_lease: the default ``(owner, ttl)`` of a run's lease.
        after_load: applied to every loaded state before a resume uses it.
        handoff_stale_after: seconds after which a pending hand-off counts as stale.
    """

    def __init__(
        self,
        graph: Graph[S, E],
        services: Services[S, E],
        store_key: object,
        run_lease: tuple[str, float] | None,
        after_load: AfterLoad[S] | None,
        handoff_stale_after: float,
    ) -> None:
        self.graph = graph
        self.checkpointer: Checkpointer[S] | None = services.checkpointer
        self.lease_manager: LeaseManager | None = services.lease_manager
        self.run_lease = run_lease
        self.after_load = after_load
        self.handoff_stale_after = handoff_stale_after
        self.clock: Callable[[], float] = services.clock
        self.telemetry: Telemetry = services.telemetry
        self._services = services
        self._store_key = store_key

    def require_checkpointer(self, what: str) -> Checkpointer[S]:
        if self.checkpointer is None:
            raise TypeError(f"{what} needs a store: Runner(graph, backend)")
        return self.checkpointer

    @staticmethod
    def _validate_token(token: ResumeToken) -> str:
        if not isinstance(token, ResumeToken):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise InvalidResumeTokenError(
                f"expected a flowy.ResumeToken (ResumeToken.parse('thread@7') reads a printed "
                f"one), got {token!r:.200}"
            )
        thread_id = validate_thread_id(token.thread_id)
        if not isinstance(token.snapshot_revision, int) or isinstance(  # pyright: ignore[reportUnnecessaryIsInstance]
            token.snapshot_revision, bool
        ):
            raise InvalidResumeTokenError(
                f"resume token revision must be an int, got {token.snapshot_revision!r:.80}"
            )
        return thread_id

    def _decide(
        self, token: ResumeToken | None, snap: Snapshot[Any], revision: int
    ) -> ResumeDecision:
        current = ResumeToken(snap.thread_id, revision)
        if snap.handoff_status is HandoffStatus.PENDING:
            kind = ResumeDecisionKind.HANDOFF_PENDING
        elif snap.handoff_status is HandoffStatus.ORPHANED:
            kind = ResumeDecisionKind.HANDOFF_ORPHANED
        elif token is None or token.snapshot_revision != revision:
            kind = ResumeDecisionKind.STALE_TOKEN
        elif snap.status is RunStatus.COMPLETED:
            kind = ResumeDecisionKind.COMPLETED
        elif (path := self.graph.migration_path(snap.graph_version)) is None:
            kind = ResumeDecisionKind.VERSION_MISMATCH
        elif not any(step.migrate for step in path) and not self.graph.has_node(
            _renamed(path, snap.execution_pointer)
        ):
            kind = ResumeDecisionKind.UNKNOWN_NODE
        else:
            kind = ResumeDecisionKind.RESUMABLE
        return ResumeDecision(
            kind,
            snap.thread_id,
            current,
            token,
            status=snap.status,
            handoff_status=snap.handoff_status,
            execution_pointer=snap.execution_pointer,
            handoff_pending_at=snap.handoff_pending_at,
            reason=snap.reason,
        )

    async def preflight(self, token: ResumeToken, loaded: Loaded[S] = UNREAD) -> _Preflight[S]:
        """Steps 1 and 2 of every resume: validate the token, load the head (unless
        ``loaded`` is the head read with the lease), decide."""
        thread_id = self._validate_token(token)
        cp = self.require_checkpointer("resume")
        try:
            if loaded is UNREAD:
                snap, revision = await cp.load(thread_id)
            elif loaded is None:
                raise ThreadNotFoundError(thread_id)
            else:
                snap, revision = loaded
        except ThreadNotFoundError:
            return _Preflight(
                ResumeDecision(ResumeDecisionKind.NOT_FOUND, thread_id, None, token), None, 0
            )
        return _Preflight(self._decide(token, snap, revision), snap, revision)

    def _refuse(self, pre: _Preflight[S], token: ResumeToken, has_policy: bool) -> None:
        """Raise the error the decision of a resume stands for (nothing for RESUMABLE,
        nor for COMPLETED/UNKNOWN_NODE when a policy may choose a target)."""
        decision = pre.decision
        thread = f"thread {decision.thread_id!r:.200}"
        kind = decision.kind
        if kind is ResumeDecisionKind.NOT_FOUND:
            raise ThreadNotFoundError(f"no checkpoint for {thread}")
        if token.snapshot_revision == 0 or token.snapshot_revision != pre.revision:
            self.telemetry.publish(
                LifecycleEvent(
                    LifecycleEventType.RESUME_CONFLICT,
                    decision.thread_id,
                    revision=pre.revision,
                    details={"token_revision": token.snapshot_revision},
                )
            )
            raise ConcurrencyConflictError(
                f"resume token {token} is stale: {thread} is at revision {pre.revision}; "
                "call Runner.evaluate_resume(token) for the current token",
                thread_id=decision.thread_id,
                expected=token.snapshot_revision,
                actual=pre.revision,
            )
        if kind is ResumeDecisionKind.HANDOFF_PENDING:
            raise HandoffPendingError(
                f"{thread} has a pending hand-off at revision {pre.revision}; use "
                "Runner.recover_stale_handoff once it is stale"
            )
        if kind is ResumeDecisionKind.HANDOFF_ORPHANED:
            raise HandoffOrphanedError(
                f"{thread} has an orphaned hand-off at revision {pre.revision}; use "
                "Runner.recover_stale_handoff to re-enqueue it"
            )
        if kind is ResumeDecisionKind.VERSION_MISMATCH:
            assert pre.snapshot is not None
            raise self._mismatch(pre.snapshot)
        if kind is ResumeDecisionKind.COMPLETED and not has_policy:
            raise ThreadCompletedError(
                f"{thread} completed at revision {pre.revision}; there is nothing to resume "
                "(a resume_target_policy returning resume_to(node) runs part of it again on "
                "purpose)"
            )

    def _mismatch(self, snap: Snapshot[Any]) -> GraphVersionMismatchError:
        return GraphVersionMismatchError(
            f"thread {snap.thread_id!r:.200} was saved by graph version "
            f"{snap.graph_version!r}; this graph is version {self.graph.version!r} and "
            f"declares no migration from it (GraphBuilder.add_migration / rename_node). "
            "Nothing ran and nothing was written",
            thread_id=snap.thread_id,
            stored=snap.graph_version,
            current=self.graph.version,
        )

    async def migrated(self, snap: Snapshot[S]) -> Snapshot[S]:
        """``snap`` brought to this graph's version by the declared migrations (itself if
        it is on this version); ``GraphVersionMismatchError`` if none covers it."""
        path = self.graph.migration_path(snap.graph_version)
        if path is None:
            raise self._mismatch(snap)
        if not path:
            return snap
        state: Any = snap.state
        pointer, on_timeout = snap.execution_pointer, snap.on_timeout
        for step in path:
            if step.migrate is not None:
                state, pointer = cast(
                    "tuple[Any, str]", await maybe_await(step.migrate(state, pointer))
                )
            pointer = step.renames.get(pointer, pointer)
            on_timeout = step.renames.get(on_timeout, on_timeout)
        return replace(
            snap,
            state=cast(S, state),
            execution_pointer=pointer,
            on_timeout=on_timeout,
            graph_version=self.graph.version,
        )

    def recovery_decision(
        self,
        snap: Snapshot[Any],
        revision: int,
        stale_after: float | None,
        force: bool,
    ) -> ResumeDecision:
        decision = self._decide(None, snap, revision)
        if decision.kind is ResumeDecisionKind.VERSION_MISMATCH:
            raise self._mismatch(snap)
        status = snap.handoff_status
        ttl = self.handoff_stale_after if stale_after is None else stale_after
        if status is HandoffStatus.ORPHANED:
            return decision
        if status is HandoffStatus.PENDING:
            at = snap.handoff_pending_at
            if at is None or at <= 0 or self.clock() - at >= ttl:
                return decision
            raise HandoffPendingError(
                f"hand-off of thread {snap.thread_id!r:.200} is pending since "
                f"{self.clock() - at:.1f}s (stale after {ttl:.0f}s); it may still be in "
                "flight: retry after the TTL"
            )
        if status is HandoffStatus.ENQUEUED:
            if force:
                return replace(decision, kind=ResumeDecisionKind.RESUMABLE)
            raise HandoffAlreadyEnqueuedError(
                f"hand-off of thread {snap.thread_id!r:.200} is already enqueued at revision "
                f"{revision}; pass force_reenqueue=True if its outbox message is known lost"
            )
        raise HandoffNotRecoverableError(
            f"thread {snap.thread_id!r:.200} has no hand-off to recover (status {status.value!r})"
        )

    def _register(self, thread_id: str) -> tuple[object, str]:
        key = (self._store_key, thread_id)
        if not register_run(key):
            raise ThreadAlreadyRunningError(
                f"thread {thread_id!r:.200} is already running in this process; wait for it "
                "or stop it before starting or resuming it again"
            )
        return key

    async def _acquire(
        self, thread_id: str, run_lease: tuple[str, float] | None
    ) -> tuple[Lease | None, Loaded[S]]:
        """The run's lease (``None``: the runner takes none) and, where the store reads
        the head in the same round trip (``Services.acquire_with_load``), the head it
        read (``None``: no thread); :data:`UNREAD` when the head is still to load."""
        if run_lease is not None:
            check_run_lease(run_lease, self.lease_manager)
        if self.lease_manager is None:
            return None, UNREAD
        run_lease = run_lease or self.run_lease
        if run_lease is None:
            raise LeaseRequiredError(
                "this Runner has a lease manager, so start/resume/stream need "
                "run_lease=(owner, ttl_seconds), e.g. run_lease=('worker-1', 30.0)"
            )
        owner, ttl = run_lease
        held = held_run.get()
        if (
            held is not None
            and not held.taken
            and held.thread_id == thread_id
            and held.lease.owner == owner
        ):
            held.taken = True
            return held.lease, held.loaded
        tracing = _tracing.active()
        if tracing is None:
            return await self._take(thread_id, owner, ttl)
        started, outcome = time.perf_counter(), "acquired"
        try:
            return await self._take(thread_id, owner, ttl)
        except ThreadLeaseBusyError:
            outcome = "busy"
            raise
        except BaseException:
            outcome = "error"
            raise
        finally:
            tracing.lease(thread_id, time.perf_counter() - started, outcome)

    async def hold(
        self, token: ResumeToken, run_lease: tuple[str, float]
    ) -> tuple[Held[S], ResumeDecision]:
        """Take the run lease on ``token``'s thread and read its head, in one round trip
        where the store can (``Services.acquire_with_load``), and decide on ``token``
        from that head: what a worker does before it resumes a hand-off, so the
        resume reads nothing again (:class:`Held`). ``ThreadLeaseBusyError`` when a
        live lease holds the thread."""
        thread_id = self._validate_token(token)
        lease, loaded = await self._acquire(thread_id, run_lease)
        assert lease is not None
        held: Held[S] = Held(thread_id, lease, loaded)
        try:
            pre = await self.preflight(token, loaded)
        except BaseException:
            await self.let_go(held)
            raise
        held.loaded = None if pre.snapshot is None else (pre.snapshot, pre.revision)
        return held, pre.decision

    async def let_go(self, held: Held[S]) -> None:
        """Release ``held``'s lease unless a resume took it over."""
        if held.taken:
            return
        held.taken = True
        assert self.lease_manager is not None
        await self.lease_manager.release(held.lease)

    async def _take(self, thread_id: str, owner: str, ttl: float) -> tuple[Lease, Loaded[S]]:
        if self._services.acquire_with_load:
            cp = cast("BaseCheckpointer[S]", self.checkpointer)
            return await cp.acquire_and_load(thread_id, owner, ttl)
        assert self.lease_manager is not None
        return await self.lease_manager.acquire(thread_id, owner, ttl), UNREAD

    async def prepare_start(
        self,
        thread_id: str,
        state: S,
        bindings: RunBindings | None,
        run_lease: tuple[str, float] | None,
        metadata: dict[str, Any] | None,
        invariant: InvariantValidator[S] | None,
        sink: EventSink[S, E] | None,
    ) -> Execution[S, E]:
        validate_thread_id(thread_id)
        key = self._register(thread_id)
        lease: Lease | None = None
        try:
            lease, loaded = await self._acquire(thread_id, run_lease)
            if self.checkpointer is not None:
                try:
                    if loaded is UNREAD:
                        _, revision = await self.checkpointer.load(thread_id)
                    elif loaded is None:
                        raise ThreadNotFoundError(thread_id)
                    else:
                        revision = loaded[1]
                except ThreadNotFoundError:
                    pass
                else:
                    raise ConcurrencyConflictError(
                        f"thread {thread_id!r:.200} already exists at revision {revision}; "
                        "resume it with its resume token (Runner.evaluate_resume gives the "
                        "current one)",
                        thread_id=thread_id,
                        expected=0,
                        actual=revision,
                    )
        except BaseException:
            await self._abort(key, lease)
            raise
        meta = RunMetadata(
            thread_id=thread_id,
            budget_limits=self.graph.budgets,
            metadata=dict(metadata or {}),
            bindings=bindings if bindings is not None else RunBindings(),
        )
        ttl = (run_lease or self.run_lease or ("", 0.0))[1]
        return Execution(
            self._services, key, state, self.graph.entry, 0, meta, lease, ttl, invariant, sink
        )

    async def prepare_resume(
        self,
        token: ResumeToken,
        overlay: S | Mapping[str, Any] | None,
        merge: StateMerge[S] | None,
        bindings: RunBindings | None,
        run_metadata: RunMetadataInput | None,
        policy: ResumeTargetPolicy[S] | None,
        invariant: InvariantValidator[S] | None,
        run_lease: tuple[str, float] | None,
        sink: EventSink[S, E] | None,
    ) -> Execution[S, E]:
        # 1. token validation
        thread_id = self._validate_token(token)
        self.require_checkpointer("resume")
        key = self._register(thread_id)
        lease: Lease | None = None
        try:
            lease, loaded = await self._acquire(thread_id, run_lease)
            # 2. load + OCC (the preflight evaluate_resume shares)
            pre = await self.preflight(token, loaded)
            self._refuse(pre, token, policy is not None)
            snap, revision = pre.snapshot, pre.revision
            assert snap is not None
            lineage = (snap.parent_thread_id, snap.parent_revision)
            snap = await self.migrated(snap)
            # The run context exists from here on: after_load, the overlay merge and the
            # policy may read run_metadata() and binding().
            meta = RunMetadata(
                thread_id=thread_id,
                segment=snap.segment + 1,
                total_steps=snap.total_steps,
                budget_counts=dict(snap.budget_counts),
                budget_limits=self.graph.budgets,
                metadata=dict(snap.metadata),
                bindings=bindings if bindings is not None else RunBindings(),
                retry_counts=dict(snap.retry_counts),
            )
            cursors = dict(snap.signal_cursors)
            ctx = current_run.set(meta)
            try:
                state = snap.state
                # 3. after_load interceptor
                if self.after_load is not None:
                    state = cast(S, await maybe_await(self.after_load(state)))
                # 3b. a waiting run wakes: its signal (merged like an overlay), or its
                # timeout route once the deadline passed
                pointer = snap.execution_pointer
                nested_wake: tuple[Any, bool] | None = None
                if snap.status is RunStatus.WAITING:
                    woke = await self._wake(snap)
                    if snap.nested:  # the wait is inside a subgraph: it takes the signal
                        nested_wake = (woke.signal, woke.timed_out)
                    else:
                        pointer = woke.pointer
                        if woke.signal is not None:
                            state = await take_signal(
                                self.graph, state, woke.signal, cursors, self._merge()
                            )
                # 4. state overlay
                if overlay is not None:
                    state = self.overlay(state, overlay, merge)
                # 5. segment reset: step_count starts at 0, budget counts kept (above)
                # 6. run-metadata merge: given budget counts replace the stored ones
                if run_metadata is not None:
                    meta.budget_counts.update(run_metadata.budget_counts)
                    meta.metadata.update(run_metadata.metadata)
                # 7. resume-target policy
                if policy is not None:
                    planned = cast(tuple[S, object], await maybe_await(policy(state, pointer)))
                    state, plan = planned
                    pointer = self._apply_plan(plan, pointer)
            finally:
                current_run.reset(ctx)
            # 8. pointer validation
            if not pointer or not self.graph.has_node(pointer):
                raise UnknownNodeError(
                    f"thread {thread_id!r:.200} cannot resume at {pointer!r}: not a node of "
                    f"this graph (known: {sorted(self.graph.nodes)}); a resume_target_policy "
                    "can choose another node"
                )
        except BaseException:
            await self._abort(key, lease)
            raise
        ttl = (run_lease or self.run_lease or ("", 0.0))[1]
        ex = Execution(
            self._services,
            key,
            state,
            pointer,
            revision,
            meta,
            lease,
            ttl,
            invariant,
            sink,
            cursors,
            lineage,
        )
        if snap.nested and pointer == snap.nested.get("node"):
            ex.nested, ex.nested_wake = dict(snap.nested), nested_wake
        held = held_run.get()
        if held is not None and held.taken and held.lease is lease:
            ex.held = held
        return ex

    def overlay(self, state: S, overlay: object, merge: StateMerge[S] | None) -> S:
        """Step 4: ``merge(state, overlay)`` if given; a mapping of fields into a
        dataclass, msgspec Struct, pydantic model or TypedDict state, validated by the
        store's codec; else the graph's reducer."""
        if merge is not None:
            return merge(state, cast(S, overlay))
        return merge_update(self.graph, state, overlay, self._merge())

    def _merge(self) -> Merge | None:
        """The store codec's ``merge`` (validates merged fields), if it has one."""
        store = self._services.store
        return store.merge if store is not None else None

    async def _wake(self, snap: Snapshot[S]) -> Wake:
        """Where the waiting head ``snap`` goes on (its signal, or its timeout route)."""
        store = self._services.store
        if store is None:
            return await wake_from(None, "NoneType", snap, self.clock())
        name = type(store.backend.checkpointer).__name__
        return await wake_from(store.durable, name, snap, self.clock())

    def _apply_plan(self, plan: object, pointer: str) -> str:
        if not isinstance(plan, ResumePlan) or plan.empty:
            raise InvalidResumePlanError(
                f"resume-target policy returned {plan!r:.200}; return flowy.resume_current() "
                "or flowy.resume_to(node)"
            )
        if plan.target is not None:
            if not self.graph.has_node(plan.target):
                raise InvalidResumePlanError(
                    f"resume-target policy chose unknown node {plan.target!r}; known nodes: "
                    f"{sorted(self.graph.nodes)}"
                )
            return plan.target
        return pointer

    async def _abort(self, key: tuple[object, str], lease: Lease | None) -> None:
        unregister_run(key)
        if lease is not None and self.lease_manager is not None:
            try:
                await asyncio.shield(self.lease_manager.release(lease))
            except Exception as exc:  # noqa: BLE001 - the lease expires anyway; the caller's error matters
                # caller's own error is the one to report
                logger.warning("flowy: releasing lease of %r failed: %s", lease.thread_id, exc)
