"""The database schema: table names, the DDL, its versions and ``migrate()``.

One PostgreSQL schema (``public`` by default) holds five tables whose names share a
prefix (``flowy_`` by default): ``threads`` (one head row per thread: revision and the
columns listings read), ``history`` (every saved record, keyed by thread and revision;
the head's record is the history entry at the head's revision, written once),
``leases`` (the live run lease of a thread; a released, expired or deleted thread's row
goes away), ``outbox`` (hand-off intents for consumers) and ``schema_version``.

Threads are keyed by ``thread_key``, the SHA-256 digest of the thread id's UTF-8 bytes:
PostgreSQL's b-tree indexes cannot hold keys of several kilobytes and thread ids may be
16 KiB long. Every statement also compares the full ``thread_id``, so ids are stored
exactly and never alias. Listings are ordered by thread id (code point order, ``COLLATE
"C"``) through an index on its first 200 characters.

A new schema is created at the current version; :data:`UPGRADES` brings an older one up
to date, only through an explicit ``migrate()``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import asyncpg

from flowy.errors import SchemaVersionError

from ._conn import PgConnection, PgPool
from ._errors import translate

if TYPE_CHECKING:
    from asyncpg.pool import PoolConnectionProxy

__all__ = [
    "DEFAULT_PREFIX",
    "DEFAULT_SCHEMA",
    "MAX_PREFIX",
    "SCHEMA_VERSION",
    "TableNames",
    "migrate",
    "read_version",
    "schema_sql",
    "schema_version",
    "thread_key",
]

SCHEMA_VERSION = 2
"""The schema version this code reads and writes."""

DEFAULT_SCHEMA = "public"
"""The PostgreSQL schema the tables live in unless configured otherwise."""

DEFAULT_PREFIX = "flowy_"
"""The prefix of every table name unless configured otherwise."""

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MAX_IDENTIFIER = 63  # NAMEDATALEN - 1
_LONGEST_SUFFIX = "threads_handoff_idx"
MAX_PREFIX = _MAX_IDENTIFIER - len(_LONGEST_SUFFIX)
"""The longest table prefix (so that every table and index name fits 63 characters)."""
ID_PREFIX = 'substr(thread_id, 1, 200) COLLATE "C"'
"""The indexed expression listings are ordered by (then by the whole id)."""


def thread_key(thread_id: str) -> bytes:
    """The 32-byte primary key of a thread: SHA-256 of its id's UTF-8 bytes."""
    return hashlib.sha256(thread_id.encode("utf-8")).digest()


def check_identifier(value: object, what: str, *, empty: bool = False, longest: int) -> str:
    """``value`` if it is a plain identifier (letters, digits, underscores) that fits."""
    if not isinstance(value, str) or not (_IDENTIFIER.fullmatch(value) or (empty and value == "")):
        raise ValueError(
            f"{what} {value!r} is not a plain identifier; use letters, digits and "
            f"underscores, starting with a letter or underscore{' (or empty)' if empty else ''}"
        )
    if len(value) > longest:
        raise ValueError(f"{what} {value!r} is {len(value)} characters long; at most {longest} fit")
    return value


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
        check_identifier(self.schema, "schema name", longest=_MAX_IDENTIFIER)
        check_identifier(self.prefix, "table prefix", empty=True, longest=MAX_PREFIX)
        set_ = object.__setattr__
        for table in ("threads", "history", "leases", "outbox"):
            set_(self, table, self.table(table))
        set_(self, "version", self.table("schema_version"))
        channel = f"{self.schema}.{self.prefix}outbox"
        if len(channel) > _MAX_IDENTIFIER:
            channel = "flowy_outbox_" + hashlib.sha256(channel.encode()).hexdigest()[:40]
        set_(self, "channel", channel)
        # Migrations of one schema serialise on this advisory lock (transaction-scoped).
        digest = hashlib.sha256(f"flowy-migrate:{self.schema}".encode()).digest()
        set_(self, "lock_key", int.from_bytes(digest[:8], "big", signed=True))

    def table(self, suffix: str) -> str:
        """The quoted, schema-qualified name of a table."""
        return f"{_quote(self.schema)}.{_quote(self.prefix + suffix)}"

    def index(self, suffix: str) -> str:
        """The quoted, unqualified name of one of the schema's indexes."""
        return _quote(self.prefix + suffix)


