"""``PostgresCheckpointer`` beyond the conformance suite: one round trip per save,
reused plans, the application's own transaction (asyncpg and SQLAlchemy), fencing
against the lease table, and records checked against their columns."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest
from pg_proxy import PgProxy
from pg_support import acquired, as_asyncpg, intent, snap, sql
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from flowy import (
    LeaseLostError,
    MemoryLeaseManager,
    SnapshotEnvelopeInvalidError,
    ThreadLeaseBusyError,
)
from flowy.checkpoint import (
    FencingCheckpointer,
    TransactionalCheckpointer,
)
from flowy_postgres import (
    PostgresBackend,
    PostgresCheckpointer,
    PostgresLeaseManager,
    PostgresTransaction,
    create_pool,
)
from flowy_postgres._schema import TableNames, thread_key

pytestmark = pytest.mark.anyio


async def outbox_rows(pool: asyncpg.Pool, schema: str) -> int:
    return int(await sql(pool).fetchval(f"SELECT count(*) FROM {TableNames(schema).outbox}"))


@pytest.fixture
async def domain(pg_pool: asyncpg.Pool, pg_schema: str) -> str:
    """An application table in the test schema, written in the same transactions."""
    table = f'"{pg_schema}".orders'
    await sql(pg_pool).execute(f"CREATE TABLE {table} (id text PRIMARY KEY, state text NOT NULL)")
    return table


# -- one statement, one round trip ------------------------------------------------------


async def test_save_and_load_are_one_round_trip_each(
    postgres_dsn: str, pg_pool: asyncpg.Pool, pg_schema: str
) -> None:
    async with PgProxy(postgres_dsn) as proxy:
        pool = await create_pool(proxy.dsn, min_size=1, max_size=1)
        try:
            backend = PostgresBackend[Any].from_pool(pool, schema=pg_schema)
            cp = backend.checkpointer
            lease = await backend.leases.acquire("trips", "owner", 30)
            # Warm up: asyncpg prepares each statement once per connection.
            for revision in range(3):
                await cp.save(revision, snap("trips", revision), lease=lease)
                await cp.load("trips")
            await cp.save(0, snap("trips-2"))
            await cp.save(1, snap("trips-2", 1))

            async def trips(operation: Any) -> int:
                await asyncio.sleep(0.05)  # the previous release has finished
                before = proxy.round_trips
                await operation
                return proxy.round_trips - before

            assert await trips(cp.save(3, snap("trips", 4), lease=lease)) == 1
            assert await trips(cp.save(2, snap("trips-2", 2))) == 1
            assert await trips(cp.load("trips")) == 1
            # A refused save explains itself from the same statement.
            with pytest.raises(ThreadLeaseBusyError):
                await cp.save(4, snap("trips", 5))
            before = proxy.round_trips
            with pytest.raises(ThreadLeaseBusyError):
                await cp.save(4, snap("trips", 5))
            assert proxy.round_trips - before == 1
        finally:
            await pool.close()


async def test_save_reuses_a_generic_plan(
    postgres_dsn: str, pg_pool: asyncpg.Pool, pg_schema: str
) -> None:
    """PostgreSQL plans the save statement once per connection, not on every save."""
    pool = await create_pool(postgres_dsn, min_size=1, max_size=1)
    try:
        cp = PostgresCheckpointer[Any](pool, schema=pg_schema)
        for revision in range(12):
            await cp.save(revision, snap("planned", revision))
        rows = await sql(pool).fetch(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE strpos(statement, $1) > 0 AND strpos(statement, 'UPDATE') > 0",
            TableNames(pg_schema).threads,
        )
        [(generic, custom)] = [tuple(r) for r in rows]
        assert generic >= 5, (generic, custom)
    finally:
        await pool.close()


# -- the application's own transaction ---------------------------------------------------


class Rollback(Exception):
    pass


async def test_bound_asyncpg_transaction_commits_or_rolls_back_everything(
    backend: PostgresBackend[Any], pg_pool: asyncpg.Pool, pg_schema: str, domain: str
) -> None:
    cp, outbox = backend.checkpointer, backend.outbox

    async def enqueue(tx: object, revision: int) -> None:
        assert isinstance(tx, PostgresTransaction)
        await outbox.enqueue_intent_tx(tx, intent("order-1", revision))

    async with acquired(pg_pool) as conn:
        bound = cp.bind(as_asyncpg(conn))

        async def approve_then_fail() -> None:
            async with conn.transaction():
                await conn.execute(f"INSERT INTO {domain} VALUES ('order-1', 'approved')")
                assert await bound.save_with_outbox(0, snap("order-1"), enqueue) == 1
                raise Rollback

        with pytest.raises(Rollback):
            await approve_then_fail()
        assert await sql(pg_pool).fetchval(f"SELECT count(*) FROM {domain}") == 0
        assert await cp.list_threads() == []
        assert await outbox_rows(pg_pool, pg_schema) == 0

        async with conn.transaction():
            await conn.execute(f"INSERT INTO {domain} VALUES ('order-1', 'approved')")
            assert (
                await cp.bind(as_asyncpg(conn)).save_with_outbox(0, snap("order-1"), enqueue) == 1
            )
            # Not visible outside the transaction before it commits.
            assert await cp.list_threads() == []
            assert await backend.consumer.claim(10, 30) == []
    assert await sql(pg_pool).fetchval(f"SELECT state FROM {domain}") == "approved"
    assert (await cp.load("order-1"))[1] == 1
    [message] = await backend.consumer.claim(10, 30)
    assert message.intent == intent("order-1", 1)


async def test_bound_sqlalchemy_transaction_commits_or_rolls_back_everything(
    backend: PostgresBackend[Any],
    postgres_dsn: str,
    pg_pool: asyncpg.Pool,
    pg_schema: str,
    domain: str,
) -> None:
    cp, outbox = backend.checkpointer, backend.outbox
    engine = create_async_engine(postgres_dsn.replace("postgresql://", "postgresql+asyncpg://", 1))

    async def enqueue(tx: object, revision: int) -> None:
        await outbox.enqueue_intent_tx(tx, intent("order-2", revision))

    try:
        async with engine.connect() as sa:

            async def pay_then_fail() -> None:
                async with sa.begin():
                    await sa.execute(text(f"INSERT INTO {domain} VALUES ('order-2', 'paid')"))
                    assert await cp.bind(sa).save_with_outbox(0, snap("order-2"), enqueue) == 1
                    raise Rollback

            with pytest.raises(Rollback):
                await pay_then_fail()
            assert await sql(pg_pool).fetchval(f"SELECT count(*) FROM {domain}") == 0
            assert await cp.list_threads() == []
            assert await outbox_rows(pg_pool, pg_schema) == 0

            # The checkpoint may be the transaction's first statement, too.
            async with sa.begin():
                assert await cp.bind(sa).save_with_outbox(0, snap("order-2"), enqueue) == 1
                await sa.execute(text(f"INSERT INTO {domain} VALUES ('order-2', 'paid')"))
                assert await outbox_rows(pg_pool, pg_schema) == 0
        assert await sql(pg_pool).fetchval(f"SELECT state FROM {domain}") == "paid"
        assert (await cp.load("order-2"))[1] == 1
        assert await outbox_rows(pg_pool, pg_schema) == 1
    finally:
        await engine.dispose()


async def test_failed_enqueue_rolls_back_to_a_savepoint_only(
    backend: PostgresBackend[Any], pg_pool: asyncpg.Pool, pg_schema: str, domain: str
) -> None:
    """A failing hand-off undoes its own checkpoint and outbox row, not the application's
    earlier writes: the application decides whether to commit them."""
    cp, outbox = backend.checkpointer, backend.outbox

    async def failing(tx: object, revision: int) -> None:
        await outbox.enqueue_intent_tx(tx, intent("order-3", revision))
        raise RuntimeError("queue rejected the intent")

    async with acquired(pg_pool) as conn, conn.transaction():
        await conn.execute(f"INSERT INTO {domain} VALUES ('order-3', 'new')")
        with pytest.raises(RuntimeError, match="queue rejected"):
            await cp.bind(as_asyncpg(conn)).save_with_outbox(0, snap("order-3"), failing)
        await conn.execute(f"UPDATE {domain} SET state = 'retry later'")
    assert await sql(pg_pool).fetchval(f"SELECT state FROM {domain}") == "retry later"
    assert await cp.list_threads() == []
    assert await outbox_rows(pg_pool, pg_schema) == 0


async def test_bound_view_works_in_a_manually_begun_transaction(
    backend: PostgresBackend[Any], pg_pool: asyncpg.Pool, pg_schema: str
) -> None:
    cp, outbox = backend.checkpointer, backend.outbox

    async def enqueue(tx: object, revision: int) -> None:
        await outbox.enqueue_intent_tx(tx, intent("manual", revision))

    async with acquired(pg_pool) as conn:
        await conn.execute("BEGIN")
        bound = cp.bind(as_asyncpg(conn))
        assert await bound.save(0, snap("manual")) == 1
        assert await bound.save_with_outbox(1, snap("manual", 2), enqueue) == 2
        assert (await bound.load("manual"))[1] == 2  # the view sees its own transaction
        await conn.execute("ROLLBACK")
    assert await cp.list_threads() == []
    assert await outbox_rows(pg_pool, pg_schema) == 0


async def test_an_open_bound_save_does_not_block_renew_or_release(
    backend: PostgresBackend[Any], pg_pool: asyncpg.Pool
) -> None:
    cp, leases = backend.checkpointer, backend.leases
    lease = await leases.acquire("long-tx", "owner", 30)
    async with acquired(pg_pool) as conn, conn.transaction():
        assert await cp.bind(as_asyncpg(conn)).save(0, snap("long-tx"), lease=lease) == 1
        renewed = await asyncio.wait_for(leases.renew(lease, 30), 2.0)
        await asyncio.wait_for(leases.release(renewed), 2.0)
    assert (await cp.load("long-tx"))[1] == 1


async def test_a_takeover_waits_for_a_save_in_flight(
    backend: PostgresBackend[Any], pg_pool: asyncpg.Pool
) -> None:
    """Fencing is strict: once a new owner holds the thread, no write of the old owner can
    still commit; a takeover waits for the old owner's open transaction to end."""
    cp, leases = backend.checkpointer, backend.leases
    old = await leases.acquire("fenced", "old-owner", 1.0)
    async with acquired(pg_pool) as conn:
        async with conn.transaction():
            assert await cp.bind(as_asyncpg(conn)).save(0, snap("fenced"), lease=old) == 1
            await asyncio.sleep(1.2)  # the old lease expires while its save is open
            takeover = asyncio.create_task(leases.acquire("fenced", "new-owner", 30))
            await asyncio.sleep(0.3)
            assert not takeover.done()
        new = await asyncio.wait_for(takeover, 5.0)
    assert new.token > old.token
    assert (await cp.load("fenced"))[1] == 1  # the old owner's save committed first
    with pytest.raises(LeaseLostError):
        await cp.save(1, snap("fenced", 2), lease=old)
    assert await cp.save(1, snap("fenced", 2), lease=new) == 2


