"""The stream helpers under their specification names, as free functions.

Each is a one-line call of a :class:`flowy.StreamHandle` method; new code calls the
methods (``await handle.collect()``, ``await handle.consume(callback)``,
``handle.begin_collect()``). This module keeps the names a reader of the
specification looks for: ``CollectEventsAndWait``, ``ConsumeEventsAndWait``,
``BeginStreamCollect`` / ``AwaitStreamCollect`` and ``AwaitStreamCollectWithSnapshot``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic

from ._errors import ThreadNotFoundError
from ._events import RunEvent, StreamCollectResult, StreamHandle
from ._results import RunResult
from ._types import E, S
from .storage import Checkpointer

__all__ = [
    "StreamCollectResult",
    "StreamCollector",
    "await_stream_collect",
    "await_stream_collect_with_snapshot",
    "begin_stream_collect",
    "collect_events_and_wait",
    "consume_events_and_wait",
]


async def collect_events_and_wait(
    handle: StreamHandle[S, E],
) -> tuple[list[RunEvent[S, E]], RunResult[S, E]]:
    """Drain every event of ``handle`` and return them with the terminal result
    (``handle.collect()``)."""
    collected = await handle.collect()
    return collected.events, collected.outcome


async def consume_events_and_wait(
    handle: StreamHandle[S, E],
    callback: Callable[[RunEvent[S, E]], bool | Awaitable[bool]],
) -> RunResult[S, E]:
    """Pass each event of ``handle`` to ``callback`` until it returns False, then stop
    the run (``handle.consume``)."""
    return await handle.consume(callback)


@dataclass(frozen=True)
class StreamCollector(Generic[S, E]):
    """What ``begin_stream_collect`` returns: the handle whose events are being drained."""

    handle: StreamHandle[S, E]
    """The handle being drained."""


def begin_stream_collect(handle: StreamHandle[S, E]) -> StreamCollector[S, E]:
    """Start draining ``handle`` in the background (``handle.begin_collect()``)."""
    handle.begin_collect()
    return StreamCollector(handle)


async def await_stream_collect(
    handle: StreamHandle[S, E], collector: StreamCollector[S, E]
) -> StreamCollectResult[S, E]:
    """Wait for the run and the background drain ``collector`` started
    (``handle.collect()``). ``handle`` is not used: ``collector`` knows its handle (it is
    kept for the specification's signature)."""
    return await collector.handle.collect()


async def await_stream_collect_with_snapshot(
    handle: StreamHandle[S, E],
    collector: StreamCollector[S, E],
    checkpointer: Checkpointer[Any],
    thread_id: str,
) -> StreamCollectResult[S, E]:
    """Like ``await_stream_collect`` (``handle`` and ``collector`` as there), then load
    the head of ``thread_id`` from ``checkpointer`` into the result's ``snapshot``
    (diagnostic only; ``None`` if the thread is gone)."""
    result = await collector.handle.collect()
    try:
        result.snapshot, _ = await checkpointer.load(thread_id)
    except ThreadNotFoundError:
        result.snapshot = None
    return result
