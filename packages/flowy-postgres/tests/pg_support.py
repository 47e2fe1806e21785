"""Typed views of asyncpg for the tests (asyncpg ships no type information), and small
builders shared by the test modules."""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Protocol, cast

import asyncpg

import flowy
from flowy.storage import HandoffIntent, HandoffStatus, ResumeToken, Snapshot
from flowy.storage.dialect import new_write_id
from flowy_postgres import PostgresBackend
from flowy_postgres._schema import TableNames, connector_for, prepare

FIXED_TIME = 1_700_000_000.25


class Sql(Protocol):
    """The query methods of an asyncpg pool or connection."""

    async def fetchval(self, query: str, *args: object) -> Any: ...

    async def fetch(self, query: str, *args: object) -> list[Any]: ...

    async def fetchrow(self, query: str, *args: object) -> Any: ...

    async def execute(self, query: str, *args: object) -> str: ...


class Conn(Sql, Protocol):
    """An asyncpg connection."""

    def transaction(self) -> AbstractAsyncContextManager[object]: ...

    async def close(self) -> None: ...


def sql(target: asyncpg.Pool | asyncpg.Connection | Conn | None) -> Sql:
    """``target`` seen through :class:`Sql`."""
    assert target is not None
    return cast(Sql, target)


def with_options(dsn: str, **options: object) -> str:
    """``dsn`` with flowy's URL options added to its query."""
    query = urllib.parse.urlencode({k: str(v) for k, v in options.items()})
    return dsn + ("&" if "?" in dsn else "?") + query


@asynccontextmanager
async def opened(url: str, **options: object) -> AsyncGenerator[PostgresBackend[Any]]:
    """``flowy.connect(url)`` (with ``options`` added to the URL), typed."""
    async with flowy.connect(with_options(url, **options) if options else url) as backend:
        assert isinstance(backend, PostgresBackend)
        yield backend


async def connect(dsn: str) -> Conn:
    """A new connection outside any pool."""
    driver: Any = asyncpg
    return cast(Conn, await driver.connect(dsn))


async def new_pool(dsn: str, **options: Any) -> asyncpg.Pool:
    """A plain asyncpg pool (asyncpg's defaults unless ``options`` say otherwise)."""
    driver: Any = asyncpg
    return cast(asyncpg.Pool, await driver.create_pool(dsn, **options))


@asynccontextmanager
async def acquired(pool: asyncpg.Pool | None) -> AsyncGenerator[Conn]:
    """A connection of ``pool`` for the block."""
    raw: Any = pool
    async with raw.acquire() as conn:
        yield cast(Conn, conn)


def as_asyncpg(conn: Conn) -> asyncpg.Connection:
    """The connection as what ``PostgresCheckpointer.bind`` accepts."""
    return cast(asyncpg.Connection, conn)


def snap(thread_id: str, n: int = 0) -> Snapshot[Any]:
    """A snapshot with a fresh write id."""
    return Snapshot(
        thread_id=thread_id, state={"n": n}, execution_pointer=f"step-{n}", write_id=new_write_id()
    )


def intent(thread_id: str, revision: int = 1) -> HandoffIntent:
    """A hand-off intent with every field set (fixed creation time)."""
    return HandoffIntent(
        thread_id=thread_id,
        pending_snapshot_revision=revision,
        committed_snapshot_revision=revision,
        snapshot_revision=revision,
        resume_token=ResumeToken(thread_id, revision),
        handoff_status=HandoffStatus.ENQUEUED,
        reason="handoff",
        execution_pointer="worker",
        created_at=FIXED_TIME,
    )


async def wait_until(predicate: Callable[[], Awaitable[bool]], within: float = 10.0) -> None:
    """Poll ``predicate`` until it holds; fail the test after ``within`` seconds."""
    deadline = time.monotonic() + within
    while not await predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


