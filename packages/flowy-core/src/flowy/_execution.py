"""One run segment: the execution loop, the directive of each step, the lease and
interrupts (stop, local hand-off, lost lease, cancellation).

``Runner`` prepares an ``Execution`` (start or resume preflight) and awaits ``run()``;
everything between the first node and the terminal result happens here, with
collaborators it composes: ``_routing`` (where a completed node goes), ``_pauses``
(suspends and waits), ``_superstep`` (parallel edges and fan-outs) and ``_nested``
(subgraph nodes). Hand-offs are ``_handoff``'s ``Handoffs``, the shared machinery (state,
saves, terminal results) in ``_segment``.
"""

from __future__ import annotations

import asyncio
import logging
from functools import cached_property
from typing import Any, cast

from . import _tracing
from ._activities import ActivityScope, RetryLater, current_scope
from ._context import current_progress, current_run
from ._directives import Directive, DirectiveKind
from ._errors import ConcurrencyConflictError, LeaseLostError, UnknownNodeError
from ._events import EventType, InterruptKind
from ._fanout import SAME_STATE, Branch
from ._handoff import Handoffs
from ._nested import Subgraphs
from ._observer import LifecycleEventType
from ._pauses import Pauses
from ._results import Reason, RunResult
from ._routing import route
from ._segment import Segment, Stop, maybe_await, unregister_run
from ._superstep import Supersteps
from ._types import E, S
from .storage import Route, RunStatus

__all__ = ["Execution"]

logger = logging.getLogger("flowy")

_CANCEL_SAVE_TIMEOUT = 10.0


