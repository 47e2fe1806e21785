"""Checkpointer contract tests: strict OCC saves, loads and their round trip, history,
pruning, deletion and thread listing (thread ids and corrupted records: ``_integrity``).
"""

from __future__ import annotations

from typing import Any

import pytest

from ..._errors import ConcurrencyConflictError, ThreadNotFoundError
from ...storage import Backend, Checkpointer, HandoffStatus, RunStatus, Snapshot, ThreadSummary
from ...storage.dialect import new_write_id
from ._support import (
    Suite,
    fixed_time,
    history_revisions,
    make_snapshot,
    new_thread_id,
    saved_chain,
    try_load,
)

__all__ = ["CheckpointerSuite", "HistorySuite"]


async def _expect_conflict(
    cp: Checkpointer[Any], expected: int, snapshot: Snapshot[Any], actual: int
) -> None:
    """Save must raise ``ConcurrencyConflictError`` naming the thread and both revisions."""
    with pytest.raises(ConcurrencyConflictError) as info:
        await cp.save(expected, snapshot)
    err = info.value
    assert err.thread_id == snapshot.thread_id
    assert err.expected == expected
    assert err.actual == actual


class CheckpointerSuite(Suite):
    """``save`` / ``load``: strict optimistic concurrency and an exact round trip."""

    async def test_create_at_revision_zero_returns_one(self, flowy_backend: Backend[Any]) -> None:
        cp = flowy_backend.checkpointer
        tid = new_thread_id("create")
        snap = make_snapshot(tid, {"step": "first"})
        assert await cp.save(0, snap) == 1
        loaded, revision = await cp.load(tid)
        assert revision == 1
        assert loaded.revision == 1
        assert loaded.state == {"step": "first"}
        assert loaded.write_id == snap.write_id

    async def test_update_returns_next_revision(self, flowy_backend: Backend[Any]) -> None:
        cp = flowy_backend.checkpointer
        tid = new_thread_id("update")
        assert await cp.save(0, make_snapshot(tid, {"n": 1})) == 1
        second = make_snapshot(tid, {"n": 2}, pointer="next")
        assert await cp.save(1, second) == 2
        for expected in range(2, 6):
            assert await cp.save(expected, make_snapshot(tid, {"n": expected + 1})) == (
                expected + 1
            )
        loaded, revision = await cp.load(tid)
        assert revision == 6
        assert loaded.state == {"n": 6}

    async def test_create_over_existing_conflicts(self, flowy_backend: Backend[Any]) -> None:
        cp = flowy_backend.checkpointer
        tid = new_thread_id("recreate")
        [first] = await saved_chain(cp, tid, 1)
        await _expect_conflict(cp, 0, make_snapshot(tid, {"n": "intruder"}), actual=1)
        loaded, revision = await cp.load(tid)
        assert (loaded, revision) == (first, 1)
        assert await history_revisions(cp, tid) == [1]

    async def test_stale_update_conflicts(self, flowy_backend: Backend[Any]) -> None:
        cp = flowy_backend.checkpointer
        tid = new_thread_id("stale")
        saved = await saved_chain(cp, tid, 3)
        await _expect_conflict(cp, 2, make_snapshot(tid, {"n": "stale"}), actual=3)
        await _expect_conflict(cp, 1, make_snapshot(tid, {"n": "staler"}), actual=3)
        assert await cp.load(tid) == (saved[-1], 3)
        assert await history_revisions(cp, tid) == [3, 2, 1]

    async def test_expected_revision_ahead_of_head_conflicts(
        self, flowy_backend: Backend[Any]
    ) -> None:
        cp = flowy_backend.checkpointer
        tid = new_thread_id("ahead")
        saved = await saved_chain(cp, tid, 1)
        await _expect_conflict(cp, 5, make_snapshot(tid, {"n": "future"}), actual=1)
        assert await cp.load(tid) == (saved[-1], 1)
        assert await history_revisions(cp, tid) == [1]

    async def test_update_of_missing_thread_conflicts(self, flowy_backend: Backend[Any]) -> None:
        cp = flowy_backend.checkpointer
        tid = new_thread_id("missing")
        await _expect_conflict(cp, 1, make_snapshot(tid), actual=0)
        assert await try_load(cp, tid) is None
        assert await cp.get_history(tid) == []
        # The failed save reserved nothing: the thread can still be created.
        assert await cp.save(0, make_snapshot(tid)) == 1

    async def test_load_of_missing_thread_raises_not_found(
        self, flowy_backend: Backend[Any]
    ) -> None:
        cp = flowy_backend.checkpointer
        with pytest.raises(ThreadNotFoundError):
            await cp.load(new_thread_id("never-saved"))

    async def test_load_round_trips_every_field(self, flowy_backend: Backend[Any]) -> None:
        cp = flowy_backend.checkpointer
        tid = new_thread_id("round-trip")
        snap: Snapshot[Any] = Snapshot(
            thread_id=tid,
            state={
                "text": 'héllo — 世界 🦜 "quoted" \\ \n tab\t',
                "nested": {"list": [1, 2.5, None, True, False, {"k": "v"}], "empty": {}},
                "big": 2**53,
                "negative": -7,
                "float": 0.1,
                "empty_list": [],
            },
            execution_pointer="review:β",
            status=RunStatus.SUSPENDED,
            reason="waiting_for_human ✋",
            step_count=7,
            segment=3,
            total_steps=42,
            budget_counts={"llm_calls": 3, "tools": 0},
            metadata={"user": "ü", "tags": ["a", "b"], "nested": {"n": 1, "f": 1.5, "z": None}},
            handoff_status=HandoffStatus.PENDING,
            handoff_pending_at=fixed_time,
            updated_at=fixed_time + 1.5,
            write_id=new_write_id(),
        )
        assert await cp.save(0, snap) == 1
        loaded, revision = await cp.load(tid)
        assert revision == 1
        assert loaded == snap.at_revision(1)
        # Field by field too, so a failure names the field that did not survive.
        assert loaded.thread_id == tid
        assert loaded.state == snap.state
        assert loaded.execution_pointer == "review:β"
        assert loaded.status is RunStatus.SUSPENDED
        assert loaded.reason == "waiting_for_human ✋"
        assert (loaded.step_count, loaded.segment, loaded.total_steps) == (7, 3, 42)
        assert dict(loaded.budget_counts) == {"llm_calls": 3, "tools": 0}
        assert dict(loaded.metadata) == dict(snap.metadata)
        assert loaded.handoff_status is HandoffStatus.PENDING
        assert loaded.handoff_pending_at == fixed_time
        assert loaded.updated_at == fixed_time + 1.5
        assert loaded.write_id == snap.write_id

    async def test_load_returns_the_newest_revision(self, flowy_backend: Backend[Any]) -> None:
        cp = flowy_backend.checkpointer
        tid = new_thread_id("newest")
        saved = await saved_chain(cp, tid, 4)
        loaded, revision = await cp.load(tid)
        assert revision == 4
        assert loaded == saved[-1]
        assert loaded.revision == 4

    async def test_stored_revision_ignores_snapshot_revision_field(
        self, flowy_backend: Backend[Any]
    ) -> None:
        """The store assigns revisions; a stale ``Snapshot.revision`` is not trusted."""
        cp = flowy_backend.checkpointer
        tid = new_thread_id("revision-field")
        assert await cp.save(0, make_snapshot(tid, revision=99)) == 1
        loaded, revision = await cp.load(tid)
        assert (revision, loaded.revision) == (1, 1)
        assert await cp.save(1, make_snapshot(tid, revision=7)) == 2
        assert (await cp.load(tid))[0].revision == 2

    async def test_failed_saves_leave_the_record_unchanged(
        self, flowy_backend: Backend[Any]
    ) -> None:
        cp = flowy_backend.checkpointer
        tid = new_thread_id("unchanged")
        await saved_chain(cp, tid, 2)
        before = await cp.load(tid)
        history_before = await cp.get_history(tid)
        for expected in (0, 1, 3, 10):
            with pytest.raises(ConcurrencyConflictError):
                await cp.save(
                    expected,
                    make_snapshot(tid, {"n": "loser"}, pointer="elsewhere", reason="x"),
                )
        assert await cp.load(tid) == before
        assert await cp.get_history(tid) == history_before


