"""The Runner: the public entry point that starts, resumes, streams and recovers runs.

``Runner.start`` / ``Runner.resume`` run a segment to its end and return the
authoritative ``RunResult``; ``stream`` / ``resume_stream`` do the same in a task and
hand back a ``StreamHandle``. The resume preflight follows the specification's order:
token validation → load + OCC → after_load → overlay → segment reset (budget counts kept)
→ run-metadata merge → resume-target policy → pointer validation → execute.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, Generic, cast

from ._checkpoint import (
    Checkpointer,
    FencingCheckpointer,
    HandoffOutbox,
    HandoffStatus,
    Lease,
    LeaseManager,
    ResumeToken,
    RunStatus,
    Snapshot,
    validate_thread_id,
)
from ._context import RunBindings, RunMetadata, RunMetadataInput
from ._errors import (
    ConcurrencyConflictError,
    HandoffAlreadyEnqueuedError,
    HandoffEnqueueFailedError,
    HandoffNotRecoverableError,
    HandoffOrphanedError,
    HandoffPendingError,
    InvalidResumePlanError,
    InvalidResumeTokenError,
    LeaseRequiredError,
    ThreadAlreadyRunningError,
    ThreadCompletedError,
    ThreadNotFoundError,
    UnknownNodeError,
)
from ._events import StreamHandle
from ._execution import Execution, InvariantValidator, maybe_await, register_run, unregister_run
from ._graph import Graph
from ._guard import LeaseGuardCheckpointer
from ._handoff import three_phase_tail
from ._observer import (
    LifecycleEvent,
    LifecycleEventType,
    publish,
)
from ._plan import ResumePlan, ResumeTargetPolicy
from ._results import (
    HandoffRecoveryResult,
    ResumeDecision,
    ResumeDecisionKind,
    RunResult,
)
from ._types import E, S

__all__ = ["DEFAULT_HANDOFF_STALE_AFTER", "InvariantValidator", "Runner", "StateMerge"]

logger = logging.getLogger("flowy")

DEFAULT_HANDOFF_STALE_AFTER = 300.0
"""Seconds after which a pending hand-off counts as stale (5 minutes)."""

StateMerge = Callable[[S, S], S]
"""``merge(loaded_state, overlay) -> state`` for ``resume(state_overlay=...)``."""


AfterLoad = Callable[[S], "S | Awaitable[S]"]


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
            token = await three_phase_tail(
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
        if not register_run(key):
            raise ThreadAlreadyRunningError(
                f"thread {thread_id!r} is already running in this process; wait for it or "
                "stop it before starting or resuming it again"
            )
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
    ) -> Execution[S, E]:
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
        return Execution(
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
    ) -> Execution[S, E]:
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
            if snap.status is RunStatus.COMPLETED and policy is None:
                raise ThreadCompletedError(
                    f"thread {thread_id!r} completed at revision {revision}; there is nothing "
                    "to resume (a resume_target_policy returning resume_to(node) runs part "
                    "of it again on purpose)"
                )
            state = snap.state
            # 3. after_load interceptor
            if self.after_load is not None:
                state = cast(S, await maybe_await(self.after_load(state)))
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
                planned = cast(tuple[S, object], await maybe_await(policy(state, pointer)))
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
        return Execution(
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
        unregister_run(key)
        if lease is not None and self.lease_manager is not None:
            try:
                await asyncio.shield(self.lease_manager.release(lease))
            except Exception as exc:
                logger.warning("flowy: releasing lease of %r failed: %s", lease.thread_id, exc)
