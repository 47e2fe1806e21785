"""``PostgresCheckpointer`` beyond the conformance suite: one round trip per save, reused
plans, the application's own transaction (asyncpg and SQLAlchemy), fencing against the
lease table, listings by index, records checked against their address, and the save
that acknowledges a message as the consumer's ack does."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import asyncpg
import pytest
from pg_proxy import PgProxy
from pg_support import (
    FIXED_TIME,
    Conn,
    acquired,
    as_asyncpg,
    intent,
    new_pool,
    opened,
    snap,
    sql,
    wait_until,
)
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from flowy.errors import LeaseLostError, SnapshotEnvelopeInvalidError, ThreadLeaseBusyError
from flowy.memory import MemoryLeaseManager
from flowy.queues import Route
from flowy.storage import OutboxMessage, Signal, Timer
from flowy.testing.suite._support import make_intent
from flowy_postgres import PostgresBackend
from flowy_postgres._schema import TableNames, thread_key

pytestmark = pytest.mark.anyio


async def outbox_rows(pool: asyncpg.Pool | None, schema: str) -> int:
    return int(await sql(pool).fetchval(f"SELECT count(*) FROM {TableNames(schema).outbox}"))


@pytest.fixture
async def domain(pg_pool: asyncpg.Pool, pg_schema: str) -> str:
    """An application table in the test schema, written in the same transactions."""
    table = f'"{pg_schema}".orders'
    await sql(pg_pool).execute(f"CREATE TABLE {table} (id text PRIMARY KEY, state text NOT NULL)")
    return table


def enqueuer(backend: PostgresBackend[Any], thread_id: str) -> Any:
    async def enqueue(tx: object, revision: int) -> None:
        await backend.outbox.enqueue_intent_tx(tx, intent(thread_id, revision))

    return enqueue


# -- one statement, one round trip ------------------------------------------------------


async def test_saves_and_loads_are_one_round_trip_each(postgres_dsn: str, pg_schema: str) -> None:
    async with (
        PgProxy(postgres_dsn) as proxy,
        opened(proxy.dsn, schema=pg_schema, pool_size=1, listen="false") as backend,
    ):
        cp = backend.checkpointer
        lease = await backend.leases.acquire("trips", "owner", 30)
        # Warm up: asyncpg prepares each statement once per connection.
        for revision in range(3):
            await cp.save(revision, snap("trips", revision), lease=lease)
            await cp.load("trips")
        for revision in range(3):
            await cp.save_with_outbox(
                revision, snap("trips-2", revision), enqueuer(backend, "trips-2")
            )

        async def trips(operation: Any) -> int:
            await asyncio.sleep(0.05)  # the previous release has finished
            before = proxy.round_trips
            await operation
            return proxy.round_trips - before

        assert await trips(cp.save(3, snap("trips", 4), lease=lease)) == 1
        assert await trips(cp.load("trips")) == 1
        tx = cp.save_with_outbox(3, snap("trips-2", 4), enqueuer(backend, "trips-2"))
        assert await trips(tx) == 1
        # A refused save explains itself from the same statement.
        with pytest.raises(ThreadLeaseBusyError):
            await cp.save(4, snap("trips", 5))
        await asyncio.sleep(0.05)
        before = proxy.round_trips
        with pytest.raises(ThreadLeaseBusyError):
            await cp.save(4, snap("trips", 5))
        assert proxy.round_trips - before == 1
        # The head's wake-up time is a column the same statement writes.
        waiting = replace(snap("trips", 5), wake_at=FIXED_TIME)
        assert await trips(cp.save(4, waiting, lease=lease)) == 1
        assert await cp.timers() == [Timer("trips", FIXED_TIME)]


async def test_saves_reuse_a_generic_plan(postgres_dsn: str, pg_schema: str) -> None:
    """PostgreSQL plans each save statement once per connection, not on every save."""
    async with opened(postgres_dsn, schema=pg_schema, pool_size=1) as backend:
        for revision in range(12):
            await backend.checkpointer.save(revision, snap("planned", revision))
        rows = await sql(backend.pool).fetch(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE strpos(statement, $1) > 0 AND strpos(statement, 'UPDATE') > 0",
            TableNames(pg_schema).threads,
        )
        [(generic, custom)] = [tuple(r) for r in rows]
        assert generic >= 5, (generic, custom)


# -- the application's own transaction ---------------------------------------------------


class Rollback(Exception):
    pass


async def test_a_bound_asyncpg_transaction_commits_or_rolls_back_everything(
    shared: PostgresBackend[Any], pg_pool: asyncpg.Pool, pg_schema: str, domain: str
) -> None:
    cp, enqueue = shared.checkpointer, enqueuer(shared, "order-1")
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
            assert await bound.save_with_outbox(0, snap("order-1"), enqueue) == 1
            # Not visible outside the transaction before it commits.
            assert await cp.list_threads() == []
            assert await shared.consumer.claim(10, 30) == []
    assert await sql(pg_pool).fetchval(f"SELECT state FROM {domain}") == "approved"
    assert (await cp.load("order-1"))[1] == 1
    [message] = await shared.consumer.claim(10, 30)
    assert message.intent == intent("order-1", 1)


async def test_a_bound_sqlalchemy_transaction_commits_or_rolls_back_everything(
    shared: PostgresBackend[Any],
    postgres_dsn: str,
    pg_pool: asyncpg.Pool,
    pg_schema: str,
    domain: str,
) -> None:
    cp, enqueue = shared.checkpointer, enqueuer(shared, "order-2")
    engine = create_async_engine(postgres_dsn.replace("postgresql://", "postgresql+asyncpg://", 1))
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


async def test_a_failing_enqueue_writes_nothing_and_keeps_the_transaction_usable(
    shared: PostgresBackend[Any], pg_pool: asyncpg.Pool, pg_schema: str, domain: str
) -> None:
    """The callback runs before the save statement: a failing hand-off writes nothing,
    and the application decides what to do with its own earlier writes."""

    async def failing(tx: object, revision: int) -> None:
        await shared.outbox.enqueue_intent_tx(tx, intent("order-3", revision))
        raise RuntimeError("queue rejected the intent")

    async with acquired(pg_pool) as conn, conn.transaction():
        await conn.execute(f"INSERT INTO {domain} VALUES ('order-3', 'new')")
        bound = shared.checkpointer.bind(as_asyncpg(conn))
        with pytest.raises(RuntimeError, match="queue rejected"):
            await bound.save_with_outbox(0, snap("order-3"), failing)
        await conn.execute(f"UPDATE {domain} SET state = 'retry later'")
    assert await sql(pg_pool).fetchval(f"SELECT state FROM {domain}") == "retry later"
    assert await shared.checkpointer.list_threads() == []
    assert await outbox_rows(pg_pool, pg_schema) == 0


async def test_a_bound_view_works_in_a_manually_begun_transaction(
    shared: PostgresBackend[Any], pg_pool: asyncpg.Pool, pg_schema: str
) -> None:
    cp = shared.checkpointer
    async with acquired(pg_pool) as conn:
        await conn.execute("BEGIN")
        bound = cp.bind(as_asyncpg(conn))
        assert await bound.save(0, snap("manual")) == 1
        assert await bound.save_with_outbox(1, snap("manual", 2), enqueuer(shared, "manual")) == 2
        assert (await bound.load("manual"))[1] == 2  # the view sees its own transaction
        await bound.delete("manual")  # two statements, inside the application's transaction
        assert await bound.list_threads() == []
        await conn.execute("ROLLBACK")
    assert await cp.list_threads() == []
    assert await outbox_rows(pg_pool, pg_schema) == 0


async def test_an_open_bound_save_does_not_block_renewing(
    shared: PostgresBackend[Any], pg_pool: asyncpg.Pool
) -> None:
    cp, leases = shared.checkpointer, shared.leases
    lease = await leases.acquire("long-tx", "owner", 30)
    async with acquired(pg_pool) as conn, conn.transaction():
        assert await cp.bind(as_asyncpg(conn)).save(0, snap("long-tx"), lease=lease) == 1
        renewed = await asyncio.wait_for(leases.renew(lease, 30), 2.0)
    await leases.release(renewed)
    assert (await cp.load("long-tx"))[1] == 1


async def test_a_takeover_waits_for_a_save_in_flight(
    shared: PostgresBackend[Any], pg_pool: asyncpg.Pool
) -> None:
    """Fencing is strict: once a new owner holds the thread, no write of the old owner can
    still commit; a takeover waits for the old owner's open transaction to end."""
    cp, leases = shared.checkpointer, shared.leases
    old = await leases.acquire("fenced", "old-owner", 1.0)
    async with acquired(pg_pool) as conn:
        async with conn.transaction():
            assert await cp.bind(as_asyncpg(conn)).save(0, snap("fenced"), lease=old) == 1
            await asyncio.sleep(1.2)  # the old lease expires while its save is open
            takeover = asyncio.create_task(leases.acquire("fenced", "new-owner", 30))
            await asyncio.sleep(0.3)
            assert not takeover.done()
        new = await asyncio.wait_for(takeover, 5.0)
    assert new.fencing_token > old.fencing_token
    assert (await cp.load("fenced"))[1] == 1  # the old owner's save committed first
    with pytest.raises(LeaseLostError):
        await cp.save(1, snap("fenced", 2), lease=old)
    assert await cp.save(1, snap("fenced", 2), lease=new) == 2


