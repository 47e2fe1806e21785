"""The database schema: the DDL, its versions and its setup (its names are in ``_names``).

Ten tables share a prefix in one PostgreSQL schema: ``threads`` (a head row per
thread, with the columns listings and timers read), ``history`` (every record by thread
and revision; the head's record is its entry there), ``leases``, ``outbox`` (each
message with its queue route), ``queue_limits`` and ``queue_starts`` (each queue's
limits, and the starts of its rate window), ``signals`` (each thread's inbox),
``journal`` (each thread's activity records), ``schedules`` (durable schedules, by name)
and ``schema_version``; the function ``claim`` claims a queue's messages. Threads are
keyed by the SHA-256 of the id (b-tree indexes cannot hold 16 KiB ids), signals and
journal entries also by the SHA-256 of their id or key; statements also compare the full
texts, stored exactly. Listings go in code point order through an index on the first
200 characters of the id; ``recent_threads`` through an index of each head's save second
(``recent_second``) and that prefix. A new schema is created at :data:`SCHEMA_VERSION`;
:data:`UPGRADES` bring an older one up to date, on ``setup()``.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import asyncpg

from flowy.storage.dialect import BaseBackend

from ._conn import Connector, PgConnection
from ._names import DEFAULT_PREFIX, DEFAULT_SCHEMA, MAX_PREFIX, TableNames, check_identifier

if TYPE_CHECKING:
    from asyncpg.pool import PoolConnectionProxy

__all__ = [
    "DEFAULT_PREFIX",
    "DEFAULT_SCHEMA",
    "ID_PREFIX",
    "MAX_PREFIX",
    "SCHEMA_VERSION",
    "UPGRADES",
    "TableNames",
    "check_identifier",
    "connector_for",
    "migrate",
    "prepare",
    "schema_sql",
    "schema_version",
    "text_key",
    "thread_key",
]

SCHEMA_VERSION = 6
"""The schema version this code reads and writes."""

ID_PREFIX = 'substr(thread_id, 1, 200) COLLATE "C"'
"""The indexed expression listings are ordered by (then by the whole id)."""


def text_key(text: str) -> bytes:
    """The 32-byte b-tree key of a thread id, signal id or activity key: SHA-256 of its
    UTF-8 bytes."""
    return hashlib.sha256(text.encode("utf-8")).digest()


def thread_key(thread_id: str) -> bytes:
    """The 32-byte primary key of a thread: SHA-256 of its id's UTF-8 bytes."""
    return text_key(thread_id)


