"""Following a thread: the events ``Backend.watch`` yields, the messages progress travels
in, and the in-process hub that carries them where a store has no channel of its own.

A watcher reads the thread's saved snapshots from the store (its head, then its history
to fill whatever it missed) and hears the progress events of the process running the
thread through the store's channel (PostgreSQL ``NOTIFY``, Redis pub/sub) or, for a store
without one, through :data:`HUB` (progress of runs in this process only).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, Literal

from .._errors import ThreadNotFoundError
from .._types import JSON, RunStatus, S
from ._model import Snapshot, validate_thread_id

__all__ = [
    "HUB",
    "MAX_PROGRESS_BYTES",
    "TERMINAL_STATUSES",
    "Inbox",
    "ProgressHub",
    "WatchEvent",
    "decode_message",
    "encode_progress",
    "follow_thread",
    "subscribe_hub",
]

MAX_PROGRESS_BYTES = 7000
"""The largest progress event, in bytes of compact JSON (PostgreSQL's ``NOTIFY`` takes
payloads under 8000 bytes; every store keeps the same limit)."""

TERMINAL_STATUSES = frozenset({RunStatus.COMPLETED, RunStatus.FAILED})
"""The statuses after which a thread does not run again: a watch ends there."""


@dataclass(frozen=True)
class WatchEvent(Generic[S]):
    """One event of a watched thread (``Backend.watch``).

    A ``"snapshot"`` event carries a saved snapshot (``snapshot``, at ``revision``); a
    ``"progress"`` event carries what a node passed to ``flowy.live.progress`` (``data``,
    from ``node``; ``revision`` is the thread's revision when it was sent). Progress is
    ephemeral: a watcher that falls behind or reconnects may miss some; snapshots are
    never missed while the store keeps them.
    """

    kind: Literal["snapshot", "progress"]
    """``"snapshot"`` or ``"progress"``."""
    thread_id: str
    """The watched thread."""
    revision: int
    """The snapshot's revision, or the revision a progress event was sent at."""
    snapshot: Snapshot[S] | None = None
    """The saved snapshot (``"snapshot"`` events)."""
    data: JSON = None
    """What the node sent (``"progress"`` events)."""
    node: str = ""
    """The node that sent it (``"progress"`` events), or the snapshot's pointer."""

    @property
    def terminal(self) -> bool:
        """True for the last event of a watch: a snapshot of a completed or failed run."""
        return self.snapshot is not None and self.snapshot.status in TERMINAL_STATUSES


def encode_progress(node: str, revision: int, data: object) -> bytes:
    """The message carrying one progress event; ``TypeError`` if ``data`` is not JSON,
    ``ValueError`` if it is larger than :data:`MAX_PROGRESS_BYTES`."""
    try:
        text = json.dumps(
            {"n": node, "r": revision, "d": data}, separators=(",", ":"), allow_nan=False
        )
    except (TypeError, ValueError) as exc:
        raise TypeError(f"progress data must be a JSON value: {exc}") from None
    message = text.encode()
    if len(message) > MAX_PROGRESS_BYTES:
        raise ValueError(
            f"a progress event is {len(message)} bytes as JSON; the limit is "
            f"{MAX_PROGRESS_BYTES} bytes (send smaller pieces)"
        )
    return message


def decode_message(message: bytes | str) -> tuple[str, int, JSON] | None:
    """``(node, revision, data)`` of the progress ``message``, or ``None`` for one that
    is not (a stray message on the channel is ignored, never fatal)."""
    try:
        value: Any = json.loads(message)
        node, revision, data = value["n"], value["r"], value["d"]
    except (ValueError, TypeError, KeyError):
        return None
    if not isinstance(node, str) or not isinstance(revision, int):
        return None
    return node, revision, data


class Inbox:
    """What a watcher has heard and not yet taken: bounded, the oldest dropped first
    when full (``dropped`` counts them), with an event to wait on.

    A store whose channel delivers asynchronously sets ``sync`` in ``_subscribe``: a
    call that returns once every message sent before it was called is in the inbox (a
    round trip on the listening connection). The watch calls it before it yields newly
    read snapshots, so progress sent before a snapshot is never yielded after it.

    Args:
        size: the most messages it holds.
    """

    def __init__(self, size: int = 1024) -> None:
        self.messages: deque[bytes] = deque()
        self.size: int = size
        self.dropped: int = 0
        self.ready: asyncio.Event = asyncio.Event()
        self.sync: Callable[[], Awaitable[None]] | None = None
        self._loop = asyncio.get_running_loop()

    def put(self, message: bytes) -> None:
        """Add ``message`` (from the watcher's own event loop)."""
        if len(self.messages) >= self.size:
            self.messages.popleft()
            self.dropped += 1
        self.messages.append(message)
        self.ready.set()

    def put_threadsafe(self, message: bytes) -> None:
        """Add ``message`` from any thread or event loop."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self.put(message)
        elif not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.put, message)


class ProgressHub:
    """Progress of runs in this process, for watchers in this process: by store
    (its domain) and thread. Delivering to a thread nobody watches is one lookup."""

    def __init__(self) -> None:
        self._inboxes: dict[tuple[Hashable, str], set[Inbox]] = {}

    def listening(self, domain: Hashable, thread_id: str) -> bool:
        """True if a watcher in this process follows the thread."""
        return (domain, thread_id) in self._inboxes

    def deliver(self, domain: Hashable, thread_id: str, message: bytes) -> None:
        """Give ``message`` to every watcher of the thread in this process."""
        for inbox in tuple(self._inboxes.get((domain, thread_id), ())):
            inbox.put_threadsafe(message)

    def subscribe(self, domain: Hashable, thread_id: str, inbox: Inbox) -> Callable[[], None]:
        """Deliver the thread's progress to ``inbox``; returns the unsubscribe call."""
        key = (domain, thread_id)
        self._inboxes.setdefault(key, set()).add(inbox)

        def unsubscribe() -> None:
            inboxes = self._inboxes.get(key)
            if inboxes is not None:
                inboxes.discard(inbox)
                if not inboxes:
                    del self._inboxes[key]

        return unsubscribe


HUB = ProgressHub()
"""The process's hub (stores without a channel of their own, and loose components)."""


Subscribe = Callable[[Inbox], Awaitable[Callable[[], Awaitable[None]]]]
"""Starts delivering a thread's messages into an inbox; returns the call that stops."""

_HISTORY_PAGE = 10_000
"""The most snapshots a watch reads from the history at once."""


async def subscribe_hub(
    domain: Hashable, thread_id: str, inbox: Inbox
) -> Callable[[], Awaitable[None]]:
    """Deliver the thread's progress in this process (:data:`HUB`) into ``inbox``."""
    unsubscribe = HUB.subscribe(domain, thread_id, inbox)

    async def stop() -> None:
        unsubscribe()

    return stop


async def follow_thread(
    checkpointer: Any, thread_id: str, after: int | None, poll: float, subscribe: Subscribe
) -> AsyncIterator[WatchEvent[Any]]:
    """What ``Backend.watch`` yields: the snapshots of ``checkpointer`` (a
    ``Checkpointer``) and the progress ``subscribe`` delivers (its docstring says how)."""
    validate_thread_id(thread_id)
    if after is not None and (
        isinstance(after, bool) or not isinstance(after, int) or after < 0  # pyright: ignore[reportUnnecessaryIsInstance]
    ):
        raise ValueError(f"after must be a revision (an int >= 0) or None, got {after!r:.80}")
    if not (isinstance(poll, int | float) and math.isfinite(poll) and poll > 0):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ValueError(f"poll must be a positive number of seconds, got {poll!r:.80}")
    inbox = Inbox()
    stop = await subscribe(inbox)
    try:
        async for event in _follow(checkpointer, thread_id, after, poll, inbox):
            yield event
    finally:
        await stop()


async def _follow(
    cp: Any, thread_id: str, after: int | None, poll: float, inbox: Inbox
) -> AsyncIterator[WatchEvent[Any]]:
    last = after
    seen = after is not None and after > 0
    reloaded = 0  # the newest revision a progress event made us read the store for
    while True:
        # The snapshots saved since the last one yielded: the head, then the history
        # below it for whatever came between.
        try:
            head: Snapshot[Any]
            head, revision = await cp.load(thread_id)
        except ThreadNotFoundError:
            if seen:
                return  # deleted while watched (delete_on_success, retention)
            last = 0  # not saved yet: every snapshot it gets is new
        else:
            seen = True
            if last is None or revision > last:
                if inbox.sync is not None:
                    await inbox.sync()  # what was sent before this snapshot is here now
                news: list[Snapshot[Any]] = [head]
                if last is not None and revision - last > 1:
                    older = await _history_between(cp, thread_id, last, revision)
                    news = [*older, head]
                for snapshot in news:
                    # Progress sent before this snapshot was saved comes first.
                    for event in _progress_before(thread_id, inbox, snapshot.revision):
                        yield event
                    yield WatchEvent("snapshot", thread_id, snapshot.revision, snapshot)
                last = revision
            if head.status in TERMINAL_STATUSES:
                return  # done: also when it was already, at or below ``after``
        # Wait for progress, or the next poll.
        deadline = time.monotonic() + poll
        while True:
            if not inbox.messages:
                inbox.ready.clear()
                try:
                    await asyncio.wait_for(inbox.ready.wait(), max(deadline - time.monotonic(), 0))
                except TimeoutError:
                    break
            moved = False
            while inbox.messages:
                decoded = decode_message(inbox.messages[0])
                if decoded is None:
                    inbox.messages.popleft()
                    continue
                node, sent_at, data = decoded
                if sent_at > (last or 0) and sent_at > reloaded:
                    reloaded = sent_at  # read the snapshots it follows first, once
                    moved = True
                    break
                inbox.messages.popleft()
                yield WatchEvent("progress", thread_id, sent_at, data=data, node=node)
            if moved or time.monotonic() >= deadline:
                break


async def _history_between(
    cp: Any, thread_id: str, last: int, revision: int
) -> list[Snapshot[Any]]:
    """The kept snapshots strictly between revisions ``last`` and ``revision``, oldest
    first. A store may give fewer entries than the limit asked for (``get_history``
    promises "up to"): ask for more until they are all there or no more come."""
    wanted = set(range(last + 1, revision))
    limit = min(revision - last, _HISTORY_PAGE)
    found: list[Snapshot[Any]] = []
    while True:
        older: list[Snapshot[Any]] = await cp.get_history(thread_id, limit)
        grew = len(older) > len(found)
        found = older
        if wanted <= {s.revision for s in found} or not grew or limit >= _HISTORY_PAGE:
            break
        limit = min(limit * 2, _HISTORY_PAGE)
    return [s for s in reversed(found) if last < s.revision < revision]


def _progress_before(thread_id: str, inbox: Inbox, revision: int) -> list[WatchEvent[Any]]:
    """Take from ``inbox`` the progress events sent at a revision below ``revision``."""
    events: list[WatchEvent[Any]] = []
    while inbox.messages:
        decoded = decode_message(inbox.messages[0])
        if decoded is not None:
            node, sent_at, data = decoded
            if sent_at >= revision:
                break
            events.append(WatchEvent("progress", thread_id, sent_at, data=data, node=node))
        inbox.messages.popleft()
    return events
