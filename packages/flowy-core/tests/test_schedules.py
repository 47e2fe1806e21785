"""Durable schedules beyond the conformance suite: the claim's arithmetic over long
downtime and daylight saving changes, the worker's loop and its failures, and a SQLite
file of the previous schema upgraded to hold schedules."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import sqlite3
import time
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

import flowy
from flowy.errors import SchemaVersionError
from flowy.memory import MemoryBackend
from flowy.schedules import schedules_of
from flowy.sqlite import SQLiteBackend
from flowy.testing.suite._schedules import (
    STARTS,
    TICK_GRAPH,
    Clock,
)

pytestmark = pytest.mark.anyio
TARGET = "flowy.testing.suite._schedules:TICK_GRAPH"
BERLIN = ZoneInfo("Europe/Berlin")


async def test_catching_up_a_year_of_minutes_reads_only_the_newest_ticks() -> None:
    backend: MemoryBackend[Any] = MemoryBackend()
    made = await backend.schedules.create(
        "minutely", graph=TARGET, cron="* * * * *", catch_up="all", catch_up_cap=5
    )
    now = made.next_tick + 366 * 86400 + 30
    started = time.monotonic()
    claim = await backend.schedules.claim("minutely", now)
    assert time.monotonic() - started < 5  # not half a million ticks one by one
    assert claim is not None
    newest = now - 30
    assert [t for t, _ in claim.ticks] == [newest - 60 * k for k in (4, 3, 2, 1, 0)]
    assert claim.schedule.next_tick == newest + 60
    one = await backend.schedules.create("one", graph=TARGET, cron="* * * * *", catch_up="one")
    claim = await backend.schedules.claim("one", one.next_tick + 366 * 86400 + 30)
    assert claim is not None and len(claim.ticks) == 1


async def test_a_nightly_cron_keeps_its_wall_time_across_the_spring_change() -> None:
    backend: MemoryBackend[Any] = MemoryBackend()
    backend.schedules.clock = lambda: dt.datetime(2026, 3, 27, 12, tzinfo=BERLIN).timestamp()
    made = await backend.schedules.create(
        "nightly", graph=TARGET, cron="30 2 * * *", tz="Europe/Berlin"
    )
    seen: list[str] = []
    schedule = made
    for _ in range(3):
        claim = await backend.schedules.claim_from(schedule, schedule.next_tick)
        assert claim is not None
        seen += [thread for _, thread in claim.ticks]
        for tick, _ in claim.ticks:  # started: no longer pending
            await backend.schedules.started("nightly", tick)
        schedule = await backend.schedules.get("nightly")
    # 28 March 02:30 CET, 29 March: no 02:30 that night (03:30 CEST), 30 March 02:30 CEST.
    assert seen == [
        "nightly@2026-03-28T01:30:00Z",
        "nightly@2026-03-29T01:30:00Z",
        "nightly@2026-03-30T00:30:00Z",
    ]


async def test_a_worker_run_fires_schedules_by_its_clock() -> None:
    backend: MemoryBackend[Any] = MemoryBackend()
    made = await backend.schedules.create("loop", graph=TARGET, every=dt.timedelta(minutes=1))
    clock = Clock(made.next_tick)
    worker = flowy.Worker(
        flowy.Runner(TICK_GRAPH, backend, clock=clock),
        schedule_interval=0.01,
        poll_interval=0.01,
        timer_interval=None,
    )
    task = asyncio.ensure_future(worker.run())
    thread = made.thread_id(made.next_tick)
    for _ in range(500):
        if STARTS[thread]:
            break
        await asyncio.sleep(0.01)
    worker.stop()
    await asyncio.wait_for(task, 10)
    assert STARTS[thread] == 1
    off = flowy.Worker(flowy.Runner(TICK_GRAPH, backend, clock=clock), schedule_interval=None)
    assert off.options.schedule_interval is None
    with pytest.raises(ValueError, match="schedule_interval must be > 0"):
        flowy.types.WorkerOptions(schedule_interval=0)


async def test_schedules_due_together_all_start() -> None:
    backend: MemoryBackend[Any] = MemoryBackend()
    made = [
        await backend.schedules.create(f"s{i}", graph=TARGET, every=dt.timedelta(minutes=1))
        for i in range(6)
    ]
    worker = flowy.Worker(
        flowy.Runner(TICK_GRAPH, backend, clock=Clock(made[-1].next_tick)), concurrency=2
    )
    assert await worker.fire_schedules() == 6
    assert all(STARTS[s.thread_id(s.next_tick)] == 1 for s in made)


async def test_a_graph_that_cannot_be_loaded_is_logged_and_its_tick_spent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend: MemoryBackend[Any] = MemoryBackend()
    made = await backend.schedules.create(
        "broken", graph="no_such_module_here:graph", every=dt.timedelta(minutes=1)
    )
    worker = flowy.Worker(flowy.Runner(TICK_GRAPH, backend, clock=Clock(made.next_tick)))
    with caplog.at_level(logging.ERROR, logger="flowy.worker"):
        assert await worker.fire_schedules() == 0
    assert "schedule 'broken' could not start thread" in caplog.text
    assert "cannot load the graph 'no_such_module_here:graph'" in caplog.text
    assert (await backend.schedules.get("broken")).next_tick == made.next_tick + 60
    not_a_graph = await backend.schedules.create(
        "not-a-graph", graph="flowy.testing.suite._schedules:TARGET", every=dt.timedelta(minutes=1)
    )
    worker = flowy.Worker(flowy.Runner(TICK_GRAPH, backend, clock=Clock(not_a_graph.next_tick)))
    with caplog.at_level(logging.ERROR, logger="flowy.worker"):
        assert await worker.fire_schedules() == 0
    assert "is a str, not a compiled graph" in caplog.text


async def test_a_store_without_schedules_fires_none() -> None:
    backend: MemoryBackend[Any] = MemoryBackend()
    components = flowy.storage.as_backend(backend.checkpointer, consumer=backend.consumer)
    assert not components.capabilities.schedules
    worker = flowy.Worker(flowy.Runner(TICK_GRAPH, components))
    assert await worker.fire_schedules() == 0
    with pytest.raises(TypeError, match="keeps no schedules"):
        schedules_of(components)
    assert schedules_of(backend) is backend.schedules


async def test_a_sqlite_file_of_schema_2_is_upgraded_to_hold_schedules(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    async with SQLiteBackend[Any](path):
        pass
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE flowy_schedules")
    # Take the file back to version 2: without the queues of version 4 or the recency
    # index of version 5 either.
    conn.execute("DROP INDEX flowy_threads_recent")
    conn.execute("ALTER TABLE flowy_threads DROP COLUMN recent_second")
    for index in ("order", "visible", "flight", "dead"):
        conn.execute(f"DROP INDEX flowy_outbox_{index}")
    conn.execute("DROP TABLE flowy_queues")
    conn.execute("DROP TABLE flowy_queue_starts")
    for column in ("queue", "partition_key", "priority", "claimed_until"):
        conn.execute(f"ALTER TABLE flowy_outbox DROP COLUMN {column}")
    conn.execute("PRAGMA user_version = 2")
    conn.commit()
    conn.close()
    backend = SQLiteBackend[Any](path)
    try:
        with pytest.raises(SchemaVersionError, match=r"older .*setup\(\)"):
            await backend.schedules.list()
        assert await backend.setup() == 5
        made = await backend.schedules.create("after", graph=TARGET, cron="0 * * * *")
        assert await backend.schedules.list() == [made]
    finally:
        await backend.aclose()