def _create(n: TableNames) -> list[str]:
    """The DDL of a new schema at :data:`SCHEMA_VERSION` (every statement idempotent)."""
    return [
        f'CREATE SCHEMA IF NOT EXISTS "{n.schema}"',
        f"""CREATE TABLE IF NOT EXISTS {n.version} (
    version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())""",
        f"""CREATE TABLE IF NOT EXISTS {n.threads} (
    thread_key bytea PRIMARY KEY,  -- sha256(convert_to(thread_id, 'UTF8'))
    thread_id text NOT NULL,
    revision bigint NOT NULL CHECK (revision > 0),
    pointer text NOT NULL, status text NOT NULL, reason text NOT NULL,
    handoff_status text NOT NULL,
    handoff_pending_at double precision,  -- epoch seconds, as in the snapshot
    updated_at double precision NOT NULL,  -- epoch seconds, as in the snapshot
    saved_at timestamptz NOT NULL,  -- the database clock at the save
    wake_at double precision,  -- epoch seconds: when a waiting head is due, as in the snapshot
    graph_version text NOT NULL DEFAULT '',  -- the version of the graph that saved the head
    recent_second bigint  -- floor(updated_at): the recency index (version 6)
) WITH (fillfactor = 80)""",
        f"CREATE INDEX IF NOT EXISTS {n.index('threads_id_idx')} ON {n.threads} (({ID_PREFIX}))",
        f"""CREATE INDEX IF NOT EXISTS {n.index("threads_handoff_idx")}
    ON {n.threads} (handoff_status) WHERE handoff_status <> 'none'""",
        f"""CREATE TABLE IF NOT EXISTS {n.history} (
    thread_key bytea NOT NULL, revision bigint NOT NULL,
    record bytea NOT NULL,  -- the flowy record envelope
    PRIMARY KEY (thread_key, revision))""",
        f"""CREATE TABLE IF NOT EXISTS {n.leases} (
    thread_key bytea PRIMARY KEY, thread_id text NOT NULL,
    owner text,  -- NULL: released while a save held the row
    token bigint NOT NULL,  -- the fencing token
    expires_at timestamptz  -- by the database clock
)""",
        f"""CREATE TABLE IF NOT EXISTS {n.outbox} (
    id bigserial PRIMARY KEY,
    thread_key bytea NOT NULL, thread_id text NOT NULL, committed_revision bigint NOT NULL,
    payload bytea NOT NULL,  -- flowy.storage.dialect.encode_intent bytes
    attempts integer NOT NULL DEFAULT 0,
    visible_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    dead boolean NOT NULL DEFAULT false,
    last_error text NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    {_ROUTE_COLUMNS},
    UNIQUE (thread_key, committed_revision))""",
        f"""CREATE INDEX IF NOT EXISTS {n.index("outbox_ready_idx")}
    ON {n.outbox} (visible_at, id) WHERE NOT dead""",
        f"CREATE INDEX IF NOT EXISTS {n.index('outbox_dead_idx')} ON {n.outbox} (id) WHERE dead",
        *_durable(n),
        *_schedules(n),
        *_queues(n),
        _recent_index(n),
    ]


def _recent_index(n: TableNames) -> str:
    """The recency index (version 6): heads by save second, then id, newest first.

    Keyed by the second, not by ``updated_at``: every save sets ``recent_second``, but
    to the value it has unless the save is the first in a new second, and an update
    that leaves every indexed column as it was stays HOT (no index entry written)."""
    return f"""CREATE INDEX IF NOT EXISTS {n.index("threads_recent_idx")}
    ON {n.threads} (recent_second DESC, ({ID_PREFIX}) DESC)"""


def _schedules(n: TableNames) -> list[str]:
    """The table of durable schedules (version 4)."""
    return [
        f"""CREATE TABLE IF NOT EXISTS {n.schedules} (
    name text PRIMARY KEY,
    version bigint NOT NULL,  -- every change adds one: a claim compares and sets it
    record bytea NOT NULL  -- the schedule as JSON
)""",
    ]


def _durable(n: TableNames) -> list[str]:
    """The wake-up index, the index of parked heads, the signal inbox and the activity
    journal (version 3)."""
    return [
        f"""CREATE INDEX IF NOT EXISTS {n.index("threads_wake_idx")}
    ON {n.threads} (wake_at, ({ID_PREFIX})) WHERE wake_at IS NOT NULL""",
        # The suspended and waiting heads, for the oldest of each (oldest_heads). Keyed
        # by status alone: a save changes updated_at every time, and an index on it
        # would cost every save its HOT update; status changes a few times per run.
        f"""CREATE INDEX IF NOT EXISTS {n.index("threads_parked_idx")}
    ON {n.threads} (status) WHERE status IN ('suspended', 'waiting')""",
        f"""CREATE TABLE IF NOT EXISTS {n.signals} (
    thread_key bytea NOT NULL, seq bigint NOT NULL CHECK (seq > 0),
    id_key bytea NOT NULL,  -- sha256(convert_to(signal_id, 'UTF8'))
    thread_id text NOT NULL, signal_id text NOT NULL,
    data bytea NOT NULL,  -- flowy.storage.encode_signal bytes
    PRIMARY KEY (thread_key, seq),
    CONSTRAINT {n.index("signals_id_key")} UNIQUE (thread_key, id_key))""",
        f"""CREATE TABLE IF NOT EXISTS {n.journal} (
    thread_key bytea NOT NULL,
    activity_key bytea NOT NULL,  -- sha256(convert_to(key, 'UTF8'))
    thread_id text NOT NULL, key text NOT NULL,
    data bytea NOT NULL,  -- flowy.storage.encode_activity bytes
    PRIMARY KEY (thread_key, activity_key))""",
    ]