async def test_bind_rejects_what_is_not_a_connection(backend: PostgresBackend[Any]) -> None:
    with pytest.raises(TypeError, match="asyncpg connection or a SQLAlchemy AsyncConnection"):
        backend.checkpointer.bind("postgresql://nowhere")  # type: ignore[arg-type]


async def test_enqueue_tx_needs_the_transaction_handle(backend: PostgresBackend[Any]) -> None:
    with pytest.raises(TypeError, match="PostgresTransaction"):
        await backend.outbox.enqueue_intent_tx(object(), intent("x", 1))


# -- fencing and protocols -----------------------------------------------------------------


async def test_protocols_and_fencing_domain(
    backend: PostgresBackend[Any], pg_pool: asyncpg.Pool, pg_schema: str, postgres_dsn: str
) -> None:
    cp = backend.checkpointer
    assert isinstance(cp, FencingCheckpointer)
    assert isinstance(cp, TransactionalCheckpointer)
    assert cp.fences(backend.leases)
    assert cp.fences(PostgresLeaseManager(pg_pool, schema=pg_schema))
    assert not cp.fences(PostgresLeaseManager(pg_pool, schema=pg_schema, prefix="other_"))
    assert not cp.fences(MemoryLeaseManager())
    other = await create_pool(postgres_dsn, min_size=1, max_size=1)
    try:
        assert not cp.fences(PostgresLeaseManager(other, schema=pg_schema))
    finally:
        await other.close()


