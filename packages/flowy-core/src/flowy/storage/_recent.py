"""Threads by recency: the order of ``recent_threads``, its cursor, and the scan stores
without a recency index answer it with.

The recency of a head is its save time to the second (``floor(updated_at)``), then its
thread id: threads come newest second first, and within one second by thread id in
descending code point order (the order of the ids' UTF-8 bytes, which every store's id
cursor uses too). Coarse on purpose: a store writes its recency index only when a save
lands in another second than the thread's save before, so the many saves of a run
within one second cost it nothing.

A page's cursor is the :func:`recent_key` of its last row, ``(second, thread_id)``; its
text form (for a command line or a URL) is ``SECOND~THREAD``, :func:`cursor_text` and
:func:`parse_cursor`.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

from ._checks import check_count
from ._limits import MAX_TIMESTAMP
from ._model import ThreadSummary, validate_thread_id
from ._protocols import Checkpointer

__all__ = [
    "RecentCursor",
    "RecentThreads",
    "check_cursor",
    "cursor_text",
    "parse_cursor",
    "recent_key",
    "recent_second",
    "recent_threads",
    "scan_recent",
]

RecentCursor = tuple[int, str]
"""``(second, thread_id)``: where a page of ``recent_threads`` ends (its last row's)."""

ListPage = Callable[[int, str | None], Awaitable[list[ThreadSummary]]]
"""``list_threads``: up to ``limit`` heads by thread id, past ``after``."""

SCAN_PAGE = 500
"""Heads per ``list_threads`` call of :func:`scan_recent`."""

_MAX_SECOND = math.floor(MAX_TIMESTAMP)


def recent_second(updated_at: float) -> int:
    """The recency second of a head saved at ``updated_at``: ``floor(updated_at)``."""
    return math.floor(updated_at)


def recent_key(summary: ThreadSummary) -> RecentCursor:
    """``(second, thread_id)`` of a head ``summary``: ``recent_threads`` lists heads in
    descending order of it, and the last row's is the ``before`` of the next page."""
    return (recent_second(summary.updated_at), summary.thread_id)


def check_cursor(before: object) -> RecentCursor | None:
    """``before`` of ``recent_threads`` checked: ``None`` or ``(second, thread_id)``.

    Raises:
        TypeError: not a pair of a whole number of seconds and a thread id.
        ValueError: the second is outside 0 .. ``MAX_TIMESTAMP``.
        InvalidThreadIdError: the thread id is not one a store keeps.
    """
    if before is None:
        return None
    if not isinstance(before, tuple) or len(before) != 2:  # pyright: ignore[reportUnknownArgumentType]
        raise TypeError(
            "before must be the (second, thread_id) of the last thread of a page "
            f"(flowy.storage.recent_key), got {before!r:.80}"
        )
    second, thread_id = before  # pyright: ignore[reportUnknownVariableType]
    if isinstance(second, bool) or not isinstance(second, int):
        raise TypeError(
            f"the second of before must be a whole number of seconds, got {second!r:.80}"
        )
    if not 0 <= second <= _MAX_SECOND:
        raise ValueError(
            f"the second of before must be within 0 .. {_MAX_SECOND} (the stored range of "
            f"times), got {second!r}"
        )
    if not isinstance(thread_id, str):
        raise TypeError(f"the thread id of before must be text, got {thread_id!r:.80}")
    validate_thread_id(thread_id)
    return (second, thread_id)


def cursor_text(cursor: RecentCursor) -> str:
    """The text form of a cursor: ``SECOND~THREAD``."""
    return f"{cursor[0]}~{cursor[1]}"


def parse_cursor(text: str) -> RecentCursor:
    """A cursor from its text form ``SECOND~THREAD`` (:func:`cursor_text`).

    Raises:
        ValueError: ``text`` is not of that form (``InvalidThreadIdError`` for a thread
            id no store keeps).
    """
    second, sep, thread_id = text.partition("~")
    if not sep or not second.isascii() or not second.isdigit():
        raise ValueError(
            f"a recent-threads cursor is SECOND~THREAD (the last row's save second and "
            f"thread id), got {text[:80]!r}"
        )
    cursor = check_cursor((int(second), thread_id))
    assert cursor is not None
    return cursor


async def scan_recent(
    list_page: ListPage, limit: int, before: RecentCursor | None
) -> list[ThreadSummary]:
    """Up to ``limit`` heads in recency order past ``before``, by reading every head
    through ``list_page`` (the id cursor) and sorting them here: O(threads) per call,
    what a store without a recency index answers with."""
    best: list[ThreadSummary] = []
    after: str | None = None
    while True:
        page = await list_page(SCAN_PAGE, after)
        best.extend(s for s in page if before is None or recent_key(s) < before)
        if len(best) > 4 * limit + SCAN_PAGE:  # keep memory bounded by the page asked for
            best = sorted(best, key=recent_key, reverse=True)[:limit]
        if len(page) < SCAN_PAGE:
            break
        after = page[-1].thread_id
    return sorted(best, key=recent_key, reverse=True)[:limit]


@runtime_checkable
class RecentThreads(Protocol):
    """A checkpointer that lists heads by recency (``BaseCheckpointer`` and the
    wrappers of flowy do)."""

    async def recent_threads(
        self, *, limit: int = 100, before: RecentCursor | None = None
    ) -> list[ThreadSummary]:
        """Up to ``limit`` heads, most recently saved first (to the second)."""
        ...


async def recent_threads(
    checkpointer: Checkpointer[Any], *, limit: int = 100, before: RecentCursor | None = None
) -> list[ThreadSummary]:
    """Up to ``limit`` thread heads of ``checkpointer``, most recently saved first (to
    the second), below ``before`` (the :func:`recent_key` of the last row of the page
    before): the checkpointer's own ``recent_threads`` where it has one
    (``BaseCheckpointer.recent_threads``), else a read of every head through its
    ``list_threads``, sorted."""
    if isinstance(checkpointer, RecentThreads):
        return await checkpointer.recent_threads(limit=limit, before=before)
    cursor = check_cursor(before)
    if check_count(limit, "limit") == 0:
        return []
    return await scan_recent(
        lambda size, after: checkpointer.list_threads(limit=size, after=after), limit, cursor
    )
