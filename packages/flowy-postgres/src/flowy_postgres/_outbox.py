"""``PostgresOutbox`` and ``PostgresConsumer``: the outbox primitives on the outbox table.

An enqueue (or a transactional save) inserts a row unique per thread and committed
revision, with its queue route, and calls ``pg_notify`` in the same statement, so
waiting consumers wake when it commits. A claim is one call of the schema's claim
function (``_schema``): it takes rows of one queue ``FOR UPDATE SKIP LOCKED`` (consumers
never block on or double-deliver one), within the queue's limits, and hides them and
marks them in flight until ``visible_at`` and ``claimed_until`` (database clock). A waiting claim
listens on one dedicated connection and also looks again every second and when a hidden
message becomes visible, in case a notification is lost; without LISTEN it polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable, Hashable

from flowy.queues import DEFAULT_QUEUE, QueueLimits
from flowy.storage import OutboxStats
from flowy.storage.dialect import BaseConsumer, BaseOutbox, OutboxRow, QueueCounts, RawMessage
from flowy.storage.dialect import message_row_id as _row_id

from ._conn import Connector, PgConnection, Row
from ._schema import TableNames, thread_key

__all__ = ["ListenHooks", "PostgresConsumer", "PostgresOutbox"]

ListenHooks = tuple[
    Callable[[], Awaitable[PgConnection]], Callable[[PgConnection], Awaitable[None]]
]
"""``(connect, disconnect)`` of the connection a consumer LISTENs on."""

_UNTIL = "clock_timestamp() + make_interval(secs => $2::float8)"


class _Sql:
    def __init__(self, n: TableNames) -> None:
        # $1 key, $2 thread id, $3 committed revision, $4 payload, $5 queue,
        # $6 partition key, $7 priority, $8 channel. A dead letter revived keeps its route.
        self.append = f"""
WITH queued AS (
    INSERT INTO {n.outbox} AS o
        (thread_key, thread_id, committed_revision, payload, queue, partition_key, priority)
    VALUES ($1, $2::text, $3::bigint, $4::bytea, $5::text, $6::text, $7::int)
    ON CONFLICT (thread_key, committed_revision) DO UPDATE
        SET payload = EXCLUDED.payload, attempts = 0, dead = false, last_error = '',
            visible_at = clock_timestamp(), created_at = clock_timestamp(),
            claimed_until = NULL
        WHERE o.dead
    RETURNING o.id
)
SELECT pg_notify($8::text, '') FROM queued"""
        # $1 queue, $2 limit, $3 visibility timeout (s), $4 held
        self.claim = f"SELECT * FROM {n.claim}($1::text, $2::int, $3::float8, $4::int)"
        self.next_visible = f"""
SELECT extract(epoch FROM min(visible_at) - clock_timestamp())::float8
FROM {n.outbox} WHERE NOT dead"""
        self.ack = f"DELETE FROM {n.outbox} WHERE id = $1::bigint AND NOT dead"
        # $1 id, $2 delay (s), $3 error, $4 dead, $5 channel
        self.release = f"""
WITH released AS (
    UPDATE {n.outbox} SET last_error = $3::text, dead = $4::bool, visible_at = {_UNTIL},
        claimed_until = NULL
    WHERE id = $1::bigint AND NOT dead
    RETURNING dead
)
SELECT pg_notify($5::text, '') FROM released WHERE NOT dead AND $2::float8 = 0"""
        self.dead_letters = f"""
SELECT id, payload, attempts, last_error FROM {n.outbox} WHERE dead ORDER BY id LIMIT $1::bigint"""
        self.retry = f"""
WITH revived AS (
    UPDATE {n.outbox}
    SET dead = false, attempts = 0, last_error = '', visible_at = clock_timestamp(),
        created_at = clock_timestamp(), claimed_until = NULL
    WHERE id = $1::bigint AND dead
    RETURNING id
)
SELECT id, pg_notify($2::text, '') FROM revived"""
        # created_at: when the message was enqueued, or came back from the dead letters.
        self.stats = f"""
SELECT count(*) FILTER (WHERE NOT dead) AS pending,
    extract(epoch FROM min(created_at) FILTER (WHERE NOT dead))::float8 AS oldest,
    count(*) FILTER (WHERE dead) AS dead
FROM {n.outbox}"""
        # $1 queue, $2..$6 the limits (NULL: none), $7 rate period (s), $8 channel
        self.set_limits = f"""
