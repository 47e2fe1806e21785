"""The schema: created on open, versioned, upgraded only by ``setup()``; ``schema_sql()``;
validated and quoted names."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from typing import Any

import asyncpg
import pytest
from pg_support import (
    FIXED_TIME,
    Conn,
    as_asyncpg,
    connect,
    intent,
    new_pool,
    opened,
    schema_v1,
    schema_v2,
    set_up,
    snap,
    sql,
    with_options,
)

import flowy
import flowy_postgres
from flowy.errors import SchemaVersionError
from flowy.storage import ActivityRecord, ActivityStatus, Signal, Timer, recent_key
from flowy.storage.dialect import encode_snapshot
from flowy_postgres import (
    SCHEMA_VERSION,
    PostgresBackend,
    schema_sql,
    schema_version,
)
from flowy_postgres._schema import TableNames, thread_key

pytestmark = pytest.mark.anyio


def fresh_schema() -> str:
    return f"flowy_test_{uuid.uuid4().hex[:12]}"


async def drop(conn: Conn, *schemas: str) -> None:
    for schema in schemas:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


async def shape(admin: Conn, schema: str) -> str:
    """The tables, columns and indexes of ``schema`` (without its name)."""
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
    rows = [tuple(r) for r in [*columns, *indexes]]
    return str(rows).replace(schema, "<schema>")  # defaults and indexes name it


async def test_open_creates_a_new_schema(postgres_dsn: str, pg_schema: str, admin: Conn) -> None:
    assert await schema_version(as_asyncpg(admin), schema=pg_schema) == 0
    async with flowy.connect(with_options(postgres_dsn, schema=pg_schema)) as backend:
        assert await backend.setup() == SCHEMA_VERSION  # idempotent
    assert await schema_version(as_asyncpg(admin), schema=pg_schema) == SCHEMA_VERSION
    assert await admin.fetch(f"SELECT version FROM {TableNames(pg_schema).version}") == [
        (SCHEMA_VERSION,)
    ]


async def test_setup_is_idempotent(pg_pool: asyncpg.Pool, pg_schema: str) -> None:
    assert await schema_version(pg_pool, schema=pg_schema) == SCHEMA_VERSION
    assert await set_up(pg_pool, schema=pg_schema) == SCHEMA_VERSION
    assert await set_up(pg_pool, schema=pg_schema) == SCHEMA_VERSION


async def test_concurrent_opens_and_migrations_are_safe(postgres_dsn: str, admin: Conn) -> None:
    schema = fresh_schema()
    conns = [await connect(postgres_dsn) for _ in range(4)]
    url = with_options(postgres_dsn, schema=schema, pool_size=1)
    try:
        versions = await asyncio.gather(
            *(set_up(as_asyncpg(c), schema=schema) for c in conns),
            *(flowy.connect(url) for _ in range(3)),
        )
        assert versions[:4] == [SCHEMA_VERSION] * 4
        for backend in versions[4:]:
            assert isinstance(backend, PostgresBackend)
            await backend.aclose()
        assert await admin.fetch(f"SELECT version FROM {TableNames(schema).version}") == [
            (SCHEMA_VERSION,)
        ]
    finally:
        for conn in conns:
            await conn.close()
        await drop(admin, schema)


async def test_a_newer_schema_is_refused(
    postgres_dsn: str, pg_pool: asyncpg.Pool, pg_schema: str
) -> None:
    await sql(pg_pool).execute(f"INSERT INTO {TableNames(pg_schema).version} VALUES (99)")
    with pytest.raises(SchemaVersionError, match="schema version 99"):
        await set_up(pg_pool, schema=pg_schema)
    with pytest.raises(SchemaVersionError, match="upgrade flowy-postgres"):
        await flowy.connect(with_options(postgres_dsn, schema=pg_schema))
    assert await schema_version(pg_pool, schema=pg_schema) == 99


async def test_an_older_schema_needs_setup_and_keeps_its_data(
    postgres_dsn: str, pg_schema: str, admin: Conn
) -> None:
    """A 0.1 schema (version 1): open refuses it until setup() upgrades it in place;
    heads, history, live leases and outbox messages survive, released leases go."""
    for statement in schema_v1(pg_schema):
        await admin.execute(statement)
    n = TableNames(pg_schema)
    records = {r: encode_snapshot(snap("old", r), r) for r in (1, 2)}
    for revision, record in records.items():
        await admin.execute(
            f"INSERT INTO {n.history} VALUES ($1, $2, $3)", thread_key("old"), revision, record
        )
    await admin.execute(
        f"INSERT INTO {n.threads} VALUES ($1, 'old', 2, 'step-2', 'running', '', 'none', NULL, "
        "1.5, now(), $2)",
        thread_key("old"),
        records[2],
    )
    await admin.execute(
        f"INSERT INTO {n.leases} VALUES ($1, 'old', NULL, 3, NULL), "
        "($2, 'live', 'worker', 4, now() + interval '1 hour')",
        thread_key("old"),
        thread_key("live"),
    )
    payload = flowy.storage.dialect.encode_intent(intent("old", 2))
    await admin.execute(
        f"INSERT INTO {n.outbox} (thread_key, thread_id, committed_revision, payload) "
        "VALUES ($1, 'old', 2, $2)",
        thread_key("old"),
        payload,
    )
    url = with_options(postgres_dsn, schema=pg_schema)
    with pytest.raises(SchemaVersionError, match=r"schema version 1, older .*backend.setup\(\)"):
        await flowy.connect(url)
    unopened = PostgresBackend[Any](postgres_dsn, schema=pg_schema)
    try:
        assert await unopened.setup() == SCHEMA_VERSION
        assert await unopened.setup() == SCHEMA_VERSION
    finally:
        await unopened.aclose()
    async with flowy.connect(url) as backend:
        head, revision = await backend.checkpointer.load("old")
        assert (revision, head.state) == (2, {"n": 2})
        assert [s.revision for s in await backend.checkpointer.get_history("old")] == [2, 1]
        holder = await backend.leases.holder("live")
        assert holder is not None and holder.fencing_token == 4
        lease = await backend.leases.acquire("old", "new-owner", 30)
        assert lease.fencing_token > 3
        [message] = await backend.consumer.claim(10, 30)
        assert message.intent == intent("old", 2) and message.last_error == ""
        assert await backend.checkpointer.save(2, snap("old", 3), lease=lease) == 3
    assert await admin.fetchval(f"SELECT count(*) FROM {n.leases} WHERE owner IS NULL") == 0


async def test_a_version_2_schema_upgrades_and_keeps_its_threads(
    postgres_dsn: str, pg_schema: str, admin: Conn
) -> None:
    """A 0.2.0 schema (version 2): open refuses it until setup() adds the wake-up
    column and index, the graph version column, the signal inbox and the activity
    journal; heads, history, leases and outbox messages stay, and the result is shaped
    like a new schema."""
    for statement in schema_v2(pg_schema):
        await admin.execute(statement)
    n = TableNames(pg_schema)
    records = {r: encode_snapshot(snap("old", r), r) for r in (1, 2)}
    for revision, record in records.items():
        await admin.execute(
            f"INSERT INTO {n.history} VALUES ($1, $2, $3)", thread_key("old"), revision, record
        )
    await admin.execute(
        f"INSERT INTO {n.threads} VALUES ($1, 'old', 2, 'step-2', 'running', '', 'none', NULL, "
        "1.5, now())",
        thread_key("old"),
    )
    await admin.execute(
        f"INSERT INTO {n.leases} VALUES ($1, 'live', 'worker', 4, now() + interval '1 hour')",
        thread_key("live"),
    )
    await admin.execute(
        f"INSERT INTO {n.outbox} (thread_key, thread_id, committed_revision, payload) "
        "VALUES ($1, 'old', 2, $2)",
        thread_key("old"),
        flowy.storage.dialect.encode_intent(intent("old", 2)),
    )
    url = with_options(postgres_dsn, schema=pg_schema)
    with pytest.raises(SchemaVersionError, match=r"schema version 2, older .*backend.setup\(\)"):
        await flowy.connect(url)
    assert await set_up(as_asyncpg(admin), schema=pg_schema) == SCHEMA_VERSION
    assert await set_up(as_asyncpg(admin), schema=pg_schema) == SCHEMA_VERSION
    assert await admin.fetch(f"SELECT version FROM {n.version} ORDER BY 1") == [
        (2,),
        (SCHEMA_VERSION,),
    ]
    async with opened(url) as backend:
        cp = backend.checkpointer
        head, revision = await cp.load("old")
        assert (revision, head.state, head.wake_at) == (2, {"n": 2}, None)
        assert [s.revision for s in await cp.get_history("old")] == [2, 1]
        [summary] = await cp.list_threads()
        assert (summary.thread_id, summary.revision, summary.wake_at) == ("old", 2, None)
        assert summary.graph_version == ""
        assert await cp.timers() == []
        holder = await backend.leases.holder("live")
        assert holder is not None and holder.fencing_token == 4
        [message] = await backend.consumer.claim(10, 30)
        assert message.intent == intent("old", 2)
        upgraded = replace(snap("old", 3), wake_at=FIXED_TIME, graph_version="v2")
        assert await cp.save(2, upgraded) == 3
        assert await cp.timers() == [Timer("old", FIXED_TIME)]
        assert [s.graph_version for s in await cp.list_threads()] == ["v2"]
        assert (await cp.append_signal(Signal("old", "go", None, "s-1"))).seq == 1
        await cp.put_activity("old", ActivityRecord("k", ActivityStatus.STARTED))
        assert [r.key for r in await cp.journal("old")] == ["k"]
    fresh = fresh_schema()
    try:
        await set_up(as_asyncpg(admin), schema=fresh)
        assert await shape(admin, pg_schema) == await shape(admin, fresh)
    finally:
        await drop(admin, fresh)


async def test_a_version_5_schema_upgrades_to_the_recency_index(
    postgres_dsn: str, pg_schema: str, admin: Conn
) -> None:
    """A schema of version 5 (before the recency index): setup() adds the save-second
    column, fills it from updated_at and indexes it, shaped like a new schema."""
    url = with_options(postgres_dsn, schema=pg_schema)
    async with opened(url) as backend:
        for thread_id, at in (("a", 5.5), ("b", 9.25), ("c", 5.75)):
            stamped = replace(snap(thread_id), updated_at=1_700_000_000 + at)
            await backend.checkpointer.save(0, stamped)
    n = TableNames(pg_schema)
    await admin.execute(f"ALTER TABLE {n.threads} DROP COLUMN recent_second")  # and its index
    await admin.execute(f"DELETE FROM {n.version} WHERE version = 6")
    await admin.execute(f"INSERT INTO {n.version} VALUES (5) ON CONFLICT DO NOTHING")
    with pytest.raises(SchemaVersionError, match=r"schema version 5, older .*backend.setup\(\)"):
        await flowy.connect(url)
    assert await set_up(as_asyncpg(admin), schema=pg_schema) == SCHEMA_VERSION
    async with opened(url) as backend:
        recent = await backend.checkpointer.recent_threads(limit=10)
        assert [(s.thread_id, recent_key(s)[0]) for s in recent] == [
            ("b", 1_700_000_009),
            ("c", 1_700_000_005),
            ("a", 1_700_000_005),
        ]
    fresh = fresh_schema()
    try:
        await set_up(as_asyncpg(admin), schema=fresh)
        assert await shape(admin, pg_schema) == await shape(admin, fresh)
    finally:
        await drop(admin, fresh)


async def test_saves_within_a_second_stay_hot_updates(
    postgres_dsn: str, pg_schema: str, admin: Conn
) -> None:
    """The recency index costs a save nothing but in a new second: the head's update
    leaves every indexed column as it was, so PostgreSQL writes no index entry (a HOT
    update); the first save in a new second moves the index entry."""
    n = TableNames(pg_schema)
    url = with_options(postgres_dsn, schema=pg_schema)
    stats = (
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
        "WHERE schemaname = $1 AND relname = $2"
    )

    async def counted() -> tuple[int, int]:
        await admin.execute("SELECT pg_stat_clear_snapshot()")
        row = await admin.fetchrow(stats, pg_schema, n.threads.split(".")[-1].strip('"'))
        assert row is not None
        return int(row[0]), int(row[1])

    async with opened(url) as backend:
        cp = backend.checkpointer
        await cp.save(0, replace(snap("hot"), updated_at=1_700_000_000.1))
        offsets = (0.2, 0.3, 0.5, 0.9, 1.1, 1.2)  # one save in a new second
        for revision, offset in enumerate(offsets, 1):
            await cp.save(
                revision, replace(snap("hot", revision), updated_at=1_700_000_000 + offset)
            )
        [head] = await cp.recent_threads(limit=1)
        assert recent_key(head) == (1_700_000_001, "hot")
    want = (len(offsets), len(offsets) - 1)
    for _ in range(50):  # a backend reports its counts when it goes idle
        if await counted() == want:
            break
        await asyncio.sleep(0.1)
    assert await counted() == want


async def test_schema_sql_creates_what_setup_creates(admin: Conn) -> None:
    by_sql, by_setup = fresh_schema(), fresh_schema()
    try:
        await admin.execute(schema_sql(by_sql))
        await set_up(as_asyncpg(admin), schema=by_setup)
        await admin.execute(schema_sql(by_sql))  # every statement is idempotent
        assert await shape(admin, by_sql) == await shape(admin, by_setup)
        for schema in (by_sql, by_setup):
            assert await admin.fetch(f"SELECT version FROM {TableNames(schema).version}") == [
                (SCHEMA_VERSION,)
            ]
        assert await schema_version(as_asyncpg(admin), schema=by_sql) == SCHEMA_VERSION
    finally:
        await drop(admin, by_sql, by_setup)


async def test_operations_on_missing_tables_say_what_to_do(
    postgres_dsn: str, pg_schema: str
) -> None:
    pool = await new_pool(postgres_dsn, min_size=1, max_size=1)
    try:
        backend = PostgresBackend[Any].from_pool(pool, schema=pg_schema)  # never opened
        backend.connector.pool = pool
        with pytest.raises(SchemaVersionError, match=r"backend.setup\(\)"):
            await backend.checkpointer.load("x")
        with pytest.raises(SchemaVersionError, match="tables are missing"):
            await backend.checkpointer.save(0, snap("x"))
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
        ("public", "p" * 45),
        ("public", 'p"'),
    ],
)
def test_identifiers_are_validated(schema: str, prefix: str) -> None:
    with pytest.raises(ValueError, match=r"schema name|table prefix"):
        TableNames(schema, prefix)
    with pytest.raises(ValueError, match=r"schema name|table prefix"):
        PostgresBackend[Any]("postgresql://localhost/db", schema=schema, prefix=prefix)


def test_names_are_quoted() -> None:
    names = TableNames("Mixed_Case", "App_")
    assert names.threads == '"Mixed_Case"."App_threads"'
    assert names.channel == "Mixed_Case.App_outbox"
    assert len(TableNames("s" * 63, "p" * 44).channel) <= 63


async def test_mixed_case_names_and_two_prefixes_in_one_schema(
    admin: Conn, postgres_dsn: str
) -> None:
    schema = "Flowy_Test_" + uuid.uuid4().hex[:8]
    try:
        async with (
            opened(postgres_dsn, schema=schema, prefix="App_") as first,
            opened(postgres_dsn, schema=schema, prefix="other_") as second,
        ):
            assert not first.checkpointer.fences(second.leases)  # another store
            assert await first.checkpointer.save(0, snap("same-id")) == 1
            assert await second.checkpointer.list_threads() == []
            assert await second.checkpointer.save(0, snap("same-id")) == 1
            assert await first.checkpointer.save(1, snap("same-id", 2)) == 2
            assert (await second.checkpointer.load("same-id"))[1] == 1
        tables = await admin.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = $1 ORDER BY 1", schema
        )
        assert [t["tablename"] for t in tables] == [
            f"{prefix}{table}"
            for prefix in ("App_", "other_")
            for table in (
                *("history", "journal", "leases", "outbox", "queue_limits", "queue_starts"),
                *("schedules", "schema_version", "signals", "threads"),
            )
        ]
    finally:
        await drop(admin, schema)


async def test_the_module_migrate_is_a_deprecated_alias(
    pg_pool: asyncpg.Pool, pg_schema: str
) -> None:
    with pytest.warns(DeprecationWarning, match=r"flowy_postgres.migrate\(\) is deprecated"):
        assert await flowy_postgres.migrate(pg_pool, schema=pg_schema) == SCHEMA_VERSION
    backend = PostgresBackend[Any].from_pool(pg_pool, schema=pg_schema)
    with pytest.warns(DeprecationWarning, match=r"migrate\(\) is deprecated; use setup"):
        assert await backend.migrate() == SCHEMA_VERSION
