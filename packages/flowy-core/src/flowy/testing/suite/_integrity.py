"""Thread id and record contract tests: any valid thread id is stored exactly and
isolated, invalid ones are refused, and a corrupted record is reported.
"""

from __future__ import annotations

from typing import Any, cast

import pytest

from ..._errors import InvalidThreadIdError, SnapshotEnvelopeInvalidError
from ...storage import Backend
from ...storage.dialect import MAX_THREAD_ID_BYTES
from ._support import (
    Corrupt,
    Suite,
    make_snapshot,
    new_thread_id,
    require_corrupt,
    require_leases,
    saved_chain,
    try_load,
)

__all__ = ["CorruptionSuite", "ThreadIdSuite"]


_SPECIAL_IDS: tuple[str, ...] = (
    "{",
    "}",
    "{tag}",
    "{tag}:x",
    "{a}:b",
    ":",
    "a:b",
    "a",
    ":b",
    "a:",
    "A",
    "a ",
    " a",
    "x",
    "x\n",
    "\nx",
    "line1\nline2",
    "\r\n",
    "tab\tid",
    '"quoted"',
    "'single'",
    "x'; DROP TABLE threads; --",
    "back\\slash",
    "%s%d%%",
    "*",
    "?",
    "[a-z]",
    "a/b",
    "../a",
    "a.b",
    "#hash",
    "$where",
    "\x01control\x7f",
    "line\u2028sep",
    "🦜",
    "é",
    "e\u0301",
    "ß",
    "k" * 10_240,
    "k" * 10_239 + "a",
    "k" * 10_239 + "b",
    "🦜" * 2_560,
)
"""Thread ids that must be stored exactly and never alias one another (near collisions
side by side: ``a:b`` / ``a`` / ``:b``, ``x`` / ``x\\n``, NFC / NFD, 10 KB prefixes)."""


