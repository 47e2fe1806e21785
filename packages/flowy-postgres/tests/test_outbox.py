"""``PostgresOutbox`` and ``PostgresConsumer`` beyond the conformance suite: LISTEN/NOTIFY
wake-ups (after commit only), the polling fallback, revived dead letters, and consumers
with pools of their own sharing the work."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg
import pytest
from pg_support import Conn, acquired, as_asyncpg, intent, snap, wait_until, with_options

import flowy
from flowy_postgres import PostgresBackend

pytestmark = pytest.mark.anyio


async def test_notify_wakes_a_waiting_claim(backend: PostgresBackend[Any]) -> None:
    consumer = backend.consumer
    async with flowy.connect(backend.url) as producer:
        waiting = asyncio.create_task(consumer.claim(1, 30, wait=20))
        await wait_until(lambda: asyncio.sleep(0.05, consumer.listening))
        await asyncio.sleep(0.1)
        started = time.monotonic()
        await producer.outbox.enqueue_intent(intent("wake"))
        [message] = await asyncio.wait_for(waiting, 5)
        # The fallback look comes every second: this was the notification.
        assert time.monotonic() - started < 0.5
        assert message.intent == intent("wake")


async def test_notify_arrives_only_when_the_transaction_commits(
    shared: PostgresBackend[Any], pg_pool: asyncpg.Pool
) -> None:
    cp, consumer = shared.checkpointer, shared.consumer

    async def enqueue(tx: object, revision: int) -> None:
        await shared.outbox.enqueue_intent_tx(tx, intent("committed", revision))

    waiting = asyncio.create_task(consumer.claim(1, 30, wait=20))
    await asyncio.sleep(0.3)
    assert consumer.listening  # on one of the application's pooled connections
    async with acquired(pg_pool) as conn:
        async with conn.transaction():
            await cp.bind(as_asyncpg(conn)).save_with_outbox(0, snap("committed"), enqueue)
            await asyncio.sleep(0.5)
            assert not waiting.done()
        started = time.monotonic()
        [message] = await asyncio.wait_for(waiting, 5)
        assert time.monotonic() - started < 0.5
    assert message.intent == intent("committed")


async def test_polling_takes_over_when_the_listener_dies(
    backend: PostgresBackend[Any], admin: Conn
) -> None:
    consumer = backend.consumer
    assert await consumer.claim(1, 30, wait=0.3) == []
    assert consumer.listening
    pid = await admin.fetchval(
        "SELECT pid FROM pg_stat_activity WHERE query = $1",
        f'LISTEN "{backend.names.channel}"',
    )
    assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
    await wait_until(lambda: asyncio.sleep(0, not consumer.listening), within=5)
    waiting = asyncio.create_task(consumer.claim(1, 30, wait=10))
    await asyncio.sleep(0.2)
    await backend.outbox.enqueue_intent(intent("polled"))
    [message] = await asyncio.wait_for(waiting, 3)
    assert message.intent == intent("polled")


async def test_a_consumer_without_listen_polls(postgres_dsn: str, pg_schema: str) -> None:
    url = with_options(postgres_dsn, schema=pg_schema, listen="false", poll_interval=0.05)
    async with flowy.connect(url) as backend:
        assert isinstance(backend, PostgresBackend)
        waiting = asyncio.create_task(backend.consumer.claim(1, 30, wait=5))
        await asyncio.sleep(0.2)
        await backend.outbox.enqueue_intent(intent("no-listen"))
        [message] = await asyncio.wait_for(waiting, 2)
        assert message.intent.thread_id == "no-listen"
        assert not backend.consumer.listening


async def test_the_end_of_a_visibility_timeout_wakes_a_waiting_claim(
    backend: PostgresBackend[Any],
) -> None:
    await backend.outbox.enqueue_intent(intent("hidden"))
    [first] = await backend.consumer.claim(1, 0.5)
    started = time.monotonic()
    [again] = await backend.consumer.claim(1, 30, wait=10)
    assert 0.3 < time.monotonic() - started < 0.9  # not at the next fallback look
    assert (again.message_id, again.attempts) == (first.message_id, 2)


async def test_re_enqueue_revives_a_dead_letter(backend: PostgresBackend[Any]) -> None:
    outbox, consumer = backend.outbox, backend.consumer
    await outbox.enqueue_intent(intent("revived"))
    for _ in range(consumer.max_attempts):
        [message] = await consumer.claim(1, 30)
        await consumer.release(message, error="handler failed")
    [dead] = await consumer.dead_letters()
    assert dead.error == "handler failed"
    await outbox.enqueue_intent(intent("revived"))
    assert await consumer.dead_letters() == []
    [again] = await consumer.claim(1, 30)
    assert (again.message_id, again.attempts, again.last_error) == (dead.message_id, 1, "")


async def test_consumers_with_pools_of_their_own_share_the_work(
    backend: PostgresBackend[Any],
) -> None:
    for i in range(40):
        await backend.outbox.enqueue_intent(intent(f"shared-{i}"))
    seen: list[str] = []

    async def work() -> None:
        async with flowy.connect(backend.url) as own:
            while messages := await own.consumer.claim(3, 30, wait=0.3):
                for message in messages:
                    seen.append(message.intent.thread_id)
                    await own.consumer.ack(message)

    await asyncio.gather(*(work() for _ in range(3)))
    assert sorted(seen) == sorted(f"shared-{i}" for i in range(40))


async def test_closing_a_from_pool_backend_returns_the_listening_connection(
    pg_pool: asyncpg.Pool, pg_schema: str
) -> None:
    async with PostgresBackend[Any].from_pool(pg_pool, schema=pg_schema) as backend:
        assert await backend.consumer.claim(1, 30, wait=0.2) == []
        assert backend.consumer.listening
    assert not backend.consumer.listening
    # Every connection is back: the pool closes at once (it would wait for a held one).
    await asyncio.wait_for(pg_pool.close(), 5)
