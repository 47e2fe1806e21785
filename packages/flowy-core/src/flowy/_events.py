"""Run events and the ``StreamHandle``: watch a run, stop it, hand it off, collect it
(``StreamStart`` is what ``Runner.stream`` returns before the handle).

Events are best-effort progress: a slow or absent consumer never blocks the run (the
buffer drops the oldest progress events when full, never the terminal one). The
terminal ``RunResult`` from ``wait_result()`` is the source of truth; a terminal
event's reason always equals the result's reason. Nothing here deadlocks, whatever the
consumer does.
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Generator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, Literal, Protocol

from ._errors import CheckpointSkippedError, NoActiveExecutionError
from ._results import Reason, RunResult
from ._types import E, ResumeToken, RunStatus, S
from .storage import Snapshot

__all__ = [
    "EventSink",
    "EventType",
    "InterruptKind",
    "RunControl",
    "RunEvent",
    "StreamCollectResult",
    "StreamHandle",
    "StreamStart",
]


class EventType(enum.StrEnum):
    """The kind of a run event."""

    NODE_STARTED = "node_started"
    """A node is about to run (``node``, ``step``)."""
    NODE_COMPLETED = "node_completed"
    """A node returned and its update was merged (``node``, ``step``, ``state``)."""
    EFFECT = "effect"
    """A node emitted an effect (``effect``)."""
    PROGRESS = "progress"
    """A node sent progress with ``flowy.live.progress`` (``node``, ``data``); never
    saved, the first dropped when the consumer falls behind."""
    CHECKPOINT_FAILED = "checkpoint_failed"
    """A save failed and ``SKIP_ON_SAVE_ERROR`` let the run go on
    (reason ``*_checkpoint_skipped``)."""
    SUSPENDED = "suspended"
    """Terminal: the run suspended."""
    WAITING = "waiting"
    """Terminal: the run waits for its wake-up time or its signal."""
    HANDOFF = "handoff"
    """Terminal: the run was handed off."""
    COMPLETED = "completed"
    """Terminal: the run completed."""
    FAILED = "failed"
    """Terminal: the run failed."""
    CONTEXT_CANCELED = "context_canceled"
    """Terminal: the run was stopped or cancelled."""


TERMINAL_EVENTS = frozenset(
    {
        EventType.SUSPENDED,
        EventType.WAITING,
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
    """The kind of event."""
    thread_id: str
    """The thread of the run."""
    node: str = ""
    """The node of node and effect events."""
    step: int = 0
    """The step number in the segment, on node and effect events."""
    reason: str = ""
    """The reason, on terminal events (the result's) and ``checkpoint_failed`` events."""
    execution_pointer: str = ""
    state: S | None = None
    """The state after the step (``node_completed``) or at the end (``completed``, and
    ``failed`` unless a node, the reducer or a router raised, the lease was lost or the
    save failed); else ``None``."""
    effect: E | None = None
    has_effect: bool = False
    resume_token: ResumeToken | None = None
    """The token of the persisted snapshot, on terminal events that persisted one."""
    data: Any = None
    """What the node sent, on ``progress`` events."""

    @property
    def terminal(self) -> bool:
        """True for the last event of a run (suspended, handoff, completed, failed,
        context_canceled)."""
        return self.type in TERMINAL_EVENTS


InterruptKind = Literal["stop", "handoff", "lease_lost"]
"""Why a run is interrupted: ``"stop"`` (``request_stop``), ``"handoff"``
(``request_local_handoff``) or ``"lease_lost"`` (its lease could not be renewed)."""


class RunControl(Protocol):
    """What a ``StreamHandle`` may do to the execution it watches."""

    interrupt_kind: InterruptKind | None
    """The interrupt requested so far, if any."""

    def interrupt(self, kind: InterruptKind) -> None:
        """Ask the run to stop at the next safe point (a node is cancelled)."""
        ...


class EventSink(Generic[S, E]):
    """The producer side of a stream: the execution emits here, the handle reads."""

    def __init__(self, max_buffer: int = 1024) -> None:
        self.events: deque[RunEvent[S, E]] = deque()
        self.max_buffer: int = max(max_buffer, 1)
        self.ready: asyncio.Event = asyncio.Event()
        self.closed: bool = False
        self.finished: bool = False
        self.dropped: int = 0

    def emit(self, event: RunEvent[S, E]) -> None:
        """Buffer ``event``; when full, drop the oldest ``progress`` event, else the
        oldest other event that is not terminal."""
        if self.closed:
            return
        if len(self.events) >= self.max_buffer:
            # The oldest progress event goes first, then the oldest other non-terminal.
            victim = next(
                (i for i, old in enumerate(self.events) if old.type is EventType.PROGRESS),
                None,
            )
            if victim is None:
                victim = next((i for i, old in enumerate(self.events) if not old.terminal), None)
            if victim is not None:
                del self.events[victim]
                self.dropped += 1
        self.events.append(event)
        self.ready.set()

    def close(self) -> None:
        """The consumer stopped listening: drop what is buffered and what comes."""
        self.closed = True
        self.events.clear()
        self.ready.set()

    def finish(self) -> None:
        """The run ended: iteration stops once the buffer is drained."""
        self.finished = True
        self.ready.set()


@dataclass
class StreamCollectResult(Generic[S, E]):
    """The events a collection gathered and the terminal outcome.

    ``outcome.resume_token`` owns the resume point; ``snapshot`` (the head loaded after
    the run, when asked for) is diagnostic only.
    """

    events: list[RunEvent[S, E]]
    """The events drained, in order (progress events dropped on overflow are missing)."""
    outcome: RunResult[S, E]
    """The terminal result of the run."""
    snapshot: Snapshot[Any] | None = None


LoadHead = Callable[[], Awaitable[Snapshot[Any] | None]]


class StreamHandle(Generic[S, E]):
    """A running stream: iterate it for events, ``wait_result()`` for the outcome.

    ``request_stop()`` ends the run with a resumable ``context_canceled`` snapshot and
    closes the event sink; ``request_local_handoff()`` hands the run off at its current
    point; ``cancel()`` cancels the run task (the same terminal save, then
    ``CancelledError``). ``collect()`` and ``consume()`` drain events and return the
    outcome without ever deadlocking. As ``async with``, the handle stops the run on
    exit if it is still going.

    ``Runner.stream`` and ``Runner.resume_stream`` build handles; the arguments are
    theirs to give.

    Args:
        thread_id: the thread of the run.
        sink: the buffer the run emits its events into.
        task: the task running the segment.
        control: the execution the handle interrupts.
        load_head: loads the thread's head for ``collect(snapshot=True)``.
    """

    def __init__(
        self,
        thread_id: str,
        sink: EventSink[S, E],
        task: asyncio.Task[RunResult[S, E]],
        control: RunControl,
        load_head: LoadHead | None = None,
    ) -> None:
        self.thread_id: str = thread_id
        self._sink = sink
        self._task = task
        self._control = control
        self._load_head = load_head
        self._collected: list[RunEvent[S, E]] = []
        self._collector: asyncio.Task[None] | None = None
        task.add_done_callback(lambda _t: sink.finish())

    # -- events ----------------------------------------------------------------------
    def __aiter__(self) -> StreamHandle[S, E]:
        return self

    async def __anext__(self) -> RunEvent[S, E]:
        sink = self._sink
        while True:
            if sink.events:
                return sink.events.popleft()
            if sink.closed or sink.finished:
                raise StopAsyncIteration
            sink.ready.clear()
            await sink.ready.wait()

    @property
    def dropped_events(self) -> int:
        """Progress events dropped because the consumer fell behind."""
        return self._sink.dropped

    @property
    def done(self) -> bool:
        """True once the run has terminated."""
        return self._task.done()

    # -- outcome ---------------------------------------------------------------------
    async def wait_result(self) -> RunResult[S, E]:
        """Wait for and return the terminal ``RunResult`` (the source of truth).

        Cancelling the waiter does not cancel the run. Raises ``CancelledError`` if the
        run itself was cancelled with ``cancel()``.
        """
        return await asyncio.shield(self._task)

    async def wait(self) -> None:
        """Wait for the run; raise the result's ``error`` if it has one."""
        (await self.wait_result()).raise_for_error()

    # -- control ---------------------------------------------------------------------
    def request_stop(self) -> None:
        """Stop the run: it saves a resumable snapshot (reason ``context_canceled``) and
        the event sink closes. A no-op once the run has terminated."""
        self._sink.close()
        if not self.done:
            self._control.interrupt("stop")

    async def request_local_handoff(self) -> None:
        """Hand the run off at its current point and wait until that is persisted.

        Returns only when the hand-off was persisted. Raises ``NoActiveExecutionError``
        if the run has terminated, was stopped, or ended on its own (suspended, completed,
        failed) while the request was in flight; ``CheckpointSkippedError`` if
        SKIP_ON_SAVE_ERROR skipped the save or the runner has no store to persist it in;
        ``HandoffEnqueueFailedError`` if the intent could not be enqueued (the snapshot is
        saved; the error carries the retry token), or the save/retention error.
        """
        if self.done or self._control.interrupt_kind == "stop" or self._sink.closed:
            raise NoActiveExecutionError(
                f"thread {self.thread_id!r:.200} has no active execution to hand off "
                "(it terminated or request_stop() was called)"
            )
        self._control.interrupt("handoff")
        result = await self.wait_result()
        if result.reason == Reason.HANDOFF_SAVE_FAILED:
            # The hand-off was attempted and its save failed: that error, not "ended on
            # its own", is what the caller must see.
            result.raise_for_error()
        if result.status is not RunStatus.HANDOFF:
            # The run ended on its own (suspended, completed, failed) before it reached a
            # point where it could hand off: nothing was handed off.
            raise NoActiveExecutionError(
                f"thread {self.thread_id!r:.200} ended on its own ({result.status.value}, "
                f"{result.reason}) before the hand-off; nothing was handed off"
            )
        result.raise_for_error()
        if result.resume_token is None:
            raise CheckpointSkippedError(
                f"the hand-off of thread {self.thread_id!r:.200} was not persisted: the runner "
                "has no store"
            )

    def cancel(self) -> None:
        """Cancel the run task; it saves a cancel snapshot and ends with CancelledError."""
        self._task.cancel()

    # -- collection --------------------------------------------------------------------
    def begin_collect(self) -> None:
        """Start draining events in the background now. Call it before
        ``request_stop()``, ``request_local_handoff()`` or ``cancel()``, then
        ``await collect()``. Idempotent."""
        if self._collector is None:

            async def drain() -> None:
                async for event in self:
                    self._collected.append(event)

            self._collector = asyncio.ensure_future(drain())

    async def collect(self, *, snapshot: bool = False) -> StreamCollectResult[S, E]:
        """Drain every event and wait for the outcome; with ``snapshot``, also load the
        thread's head afterwards (diagnostic only: the outcome's ``resume_token`` is
        authoritative; ``None`` if the thread is gone)."""
        self.begin_collect()
        assert self._collector is not None
        outcome = await self.wait_result()
        try:
            await asyncio.shield(self._collector)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # our caller is being cancelled: never swallow that
        result = StreamCollectResult(list(self._collected), outcome)
        if snapshot and self._load_head is not None:
            result.snapshot = await self._load_head()
        return result

    async def consume(
        self, callback: Callable[[RunEvent[S, E]], bool | Awaitable[bool]]
    ) -> RunResult[S, E]:
        """Pass each event to ``callback``; when it returns ``False``, ``request_stop()``
        and stop listening. Returns the terminal result."""
        async for event in self:
            keep = callback(event)
            if not isinstance(keep, bool):
                keep = await keep
            if not keep:
                self.request_stop()
                break
        return await self.wait_result()

    # -- ownership -------------------------------------------------------------------
    async def __aenter__(self) -> StreamHandle[S, E]:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self.done:
            self.request_stop()
        try:
            await asyncio.shield(self._task)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
        if self._collector is not None and not self._collector.done():
            self._collector.cancel()


class StreamStart(Generic[S, E]):
    """What ``Runner.stream`` / ``resume_stream`` return: await it for the
    ``StreamHandle``, or use it as ``async with`` so the run is stopped (with its
    terminal save) and awaited when the block ends.

    Args:
        opening: the coroutine that runs the preflight, starts the run and returns its
            handle (awaited once).
    """

    def __init__(self, opening: Coroutine[Any, Any, StreamHandle[S, E]]) -> None:
        self._opening = opening
        self._handle: StreamHandle[S, E] | None = None

    def __await__(self) -> Generator[Any, None, StreamHandle[S, E]]:
        return self._opening.__await__()

    async def __aenter__(self) -> StreamHandle[S, E]:
        self._handle = await self._opening
        return self._handle

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._handle is not None:
            await self._handle.__aexit__(exc_type, exc, tb)
