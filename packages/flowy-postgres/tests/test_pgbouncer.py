"""The conformance suite and the hazard tests a second time, through a real PgBouncer in
transaction pooling mode (``pooler_mode=true``): every transaction may run on another
server session, and PgBouncer itself may lose a server connection mid-statement.

PgBouncer comes from ``FLOWY_PGBOUNCER_DSN``, else 127.0.0.1:6432 (``scripts/
ensure-services.sh`` installs and starts one in front of the local PostgreSQL); without
one these tests skip (fail under ``FLOWY_REQUIRE_BACKENDS=1``). The inspecting and
disturbing connections (``admin``, the row locker) go to PostgreSQL directly.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from pg_proxy import PgProxy
from pg_support import Conn, intent, opened, snap, with_options

from flowy.errors import StorageUnavailableError
from flowy.storage.dialect import confirmed_save
from flowy.testing.backends import backend_missing, port_open
from flowy.testing.suite import *  # noqa: F403  # pyright: ignore[reportWildcardImportFromLibrary]

pytestmark = pytest.mark.anyio


def _hazards() -> Any:
    """This folder's ``test_hazards`` module (loaded by path: other packages' test
    folders have modules of that name too)."""
    path = Path(__file__).with_name("test_hazards.py")
    spec = importlib.util.spec_from_file_location("flowy_postgres_test_hazards", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_HAZARDS = _hazards()
history = _HAZARDS.history
# The hazards whose stores come from ``flowy_url``/``backend`` run here through PgBouncer
# (this module's ``flowy_url``): a server connection killed while a save waits on a row
# lock, then the same under confirmed_save, and two processes racing on one thread.
test_connection_killed_mid_save_writes_nothing = (
    _HAZARDS.test_connection_killed_mid_save_writes_nothing
)
test_durable_save_recovers_a_save_killed_mid_statement = (
    _HAZARDS.test_durable_save_recovers_a_save_killed_mid_statement
)
test_two_processes_race_into_one_history_chain = (
    _HAZARDS.test_two_processes_race_into_one_history_chain
)


@pytest.fixture(scope="session")
def pgbouncer_dsn() -> str:
    """A DSN that reaches PostgreSQL through PgBouncer in transaction pooling mode."""
    explicit = os.environ.get("FLOWY_PGBOUNCER_DSN")
    if explicit:
        return explicit
    if not port_open("127.0.0.1", 6432):
        backend_missing(
            "no PgBouncer on 127.0.0.1:6432: run scripts/ensure-services.sh or set "
            "FLOWY_PGBOUNCER_DSN"
        )
    return "postgresql://postgres@127.0.0.1:6432/test"


@pytest.fixture
def flowy_url(pgbouncer_dsn: str, pg_schema: str) -> str:
    """The suite's store, through PgBouncer (the schema is dropped directly afterwards)."""
    return with_options(pgbouncer_dsn, schema=pg_schema, max_attempts=3, pooler_mode="true")


async def test_the_pool_really_goes_through_pgbouncer(pgbouncer_dsn: str, pg_schema: str) -> None:
    """The check means something: the store's connections are PgBouncer's clients, in a
    transaction-mode pool, and their statements run on PostgreSQL's port."""
    tag = f"flowy-pgb-{uuid.uuid4().hex[:8]}"
    url = with_options(pgbouncer_dsn, application_name=tag)
    async with opened(url, schema=pg_schema, pooler_mode="true", pool_size=2) as backend:
        await backend.checkpointer.save(0, snap("through"))
        pool: Any = backend.pool
        assert await pool.fetchval("SELECT inet_server_port()") == 5432
        clients = _console(pgbouncer_dsn, "SHOW CLIENTS")
        assert any(row.get("application_name") == tag for row in clients), clients
    pools = _console(pgbouncer_dsn, "SHOW POOLS")
    assert any(row["database"] == "test" and row["pool_mode"] == "transaction" for row in pools)