class Execution(Segment[S, E]):
    """One run segment: the loop of a start or a resume, with its lease and interrupts."""

    task: asyncio.Task[Any] | None = None
    renewer: asyncio.Task[None] | None = None
    interrupt_kind: InterruptKind | None

    # ------------------------------------------------------- collaborators
    @cached_property
    def pauses(self) -> Pauses[S, E]:
        """Suspends and waits."""
        return Pauses(self)

    @cached_property
    def handoffs(self) -> Handoffs[S, E]:
        """Hand-offs (transactional or three-phase)."""
        return Handoffs(self)

    @cached_property
    def supersteps(self) -> Supersteps[S, E]:
        """Parallel edges and fan-outs."""
        return Supersteps(self, self.pauses, self.handoffs)

    @cached_property
    def subgraphs(self) -> Subgraphs[S, E]:
        """Subgraph nodes."""
        return Subgraphs(self, self.pauses, self.handoffs, self._after_step, self._on_interrupt)

    # -------------------------------------------------------------- control
    def interrupt(self, kind: InterruptKind) -> None:
        """Ask the run to stop at the next safe point: ``stop`` (request_stop),
        ``handoff`` (request_local_handoff) or ``lease_lost``."""
        if self.interrupt_kind is not None and kind != "lease_lost":
            return
        self.interrupt_kind = kind
        if self.in_node and self.task is not None:
            self.task.cancel()
            self.cancels_sent += 1

    def _take_own_cancels(self) -> bool:
        """Take back the cancellations interrupts sent to the run's task. True if one
        was sent and no other is pending: a cancellation from outside (the caller's task
        cancelled, ``handle.cancel()``) is never taken for an interrupt's."""
        task, sent = self.task, self.cancels_sent
        self.cancels_sent = 0
        if task is None or not sent:
            return False
        for _ in range(sent):
            task.uncancel()
        return task.cancelling() == 0

    async def _absorb_cancel(self) -> None:
        """An interrupt cancelled the task just as its node returned: take the pending
        cancellation here, so it cannot land in the middle of a save (one from outside
        goes on)."""
        if not self.cancels_sent:
            return
        try:
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            if not self._take_own_cancels():
                raise
        else:
            self._take_own_cancels()

    async def _renew_loop(self) -> None:
        lm = self.services.lease_manager
        assert lm is not None and self.lease is not None
        interval = max(self.lease_ttl / 3.0, 0.01)
        while True:
            await asyncio.sleep(interval)
            try:
                self.lease = await lm.renew(self.lease, self.lease_ttl)
            except LeaseLostError:
                if self.released:  # the segment's last save gave it up
                    return
                logger.warning("flowy: lease on thread %r was lost; stopping", self.thread_id)
                self.interrupt("lease_lost")
                return
            except Exception as exc:  # noqa: BLE001 - a transient store error: try again next tick
                logger.warning("flowy: renewing lease on %r failed: %s", self.thread_id, exc)

    # -------------------------------------------------------------- the run
    async def run(self) -> RunResult[S, E]:
        """Run the segment to its terminal result (the source of truth)."""
        self.task = asyncio.current_task()
        if self.lease is not None:
            self.renewer = asyncio.ensure_future(self._renew_loop())
        ctx_token = current_run.set(self.meta)
        progress_token = current_progress.set(self.progress_sender())
        scope_token = current_scope.set(
            ActivityScope(
                lambda: self._journal("flowy.activity()"),
                self.thread_id,
                self.clock,
                lambda: (self.meta.total_steps + 1, self.pointer),
            )
        )
        result: RunResult[S, E] | None = None
        tracing = _tracing.active()
        span = (
            tracing.segment(self.thread_id, "resume" if self.meta.segment else "start", self.store)
            if tracing is not None
            else None
        )
        try:
            try:
                result = await self._loop()
            except Stop as stop:
                result = cast(RunResult[S, E], stop.result)
            except asyncio.CancelledError:
                kind = self.interrupt_kind
                if kind is not None and self._take_own_cancels():
                    result = await self._on_interrupt(kind)
                else:
                    await self._on_external_cancel()
                    raise
            return result
        finally:
            current_scope.reset(scope_token)
            current_run.reset(ctx_token)
            current_progress.reset(progress_token)
            if span is not None:
                if result is None:
                    span.end("canceled", error=asyncio.CancelledError())
                else:
                    span.end(
                        result.status.value,
                        result.reason,
                        result.revision,
                        result.error,
                        result.step_count,
                    )
            await self._finish(result)

    async def _on_external_cancel(self) -> None:
        """The task was cancelled from outside (``handle.cancel()``, or the caller's
        task): the same terminal save as ``request_stop``, shielded and bounded, before
        the cancellation goes on."""
        try:
            await asyncio.wait_for(asyncio.shield(self._on_interrupt("stop")), _CANCEL_SAVE_TIMEOUT)
        except (TimeoutError, asyncio.CancelledError) as exc:
            logger.warning(
                "flowy: the cancel checkpoint of thread %r did not finish: %r", self.thread_id, exc
            )

    async def _finish(self, result: RunResult[S, E] | None) -> None:
        if self.renewer is not None:
            self.renewer.cancel()
        lm = self.services.lease_manager
        try:
            if (
                self.lease is not None
                and lm is not None
                and self.interrupt_kind != "lease_lost"
                and not self.released
            ):
                try:
                    await asyncio.shield(lm.release(self.lease))
                except Exception as exc:  # noqa: BLE001 - the lease expires on its own
                    logger.warning("flowy: releasing lease on %r failed: %s", self.thread_id, exc)
        finally:
            unregister_run(self.key)  # even when the release is interrupted
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
        except Exception as exc:  # noqa: BLE001 - post-run cleanup only logs (the specification)
            logger.warning("flowy: post-run cleanup of %r failed: %s", self.thread_id, exc)

    async def _loop(self) -> RunResult[S, E]:
        graph = self.graph
        nodes = graph.nodes
        reducer = graph.reducer
        budgets = graph.budgets
        max_steps = graph.max_steps
        max_total = graph.max_total_steps
        meta = self.meta
        emit = self.sink is not None
        save_steps = graph.save_every_step and self.cp is not None
        edges = graph.edges
        effect_kind, completed_kind = DirectiveKind.EFFECT, DirectiveKind.COMPLETED
        attempts = self.attempts
        subgraphs = graph.subgraphs
        tracing = _tracing.active()
        while True:
            if self.interrupt_kind is not None:
                return await self._on_interrupt(self.interrupt_kind)
            pointer = self.pointer
            if meta.step_count >= max_steps:
                return await self.fail(Reason.MAX_STEPS_EXCEEDED)
            if max_total is not None and meta.total_steps >= max_total:
                self.publish(LifecycleEventType.STEP_LIMIT_EXCEEDED, reason=pointer)
                return await self.fail(Reason.MAX_TOTAL_STEPS_EXCEEDED)
            meta.node = pointer
            if pointer in subgraphs:
                result = await self.subgraphs.run(pointer)
                if result is not None:
                    return result
                continue
            if emit:
                self.emit(EventType.NODE_STARTED, node=pointer, step=meta.step_count + 1)
            self.step_state = self.state
            node_span = (
                tracing.node(self.thread_id, pointer, meta.step_count + 1) if tracing else None
            )
            self.in_node = True
            try:
                update, directive = await nodes[pointer](self.state)
            except asyncio.CancelledError:
                if node_span is not None:
                    node_span.end("canceled")
                raise
            except RetryLater as later:  # an activity waits for its next attempt
                self.in_node = False
                if node_span is not None:
                    node_span.end(Reason.ACTIVITY_RETRY)
                return await self.pauses.save_wait(Reason.ACTIVITY_RETRY, later.at)
            except Exception as exc:  # noqa: BLE001 - a node's error fails the run, reported on the result
                if node_span is not None:
                    node_span.end("failed", error=exc)
                return self.fail_unsaved(Reason.NODE_ERROR, exc)
            finally:
                self.in_node = False
            if node_span is not None:
                node_span.end(directive.kind.value)
            if self.interrupt_kind is not None:
                await self._absorb_cancel()
            try:
                self.state = reducer(self.state, update)
            except Exception as exc:  # noqa: BLE001 - a reducer's error fails the run, reported on the result
                return self.fail_unsaved(Reason.REDUCER_ERROR, exc)
            meta.step_count += 1
            meta.total_steps += 1
            if budgets:
                for name, limit in budgets.items():
                    if meta.budget_counts.get(name, 0) > limit:
                        return await self.fail(f"{Reason.BUDGET_EXCEEDED}:{name}")
            if self.invariant is not None:
                try:
                    await maybe_await(self.invariant(self.state))
                except Exception as exc:  # noqa: BLE001 - a violated invariant fails the run
                    return await self.fail(Reason.INVARIANT_VIOLATION, exc)
            while directive.kind is effect_kind:
                payload = cast(E, directive.payload)
                self.effects.append(payload)
                if emit:
                    self.emit(
                        EventType.EFFECT,
                        node=pointer,
                        step=meta.step_count,
                        effect=payload,
                        has_effect=True,
                    )
                assert directive.base is not None
                directive = directive.base
            if emit:
                self.emit(
                    EventType.NODE_COMPLETED, node=pointer, step=meta.step_count, state=self.state
                )
            if directive.kind is completed_kind and (nxt := edges.get(pointer)) is not None:
                # The common step, inline: a completed node with a static edge.
                if attempts:
                    attempts.pop(pointer, None)
                self.pointer = nxt
                if save_steps:
                    await self.save_or_stop(self.snapshot(RunStatus.RUNNING, ""), "step")
                continue
            result = await self._after_step(pointer, directive, save_steps)
            if result is not None:
                return result

    async def _after_step(
        self, pointer: str, directive: Directive[E], save_steps: bool
    ) -> RunResult[S, E] | None:
        """Apply the node's directive: the terminal result, or ``None`` to go on."""
        kind = directive.kind
        graph = self.graph
        if kind is DirectiveKind.COMPLETED and pointer in graph.parallel_edges:
            self.attempts.pop(pointer, None)
            names, then = graph.parallel_edges[pointer]
            branches = [Branch(i, name, SAME_STATE) for i, name in enumerate(names)]
            result = await self.supersteps.run(pointer, branches, then, None)
            if result is not None:
                return result
        elif kind is DirectiveKind.FAN_OUT:
            declared = graph.fan_outs.get(pointer)
            if declared is None or declared[0] != directive.resume_at:
                return await self.fail(
                    Reason.FAN_OUT_UNDECLARED,
                    UnknownNodeError(
                        f"node {pointer!r} returned fan_out({directive.resume_at!r}, ...) "
                        "but declares no such fan-out (GraphBuilder.add_fan_out)"
                    ),
                )
            branches = [Branch(i, declared[0], item) for i, item in enumerate(directive.items)]
            result = await self.supersteps.run(
                pointer, branches, declared[1], directive.concurrency
            )
            if result is not None:
                return result
        elif kind is DirectiveKind.COMPLETED:
            self.attempts.pop(pointer, None)
            nxt = await route(self, pointer)
            if nxt is None:
                return await self._terminal(
                    RunStatus.COMPLETED, Reason.COMPLETED, EventType.COMPLETED
                )
            self.pointer = nxt
        elif kind is DirectiveKind.RETRY:
            used = self.attempts.get(pointer, 0) + 1
            self.attempts[pointer] = used
            if used >= directive.max_attempts:
                self.attempts.pop(pointer, None)
                fallback = graph.retry_routes.get(pointer)
                if fallback is None:
                    return await self.fail(Reason.RETRY_EXHAUSTED)
                self.pointer = fallback
        elif kind is DirectiveKind.END:
            return await self._terminal(RunStatus.COMPLETED, Reason.END, EventType.COMPLETED)
        elif kind is DirectiveKind.FAIL:
            return await self.fail(directive.reason)
        elif kind is DirectiveKind.SUSPEND:
            return await self.pauses.suspend(directive)
        elif kind is DirectiveKind.WAIT:
            result = await self.pauses.wait(directive)
            if result is not None:
                return result
        elif kind is DirectiveKind.HANDOFF:
            target = directive.resume_at or pointer
            if not graph.has_node(target):
                return await self.fail(
                    Reason.HANDOFF_RESUME_TARGET_INVALID,
                    UnknownNodeError(f"handoff resume_at names unknown node {target!r}"),
                )
            self.pointer = target
            return await self.handoffs.handoff(
                directive.reason, directive.route(graph.queue_of(pointer))
            )
        else:  # pragma: no cover - every kind is handled above
            raise AssertionError(f"unhandled directive {directive!r}")
        if save_steps:
            await self.save_or_stop(self.snapshot(RunStatus.RUNNING, ""), "step")
        return None

    async def _on_interrupt(self, kind: InterruptKind) -> RunResult[S, E]:
        try:
            if kind == "lease_lost":
                err = LeaseLostError(
                    f"the lease on thread {self.thread_id!r:.200} was lost; the run stopped "
                    "without saving (another worker may own the thread now)"
                )
                raise await self.stopped_outside(err) or self.lease_lost(err)
            if kind == "handoff":
                queue = self.graph.queue_of(self.pointer)
                return await self.handoffs.handoff(Reason.LOCAL_HANDOFF, Route(queue))
            return await self._cancel_save()
        except Stop as stop:
            return cast(RunResult[S, E], stop.result)

    async def _cancel_save(self) -> RunResult[S, E]:
        """Save a resumable snapshot after a stop or a cancellation (reason
        ``context_canceled``); a failed save is ``context_canceled_save_failed`` (or
        ``..._checkpoint_skipped`` under SKIP_ON_SAVE_ERROR), reported on the
        ``context_canceled`` event, never as ``failed``."""
        reason: str = Reason.CONTEXT_CANCELED
        error: BaseException | None = None
        persisted = False
        if self.cp is not None:
            try:
                await self.save(self.snapshot(RunStatus.CANCELED, reason))
                persisted = True
            except LeaseLostError as exc:
                raise await self.stopped_outside(exc) or self.lease_lost(exc) from exc
            except Exception as exc:  # a failed cancel save is reported on the result and event
                if isinstance(exc, ConcurrencyConflictError):
                    stop = await self.stopped_outside(exc)
                    if stop is not None:
                        raise stop from exc
                if self.skip_saves:
                    reason = Reason.CONTEXT_CANCELED_CHECKPOINT_SKIPPED
                    error = self.skipped("context_canceled", exc)
                else:
                    reason = Reason.CONTEXT_CANCELED_SAVE_FAILED
                    error = exc
                    self.publish(LifecycleEventType.CHECKPOINT_FAILED, reason=reason, error=exc)
                    logger.warning(
                        "flowy: the cancel checkpoint of thread %r failed: %r", self.thread_id, exc
                    )
            if persisted:
                reason, error = await self.retention(reason, "context_canceled")
        result = self.result(RunStatus.CANCELED, reason, token=persisted, error=error)
        self.emit(
            EventType.CONTEXT_CANCELED,
            reason=reason,
            execution_pointer=self.pointer,
            resume_token=result.resume_token,
        )
        return result
