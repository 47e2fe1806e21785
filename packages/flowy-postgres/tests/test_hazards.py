"""What production PostgreSQL does to applications, each against the real server: a
transaction-mode pooler, connections killed while idle and mid-save, a reply lost after
the commit, an exhausted pool, and two worker processes racing on one thread."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest
from pg_proxy import PgProxy
from pg_support import Conn, acquired, connect, intent, opened, set_up, snap, sql, wait_until

from flowy.errors import StorageUnavailableError
from flowy.storage import ActivityRecord, ActivityStatus, Checkpointer, Signal
from flowy.storage.dialect import confirmed_save
from flowy_postgres import SCHEMA_VERSION, PostgresBackend, create_pool
from flowy_postgres._schema import TableNames, thread_key

pytestmark = pytest.mark.anyio


async def history(cp: Checkpointer[Any], thread_id: str) -> list[int]:
    return [s.revision for s in await cp.get_history(thread_id, 1000)]


# -- 1. a transaction-mode pooler -------------------------------------------------------


async def test_pooler_mode_keeps_no_session_state(postgres_dsn: str, pg_schema: str) -> None:
    """With ``pooler_mode=true`` every operation works while the session keeps no named
    (server-side, session-scoped) prepared statement, and the consumer polls instead of
    LISTENing: a transaction pooler may give each transaction another server session."""
    async with opened(postgres_dsn, schema=pg_schema, pooler_mode="true", pool_size=1) as backend:
        assert await backend.setup() == SCHEMA_VERSION
        cp, leases, consumer = backend.checkpointer, backend.leases, backend.consumer
        lease = await leases.acquire("pooled", "worker", 30)
        assert await cp.save(0, snap("pooled"), lease=lease) == 1

        async def enqueue(tx: object, revision: int) -> None:
            await backend.outbox.enqueue_intent_tx(tx, intent("pooled", revision))

        assert await cp.save_with_outbox(1, snap("pooled", 2), enqueue, lease=lease) == 2
        lease = await leases.renew(lease, 30)
        assert await leases.holder("pooled") is not None
        await leases.release(lease)
        assert (await cp.load("pooled"))[1] == 2
        assert await history(cp, "pooled") == [2, 1]
        assert len(await cp.list_threads(after="a")) == 1
        await cp.prune("pooled", 1)
        assert await cp.save(2, replace(snap("pooled", 3), wake_at=5.0)) == 3
        assert [t.thread_id for t in await cp.timers(before=5.0)] == ["pooled"]
        signal = await cp.append_signal(Signal("pooled", "go", 1, "s-1"))
        assert (await cp.append_signal(Signal("pooled", "go", 2, "s-1"))).seq == signal.seq == 1
        assert await cp.signals("pooled") == [signal]
        await cp.put_activity("pooled", ActivityRecord("k", ActivityStatus.STARTED))
        assert await cp.get_activity("pooled", "k") == ActivityRecord("k", ActivityStatus.STARTED)
        assert len(await cp.journal("pooled")) == 1
        [message] = await consumer.claim(10, 30, wait=1.0)
        await consumer.release(message, error="again")
        [message] = await consumer.claim(10, 30)
        await consumer.ack(message)
        assert await consumer.dead_letters() == []
        assert not consumer.listening
        await cp.delete_if_idle("pooled")
        # One connection (pool_size=1) ran all of that.
        assert await sql(backend.pool).fetchval("SELECT count(*) FROM pg_prepared_statements") == 0
    # The check means something: a default pool does keep named prepared statements.
    async with opened(postgres_dsn, schema=pg_schema, pool_size=1) as backend:
        await backend.checkpointer.list_threads()
        assert await sql(backend.pool).fetchval("SELECT count(*) FROM pg_prepared_statements") > 0


# -- 2. an idle connection killed between saves ------------------------------------------


async def test_idle_connection_killed_between_saves(
    postgres_dsn: str, pg_schema: str, admin: Conn
) -> None:
    async with opened(postgres_dsn, schema=pg_schema, pool_size=1, listen="false") as backend:
        cp, pool = backend.checkpointer, backend.pool
        assert await cp.save(0, snap("idle")) == 1
        pid = await sql(pool).fetchval("SELECT pg_backend_pid()")
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)

        async def gone() -> bool:
            count = await admin.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid
            )
            return count == 0

        await wait_until(gone)
        await asyncio.sleep(0.05)  # time for the client to see the socket close
        # The next save simply succeeds, on a fresh connection.
        assert await cp.save(1, snap("idle", 2)) == 2
        assert await sql(pool).fetchval("SELECT pg_backend_pid()") != pid
        # Killed just before a read, with no time to notice: the read is repeated once.
        pid = await sql(pool).fetchval("SELECT pg_backend_pid()")
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
        await wait_until(gone)
        assert (await cp.load("idle"))[1] == 2
        # Killed just before a save: the save reports an unknown outcome, and confirmed_save
        # resolves it (here: not landed, so it saves once).
        pid = await sql(pool).fetchval("SELECT pg_backend_pid()")
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
        assert await confirmed_save(cp, 2, snap("idle", 3)) == 3
        assert await history(cp, "idle") == [3, 2, 1]


# -- 3. a connection killed mid-save, and a reply lost after the commit ---------------------


async def _lock_head(conn: Conn, schema: str, thread_id: str) -> None:
    await conn.execute(
        f"SELECT 1 FROM {TableNames(schema).threads} WHERE thread_key = $1 FOR UPDATE",
        thread_key(thread_id),
    )


async def _blocked_saver(admin: Conn, schema: str) -> int:
    """The pid of the backend whose save of ``schema`` waits for a row lock."""
    found: list[int] = []

    async def blocked() -> bool:
        pid = await admin.fetchval(
            "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND strpos(query, $1) > 0 AND pid <> pg_backend_pid()",
            schema,
        )
        if pid is not None:
            found.append(pid)
        return pid is not None

    await wait_until(blocked)
    return found[0]


async def test_connection_killed_mid_save_writes_nothing(
    postgres_dsn: str, backend: PostgresBackend[Any], pg_schema: str, admin: Conn
) -> None:
    cp = backend.checkpointer
    assert await cp.save(0, snap("mid")) == 1
    before = await cp.load("mid")
    locker = await connect(postgres_dsn)
    try:
        async with locker.transaction():
            await _lock_head(locker, pg_schema, "mid")
            saving = asyncio.create_task(cp.save(1, snap("mid", 2)))
            pid = await _blocked_saver(admin, pg_schema)
            assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
            with pytest.raises(StorageUnavailableError, match="connection"):
                await saving
    finally:
        await locker.close()
    # Nothing of the killed statement is stored: head and history are as before.
    assert await cp.load("mid") == before
    assert await history(cp, "mid") == [1]
    assert await cp.save(1, snap("mid", 2)) == 2


async def test_durable_save_recovers_a_save_killed_mid_statement(
    postgres_dsn: str, backend: PostgresBackend[Any], pg_schema: str, admin: Conn
) -> None:
    cp = backend.checkpointer
    assert await cp.save(0, snap("mid-durable")) == 1
    wanted = snap("mid-durable", 2)
    locker = await connect(postgres_dsn)
    try:
        async with locker.transaction():
            await _lock_head(locker, pg_schema, "mid-durable")
            saving = asyncio.create_task(confirmed_save(cp, 1, wanted))
            pid = await _blocked_saver(admin, pg_schema)
            assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
            await asyncio.sleep(0.2)  # confirmed_save reloads and retries (blocked again)
        # The lock is gone: the retry goes through, exactly once.
        assert await saving == 2
    finally:
        await locker.close()
    head, revision = await cp.load("mid-durable")
    assert (revision, head.write_id) == (2, wanted.write_id)
    assert await history(cp, "mid-durable") == [2, 1]


async def test_reply_lost_after_commit_is_resolved_by_durable_save(
    postgres_dsn: str, pg_schema: str, backend: PostgresBackend[Any]
) -> None:
    """The statement commits, then the connection dies before the reply arrives: the
    client cannot know. ``save`` reports ``StorageUnavailableError`` (never a conflict)
    and ``confirmed_save`` finds its own write by its write id instead of writing again."""
    reference = backend.checkpointer
    async with (
        PgProxy(postgres_dsn) as proxy,
        opened(proxy.dsn, schema=pg_schema, pool_size=1, listen="false") as through,
    ):
        cp = through.checkpointer
        # Two saves first: the update statement is then prepared on the connection, so
        # the next reply is the one of the statement's execution.
        assert await cp.save(0, snap("lost")) == 1
        assert await cp.save(1, snap("lost", 2)) == 2
        await asyncio.sleep(0.05)  # the connection is back in the pool
        landed = snap("lost", 3)
        proxy.cut_next_reply()
        with pytest.raises(StorageUnavailableError):
            await cp.save(2, landed)
        assert proxy.cuts == 1
        head, revision = await reference.load("lost")
        assert (revision, head.write_id) == (3, landed.write_id)  # it did land
        # Same again under confirmed_save: it returns the revision its write landed at.
        again = snap("lost", 4)
        await asyncio.sleep(0.05)
        proxy.cut_next_reply()
        assert await confirmed_save(cp, 3, again) == 4
        assert proxy.cuts == 2
        head, revision = await cp.load("lost")
        assert (revision, head.write_id) == (4, again.write_id)
        assert await history(cp, "lost") == [4, 3, 2, 1]


# -- 4. an exhausted pool ----------------------------------------------------------------


async def test_exhausted_pool_is_a_clear_timeout(postgres_dsn: str, pg_schema: str) -> None:
    options = {"pool_size": 1, "acquire_timeout": 0.3, "listen": "false"}
    async with opened(postgres_dsn, schema=pg_schema, **options) as backend:
        cp = backend.checkpointer
        async with acquired(backend.pool):  # the only connection is busy elsewhere
            started = time.monotonic()
            with pytest.raises(StorageUnavailableError, match=r"at most 1 connections") as info:
                await cp.save(0, snap("starved"))
            assert time.monotonic() - started < 2.0
            assert "0.3s" in str(info.value)
            assert "acquire_timeout" in str(info.value)
        # Free again: everything works, nothing was written by the refused save.
        assert await cp.list_threads() == []
        assert await cp.save(0, snap("starved")) == 1


async def test_kept_connections_go_to_waiting_operations(postgres_dsn: str, pg_schema: str) -> None:
    """A backend that owns its pool keeps half of it in hand between operations (here
    one of two): a burst of saves larger than the pool all finish, none waits for the
    acquire timeout, the other half stays free for the application, and closing gives
    every connection back (the pool's close waits for them)."""
    options = {"pool_size": 2, "acquire_timeout": 5, "listen": "false"}
    async with opened(postgres_dsn, schema=pg_schema, **options) as backend:
        cp = backend.checkpointer
        assert await cp.save(0, snap("kept-0")) == 1
        kept = backend.connector._idle  # pyright: ignore[reportPrivateUsage]
        assert len(kept) == 1
        started = time.monotonic()
        saved = await asyncio.gather(*(cp.save(0, snap(f"burst-{i}")) for i in range(40)))
        assert saved == [1] * 40 and time.monotonic() - started < 4.0
        assert len(kept) == 1
        async with asyncio.timeout(5), acquired(backend.pool) as conn:  # the half not kept
            assert await sql(conn).fetchval("SELECT 1") == 1
    assert backend.pool is None
    assert await asyncio.wait_for(_pool_closed_cleanly(postgres_dsn, pg_schema), 10)


async def _pool_closed_cleanly(postgres_dsn: str, pg_schema: str) -> bool:
    async with opened(postgres_dsn, schema=pg_schema, pool_size=4, listen="false") as backend:
        await asyncio.gather(*(backend.checkpointer.save(0, snap(f"c-{i}")) for i in range(8)))
        # At most half the pool is kept; how many the burst needed depends on the timing.
        assert 1 <= len(backend.connector._idle) <= 2  # pyright: ignore[reportPrivateUsage]
    return True


async def test_the_applications_pool_gets_every_connection_back(
    postgres_dsn: str, pg_schema: str
) -> None:
    """Over the application's pool (``from_pool``) nothing is kept: right after a save,
    the only connection of a one-connection pool is the application's again."""
    pool = await create_pool(postgres_dsn, min_size=1, max_size=1)
    try:
        await set_up(pool, schema=pg_schema)
        async with PostgresBackend[Any].from_pool(pool, schema=pg_schema, listen=False) as backend:
            assert await backend.checkpointer.save(0, snap("app-pool")) == 1
            async with asyncio.timeout(5), acquired(pool) as conn:
                assert await sql(conn).fetchval("SELECT 1") == 1
    finally:
        await pool.close()


def server_pid(conn: object) -> int:
    """The server process of an asyncpg connection (asyncpg ships no types)."""
    return int(cast(Any, conn).get_server_pid())


async def test_a_kept_connection_killed_while_idle_is_replaced(
    postgres_dsn: str, pg_schema: str, admin: Conn
) -> None:
    async with opened(postgres_dsn, schema=pg_schema, pool_size=2, listen="false") as backend:
        cp = backend.checkpointer
        assert await cp.save(0, snap("kept")) == 1
        [conn] = backend.connector._idle  # pyright: ignore[reportPrivateUsage]
        pid = server_pid(conn)
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)

        async def gone() -> bool:
            query = "SELECT count(*) FROM pg_stat_activity WHERE pid = $1"
            return await admin.fetchval(query, pid) == 0

        await wait_until(gone)
        await asyncio.sleep(0.05)  # time for the client to see the socket close
        assert await cp.save(1, snap("kept", 2)) == 2  # on a fresh connection
        [fresh] = backend.connector._idle  # pyright: ignore[reportPrivateUsage]
        assert server_pid(fresh) != pid


