"""Fixtures of the flowy-postgres tests: a real PostgreSQL server, a fresh schema per test.

The server is found as ``flowy.testing.backends`` describes: ``FLOWY_POSTGRES_DSN``; else
a server on 127.0.0.1:5432 (user ``postgres``, database ``test`` or ``postgres``); else a
testcontainers PostgreSQL when a Docker engine answers; else the test is skipped (failed
under ``FLOWY_REQUIRE_BACKENDS=1``). Every test gets its own schema, dropped afterwards.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from flowy.testing import BackendBundle
from flowy.testing.backends import backend_missing, docker_available, port_open
from flowy_postgres import PostgresBackend, migrate
from flowy_postgres._schema import TableNames, thread_key

# pytest runs with --import-mode=importlib, which does not put test directories on
# sys.path; the helpers here (pg_support, pg_proxy, pg_race_worker) are imported by name.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from pg_support import Conn, Sql, acquired, connect, new_pool, sql

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
async def pg_pool(postgres_dsn: str, pg_schema: str) -> AsyncIterator[asyncpg.Pool]:
    """A plain asyncpg pool (asyncpg's defaults, as an application would make it) whose
    schema ``pg_schema`` is migrated."""
    pool = await new_pool(postgres_dsn, min_size=1, max_size=10)
    try:
        await migrate(pool, schema=pg_schema)
        yield pool
    finally:
        await pool.close()


@pytest.fixture
def db(pg_pool: asyncpg.Pool) -> Sql:
    """``pg_pool`` for the test's own queries."""
    return sql(pg_pool)


@pytest.fixture
async def admin(postgres_dsn: str) -> AsyncIterator[Conn]:
    """A separate connection for inspecting and disturbing the server."""
    conn = await connect(postgres_dsn)
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture
async def backend(pg_pool: asyncpg.Pool, pg_schema: str) -> AsyncIterator[PostgresBackend[Any]]:
    """All four objects over ``pg_pool`` in ``pg_schema``."""
    made = PostgresBackend[Any].from_pool(pg_pool, schema=pg_schema, max_attempts=3)
    try:
        yield made
    finally:
        await made.consumer.close()


async def corrupt_head(pool: asyncpg.Pool, names: TableNames, thread_id: str) -> None:
    """Flip one byte in the middle of the thread's head record (and its history copy)."""
    key = thread_key(thread_id)
    flip = "set_byte(record, length(record) / 2, get_byte(record, length(record) / 2) # 255)"
    async with acquired(pool) as conn, conn.transaction():
        revision = await conn.fetchval(
            f"UPDATE {names.threads} SET record = {flip} WHERE thread_key = $1 RETURNING revision",
            key,
        )
        await conn.execute(
            f"UPDATE {names.history} SET record = {flip} WHERE thread_key = $1 AND revision = $2",
            key,
            revision,
        )


def bundle_of(backend: PostgresBackend[Any], dsn: str, name: str = "postgres") -> BackendBundle:
    """A conformance-suite bundle over ``backend``; peers get a pool of their own."""
    names = backend.checkpointer.names

    async def corrupt(thread_id: str) -> None:
        await corrupt_head(backend.pool, names, thread_id)

    async def open_peer() -> BackendBundle:
        peer = await PostgresBackend[Any].from_dsn(
            dsn,
            schema=names.schema,
            prefix=names.prefix,
            max_attempts=backend.consumer.max_attempts,
        )
        return bundle_of(peer, dsn, name="postgres-peer")

    return BackendBundle(
        checkpointer=backend.checkpointer,
        leases=backend.leases,
        outbox=backend.outbox,
        consumer=backend.consumer,
        corrupt=corrupt,
        open_peer=open_peer,
        close=backend.close,
        name=name,
    )


@pytest.fixture
async def flowy_backend(backend: PostgresBackend[Any], postgres_dsn: str) -> BackendBundle:
    """The conformance suite's backend: PostgreSQL in a schema of its own."""
    return bundle_of(backend, postgres_dsn)
