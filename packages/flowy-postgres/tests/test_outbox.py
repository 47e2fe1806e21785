"""``PostgresOutbox`` and ``PostgresOutboxConsumer`` beyond the conformance suite:
LISTEN/NOTIFY wake-ups (after commit only), the polling fallback, de-duplication,
dead letters kept with their error, and poison payloads."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg
import pytest
from pg_support import Conn, acquired, as_asyncpg, intent, sql, wait_until

from flowy.checkpoint import (
    OutboxConsumer,
    Snapshot,
    TransactionalHandoffOutbox,
)
from flowy_postgres import (
    PostgresBackend,
    PostgresOutbox,
    PostgresOutboxConsumer,
    create_pool,
)
from flowy_postgres._schema import TableNames, thread_key

pytestmark = pytest.mark.anyio


def slow_polling(pool: asyncpg.Pool, schema: str, **options: Any) -> PostgresOutboxConsumer:
    """A consumer that would take 30 s to notice a message by polling."""
    return PostgresOutboxConsumer(
        pool, schema=schema, poll_interval=30.0, listen_poll_interval=30.0, **options
    )


async def test_protocols(backend: PostgresBackend[Any]) -> None:
    assert isinstance(backend.outbox, TransactionalHandoffOutbox)
    assert isinstance(backend.consumer, OutboxConsumer)


async def test_notify_wakes_a_waiting_claim(
    postgres_dsn: str, pg_pool: asyncpg.Pool, pg_schema: str
) -> None:
    consumer = slow_polling(pg_pool, pg_schema)
    producer_pool = await create_pool(postgres_dsn, min_size=1, max_size=1)
    try:
        waiting = asyncio.create_task(consumer.claim(1, 30, wait=20))
        await asyncio.sleep(0.3)
        assert consumer.listening
        started = time.monotonic()
        await PostgresOutbox(producer_pool, schema=pg_schema).enqueue_intent(intent("wake"))
        [message] = await asyncio.wait_for(waiting, 5)
        assert time.monotonic() - started < 2.0
        assert message.intent == intent("wake")
    finally:
        await consumer.close()
        await producer_pool.close()


async def test_notify_arrives_only_when_the_transaction_commits(
    pg_pool: asyncpg.Pool, pg_schema: str, backend: PostgresBackend[Any]
) -> None:
    consumer = slow_polling(pg_pool, pg_schema)
    cp, outbox = backend.checkpointer, backend.outbox

    async def enqueue(tx: object, revision: int) -> None:
        await outbox.enqueue_intent_tx(tx, intent("committed", revision))

    try:
        waiting = asyncio.create_task(consumer.claim(1, 30, wait=20))
        await asyncio.sleep(0.3)
        async with acquired(pg_pool) as conn:
            async with conn.transaction():
                snapshot = Snapshot[Any](thread_id="committed", state={}, execution_pointer="p")
                await cp.bind(as_asyncpg(conn)).save_with_outbox(0, snapshot, enqueue)
                await asyncio.sleep(0.5)
                assert not waiting.done()
            [message] = await asyncio.wait_for(waiting, 5)
        assert message.intent == intent("committed")
    finally:
        await consumer.close()


async def test_polling_takes_over_when_the_listener_dies(
    pg_pool: asyncpg.Pool, pg_schema: str, admin: Conn
) -> None:
    consumer = PostgresOutboxConsumer(pg_pool, schema=pg_schema, poll_interval=0.1)
    outbox = PostgresOutbox(pg_pool, schema=pg_schema)
    try:
        assert await consumer.claim(1, 30, wait=0.2) == []
        assert consumer.listening
        pid = await admin.fetchval(
            "SELECT pid FROM pg_stat_activity WHERE query = $1",
            f'LISTEN "{TableNames(pg_schema).channel}"',
        )
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)

        async def stopped_listening() -> bool:
            return not consumer.listening

        await wait_until(stopped_listening, within=5)
        waiting = asyncio.create_task(consumer.claim(1, 30, wait=10))
        await asyncio.sleep(0.2)
        await outbox.enqueue_intent(intent("polled"))
        [message] = await asyncio.wait_for(waiting, 3)
        assert message.intent == intent("polled")
    finally:
        await consumer.close()


async def test_a_consumer_without_listen_polls(pg_pool: asyncpg.Pool, pg_schema: str) -> None:
    consumer = PostgresOutboxConsumer(pg_pool, schema=pg_schema, listen=False, poll_interval=0.05)
    try:
        waiting = asyncio.create_task(consumer.claim(1, 30, wait=5))
        await asyncio.sleep(0.2)
        await PostgresOutbox(pg_pool, schema=pg_schema).enqueue_intent(intent("no-listen"))
        [message] = await asyncio.wait_for(waiting, 2)
        assert message.intent.thread_id == "no-listen"
        assert not consumer.listening
    finally:
        await consumer.close()


async def test_a_visibility_timeout_ending_wakes_a_waiting_claim(
    pg_pool: asyncpg.Pool, pg_schema: str
) -> None:
    consumer = slow_polling(pg_pool, pg_schema)
    try:
        await PostgresOutbox(pg_pool, schema=pg_schema).enqueue_intent(intent("hidden"))
        [first] = await consumer.claim(1, 0.5)
        started = time.monotonic()
        [again] = await consumer.claim(1, 30, wait=10)
        assert time.monotonic() - started < 2.0
        assert (again.message_id, again.attempts) == (first.message_id, 2)
    finally:
        await consumer.close()


async def test_the_same_intent_is_enqueued_once(backend: PostgresBackend[Any]) -> None:
    outbox, consumer = backend.outbox, backend.consumer
    await outbox.enqueue_intent(intent("dup", 3))
    await outbox.enqueue_intent(intent("dup", 3))
    await outbox.enqueue_intent(intent("dup", 4))  # another committed revision: a new one
    claimed = await consumer.claim(10, 30)
    assert sorted(m.intent.committed_snapshot_revision for m in claimed) == [3, 4]
    # Re-enqueued while claimed: still one message.
    await outbox.enqueue_intent(intent("dup", 3))
    assert await consumer.claim(10, 30) == []


async def test_re_enqueue_revives_a_dead_letter(backend: PostgresBackend[Any]) -> None:
    outbox, consumer = backend.outbox, backend.consumer
    await outbox.enqueue_intent(intent("revived"))
    for _ in range(consumer.max_attempts):
        [message] = await consumer.claim(1, 30)
        await consumer.release(message, error="handler failed")
    [dead] = await consumer.dead_letters()
    await outbox.enqueue_intent(intent("revived"))
    assert await consumer.dead_letters() == []
    [again] = await consumer.claim(1, 30)
    assert (again.message_id, again.attempts) == (dead.message_id, 1)


async def test_dead_letters_keep_their_last_error(
    backend: PostgresBackend[Any], pg_pool: asyncpg.Pool, pg_schema: str
) -> None:
    outbox, consumer = backend.outbox, backend.consumer
    await outbox.enqueue_intent(intent("failing"))
    for attempt in range(1, consumer.max_attempts + 1):
        [message] = await consumer.claim(1, 30)
        await consumer.release(message, error=f"failure {attempt}")
    [dead] = await consumer.dead_letters()
    row = await sql(pg_pool).fetchrow(
        f"SELECT dead, attempts, last_error FROM {TableNames(pg_schema).outbox} WHERE id = $1",
        int(dead.message_id),
    )
    assert tuple(row) == (True, consumer.max_attempts, f"failure {consumer.max_attempts}")


async def test_a_malformed_payload_is_dead_lettered_not_redelivered(
    backend: PostgresBackend[Any], pg_pool: asyncpg.Pool, pg_schema: str
) -> None:
    names = TableNames(pg_schema)
    await sql(pg_pool).execute(
        f"INSERT INTO {names.outbox} (thread_key, thread_id, committed_revision, payload) "
        f"VALUES ($1, 'poison', 1, 'not json')",
        thread_key("poison"),
    )
    await backend.outbox.enqueue_intent(intent("healthy"))
    [message] = await backend.consumer.claim(10, 30)
    assert message.intent.thread_id == "healthy"
    row = await sql(pg_pool).fetchrow(
        f"SELECT dead, last_error FROM {names.outbox} WHERE thread_id = 'poison'"
    )
    assert row["dead"] is True
    assert "undecodable payload" in row["last_error"]
    assert await backend.consumer.dead_letters() == []


async def test_consumers_with_their_own_pools_share_the_work(
    postgres_dsn: str, pg_pool: asyncpg.Pool, pg_schema: str
) -> None:
    outbox = PostgresOutbox(pg_pool, schema=pg_schema)
    for i in range(40):
        await outbox.enqueue_intent(intent(f"shared-{i}"))
    consumers = [
        await PostgresOutboxConsumer.from_dsn(postgres_dsn, schema=pg_schema) for _ in range(3)
    ]
    seen: list[str] = []

    async def work(consumer: PostgresOutboxConsumer) -> None:
        while messages := await consumer.claim(3, 30, wait=0.3):
            for message in messages:
                seen.append(message.intent.thread_id)
                await consumer.ack(message)

    try:
        await asyncio.gather(*(work(c) for c in consumers))
    finally:
        for consumer in consumers:
            await consumer.close()
    assert sorted(seen) == sorted(f"shared-{i}" for i in range(40))


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf")])
async def test_claim_validates_the_visibility_timeout(
    backend: PostgresBackend[Any], bad: float
) -> None:
    with pytest.raises(ValueError, match="visibility_timeout"):
        await backend.consumer.claim(1, bad)


async def test_consumer_options_are_validated(pg_pool: asyncpg.Pool) -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        PostgresOutboxConsumer(pg_pool, max_attempts=0)
    with pytest.raises(ValueError, match="poll_interval"):
        PostgresOutboxConsumer(pg_pool, poll_interval=0)
