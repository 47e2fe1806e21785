"""``PostgresOutbox`` and ``PostgresConsumer``: the outbox primitives on the outbox table.

An enqueue inserts one row, unique per thread and committed revision (a live message
is left as it is; a dead-lettered one comes back to life), and calls ``pg_notify`` in
the same statement, so a waiting consumer wakes when the row commits and not before. A
transactional save writes its rows in its own statement (see ``_checkpointer``).

Consumers claim with ``FOR UPDATE SKIP LOCKED`` (concurrent consumers never block on or
double-deliver a row), hide what they claimed until ``visible_at`` (database clock) and
count deliveries in ``attempts``. A waiting claim listens on the notification channel
over one dedicated connection and also looks again at least every second and when the
next hidden message becomes visible, so it works when notifications are lost or
unavailable (``listen=False``, as behind a transaction-mode pooler: then it polls).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import Awaitable, Callable

from flowy.storage import BaseConsumer, BaseOutbox, OutboxRow, RawMessage

from ._conn import Connector, PgConnection, Row
from ._schema import TableNames, thread_key

__all__ = ["ListenHooks", "PostgresConsumer", "PostgresOutbox"]

ListenHooks = tuple[
    Callable[[], Awaitable[PgConnection]], Callable[[PgConnection], Awaitable[None]]
]
"""``(connect, disconnect)`` of the connection a consumer LISTENs on."""

_log = logging.getLogger("flowy_postgres")
_MAX_BATCH = 10_000
_LISTEN_POLL = 1.0
"""Seconds between looks at the outbox while listening (in case a notification is lost)."""


class _Sql:
    def __init__(self, n: TableNames) -> None:
        self.append = f"""
WITH queued AS (
    INSERT INTO {n.outbox} AS o (thread_key, thread_id, committed_revision, payload)
    VALUES ($1, $2::text, $3::bigint, $4::bytea)
    ON CONFLICT (thread_key, committed_revision) DO UPDATE
        SET payload = EXCLUDED.payload, attempts = 0, dead = false, last_error = '',
            visible_at = clock_timestamp()
        WHERE o.dead
    RETURNING o.id
)
SELECT pg_notify($5::text, '') FROM queued
"""
        self.claim = f"""
WITH ready AS (
    SELECT id FROM {n.outbox}
    WHERE NOT dead AND visible_at <= clock_timestamp()
    ORDER BY visible_at, id LIMIT $1::int
    FOR UPDATE SKIP LOCKED
)
UPDATE {n.outbox} AS o
SET attempts = o.attempts + 1, visible_at = clock_timestamp() + make_interval(secs => $2::float8)
FROM ready WHERE o.id = ready.id
RETURNING o.id, o.payload, o.attempts, o.last_error
"""
        self.next_visible = f"""
SELECT extract(epoch FROM min(visible_at) - clock_timestamp())::float8
FROM {n.outbox} WHERE NOT dead
"""
        self.ack = f"DELETE FROM {n.outbox} WHERE id = $1::bigint AND NOT dead"
        # $1 id, $2 error, $3 delay (s), $4 dead, $5 channel
        self.release = f"""
WITH released AS (
    UPDATE {n.outbox}
    SET last_error = $2::text, dead = $4::bool,
        visible_at = clock_timestamp() + make_interval(secs => $3::float8)
    WHERE id = $1::bigint AND NOT dead
    RETURNING dead
)
SELECT pg_notify($5::text, '') FROM released WHERE NOT dead AND $3::float8 = 0
"""
        self.dead_letters = f"""
SELECT id, payload, attempts, last_error FROM {n.outbox} WHERE dead ORDER BY id LIMIT $1::bigint
"""
        self.retry = f"""