# -- 5. two worker processes racing on one thread -----------------------------------------


async def test_two_processes_race_into_one_history_chain(
    flowy_url: str, backend: PostgresBackend[Any]
) -> None:
    saves = 60
    worker = Path(__file__).with_name("pg_race_worker.py")
    url = flowy_url + "&pool_size=2&listen=false"
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            str(worker),
            url,
            "raced",
            name,
            str(saves),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        for name in ("left", "right")
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            ready = await asyncio.wait_for(proc.stdout.readline(), 30)
            assert ready.strip() == b"ready"
        for proc in procs:  # both start together
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
            await proc.stdin.drain()
        outputs = [await asyncio.wait_for(p.communicate(), 120) for p in procs]
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert [p.returncode for p in procs] == [0, 0]
    conflicts = sum(int(out.split()[-1]) for out, _ in outputs)
    cp = backend.checkpointer
    chain = await cp.get_history("raced", 10 * saves)
    # One chain: revisions 2 * saves .. 1, each once, no gap and no fork.
    assert [s.revision for s in chain] == list(range(2 * saves, 0, -1))
    writers = [s.state["writer"] for s in chain]
    assert writers.count("left") == writers.count("right") == saves
    assert (await cp.load("raced"))[1] == 2 * saves
    assert conflicts > 0, "the two processes never raced; the test proved nothing"


async def test_pool_reconnect_warnings_are_one_line(
    postgres_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """asyncpg logs each failed reconnect of its pool's connection floor (the server
    restarting) as a warning with a traceback: a pool of flowy's keeps the warning to one
    line naming the error, and the traceback goes to debug on ``flowy_postgres``."""
    pool = await create_pool(postgres_dsn, min_size=1, max_size=1)
    try:
        caplog.set_level(logging.DEBUG)
        try:
            raise ConnectionResetError(104, "Connection reset by peer")
        except ConnectionResetError:
            logging.getLogger("asyncpg.pool").warning(
                "Failed to restore the pool connection floor; retrying", exc_info=True
            )
    finally:
        await pool.close()
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.exc_info is None and "\n" not in warning.getMessage()
    assert warning.getMessage() == (
        "Failed to restore the pool connection floor; retrying "
        "(ConnectionResetError: [Errno 104] Connection reset by peer)"
    )
    (debug,) = [r for r in caplog.records if r.name == "flowy_postgres" and r.exc_info]
    assert debug.levelno == logging.DEBUG
