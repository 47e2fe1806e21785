"""The Runner: the only place that awaits nodes and storage.

``Runner.start`` / ``Runner.resume`` run a segment to its end and return the
authoritative ``RunResult``; ``stream`` / ``resume_stream`` do the same in a task and
hand back a ``StreamHandle``. The resume preflight follows the specification's order:
token validation → load + OCC → after_load → overlay → segment reset (budget counts kept)
→ run-metadata merge → resume-target policy → pointer validation → execute.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, Generic, Literal, Protocol, cast

from ._checkpoint import (
    Checkpointer,
    FencingCheckpointer,
    HandoffIntent,
    HandoffOutbox,
    HandoffStatus,
    Lease,
    LeaseManager,
    ResumeToken,
    RunStatus,
    Snapshot,
    TransactionalCheckpointer,
    TransactionalHandoffOutbox,
    new_write_id,
    validate_thread_id,
)
from ._context import RunBindings, RunMetadata, RunMetadataInput, current_run
from ._directives import Directive, DirectiveKind
from ._errors import (
    CheckpointSkippedError,
    ConcurrencyConflictError,
    HandoffAlreadyEnqueuedError,
    HandoffEnqueueFailedError,
    HandoffNotRecoverableError,
    HandoffOrphanedError,
    HandoffPatchFailedError,
    HandoffPendingError,
    InvalidResumePlanError,
    InvalidResumeTokenError,
    LeaseLostError,
    LeaseRequiredError,
    ThreadAlreadyRunningError,
    ThreadNotFoundError,
    UnknownNodeError,
)
from ._events import EventType, RunEvent, StreamHandle
from ._graph import CheckpointPolicy, Graph
from ._guard import LeaseGuardCheckpointer
from ._observer import (
    HandoffMetricStatus,
    LifecycleEvent,
    LifecycleEventType,
    count_handoff,
    publish,
)
from ._plan import ResumePlan, ResumeTargetPolicy
from ._results import (
    HandoffRecoveryResult,
    Reason,
    ResumeDecision,
    ResumeDecisionKind,
    RunResult,
)
from ._saving import durable_save
from ._types import E, S

__all__ = ["DEFAULT_HANDOFF_STALE_AFTER", "InvariantValidator", "Runner", "StateMerge"]

logger = logging.getLogger("flowy")

DEFAULT_HANDOFF_STALE_AFTER = 300.0
"""Seconds after which a pending hand-off counts as stale (5 minutes)."""

StateMerge = Callable[[S, S], S]
"""``merge(loaded_state, overlay) -> state`` for ``resume(state_overlay=...)``."""

InvariantValidator = Callable[[S], "Awaitable[None] | None"]
"""Called with the state after every step; raising fails the run (invariant_violation)."""

AfterLoad = Callable[[S], "S | Awaitable[S]"]

_CANCEL_SAVE_TIMEOUT = 10.0

# Threads running in this process, keyed by (store identity, thread id).
_running: set[tuple[int, str]] = set()


class _Stop(Exception):
    """Internal: ends the execution loop with a finished result."""

    def __init__(self, result: RunResult[Any, Any]) -> None:
        self.result = result


async def _maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


def _is_transactional(obj: object, protocol: type) -> bool:
    """True if ``obj`` implements ``protocol``; wrappers (the lease guard, fault
    injectors) say whether the object they wrap does through a ``transactional`` flag."""
    flag = getattr(obj, "transactional", None)
    if isinstance(flag, bool):
        return flag
    return isinstance(obj, protocol)


class Runner(Generic[S, E]):
    """Runs a compiled graph against a checkpointer.

    ``lease_manager``: with one, every start/resume/stream needs ``run_lease=(owner,
    ttl)``; the lease is renewed about every ttl/3 and released after the terminal save.
    A checkpointer that does not fence leases of ``lease_manager`` natively is wrapped in
    a ``LeaseGuardCheckpointer`` (safe within one process only).
    ``handoff_outbox``: where ``handoff()`` puts intents (transactionally when both the
    checkpointer and the outbox support it; otherwise with the three-phase FSM).
    ``after_load``: a state interceptor applied to every loaded snapshot's state.
    """

    def __init__(
        self,
        graph: Graph[S, E],
        checkpointer: Checkpointer[S] | None = None,
        *,
        lease_manager: LeaseManager | None = None,
        handoff_outbox: HandoffOutbox | None = None,
        after_load: AfterLoad[S] | None = None,
        handoff_stale_after: float = DEFAULT_HANDOFF_STALE_AFTER,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.graph = graph
        self._store_key = id(checkpointer) if checkpointer is not None else id(self)
        if (
            lease_manager is not None
            and checkpointer is not None
            and not (
                isinstance(checkpointer, FencingCheckpointer) and checkpointer.fences(lease_manager)
            )
        ):
            checkpointer = LeaseGuardCheckpointer(checkpointer, lease_manager)
        self.checkpointer: Checkpointer[S] | None = checkpointer
        self.lease_manager = lease_manager
        self.handoff_outbox = handoff_outbox
        self.after_load = after_load
        self.handoff_stale_after = handoff_stale_after
        self.clock = clock

    # ------------------------------------------------------------------ public API
    async def start(
        self,
        thread_id: str,
        state: S,
        *,
        bindings: RunBindings | None = None,
        run_lease: tuple[str, float] | None = None,
        metadata: dict[str, Any] | None = None,
        invariant_validator: InvariantValidator[S] | None = None,
    ) -> RunResult[S, E]:
        """Run a new thread from the entry node until it finishes, suspends or hands off.

        Raises before running anything: ``InvalidThreadIdError``,
        ``ThreadAlreadyRunningError``, ``LeaseRequiredError``, ``ThreadLeaseBusyError``,
        ``ConcurrencyConflictError`` (the thread already exists: resume it instead).
        """
        ex = await self._prepare_start(
            thread_id, state, bindings, run_lease, metadata, invariant_validator, None
        )
        return await ex.run()

    async def stream(
        self,
        thread_id: str,
        state: S,
        *,
        bindings: RunBindings | None = None,
        run_lease: tuple[str, float] | None = None,
        metadata: dict[str, Any] | None = None,
        invariant_validator: InvariantValidator[S] | None = None,
        max_buffer: int = 1024,
    ) -> StreamHandle[S, E]:
        """Like ``start`` but run in a task and return a ``StreamHandle`` of events."""
        handle: StreamHandle[S, E] = StreamHandle(thread_id, max_buffer=max_buffer)
        ex = await self._prepare_start(
            thread_id, state, bindings, run_lease, metadata, invariant_validator, handle
        )
        ex.launch()
        return handle

    async def resume(
        self,
        token: ResumeToken,
        *,
        state_overlay: S | None = None,
        merge: StateMerge[S] | None = None,
        bindings: RunBindings | None = None,
        run_metadata: RunMetadataInput | None = None,
        resume_target_policy: ResumeTargetPolicy[S] | None = None,
        invariant_validator: InvariantValidator[S] | None = None,
        run_lease: tuple[str, float] | None = None,
    ) -> RunResult[S, E]:
        """Resume the snapshot ``token`` names, if it is still the thread's head.

        ``state_overlay`` is merged into the loaded state with ``merge`` (default: the
        graph's reducer). Raises before running anything: ``InvalidResumeTokenError``,
        ``ConcurrencyConflictError`` (stale or zero revision: see ``evaluate_resume``),
        ``ThreadNotFoundError``, ``HandoffPendingError``, ``HandoffOrphanedError``,
        ``InvalidResumePlanError``, ``UnknownNodeError``, lease errors.
        """
        ex = await self._prepare_resume(
            token,
            state_overlay,
            merge,
            bindings,
            run_metadata,
            resume_target_policy,
            invariant_validator,
            run_lease,
            None,
        )
        return await ex.run()

    async def resume_stream(
        self,
        token: ResumeToken,
        *,
        state_overlay: S | None = None,
        merge: StateMerge[S] | None = None,
        bindings: RunBindings | None = None,
        run_metadata: RunMetadataInput | None = None,
        resume_target_policy: ResumeTargetPolicy[S] | None = None,
        invariant_validator: InvariantValidator[S] | None = None,
        run_lease: tuple[str, float] | None = None,
        max_buffer: int = 1024,
    ) -> StreamHandle[S, E]:
        """Like ``resume`` but run in a task and return a ``StreamHandle`` of events."""
        handle: StreamHandle[S, E] = StreamHandle(token.thread_id, max_buffer=max_buffer)
        ex = await self._prepare_resume(
            token,
            state_overlay,
            merge,
            bindings,
            run_metadata,
            resume_target_policy,
            invariant_validator,
            run_lease,
            handle,
        )
        ex.launch()
        return handle

    async def evaluate_resume(self, token: ResumeToken) -> ResumeDecision:
        """The preflight decision for ``token`` with the current core-issued token.

        Never raises for stale or hand-off states: they are decision kinds.
        """
        thread_id = self._validate_token(token)
        cp = self._require_checkpointer("evaluate_resume")
        try:
            snap, revision = await cp.load(thread_id)
        except ThreadNotFoundError:
            return ResumeDecision(ResumeDecisionKind.NOT_FOUND, thread_id, None, token)
        return self._decide(token, snap, revision)

    async def evaluate_handoff_recovery(
        self,
        thread_id: str,
        *,
        stale_after: float | None = None,
        force_reenqueue: bool = False,
    ) -> ResumeDecision:
        """Decide whether ``thread_id``'s hand-off may be recovered now.

        Returns the decision for an orphaned hand-off, a stale pending one (an empty
        pending-at is stale), or an enqueued one with ``force_reenqueue``. Raises
        ``HandoffPendingError`` (fresh pending), ``HandoffAlreadyEnqueuedError``,
        ``HandoffNotRecoverableError`` (no hand-off), ``ThreadNotFoundError``.
        """
        validate_thread_id(thread_id)
        cp = self._require_checkpointer("evaluate_handoff_recovery")
        snap, revision = await cp.load(thread_id)
        return self._recovery_decision(snap, revision, stale_after, force_reenqueue)

    async def recover_stale_handoff(
        self,
        thread_id: str,
        *,
        stale_after: float | None = None,
        force_reenqueue: bool = False,
    ) -> HandoffRecoveryResult:
        """Re-enqueue an orphaned or stale pending hand-off (or, forced, an enqueued one).

        Always the three-phase path: patch enqueued → enqueue → on failure patch orphaned
        (then ``HandoffEnqueueFailedError`` with the retry token). Does not take a run
        lease: run it from a single leader (``flowy.Worker`` does).
        """
        cp = self._require_checkpointer("recover_stale_handoff")
        if self.handoff_outbox is None:
            raise TypeError("recover_stale_handoff needs Runner(handoff_outbox=...)")
        validate_thread_id(thread_id)
        snap, revision = await cp.load(thread_id)
        decision = self._recovery_decision(snap, revision, stale_after, force_reenqueue)
        pending = replace(snap, handoff_pending_at=snap.handoff_pending_at or self.clock())
        try:
            token = await _three_phase_tail(
                cp, self.handoff_outbox, pending, revision, None, self.clock
            )
        except HandoffEnqueueFailedError as exc:
            publish(
                LifecycleEvent(
                    LifecycleEventType.HANDOFF_RECOVERY_FAILED,
                    thread_id,
                    revision=revision,
                    error=str(exc),
                )
            )
            raise
        publish(
            LifecycleEvent(
                LifecycleEventType.HANDOFF_RECOVERED, thread_id, revision=token.snapshot_revision
            )
        )
        return HandoffRecoveryResult(
            decision=decision,
            resume_token=token,
            snapshot_revision=token.snapshot_revision,
            recovered=True,
            handoff_status=HandoffStatus.ENQUEUED,
        )

    # ------------------------------------------------------------------ internals
    def _require_checkpointer(self, what: str) -> Checkpointer[S]:
        if self.checkpointer is None:
            raise TypeError(f"{what} needs a checkpointer: Runner(graph, checkpointer)")
        return self.checkpointer

    @staticmethod
    def _validate_token(token: ResumeToken) -> str:
        if not isinstance(token, ResumeToken):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise InvalidResumeTokenError(f"expected a flowy.ResumeToken, got {token!r}")
        thread_id = validate_thread_id(token.thread_id)
        if not isinstance(token.snapshot_revision, int) or isinstance(  # pyright: ignore[reportUnnecessaryIsInstance]
            token.snapshot_revision, bool
        ):
            raise InvalidResumeTokenError(
                f"resume token revision must be an int, got {token.snapshot_revision!r}"
            )
        return thread_id

    @staticmethod
    def _decide(token: ResumeToken | None, snap: Snapshot[Any], revision: int) -> ResumeDecision:
        current = ResumeToken(snap.thread_id, revision)
        if snap.handoff_status is HandoffStatus.PENDING:
            kind = ResumeDecisionKind.HANDOFF_PENDING
        elif snap.handoff_status is HandoffStatus.ORPHANED:
            kind = ResumeDecisionKind.HANDOFF_ORPHANED
        elif token is not None and token.snapshot_revision == revision:
            kind = ResumeDecisionKind.RESUMABLE
        else:
            kind = ResumeDecisionKind.STALE_TOKEN
        return ResumeDecision(
            kind,
            snap.thread_id,
            current,
            token,
            status=snap.status,
            handoff_status=snap.handoff_status,
            execution_pointer=snap.execution_pointer,
            handoff_pending_at=snap.handoff_pending_at,
        )

    def _recovery_decision(
        self,
        snap: Snapshot[Any],
        revision: int,
        stale_after: float | None,
        force: bool,
    ) -> ResumeDecision:
        decision = self._decide(None, snap, revision)
        status = snap.handoff_status
        ttl = self.handoff_stale_after if stale_after is None else stale_after
        if status is HandoffStatus.ORPHANED:
            return decision
        if status is HandoffStatus.PENDING:
            at = snap.handoff_pending_at
            if at is None or at <= 0 or self.clock() - at >= ttl:
                return decision
            raise HandoffPendingError(
                f"hand-off of thread {snap.thread_id!r} is pending since "
                f"{self.clock() - at:.1f}s (stale after {ttl:.0f}s); it may still be in "
                "flight: retry after the TTL"
            )
        if status is HandoffStatus.ENQUEUED:
            if force:
                return replace(decision, kind=ResumeDecisionKind.RESUMABLE)
            raise HandoffAlreadyEnqueuedError(
                f"hand-off of thread {snap.thread_id!r} is already enqueued at revision "
                f"{revision}; pass force_reenqueue=True if its outbox message is known lost"
            )
        raise HandoffNotRecoverableError(
            f"thread {snap.thread_id!r} has no hand-off to recover (status {status.value!r})"
        )

    def _register(self, thread_id: str) -> tuple[int, str]:
        key = (self._store_key, thread_id)
        if key in _running:
            raise ThreadAlreadyRunningError(
                f"thread {thread_id!r} is already running in this process; wait for it or "
                "stop it before starting or resuming it again"
            )
        _running.add(key)
        return key

    async def _acquire(self, thread_id: str, run_lease: tuple[str, float] | None) -> Lease | None:
        if self.lease_manager is None:
            return None
        if run_lease is None:
            raise LeaseRequiredError(
                "this Runner has a lease manager, so start/resume/stream need "
                "run_lease=(owner, ttl_seconds), e.g. run_lease=('worker-1', 30.0)"
            )
        owner, ttl = run_lease
        if not owner or ttl <= 0:
            raise LeaseRequiredError(
                f"run_lease needs a non-empty owner and a positive ttl, got {run_lease!r}"
            )
        return await self.lease_manager.acquire(thread_id, owner, ttl)

    async def _prepare_start(
        self,
        thread_id: str,
        state: S,
        bindings: RunBindings | None,
        run_lease: tuple[str, float] | None,
        metadata: dict[str, Any] | None,
        invariant: InvariantValidator[S] | None,
        handle: StreamHandle[S, E] | None,
    ) -> _Execution[S, E]:
        validate_thread_id(thread_id)
        key = self._register(thread_id)
        lease: Lease | None = None
        try:
            lease = await self._acquire(thread_id, run_lease)
            if self.checkpointer is not None:
                try:
                    _, revision = await self.checkpointer.load(thread_id)
                except ThreadNotFoundError:
                    pass
                else:
                    raise ConcurrencyConflictError(
                        f"thread {thread_id!r} already exists at revision {revision}; resume "
                        "it with its resume token (Runner.evaluate_resume gives the current one)",
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
        return _Execution(
            self, key, state, self.graph.entry, 0, meta, lease, run_lease, invariant, handle
        )

    async def _prepare_resume(
        self,
        token: ResumeToken,
        overlay: S | None,
        merge: StateMerge[S] | None,
        bindings: RunBindings | None,
        run_metadata: RunMetadataInput | None,
        policy: ResumeTargetPolicy[S] | None,
        invariant: InvariantValidator[S] | None,
        run_lease: tuple[str, float] | None,
        handle: StreamHandle[S, E] | None,
    ) -> _Execution[S, E]:
        # 1. token validation
        thread_id = self._validate_token(token)
        cp = self._require_checkpointer("resume")
        key = self._register(thread_id)
        lease: Lease | None = None
        try:
            lease = await self._acquire(thread_id, run_lease)
            # 2. load + OCC
            snap, revision = await cp.load(thread_id)
            if token.snapshot_revision == 0 or token.snapshot_revision != revision:
                publish(
                    LifecycleEvent(
                        LifecycleEventType.RESUME_CONFLICT,
                        thread_id,
                        revision=revision,
                        details={"token_revision": token.snapshot_revision},
                    )
                )
                raise ConcurrencyConflictError(
                    f"resume token {token} is stale: thread {thread_id!r} is at revision "
                    f"{revision}; call Runner.evaluate_resume(token) for the current token",
                    thread_id=thread_id,
                    expected=token.snapshot_revision,
                    actual=revision,
                )
            if snap.handoff_status is HandoffStatus.PENDING:
                raise HandoffPendingError(
                    f"thread {thread_id!r} has a pending hand-off at revision {revision}; "
                    "use Runner.recover_stale_handoff once it is stale"
                )
            if snap.handoff_status is HandoffStatus.ORPHANED:
                raise HandoffOrphanedError(
                    f"thread {thread_id!r} has an orphaned hand-off at revision {revision}; "
                    "use Runner.recover_stale_handoff to re-enqueue it"
                )
            state = snap.state
            # 3. after_load interceptor
            if self.after_load is not None:
                state = cast(S, await _maybe_await(self.after_load(state)))
            # 4. state overlay
            if overlay is not None:
                state = (merge or self.graph.reducer)(state, overlay)
            # 5. segment reset (budget counts kept)
            budget_counts = dict(snap.budget_counts)
            metadata: dict[str, Any] = dict(snap.metadata)
            # 6. run-metadata merge
            if run_metadata is not None:
                for name, n in run_metadata.budget_counts.items():
                    budget_counts[name] = budget_counts.get(name, 0) + n
                metadata.update(run_metadata.metadata)
            # 7. resume-target policy
            pointer = snap.execution_pointer
            if policy is not None:
                planned = cast(tuple[S, object], await _maybe_await(policy(state, pointer)))
                state, plan = planned
                pointer = self._apply_plan(plan, pointer)
            # 8. pointer validation
            if not pointer or not self.graph.has_node(pointer):
                raise UnknownNodeError(
                    f"thread {thread_id!r} cannot resume at {pointer!r}: not a node of this "
                    f"graph (known: {sorted(self.graph.nodes)})"
                )
        except BaseException:
            await self._abort(key, lease)
            raise
        meta = RunMetadata(
            thread_id=thread_id,
            segment=snap.segment + 1,
            total_steps=snap.total_steps,
            budget_counts=budget_counts,
            budget_limits=self.graph.budgets,
            metadata=metadata,
            bindings=bindings if bindings is not None else RunBindings(),
        )
        return _Execution(
            self, key, state, pointer, revision, meta, lease, run_lease, invariant, handle
        )

    def _apply_plan(self, plan: object, pointer: str) -> str:
        if not isinstance(plan, ResumePlan) or plan.empty:
            raise InvalidResumePlanError(
                f"resume-target policy returned {plan!r}; return flowy.resume_current() "
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

    async def _abort(self, key: tuple[int, str], lease: Lease | None) -> None:
        _running.discard(key)
        if lease is not None and self.lease_manager is not None:
            try:
                await asyncio.shield(self.lease_manager.release(lease))
            except Exception as exc:
                logger.warning("flowy: releasing lease of %r failed: %s", lease.thread_id, exc)


async def _three_phase_tail(
    cp: Checkpointer[Any],
    outbox: HandoffOutbox,
    pending: Snapshot[Any],
    pending_revision: int,
    lease: Lease | None,
    clock: Callable[[], float],
) -> ResumeToken:
    """Phases 2 and 3 of the hand-off FSM from a saved pending snapshot: patch enqueued,
    enqueue the intent; on enqueue failure patch orphaned. Returns the committed token."""
    thread_id = pending.thread_id
    enqueued = replace(
        pending,
        status=RunStatus.HANDOFF,
        handoff_status=HandoffStatus.ENQUEUED,
        write_id=new_write_id(),
        updated_at=clock(),
    )
    try:
        committed = await durable_save(cp, pending_revision, enqueued, lease=lease)
    except LeaseLostError:
        raise
    except Exception as exc:
        count_handoff(HandoffMetricStatus.PATCH_ENQUEUED_FAILED)
        raise HandoffPatchFailedError(
            f"hand-off of thread {thread_id!r}: saving status enqueued failed ({exc}); the "
            f"snapshot stays pending at revision {pending_revision} and is recoverable "
            "after the stale TTL"
        ) from exc
    token = ResumeToken(thread_id, committed)
    intent = HandoffIntent(
        thread_id=thread_id,
        pending_snapshot_revision=pending_revision,
        committed_snapshot_revision=committed,
        snapshot_revision=committed,
        resume_token=token,
        handoff_status=HandoffStatus.ENQUEUED,
        reason=pending.reason,
        execution_pointer=pending.execution_pointer,
        created_at=clock(),
    )
    try:
        await outbox.enqueue_intent(intent)
    except Exception as enqueue_exc:
        count_handoff(HandoffMetricStatus.ENQUEUE_FAILED)
        orphan = replace(
            enqueued,
            handoff_status=HandoffStatus.ORPHANED,
            write_id=new_write_id(),
            updated_at=clock(),
        )
        try:
            orphaned = await durable_save(cp, committed, orphan, lease=lease)
        except Exception as patch_exc:
            count_handoff(HandoffMetricStatus.PATCH_ORPHAN_FAILED)
            err = HandoffEnqueueFailedError(
                f"hand-off of thread {thread_id!r}: enqueue failed ({enqueue_exc}) and the "
                f"orphaned patch failed too ({patch_exc}); the snapshot stays enqueued at "
                f"revision {committed} without an outbox message: recover it with "
                "recover_stale_handoff(force_reenqueue=True)",
                resume_token=token,
                orphaned=False,
            )
            raise err from enqueue_exc
        err = HandoffEnqueueFailedError(
            f"hand-off of thread {thread_id!r}: enqueue failed ({enqueue_exc}); the snapshot "
            f"is saved as orphaned at revision {orphaned}: recover it with "
            "recover_stale_handoff or retry with the error's resume_token",
            resume_token=ResumeToken(thread_id, orphaned),
            orphaned=True,
        )
        raise err from enqueue_exc
    count_handoff(HandoffMetricStatus.SUCCESS)
    publish(LifecycleEvent(LifecycleEventType.HANDOFF_ENQUEUED, thread_id, revision=committed))
    return token


InterruptKind = Literal["stop", "handoff", "lease_lost"]


class RunControl(Protocol):
    """What a ``StreamHandle`` may do to the execution it watches."""

    interrupt_kind: InterruptKind | None
    in_node: bool
    pointer: str

    def interrupt(self, kind: InterruptKind) -> None: ...


class _Execution(Generic[S, E]):
    """One run segment: the mutable loop state of a start or resume."""

    def __init__(
        self,
        runner: Runner[S, E],
        key: tuple[int, str],
        state: S,
        pointer: str,
        revision: int,
        meta: RunMetadata,
        lease: Lease | None,
        run_lease: tuple[str, float] | None,
        invariant: InvariantValidator[S] | None,
        handle: StreamHandle[S, E] | None,
    ) -> None:
        self.runner = runner
        self.graph = runner.graph
        self.cp = runner.checkpointer
        self.key = key
        self.thread_id = meta.thread_id
        self.state = state
        self.pointer = pointer
        self.revision = revision
        self.meta = meta
        self.lease = lease
        self.lease_ttl = run_lease[1] if run_lease is not None else 0.0
        self.invariant = invariant
        self.handle = handle
        self.effects: list[E] = []
        self.interrupt_kind: InterruptKind | None = None
        self.in_node = False
        self.task: asyncio.Task[Any] | None = None
        self.renewer: asyncio.Task[None] | None = None
        self.attempts: dict[str, int] = {}
        self.skip_saves = self.graph.checkpoint_policy is CheckpointPolicy.SKIP_ON_SAVE_ERROR

    # -------------------------------------------------------------- control
    def launch(self) -> None:
        assert self.handle is not None
        task = asyncio.ensure_future(self.run())
        self.handle._attach(task, self)  # pyright: ignore[reportPrivateUsage]

    def interrupt(self, kind: InterruptKind) -> None:
        if self.interrupt_kind is not None and kind != "lease_lost":
            return
        self.interrupt_kind = kind
        if self.in_node and self.task is not None:
            self.task.cancel()

    async def _absorb_cancel(self) -> None:
        """An interrupt cancelled the task just as its node returned: take the pending
        cancellation here, so it cannot land in the middle of a save."""
        task = self.task
        if task is not None and task.cancelling():
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                task.uncancel()

    def _emit(self, type_: EventType, **kw: Any) -> None:
        if self.handle is not None:
            self.handle._emit(  # pyright: ignore[reportPrivateUsage]
                RunEvent(type_, self.thread_id, **kw)
            )

    async def _renew_loop(self) -> None:
        lm = self.runner.lease_manager
        assert lm is not None and self.lease is not None
        interval = max(self.lease_ttl / 3.0, 0.01)
        while True:
            await asyncio.sleep(interval)
            try:
                self.lease = await lm.renew(self.lease, self.lease_ttl)
            except LeaseLostError:
                logger.warning("flowy: lease on thread %r was lost; stopping", self.thread_id)
                self.interrupt("lease_lost")
                return
            except Exception as exc:  # a transient backend error: try again next tick
                logger.warning("flowy: renewing lease on %r failed: %s", self.thread_id, exc)

    # -------------------------------------------------------------- the run
    async def run(self) -> RunResult[S, E]:
        self.task = asyncio.current_task()
        if self.lease is not None:
            self.renewer = asyncio.ensure_future(self._renew_loop())
        ctx_token = current_run.set(self.meta)
        result: RunResult[S, E] | None = None
        try:
            try:
                result = await self._loop()
            except _Stop as stop:
                result = cast(RunResult[S, E], stop.result)
            except asyncio.CancelledError:
                kind = self.interrupt_kind
                task = self.task
                if kind is not None and task is not None and task.cancelling():
                    task.uncancel()
                    result = await self._on_interrupt(kind)
                else:
                    # Cancelled from outside: save a resumable snapshot, then re-raise.
                    await self._save_on_external_cancel()
                    raise
            return result
        finally:
            current_run.reset(ctx_token)
            await self._finish(result)

    async def _finish(self, result: RunResult[S, E] | None) -> None:
        if self.renewer is not None:
            self.renewer.cancel()
        lm = self.runner.lease_manager
        if self.lease is not None and lm is not None and self.interrupt_kind != "lease_lost":
            try:
                await asyncio.shield(lm.release(self.lease))
            except Exception as exc:
                logger.warning("flowy: releasing lease on %r failed: %s", self.thread_id, exc)
        _running.discard(self.key)
        if result is not None:
            await self._post_run_cleanup(result)

    async def _post_run_cleanup(self, result: RunResult[S, E]) -> None:
        cp = self.cp
        if cp is None or result.revision == 0:
            return
        try:
            if result.status is RunStatus.COMPLETED and self.graph.delete_on_success:
                await cp.delete_if_idle(self.thread_id)
            elif (
                result.status in (RunStatus.COMPLETED, RunStatus.FAILED)
                and self.graph.retention_limit is not None
            ):
                await cp.prune(self.thread_id, self.graph.retention_limit)
        except Exception as exc:
            logger.warning("flowy: post-run cleanup of %r failed: %s", self.thread_id, exc)

    def _result(
        self,
        status: RunStatus,
        reason: str,
        *,
        token: bool = False,
        error: BaseException | None = None,
        handoff_status: HandoffStatus = HandoffStatus.NONE,
    ) -> RunResult[S, E]:
        return RunResult(
            thread_id=self.thread_id,
            state=self.state,
            status=status,
            reason=reason,
            execution_pointer=self.pointer,
            resume_token=ResumeToken(self.thread_id, self.revision) if token else None,
            effects=self.effects,
            step_count=self.meta.step_count,
            total_steps=self.meta.total_steps,
            segment=self.meta.segment,
            budget_counts=dict(self.meta.budget_counts),
            handoff_status=handoff_status,
            error=error,
            revision=self.revision,
        )

    def _snapshot(
        self,
        status: RunStatus,
        reason: str,
        handoff_status: HandoffStatus = HandoffStatus.NONE,
        pending_at: float | None = None,
    ) -> Snapshot[S]:
        meta = self.meta
        return Snapshot(
            thread_id=self.thread_id,
            state=self.state,
            execution_pointer=self.pointer,
            status=status,
            reason=reason,
            step_count=meta.step_count,
            segment=meta.segment,
            total_steps=meta.total_steps,
            budget_counts=dict(meta.budget_counts),
            metadata=dict(meta.metadata),
            handoff_status=handoff_status,
            handoff_pending_at=pending_at,
            updated_at=self.runner.clock(),
            write_id=new_write_id(),
        )

    async def _save(self, snap: Snapshot[S]) -> None:
        assert self.cp is not None
        self.revision = await durable_save(self.cp, self.revision, snap, lease=self.lease)

    def _lease_lost(self, exc: BaseException) -> _Stop:
        self.interrupt_kind = "lease_lost"
        result = self._result(RunStatus.FAILED, Reason.LEASE_LOST, error=exc)
        self._emit(EventType.FAILED, reason=result.reason, execution_pointer=self.pointer)
        return _Stop(result)

    async def _save_or_stop(self, snap: Snapshot[S], kind: str) -> bool:
        """Save ``snap``; True if persisted, False if skipped by policy. On a hard failure
        raise ``_Stop`` with a failed result (reason ``{kind}_save_failed``)."""
        try:
            await self._save(snap)
            return True
        except LeaseLostError as exc:
            raise self._lease_lost(exc) from exc
        except Exception as exc:
            if self.skip_saves:
                self._emit(
                    EventType.CHECKPOINT_FAILED,
                    reason=f"{kind}_checkpoint_skipped",
                    execution_pointer=snap.execution_pointer,
                    node=self.pointer,
                )
                publish(
                    LifecycleEvent(
                        LifecycleEventType.CHECKPOINT_SKIPPED,
                        self.thread_id,
                        revision=self.revision,
                        reason=f"{kind}_checkpoint_skipped",
                        error=str(exc),
                    )
                )
                logger.warning("flowy: %s checkpoint of %r skipped: %s", kind, self.thread_id, exc)
                return False
            reason = f"{kind}_save_failed"
            result = self._result(RunStatus.FAILED, reason, error=exc)
            self._emit(EventType.FAILED, reason=reason, execution_pointer=self.pointer)
            raise _Stop(result) from exc

    async def _retention(self, base_reason: str, kind: str) -> tuple[str, BaseException | None]:
        """In-loop prune after a persisted suspend/handoff/cancel save."""
        limit = self.graph.retention_limit
        if limit is None or self.cp is None:
            return base_reason, None
        try:
            await self.cp.prune(self.thread_id, limit)
        except Exception as exc:
            publish(
                LifecycleEvent(LifecycleEventType.RETENTION_FAILED, self.thread_id, error=str(exc))
            )
            return f"{kind}_retention_failed", exc
        return base_reason, None

    async def _terminal(self, status: RunStatus, reason: str, event: EventType) -> RunResult[S, E]:
        """Save a completed/failed snapshot and build the result."""
        kind = "completed" if status is RunStatus.COMPLETED else "failed"
        error: BaseException | None = None
        if self.cp is not None:
            saved = await self._save_or_stop(self._snapshot(status, reason), kind)
            if not saved:
                reason = f"{kind}_checkpoint_skipped"
                error = CheckpointSkippedError(
                    f"the {kind} checkpoint of thread {self.thread_id!r} was skipped"
                )
        result = self._result(status, reason, error=error)
        self._emit(event, reason=reason, execution_pointer=self.pointer, state=self.state)
        return result

    async def _fail(self, reason: str, error: BaseException | None = None) -> RunResult[S, E]:
        result = await self._terminal(RunStatus.FAILED, reason, EventType.FAILED)
        if error is not None and result.error is None:
            result.error = error
        return result

    def _fail_unsaved(self, reason: str, error: BaseException) -> RunResult[S, E]:
        """A node/reducer/router exception: nothing is saved; the last checkpoint stays."""
        result = self._result(RunStatus.FAILED, reason, error=error)
        self._emit(EventType.FAILED, reason=reason, execution_pointer=self.pointer)
        return result

    async def _loop(self) -> RunResult[S, E]:
        graph = self.graph
        nodes = graph.nodes
        reducer = graph.reducer
        budgets = graph.budgets
        max_steps = graph.max_steps
        meta = self.meta
        emit = self.handle is not None
        save_steps = graph.save_every_step and self.cp is not None
        while True:
            if self.interrupt_kind is not None:
                return await self._on_interrupt(self.interrupt_kind)
            pointer = self.pointer
            if meta.step_count >= max_steps:
                return await self._fail(Reason.MAX_STEPS_EXCEEDED)
            meta.node = pointer
            if emit:
                self._emit(EventType.NODE_STARTED, node=pointer, step=meta.step_count + 1)
            self.in_node = True
            try:
                update, directive = await nodes[pointer](self.state)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                return self._fail_unsaved(Reason.NODE_ERROR, exc)
            finally:
                self.in_node = False
            if self.interrupt_kind is not None:
                await self._absorb_cancel()
            try:
                self.state = reducer(self.state, update)
            except Exception as exc:
                return self._fail_unsaved(Reason.REDUCER_ERROR, exc)
            meta.step_count += 1
            meta.total_steps += 1
            if budgets:
                for name, limit in budgets.items():
                    if meta.budget_counts.get(name, 0) > limit:
                        return await self._fail(f"{Reason.BUDGET_EXCEEDED}:{name}")
            if self.invariant is not None:
                try:
                    await _maybe_await(self.invariant(self.state))
                except Exception as exc:
                    return await self._fail(Reason.INVARIANT_VIOLATION, exc)
            while directive.kind is DirectiveKind.EFFECT:
                payload = cast(E, directive.payload)
                self.effects.append(payload)
                if emit:
                    self._emit(
                        EventType.EFFECT,
                        node=pointer,
                        step=meta.step_count,
                        effect=payload,
                        has_effect=True,
                    )
                assert directive.base is not None
                directive = directive.base
            if emit:
                self._emit(
                    EventType.NODE_COMPLETED, node=pointer, step=meta.step_count, state=self.state
                )
            kind = directive.kind
            if kind is DirectiveKind.COMPLETED:
                self.attempts.pop(pointer, None)
                nxt = await self._route(pointer)
                if nxt is None:
                    return await self._terminal(
                        RunStatus.COMPLETED, Reason.COMPLETED, EventType.COMPLETED
                    )
                self.pointer = nxt
                if save_steps:
                    await self._save_or_stop(self._snapshot(RunStatus.RUNNING, ""), "step")
            elif kind is DirectiveKind.RETRY:
                used = self.attempts.get(pointer, 0) + 1
                self.attempts[pointer] = used
                if used >= directive.max_attempts:
                    self.attempts.pop(pointer, None)
                    fallback = graph.retry_routes.get(pointer)
                    if fallback is None:
                        return await self._fail(Reason.RETRY_EXHAUSTED)
                    self.pointer = fallback
                if save_steps:
                    await self._save_or_stop(self._snapshot(RunStatus.RUNNING, ""), "step")
            elif kind is DirectiveKind.END:
                return await self._terminal(RunStatus.COMPLETED, Reason.END, EventType.COMPLETED)
            elif kind is DirectiveKind.FAIL:
                return await self._fail(directive.reason)
            elif kind is DirectiveKind.SUSPEND:
                return await self._suspend(directive)
            elif kind is DirectiveKind.HANDOFF:
                target = directive.resume_at or pointer
                if not graph.has_node(target):
                    return await self._fail(
                        Reason.HANDOFF_RESUME_TARGET_INVALID,
                        UnknownNodeError(f"handoff resume_at names unknown node {target!r}"),
                    )
                self.pointer = target
                return await self._handoff(directive.reason)
            else:  # pragma: no cover - every kind is handled above
                raise AssertionError(f"unhandled directive {directive!r}")

    async def _route(self, src: str) -> str | None:
        graph = self.graph
        dst = graph.edges.get(src)
        if dst is not None:
            return dst
        cond = graph.conditional_edges.get(src)
        if cond is None:
            return None  # a terminal node (validated at compile time)
        try:
            target = cond.router(self.state)
            if cond.is_async or inspect.isawaitable(target):
                target = await cast(Awaitable[str], target)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise _Stop(self._fail_unsaved(Reason.ROUTER_ERROR, exc)) from exc
        if target not in cond.targets:
            err = UnknownNodeError(
                f"router of {src!r} returned {target!r}, which is not among its declared "
                f"targets {list(cond.targets)}"
            )
            raise _Stop(await self._fail(Reason.ROUTER_TARGET_UNDECLARED, err))
        return target

    async def _suspend(self, directive: Directive[E]) -> RunResult[S, E]:
        target = directive.resume_at or self.pointer
        if not self.graph.has_node(target):
            return await self._fail(
                Reason.SUSPEND_RESUME_TARGET_INVALID,
                UnknownNodeError(f"suspend resume_at names unknown node {target!r}"),
            )
        self.pointer = target
        reason = directive.reason
        if self.cp is None:
            result = self._result(RunStatus.SUSPENDED, reason)
            self._emit(EventType.SUSPENDED, reason=reason, execution_pointer=target)
            return result
        saved = await self._save_or_stop(self._snapshot(RunStatus.SUSPENDED, reason), "suspend")
        error: BaseException | None = None
        if saved:
            reason, error = await self._retention(reason, "suspend")
        else:
            reason = Reason.SUSPEND_CHECKPOINT_SKIPPED
            error = CheckpointSkippedError(f"suspend checkpoint of {self.thread_id!r} skipped")
        result = self._result(RunStatus.SUSPENDED, reason, token=saved, error=error)
        self._emit(
            EventType.SUSPENDED,
            reason=reason,
            execution_pointer=target,
            resume_token=result.resume_token,
        )
        return result

    async def _handoff(self, reason: str) -> RunResult[S, E]:
        """Persist a hand-off at ``self.pointer`` (transactional or three-phase)."""
        cp = self.cp
        outbox = self.runner.handoff_outbox
        if cp is None:
            result = self._result(RunStatus.HANDOFF, reason)
            self._emit(EventType.HANDOFF, reason=reason, execution_pointer=self.pointer)
            return result
        error: BaseException | None = None
        handoff_status = HandoffStatus.NONE
        persisted = True
        if outbox is None:
            persisted = await self._save_or_stop(
                self._snapshot(RunStatus.HANDOFF, reason), "handoff"
            )
        elif _is_transactional(cp, TransactionalCheckpointer) and _is_transactional(
            outbox, TransactionalHandoffOutbox
        ):
            persisted = await self._handoff_tx(
                cast(TransactionalCheckpointer[S], cp),
                cast(TransactionalHandoffOutbox, outbox),
                reason,
            )
            handoff_status = HandoffStatus.ENQUEUED
        else:
            now = self.runner.clock()
            snap = self._snapshot(RunStatus.HANDOFF, reason, HandoffStatus.PENDING, now)
            try:
                await self._save(snap)
            except LeaseLostError as exc:
                raise self._lease_lost(exc) from exc
            except Exception as exc:
                count_handoff(HandoffMetricStatus.SAVE_FAILED)
                if not self.skip_saves:
                    result = self._result(RunStatus.FAILED, Reason.HANDOFF_SAVE_FAILED, error=exc)
                    self._emit(
                        EventType.FAILED,
                        reason=Reason.HANDOFF_SAVE_FAILED,
                        execution_pointer=self.pointer,
                    )
                    return result
                self._emit(
                    EventType.CHECKPOINT_FAILED,
                    reason=Reason.HANDOFF_CHECKPOINT_SKIPPED,
                    execution_pointer=self.pointer,
                )
                persisted = False
            if persisted:
                handoff_status = HandoffStatus.PENDING
                try:
                    token = await _three_phase_tail(
                        cp,
                        outbox,
                        snap.at_revision(self.revision),
                        self.revision,
                        self.lease,
                        self.runner.clock,
                    )
                    self.revision = token.snapshot_revision
                    handoff_status = HandoffStatus.ENQUEUED
                except LeaseLostError as exc:
                    raise self._lease_lost(exc) from exc
                except HandoffPatchFailedError as exc:
                    error = exc
                except HandoffEnqueueFailedError as exc:
                    error = exc
                    if exc.resume_token is not None:
                        self.revision = exc.resume_token.snapshot_revision
                    if exc.orphaned:
                        reason = Reason.HANDOFF_ORPHANED
                        handoff_status = HandoffStatus.ORPHANED
                    else:
                        handoff_status = HandoffStatus.ENQUEUED
        if persisted:
            reason, retention_error = await self._retention(reason, "handoff")
            if retention_error is not None:
                error = (
                    retention_error
                    if error is None
                    else ExceptionGroup(
                        "hand-off errors",
                        [cast(Exception, error), cast(Exception, retention_error)],
                    )
                )
        else:
            reason = Reason.HANDOFF_CHECKPOINT_SKIPPED
            error = CheckpointSkippedError(f"hand-off checkpoint of {self.thread_id!r} skipped")
        result = self._result(
            RunStatus.HANDOFF, reason, token=persisted, error=error, handoff_status=handoff_status
        )
        self._emit(
            EventType.HANDOFF,
            reason=reason,
            execution_pointer=self.pointer,
            resume_token=result.resume_token,
        )
        return result

    async def _handoff_tx(
        self,
        cp: TransactionalCheckpointer[S],
        outbox: TransactionalHandoffOutbox,
        reason: str,
    ) -> bool:
        now = self.runner.clock()
        snap = self._snapshot(RunStatus.HANDOFF, reason, HandoffStatus.ENQUEUED, now)
        thread_id = self.thread_id
        clock = self.runner.clock

        async def enqueue(tx: object, revision: int) -> None:
            token = ResumeToken(thread_id, revision)
            await outbox.enqueue_intent_tx(
                tx,
                HandoffIntent(
                    thread_id=thread_id,
                    pending_snapshot_revision=revision,
                    committed_snapshot_revision=revision,
                    snapshot_revision=revision,
                    resume_token=token,
                    handoff_status=HandoffStatus.ENQUEUED,
                    reason=reason,
                    execution_pointer=snap.execution_pointer,
                    created_at=clock(),
                ),
            )

        try:
            self.revision = await cp.save_with_outbox(
                self.revision, snap, enqueue, lease=self.lease
            )
        except LeaseLostError as exc:
            raise self._lease_lost(exc) from exc
        except Exception as exc:
            from ._saving import confirm_save

            landed: int | None = None
            try:
                landed = await confirm_save(cp, self.revision, snap)
            except Exception:
                landed = None
            if landed is not None:
                self.revision = landed
            else:
                count_handoff(HandoffMetricStatus.COMMIT_FAILED)
                if not self.skip_saves:
                    result = self._result(RunStatus.FAILED, Reason.HANDOFF_SAVE_FAILED, error=exc)
                    self._emit(
                        EventType.FAILED,
                        reason=Reason.HANDOFF_SAVE_FAILED,
                        execution_pointer=self.pointer,
                    )
                    raise _Stop(result) from exc
                self._emit(
                    EventType.CHECKPOINT_FAILED,
                    reason=Reason.HANDOFF_CHECKPOINT_SKIPPED,
                    execution_pointer=self.pointer,
                )
                return False
        count_handoff(HandoffMetricStatus.SUCCESS)
        publish(
            LifecycleEvent(LifecycleEventType.HANDOFF_ENQUEUED, thread_id, revision=self.revision)
        )
        return True

    async def _on_interrupt(self, kind: InterruptKind) -> RunResult[S, E]:
        try:
            if kind == "lease_lost":
                err = LeaseLostError(
                    f"the lease on thread {self.thread_id!r} was lost; the run stopped "
                    "without saving (another worker may own the thread now)"
                )
                raise self._lease_lost(err)
            if kind == "handoff":
                return await self._handoff(Reason.LOCAL_HANDOFF)
            return await self._cancel_save()
        except _Stop as stop:
            return cast(RunResult[S, E], stop.result)

    async def _cancel_save(self) -> RunResult[S, E]:
        """Save a resumable snapshot after request_stop (reason context_canceled)."""
        reason: str = Reason.CONTEXT_CANCELED
        error: BaseException | None = None
        persisted = False
        if self.cp is not None:
            try:
                await self._save(self._snapshot(RunStatus.CANCELED, reason))
                persisted = True
            except LeaseLostError as exc:
                raise self._lease_lost(exc) from exc
            except Exception as exc:
                if self.skip_saves:
                    reason = Reason.CONTEXT_CANCELED_CHECKPOINT_SKIPPED
                    error = CheckpointSkippedError(
                        f"cancel checkpoint of {self.thread_id!r} skipped: {exc}"
                    )
                    self._emit(
                        EventType.CHECKPOINT_FAILED, reason=reason, execution_pointer=self.pointer
                    )
                else:
                    reason = Reason.CONTEXT_CANCELED_SAVE_FAILED
                    error = exc
            if persisted:
                reason, error = await self._retention(reason, "context_canceled")
        result = self._result(RunStatus.CANCELED, reason, token=persisted, error=error)
        self._emit(
            EventType.CONTEXT_CANCELED,
            reason=reason,
            execution_pointer=self.pointer,
            resume_token=result.resume_token,
        )
        return result

    async def _save_on_external_cancel(self) -> None:
        if self.cp is None:
            return
        snap = self._snapshot(RunStatus.CANCELED, Reason.CONTEXT_CANCELED)
        try:
            await asyncio.wait_for(asyncio.shield(self._save(snap)), _CANCEL_SAVE_TIMEOUT)
            self._emit(
                EventType.CONTEXT_CANCELED,
                reason=Reason.CONTEXT_CANCELED,
                execution_pointer=self.pointer,
            )
        except BaseException as exc:
            logger.warning(
                "flowy: saving thread %r after cancellation failed: %r", self.thread_id, exc
            )
            self._emit(
                EventType.CONTEXT_CANCELED,
                reason=Reason.CONTEXT_CANCELED_SAVE_FAILED,
                execution_pointer=self.pointer,
            )