WITH revived AS (
    UPDATE {n.outbox}
    SET dead = false, attempts = 0, last_error = '', visible_at = clock_timestamp()
    WHERE id = $1::bigint AND dead
    RETURNING id
)
SELECT id, pg_notify($2::text, '') FROM revived
"""


_cache: dict[TableNames, _Sql] = {}


def _sql(names: TableNames) -> _Sql:
    if (sql := _cache.get(names)) is None:
        sql = _cache[names] = _Sql(names)
    return sql


class PostgresOutbox(BaseOutbox):
    """The hand-off outbox of a :class:`~flowy_postgres.PostgresBackend`:
    ``enqueue_intent`` on its own, or ``enqueue_intent_tx`` inside the checkpointer's
    ``save_with_outbox`` (the rows go into the save's own statement)."""

    def __init__(self, connector: Connector) -> None:
        self.connector = connector
        self.domain = connector.domain
        self._sql = _sql(connector.names)

    async def _append(self, row: OutboxRow) -> None:
        action = f"enqueue the hand-off of thread {row.thread_id!r:.80}"
        args = (thread_key(row.thread_id), row.thread_id, row.committed_revision, row.payload)
        async with self.connector.connection(action) as conn:
            await conn.execute(self._sql.append, *args, self.connector.names.channel)


class _Listener:
    """One LISTEN connection shared by the waiting claims of one consumer.

    Each notification (and the loss of the connection) bumps ``generation`` and sets
    the current event, installing a fresh one, so every claim waiting then wakes up.
    """

    retry_after = 5.0
    """Seconds before listening is tried again after a failure (polling meanwhile)."""

    def __init__(
        self,
        channel: str,
        connect: Callable[[], Awaitable[PgConnection]],
        disconnect: Callable[[PgConnection], Awaitable[None]],
    ) -> None:
        self._channel = channel
        self._connect = connect
        self._disconnect = disconnect
        self._conn: PgConnection | None = None
        self._event = asyncio.Event()
        self._lock = asyncio.Lock()
        self._failed_at: float | None = None
        self._closed = False
        self.generation = 0

    @property
    def listening(self) -> bool:
        conn = self._conn
        return conn is not None and not conn.is_closed()

    def _wake(self, *_: object) -> None:
        self.generation += 1
        event, self._event = self._event, asyncio.Event()
        event.set()

    def _lost(self, *_: object) -> None:
        self._conn = None
        self._wake()

    async def wait(self, generation: int, seconds: float) -> None:
        """Wait up to ``seconds`` unless a notification came after ``generation``."""
        if self.generation == generation:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), seconds)

    async def start(self) -> bool:
        """Listen if not yet listening; False (poll instead) if that fails."""
        if self.listening:
            return True
        loop = asyncio.get_running_loop()
        if self._closed or (
            self._failed_at is not None and loop.time() - self._failed_at < self.retry_after
        ):
            return False
        async with self._lock:
            if self.listening:
                return True
            conn: PgConnection | None = None
            try:
                conn = await self._connect()
                conn.add_termination_listener(self._lost)
                await conn.add_listener(self._channel, self._wake)
            except BaseException as exc:
                if conn is not None:
                    # Never keep a half-set-up connection, even when cancelled here.
                    await asyncio.shield(self._hang_up(conn))
                if not isinstance(exc, Exception):
                    raise
                self._failed_at = loop.time()
                _log.warning(
                    "flowy_postgres: cannot LISTEN on %r (%s: %s); polling instead",
                    self._channel,
                    type(exc).__name__,
                    exc,
                )
                return False
            self._conn = conn
            self._failed_at = None
            return True

    async def close(self) -> None:
        self._closed = True
        async with self._lock:
            conn, self._conn = self._conn, None
            if conn is not None:
                await self._hang_up(conn)
        self._wake()

    async def _hang_up(self, conn: PgConnection) -> None:
        # A pool warns about connections returned with listeners still attached.
        with contextlib.suppress(Exception):
            conn.remove_termination_listener(self._lost)
            if not conn.is_closed():
                await conn.remove_listener(self._channel, self._wake)
        with contextlib.suppress(Exception):
            await self._disconnect(conn)