async def waits_for_a_lock(pool: asyncpg.Pool, schema: str) -> bool:
    """Whether a statement on ``schema``'s tables is waiting for a lock."""
    query = (
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE wait_event_type = 'Lock' AND position($1::text IN query) > 0"
    )
    return int(await sql(pool).fetchval(query, schema)) > 0


@pytest.mark.parametrize("ended", ["released", "expired", "unleased"])
async def test_a_takeover_reads_the_save_it_waited_for(
    shared: PostgresBackend[Any], pg_pool: asyncpg.Pool, pg_schema: str, ended: str
) -> None:
    """``acquire_and_load`` takes the lease, then reads the head: a save that commits
    while the acquisition waits (the holder's last save, which releases the lease; a
    save under a lease that expired meanwhile; a save without a lease) is the head it
    reads, though the statement began before that save committed. Reading the head as
    the statement's snapshot has it, or through a lock that the save's update does not
    conflict with (``FOR KEY SHARE``), gives the revision before: the new holder does
    the step again."""
    cp, leases = shared.checkpointer, shared.leases
    tid = f"waited-{ended}"
    lease = None
    if ended != "unleased":
        lease = await leases.acquire(tid, "old-owner", 1.0 if ended == "expired" else 30.0)
    assert await cp.save(0, snap(tid, 1), lease=lease) == 1
    async with acquired(pg_pool) as conn:
        async with conn.transaction():
            bound = cp.bind(as_asyncpg(conn))
            if ended == "released":
                assert lease is not None
                assert await bound.save_and_release(1, snap(tid, 2), lease=lease) == 2
            else:
                assert await bound.save(1, snap(tid, 2), lease=lease) == 2
            if ended == "expired":  # expired, but its save still holds the lease row

                async def expired() -> bool:
                    return await leases.holder(tid) is None

                await wait_until(expired)
            takeover = asyncio.create_task(cp.acquire_and_load(tid, "new-owner", 30))

            async def stopped() -> bool:
                return takeover.done() or await waits_for_a_lock(pg_pool, pg_schema)

            await wait_until(stopped)
            assert not takeover.done(), "the takeover did not wait for the open save"
        new, head = await asyncio.wait_for(takeover, 5.0)
    assert head is not None
    snapshot, revision = head
    assert (revision, snapshot.state) == (2, {"n": 2})
    assert new.owner == "new-owner"
    await leases.release(new)


