"""Pauses of a run segment: a suspend, and a wait (``sleep`` / ``wait_for``) with the
signal it may take at once and the waiting snapshot it saves."""

from __future__ import annotations

import logging
from typing import Generic

from ._directives import Directive
from ._errors import LimitError, UnknownNodeError
from ._events import EventType
from ._results import Reason, RunResult
from ._segment import Segment
from ._types import E, S
from ._waits import next_signal, take_signal
from .storage import Route, RunStatus
from .storage.dialect import MAX_TIMESTAMP

__all__ = ["Pauses"]

logger = logging.getLogger("flowy")


class Pauses(Generic[S, E]):
    """Suspends and waits of the segment ``seg`` (its pointer, state and saves)."""

    def __init__(self, seg: Segment[S, E]) -> None:
        self.seg = seg

    async def suspend(self, directive: Directive[E]) -> RunResult[S, E]:
        seg = self.seg
        target = directive.resume_at or seg.pointer
        if not seg.graph.has_node(target):
            return await seg.fail(
                Reason.SUSPEND_RESUME_TARGET_INVALID,
                UnknownNodeError(f"suspend resume_at names unknown node {target!r}"),
            )
        seg.pointer = target
        reason = directive.reason
        if seg.cp is None:
            result = seg.result(RunStatus.SUSPENDED, reason)
            seg.emit(EventType.SUSPENDED, reason=reason, execution_pointer=target)
            return result
        error = await seg.save_or_stop(seg.snapshot(RunStatus.SUSPENDED, reason), "suspend")
        saved = error is None
        if saved:
            reason, error = await seg.retention(reason, "suspend")
        else:
            reason = Reason.SUSPEND_CHECKPOINT_SKIPPED
        result = seg.result(RunStatus.SUSPENDED, reason, token=saved, error=error)
        seg.emit(
            EventType.SUSPENDED,
            reason=reason,
            execution_pointer=target,
            resume_token=result.resume_token,
        )
        return result

    async def wait(self, directive: Directive[E]) -> RunResult[S, E] | None:
        """A ``sleep`` / ``wait_for``: take a signal already in the inbox and go on, or
        save the waiting snapshot (and take a signal that arrived meanwhile)."""
        seg = self.seg
        graph = seg.graph
        target = directive.resume_at or seg.pointer
        on_timeout = directive.on_timeout or graph.timeout_routes.get(seg.pointer, "")
        for node in (target, on_timeout):
            if node and not graph.has_node(node):
                return await seg.fail(
                    Reason.WAIT_TARGET_INVALID,
                    UnknownNodeError(f"the wait names unknown node {node!r}"),
                )
        name = directive.signal
        seg.pointer = target
        if name and seg.cp is not None and await self.take_pending(name):
            return None
        now = seg.clock()
        wake_at = now + directive.delay if directive.delay is not None else directive.until
        result = await self.save_wait(directive.reason, wake_at, name, on_timeout, emit=False)
        if name and result.resume_token is not None:
            # A signal sent while the wait was being saved saw no waiting head, so it
            # woke nobody: look once more, now that the wait is stored.
            try:
                if await self.take_pending(name):
                    return None
            except Exception as exc:  # noqa: BLE001 - the wait is saved; a sender wakes it
                logger.warning(
                    "flowy: reading the inbox of thread %r after its wait was saved failed: %s",
                    seg.thread_id,
                    exc,
                )
        self.emit_wait(result)
        return result

    async def take_pending(self, name: str) -> bool:
        """Take the next signal ``name`` from the inbox into the state, if there is one."""
        seg = self.seg
        durable = seg.durable("wait_for()")
        signal = await next_signal(durable, seg.thread_id, name, seg.signal_cursors)
        if signal is None:
            return False
        seg.state = await take_signal(seg.graph, seg.state, signal, seg.signal_cursors, seg.merge)
        return True

    async def save_wait(
        self,
        reason: str,
        wake_at: float | None,
        signal: str = "",
        on_timeout: str = "",
        *,
        emit: bool = True,
    ) -> RunResult[S, E]:
        """Save the waiting snapshot (its wake-up time indexed by the store) and build
        the result; ``emit`` the terminal event now (else the caller does)."""
        seg = self.seg
        store = seg.services.store
        if store is None:
            result = seg.result(RunStatus.WAITING, reason)
            if emit:
                self.emit_wait(result)
            return result
        if wake_at is not None:
            longest = store.limits.max_sleep
            now = seg.clock()
            if not 0 <= wake_at <= MAX_TIMESTAMP or wake_at - now > longest:
                return seg.fail_unsaved(
                    Reason.NODE_ERROR,
                    LimitError(
                        f"the wait of thread {seg.thread_id!r:.200} at node {seg.pointer!r} "
                        f"would end at {wake_at!r}, {wake_at - now:.0f} seconds from now; the "
                        f"longest sleep or deadline is {longest:.0f} seconds "
                        "(Limits.max_sleep)"
                    ),
                )
        # The queue of its wake-up message (a signal's): the graph's default queue.
        route = Route(seg.graph.default_queue)
        snap = seg.snapshot(
            RunStatus.WAITING,
            reason,
            wake_at=wake_at,
            waiting_for=signal,
            on_timeout=on_timeout,
            route=route,
        )
        error = await seg.save_or_stop(snap, "wait")
        saved = error is None
        if saved:
            reason, error = await seg.retention(reason, "wait")
        else:
            reason = Reason.WAIT_CHECKPOINT_SKIPPED
        result = seg.result(RunStatus.WAITING, reason, token=saved, error=error)
        if emit:
            self.emit_wait(result)
        return result

    def emit_wait(self, result: RunResult[S, E]) -> None:
        seg = self.seg
        seg.emit(
            EventType.WAITING,
            reason=result.reason,
            execution_pointer=result.execution_pointer,
            resume_token=result.resume_token,
        )
