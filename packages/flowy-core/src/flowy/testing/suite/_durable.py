"""Durable-time contract tests: the index of wake-up times (timers), each thread's inbox
of signals, and each thread's activity journal, as ``DurableCheckpointer`` states them.

Other tests may share the store, so every listing is filtered to this test's threads.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any, ClassVar, cast

import pytest

from ..._errors import ConcurrencyConflictError, InvalidThreadIdError
from ...storage import (
    ActivityRecord,
    ActivityStatus,
    Backend,
    DurableCheckpointer,
    RunStatus,
    Signal,
    Timer,
)
from ._support import (
    Suite,
    fixed_time,
    make_snapshot,
    new_thread_id,
    peer_of,
    require_capability,
)

__all__ = ["JournalSuite", "LineageSuite", "SignalSuite", "TimerSuite"]


def require_durable(
    backend: Backend[Any], capability: str = "durable_timers_signals"
) -> DurableCheckpointer[Any]:
    """The store's checkpointer as a ``DurableCheckpointer``: the test is skipped, with
    the reason, when the store lacks ``capability`` (``durable_timers_signals`` or
    ``journal``), and fails when it claims it without being one."""
    require_capability(backend, capability)
    cp = backend.checkpointer
    if not isinstance(cp, DurableCheckpointer):
        pytest.fail(
            f"{type(cp).__name__} must keep timers, signals and an activity journal "
            "(flowy.storage.DurableCheckpointer)"
        )
    return cp


async def _timers_of(cp: DurableCheckpointer[Any], threads: set[str], **kw: Any) -> list[Timer]:
    return [t for t in await cp.timers(limit=10_000, **kw) if t.thread_id in threads]


async def _wait(
    cp: DurableCheckpointer[Any], thread_id: str, expected: int, at: float | None
) -> int:
    snap = make_snapshot(thread_id, status=RunStatus.WAITING, reason="sleep")
    return await cp.save(expected, replace(snap, wake_at=at))


def _signal(thread_id: str, name: str = "approval", payload: Any = None, **kw: Any) -> Signal:
    signal_id = kw.pop("signal_id", f"sig-{new_thread_id()}")
    return Signal(thread_id, name, payload, signal_id, sent_at=kw.pop("sent_at", fixed_time))


class TimerSuite(Suite):
    """Wake-up times are saved with the head and listed from an index, soonest first."""

    requires: ClassVar[tuple[str, ...]] = ("durable_timers_signals",)

    async def test_wake_at_round_trips_with_the_head(self, flowy_backend: Backend[Any]) -> None:
        cp = require_durable(flowy_backend)
        tid = new_thread_id("wake")
        snap = replace(
            make_snapshot(tid, status=RunStatus.WAITING, reason="wait"),
            wake_at=fixed_time + 60.5,
            waiting_for="approval",
            on_timeout="escalate",
            signal_cursors={"approval": 3, "cancel": 1},
        )
        await cp.save(0, snap)
        loaded, _ = await cp.load(tid)
        assert loaded.status is RunStatus.WAITING
        assert loaded.wake_at == fixed_time + 60.5
        assert loaded.waiting_for == "approval"
        assert loaded.on_timeout == "escalate"
        assert dict(loaded.signal_cursors) == {"approval": 3, "cancel": 1}
        [summary] = [s for s in await cp.list_threads(limit=10_000) if s.thread_id == tid]
        assert summary.wake_at == fixed_time + 60.5

    async def test_due_timers_soonest_first(self, flowy_backend: Backend[Any]) -> None:
        cp = require_durable(flowy_backend)
        base = fixed_time - 1000
        threads = {new_thread_id(f"due{i}"): base + offset for i, offset in enumerate((3, 1, 2))}
        for tid, at in threads.items():
            await _wait(cp, tid, 0, at)
        got = await _timers_of(cp, set(threads), before=base + 10)
        assert [t.wake_at for t in got] == [base + 1, base + 2, base + 3]
        assert {t.thread_id: t.wake_at for t in got} == threads

    async def test_only_due_timers_are_listed(self, flowy_backend: Backend[Any]) -> None:
        cp = require_durable(flowy_backend)
        due, later = new_thread_id("due"), new_thread_id("later")
        await _wait(cp, due, 0, fixed_time - 10)
        await _wait(cp, later, 0, fixed_time + 10)
        assert await _timers_of(cp, {due, later}, before=fixed_time) == [
            Timer(due, fixed_time - 10)
        ]
        everything = await _timers_of(cp, {due, later})
        assert [t.thread_id for t in everything] == [due, later]

    async def test_a_timer_due_exactly_now_is_listed(self, flowy_backend: Backend[Any]) -> None:
        cp = require_durable(flowy_backend)
        tid = new_thread_id("exact")
        await _wait(cp, tid, 0, fixed_time)
        assert await _timers_of(cp, {tid}, before=fixed_time) == [Timer(tid, fixed_time)]

    async def test_a_head_that_moves_on_leaves_the_index(self, flowy_backend: Backend[Any]) -> None:
        cp = require_durable(flowy_backend)
        tid = new_thread_id("moved")
        await _wait(cp, tid, 0, fixed_time - 5)
        await cp.save(1, make_snapshot(tid, pointer="next"))
        assert await _timers_of(cp, {tid}) == []
        await _wait(cp, tid, 2, fixed_time + 7)
        assert await _timers_of(cp, {tid}) == [Timer(tid, fixed_time + 7)]
        await _wait(cp, tid, 3, fixed_time + 3)
        assert await _timers_of(cp, {tid}) == [Timer(tid, fixed_time + 3)]

    async def test_a_refused_save_leaves_the_timer(self, flowy_backend: Backend[Any]) -> None:
        cp = require_durable(flowy_backend)
        tid = new_thread_id("refused")
        await _wait(cp, tid, 0, fixed_time - 5)
        with pytest.raises(ConcurrencyConflictError):
            await cp.save(0, make_snapshot(tid))
        assert await _timers_of(cp, {tid}) == [Timer(tid, fixed_time - 5)]

    async def test_delete_removes_the_timer(self, flowy_backend: Backend[Any]) -> None:
        cp = require_durable(flowy_backend)
        tid, other = new_thread_id("deleted"), new_thread_id("kept")
        await _wait(cp, tid, 0, fixed_time - 5)
        await _wait(cp, other, 0, fixed_time - 4)
        await cp.delete(tid)
        assert await _timers_of(cp, {tid, other}) == [Timer(other, fixed_time - 4)]

    async def test_limit_and_ties(self, flowy_backend: Backend[Any]) -> None:
        cp = require_durable(flowy_backend)
        at = fixed_time - 500.125
        threads = sorted(new_thread_id(f"tie{i}") for i in range(5))
        for tid in threads:
            await _wait(cp, tid, 0, at)
        got = await _timers_of(cp, set(threads), before=at)
        assert [t.thread_id for t in got] == threads  # equal times: by thread id
        assert await cp.timers(limit=0) == []
        assert len(await cp.timers(before=at, limit=2)) == 2

    async def test_bad_arguments(self, flowy_backend: Backend[Any]) -> None:
        cp = require_durable(flowy_backend)
        with pytest.raises(ValueError):
            await cp.timers(limit=-1)
        with pytest.raises(TypeError):
            await cp.timers(before=float("nan"))
        with pytest.raises(ValueError):
            await _wait(cp, new_thread_id("nan"), 0, float("nan"))

    async def test_a_peer_sees_the_timer(self, flowy_backend: Backend[Any]) -> None:
        cp = require_durable(flowy_backend)
        tid = new_thread_id("peer")
        await _wait(cp, tid, 0, fixed_time - 1)
        async with peer_of(flowy_backend) as peer:
            assert await _timers_of(require_durable(peer), {tid}) == [Timer(tid, fixed_time - 1)]


class SignalSuite(Suite):
    """Each thread's inbox: numbered in order, once per signal id, isolated per thread."""

    requires: ClassVar[tuple[str, ...]] = ("durable_timers_signals",)

    async def test_signals_are_numbered_in_order(self, flowy_backend: Backend[Any]) -> None:
        cp = require_durable(flowy_backend)
        tid = new_thread_id("inbox")
        stored = [
            await cp.append_signal(_signal(tid, name, {"i": i}))
            for i, name in enumerate(["approval", "cancel", "approval"])
        ]
        assert [s.seq for s in stored] == [1, 2, 3]
        got = await cp.signals(tid)
        assert [(s.seq, s.name, s.payload) for s in got] == [
            (1, "approval", {"i": 0}),
            (2, "cancel", {"i": 1}),
            (3, "approval", {"i": 2}),
        ]
        assert got == stored
        assert [s.seq for s in await cp.signals(tid, after=1)] == [2, 3]
        assert [s.seq for s in await cp.signals(tid, after=1, limit=1)] == [2]
        assert await cp.signals(tid, after=3) == []

    async def test_a_repeated_signal_id_is_stored_once(self, flowy_backend: Backend[Any]) -> None:
        cp = require_durable(flowy_backend)
        tid = new_thread_id("dedupe")
        first = await cp.append_signal(_signal(tid, payload="yes", signal_id="webhook-1"))
        await cp.append_signal(_signal(tid, "other", signal_id="webhook-2"))
        again = await cp.append_signal(
            _signal(tid, payload="changed", signal_id="webhook-1", sent_at=fixed_time + 9)
        )
        assert again == first  # the first one, as stored
        assert again.payload == "yes"
        assert [s.signal_id for s in await cp.signals(tid)] == ["webhook-1", "webhook-2"]

    async def test_the_same_id_on_two_threads_is_two_signals(
        self, flowy_backend: Backend[Any]
    ) -> None:
        cp = require_durable(flowy_backend)
        a, b = new_thread_id("a"), new_thread_id("b")
        await cp.append_signal(_signal(a, payload=1, signal_id="same"))
        stored = await cp.append_signal(_signal(b, payload=2, signal_id="same"))
        assert stored.seq == 1 and stored.payload == 2
        assert [s.payload for s in await cp.signals(a)] == [1]
        assert [s.payload for s in await cp.signals(b)] == [2]

    async def test_payloads_and_names_round_trip(self, flowy_backend: Backend[Any]) -> None:
        cp = require_durable(flowy_backend)
        tid = new_thread_id("payload")
        payload = {"text": 'héllo\n{"x"}', "n": 2**53, "f": 0.1, "ok": True, "none": None}
        name = "reviewer:décision/{1}"
        signal_id = 'id with spaces, ünïcode & "quotes"' + "x" * 500
        await cp.append_signal(_signal(tid, name, payload, signal_id=signal_id))
        [got] = await cp.signals(tid)
        assert (got.name, got.payload, got.signal_id, got.sent_at) == (
            name,
            payload,
            signal_id,
            fixed_time,
        )

    async def test_delete_empties_the_inbox(self, flowy_backend: Backend[Any]) -> None:
        cp = require_durable(flowy_backend)
        tid, other = new_thread_id("gone"), new_thread_id("other")
        await cp.save(0, make_snapshot(tid))
        await cp.append_signal(_signal(tid, signal_id="s1"))
        await cp.append_signal(_signal(other, signal_id="s1"))
        await cp.delete(tid)
        assert await cp.signals(tid) == []
        assert len(await cp.signals(other)) == 1

    async def test_delete_resets_the_signal_ids(self, flowy_backend: Backend[Any]) -> None:
        """A thread created again after a delete starts a new inbox: numbered from 1, and
        a signal id sent before the delete is new again."""
        cp = require_durable(flowy_backend)
        tid = new_thread_id("reset")
        await cp.save(0, make_snapshot(tid))
        await cp.append_signal(_signal(tid, payload="old", signal_id="s1"))
        await cp.append_signal(_signal(tid, payload="old", signal_id="s2"))
        await cp.delete(tid)
        await cp.save(0, make_snapshot(tid))
        again = await cp.append_signal(_signal(tid, payload="new", signal_id="s2"))
        assert (again.seq, again.signal_id, again.payload) == (1, "s2", "new")
        assert [(s.seq, s.signal_id, s.payload) for s in await cp.signals(tid)] == [
            (1, "s2", "new")
        ]

    async def test_racing_senders_get_distinct_numbers(self, flowy_backend: Backend[Any]) -> None:
        cp = require_durable(flowy_backend)
        tid = new_thread_id("race")
        async with peer_of(flowy_backend) as peer:
            other = require_durable(peer)
            calls = [
                (cp if i % 2 else other).append_signal(_signal(tid, payload=i, signal_id=f"s{i}"))
                for i in range(12)
            ]
            stored = await asyncio.gather(*calls)
        assert sorted(s.seq for s in stored) == list(range(1, 13))
        got = await cp.signals(tid, limit=100)
        assert [s.seq for s in got] == list(range(1, 13))
        assert sorted(cast(int, s.payload) for s in got) == list(range(12))

    async def test_racing_repeats_store_one_signal(self, flowy_backend: Backend[Any]) -> None:
        cp = require_durable(flowy_backend)
        tid = new_thread_id("repeat")
        async with peer_of(flowy_backend) as peer:
            other = require_durable(peer)
            stored = await asyncio.gather(
                *[(cp, other)[i % 2].append_signal(_signal(tid, signal_id="one")) for i in range(8)]
            )
        assert {s.seq for s in stored} == {1}
        assert len(await cp.signals(tid)) == 1

    async def test_bad_signals_are_refused(self, flowy_backend: Backend[Any]) -> None:
        cp = require_durable(flowy_backend)
        tid = new_thread_id("bad")
        with pytest.raises(ValueError):
            await cp.append_signal(_signal(tid, ""))
        with pytest.raises(ValueError):
            await cp.append_signal(_signal(tid, signal_id=""))
        with pytest.raises(ValueError):
            await cp.append_signal(_signal(tid, signal_id="x" * 2000))
        with pytest.raises(TypeError):
            await cp.append_signal(_signal(tid, payload=object()))
        with pytest.raises(ValueError):
            await cp.append_signal(_signal(tid, payload="x" * (300 * 1024)))
        with pytest.raises(InvalidThreadIdError):
            await cp.append_signal(_signal("", signal_id="s"))
        with pytest.raises(ValueError):
            await cp.signals(tid, after=-1)
        assert await cp.signals(tid) == []  # nothing was stored


