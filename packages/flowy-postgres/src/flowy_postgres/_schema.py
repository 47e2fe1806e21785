"""The database schema: table names, the DDL, and ``migrate()``.

One schema (``public`` by default) holds five tables whose names share a prefix
(``flowy_`` by default): ``threads`` (one head row per thread), ``history`` (every saved
record, keyed by thread and revision), ``leases`` (the run lease and fencing counter of
each thread), ``outbox`` (hand-off intents for consumers) and ``schema_version``.

Threads are keyed by ``thread_key``, the SHA-256 digest of the thread id's UTF-8 bytes:
PostgreSQL's b-tree indexes cannot hold keys of several kilobytes and thread ids may be
16 KiB long. Every statement also compares the full ``thread_id``, so ids are stored
exactly and never alias. ``migrate()`` is explicit and idempotent; ``schema_sql()`` gives
the same DDL for an application's own migration tool.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import asyncpg

from flowy import SchemaVersionError

from ._conn import PgConnection, PgPool
from ._errors import translated

if TYPE_CHECKING:
    from asyncpg.pool import PoolConnectionProxy

__all__ = [
    "DEFAULT_PREFIX",
    "DEFAULT_SCHEMA",
    "SCHEMA_VERSION",
    "TableNames",
    "migrate",
    "schema_sql",
    "schema_version",
    "thread_key",
]

SCHEMA_VERSION = 1
"""The schema version this code reads and writes."""

DEFAULT_SCHEMA = "public"
"""The PostgreSQL schema the tables live in unless configured otherwise."""

DEFAULT_PREFIX = "flowy_"
"""The prefix of every table name unless configured otherwise."""

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MAX_IDENTIFIER = 63  # NAMEDATALEN - 1
_LONGEST_SUFFIX = "outbox_ready_idx"


def thread_key(thread_id: str) -> bytes:
    """The 32-byte primary key of a thread: SHA-256 of its id's UTF-8 bytes."""
    return hashlib.sha256(thread_id.encode("utf-8")).digest()


def _quote(identifier: str) -> str:
    return '"' + identifier + '"'


@dataclass(frozen=True, slots=True)
class TableNames:
    """The validated, quoted names of one flowy schema (a schema name plus a prefix)."""

    schema: str = DEFAULT_SCHEMA
    prefix: str = DEFAULT_PREFIX
    threads: str = field(init=False)
    history: str = field(init=False)
    leases: str = field(init=False)
    outbox: str = field(init=False)
    version: str = field(init=False)
    channel: str = field(init=False)
    lock_key: int = field(init=False)

    def __post_init__(self) -> None:
        schema_value = cast(object, self.schema)
        prefix_value = cast(object, self.prefix)
        if not isinstance(schema_value, str) or not _IDENTIFIER.fullmatch(schema_value):
            raise ValueError(
                f"schema name {self.schema!r} is not a plain identifier; use letters, digits "
                f"and underscores, starting with a letter or underscore"
            )
        if len(self.schema) > _MAX_IDENTIFIER:
            raise ValueError(
                f"schema name {self.schema!r} is {len(self.schema)} characters long; "
                f"PostgreSQL allows {_MAX_IDENTIFIER}"
            )
        if not isinstance(prefix_value, str) or (
            prefix_value and not _IDENTIFIER.fullmatch(prefix_value)
        ):
            raise ValueError(
                f"table prefix {self.prefix!r} is not a plain identifier; use letters, "
                f"digits and underscores, starting with a letter or underscore (or '')"
            )
        longest = _MAX_IDENTIFIER - len(_LONGEST_SUFFIX)
        if len(self.prefix) > longest:
            raise ValueError(
                f"table prefix {self.prefix!r} is {len(self.prefix)} characters long; at "
                f"most {longest} fit PostgreSQL's {_MAX_IDENTIFIER}-character names"
            )
        schema = _quote(self.schema)

        def table(suffix: str) -> str:
            return f"{schema}.{_quote(self.prefix + suffix)}"

        set_ = object.__setattr__
        set_(self, "threads", table("threads"))
        set_(self, "history", table("history"))
        set_(self, "leases", table("leases"))
        set_(self, "outbox", table("outbox"))
        set_(self, "version", table("schema_version"))
        channel = f"{self.schema}.{self.prefix}outbox"
        if len(channel) > _MAX_IDENTIFIER:
            channel = "flowy_outbox_" + hashlib.sha256(channel.encode()).hexdigest()[:40]
        set_(self, "channel", channel)
        # Migrations of one schema serialise on this advisory lock (transaction-scoped).
        digest = hashlib.sha256(f"flowy-migrate:{self.schema}".encode()).digest()
        set_(self, "lock_key", int.from_bytes(digest[:8], "big", signed=True))

    def index(self, suffix: str) -> str:
        """The quoted, unqualified name of one of the schema's indexes."""
        return _quote(self.prefix + suffix)


