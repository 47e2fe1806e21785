"""``PostgresOutbox`` and ``PostgresConsumer``: the outbox primitives on the outbox table.

An enqueue (or a transactional save) inserts a row unique per thread and committed
revision and calls ``pg_notify`` in the same statement, so waiting consumers wake when
it commits. Claims take rows ``FOR UPDATE SKIP LOCKED`` (consumers never block on or
double-deliver one) and hide them until ``visible_at`` (database clock). A waiting claim
listens on one dedicated connection and also looks again every second and when a hidden
message becomes visible, in case a notification is lost; without LISTEN it polls.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Hashable

from flowy.storage import OutboxStats
from flowy.storage.dialect import BaseConsumer, BaseOutbox, OutboxRow, RawMessage
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
        # $1 key, $2 thread id, $3 committed revision, $4 payload, $5 channel
        self.append = f"""
WITH queued AS (
    INSERT INTO {n.outbox} AS o (thread_key, thread_id, committed_revision, payload)
    VALUES ($1, $2::text, $3::bigint, $4::bytea)
    ON CONFLICT (thread_key, committed_revision) DO UPDATE
        SET payload = EXCLUDED.payload, attempts = 0, dead = false, last_error = '',
            visible_at = clock_timestamp(), created_at = clock_timestamp()
        WHERE o.dead
    RETURNING o.id
)
SELECT pg_notify($5::text, '') FROM queued"""
        # $1 limit, $2 visibility timeout (s)
        self.claim = f"""
WITH ready AS (
    SELECT id FROM {n.outbox} WHERE NOT dead AND visible_at <= clock_timestamp()
    ORDER BY visible_at, id LIMIT $1::int FOR UPDATE SKIP LOCKED
)
UPDATE {n.outbox} AS o SET attempts = o.attempts + 1, visible_at = {_UNTIL}
FROM ready WHERE o.id = ready.id
RETURNING o.id, o.payload, o.attempts, o.last_error"""
        self.next_visible = f"""
SELECT extract(epoch FROM min(visible_at) - clock_timestamp())::float8
FROM {n.outbox} WHERE NOT dead"""
        self.ack = f"DELETE FROM {n.outbox} WHERE id = $1::bigint AND NOT dead"
        # $1 id, $2 delay (s), $3 error, $4 dead, $5 channel
        self.release = f"""
WITH released AS (
    UPDATE {n.outbox} SET last_error = $3::text, dead = $4::bool, visible_at = {_UNTIL}
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
        created_at = clock_timestamp()
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


class PostgresOutbox(BaseOutbox):
    """The hand-off outbox of a :class:`~flowy_postgres.PostgresBackend`:
    ``enqueue_intent`` on its own, or ``enqueue_intent_tx`` inside the checkpointer's
    ``save_with_outbox`` (the rows go into the save's own statement)."""

    def __init__(self, connector: Connector) -> None:
        self.connector = connector
        self.domain: Hashable = connector.domain
        self._sql = _Sql(connector.names)

    async def _append(self, row: OutboxRow) -> None:
        tid = row.thread_id
        await self.connector.execute(
            f"enqueue the hand-off of thread {tid!r:.80}",
            self._sql.append,
            *(thread_key(tid), tid, row.committed_revision, row.payload),
            self.connector.names.channel,
        )


def _raw(rows: list[Row]) -> list[RawMessage]:
    return [
        RawMessage(str(r["id"]), bytes(r["payload"]), int(r["attempts"]), str(r["last_error"]))
        for r in sorted(rows, key=lambda r: int(r["id"]))
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
        args = (self._sql.claim, min(limit, 10_000), visibility_timeout)
        return _raw(await self.connector.fetch("claim outbox messages", *args))

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