async def test_a_lease_of_another_thread_does_not_fence(backend: PostgresBackend[Any]) -> None:
    lease = await backend.leases.acquire("mine", "owner", 30)
    with pytest.raises(LeaseLostError, match="for thread 'mine'"):
        await backend.checkpointer.save(0, snap("yours"), lease=lease)


async def test_delete_keeps_the_fencing_counter(backend: PostgresBackend[Any]) -> None:
    cp, leases = backend.checkpointer, backend.leases
    first = await leases.acquire("counted", "owner", 30)
    await cp.save(0, snap("counted"), lease=first)
    await leases.release(first)
    await cp.delete("counted")
    second = await leases.acquire("counted", "owner", 30)
    assert second.token > first.token


# -- records against their columns --------------------------------------------------------


async def test_a_record_that_does_not_match_its_columns_is_refused(
    backend: PostgresBackend[Any], pg_pool: asyncpg.Pool, pg_schema: str
) -> None:
    cp = backend.checkpointer
    names = TableNames(pg_schema)
    await cp.save(0, snap("moved"))
    await cp.save(0, snap("other"))
    # Another thread's record under this thread's key: refused, never returned.
    await sql(pg_pool).execute(
        f"UPDATE {names.threads} SET record = (SELECT record FROM {names.threads} "
        f"WHERE thread_key = $2) WHERE thread_key = $1",
        thread_key("moved"),
        thread_key("other"),
    )
    with pytest.raises(SnapshotEnvelopeInvalidError, match="stored under thread 'moved'"):
        await cp.load("moved")
    # A pointer column that disagrees with the record: refused as well.
    await cp.save(0, snap("pointer"))
    await sql(pg_pool).execute(
        f"UPDATE {names.threads} SET pointer = 'elsewhere' WHERE thread_key = $1",
        thread_key("pointer"),
    )
    with pytest.raises(SnapshotEnvelopeInvalidError, match="pointer"):
        await cp.load("pointer")


async def test_list_threads_reads_columns_not_records(
    backend: PostgresBackend[Any], pg_pool: asyncpg.Pool, pg_schema: str
) -> None:
    cp = backend.checkpointer
    await cp.save(0, snap("listed"))
    await sql(pg_pool).execute(f"UPDATE {TableNames(pg_schema).threads} SET record = '\\x00'")
    [summary] = await cp.list_threads()
    assert (summary.thread_id, summary.revision, summary.execution_pointer) == (
        "listed",
        1,
        "step-0",
    )


async def test_from_dsn_owns_its_pool(
    postgres_dsn: str, pg_pool: asyncpg.Pool, pg_schema: str
) -> None:
    cp = await PostgresCheckpointer[Any].from_dsn(postgres_dsn, schema=pg_schema)
    assert await cp.save(0, snap("owned")) == 1
    await cp.close()
    assert cp.pool.is_closing()
    # A pool passed in stays open when the checkpointer is closed.
    shared = PostgresCheckpointer[Any](pg_pool, schema=pg_schema)
    await shared.close()
    assert (await shared.load("owned"))[1] == 1
