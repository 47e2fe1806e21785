"""``PostgresOutbox`` (enqueue, alone or inside a checkpoint's transaction) and
``PostgresOutboxConsumer`` (claim / ack / release / dead letters).

Each enqueue inserts one row, unique per thread and committed revision (enqueuing the
same intent again while it is pending is a no-op; re-enqueuing a dead-lettered one
revives it), and calls ``pg_notify`` in the same transaction, so a waiting consumer
wakes when the row commits and not before.

Consumers claim with ``FOR UPDATE SKIP LOCKED`` (concurrent consumers never block on or
double-deliver a row), hide what they claimed until ``visible_at`` (database clock) and
count deliveries in ``attempts``. A message delivered ``max_attempts`` times without an
ack is dead-lettered when released or when its last claim times out. A waiting claim
listens on the notification channel over one dedicated connection and also polls, so it
works when notifications are lost or unavailable (through a transaction-mode pooler).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import uuid
from collections.abc import Awaitable, Callable
from functools import lru_cache
from typing import Any, Self, cast

import asyncpg

from flowy.checkpoint import (
    HandoffIntent,
    OutboxMessage,
    decode_intent,
    encode_intent,
    validate_thread_id,
)

from ._checkpointer import PostgresTransaction
from ._conn import PgComponent, PgConnection, Row, create_pool
from ._errors import show_id, translated
from ._schema import DEFAULT_PREFIX, DEFAULT_SCHEMA, TableNames, thread_key

__all__ = ["PostgresOutbox", "PostgresOutboxConsumer"]

_log = logging.getLogger("flowy_postgres")
_MAX_BATCH = 10_000


class _Sql:
    def __init__(self, n: TableNames) -> None:
        self.enqueue = f"""
WITH queued AS (
    INSERT INTO {n.outbox} AS o (thread_key, thread_id, committed_revision, payload)
    VALUES ($1, $2::text, $3::bigint, $4::bytea)
    ON CONFLICT (thread_key, committed_revision) DO UPDATE
        SET payload = EXCLUDED.payload, attempts = 0, dead = false, claimed_by = NULL,
            last_error = NULL, visible_at = clock_timestamp()
        WHERE o.dead
    RETURNING o.id
)
SELECT pg_notify($5::text, '') FROM queued
"""
        # $1 limit, $2 visibility timeout (s), $3 consumer id, $4 max attempts.
        self.claim = f"""
WITH ready AS (
    SELECT id, attempts FROM {n.outbox}
    WHERE NOT dead AND visible_at <= clock_timestamp()
    ORDER BY visible_at, id
    LIMIT $1::int
    FOR UPDATE SKIP LOCKED
), expired AS (
    UPDATE {n.outbox} AS o
    SET dead = true, claimed_by = NULL,
        last_error = coalesce(o.last_error || '; ', '')
            || 'delivery ' || o.attempts || ' was not acknowledged in time'
    FROM ready
    WHERE o.id = ready.id AND ready.attempts >= $4::int
    RETURNING o.id
), claimed AS (
    UPDATE {n.outbox} AS o
    SET attempts = o.attempts + 1, claimed_by = $3::text,
        visible_at = clock_timestamp() + make_interval(secs => $2::float8)
    FROM ready
    WHERE o.id = ready.id AND ready.attempts < $4::int
    RETURNING o.id, o.payload, o.attempts
)
SELECT id, payload, attempts FROM claimed
UNION ALL
SELECT id, NULL, NULL FROM expired
"""
        self.next_visible = f"""
SELECT extract(epoch FROM min(visible_at) - clock_timestamp())::float8
FROM {n.outbox} WHERE NOT dead
"""
        self.poison = f"""
UPDATE {n.outbox} SET dead = true, claimed_by = NULL, last_error = $2::text
WHERE id = $1::bigint
"""
        self.ack = f"""
DELETE FROM {n.outbox} WHERE id = $1::bigint
"""
        self.release = f"""
WITH released AS (
    UPDATE {n.outbox}
    SET last_error = nullif($2::text, ''), claimed_by = NULL,
        dead = attempts >= $3::int,
        visible_at = CASE WHEN attempts >= $3::int THEN visible_at
                          ELSE clock_timestamp() END
    WHERE id = $1::bigint AND NOT dead
    RETURNING dead
)
SELECT pg_notify($4::text, '') FROM released WHERE NOT dead
"""
        self.dead_letters = f"""
SELECT id, payload, attempts FROM {n.outbox} WHERE dead ORDER BY id LIMIT $1::bigint
"""
        self.retry = f"""