async def test_bind_rejects_what_is_not_an_asyncpg_connection(
    shared: PostgresBackend[Any],
) -> None:
    with pytest.raises(TypeError, match="asyncpg connection or a SQLAlchemy AsyncConnection"):
        shared.checkpointer.bind("postgresql://nowhere")  # type: ignore[arg-type]


# -- fencing domain ------------------------------------------------------------------------


async def test_fencing_domain(
    shared: PostgresBackend[Any], pg_pool: asyncpg.Pool, pg_schema: str, postgres_dsn: str
) -> None:
    cp = shared.checkpointer
    same = PostgresBackend[Any].from_pool(pg_pool, schema=pg_schema)
    assert cp.fences(shared.leases) and cp.fences(same.leases)
    assert not cp.fences(
        PostgresBackend[Any].from_pool(pg_pool, schema=pg_schema, prefix="o_").leases
    )
    assert not cp.fences(MemoryLeaseManager())
    other = await new_pool(postgres_dsn, min_size=1, max_size=1)
    try:
        assert not cp.fences(PostgresBackend[Any].from_pool(other, schema=pg_schema).leases)
    finally:
        await other.close()

    # The outbox of another store cannot join this store's transactions.
    async def foreign(tx: object, revision: int) -> None:
        alien = PostgresBackend[Any].from_pool(pg_pool, schema=pg_schema, prefix="o_")
        await alien.outbox.enqueue_intent_tx(tx, intent("foreign", revision))

    with pytest.raises(ValueError, match="not in one store"):
        await cp.save_with_outbox(0, snap("foreign"), foreign)