def _record(key: str, status: ActivityStatus = ActivityStatus.STARTED, **kw: Any) -> ActivityRecord:
    return ActivityRecord(
        key=key,
        status=status,
        name="charge",
        attempts=kw.pop("attempts", 1),
        started_at=kw.pop("started_at", fixed_time),
        updated_at=fixed_time,
        **kw,
    )


class JournalSuite(Suite):
    """Each thread's activity journal: entries by key, replaced in place, isolated."""

    requires: ClassVar[tuple[str, ...]] = ("journal",)

    async def test_put_get_and_replace(self, flowy_backend: Backend[Any]) -> None:
        cp = require_durable(flowy_backend, "journal")
        tid = new_thread_id("journal")
        assert await cp.get_activity(tid, "charge:1") is None
        started = _record("charge:1")
        await cp.put_activity(tid, started)
        assert await cp.get_activity(tid, "charge:1") == started
        done = replace(started, status=ActivityStatus.SUCCEEDED, result={"id": "ch_1", "n": [1]})
        await cp.put_activity(tid, done)
        assert await cp.get_activity(tid, "charge:1") == done
        assert await cp.journal(tid) == [done]

    async def test_journal_is_oldest_first_and_per_thread(
        self, flowy_backend: Backend[Any]
    ) -> None:
        cp = require_durable(flowy_backend, "journal")
        tid, other = new_thread_id("j1"), new_thread_id("j2")
        records = [_record(f"k{i}", started_at=fixed_time + 10 - i) for i in range(3)]
        for record in records:
            await cp.put_activity(tid, record)
        await cp.put_activity(other, _record("k0", ActivityStatus.FAILED, error="E: x"))
        assert await cp.journal(tid) == list(reversed(records))
        assert [r.status for r in await cp.journal(other)] == [ActivityStatus.FAILED]
        assert (await cp.get_activity(tid, "k0")) == records[0]

    async def test_every_field_round_trips(self, flowy_backend: Backend[Any]) -> None:
        cp = require_durable(flowy_backend, "journal")
        tid = new_thread_id("fields")
        key = "step 3/charge:order-42 ünïcode {x}" + "k" * 300
        record = ActivityRecord(
            key=key,
            status=ActivityStatus.RETRYING,
            name="module.charge_card",
            attempts=3,
            result=None,
            error="TimeoutError: gateway timed out",
            started_at=fixed_time,
            updated_at=fixed_time + 2.5,
            retry_at=fixed_time + 8.25,
        )
        await cp.put_activity(tid, record)
        assert await cp.get_activity(tid, key) == record

    async def test_delete_removes_the_journal(self, flowy_backend: Backend[Any]) -> None:
        cp = require_durable(flowy_backend, "journal")
        tid = new_thread_id("jdel")
        await cp.save(0, make_snapshot(tid))
        await cp.put_activity(tid, _record("a"))
        await cp.delete(tid)
        assert await cp.journal(tid) == []
        assert await cp.get_activity(tid, "a") is None

    async def test_delete_removes_the_journal_of_a_thread_without_a_snapshot(
        self, flowy_backend: Backend[Any]
    ) -> None:
        cp = require_durable(flowy_backend, "journal")
        tid, other = new_thread_id("jbare"), new_thread_id("jbare2")
        await cp.put_activity(tid, _record("a"))
        await cp.put_activity(other, _record("a"))
        assert [r.key for r in await cp.journal(tid)] == ["a"]
        await cp.delete(tid)
        assert await cp.journal(tid) == []
        assert [r.key for r in await cp.journal(other)] == ["a"]

    async def test_bad_keys_are_refused(self, flowy_backend: Backend[Any]) -> None:
        cp = require_durable(flowy_backend, "journal")
        tid = new_thread_id("jbad")
        with pytest.raises(ValueError):
            await cp.put_activity(tid, _record(""))
        with pytest.raises(ValueError):
            await cp.get_activity(tid, "a\x00b")
        with pytest.raises(TypeError):
            await cp.put_activity(tid, _record("r", result={1, 2}))
        assert await cp.journal(tid) == []