# The route of a message and its flight (version 5), the last columns of the outbox.
_ROUTE_COLUMNS = """queue text NOT NULL DEFAULT 'default',
    partition_key text NOT NULL DEFAULT '',
    priority integer NOT NULL DEFAULT 0,  -- lower first
    -- in flight until then (NULL: released, or never claimed)
    claimed_until timestamptz"""


def _queues(n: TableNames) -> list[str]:
    """The queues (version 5): the claim index of each queue, the index of messages in
    flight, the limits of each queue, the starts of its rate window and the claim."""
    return [
        # Claim order (priority, then enqueue order); visibility is checked in the index.
        f"""CREATE INDEX IF NOT EXISTS {n.index("outbox_queue_idx")}
    ON {n.outbox} (queue, priority, id, visible_at) WHERE NOT dead""",
        f"""CREATE INDEX IF NOT EXISTS {n.index("outbox_flight_idx")}
    ON {n.outbox} (queue, claimed_until) WHERE claimed_until IS NOT NULL""",
        f"""CREATE TABLE IF NOT EXISTS {n.queue_limits} (
    queue text PRIMARY KEY,
    global_concurrency integer, worker_concurrency integer,  -- NULL: no limit
    partition_concurrency integer, rate_limit integer, partition_rate_limit integer,
    rate_period double precision NOT NULL  -- seconds
)""",
        f"""CREATE TABLE IF NOT EXISTS {n.queue_starts} (
    queue text NOT NULL, partition_key text NOT NULL,
    started_at timestamptz NOT NULL,  -- the database clock at the claim
    count integer NOT NULL  -- the partition's messages that claim started
)""",
        f"""CREATE INDEX IF NOT EXISTS {n.index("queue_starts_idx")}
    ON {n.queue_starts} (queue, started_at)""",
        _claim_function(n),
    ]


_PAGE = 16
"""The fewest messages a claim of a queue with partition limits reads (and locks) at a
time: as many as it still wants, if more."""