WITH stored AS (
    INSERT INTO {n.queue_limits} AS l (queue, global_concurrency, worker_concurrency,
        partition_concurrency, rate_limit, partition_rate_limit, rate_period)
    VALUES ($1::text, $2::int, $3::int, $4::int, $5::int, $6::int, $7::float8)
    ON CONFLICT (queue) DO UPDATE SET global_concurrency = EXCLUDED.global_concurrency,
        worker_concurrency = EXCLUDED.worker_concurrency,
        partition_concurrency = EXCLUDED.partition_concurrency,
        rate_limit = EXCLUDED.rate_limit, partition_rate_limit = EXCLUDED.partition_rate_limit,
        rate_period = EXCLUDED.rate_period
    RETURNING 1
), unrated AS (  -- starts are kept only while a rate limit is set
    DELETE FROM {n.queue_starts}
    WHERE queue = $1::text AND $5::int IS NULL AND $6::int IS NULL
)
SELECT pg_notify($8::text, '') FROM stored"""
        # $1 queue, $2 channel
        self.forget_limits = f"""
WITH forgotten AS (
    DELETE FROM {n.queue_limits} WHERE queue = $1::text
), unrated AS (
    DELETE FROM {n.queue_starts} WHERE queue = $1::text
)
SELECT pg_notify($2::text, '')"""
        self.read_limits = f"""
SELECT queue, global_concurrency, worker_concurrency, partition_concurrency, rate_limit,
    partition_rate_limit, rate_period
FROM {n.queue_limits}"""
        # In flight: claimed_until is later than now; pending: every other live message.
        self.queue_counts = f"""
WITH clock AS MATERIALIZED (SELECT clock_timestamp() AS now_),
messages AS (
    SELECT o.queue, count(*) FILTER (WHERE o.claimed_until > c.now_) AS in_flight,
        count(*) FILTER (WHERE (o.claimed_until > c.now_) IS NOT TRUE) AS pending,
        extract(epoch FROM min(o.created_at)
            FILTER (WHERE (o.claimed_until > c.now_) IS NOT TRUE))::float8 AS oldest
    FROM {n.outbox} AS o, clock AS c WHERE NOT o.dead GROUP BY o.queue
), starts AS (
    SELECT s.queue, sum(s.count) AS started
    FROM {n.queue_starts} AS s JOIN {n.queue_limits} AS l ON l.queue = s.queue, clock AS c
    WHERE (l.rate_limit IS NOT NULL OR l.partition_rate_limit IS NOT NULL)
        AND s.started_at > c.now_ - make_interval(secs => l.rate_period)
    GROUP BY s.queue
)
SELECT coalesce(m.queue, s.queue) AS queue, coalesce(m.in_flight, 0) AS in_flight,
    coalesce(m.pending, 0) AS pending, m.oldest, coalesce(s.started, 0) AS started
FROM messages AS m FULL JOIN starts AS s ON s.queue = m.queue"""
        # $1 queue, $2 limit
        self.queue_messages = f"""