# -- records and listings -------------------------------------------------------------------


async def test_a_record_stored_under_another_thread_is_refused(
    backend: PostgresBackend[Any], admin: Conn
) -> None:
    cp, n = backend.checkpointer, backend.names
    await cp.save(0, snap("moved"))
    await cp.save(0, snap("other"))
    await admin.execute(
        f"UPDATE {n.history} SET record = (SELECT record FROM {n.history} "
        "WHERE thread_key = $2) WHERE thread_key = $1",
        thread_key("moved"),
        thread_key("other"),
    )
    with pytest.raises(SnapshotEnvelopeInvalidError, match="moved"):
        await cp.load("moved")
    await admin.execute(f"DELETE FROM {n.history} WHERE thread_key = $1", thread_key("other"))
    with pytest.raises(SnapshotEnvelopeInvalidError, match="no record"):
        await cp.load("other")


async def test_list_threads_reads_columns_not_records(
    backend: PostgresBackend[Any], admin: Conn
) -> None:
    await backend.checkpointer.save(0, snap("listed"))
    await admin.execute(f"UPDATE {backend.names.history} SET record = '\\x00'")
    [summary] = await backend.checkpointer.list_threads()
    assert (summary.thread_id, summary.revision, summary.execution_pointer) == (
        "listed",
        1,
        "step-0",
    )


async def test_long_ids_with_a_common_prefix_list_in_order(backend: PostgresBackend[Any]) -> None:
    """The index holds the first 200 characters; ids beyond that still order exactly."""
    common = "é" * 250
    ids = [common + tail for tail in ("b", "a", "ab", "\U0001f99c", "Z")] + ["a", "é", "~"]
    for thread_id in ids:
        await backend.checkpointer.save(0, snap(thread_id))
    listed = [s.thread_id for s in await backend.checkpointer.list_threads(limit=100)]
    assert listed == sorted(ids)
    page: list[str] = []
    after: str | None = None
    while batch := await backend.checkpointer.list_threads(limit=2, after=after):
        page += [s.thread_id for s in batch]
        after = batch[-1].thread_id
    assert page == sorted(ids)


async def test_listings_use_the_indexes(backend: PostgresBackend[Any]) -> None:
    sql_list = backend.checkpointer._sql.list  # pyright: ignore[reportPrivateUsage]
    async with acquired(backend.pool) as conn:
        await conn.execute("SET enable_seqscan = off")
        try:
            for (kind, paged), statement in sql_list.items():
                args: list[object] = [10, "a"] if paged else [10]
                if kind is not None:
                    args.append(["pending"] if kind == "handoff" else ["none", "pending"])
                plan = "\n".join(r[0] for r in await conn.fetch(f"EXPLAIN {statement}", *args))
                assert "Seq Scan" not in plan, (kind, paged, plan)
        finally:
            await conn.execute("RESET enable_seqscan")


async def test_timers_read_the_wake_up_index(backend: PostgresBackend[Any]) -> None:
    statement = backend.checkpointer._sql.timers  # pyright: ignore[reportPrivateUsage]
    async with acquired(backend.pool) as conn:
        await conn.execute("SET enable_seqscan = off")
        try:
            plan = "\n".join(r[0] for r in await conn.fetch(f"EXPLAIN {statement}", 1e9, 10))
            assert "threads_wake_idx" in plan, plan
        finally:
            await conn.execute("RESET enable_seqscan")


