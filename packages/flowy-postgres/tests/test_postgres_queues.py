"""Queues on PostgreSQL beyond the conformance suite: the claims of a limited queue take
turns on its limits row and each counts what the one before it took; the claims of a
queue without concurrency or rate limits never wait for that row."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pg_support import Conn, wait_until

from flowy.queues import Route
from flowy.storage import HandoffIntent
from flowy.testing.suite._support import make_intent, new_thread_id
from flowy_postgres import PostgresBackend

pytestmark = pytest.mark.anyio


async def _enqueue(backend: PostgresBackend[Any], route: Route) -> HandoffIntent:
    intent = make_intent(new_thread_id("q"), 1, route=route)
    await backend.outbox.enqueue_intent(intent)
    return intent


async def _a_claim_waits(admin: Conn, backend: PostgresBackend[Any]) -> bool:
    """True once a claim of ``backend``'s schema waits for a lock."""
    return bool(
        await admin.fetchval(
            "SELECT count(*) > 0 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND position($1 in query) > 0",
            backend.names.claim,
        )
    )


async def test_a_claim_that_waited_for_the_limits_row_counts_what_it_missed(
    backend: PostgresBackend[Any], admin: Conn
) -> None:
    """The claim that holds the limits row takes the last slot and commits while another
    claim waits for the row: the waiting claim, whose statement began before that
    commit, still sees the slot taken."""
    await backend.queues.configure("one", global_concurrency=1)
    for _ in range(2):
        await _enqueue(backend, Route("one"))
    async with admin.transaction():
        first = await admin.fetch(f"SELECT * FROM {backend.names.claim}('one', 5, 60, 0)")
        assert len(first) == 1
        second = asyncio.create_task(backend.consumer.claim(5, 60, queue="one"))
        await wait_until(lambda: _a_claim_waits(admin, backend))
        assert not second.done()
    assert await asyncio.wait_for(second, 10) == []
    [stats] = [s for s in await backend.queues.list() if s.queue == "one"]
    assert (stats.in_flight, stats.pending) == (1, 1)


async def test_a_rate_limited_claim_that_waited_counts_the_starts_it_missed(
    backend: PostgresBackend[Any], admin: Conn
) -> None:
    await backend.queues.configure("rated", rate_limit=2, rate_period=600)
    for _ in range(4):
        await _enqueue(backend, Route("rated"))
    async with admin.transaction():
        first = await admin.fetch(f"SELECT * FROM {backend.names.claim}('rated', 1, 60, 0)")
        assert len(first) == 1
        second = asyncio.create_task(backend.consumer.claim(5, 60, queue="rated"))
        await wait_until(lambda: _a_claim_waits(admin, backend))
    assert len(await asyncio.wait_for(second, 10)) == 1
    assert await backend.consumer.claim(5, 60, queue="rated") == []


async def test_claims_of_a_queue_without_counted_limits_do_not_wait(
    backend: PostgresBackend[Any], admin: Conn
) -> None:
    await backend.queues.configure("busy", global_concurrency=5)
    await backend.queues.configure("per-worker", worker_concurrency=1)
    await _enqueue(backend, Route("busy"))
    plain = await _enqueue(backend, Route())
    mine = await _enqueue(backend, Route("per-worker"))
    async with admin.transaction():
        # Another session holds the limits row of "busy" (a claim of it in progress).
        await admin.execute(
            f"SELECT FROM {backend.names.queue_limits} WHERE queue = 'busy' FOR UPDATE"
        )
        claimed = await asyncio.wait_for(backend.consumer.claim(5, 60), 10)
        assert [m.intent for m in claimed] == [plain]
        claimed = await asyncio.wait_for(backend.consumer.claim(5, 60, queue="per-worker"), 10)
        assert [m.intent for m in claimed] == [mine]


async def test_a_partitioned_claim_walks_past_pages_of_full_partitions(
    backend: PostgresBackend[Any],
) -> None:
    """The messages of full partitions fill more than one of the pages the claim reads
    (64 at a time), across two priorities: the claim still reaches the free ones after
    them, in claim order."""
    await backend.queues.configure("walk", partition_concurrency=1)
    await _enqueue(backend, Route("walk", "busy"))
    [held] = await backend.consumer.claim(1, 60, queue="walk")
    for _ in range(150):
        await _enqueue(backend, Route("walk", "busy"))
    for _ in range(70):
        await _enqueue(backend, Route("walk", "busy", priority=1))
    late = await _enqueue(backend, Route("walk", "late", priority=1))
    free = await _enqueue(backend, Route("walk", "free", priority=2))
    claimed = await backend.consumer.claim(5, 60, queue="walk")
    assert [m.intent.thread_id for m in claimed if m.intent] == [late.thread_id, free.thread_id]
    await backend.consumer.ack(held)
    [next_busy] = await backend.consumer.claim(5, 60, queue="walk")
    assert next_busy.intent is not None and next_busy.intent.route.partition_key == "busy"