class HistorySuite(Suite):
    """``get_history``, ``prune``, ``delete``, ``delete_if_idle`` and ``list_threads``."""

    async def test_history_is_newest_first(self, flowy_backend: Backend[Any]) -> None:
        cp = flowy_backend.checkpointer
        tid = new_thread_id("history")
        saved = await saved_chain(cp, tid, 5)
        history = await cp.get_history(tid, 100)
        assert [s.revision for s in history] == [5, 4, 3, 2, 1]
        assert history == list(reversed(saved))

    async def test_history_limit(self, flowy_backend: Backend[Any]) -> None:
        cp = flowy_backend.checkpointer
        tid = new_thread_id("history-limit")
        await saved_chain(cp, tid, 5)
        assert await history_revisions(cp, tid, 2) == [5, 4]
        assert await history_revisions(cp, tid, 1) == [5]
        assert await history_revisions(cp, tid, 5) == [5, 4, 3, 2, 1]
        assert await history_revisions(cp, tid, 50) == [5, 4, 3, 2, 1]

    async def test_history_limit_zero_is_empty(self, flowy_backend: Backend[Any]) -> None:
        cp = flowy_backend.checkpointer
        tid = new_thread_id("history-zero")
        await saved_chain(cp, tid, 2)
        assert await cp.get_history(tid, 0) == []

    async def test_history_of_missing_thread_is_empty(self, flowy_backend: Backend[Any]) -> None:
        cp = flowy_backend.checkpointer
        assert await cp.get_history(new_thread_id("no-history")) == []

    async def test_prune_keeps_the_newest(self, flowy_backend: Backend[Any]) -> None:
        cp = flowy_backend.checkpointer
        tid = new_thread_id("prune")
        saved = await saved_chain(cp, tid, 6)
        await cp.prune(tid, 3)
        assert await cp.get_history(tid) == [saved[5], saved[4], saved[3]]
        assert await cp.load(tid) == (saved[5], 6)
        # Pruning does not move the head: the next save still expects revision 6.
        assert await cp.save(6, make_snapshot(tid)) == 7

    async def test_prune_more_than_exists_keeps_everything(
        self, flowy_backend: Backend[Any]
    ) -> None:
        cp = flowy_backend.checkpointer
        tid = new_thread_id("prune-all")
        await saved_chain(cp, tid, 3)
        await cp.prune(tid, 10)
        assert await history_revisions(cp, tid) == [3, 2, 1]

    async def test_prune_zero_keeps_the_head(self, flowy_backend: Backend[Any]) -> None:
        cp = flowy_backend.checkpointer
        tid = new_thread_id("prune-zero")
        saved = await saved_chain(cp, tid, 4)
        await cp.prune(tid, 0)
        assert await history_revisions(cp, tid) == [4]
        assert await cp.load(tid) == (saved[3], 4)
        await cp.prune(tid, 1)
        assert await history_revisions(cp, tid) == [4]

    async def test_prune_touches_only_its_thread(self, flowy_backend: Backend[Any]) -> None:
        cp = flowy_backend.checkpointer
        tid, other = new_thread_id("prune-mine"), new_thread_id("prune-other")
        await saved_chain(cp, tid, 4)
        await saved_chain(cp, other, 4)
        await cp.prune(tid, 1)
        assert await history_revisions(cp, tid) == [4]
        assert await history_revisions(cp, other) == [4, 3, 2, 1]

    async def test_prune_of_missing_thread_is_fine(self, flowy_backend: Backend[Any]) -> None:
        cp = flowy_backend.checkpointer
        tid = new_thread_id("prune-missing")
        await cp.prune(tid, 1)
        assert await try_load(cp, tid) is None

    async def test_delete_removes_head_and_history(self, flowy_backend: Backend[Any]) -> None:
        cp = flowy_backend.checkpointer
        tid = new_thread_id("delete")
        other = new_thread_id("delete-bystander")
        await saved_chain(cp, tid, 3)
        kept = await saved_chain(cp, other, 1)
        await cp.delete(tid)
        with pytest.raises(ThreadNotFoundError):
            await cp.load(tid)
        assert await cp.get_history(tid) == []
        assert tid not in {s.thread_id for s in await cp.list_threads(limit=1000)}
        assert await cp.load(other) == (kept[0], 1)

    async def test_delete_of_missing_thread_is_fine(self, flowy_backend: Backend[Any]) -> None:
        cp = flowy_backend.checkpointer
        tid = new_thread_id("delete-missing")
        await cp.delete(tid)
        await cp.delete_if_idle(tid)
        assert await try_load(cp, tid) is None

    async def test_deleted_thread_is_created_again_at_revision_one(
        self, flowy_backend: Backend[Any]
    ) -> None:
        """A deleted thread has no snapshot, so it is at revision 0 again: the next
        create returns 1 and the old history does not come back."""
        cp = flowy_backend.checkpointer
        tid = new_thread_id("recreated")
        await saved_chain(cp, tid, 3)
        await cp.delete(tid)
        with pytest.raises(ConcurrencyConflictError):
            await cp.save(3, make_snapshot(tid))
        fresh = make_snapshot(tid, {"life": 2})
        assert await cp.save(0, fresh) == 1
        assert await cp.load(tid) == (fresh.at_revision(1), 1)
        assert await history_revisions(cp, tid) == [1]
        assert await cp.save(1, make_snapshot(tid)) == 2

    async def test_delete_if_idle_deletes_an_idle_thread(self, flowy_backend: Backend[Any]) -> None:
        cp = flowy_backend.checkpointer
        tid = new_thread_id("idle")
        await saved_chain(cp, tid, 2)
        await cp.delete_if_idle(tid)
        assert await try_load(cp, tid) is None
        assert await cp.get_history(tid) == []

    async def test_list_threads_reports_heads(self, flowy_backend: Backend[Any]) -> None:
        cp = flowy_backend.checkpointer
        specs = {
            HandoffStatus.NONE: (RunStatus.RUNNING, None),
            HandoffStatus.PENDING: (RunStatus.HANDOFF, fixed_time - 60),
            HandoffStatus.ENQUEUED: (RunStatus.HANDOFF, fixed_time - 30),
            HandoffStatus.ORPHANED: (RunStatus.HANDOFF, None),
        }
        expected: dict[str, ThreadSummary] = {}
        for index, (handoff, (status, pending_at)) in enumerate(specs.items()):
            tid = new_thread_id(f"list-{handoff.value}")
            revisions = index + 1
            await saved_chain(cp, tid, revisions - 1)
            snap = make_snapshot(
                tid,
                {"i": index},
                pointer=f"node-{handoff.value}",
                status=status,
                reason=f"reason-{handoff.value}",
                handoff_status=handoff,
                handoff_pending_at=pending_at,
                updated_at=fixed_time + index,
            )
            assert await cp.save(revisions - 1, snap) == revisions
            expected[tid] = ThreadSummary(
                thread_id=tid,
                revision=revisions,
                execution_pointer=f"node-{handoff.value}",
                status=status,
                reason=f"reason-{handoff.value}",
                handoff_status=handoff,
                handoff_pending_at=pending_at,
                updated_at=fixed_time + index,
            )
        listed = {s.thread_id: s for s in await cp.list_threads(limit=1000)}
        assert set(listed) == set(expected)
        for tid, want in expected.items():
            got = listed[tid]
            assert (got.revision, got.execution_pointer, got.status, got.reason) == (
                want.revision,
                want.execution_pointer,
                want.status,
                want.reason,
            )
            assert got.handoff_status == want.handoff_status
            if want.handoff_pending_at is None:
                assert got.handoff_pending_at is None
            else:
                assert got.handoff_pending_at == pytest.approx(want.handoff_pending_at, abs=1e-3)
            assert got.updated_at == pytest.approx(want.updated_at, abs=1e-3)

    async def test_list_threads_filters_by_handoff_status(
        self, flowy_backend: Backend[Any]
    ) -> None:
        cp = flowy_backend.checkpointer
        by_status: dict[HandoffStatus, str] = {}
        for handoff in HandoffStatus:
            tid = new_thread_id(f"filter-{handoff.value}")
            await cp.save(0, make_snapshot(tid, handoff_status=handoff))
            by_status[handoff] = tid

        async def listed(statuses: frozenset[HandoffStatus] | None) -> set[str]:
            return {
                s.thread_id for s in await cp.list_threads(handoff_statuses=statuses, limit=1000)
            }

        assert await listed(None) == set(by_status.values())
        wanted = frozenset({HandoffStatus.PENDING, HandoffStatus.ORPHANED})
        assert await listed(wanted) == {by_status[s] for s in wanted}
        assert await listed(frozenset({HandoffStatus.ENQUEUED})) == {
            by_status[HandoffStatus.ENQUEUED]
        }
        assert await listed(frozenset()) == set()

    async def test_list_threads_follows_the_head(self, flowy_backend: Backend[Any]) -> None:
        """The listed status is the head's: an update moves the thread between filters."""
        cp = flowy_backend.checkpointer
        tid = new_thread_id("list-moves")
        pending = frozenset({HandoffStatus.PENDING})
        enqueued = frozenset({HandoffStatus.ENQUEUED})
        await cp.save(0, make_snapshot(tid, handoff_status=HandoffStatus.PENDING))
        assert [s.thread_id for s in await cp.list_threads(handoff_statuses=pending)] == [tid]
        await cp.save(1, make_snapshot(tid, handoff_status=HandoffStatus.ENQUEUED))
        assert await cp.list_threads(handoff_statuses=pending) == []
        [summary] = await cp.list_threads(handoff_statuses=enqueued)
        assert (summary.thread_id, summary.revision) == (tid, 2)

    async def test_list_threads_limit(self, flowy_backend: Backend[Any]) -> None:
        cp = flowy_backend.checkpointer
        created = {new_thread_id(f"limit-{i}") for i in range(5)}
        for tid in created:
            await cp.save(0, make_snapshot(tid))
        two = await cp.list_threads(limit=2)
        assert len(two) == 2
        assert {s.thread_id for s in two} <= created
        assert len({s.thread_id for s in two}) == 2
        assert len(await cp.list_threads(limit=5)) == 5
        assert len(await cp.list_threads(limit=50)) == 5
        assert await cp.list_threads(limit=0) == []

    async def test_list_threads_after_excludes_that_thread(
        self, flowy_backend: Backend[Any]
    ) -> None:
        """``after`` is exclusive: paging on from the last id of a page never lists it
        again, and every thread comes exactly once."""
        cp = flowy_backend.checkpointer
        prefix = new_thread_id("after")
        ids = [f"{prefix}-{c}" for c in "abc"]
        for tid in ids:
            await cp.save(0, make_snapshot(tid))

        async def mine(after: str, limit: int = 1000) -> list[str]:
            listed = await cp.list_threads(after=after, limit=limit)
            return [s.thread_id for s in listed if s.thread_id.startswith(prefix)]

        assert await mine(ids[0]) == ids[1:]
        assert await mine(ids[1]) == ids[2:]
        assert await mine(ids[2]) == []
        assert await mine(f"{ids[0]}0") == ids[1:]  # not a thread: the ones after it
        paged: list[str] = []
        after = prefix  # sorts just before the three ids
        while page := await mine(after, limit=1):
            paged += page
            after = page[-1]
            assert len(paged) <= len(ids), f"paging repeats threads: {paged}"
        assert paged == ids

    async def test_list_threads_pages_through_many_threads(
        self, flowy_backend: Backend[Any]
    ) -> None:
        """Small pages from ``after`` list every thread exactly once, in thread-id (code
        point) order, with or without a status filter: ids that share a long prefix, that
        are prefixes of each other, or differ by a non-ASCII character."""
        cp = flowy_backend.checkpointer
        prefix = new_thread_id("pages")
        tails = [f"{i:03d}" for i in range(0, 120, 3)]
        tails += ["05", "05é", "05~", "050", "0", "0 ", "ä", "é", "z", "😀", "~", "6" * 40]
        ids = [f"{prefix}-{tail}" for tail in tails]
        statuses = list(HandoffStatus)
        status_of = {tid: statuses[i % len(statuses)] for i, tid in enumerate(ids)}
        for tid in ids:
            await cp.save(0, make_snapshot(tid, handoff_status=status_of[tid]))

        async def paged(limit: int, wanted: frozenset[HandoffStatus] | None) -> list[str]:
            listed: list[str] = []
            after = prefix  # sorts just before every id of this test
            while page := await cp.list_threads(handoff_statuses=wanted, limit=limit, after=after):
                got = [s.thread_id for s in page]
                assert len(got) <= limit
                assert got == sorted(got) and got[0] > after, f"a page out of order: {got}"
                mine = [t for t in got if t.startswith(prefix)]
                listed += mine
                assert len(listed) <= len(ids), f"paging repeats threads: {listed}"
                if len(mine) < len(got):
                    break  # past this test's threads
                after = got[-1]
            return listed

        for limit in (1, 7, 100):
            assert await paged(limit, None) == sorted(ids)
        pending = frozenset({HandoffStatus.PENDING, HandoffStatus.ORPHANED})
        assert await paged(5, pending) == sorted(t for t in ids if status_of[t] in pending)
        listed = await cp.list_threads(limit=len(ids), after=prefix)
        assert {s.thread_id: s.handoff_status for s in listed} == status_of
