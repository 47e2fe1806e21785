"""Recent-threads contract tests: ``recent_threads`` lists heads most recently saved
first, to the second (``floor(updated_at)`` descending, then thread id descending in code
point order), a page at a time through its ``(second, thread_id)`` cursor.

Every store runs them: one with a recency index (``Capabilities.recent_index``) answers
from it, one without from the base's scan of its heads; the answers are the same. Save
times are the snapshots' own ``updated_at``, so no test waits for the clock.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from ..._errors import InvalidThreadIdError
from ...storage import Backend, Checkpointer, ThreadSummary, recent_key, recent_threads
from ._support import Suite, make_snapshot, new_thread_id

__all__ = ["RecentThreadsSuite"]

BASE = 1_700_000_000
"""A whole second every store keeps exactly; the tests save at seconds around it."""


async def _save(cp: Checkpointer[Any], thread_id: str, at: float, revision: int = 0) -> int:
    snap = make_snapshot(thread_id, {"n": revision + 1}, updated_at=at)
    return await cp.save(revision, snap)


async def _all(cp: Checkpointer[Any], page: int) -> list[ThreadSummary]:
    """Every head, through pages of ``page`` rows and the cursor of each page's last."""
    out: list[ThreadSummary] = []
    before = None
    for _ in range(10_000):
        rows = await recent_threads(cp, limit=page, before=before)
        out += rows
        if len(rows) < page:
            return out
        before = recent_key(rows[-1])
    raise AssertionError("recent_threads never ended")


def _ids(rows: list[ThreadSummary]) -> list[str]:
    return [s.thread_id for s in rows]