def _claim_function(n: TableNames) -> str:
    """The claim of up to ``want`` messages of queue ``q`` (``BaseConsumer._claim_queue``).

    A queue without a concurrency or rate limit is claimed as the outbox always was:
    its visible messages in claim order, ``FOR UPDATE SKIP LOCKED``, no lock besides.
    The claims of a queue with one take turns on its limits row (``FOR UPDATE``), and
    count what is in flight and what started only once they hold it, each count by a
    statement of its own: a function's statements read the database as of their own
    start (READ COMMITTED), so each claim sees what the claim before it took. One
    statement of a single snapshot would not: waiting for the row, it would still count
    from the snapshot taken before the wait. Messages of a full partition are skipped,
    not waited behind.
    """
    outbox, starts = n.outbox, n.queue_starts
    ready = f"""SELECT o.id, o.partition_key FROM {outbox} AS o
        WHERE o.queue = q AND NOT o.dead AND o.visible_at <= now_
        ORDER BY o.priority, o.id"""
    # The walk past full partitions reads pages in claim order, each of them bounded: a
    # query without a bound may be planned as a sort of the queue's every ready message,
    # and it would lock every row the loop prefetches, past those it takes.
    page = f"""SELECT o.id, o.partition_key, o.priority FROM {outbox} AS o
        WHERE o.queue = q AND NOT o.dead AND o.visible_at <= now_
            AND (o.priority, o.id) > (after_priority, after_id)
        ORDER BY o.priority, o.id LIMIT page_size"""
    return f"""CREATE OR REPLACE FUNCTION {n.claim}(
    q text, want integer, hide double precision, held integer)
RETURNS TABLE (id bigint, payload bytea, attempts integer, last_error text)
LANGUAGE plpgsql VOLATILE AS $claim$
#variable_conflict use_column
DECLARE
    lim {n.queue_limits}%ROWTYPE;
    counted boolean;
    rated boolean;
    now_ timestamptz;
    room integer := want;
    flying jsonb := '{{}}';
    started jsonb := '{{}}';
    total bigint;
    seen integer;
    went integer;
    taken bigint[] := '{{}}';
    fetched integer;
    page_size integer;
    after_priority integer := -1;  -- priorities are 0 or more
    after_id bigint := 0;
    keys text[] := '{{}}';
    msg record;
BEGIN
    SELECT * INTO lim FROM {n.queue_limits} AS l WHERE l.queue = q;
    counted := coalesce(lim.global_concurrency, lim.partition_concurrency, lim.rate_limit,
        lim.partition_rate_limit) IS NOT NULL;
    IF counted THEN  -- take turns, then read the limits as they are now
        SELECT * INTO lim FROM {n.queue_limits} AS l WHERE l.queue = q FOR UPDATE;
        counted := coalesce(lim.global_concurrency, lim.partition_concurrency,
            lim.rate_limit, lim.partition_rate_limit) IS NOT NULL;
    END IF;
    now_ := clock_timestamp();
    IF lim.worker_concurrency IS NOT NULL THEN
        room := least(room, lim.worker_concurrency - held);
    END IF;
    IF NOT counted THEN
        IF room > 0 THEN
            SELECT coalesce(array_agg(r.id), '{{}}') INTO taken
            FROM ({ready} LIMIT room FOR UPDATE SKIP LOCKED) AS r;
        END IF;
    ELSE
        rated := lim.rate_limit IS NOT NULL OR lim.partition_rate_limit IS NOT NULL;
        IF lim.partition_concurrency IS NOT NULL THEN
            SELECT coalesce(jsonb_object_agg(f.partition_key, f.n), '{{}}'),
                coalesce(sum(f.n), 0) INTO flying, total
            FROM (SELECT o.partition_key, count(*) AS n FROM {outbox} AS o
                WHERE o.queue = q AND o.claimed_until > now_ GROUP BY o.partition_key) AS f;
            room := least(room, lim.global_concurrency - total);
        ELSIF lim.global_concurrency IS NOT NULL THEN  -- no partition counts needed
            SELECT count(*) INTO total FROM {outbox} AS o
                WHERE o.queue = q AND o.claimed_until > now_;
            room := least(room, lim.global_concurrency - total);
        END IF;
        IF rated THEN
            DELETE FROM {starts} AS s WHERE s.queue = q
                AND s.started_at <= now_ - make_interval(secs => lim.rate_period);
            IF lim.partition_rate_limit IS NOT NULL THEN
                SELECT coalesce(jsonb_object_agg(c.partition_key, c.n), '{{}}'),
                    coalesce(sum(c.n), 0) INTO started, total
                FROM (SELECT s.partition_key, sum(s.count) AS n FROM {starts} AS s
                    WHERE s.queue = q GROUP BY s.partition_key) AS c;
            ELSE  -- no partition counts needed
                SELECT coalesce(sum(s.count), 0) INTO total FROM {starts} AS s
                    WHERE s.queue = q;
            END IF;
            room := least(room, lim.rate_limit - total);
        END IF;
        IF room > 0 AND lim.partition_concurrency IS NULL
                AND lim.partition_rate_limit IS NULL THEN
            SELECT coalesce(array_agg(r.id), '{{}}'), coalesce(array_agg(r.partition_key), '{{}}')
            INTO taken, keys FROM ({ready} LIMIT room FOR UPDATE SKIP LOCKED) AS r;
        ELSIF room > 0 THEN  -- walk past the messages of full partitions, a page at a time
            LOOP
                fetched := 0;
                page_size := greatest(room - cardinality(taken), {_PAGE});
                FOR msg IN {page} FOR UPDATE SKIP LOCKED LOOP
                    fetched := fetched + 1;
                    after_priority := msg.priority;
                    after_id := msg.id;
                    IF msg.partition_key <> '' THEN
                        seen := coalesce((flying ->> msg.partition_key)::integer, 0);
                        went := coalesce((started ->> msg.partition_key)::integer, 0);
                        CONTINUE WHEN seen >= lim.partition_concurrency
                            OR went >= lim.partition_rate_limit;
                        IF lim.partition_concurrency IS NOT NULL THEN
                            flying := jsonb_set(flying, ARRAY[msg.partition_key],
                                to_jsonb(seen + 1));
                        END IF;
                        IF lim.partition_rate_limit IS NOT NULL THEN
                            started := jsonb_set(started, ARRAY[msg.partition_key],
                                to_jsonb(went + 1));
                        END IF;
                    END IF;
                    taken := taken || msg.id;
                    keys := keys || msg.partition_key;
                    EXIT WHEN cardinality(taken) >= room;
                END LOOP;
                EXIT WHEN fetched < page_size OR cardinality(taken) >= room;
            END LOOP;
        END IF;
        IF rated AND cardinality(keys) > 0 THEN
            INSERT INTO {starts} (queue, partition_key, started_at, count)
            SELECT q, k.key, now_, count(*) FROM unnest(keys) AS k(key) GROUP BY k.key;
        END IF;
    END IF;
    IF cardinality(taken) = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH claimed AS (
        UPDATE {outbox} AS o SET attempts = o.attempts + 1,
            visible_at = now_ + make_interval(secs => hide),
            claimed_until = now_ + make_interval(secs => hide)
        WHERE o.id = ANY (taken)
        RETURNING o.id, o.payload, o.attempts, o.last_error, o.priority
    )
    SELECT c.id, c.payload, c.attempts, c.last_error FROM claimed AS c
    ORDER BY c.priority, c.id;
END
$claim$"""