_seen: contextvars.ContextVar[int | None] = contextvars.ContextVar("flowy_pg_seen", default=None)
"""The listener generation the current task saw before its last claim query."""


class PostgresConsumer(BaseConsumer):
    """Claims hand-off intents from the outbox table for ``flowy.Worker``.

    ``listen`` is how a waiting claim learns of new messages: ``None`` polls every
    ``poll_interval`` seconds; otherwise it is ``(connect, disconnect)`` for one
    dedicated LISTEN connection, opened at the first waiting claim and closed by
    :meth:`aclose` (the backend does that).
    """

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
        self.domain = connector.domain
        self._sql = _sql(connector.names)
        self._channel = connector.names.channel
        self._listener = None if listen is None else _Listener(self._channel, *listen)

    @property
    def listening(self) -> bool:
        """True while a LISTEN connection is up (waiting claims wake on notifications)."""
        return self._listener is not None and self._listener.listening

    async def aclose(self) -> None:
        """Stop listening (closing or returning its connection)."""
        if self._listener is not None:
            await self._listener.close()

    async def _claim(self, limit: int, visibility_timeout: float) -> list[RawMessage]:
        listener = self._listener
        _seen.set(listener.generation if listener is not None and listener.listening else None)
        async with self.connector.connection("claim outbox messages") as conn:
            rows = await conn.fetch(self._sql.claim, min(limit, _MAX_BATCH), visibility_timeout)
        return [
            RawMessage(str(r["id"]), bytes(r["payload"]), int(r["attempts"]), str(r["last_error"]))
            for r in sorted(rows, key=lambda r: int(r["id"]))
        ]

    async def _wait(self, seconds: float) -> None:
        listener, seen = self._listener, _seen.get()
        _seen.set(None)
        if listener is not None and seen is None and await listener.start():
            return  # listening from now on: look once more, then wait for news
        listening = listener is not None and listener.listening and seen is not None

        async def query(conn: PgConnection) -> object:
            return await conn.fetchval(self._sql.next_visible)

        pause = min(seconds, _LISTEN_POLL if listening else self.poll_interval)
        due = await self.connector.read("check the outbox", query)
        if isinstance(due, float):
            pause = min(pause, max(due, 0.0) + 0.005)
        if listening:
            assert listener is not None and seen is not None
            await listener.wait(seen, pause)
        else:
            await asyncio.sleep(pause)

    async def _ack(self, message_id: str) -> None:
        if (row_id := _row_id(message_id)) is not None:
            async with self.connector.connection(f"ack outbox message {row_id}") as conn:
                await conn.execute(self._sql.ack, row_id)

    async def _release(self, message_id: str, *, error: str, delay: float, dead: bool) -> None:
        if (row_id := _row_id(message_id)) is not None:
            async with self.connector.connection(f"release outbox message {row_id}") as conn:
                await conn.execute(self._sql.release, row_id, error, delay, dead, self._channel)

    async def _dead_letters(self, limit: int) -> list[RawMessage]:
        async def query(conn: PgConnection) -> list[Row]:
            return await conn.fetch(self._sql.dead_letters, limit)

        rows = await self.connector.read("list outbox dead letters", query)
        return [
            RawMessage(str(r["id"]), bytes(r["payload"]), int(r["attempts"]), str(r["last_error"]))
            for r in rows
        ]

    async def _retry_dead_letter(self, message_id: str) -> bool:
        if (row_id := _row_id(message_id)) is None:
            return False
        async with self.connector.connection(f"retry dead letter {row_id}") as conn:
            return await conn.fetchrow(self._sql.retry, row_id, self._channel) is not None


def _row_id(message_id: str) -> int | None:
    """The outbox row id of a message id, or ``None`` for ids this store never made."""
    if not (message_id.isascii() and message_id.isdigit()):
        return None
    value = int(message_id)
    return value if 0 < value < 2**63 else None