def _console(pgbouncer_dsn: str, command: str) -> list[dict[str, str]]:
    """Rows of a command on PgBouncer's console (database ``pgbouncer``), through psql:
    the console speaks only the simple query protocol, which asyncpg does not offer."""
    base = pgbouncer_dsn.split("?", 1)[0].rsplit("/", 1)[0]
    out = subprocess.run(
        ["psql", f"{base}/pgbouncer", "--no-psqlrc", "-A", "-F", "\t", "-c", command],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.splitlines()
    header = out[0].split("\t")
    return [dict(zip(header, line.split("\t"), strict=False)) for line in out[1:-1]]


async def test_every_operation_through_pgbouncer(pgbouncer_dsn: str, pg_schema: str) -> None:
    async with opened(pgbouncer_dsn, schema=pg_schema, pooler_mode="true", pool_size=2) as backend:
        cp, leases, consumer = backend.checkpointer, backend.leases, backend.consumer
        lease = await leases.acquire("pooled", "worker", 30)
        assert await cp.save(0, snap("pooled"), lease=lease) == 1

        async def enqueue(tx: object, revision: int) -> None:
            await backend.outbox.enqueue_intent_tx(tx, intent("pooled", revision))

        assert await cp.save_with_outbox(1, snap("pooled", 2), enqueue, lease=lease) == 2
        lease = await leases.renew(lease, 30)
        assert (await leases.holder("pooled")) is not None
        await leases.release(lease)
        assert (await cp.load("pooled"))[1] == 2
        assert await history(cp, "pooled") == [2, 1]
        [message] = await consumer.claim(10, 30, wait=1.0)
        await consumer.release(message, error="again")
        [message] = await consumer.claim(10, 30)
        await consumer.ack(message)
        assert await consumer.dead_letters() == []
        assert not consumer.listening
        await cp.delete_if_idle("pooled")


async def test_server_connection_killed_while_idle(
    pgbouncer_dsn: str, pg_schema: str, admin: Conn
) -> None:
    """PgBouncer's server connection dies between saves: PgBouncer drops it, and the
    next save runs on another one."""
    tag = f"flowy-pgb-{uuid.uuid4().hex[:8]}"
    url = with_options(pgbouncer_dsn, application_name=tag)
    async with opened(url, schema=pg_schema, pooler_mode="true", pool_size=1) as backend:
        cp = backend.checkpointer
        assert await cp.save(0, snap("idle")) == 1
        killed = await admin.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = $1",
            tag,
        )
        assert killed >= 1
        await asyncio.sleep(0.1)
        # The first use after the kill may hit the dead connection: confirmed_save
        # resolves an unknown outcome; then plain saves go through.
        assert await confirmed_save(cp, 1, snap("idle", 2)) == 2
        assert await cp.save(2, snap("idle", 3)) == 3
        assert await history(cp, "idle") == [3, 2, 1]


async def test_reply_lost_after_commit_through_pgbouncer(
    pgbouncer_dsn: str, pg_schema: str, backend: Any
) -> None:
    """The save commits, then the connection between the client and PgBouncer dies
    before the reply: ``confirmed_save`` finds its own write instead of writing again."""
    async with (
        PgProxy(pgbouncer_dsn) as proxy,
        opened(proxy.dsn, schema=pg_schema, pooler_mode="true", pool_size=1) as through,
    ):
        cp = through.checkpointer
        assert await cp.save(0, snap("lost")) == 1
        await asyncio.sleep(0.05)
        landed = snap("lost", 2)
        proxy.cut_next_reply(after_command=True)
        with pytest.raises(StorageUnavailableError):
            await cp.save(1, landed)
        head, revision = await backend.checkpointer.load("lost")
        assert (revision, head.write_id) == (2, landed.write_id)
        again = snap("lost", 3)
        await asyncio.sleep(0.05)
        proxy.cut_next_reply(after_command=True)
        assert await confirmed_save(cp, 2, again) == 3
        assert proxy.cuts == 2
        assert await history(backend.checkpointer, "lost") == [3, 2, 1]
