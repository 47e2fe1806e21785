"""One run segment: the execution loop, its saves, interrupts and terminal paths.

``Runner`` prepares an ``Execution`` (start or resume preflight) and calls ``run()``;
everything that happens between the first node and the terminal result is here.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, cast

from ._context import RunMetadata, current_run
from ._directives import Directive, DirectiveKind
from ._errors import (
    CheckpointSkippedError,
    HandoffEnqueueFailedError,
    HandoffPatchFailedError,
    LeaseLostError,
    UnknownNodeError,
)
from ._events import EventSink, EventType, InterruptKind, RunEvent
from ._graph import CheckpointPolicy, Graph
from ._handoff import three_phase_tail
from ._observer import HandoffMetricStatus, LifecycleEvent, LifecycleEventType, Telemetry
from ._results import Reason, RunResult
from ._types import E, ResumeToken, S
from .storage import (
    Checkpointer,
    HandoffIntent,
    HandoffOutbox,
    HandoffStatus,
    Lease,
    LeaseManager,
    RunStatus,
    Snapshot,
    TransactionalCheckpointer,
    TransactionalHandoffOutbox,
    confirm_save,
    durable_save,
    new_write_id,
)

__all__ = [
    "Execution",
    "InvariantValidator",
    "Services",
    "maybe_await",
    "register_run",
    "unregister_run",
]

logger = logging.getLogger("flowy")

InvariantValidator = Callable[[S], "Awaitable[None] | None"]
"""Called with the state after every step; raising fails the run (invariant_violation)."""

_CANCEL_SAVE_TIMEOUT = 10.0

# Threads running in this process, keyed by (store identity, thread id).
_running: set[tuple[object, str]] = set()


def register_run(key: tuple[object, str]) -> bool:
    """Mark a thread as running in this process; False if it already is."""
    if key in _running:
        return False
    _running.add(key)
    return True


def unregister_run(key: tuple[object, str]) -> None:
    """Forget a running thread (its run ended or never started)."""
    _running.discard(key)


class _Stop(Exception):
    """Internal: ends the execution loop with a finished result."""

    def __init__(self, result: RunResult[Any, Any]) -> None:
        self.result = result


async def maybe_await(value: Any) -> Any:
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


@dataclass(frozen=True, slots=True)
class Services(Generic[S, E]):
    """What an execution uses of its runner: the graph, the store's parts, the clock and
    the telemetry."""

    graph: Graph[S, E]
    checkpointer: Checkpointer[S] | None
    lease_manager: LeaseManager | None
    outbox: HandoffOutbox | None
    clock: Callable[[], float]
    telemetry: Telemetry


class Execution(Generic[S, E]):
    """One run segment: the mutable loop state of a start or resume."""

    def __init__(
        self,
        services: Services[S, E],
        key: tuple[object, str],
        state: S,
        pointer: str,
        revision: int,
        meta: RunMetadata,
        lease: Lease | None,
        lease_ttl: float,
        invariant: InvariantValidator[S] | None,
        sink: EventSink[S, E] | None,
    ) -> None:
        self.services = services
        self.graph = services.graph
        self.cp = services.checkpointer
        self.telemetry = services.telemetry
        self.clock = services.clock
        self.key = key
        self.thread_id = meta.thread_id
        self.state = state
        self.pointer = pointer
        self.revision = revision
        self.meta = meta
        self.lease = lease
        self.lease_ttl = lease_ttl
        self.invariant = invariant
        self.sink = sink
        self.effects: list[E] = []
        self.interrupt_kind: InterruptKind | None = None
        self.in_node = False
        self.task: asyncio.Task[Any] | None = None
        self.renewer: asyncio.Task[None] | None = None
        self.attempts: dict[str, int] = meta.retry_counts
        self.skip_saves = self.graph.checkpoint_policy is CheckpointPolicy.SKIP_ON_SAVE_ERROR

    # -------------------------------------------------------------- control
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
        if self.sink is not None:
            self.sink.emit(RunEvent(type_, self.thread_id, **kw))

    async def _renew_loop(self) -> None:
        lm = self.services.lease_manager
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
        lm = self.services.lease_manager
        if self.lease is not None and lm is not None and self.interrupt_kind != "lease_lost":
            try:
                await asyncio.shield(lm.release(self.lease))
            except Exception as exc:
                logger.warning("flowy: releasing lease on %r failed: %s", self.thread_id, exc)
        unregister_run(self.key)
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
            updated_at=self.clock(),
            write_id=new_write_id(),
            effects=cast("tuple[Any, ...]", tuple(self.effects)),
            retry_counts=dict(self.attempts),
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
                self.telemetry.publish(
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
            self.telemetry.publish(
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
        emit = self.sink is not None
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
                    await maybe_await(self.invariant(self.state))
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
        outbox = self.services.outbox
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
            now = self.clock()
            snap = self._snapshot(RunStatus.HANDOFF, reason, HandoffStatus.PENDING, now)
            try:
                await self._save(snap)
            except LeaseLostError as exc:
                raise self._lease_lost(exc) from exc
            except Exception as exc:
                self.telemetry.count_handoff(HandoffMetricStatus.SAVE_FAILED)
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
                    token = await three_phase_tail(
                        cp,
                        outbox,
                        snap.at_revision(self.revision),
                        self.revision,
                        self.lease,
                        self.clock,
                        self.telemetry,
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
        now = self.clock()
        snap = self._snapshot(RunStatus.HANDOFF, reason, HandoffStatus.ENQUEUED, now)
        thread_id = self.thread_id
        clock = self.clock

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
            landed: int | None = None
            try:
                landed = await confirm_save(cp, self.revision, snap)
            except Exception:
                landed = None
            if landed is not None:
                self.revision = landed
            else:
                self.telemetry.count_handoff(HandoffMetricStatus.COMMIT_FAILED)
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
        self.telemetry.count_handoff(HandoffMetricStatus.SUCCESS)
        self.telemetry.publish(
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