class ThreadIdSuite(Suite):
    """Thread ids: any valid id is stored exactly and isolated; invalid ids are refused."""

    special_ids: tuple[str, ...] = _SPECIAL_IDS

    async def test_special_ids_round_trip(self, flowy_backend: Backend[Any]) -> None:
        cp = flowy_backend.checkpointer
        for index, tid in enumerate(self.special_ids):
            assert await cp.save(0, make_snapshot(tid, {"id": tid, "i": index})) == 1, tid
        for index, tid in enumerate(self.special_ids):
            loaded, revision = await cp.load(tid)
            assert revision == 1, f"thread {tid[:40]!r}"
            assert loaded.thread_id == tid
            assert loaded.state == {"id": tid, "i": index}
            [entry] = await cp.get_history(tid)
            assert entry.thread_id == tid

    async def test_special_ids_are_isolated(self, flowy_backend: Backend[Any]) -> None:
        """Each id is its own thread: updating or deleting one leaves the others alone."""
        cp = flowy_backend.checkpointer
        for tid in self.special_ids:
            await cp.save(0, make_snapshot(tid, {"id": tid}))
        # Update every other id; the rest must stay at revision 1.
        updated = set(self.special_ids[::2])
        for tid in updated:
            assert await cp.save(1, make_snapshot(tid, {"id": tid, "v": 2})) == 2
        for tid in self.special_ids:
            loaded, revision = await cp.load(tid)
            assert revision == (2 if tid in updated else 1), f"thread {tid[:40]!r}"
            assert loaded.state["id"] == tid
        deleted = set(self.special_ids[1::2])
        for tid in deleted:
            await cp.delete(tid)
        for tid in self.special_ids:
            if tid in deleted:
                assert await try_load(cp, tid) is None, f"thread {tid[:40]!r}"
            else:
                assert (await cp.load(tid))[0].state["id"] == tid

    async def test_special_ids_are_listed_exactly(self, flowy_backend: Backend[Any]) -> None:
        cp = flowy_backend.checkpointer
        for tid in self.special_ids:
            await cp.save(0, make_snapshot(tid))
        listed = [s.thread_id for s in await cp.list_threads(limit=1000)]
        assert sorted(listed) == sorted(self.special_ids)

    async def test_special_ids_have_separate_leases(self, flowy_backend: Backend[Any]) -> None:
        leases = require_leases(flowy_backend)
        pairs = [("x", "x\n"), ("a:b", "a"), ("{tag}", "{tag}:x"), ("é", "e\u0301")]
        pairs.append(("k" * 10_239 + "a", "k" * 10_239 + "b"))
        for first, second in pairs:
            held = await leases.acquire(first, "owner-1", self.long_ttl)
            other = await leases.acquire(second, "owner-2", self.long_ttl)
            assert (held.thread_id, other.thread_id) == (first, second)
            holder = await leases.holder(first)
            assert holder is not None
            assert (holder.owner, holder.fencing_token) == ("owner-1", held.fencing_token)
            await leases.release(held)
            await leases.release(other)

    async def test_longest_valid_id(self, flowy_backend: Backend[Any]) -> None:
        cp = flowy_backend.checkpointer
        tid = "é" * (MAX_THREAD_ID_BYTES // 2)  # exactly MAX_THREAD_ID_BYTES UTF-8 bytes
        assert len(tid.encode("utf-8")) == MAX_THREAD_ID_BYTES
        assert await cp.save(0, make_snapshot(tid)) == 1
        loaded, _ = await cp.load(tid)
        assert loaded.thread_id == tid

    invalid_ids: tuple[object, ...] = (
        "",
        "a\x00b",
        "\x00",
        "x" * (MAX_THREAD_ID_BYTES + 1),
        "é" * (MAX_THREAD_ID_BYTES // 2) + "x",
        "lone \ud800 surrogate",
        123,
        b"bytes-id",
        None,
    )

    async def test_invalid_ids_are_refused_by_save(self, flowy_backend: Backend[Any]) -> None:
        cp = flowy_backend.checkpointer
        for bad in self.invalid_ids:
            snap = make_snapshot(cast(str, bad))
            with pytest.raises(InvalidThreadIdError):
                await cp.save(0, snap)
        assert await cp.list_threads(limit=1000) == []

    async def test_invalid_ids_are_refused_by_load(self, flowy_backend: Backend[Any]) -> None:
        cp = flowy_backend.checkpointer
        for bad in self.invalid_ids:
            with pytest.raises(InvalidThreadIdError):
                await cp.load(cast(str, bad))

    async def test_invalid_ids_are_refused_by_other_methods(
        self, flowy_backend: Backend[Any]
    ) -> None:
        cp = flowy_backend.checkpointer
        for bad in self.invalid_ids:
            tid = cast(str, bad)
            with pytest.raises(InvalidThreadIdError):
                await cp.get_history(tid)
            with pytest.raises(InvalidThreadIdError):
                await cp.prune(tid, 1)
            with pytest.raises(InvalidThreadIdError):
                await cp.delete(tid)
            with pytest.raises(InvalidThreadIdError):
                await cp.delete_if_idle(tid)
        assert await cp.list_threads(limit=1000) == []

    async def test_invalid_ids_are_refused_by_acquire(self, flowy_backend: Backend[Any]) -> None:
        leases = require_leases(flowy_backend)
        for bad in self.invalid_ids:
            with pytest.raises(InvalidThreadIdError):
                await leases.acquire(cast(str, bad), "owner", self.long_ttl)


class CorruptionSuite(Suite):
    """A corrupted stored record is reported, never half-decoded or skipped."""

    async def test_load_of_corrupt_record_raises(
        self, flowy_backend: Backend[Any], flowy_corrupt: Corrupt | None
    ) -> None:
        corrupt = require_corrupt(flowy_corrupt, flowy_backend)
        cp = flowy_backend.checkpointer
        tid = new_thread_id("corrupt")
        await saved_chain(cp, tid, 2)
        await corrupt(flowy_backend, tid)
        with pytest.raises(SnapshotEnvelopeInvalidError):
            await cp.load(tid)

    async def test_history_with_corrupt_record_raises(
        self, flowy_backend: Backend[Any], flowy_corrupt: Corrupt | None
    ) -> None:
        corrupt = require_corrupt(flowy_corrupt, flowy_backend)
        cp = flowy_backend.checkpointer
        tid = new_thread_id("corrupt-history")
        await saved_chain(cp, tid, 2)
        await corrupt(flowy_backend, tid)
        with pytest.raises(SnapshotEnvelopeInvalidError):
            await cp.get_history(tid, 100)

    async def test_corruption_stays_in_its_thread(
        self, flowy_backend: Backend[Any], flowy_corrupt: Corrupt | None
    ) -> None:
        corrupt = require_corrupt(flowy_corrupt, flowy_backend)
        cp = flowy_backend.checkpointer
        tid = new_thread_id("corrupt-one")
        other = new_thread_id("corrupt-bystander")
        await saved_chain(cp, tid, 1)
        kept = await saved_chain(cp, other, 1)
        await corrupt(flowy_backend, tid)
        with pytest.raises(SnapshotEnvelopeInvalidError):
            await cp.load(tid)
        assert await cp.load(other) == (kept[0], 1)