WITH revived AS (
    UPDATE {n.outbox}
    SET dead = false, attempts = 0, claimed_by = NULL, visible_at = clock_timestamp()
    WHERE id = $1::bigint AND dead
    RETURNING id
)
SELECT id, pg_notify($2::text, '') FROM revived
"""


@lru_cache(maxsize=64)
def _sql(names: TableNames) -> _Sql:
    return _Sql(names)


def _enqueue_args(intent: HandoffIntent, channel: str) -> tuple[object, ...]:
    thread_id = validate_thread_id(intent.thread_id)
    return (
        thread_key(thread_id),
        thread_id,
        intent.committed_snapshot_revision,
        encode_intent(intent),
        channel,
    )


class PostgresOutbox(PgComponent):
    """The hand-off outbox table: ``enqueue_intent`` on its own, or
    ``enqueue_intent_tx`` inside ``PostgresCheckpointer.save_with_outbox``."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        schema: str = DEFAULT_SCHEMA,
        prefix: str = DEFAULT_PREFIX,
        acquire_timeout: float = 10.0,
    ) -> None:
        self.names = TableNames(schema, prefix)
        super().__init__(pool, acquire_timeout=acquire_timeout)
        self._sql = _sql(self.names)

    @classmethod
    async def from_dsn(
        cls,
        dsn: str,
        *,
        schema: str = DEFAULT_SCHEMA,
        prefix: str = DEFAULT_PREFIX,
        acquire_timeout: float = 10.0,
        pooler_mode: bool = False,
        min_size: int = 1,
        max_size: int = 10,
    ) -> Self:
        """An outbox on a pool of its own (closed by :meth:`close`)."""
        pool = await create_pool(dsn, pooler_mode=pooler_mode, min_size=min_size, max_size=max_size)
        outbox = cls(pool, schema=schema, prefix=prefix, acquire_timeout=acquire_timeout)
        return outbox._owning_pool()

    async def enqueue_intent(self, intent: HandoffIntent) -> None:
        """Durably enqueue ``intent`` (committed when this returns) and wake consumers."""
        args = _enqueue_args(intent, self.names.channel)
        action = f"enqueue the hand-off of thread {show_id(intent.thread_id)}"
        async with self._connector.connection(action) as conn:
            await conn.execute(self._sql.enqueue, *args)

    async def enqueue_intent_tx(self, tx: object, intent: HandoffIntent) -> None:
        """Enqueue ``intent`` inside ``tx``, the :class:`PostgresTransaction` that
        ``PostgresCheckpointer.save_with_outbox`` passed: it commits with the checkpoint."""
        if not isinstance(tx, PostgresTransaction):
            raise TypeError(
                f"PostgresOutbox.enqueue_intent_tx needs the PostgresTransaction handle of "
                f"PostgresCheckpointer.save_with_outbox, got {type(tx).__name__}"
            )
        args = _enqueue_args(intent, self.names.channel)
        conn = cast(PgConnection, tx.connection)
        with translated(f"enqueue the hand-off of thread {show_id(intent.thread_id)}", conn):
            await conn.execute(self._sql.enqueue, *args)