SELECT id, payload, attempts, last_error FROM {n.outbox}
WHERE queue = $1::text AND NOT dead ORDER BY priority, id LIMIT $2::bigint"""


class PostgresOutbox(BaseOutbox):
    """The hand-off outbox of a :class:`~flowy_postgres.PostgresBackend`:
    ``enqueue_intent`` on its own, or ``enqueue_intent_tx`` inside the checkpointer's
    ``save_with_outbox`` (the rows go into the save's own statement)."""

    def __init__(self, connector: Connector) -> None:
        self.connector = connector
        self.domain: Hashable = connector.domain
        self._sql = _Sql(connector.names)

    async def _append(self, row: OutboxRow) -> None:
        tid, route = row.thread_id, row.route
        await self.connector.execute(
            f"enqueue the hand-off of thread {tid!r:.80}",
            self._sql.append,
            *(thread_key(tid), tid, row.committed_revision, row.payload),
            *(route.queue, route.partition_key, route.priority),
            self.connector.names.channel,
        )


def _raw(rows: list[Row]) -> list[RawMessage]:
    """The messages of ``rows``, in the order the statement returned them."""
    return [
        RawMessage(str(r["id"]), bytes(r["payload"]), int(r["attempts"]), str(r["last_error"]))
        for r in rows
    ]


class PostgresConsumer(BaseConsumer):
    """Claims hand-off intents from the outbox table for ``flowy.Worker``. Waiting claims
    poll every ``poll_interval`` seconds, or, with ``listen`` (``(connect, disconnect)`` of
    a LISTEN connection opened at the first wait, closed by :meth:`aclose`), wake on each
    notification and on the loss of that connection."""

    def __init__(
        self,
        connector: Connector,
        *,
        max_attempts: int = 5,
        poll_interval: float = 0.1,
        listen: ListenHooks | None = None,
    ) -> None:
        super().__init__(max_attempts=max_attempts, poll_interval=poll_interval)
        self.connector = connector
        self.domain: Hashable = connector.domain
        self._sql = _Sql(connector.names)
        self._channel = connector.names.channel
        self._hooks = listen
        self._conn: PgConnection | None = None

    @property
    def listening(self) -> bool:
        """True while a LISTEN connection is up (waiting claims wake on notifications)."""
        return super().listening and self._conn is not None and not self._conn.is_closed()

    async def _listen(self) -> Callable[[], Awaitable[None]] | None:
        if self._hooks is None:
            return None
        conn = self._conn = await self._hooks[0]()
        try:
            conn.add_termination_listener(self._listen_lost)
            await conn.add_listener(self._channel, self._notify)
        except BaseException:
            await asyncio.shield(self._hang_up())  # never keep a half-set-up connection
            raise
        return self._hang_up

    async def _hang_up(self) -> None:
        conn, self._conn = self._conn, None
        assert self._hooks is not None and conn is not None
        # A pool warns about connections returned with listeners still attached.
        with contextlib.suppress(Exception):
            conn.remove_termination_listener(self._listen_lost)
            if not conn.is_closed():
                await conn.remove_listener(self._channel, self._notify)
        with contextlib.suppress(Exception):
            await self._hooks[1](conn)

    async def _claim(self, limit: int, visibility_timeout: float) -> list[RawMessage]:
        return await self._claim_queue(DEFAULT_QUEUE, limit, visibility_timeout, 0)

    async def _claim_queue(
        self, queue: str, limit: int, visibility_timeout: float, held: int
    ) -> list[RawMessage]:
        held = min(held, 2**31 - 1)
        args = (self._sql.claim, queue, min(limit, 10_000), visibility_timeout, held)
        return _raw(await self.connector.fetch(f"claim messages of queue {queue!r}", *args))

    async def _set_limits(self, queue: str, limits: QueueLimits | None) -> None:
        channel = self._channel
        if limits is None:
            sql, args = self._sql.forget_limits, (queue, channel)
        else:
            counts = (limits.global_concurrency, limits.worker_concurrency)
            counts += (limits.partition_concurrency, limits.rate_limit)
            counts += (limits.partition_rate_limit,)
            sql, args = self._sql.set_limits, (queue, *counts, limits.rate_period, channel)
        await self.connector.execute(f"set the limits of queue {queue!r}", sql, *args)

    async def _read_limits(self) -> dict[str, QueueLimits]:
        rows = await self.connector.fetch("read the queue limits", self._sql.read_limits, read=True)
        names = [f.name for f in dataclasses.fields(QueueLimits)]  # the columns
        return {str(r["queue"]): QueueLimits.from_json({k: r[k] for k in names}) for r in rows}

    async def _queue_counts(self) -> dict[str, QueueCounts]:
        sql = self._sql.queue_counts
        rows = await self.connector.fetch("count the queues", sql, read=True)
        return {
            str(r["queue"]): QueueCounts(
                int(r["in_flight"]),
                int(r["pending"]),
                None if r["oldest"] is None else float(r["oldest"]),
                int(r["started"]),
            )
            for r in rows
        }

    async def _queue_messages(self, queue: str, limit: int) -> list[RawMessage]:
        sql, action = self._sql.queue_messages, f"list the messages of queue {queue!r}"
        return _raw(await self.connector.fetch(action, sql, queue, limit, read=True))

    async def _next_visible(self) -> float | None:
        row = await self.connector.fetchrow("check the outbox", self._sql.next_visible, read=True)
        return None if row is None or row[0] is None else float(row[0])

    async def _ack(self, message_id: str) -> None:
        if (row_id := _row_id(message_id)) is not None:
            await self.connector.execute(f"ack outbox message {row_id}", self._sql.ack, row_id)

    async def _release(self, message_id: str, *, error: str, delay: float, dead: bool) -> None:
        if (row_id := _row_id(message_id)) is not None:
            args = (self._sql.release, row_id, delay, error, dead, self._channel)
            await self.connector.execute(f"release outbox message {row_id}", *args)

    async def _dead_letters(self, limit: int) -> list[RawMessage]:
        sql = self._sql.dead_letters
        return _raw(await self.connector.fetch("list outbox dead letters", sql, limit, read=True))

    async def _retry_dead_letter(self, message_id: str) -> bool:
        if (row_id := _row_id(message_id)) is None:
            return False
        args = (self._sql.retry, row_id, self._channel)
        return await self.connector.fetchrow(f"retry dead letter {row_id}", *args) is not None

    async def _stats(self) -> OutboxStats:
        row = await self.connector.fetchrow("read the outbox backlog", self._sql.stats, read=True)
        assert row is not None
        oldest = row["oldest"]
        return OutboxStats(
            int(row["pending"]), None if oldest is None else float(oldest), int(row["dead"])
        )
