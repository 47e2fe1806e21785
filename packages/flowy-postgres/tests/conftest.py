"""Fixtures of the flowy-postgres tests: a real PostgreSQL server, a fresh schema per test.

The server is found as ``flowy.testing.backends`` describes: ``FLOWY_POSTGRES_DSN``; else
a server on 127.0.0.1:5432 (user ``postgres``, database ``test`` or ``postgres``); else a
testcontainers PostgreSQL when a Docker engine answers; else the test is skipped (failed
under ``FLOWY_REQUIRE_BACKENDS=1``). Every test gets its own schema, dropped afterwards.

The conformance suite opens ``flowy_url`` with ``flowy.connect``; ``flowy_corrupt`` flips
a byte of a thread's head record (its history entry at the head revision) in place.
"""

from __future__ import annotations

import asyncio
import os
import sys
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

import flowy
from flowy.errors import ThreadNotFoundError
from flowy.storage import Backend
from flowy.testing import Corrupt, Dump
from flowy.testing.backends import backend_missing, docker_available, port_open
from flowy.testing.hooks import SetSchemaVersion
from flowy_postgres import PostgresBackend
from flowy_postgres._schema import TableNames, thread_key

# pytest runs with --import-mode=importlib, which does not put test directories on
# sys.path; the helpers here (pg_support, pg_proxy, pg_race_worker) are imported by name.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from pg_support import Conn, Sql, connect, new_pool, set_up, sql, with_options

LOCAL_DSNS = (
    "postgresql://postgres@127.0.0.1:5432/test",
    "postgresql://postgres@127.0.0.1:5432/postgres",
)


async def _first_reachable(dsns: tuple[str, ...]) -> str | None:
    for dsn in dsns:
        try:
            conn = await connect(dsn)
        except (OSError, asyncpg.PostgresError):
            continue
        await conn.close()
        return dsn
    return None


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """The DSN of a PostgreSQL server for the whole session."""
    explicit = os.environ.get("FLOWY_POSTGRES_DSN")
    if explicit:
        yield explicit
        return
    if port_open("127.0.0.1", 5432):
        dsn = asyncio.run(_first_reachable(LOCAL_DSNS))
        if dsn is not None:
            yield dsn
            return
    if docker_available():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:16-alpine", driver=None) as container:
            yield container.get_connection_url()
        return
    backend_missing(
        "no PostgreSQL server: set FLOWY_POSTGRES_DSN, run one on 127.0.0.1:5432, or "
        "start a Docker engine for testcontainers"
    )


@pytest.fixture
async def pg_schema(postgres_dsn: str) -> AsyncIterator[str]:
    """A schema name no other test uses; the schema is dropped after the test."""
    schema = f"flowy_test_{uuid.uuid4().hex[:12]}"
    yield schema
    conn = await connect(postgres_dsn)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


@pytest.fixture
def flowy_url(postgres_dsn: str, pg_schema: str) -> str:
    """The conformance suite's store: PostgreSQL in a schema of its own."""
    return with_options(postgres_dsn, schema=pg_schema, max_attempts=3)


async def corrupt_head(backend: Backend[Any], thread_id: str) -> None:
    """Flip one byte in the middle of the thread's head record, in place."""
    assert isinstance(backend, PostgresBackend) and backend.pool is not None
    names = backend.names
    flip = "set_byte(record, length(record) / 2, get_byte(record, length(record) / 2) # 255)"
    done = await sql(backend.pool).fetchval(
        f"UPDATE {names.history} AS h SET record = {flip} FROM {names.threads} AS t "
        "WHERE t.thread_key = $1 AND t.thread_id = $2 AND h.thread_key = t.thread_key "
        "AND h.revision = t.revision RETURNING h.revision",
        thread_key(thread_id),
        thread_id,
    )
    if done is None:
        raise ThreadNotFoundError(f"no checkpoint for thread {thread_id!r}")


@pytest.fixture
def flowy_corrupt() -> Corrupt:
    """Flips a byte of a thread's head record in PostgreSQL."""
    return corrupt_head


@pytest.fixture
async def pg_pool(postgres_dsn: str, pg_schema: str) -> AsyncIterator[asyncpg.Pool]:
    """A plain asyncpg pool (asyncpg's defaults, as an application would make it) whose
    schema ``pg_schema`` is migrated."""
    pool = await new_pool(postgres_dsn, min_size=1, max_size=10)
    try:
        await set_up(pool, schema=pg_schema)
        yield pool
    finally:
        await pool.close()


@pytest.fixture
def db(pg_pool: asyncpg.Pool) -> Sql:
    """``pg_pool`` for the test's own queries."""
    return sql(pg_pool)


@pytest.fixture
def names(pg_schema: str) -> TableNames:
    """The quoted table names of ``pg_schema``."""
    return TableNames(pg_schema)


@pytest.fixture
async def admin(postgres_dsn: str) -> AsyncIterator[Conn]:
    """A separate connection for inspecting and disturbing the server."""
    conn = await connect(postgres_dsn)
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture
async def backend(flowy_url: str) -> AsyncIterator[PostgresBackend[Any]]:
    """A backend of its own pool in ``pg_schema`` (what ``flowy.connect`` opens)."""
    async with flowy.connect(flowy_url) as made:
        assert isinstance(made, PostgresBackend)
        yield made


@pytest.fixture
async def shared(pg_pool: asyncpg.Pool, pg_schema: str) -> AsyncIterator[PostgresBackend[Any]]:
    """A backend over the application's ``pg_pool`` (``from_pool``)."""
    async with PostgresBackend[Any].from_pool(pg_pool, schema=pg_schema, max_attempts=3) as made:
        yield made


async def dump_store(url: str) -> object:
    """Every row of the flowy tables of the URL's schema and prefix, as stored (none
    when the schema does not exist)."""
    parts = urllib.parse.urlsplit(url)
    options = dict(urllib.parse.parse_qsl(parts.query))
    schema, prefix = options.get("schema", "public"), options.get("prefix", "flowy_")
    conn = await connect(urllib.parse.urlunsplit(parts._replace(query="")))
    try:
        like = prefix.replace("\\", "\\\\").replace("_", "\\_").replace("%", "\\%") + "%"
        tables = await conn.fetch(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = $1 "
            "AND table_name LIKE $2 ORDER BY table_name",
            schema,
            like,
        )
        dumped: dict[str, list[str]] = {}
        for row in tables:
            name: str = row["table_name"]
            rows = await conn.fetch(f'SELECT * FROM "{schema}"."{name}"')
            dumped[name] = sorted(repr(tuple(r.values())) for r in rows)
        return dumped
    finally:
        await conn.close()


@pytest.fixture
def flowy_dump() -> Dump:
    """Everything a PostgreSQL store holds in its schema, as stored."""
    return dump_store


async def record_schema_version(url: str, version: int) -> None:
    """Record ``version`` as the only schema version of the URL's schema and prefix."""
    parts = urllib.parse.urlsplit(url)
    options = dict(urllib.parse.parse_qsl(parts.query))
    names = TableNames(options.get("schema", "public"), options.get("prefix", "flowy_"))
    conn = await connect(urllib.parse.urlunsplit(parts._replace(query="")))
    try:
        await conn.execute(f"DELETE FROM {names.version}")
        await conn.execute(f"INSERT INTO {names.version} VALUES ($1)", version)
    finally:
        await conn.close()


@pytest.fixture
def flowy_schema_version() -> SetSchemaVersion:
    """Records a schema version in a PostgreSQL schema."""
    return record_schema_version
