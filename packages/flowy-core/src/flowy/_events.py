"""Run events, the ``StreamHandle`` and the stream helpers that never deadlock.

Events are best-effort progress: a slow or absent consumer never blocks the run (the
buffer drops the oldest progress events when full, never the terminal one). The
terminal ``RunResult`` from ``wait_result()`` is the source of truth; a terminal
event's reason always equals the result's reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic

from ._checkpoint import Checkpointer, ResumeToken, Snapshot
from ._errors import NoActiveExecutionError, ThreadNotFoundError
from ._results import RunResult
from ._types import E, S

if TYPE_CHECKING:
    from ._execution import RunControl

__all__ = [
    "EventType",
    "RunEvent",
    "StreamCollectResult",
    "StreamCollector",
    "StreamHandle",
    "await_stream_collect",
    "await_stream_collect_with_snapshot",
    "begin_stream_collect",
    "collect_events_and_wait",
    "consume_events_and_wait",
]


class EventType(enum.StrEnum):
    """The kind of a run event."""

    NODE_STARTED = "node_started"
    NODE_COMPLETED = "node_completed"
    EFFECT = "effect"
    CHECKPOINT_FAILED = "checkpoint_failed"
    SUSPENDED = "suspended"
    HANDOFF = "handoff"
    COMPLETED = "completed"
    FAILED = "failed"
    CONTEXT_CANCELED = "context_canceled"


TERMINAL_EVENTS = frozenset(
    {
        EventType.SUSPENDED,
        EventType.HANDOFF,
        EventType.COMPLETED,
        EventType.FAILED,
        EventType.CONTEXT_CANCELED,
    }
)


@dataclass(frozen=True)
class RunEvent(Generic[S, E]):
    """One event of a run. ``effect`` is set (and ``has_effect`` true) on effect events;
    ``execution_pointer`` equals the persisted pointer on terminal and checkpoint events."""

    type: EventType
    thread_id: str
    node: str = ""
    step: int = 0
    reason: str = ""
    execution_pointer: str = ""
    state: S | None = None
    effect: E | None = None
    has_effect: bool = False
    resume_token: ResumeToken | None = None

    @property
    def terminal(self) -> bool:
        """True for the last event of a run (suspended, handoff, completed, failed,
        context_canceled)."""
        return self.type in TERMINAL_EVENTS


class StreamHandle(Generic[S, E]):
    """A running stream: iterate it for events, ``wait_result()`` for the outcome.

    ``request_stop()`` ends the run with a resumable ``context_canceled`` snapshot and
    closes the event sink; ``request_local_handoff()`` hands the run off at its current
    point; ``cancel()`` cancels the run task (it saves, then ends with CancelledError).
    """

    def __init__(self, thread_id: str, *, max_buffer: int = 1024) -> None:
        self.thread_id: str = thread_id
        self._events: deque[RunEvent[S, E]] = deque()
        self._max_buffer = max(max_buffer, 1)
        self._ready = asyncio.Event()
        self._closed = False
        self._finished = False
        self.dropped_events: int = 0
        self._task: asyncio.Task[RunResult[S, E]] | None = None
        self._execution: RunControl | None = None

    # -- producer side (the runner) -------------------------------------------------
    def _emit(self, event: RunEvent[S, E]) -> None:
        if self._closed:
            return
        if len(self._events) >= self._max_buffer:
            # Drop the oldest progress event; terminal events are never dropped.
            for i, old in enumerate(self._events):
                if not old.terminal:
                    del self._events[i]
                    self.dropped_events += 1
                    break
        self._events.append(event)
        self._ready.set()

    def _finish(self) -> None:
        self._finished = True
        self._ready.set()

    def _attach(self, task: asyncio.Task[RunResult[S, E]], execution: RunControl) -> None:
        self._task = task
        self._execution = execution
        task.add_done_callback(lambda _t: self._finish())

    # -- consumer side -------------------------------------------------------------
    def __aiter__(self) -> StreamHandle[S, E]:
        return self

    async def __anext__(self) -> RunEvent[S, E]:
        while True:
            if self._events:
                return self._events.popleft()
            if self._closed or self._finished:
                raise StopAsyncIteration
            self._ready.clear()
            await self._ready.wait()

    @property
    def done(self) -> bool:
        """True once the run has terminated."""
        return self._task is not None and self._task.done()

    async def wait_result(self) -> RunResult[S, E]:
        """Wait for and return the terminal ``RunResult`` (the source of truth).

        Cancelling the waiter does not cancel the run. Raises ``CancelledError`` if the
        run itself was cancelled with ``cancel()``.
        """
        assert self._task is not None
        return await asyncio.shield(self._task)

    async def wait(self) -> None:
        """Wait for the run; raise the result's ``error`` if it has one."""
        (await self.wait_result()).raise_for_error()

    def request_stop(self) -> None:
        """Stop the run: it saves a resumable snapshot (reason ``context_canceled``) and the
        event sink closes. A no-op once the run has terminated."""
        self._closed = True
        self._events.clear()
        self._ready.set()
        if self._execution is not None and not self.done:
            self._execution.interrupt("stop")

    async def request_local_handoff(self) -> None:
        """Hand the run off at its current point and wait until that is persisted.

        Raises ``NoActiveExecutionError`` if the run has terminated or was stopped,
        ``CheckpointSkippedError`` if SKIP_ON_SAVE_ERROR skipped the save,
        ``HandoffEnqueueFailedError`` if the intent could not be enqueued (the snapshot is
        saved; the error carries the retry token), or the save/retention error.
        """
        ex = self._execution
        if ex is None or self.done or ex.interrupt_kind == "stop" or self._closed:
            raise NoActiveExecutionError(
                f"thread {self.thread_id!r} has no active execution to hand off "
                "(it terminated or request_stop() was called)"
            )
        ex.interrupt("handoff")
        result = await self.wait_result()
        result.raise_for_error()

    def cancel(self) -> None:
        """Cancel the run task; it saves a cancel snapshot and ends with CancelledError."""
        if self._task is not None:
            self._task.cancel()