async def test_timers_due_together_go_in_thread_id_order(backend: PostgresBackend[Any]) -> None:
    """Ties go by thread id in code point order, past the indexed first 200 characters."""
    common = "é" * 250
    ids = [common + tail for tail in ("b", "a", "\U0001f99c", "Z")] + ["a", "~"]
    for thread_id in ids:
        await backend.checkpointer.save(0, replace(snap(thread_id), wake_at=FIXED_TIME))
    timers = await backend.checkpointer.timers(before=FIXED_TIME)
    assert [t.thread_id for t in timers] == sorted(ids)


# -- signals -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("end", "racing_id", "seq", "payloads"),
    [
        ("ROLLBACK", "b", 1, ["racing"]),
        ("COMMIT", "b", 2, ["held", "racing"]),
        ("COMMIT", "a", 1, ["held"]),  # the same id: the committed signal
    ],
)
async def test_a_signal_is_numbered_after_the_one_before_it_ends(
    shared: PostgresBackend[Any],
    pg_pool: asyncpg.Pool,
    end: str,
    racing_id: str,
    seq: int,
    payloads: list[str],
) -> None:
    """Signal n + 1 is never written while n may still commit: a sender racing an open
    transaction's signal waits for it to end, then numbers its own."""
    cp = shared.checkpointer
    async with acquired(pg_pool) as conn:
        await conn.execute("BEGIN")
        held = await cp.bind(as_asyncpg(conn)).append_signal(Signal("inbox", "go", "held", "a"))
        assert held.seq == 1
        racing = asyncio.create_task(cp.append_signal(Signal("inbox", "go", "racing", racing_id)))
        await asyncio.sleep(0.3)
        assert not racing.done()
        assert await cp.signals("inbox") == []
        await conn.execute(end)
    stored = await asyncio.wait_for(racing, 5.0)
    assert (stored.seq, stored.payload) == (seq, payloads[-1])
    assert [s.payload for s in await cp.signals("inbox")] == payloads


# -- pools -----------------------------------------------------------------------------------


async def test_a_dsn_backend_owns_its_pool_and_from_pool_leaves_it_open(
    postgres_dsn: str, pg_pool: asyncpg.Pool, pg_schema: str
) -> None:
    owned = await PostgresBackend[Any].from_dsn(postgres_dsn, schema=pg_schema)
    pool = owned.pool
    assert pool is not None and await owned.checkpointer.save(0, snap("owned")) == 1
    await owned.aclose()
    assert pool.is_closing() and owned.pool is None
    async with PostgresBackend[Any].from_pool(pg_pool, schema=pg_schema) as shared:
        assert (await shared.checkpointer.load("owned"))[1] == 1
    assert not pg_pool.is_closing()
    assert await sql(pg_pool).fetchval("SELECT 1") == 1


# -- the save that acknowledges the message of a resumed run ----------------------------------


async def _handed_off(
    backend: PostgresBackend[Any], thread_id: str, route: Route | None = None
) -> OutboxMessage:
    """Thread ``thread_id`` at revision 1 with its hand-off message (in ``route``, else
    the default queue) claimed."""
    route = route or Route()
    enqueue = make_intent(thread_id, 1, route=route)

    async def hand_off(tx: object, revision: int) -> None:
        await backend.outbox.enqueue_intent_tx(tx, enqueue)

    assert await backend.checkpointer.save_with_outbox(0, snap(thread_id), hand_off) == 1
    [message] = await backend.consumer.claim(1, 60, queue=route.queue)
    assert message.intent == enqueue
    return message


async def _live_ids(backend: PostgresBackend[Any]) -> list[int]:
    return [
        int(r[0])
        for r in await sql(backend.pool).fetch(
            f"SELECT id FROM {backend.names.outbox} WHERE NOT dead ORDER BY id"
        )
    ]


async def test_an_acking_save_is_one_round_trip(postgres_dsn: str, pg_schema: str) -> None:
    async with (
        PgProxy(postgres_dsn) as proxy,
        opened(proxy.dsn, schema=pg_schema, pool_size=1, listen="false") as backend,
    ):
        cp = backend.checkpointer
        for n in range(3):  # the last round is measured (asyncpg prepares once per connection)
            tid = f"acked-{n}"
            message = await _handed_off(backend, tid)
            lease = await backend.leases.acquire(tid, "worker", 30)
            await asyncio.sleep(0.05)  # the previous release has finished
            before = proxy.round_trips
            assert await cp.save_and_release(1, snap(tid, 2), lease=lease, ack=message) == 2
            trips = proxy.round_trips - before
        assert trips == 1
        assert await _live_ids(backend) == []
        assert [await backend.leases.holder(f"acked-{n}") for n in range(3)] == [None] * 3