class _Listener:
    """One LISTEN connection shared by the waiting claims of one consumer.

    Each notification (and the loss of the connection) sets the current event and
    installs a fresh one, so every claim waiting at that moment wakes up.
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

    @property
    def listening(self) -> bool:
        conn = self._conn
        return conn is not None and not conn.is_closed()

    def event(self) -> asyncio.Event:
        """The event the next notification sets (take it before querying)."""
        return self._event

    def _wake(self, *_: object) -> None:
        event, self._event = self._event, asyncio.Event()
        event.set()

    def _lost(self, *_: object) -> None:
        self._conn = None
        self._wake()

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
                # Listening is an optimisation: poll instead.
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
        # A pool warns about (and flowy's tests fail on) connections returned with
        # listeners still attached.
        with contextlib.suppress(Exception):
            conn.remove_termination_listener(self._lost)
            if not conn.is_closed():
                await conn.remove_listener(self._channel, self._wake)
        with contextlib.suppress(Exception):
            await self._disconnect(conn)


class PostgresOutboxConsumer(PgComponent):
    """Claims hand-off intents from the outbox table for ``flowy.Worker``.

    ``max_attempts`` deliveries without an ack dead-letter a message. A claim with
    ``wait > 0`` listens for notifications on one dedicated connection (from
    ``listen_connect`` if given, else held from the pool until :meth:`close`) and polls
    every ``listen_poll_interval`` seconds as well, or only polls (every
    ``poll_interval`` seconds) when ``listen=False``: use that behind a
    transaction-mode pooler, where LISTEN does not work, unless ``listen_connect`` opens
    a direct connection to the server. Call :meth:`close` before closing the pool: a
    pool waits for the connection the listener holds.
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        schema: str = DEFAULT_SCHEMA,
        prefix: str = DEFAULT_PREFIX,
        max_attempts: int = 5,
        consumer_id: str | None = None,
        listen: bool = True,
        listen_connect: Callable[[], Awaitable[asyncpg.Connection]] | None = None,
        poll_interval: float = 0.1,
        listen_poll_interval: float = 1.0,
        acquire_timeout: float = 10.0,
    ) -> None:
        attempts = cast(object, max_attempts)
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
            raise ValueError(f"max_attempts must be an int >= 1, got {max_attempts!r}")
        for name, value in (
            ("poll_interval", poll_interval),
            ("listen_poll_interval", listen_poll_interval),
        ):
            if not value > 0:
                raise ValueError(f"{name} must be positive seconds, got {value!r}")
        self.names = TableNames(schema, prefix)
        self.max_attempts = max_attempts
        self.consumer_id = consumer_id or f"consumer-{uuid.uuid4().hex[:12]}"
        self.poll_interval = poll_interval
        self.listen_poll_interval = listen_poll_interval
        super().__init__(pool, acquire_timeout=acquire_timeout)
        self._sql = _sql(self.names)
        self._listener: _Listener | None = None
        if listen:
            if listen_connect is not None:
                connect_direct = cast(Callable[[], Awaitable[PgConnection]], listen_connect)

                async def close_direct(conn: PgConnection) -> None:
                    await conn.close()

                self._listener = _Listener(self.names.channel, connect_direct, close_direct)
            else:
                self._listener = _Listener(
                    self.names.channel,
                    lambda: self._connector.acquire("listen for outbox notifications"),
                    self._connector.release,
                )

    @classmethod
    async def from_dsn(
        cls,
        dsn: str,
        *,
        schema: str = DEFAULT_SCHEMA,
        prefix: str = DEFAULT_PREFIX,
        max_attempts: int = 5,
        consumer_id: str | None = None,
        acquire_timeout: float = 10.0,
        pooler_mode: bool = False,
        listen_dsn: str | None = None,
        min_size: int = 1,
        max_size: int = 10,
    ) -> Self:
        """A consumer on a pool of its own (closed by :meth:`close`).

        It listens on a dedicated connection to ``listen_dsn`` (default: ``dsn``, or
        none with ``pooler_mode=True``: then it polls).
        """
        pool = await create_pool(dsn, pooler_mode=pooler_mode, min_size=min_size, max_size=max_size)
        target = listen_dsn if listen_dsn is not None else (None if pooler_mode else dsn)
        connect: Callable[[], Awaitable[asyncpg.Connection]] | None = None
        if target is not None:
            driver: Any = asyncpg  # asyncpg's own signatures are untyped
            direct = cast(Callable[..., Awaitable[asyncpg.Connection]], driver.connect)
            dsn_to_listen = target

            def connect_direct() -> Awaitable[asyncpg.Connection]:
                return direct(dsn_to_listen, statement_cache_size=0)

            connect = connect_direct

        consumer = cls(
            pool,
            schema=schema,
            prefix=prefix,
            max_attempts=max_attempts,
            consumer_id=consumer_id,
            listen=connect is not None,
            listen_connect=connect,
            acquire_timeout=acquire_timeout,
        )
        return consumer._owning_pool()

    @property
    def listening(self) -> bool:
        """True while a LISTEN connection is up (waiting claims wake on notifications)."""
        return self._listener is not None and self._listener.listening

    async def close(self) -> None:
        """Stop listening (returning or closing its connection); close the pool if
        :meth:`from_dsn` created it."""
        if self._listener is not None:
            await self._listener.close()
        await super().close()

    async def _claim_once(
        self, limit: int, visibility_timeout: float
    ) -> tuple[list[OutboxMessage], bool]:
        """Claimed messages, and whether rows were dead-lettered instead of delivered."""
        async with self._connector.connection("claim outbox messages") as conn:
            rows = await conn.fetch(
                self._sql.claim,
                min(limit, _MAX_BATCH),
                visibility_timeout,
                self.consumer_id,
                self.max_attempts,
            )
            messages: list[OutboxMessage] = []
            skipped = False
            for row in sorted(rows, key=lambda r: int(r["id"])):
                if row["payload"] is None:
                    skipped = True
                    continue
                message = await self._message(conn, row)
                if message is None:
                    skipped = True
                else:
                    messages.append(message)
            return messages, skipped

    async def _message(self, conn: PgConnection, row: Row) -> OutboxMessage | None:
        try:
            intent = decode_intent(bytes(row["payload"]))
        except ValueError as exc:
            # A payload no consumer can read would be redelivered forever.
            await conn.execute(self._sql.poison, row["id"], f"undecodable payload: {exc}")
            _log.error("flowy_postgres: outbox message %s is malformed (%s)", row["id"], exc)
            return None
        return OutboxMessage(str(row["id"]), intent, int(row["attempts"]))

    async def _next_visible(self) -> float | None:
        async def query(conn: PgConnection) -> Any:
            return await conn.fetchval(self._sql.next_visible)

        value = await self._connector.read("check the outbox", query)
        return None if value is None else max(float(value), 0.0)

    async def claim(
        self, limit: int, visibility_timeout: float, wait: float = 0.0
    ) -> list[OutboxMessage]:
        """Claim up to ``limit`` messages, hidden for ``visibility_timeout`` seconds;
        with ``wait`` > 0, wait up to that long for one to arrive."""
        timeout = cast(object, visibility_timeout)
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not math.isfinite(timeout)
            or timeout <= 0
        ):
            raise ValueError(
                f"visibility_timeout must be a positive, finite number of seconds, got "
                f"{visibility_timeout!r}"
            )
        if limit <= 0:
            return []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(wait, 0.0)
        listener = self._listener if wait > 0 else None
        while True:
            listening = listener is not None and await listener.start()
            wakeup = listener.event() if listener is not None else None
            messages, skipped = await self._claim_once(limit, float(visibility_timeout))
            if messages:
                return messages
            if skipped:
                continue
            remaining = deadline - loop.time()
            if remaining <= 0:
                return []
            pause = self.listen_poll_interval if listening else self.poll_interval
            next_visible = await self._next_visible()
            if next_visible is not None:
                pause = min(pause, next_visible + 0.005)
            pause = min(pause, remaining)
            if wakeup is None:
                await asyncio.sleep(pause)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wakeup.wait(), timeout=pause)

    async def ack(self, message: OutboxMessage) -> None:
        """Delete the message for good (acking an unknown or acked message is a no-op)."""
        message_id = _parse_id(message.message_id)
        if message_id is None:
            return
        async with self._connector.connection(f"ack outbox message {message_id}") as conn:
            await conn.execute(self._sql.ack, message_id)

    async def release(self, message: OutboxMessage, *, error: str = "") -> None:
        """Make the message claimable again at once, or dead-letter it once it has been
        delivered ``max_attempts`` times; ``error`` is kept as its last error."""
        message_id = _parse_id(message.message_id)
        if message_id is None:
            return
        async with self._connector.connection(f"release outbox message {message_id}") as conn:
            await conn.execute(
                self._sql.release, message_id, error, self.max_attempts, self.names.channel
            )

    async def dead_letters(self, limit: int = 100) -> list[OutboxMessage]:
        """Dead-lettered messages, oldest first (``attempts`` as when they died)."""
        if limit <= 0:
            return []

        async def query(conn: PgConnection) -> list[Row]:
            return await conn.fetch(self._sql.dead_letters, limit)

        rows = await self._connector.read("list outbox dead letters", query)
        out: list[OutboxMessage] = []
        for row in rows:
            try:
                intent = decode_intent(bytes(row["payload"]))
            except ValueError:
                continue  # a malformed payload; its last_error column says why
            out.append(OutboxMessage(str(row["id"]), intent, int(row["attempts"])))
        return out

    async def retry_dead_letter(self, message_id: str) -> None:
        """Move a dead letter back to the outbox with its attempts reset; ``KeyError``
        if ``message_id`` is not a dead letter."""
        parsed = _parse_id(message_id)
        if parsed is None:
            raise KeyError(f"no dead letter with id {message_id!r}")
        async with self._connector.connection(f"retry dead letter {parsed}") as conn:
            row = await conn.fetchrow(self._sql.retry, parsed, self.names.channel)
        if row is None:
            raise KeyError(f"no dead letter with id {message_id!r}")


def _parse_id(message_id: str) -> int | None:
    try:
        value = int(message_id)
    except (TypeError, ValueError):
        return None
    return value if 0 < value < 2**63 else None