def _create(n: TableNames) -> list[str]:
    """The DDL of a new schema at :data:`SCHEMA_VERSION` (every statement idempotent)."""
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
    saved_at timestamptz NOT NULL          -- the database clock at the save
) WITH (fillfactor = 80)""",
        f"CREATE INDEX IF NOT EXISTS {n.index('threads_id_idx')} ON {n.threads} (({ID_PREFIX}))",
        f"""CREATE INDEX IF NOT EXISTS {n.index("threads_handoff_idx")}
    ON {n.threads} (handoff_status) WHERE handoff_status <> 'none'""",
        f"""CREATE TABLE IF NOT EXISTS {n.history} (
    thread_key bytea NOT NULL,
    revision bigint NOT NULL,
    record bytea NOT NULL,                 -- the flowy record envelope
    PRIMARY KEY (thread_key, revision)
)""",
        f"""CREATE TABLE IF NOT EXISTS {n.leases} (
    thread_key bytea PRIMARY KEY,
    thread_id text NOT NULL,
    owner text,                            -- NULL: released while a save held the row
    token bigint NOT NULL,                 -- fencing token
    expires_at timestamptz                 -- by the database clock
)""",
        f"""CREATE TABLE IF NOT EXISTS {n.outbox} (
    id bigserial PRIMARY KEY,
    thread_key bytea NOT NULL,
    thread_id text NOT NULL,
    committed_revision bigint NOT NULL,
    payload bytea NOT NULL,                -- flowy.storage.encode_intent bytes
    attempts integer NOT NULL DEFAULT 0,
    visible_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    dead boolean NOT NULL DEFAULT false,
    last_error text NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (thread_key, committed_revision)
)""",
        f"""CREATE INDEX IF NOT EXISTS {n.index("outbox_ready_idx")}
    ON {n.outbox} (visible_at, id) WHERE NOT dead""",
        f"CREATE INDEX IF NOT EXISTS {n.index('outbox_dead_idx')} ON {n.outbox} (id) WHERE dead",
    ]


def _upgrade_1_to_2(n: TableNames) -> list[str]:
    return [
        # The head's record lives in the history only (a v1 head always had its copy
        # there; this insert is a safety net).
        f"INSERT INTO {n.history} (thread_key, revision, record) "
        f"SELECT thread_key, revision, record FROM {n.threads} ON CONFLICT DO NOTHING",
        f"ALTER TABLE {n.threads} DROP COLUMN record",
        f"CREATE INDEX IF NOT EXISTS {n.index('threads_id_idx')} ON {n.threads} (({ID_PREFIX}))",
        # Tokens now start at the clock in microseconds: released rows are not needed.
        f"DELETE FROM {n.leases} WHERE owner IS NULL",
        f"UPDATE {n.outbox} SET last_error = '' WHERE last_error IS NULL",
        f"ALTER TABLE {n.outbox} ALTER COLUMN last_error SET DEFAULT '', "
        "ALTER COLUMN last_error SET NOT NULL, DROP COLUMN claimed_by",
    ]


UPGRADES: dict[int, Callable[[TableNames], list[str]]] = {1: _upgrade_1_to_2}
"""``UPGRADES[n](names)``: the statements that take a schema from version n to n + 1."""


def _statements(names: TableNames, *, current: int) -> list[str]:
    """A new schema is created at the current version; an older one is upgraded."""
    steps = _create(names) if current == 0 else []
    for version in range(current or SCHEMA_VERSION, SCHEMA_VERSION):
        steps.extend(UPGRADES[version](names))
    steps.append(
        f"INSERT INTO {names.version} (version) VALUES ({SCHEMA_VERSION}) ON CONFLICT DO NOTHING"
    )
    return steps


def schema_sql(schema: str = DEFAULT_SCHEMA, prefix: str = DEFAULT_PREFIX) -> str:
    """The DDL ``migrate()`` runs on an empty database, as one SQL script.

    For applications that manage their schema with their own migration tool. Every
    statement is idempotent (``IF NOT EXISTS``); the last one records the schema version.
    """
    return ";\n\n".join(_statements(TableNames(schema, prefix), current=0)) + ";\n"


async def read_version(conn: PgConnection, names: TableNames) -> int:
    """The schema version recorded in the database (0 when there is none)."""
    if not await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", names.version):
        return 0
    return int(await conn.fetchval(f"SELECT max(version) FROM {names.version}") or 0)


async def _on(target: object, action: str, names: TableNames, migrating: bool) -> int:
    pool = cast(PgPool, target) if isinstance(target, asyncpg.Pool) else None
    conn = await pool.acquire() if pool is not None else cast(PgConnection, target)
    try:
        if not migrating:
            return await read_version(conn, names)
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", names.lock_key)
            current = await read_version(conn, names)
            if current > SCHEMA_VERSION:
                raise SchemaVersionError(
                    f"the flowy tables in schema {names.schema!r} (prefix {names.prefix!r}) "
                    f"are at schema version {current}, but this flowy-postgres knows versions "
                    f"up to {SCHEMA_VERSION}; upgrade flowy-postgres to use this database"
                )
            if current < SCHEMA_VERSION:
                for statement in _statements(names, current=current):
                    await conn.execute(statement)
            return SCHEMA_VERSION
    except Exception as exc:
        err = translate(exc, action, conn)
        if err is exc:
            raise
        raise err from exc
    finally:
        if pool is not None:
            await pool.release(conn)


async def migrate(
    target: asyncpg.Pool | asyncpg.Connection | PoolConnectionProxy,
    *,
    schema: str = DEFAULT_SCHEMA,
    prefix: str = DEFAULT_PREFIX,
) -> int:
    """Create or upgrade the flowy tables; return the schema version now in place.

    Idempotent and safe to run from several processes at once (a transaction-scoped
    advisory lock serialises migrations of one schema). ``target`` is a pool or a
    connection. Back the database up before an upgrade: older code cannot read the
    result. A schema whose recorded version is newer than this code knows raises
    ``flowy.errors.SchemaVersionError``: upgrade flowy-postgres instead.
    """
    names = TableNames(schema, prefix)
    action = f"migrate schema {schema!r} (prefix {prefix!r})"
    return await _on(target, action, names, migrating=True)


async def schema_version(
    target: asyncpg.Pool | asyncpg.Connection | PoolConnectionProxy,
    *,
    schema: str = DEFAULT_SCHEMA,
    prefix: str = DEFAULT_PREFIX,
) -> int:
    """The schema version recorded in the database (0 when never migrated). Read-only."""
    names = TableNames(schema, prefix)
    action = f"read the schema version of {schema!r} (prefix {prefix!r})"
    return await _on(target, action, names, migrating=False)