class RecentThreadsSuite(Suite):
    """``recent_threads``: newest second first, then thread id, paged by a keyset cursor."""

    async def test_orders_by_second_then_thread_id(self, flowy_backend: Backend[Any]) -> None:
        cp = flowy_backend.checkpointer
        label = new_thread_id("recent")
        # Within one second the order is by thread id, whatever the times inside it.
        early, late = f"{label}-a", f"{label}-b"
        await _save(cp, late, BASE + 0.1)
        await _save(cp, early, BASE + 0.9)
        newest = f"{label}-0"
        await _save(cp, newest, BASE + 1.0)
        oldest = f"{label}-z"
        await _save(cp, oldest, BASE - 0.5)
        rows = await recent_threads(cp, limit=10)
        assert _ids(rows) == [newest, late, early, oldest]
        assert [s.revision for s in rows] == [1, 1, 1, 1]
        assert rows[1].updated_at == BASE + 0.1  # the head's summary, as list_threads has it

    async def test_thread_ids_compare_by_code_point(self, flowy_backend: Backend[Any]) -> None:
        cp = flowy_backend.checkpointer
        label = new_thread_id("points")
        ids = [f"{label}-{suffix}" for suffix in ("Z", "a", "\u00e9", "\uffee", "\U0001f600")]
        for thread_id in random.sample(ids, len(ids)):
            await _save(cp, thread_id, BASE + 0.5)
        assert _ids(await recent_threads(cp, limit=10)) == sorted(ids, reverse=True)

    async def test_pages_return_each_thread_once(self, flowy_backend: Backend[Any]) -> None:
        cp = flowy_backend.checkpointer
        label = new_thread_id("pages")
        ids = [f"{label}-{i:02d}" for i in range(23)]
        for i, thread_id in enumerate(random.sample(ids, len(ids))):
            await _save(cp, thread_id, BASE + (i % 4) + 0.25)
        whole = await recent_threads(cp, limit=100)
        assert len(whole) == 23
        assert [recent_key(s) for s in whole] == sorted(map(recent_key, whole), reverse=True)
        for page in (1, 2, 5, 7, 23):
            assert _ids(await _all(cp, page)) == _ids(whole), page
        # The same threads as list_threads, in recency order.
        listed = await cp.list_threads(limit=100)
        assert _ids(sorted(listed, key=recent_key, reverse=True)) == _ids(whole)

    async def test_a_cursor_past_a_deleted_thread_still_pages(
        self, flowy_backend: Backend[Any]
    ) -> None:
        cp = flowy_backend.checkpointer
        label = new_thread_id("gone")
        ids = [f"{label}-{i}" for i in range(6)]
        for i, thread_id in enumerate(ids):
            await _save(cp, thread_id, BASE + i // 2)
        first = await recent_threads(cp, limit=3)
        assert _ids(first) == [ids[5], ids[4], ids[3]]
        await cp.delete(ids[3])  # the cursor's own thread
        rest = await recent_threads(cp, limit=10, before=recent_key(first[-1]))
        assert _ids(rest) == [ids[2], ids[1], ids[0]]
        # A cursor between stored keys, and past the end.
        assert _ids(await recent_threads(cp, limit=10, before=(BASE + 1, f"{label}-3"))) == [
            ids[2],
            ids[1],
            ids[0],
        ]
        assert await recent_threads(cp, limit=10, before=(BASE - 1, label)) == []

    async def test_a_save_in_a_new_second_moves_the_thread(
        self, flowy_backend: Backend[Any]
    ) -> None:
        cp = flowy_backend.checkpointer
        label = new_thread_id("move")
        one, two = f"{label}-1", f"{label}-2"
        await _save(cp, one, BASE + 0.2)
        await _save(cp, two, BASE + 1.2)
        assert _ids(await recent_threads(cp, limit=10)) == [two, one]
        await _save(cp, one, BASE + 2.7, revision=1)
        rows = await recent_threads(cp, limit=10)
        assert _ids(rows) == [one, two]
        assert (rows[0].revision, rows[0].updated_at) == (2, BASE + 2.7)
        # A save in the same second keeps the place and shows the new head.
        await _save(cp, one, BASE + 2.9, revision=2)
        rows = await recent_threads(cp, limit=10)
        assert _ids(rows) == [one, two]
        assert (rows[0].revision, rows[0].updated_at) == (3, BASE + 2.9)
        # A save stamped earlier (another process's clock) moves it back: the order is
        # the head's own save second, whichever way it changed.
        await _save(cp, one, BASE + 0.5, revision=3)
        rows = await recent_threads(cp, limit=10)
        assert _ids(rows) == [two, one]
        assert _ids(await recent_threads(cp, limit=10, before=recent_key(rows[0]))) == [one]

    async def test_deleted_threads_disappear(self, flowy_backend: Backend[Any]) -> None:
        cp = flowy_backend.checkpointer
        label = new_thread_id("delete")
        kept, gone, idle = f"{label}-kept", f"{label}-gone", f"{label}-idle"
        for i, thread_id in enumerate((kept, gone, idle)):
            await _save(cp, thread_id, BASE + i)
        await cp.delete(gone)
        await cp.delete_if_idle(idle)
        assert _ids(await recent_threads(cp, limit=10)) == [kept]
        await _save(cp, gone, BASE - 3)  # a new thread under the old id
        assert _ids(await recent_threads(cp, limit=10)) == [kept, gone]

    async def test_limit_and_cursor_are_checked(self, flowy_backend: Backend[Any]) -> None:
        cp = flowy_backend.checkpointer
        await _save(cp, new_thread_id("checked"), BASE)
        assert await recent_threads(cp, limit=0) == []
        assert len(await recent_threads(cp, limit=1)) == 1
        with pytest.raises(ValueError, match="limit"):
            await recent_threads(cp, limit=-1)
        with pytest.raises(TypeError, match="limit"):
            await recent_threads(cp, limit=1.5)  # pyright: ignore[reportArgumentType]
        bad: list[tuple[object, type[Exception]]] = [
            ("1700000000~t", TypeError),
            ((BASE,), TypeError),
            ((float(BASE), "t"), TypeError),
            ((True, "t"), TypeError),
            ((BASE, 7), TypeError),
            ((-1, "t"), ValueError),
            ((10**15, "t"), ValueError),
            ((BASE, ""), InvalidThreadIdError),
            ((BASE, "a\x00b"), InvalidThreadIdError),
        ]
        for cursor, error in bad:
            with pytest.raises(error):
                await recent_threads(cp, limit=5, before=cursor)  # pyright: ignore[reportArgumentType]
            with pytest.raises(error):
                await recent_threads(cp, limit=0, before=cursor)  # pyright: ignore[reportArgumentType]

    async def test_an_empty_store_lists_nothing(self, flowy_backend: Backend[Any]) -> None:
        cp = flowy_backend.checkpointer
        assert await recent_threads(cp, limit=10) == []
        assert await recent_threads(cp, limit=10, before=(BASE, "t")) == []