def _upgrade_4_to_5(n: TableNames) -> list[str]:
    # Constant defaults and a nullable column: no table rewrite; every message stored
    # before is in the default queue, without a partition, at priority 0, not in flight.
    return [
        f"ALTER TABLE {n.outbox} ADD COLUMN IF NOT EXISTS queue text NOT NULL DEFAULT 'default', "
        "ADD COLUMN IF NOT EXISTS partition_key text NOT NULL DEFAULT '', "
        "ADD COLUMN IF NOT EXISTS priority integer NOT NULL DEFAULT 0, "
        "ADD COLUMN IF NOT EXISTS claimed_until timestamptz",
        *_queues(n),
    ]


def _upgrade_1_to_2(n: TableNames) -> list[str]:
    return [
        # The head's record lives in the history only (a v1 head always had its copy
        # there; this is a safety net).
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


def _upgrade_2_to_3(n: TableNames) -> list[str]:
    return [
        # Nullable, without a default: no table rewrite; every head starts without a timer.
        f"ALTER TABLE {n.threads} ADD COLUMN IF NOT EXISTS wake_at double precision",
        # A constant default: no table rewrite either (PostgreSQL 11+); every head starts
        # without a graph version.
        f"ALTER TABLE {n.threads} ADD COLUMN IF NOT EXISTS graph_version text NOT NULL DEFAULT ''",
        *_durable(n),
    ]


def _upgrade_5_to_6(n: TableNames) -> list[str]:
    # Nullable, without a default: no table rewrite to add it; the update that fills it
    # writes every head row once (updated_at is never negative: floor is the cast down).
    return [
        f"ALTER TABLE {n.threads} ADD COLUMN IF NOT EXISTS recent_second bigint",
        f"UPDATE {n.threads} SET recent_second = floor(updated_at)::bigint "
        "WHERE recent_second IS NULL",
        _recent_index(n),
        _claim_function(n),  # the claim that reads a partitioned queue a page at a time
    ]


UPGRADES: dict[int, Callable[[TableNames], list[str]]] = {
    1: _upgrade_1_to_2,
    2: _upgrade_2_to_3,
    3: _schedules,
    4: _upgrade_4_to_5,
    5: _upgrade_5_to_6,
}
"""``UPGRADES[n](names)``: the statements that take a schema from version n to n + 1."""


def _statements(names: TableNames, current: int) -> list[str]:
    steps = _create(names) if current == 0 else []
    for version in range(current or SCHEMA_VERSION, SCHEMA_VERSION):
        steps += UPGRADES[version](names)
    version = SCHEMA_VERSION
    return [*steps, f"INSERT INTO {names.version} VALUES ({version}) ON CONFLICT DO NOTHING"]


def schema_sql(schema: str = DEFAULT_SCHEMA, prefix: str = DEFAULT_PREFIX) -> str:
    """The DDL ``setup()`` runs on an empty database, as one SQL script (for your own
    migration tool; every statement is idempotent, the last records the version)."""
    return ";\n\n".join(_statements(TableNames(schema, prefix), 0)) + ";\n"


async def _version(conn: PgConnection, names: TableNames) -> int:
    if not await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", names.version):
        return 0
    return int(await conn.fetchval(f"SELECT max(version) FROM {names.version}") or 0)


def connector_for(target: object, names: TableNames) -> Connector:
    """A connector running statements on ``target``, a pool or a connection."""
    connector = Connector(names, acquire_timeout=60.0, domain=None)
    if isinstance(target, asyncpg.Pool):
        connector.pool = target
        return connector
    return connector.bind(cast(asyncpg.Connection, target))


async def prepare(connector: Connector, *, upgrade: bool) -> int:
    """Create the tables of a new schema; upgrade an older one only with ``upgrade``
    (else ``SchemaVersionError``); refuse a newer one. Returns the version in place."""
    names = connector.names

    async def body(conn: PgConnection) -> int:
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", names.lock_key)
            current = await _version(conn, names)
            where = f"the flowy tables in schema {names.schema!r} (prefix {names.prefix!r})"
            if BaseBackend.check_schema_version(
                current,
                known=SCHEMA_VERSION,
                where=where,
                package="flowy-postgres",
                upgrade=upgrade,
            ):
                for statement in _statements(names, current):
                    await conn.execute(statement)
            return SCHEMA_VERSION

    return await connector.run(f"set up schema {names.schema!r} (prefix {names.prefix!r})", body)


async def migrate(
    target: asyncpg.Pool | asyncpg.Connection | PoolConnectionProxy,
    *,
    schema: str = DEFAULT_SCHEMA,
    prefix: str = DEFAULT_PREFIX,
) -> int:
    """Deprecated (removed in 0.4): ``await PostgresBackend.from_pool(pool, schema=...,
    prefix=...).setup()`` creates or upgrades the tables."""
    warnings.warn(
        "flowy_postgres.migrate() is deprecated; use `await backend.setup()` "
        "(PostgresBackend.from_pool(pool, schema=..., prefix=...) for your own pool)",
        DeprecationWarning,
        stacklevel=2,
    )
    return await prepare(connector_for(target, TableNames(schema, prefix)), upgrade=True)


async def schema_version(
    target: asyncpg.Pool | asyncpg.Connection | PoolConnectionProxy,
    *,
    schema: str = DEFAULT_SCHEMA,
    prefix: str = DEFAULT_PREFIX,
) -> int:
    """The schema version recorded in the database (0 when never set up). Read-only."""
    names = TableNames(schema, prefix)
    action = f"read the schema version of {names.schema!r}"
    return await connector_for(target, names).run(action, lambda conn: _version(conn, names))