def schema_v1(schema: str, prefix: str = "flowy_") -> list[str]:
    """The DDL flowy-postgres 0.1 created (schema version 1), to test upgrades."""
    q = f'"{schema}"."{prefix}'
    return [
        f'CREATE SCHEMA IF NOT EXISTS "{schema}"',
        f'CREATE TABLE {q}schema_version" (version integer PRIMARY KEY, '
        "applied_at timestamptz NOT NULL DEFAULT now())",
        f'CREATE TABLE {q}threads" (thread_key bytea PRIMARY KEY, thread_id text NOT NULL, '
        "revision bigint NOT NULL CHECK (revision > 0), pointer text NOT NULL, "
        "status text NOT NULL, reason text NOT NULL, handoff_status text NOT NULL, "
        "handoff_pending_at double precision, updated_at double precision NOT NULL, "
        "saved_at timestamptz NOT NULL, record bytea NOT NULL) WITH (fillfactor = 80)",
        f'CREATE INDEX "{prefix}threads_handoff_idx" ON {q}threads" (handoff_status) '
        "WHERE handoff_status <> 'none'",
        f'CREATE TABLE {q}history" (thread_key bytea NOT NULL, revision bigint NOT NULL, '
        "record bytea NOT NULL, PRIMARY KEY (thread_key, revision))",
        f'CREATE TABLE {q}leases" (thread_key bytea PRIMARY KEY, thread_id text NOT NULL, '
        "owner text, token bigint NOT NULL, expires_at timestamptz)",
        f'CREATE TABLE {q}outbox" (id bigserial PRIMARY KEY, thread_key bytea NOT NULL, '
        "thread_id text NOT NULL, committed_revision bigint NOT NULL, payload bytea NOT NULL, "
        "attempts integer NOT NULL DEFAULT 0, "
        "visible_at timestamptz NOT NULL DEFAULT clock_timestamp(), claimed_by text, "
        "dead boolean NOT NULL DEFAULT false, last_error text, "
        "created_at timestamptz NOT NULL DEFAULT clock_timestamp(), "
        "UNIQUE (thread_key, committed_revision))",
        f'CREATE INDEX "{prefix}outbox_ready_idx" ON {q}outbox" (visible_at, id) WHERE NOT dead',
        f'CREATE INDEX "{prefix}outbox_dead_idx" ON {q}outbox" (id) WHERE dead',
        f'INSERT INTO {q}schema_version" (version) VALUES (1)',
    ]


def schema_v2(schema: str, prefix: str = "flowy_") -> list[str]:
    """The DDL flowy-postgres 0.2.0 created (schema version 2), to test upgrades."""
    q = f'"{schema}"."{prefix}'
    return [
        f'CREATE SCHEMA IF NOT EXISTS "{schema}"',
        f'CREATE TABLE {q}schema_version" (version integer PRIMARY KEY, '
        "applied_at timestamptz NOT NULL DEFAULT now())",
        f'CREATE TABLE {q}threads" (thread_key bytea PRIMARY KEY, thread_id text NOT NULL, '
        "revision bigint NOT NULL CHECK (revision > 0), pointer text NOT NULL, "
        "status text NOT NULL, reason text NOT NULL, handoff_status text NOT NULL, "
        "handoff_pending_at double precision, updated_at double precision NOT NULL, "
        "saved_at timestamptz NOT NULL) WITH (fillfactor = 80)",
        f'CREATE INDEX "{prefix}threads_id_idx" ON {q}threads" '
        '((substr(thread_id, 1, 200) COLLATE "C"))',
        f'CREATE INDEX "{prefix}threads_handoff_idx" ON {q}threads" (handoff_status) '
        "WHERE handoff_status <> 'none'",
        f'CREATE TABLE {q}history" (thread_key bytea NOT NULL, revision bigint NOT NULL, '
        "record bytea NOT NULL, PRIMARY KEY (thread_key, revision))",
        f'CREATE TABLE {q}leases" (thread_key bytea PRIMARY KEY, thread_id text NOT NULL, '
        "owner text, token bigint NOT NULL, expires_at timestamptz)",
        f'CREATE TABLE {q}outbox" (id bigserial PRIMARY KEY, thread_key bytea NOT NULL, '
        "thread_id text NOT NULL, committed_revision bigint NOT NULL, payload bytea NOT NULL, "
        "attempts integer NOT NULL DEFAULT 0, "
        "visible_at timestamptz NOT NULL DEFAULT clock_timestamp(), "
        "dead boolean NOT NULL DEFAULT false, last_error text NOT NULL DEFAULT '', "
        "created_at timestamptz NOT NULL DEFAULT clock_timestamp(), "
        "UNIQUE (thread_key, committed_revision))",
        f'CREATE INDEX "{prefix}outbox_ready_idx" ON {q}outbox" (visible_at, id) WHERE NOT dead',
        f'CREATE INDEX "{prefix}outbox_dead_idx" ON {q}outbox" (id) WHERE dead',
        f'INSERT INTO {q}schema_version" (version) VALUES (2)',
    ]


async def set_up(target: object, *, schema: str, prefix: str = "flowy_") -> int:
    """Create or upgrade the tables of ``schema`` through a pool or a connection (what
    ``backend.setup()`` runs), for tests that have no backend."""
    return await prepare(connector_for(target, TableNames(schema, prefix)), upgrade=True)
