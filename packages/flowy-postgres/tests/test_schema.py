"""``migrate()``, ``schema_sql()``, ``schema_version()`` and the table names."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
import pytest
from pg_support import Conn, as_asyncpg, connect, new_pool, sql

from flowy import SchemaVersionError
from flowy.checkpoint import Snapshot
from flowy_postgres import (
    SCHEMA_VERSION,
    PostgresCheckpointer,
    migrate,
    schema_sql,
    schema_version,
)
from flowy_postgres._schema import TableNames

pytestmark = pytest.mark.anyio


def fresh_schema() -> str:
    return f"flowy_test_{uuid.uuid4().hex[:12]}"


async def drop(conn: Conn, *schemas: str) -> None:
    for schema in schemas:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


async def test_migrate_is_idempotent(pg_pool: asyncpg.Pool, pg_schema: str) -> None:
    assert await schema_version(pg_pool, schema=pg_schema) == SCHEMA_VERSION
    assert await migrate(pg_pool, schema=pg_schema) == SCHEMA_VERSION
    assert await migrate(pg_pool, schema=pg_schema) == SCHEMA_VERSION
    names = TableNames(pg_schema)
    assert await sql(pg_pool).fetch(f"SELECT version FROM {names.version}") == [(SCHEMA_VERSION,)]


async def test_schema_version_of_an_unmigrated_schema_is_zero(admin: Conn, pg_schema: str) -> None:
    assert await schema_version(as_asyncpg(admin), schema=pg_schema) == 0


async def test_concurrent_migrations_are_safe(postgres_dsn: str, admin: Conn) -> None:
    schema = fresh_schema()
    conns = [await connect(postgres_dsn) for _ in range(6)]
    try:
        versions = await asyncio.gather(*(migrate(as_asyncpg(c), schema=schema) for c in conns))
        assert versions == [SCHEMA_VERSION] * 6
        assert await admin.fetch(f"SELECT version FROM {TableNames(schema).version}") == [
            (SCHEMA_VERSION,)
        ]
    finally:
        for conn in conns:
            await conn.close()
        await drop(admin, schema)


async def test_a_newer_schema_is_refused(pg_pool: asyncpg.Pool, pg_schema: str) -> None:
    names = TableNames(pg_schema)
    await sql(pg_pool).execute(f"INSERT INTO {names.version} (version) VALUES (99)")
    with pytest.raises(SchemaVersionError, match="schema version 99"):
        await migrate(pg_pool, schema=pg_schema)
    assert await schema_version(pg_pool, schema=pg_schema) == 99


async def test_schema_sql_creates_what_migrate_creates(admin: Conn) -> None:
    by_sql, by_migrate = fresh_schema(), fresh_schema()
    try:
        await admin.execute(schema_sql(by_sql))
        await migrate(as_asyncpg(admin), schema=by_migrate)
        # Running the script again changes nothing (every statement is idempotent).
        await admin.execute(schema_sql(by_sql))

        async def shape(schema: str) -> str:
            columns = await admin.fetch(
                "SELECT table_name, column_name, data_type, is_nullable, column_default "
                "FROM information_schema.columns WHERE table_schema = $1 "
                "ORDER BY table_name, ordinal_position",
                schema,
            )
            indexes = await admin.fetch(
                "SELECT tablename, indexname, indexdef FROM pg_indexes "
                "WHERE schemaname = $1 ORDER BY indexname",
                schema,
            )
            versions = await admin.fetch(f"SELECT version FROM {TableNames(schema).version}")
            rows = [tuple(r) for r in [*columns, *indexes, *versions]]
            # Sequence defaults and index definitions name their schema.
            return str(rows).replace(schema, "<schema>")

        assert await shape(by_sql) == await shape(by_migrate)
        assert await schema_version(as_asyncpg(admin), schema=by_sql) == SCHEMA_VERSION
    finally:
        await drop(admin, by_sql, by_migrate)


async def test_operations_on_an_unmigrated_schema_say_what_to_do(
    pg_schema: str, postgres_dsn: str
) -> None:
    pool = await new_pool(postgres_dsn, min_size=1, max_size=1)
    try:
        cp = PostgresCheckpointer[Any](pool, schema=pg_schema)
        with pytest.raises(SchemaVersionError, match=r"migrate\(pool"):
            await cp.load("x")
        with pytest.raises(SchemaVersionError, match="tables are missing"):
            await cp.save(0, Snapshot(thread_id="x", state={}, execution_pointer="p"))
    finally:
        await pool.close()


@pytest.mark.parametrize(
    ("schema", "prefix"),
    [
        ("bad-name", "flowy_"),
        ("1abc", "flowy_"),
        ('x"; DROP TABLE t; --', "flowy_"),
        ("", "flowy_"),
        ("s" * 64, "flowy_"),
        ("public", "bad prefix"),
        ("public", "9_"),
        ("public", "p" * 48),
        ("public", 'p"'),
    ],
)
def test_identifiers_are_validated(schema: str, prefix: str) -> None:
    with pytest.raises(ValueError, match=r"schema name|table prefix"):
        TableNames(schema, prefix)
    with pytest.raises(ValueError):
        schema_sql(schema, prefix)


def test_names_are_quoted() -> None:
    names = TableNames("Mixed_Case", "App_")
    assert names.threads == '"Mixed_Case"."App_threads"'
    assert names.channel == "Mixed_Case.App_outbox"
    long = TableNames("s" * 63, "p" * 47)
    assert len(long.channel) <= 63


async def test_mixed_case_names_and_two_prefixes_in_one_schema(
    admin: Conn, postgres_dsn: str
) -> None:
    schema = "Flowy_Test_" + uuid.uuid4().hex[:8]
    pool = await new_pool(postgres_dsn, min_size=1, max_size=2)
    try:
        for prefix in ("App_", "other_"):
            await migrate(pool, schema=schema, prefix=prefix)
        first = PostgresCheckpointer[Any](pool, schema=schema, prefix="App_")
        second = PostgresCheckpointer[Any](pool, schema=schema, prefix="other_")
        snap = Snapshot[Any](thread_id="same-id", state={"by": "first"}, execution_pointer="p")
        assert await first.save(0, snap) == 1
        assert await second.list_threads() == []
        assert await second.save(0, snap) == 1
        assert await first.save(1, snap) == 2
        assert (await second.load("same-id"))[1] == 1
        tables = await admin.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = $1 ORDER BY 1", schema
        )
        assert [t["tablename"] for t in tables] == [
            "App_history",
            "App_leases",
            "App_outbox",
            "App_schema_version",
            "App_threads",
            "other_history",
            "other_leases",
            "other_outbox",
            "other_schema_version",
            "other_threads",
        ]
    finally:
        await pool.close()
        await drop(admin, schema)