class LineageSuite(Suite):
    """The graph version and the fork lineage of a snapshot round-trip, and listings
    report the head's graph version (what ``flowy threads --version`` filters on)."""

    async def test_version_and_lineage_round_trip(self, flowy_backend: Backend[Any]) -> None:
        cp = flowy_backend.checkpointer
        tid = new_thread_id("lineage")
        snap = replace(
            make_snapshot(tid),
            graph_version="v-1a2b3c",
            parent_thread_id="parent {x}: ünïcode",
            parent_revision=7,
        )
        await cp.save(0, snap)
        loaded, _ = await cp.load(tid)
        assert (loaded.graph_version, loaded.parent_thread_id, loaded.parent_revision) == (
            "v-1a2b3c",
            "parent {x}: ünïcode",
            7,
        )
        [entry] = await cp.get_history(tid)
        assert entry.graph_version == "v-1a2b3c" and entry.parent_revision == 7

    async def test_listings_report_the_heads_graph_version(
        self, flowy_backend: Backend[Any]
    ) -> None:
        cp = flowy_backend.checkpointer
        old, new, none = new_thread_id("v1"), new_thread_id("v2"), new_thread_id("v0")
        await cp.save(0, replace(make_snapshot(old), graph_version="v1"))
        await cp.save(0, replace(make_snapshot(new), graph_version="v1"))
        await cp.save(1, replace(make_snapshot(new), graph_version="v2"))
        await cp.save(0, make_snapshot(none))
        versions = {
            s.thread_id: s.graph_version
            for s in await cp.list_threads(limit=10_000)
            if s.thread_id in (old, new, none)
        }
        assert versions == {old: "v1", new: "v2", none: ""}