async def test_an_acking_save_frees_the_slot_of_a_limited_queue(
    backend: PostgresBackend[Any],
) -> None:
    """The message leaves the queue's in-flight count as with an ack: the next claim
    takes the next message; the rate window keeps its start, as with an ack."""
    await backend.queues.configure("one", global_concurrency=1, rate_limit=10, rate_period=600)
    message = await _handed_off(backend, "limited-1", Route("one"))
    await backend.outbox.enqueue_intent(make_intent("limited-2", 1, route=Route("one")))
    assert await backend.consumer.claim(5, 60, queue="one") == []
    lease = await backend.leases.acquire("limited-1", "worker", 30)
    cp = backend.checkpointer
    assert await cp.save_and_release(1, snap("limited-1", 2), lease=lease, ack=message) == 2
    [stats] = [s for s in await backend.queues.list() if s.queue == "one"]
    assert (stats.in_flight, stats.pending, stats.started) == (0, 1, 1)
    [after] = await backend.consumer.claim(5, 60, queue="one")
    assert after.intent.thread_id == "limited-2"


async def test_a_refused_acking_save_keeps_the_message_in_flight(
    backend: PostgresBackend[Any],
) -> None:
    cp = backend.checkpointer
    message = await _handed_off(backend, "kept")
    lease = await backend.leases.acquire("kept", "worker", 30)
    stale = replace(lease, fencing_token=lease.fencing_token - 1)
    with pytest.raises(LeaseLostError):
        await cp.save_and_release(1, snap("kept", 2), lease=stale, ack=message)
    assert await _live_ids(backend) == [int(message.message_id)]
    assert await backend.consumer.claim(5, 60) == []  # still claimed
    assert (await cp.load("kept"))[1] == 1


async def test_an_acking_save_leaves_a_dead_letter_and_lands_for_an_id_of_no_message(
    backend: PostgresBackend[Any],
) -> None:
    """As the consumer's ack does: a dead letter stays, an id that names no row of the
    outbox (or is not spelled as one) deletes nothing, and the save lands each time."""
    cp = backend.checkpointer
    buried = await _handed_off(backend, "buried")
    await backend.consumer.release(buried, error="poison", dead=True)
    lease = await backend.leases.acquire("buried", "worker", 30)
    assert await cp.save_and_release(1, snap("buried", 2), lease=lease, ack=buried) == 2
    [dead] = await backend.consumer.dead_letters()
    assert dead.message_id == buried.message_id
    live = await _handed_off(backend, "live")
    for n, message_id in enumerate(("9" * 18, "0", "-1", " 1", "x", str(2**63))):
        tid = f"no-message-{n}"
        assert await cp.save(0, snap(tid)) == 1
        lease = await backend.leases.acquire(tid, "worker", 30)
        ack = replace(live, message_id=message_id)
        assert await cp.save_and_release(1, snap(tid, 2), lease=lease, ack=ack) == 2
        assert await backend.leases.holder(tid) is None
    assert await _live_ids(backend) == [int(live.message_id)]


async def test_a_bound_acking_save_rolls_back_with_the_application(
    shared: PostgresBackend[Any], pg_pool: asyncpg.Pool
) -> None:
    cp = shared.checkpointer
    message = await _handed_off(shared, "bound-ack")
    lease = await shared.leases.acquire("bound-ack", "worker", 30)
    async with acquired(pg_pool) as conn:
        bound = cp.bind(as_asyncpg(conn))

        async def save_then_fail() -> None:
            async with conn.transaction():
                saved = await bound.save_and_release(
                    1, snap("bound-ack", 2), lease=lease, ack=message
                )
                assert saved == 2
                raise Rollback

        with pytest.raises(Rollback):
            await save_then_fail()
        assert await _live_ids(shared) == [int(message.message_id)]
        assert await shared.leases.holder("bound-ack") == lease
        async with conn.transaction():
            assert await bound.save_and_release(1, snap("bound-ack", 2), lease=lease, ack=message)
    assert await _live_ids(shared) == []
    assert (await cp.load("bound-ack"))[1] == 2