def _ddl_v1(n: TableNames) -> list[str]:
    return [
        f"CREATE SCHEMA IF NOT EXISTS {_quote(n.schema)}",
        f"""CREATE TABLE IF NOT EXISTS {n.version} (
    version integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
)""",
        f"""CREATE TABLE IF NOT EXISTS {n.threads} (
    thread_key bytea PRIMARY KEY,          -- sha256(convert_to(thread_id, 'UTF8'))
    thread_id text NOT NULL,
    revision bigint NOT NULL CHECK (revision > 0),
    pointer text NOT NULL,
    status text NOT NULL,
    reason text NOT NULL,
    handoff_status text NOT NULL,
    handoff_pending_at double precision,   -- seconds since the epoch, as in the snapshot
    updated_at double precision NOT NULL,  -- seconds since the epoch, as in the snapshot
    saved_at timestamptz NOT NULL,         -- the database clock at the save
    record bytea NOT NULL                  -- the flowy record envelope of the head
) WITH (fillfactor = 80)""",
        f"""CREATE INDEX IF NOT EXISTS {n.index("threads_handoff_idx")}
    ON {n.threads} (handoff_status) WHERE handoff_status <> 'none'""",
        f"""CREATE TABLE IF NOT EXISTS {n.history} (
    thread_key bytea NOT NULL,
    revision bigint NOT NULL,
    record bytea NOT NULL,
    PRIMARY KEY (thread_key, revision)
)""",
        f"""CREATE TABLE IF NOT EXISTS {n.leases} (
    thread_key bytea PRIMARY KEY,
    thread_id text NOT NULL,
    owner text,                            -- NULL once released
    token bigint NOT NULL,                 -- fencing token: only ever grows
    expires_at timestamptz                 -- by the database clock; NULL once released
)""",
        f"""CREATE TABLE IF NOT EXISTS {n.outbox} (
    id bigserial PRIMARY KEY,
    thread_key bytea NOT NULL,
    thread_id text NOT NULL,
    committed_revision bigint NOT NULL,
    payload bytea NOT NULL,                -- flowy.checkpoint.encode_intent bytes
    attempts integer NOT NULL DEFAULT 0,
    visible_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    claimed_by text,
    dead boolean NOT NULL DEFAULT false,
    last_error text,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (thread_key, committed_revision)
)""",
        f"""CREATE INDEX IF NOT EXISTS {n.index("outbox_ready_idx")}
    ON {n.outbox} (visible_at, id) WHERE NOT dead""",
        f"""CREATE INDEX IF NOT EXISTS {n.index("outbox_dead_idx")}
    ON {n.outbox} (id) WHERE dead""",
    ]


_MIGRATIONS = {1: _ddl_v1}


def _statements(names: TableNames, *, after: int) -> list[str]:
    out: list[str] = []
    for version in range(after + 1, SCHEMA_VERSION + 1):
        out.extend(_MIGRATIONS[version](names))
        out.append(
            f"INSERT INTO {names.version} (version) VALUES ({version}) ON CONFLICT DO NOTHING"
        )
    return out


def schema_sql(schema: str = DEFAULT_SCHEMA, prefix: str = DEFAULT_PREFIX) -> str:
    """The DDL ``migrate()`` runs on an empty database, as one SQL script.

    For applications that manage their schema with their own migration tool. Every
    statement is idempotent (``IF NOT EXISTS``); the last one records the schema version.
    """
    names = TableNames(schema, prefix)
    return ";\n\n".join(_statements(names, after=0)) + ";\n"


async def _read_version(conn: PgConnection, names: TableNames) -> int:
    exists = await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", names.version)
    if not exists:
        return 0
    value = await conn.fetchval(f"SELECT max(version) FROM {names.version}")
    return int(value or 0)


async def _with_connection(
    target: asyncpg.Pool | asyncpg.Connection | PoolConnectionProxy,
) -> tuple[PgConnection, PgPool | None]:
    if isinstance(target, asyncpg.Pool):
        pool = cast(PgPool, target)
        return await pool.acquire(), pool
    return cast(PgConnection, target), None


async def migrate(
    target: asyncpg.Pool | asyncpg.Connection | PoolConnectionProxy,
    *,
    schema: str = DEFAULT_SCHEMA,
    prefix: str = DEFAULT_PREFIX,
) -> int:
    """Create or upgrade the flowy tables; return the schema version now in place.

    Idempotent and safe to run from several processes at once (a transaction-scoped
    advisory lock serialises migrations of one schema). ``target`` is a pool or a
    connection. A database whose recorded version is newer than this code knows raises
    ``flowy.SchemaVersionError``: upgrade flowy-postgres instead.
    """
    names = TableNames(schema, prefix)
    conn, pool = await _with_connection(target)
    try:
        with translated(f"migrate schema {schema!r} (prefix {prefix!r})", conn):
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock($1)", names.lock_key)
                current = await _read_version(conn, names)
                if current > SCHEMA_VERSION:
                    raise SchemaVersionError(
                        f"the flowy tables in schema {schema!r} (prefix {prefix!r}) are at "
                        f"schema version {current}, but this flowy-postgres knows versions up "
                        f"to {SCHEMA_VERSION}; upgrade flowy-postgres to use this database"
                    )
                for statement in _statements(names, after=current):
                    await conn.execute(statement)
                return SCHEMA_VERSION
    finally:
        if pool is not None:
            await pool.release(conn)


async def schema_version(
    target: asyncpg.Pool | asyncpg.Connection | PoolConnectionProxy,
    *,
    schema: str = DEFAULT_SCHEMA,
    prefix: str = DEFAULT_PREFIX,
) -> int:
    """The schema version recorded in the database (0 when never migrated). Read-only."""
    names = TableNames(schema, prefix)
    conn, pool = await _with_connection(target)
    try:
        with translated(f"read the schema version of {schema!r} (prefix {prefix!r})", conn):
            return await _read_version(conn, names)
    finally:
        if pool is not None:
            await pool.release(conn)
