"""Durable schedules (``backend.schedules``): create, read, list, pause, resume and
delete; a tick claimed by exactly one of several schedulers, so one thread starts per
tick; the catch-up policies after downtime, with time injected through a clock (never
slept); and bad input refused with nothing stored.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from collections import Counter
from typing import Any, ClassVar

import pytest

from ..._context import run_metadata
from ..._directives import Directive, completed
from ..._errors import ConcurrencyConflictError, ScheduleError
from ..._graph import Graph, GraphBuilder
from ..._runner import Runner
from ..._worker import Worker
from ...schedules import schedules_of
from ...storage import Backend, RunStatus
from ._support import Suite, peer_of

__all__ = ["TICK_GRAPH", "ScheduleSuite"]

State = dict[str, Any]

STARTS: Counter[str] = Counter()
"""How many times the entry node of :data:`TICK_GRAPH` ran, by thread id."""


def _merge(state: State, update: State) -> State:
    return {**state, **update}


async def _tick(state: State) -> tuple[State, Directive[Any]]:
    STARTS[run_metadata().thread_id] += 1
    return {"ran": True}, completed()


def _tick_graph() -> Graph[State, Any]:
    builder: GraphBuilder[State, Any] = GraphBuilder(_merge)
    return builder.add_node("tick", _tick).allow_no_outgoing_route("tick").compile(version="tick")


TICK_GRAPH = _tick_graph()
"""The graph the suite's schedules start: one node that counts its runs in
:data:`STARTS`."""

TARGET = f"{__name__}:TICK_GRAPH"
MINUTE = dt.timedelta(minutes=1)


class Clock:
    """A clock the test moves (a runner's ``clock``)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _name(label: str) -> str:
    return f"{label}-{uuid.uuid4().hex[:10]}"


class ScheduleSuite(Suite):
    """``backend.schedules`` keeps schedules, and exactly one thread starts per tick."""

    requires: ClassVar[tuple[str, ...]] = ("schedules",)

    async def test_create_get_list_delete(self, flowy_backend: Backend[Any]) -> None:
        store = schedules_of(flowy_backend)
        name = _name("nightly")
        made = await store.create(
            name,
            graph=TARGET,
            cron="0 2 * * *",
            tz="Europe/Berlin",
            state={"queue": "inbox", "n": [1, 2]},
            catch_up="all",
            catch_up_cap=5,
        )
        got = await store.get(name)
        assert got == made
        assert (got.cron, got.tz, got.every, got.state) == (
            "0 2 * * *",
            "Europe/Berlin",
            None,
            {"queue": "inbox", "n": [1, 2]},
        )
        assert (got.catch_up, got.catch_up_cap, got.paused) == ("all", 5, False)
        when = dt.datetime.fromtimestamp(got.next_tick, dt.UTC).astimezone(
            dt.timezone(dt.timedelta(hours=1))
        )
        assert when.minute == 0 and got.next_tick > got.created_at - 1
        other = await store.create(_name("sync"), graph=TARGET, every=dt.timedelta(hours=1))
        assert other.every == 3600.0 and other.cron is None
        assert other.next_tick == other.created_at + 3600
        names = [s.name for s in await store.list()]
        assert names == sorted([name, other.name])
        await store.delete(name)
        assert [s.name for s in await store.list()] == [other.name]
        with pytest.raises(ScheduleError, match="no schedule named"):
            await store.get(name)
        with pytest.raises(ScheduleError, match="no schedule named"):
            await store.delete(name)
        async with peer_of(flowy_backend) as peer:
            assert await schedules_of(peer).get(other.name) == other

    async def test_a_name_is_taken_once(self, flowy_backend: Backend[Any]) -> None:
        store = schedules_of(flowy_backend)
        name = _name("once")
        first = await store.create(name, graph=TARGET, cron="*/5 * * * *")
        with pytest.raises(ScheduleError, match="exists already"):
            await store.create(name, graph=TARGET, cron="0 * * * *")
        assert await store.get(name) == first

    @pytest.mark.parametrize(
        ("kwargs", "error", "message"),
        [
            ({"name": "bad name"}, ValueError, "schedule name"),
            ({"name": ""}, ValueError, "schedule name"),
            ({"graph": "no-colon"}, ValueError, "package.module:attribute"),
            ({"cron": "* * *"}, ValueError, "five fields"),
            ({"cron": "0 0 L * *"}, ValueError, "not supported"),
            ({"tz": "Mars/Olympus"}, ValueError, "unknown time zone"),
            ({"every": MINUTE}, ValueError, "not both"),
            ({"cron": None}, ValueError, "not both or neither"),
            ({"catch_up": "some"}, ValueError, "catch_up must be"),
            ({"catch_up_cap": 0}, ValueError, "catch_up_cap must be"),
            ({"catch_up_cap": True}, TypeError, "catch_up_cap must be an int"),
            ({"state": {"x": float("nan")}}, ValueError, "JSON"),
        ],
    )
    async def test_bad_input_is_refused_and_nothing_stored(
        self,
        flowy_backend: Backend[Any],
        kwargs: dict[str, Any],
        error: type[Exception],
        message: str,
    ) -> None:
        store = schedules_of(flowy_backend)
        given: dict[str, Any] = {"name": _name("bad"), "graph": TARGET, "cron": "0 * * * *"}
        given.update(kwargs)
        with pytest.raises(error, match=message) as info:
            await store.create(given.pop("name"), **given)
        assert "\n" not in str(info.value)
        assert await store.list() == []
        with pytest.raises(ValueError, match="schedule name"):
            await store.pause("no such/name")

    async def test_a_stale_claim_is_refused(self, flowy_backend: Backend[Any]) -> None:
        store = schedules_of(flowy_backend)
        made = await store.create(_name("cas"), graph=TARGET, every=MINUTE)
        now = made.next_tick
        first = await store.claim_from(made, now)
        assert first is not None and first.ticks == ((now, made.thread_id(now)),)
        assert await store.claim_from(made, now) is None  # its version moved on
        assert await store.claim_from(made, now + 600) is None
        again = await store.get(made.name)
        assert again.version == made.version + 1 and again.next_tick == now + 60
        assert again.last_tick == now

    async def test_a_claim_is_one_read_and_one_write(self, flowy_backend: Backend[Any]) -> None:
        store = schedules_of(flowy_backend)
        due = await store.create(_name("due"), graph=TARGET, every=MINUTE)
        for label in ("later-a", "later-b", "paused"):
            await store.create(
                _name(label), graph=TARGET, cron="0 0 1 1 *", paused=label == "paused"
            )
        calls: Counter[str] = Counter()
        for primitive in ("_read", "_read_all", "_replace", "_insert", "_delete"):
            original = getattr(store, primitive)

            def counted(*args: Any, _name: str = primitive, _call: Any = original) -> Any:
                calls[_name] += 1
                return _call(*args)

            setattr(store, primitive, counted)
        try:
            claim = await store.claim(due.name, due.next_tick)
            assert claim is not None
            assert calls == Counter({"_read": 1, "_replace": 1})
            await store.started(due.name, due.next_tick)  # its thread started
            calls.clear()
            # A worker's look: one listing, one write per due schedule only, and a read
            # and a write per started tick (it is no longer pending).
            worker = Worker(Runner(TICK_GRAPH, flowy_backend, clock=Clock(due.next_tick + 60)))
            assert await worker.fire_schedules() == 1
            assert calls == Counter({"_read_all": 1, "_replace": 2, "_read": 1})
        finally:
            for primitive in ("_read", "_read_all", "_replace", "_insert", "_delete"):
                delattr(store, primitive)

    async def test_one_start_per_tick_with_four_concurrent_schedulers(
        self, flowy_backend: Backend[Any]
    ) -> None:
        store = schedules_of(flowy_backend)
        made = await store.create(_name("race"), graph=TARGET, every=MINUTE, catch_up="one")
        clock = Clock(made.next_tick)
        async with (
            peer_of(flowy_backend) as p1,
            peer_of(flowy_backend) as p2,
            peer_of(flowy_backend) as p3,
        ):
            workers = [
                Worker(Runner(TICK_GRAPH, b, clock=clock), owner=f"scheduler-{i}")
                for i, b in enumerate((flowy_backend, p1, p2, p3))
            ]
            started: list[int] = []
            for _ in range(5):
                results = await asyncio.gather(*(w.fire_schedules() for w in workers))
                started.append(sum(results))
                clock.now += 60
        assert started == [1, 1, 1, 1, 1]
        ticks = [made.next_tick + 60 * k for k in range(5)]
        for tick in ticks:
            thread_id = made.thread_id(tick)
            assert STARTS[thread_id] == 1, thread_id
            head, _ = await Runner(TICK_GRAPH, flowy_backend).head(thread_id)
            assert head.status is RunStatus.COMPLETED
            assert head.state == {"ran": True}

    async def test_a_tick_whose_worker_died_before_starting_it_starts_later(
        self, flowy_backend: Backend[Any]
    ) -> None:
        store = schedules_of(flowy_backend)
        made = await store.create(_name("died"), graph=TARGET, every=MINUTE)
        tick = made.next_tick
        # A worker claims the tick, then dies before it starts the tick's thread.
        claim = await store.claim(made.name, tick, hold=30.0)
        assert claim is not None and claim.ticks == ((tick, made.thread_id(tick)),)
        assert [t for t, _ in (await store.get(made.name)).pending] == [tick]
        clock = Clock(tick + 10)
        worker = Worker(Runner(TICK_GRAPH, flowy_backend, clock=clock), lease_ttl=30.0)
        assert await worker.fire_schedules() == 0  # still held by the claim
        clock.now = tick + 31  # the hold ran out: the next look takes it again
        assert await worker.fire_schedules() == 1
        assert STARTS[made.thread_id(tick)] == 1
        assert (await store.get(made.name)).pending == ()
        assert await worker.fire_schedules() == 0

    async def test_a_pending_tick_whose_thread_exists_is_not_started_again(
        self, flowy_backend: Backend[Any]
    ) -> None:
        store = schedules_of(flowy_backend)
        made = await store.create(_name("exists"), graph=TARGET, every=MINUTE)
        tick, thread_id = made.next_tick, made.thread_id(made.next_tick)
        # A worker claims the tick and starts its thread, then dies before it says so.
        assert await store.claim(made.name, tick, hold=30.0) is not None
        runner = Runner(TICK_GRAPH, flowy_backend, clock=Clock(tick + 31))
        await runner.start(thread_id, {})
        assert await Worker(runner, lease_ttl=30.0).fire_schedules() == 0
        assert STARTS[thread_id] == 1
        assert (await store.get(made.name)).pending == ()

    async def test_four_schedulers_that_read_one_version_claim_once(
        self, flowy_backend: Backend[Any]
    ) -> None:
        made = await schedules_of(flowy_backend).create(_name("read"), graph=TARGET, every=MINUTE)
        async with (
            peer_of(flowy_backend) as p1,
            peer_of(flowy_backend) as p2,
            peer_of(flowy_backend) as p3,
        ):
            stores = [schedules_of(b) for b in (flowy_backend, p1, p2, p3)]
            for k in range(3):
                now = made.next_tick + 60 * k
                seen = [await store.get(made.name) for store in stores]  # one version, read 4x
                assert len({s.version for s in seen}) == 1
                claims = await asyncio.gather(
                    *(store.claim_from(s, now) for store, s in zip(stores, seen, strict=True))
                )
                won = [c for c in claims if c is not None]
                assert len(won) == 1, claims
                assert won[0].ticks == ((now, made.thread_id(now)),)
                await stores[0].started(made.name, now)  # the winner started its thread

    async def test_a_ticks_thread_cannot_start_twice(self, flowy_backend: Backend[Any]) -> None:
        store = schedules_of(flowy_backend)
        made = await store.create(_name("dup"), graph=TARGET, every=MINUTE, state={"a": 1})
        runner = Runner(TICK_GRAPH, flowy_backend, clock=Clock(made.next_tick))
        assert await Worker(runner).fire_schedules() == 1
        thread_id = made.thread_id(made.next_tick)
        with pytest.raises(ConcurrencyConflictError):
            await runner.start(thread_id, {"a": 1})
        assert STARTS[thread_id] == 1
        head, _ = await runner.head(thread_id)
        assert head.state == {"a": 1, "ran": True}

    @pytest.mark.parametrize(
        ("policy", "late", "expected"),
        [
            ("skip", 0, [9]),  # the newest tick is on time: it starts
            ("skip", 90, []),  # every due tick is past the grace: all dropped
            ("one", 90, [9]),  # the newest due tick, however late
            ("all", 0, [7, 8, 9]),  # the newest three (the cap), oldest first
            ("all", 90, [7, 8, 9]),
        ],
    )
    async def test_catch_up_after_downtime(
        self, flowy_backend: Backend[Any], policy: Any, late: int, expected: list[int]
    ) -> None:
        store = schedules_of(flowy_backend)
        every = 120  # a due tick is never more than a minute late unless ticks were missed
        made = await store.create(
            _name(policy),
            graph=TARGET,
            every=dt.timedelta(seconds=every),
            catch_up=policy,
            catch_up_cap=3,
        )
        first = made.next_tick
        clock = Clock(first + 9 * every + late)  # ten ticks came due while nothing ran
        worker = Worker(Runner(TICK_GRAPH, flowy_backend, clock=clock))
        assert await worker.fire_schedules() == len(expected)
        for k in range(11):
            want = 1 if k in expected else 0
            assert STARTS[made.thread_id(first + every * k)] == want, (k, policy)
        after = await store.get(made.name)
        assert after.next_tick == first + 10 * every
        assert after.last_tick == first + 9 * every
        assert await worker.fire_schedules() == 0  # nothing is due until the next tick

    async def test_pause_and_resume(self, flowy_backend: Backend[Any]) -> None:
        store = schedules_of(flowy_backend)
        made = await store.create(_name("pause"), graph=TARGET, every=MINUTE)
        paused = await store.pause(made.name)
        assert paused.paused and (await store.pause(made.name)).paused  # idempotent
        clock = Clock(made.next_tick + 60)
        worker = Worker(Runner(TICK_GRAPH, flowy_backend, clock=clock))
        assert await worker.fire_schedules() == 0
        assert await store.claim(made.name, clock.now) is None
        assert STARTS[made.thread_id(made.next_tick)] == 0
        resumed = await store.resume(made.name)
        assert not resumed.paused
        assert resumed.next_tick > made.next_tick - 1  # from now on: the paused ticks are skipped
        assert await store.resume(made.name) == resumed  # idempotent
        clock.now = resumed.next_tick
        assert await worker.fire_schedules() == 1
        assert STARTS[made.thread_id(resumed.next_tick)] == 1
        with pytest.raises(ScheduleError, match="no schedule named"):
            await store.pause(_name("missing"))

    async def test_a_deleted_schedule_starts_nothing(self, flowy_backend: Backend[Any]) -> None:
        store = schedules_of(flowy_backend)
        made = await store.create(_name("gone"), graph=TARGET, every=MINUTE)
        clock = Clock(made.next_tick)
        worker = Worker(Runner(TICK_GRAPH, flowy_backend, clock=clock))
        assert await worker.fire_schedules() == 1
        await store.delete(made.name)
        clock.now += 600
        assert await worker.fire_schedules() == 0
        assert await store.claim(made.name, clock.now) is None
        head, _ = await Runner(TICK_GRAPH, flowy_backend).head(made.thread_id(made.next_tick))
        assert head.status is RunStatus.COMPLETED  # the threads it started stay