async def collect_events_and_wait(
    handle: StreamHandle[S, E],
) -> tuple[list[RunEvent[S, E]], RunResult[S, E]]:
    """Drain every event and return them with the terminal result. Never deadlocks."""
    events = [ev async for ev in handle]
    return events, await handle.wait_result()


async def consume_events_and_wait(
    handle: StreamHandle[S, E],
    callback: Callable[[RunEvent[S, E]], bool | Awaitable[bool]],
) -> RunResult[S, E]:
    """Pass each event to ``callback``; when it returns False, ``request_stop()`` and
    drain silently. Returns the terminal result."""
    async for ev in handle:
        keep = callback(ev)
        if not isinstance(keep, bool):
            keep = await keep
        if not keep:
            handle.request_stop()
            break
    return await handle.wait_result()


@dataclass
class StreamCollectResult(Generic[S, E]):
    """What ``await_stream_collect`` gathered: the events and the terminal outcome.

    ``outcome.resume_token`` owns the resume point; ``snapshot`` is diagnostic only.
    """

    events: list[RunEvent[S, E]]
    outcome: RunResult[S, E]
    snapshot: Snapshot[Any] | None = None


@dataclass
class StreamCollector(Generic[S, E]):
    """A background drain started by ``begin_stream_collect``."""

    events: list[RunEvent[S, E]] = field(default_factory=lambda: [])
    task: asyncio.Task[None] | None = None


def begin_stream_collect(handle: StreamHandle[S, E]) -> StreamCollector[S, E]:
    """Start draining ``handle`` in the background. Call it before ``request_stop()``,
    ``request_local_handoff()`` or cancellation, then ``await_stream_collect``."""
    collector: StreamCollector[S, E] = StreamCollector()

    async def drain() -> None:
        async for ev in handle:
            collector.events.append(ev)

    collector.task = asyncio.ensure_future(drain())
    return collector


async def await_stream_collect(
    handle: StreamHandle[S, E], collector: StreamCollector[S, E]
) -> StreamCollectResult[S, E]:
    """Wait for the run and the background drain; return events and the outcome."""
    outcome = await handle.wait_result()
    if collector.task is not None:
        with contextlib.suppress(asyncio.CancelledError):
            await collector.task
    return StreamCollectResult(list(collector.events), outcome)


async def await_stream_collect_with_snapshot(
    handle: StreamHandle[S, E],
    collector: StreamCollector[S, E],
    checkpointer: Checkpointer[Any],
    thread_id: str,
) -> StreamCollectResult[S, E]:
    """Like ``await_stream_collect``, then load the thread's head snapshot (diagnostic
    only: the outcome's ``resume_token`` is authoritative). A missing thread gives
    ``snapshot=None``."""
    result = await await_stream_collect(handle, collector)
    try:
        result.snapshot, _ = await checkpointer.load(thread_id)
    except ThreadNotFoundError:
        result.snapshot = None
    return result
