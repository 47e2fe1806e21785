"""The hand-off outbox stored in the SQLite file (table ``flowy_outbox``) and its consumer.

One row per intent, unique per (thread, committed revision): enqueueing the same intent
again keeps one message (and revives it if it was dead-lettered). A claim hides rows for
the visibility timeout and counts the delivery; rows delivered ``max_attempts`` times
without an ack move to the dead letters. Consumers in other processes see new rows by
polling; in this process an enqueue also wakes them at once.
"""

from __future__ import annotations

import sqlite3
import time

from ._checkpoint import HandoffIntent, OutboxMessage, decode_intent, encode_intent
from ._sqlite_db import SQLiteDatabase, SQLiteResource, SQLiteTransaction, StrPath, immediate

__all__ = ["SQLiteOutbox"]

_UPSERT = (
    "INSERT INTO flowy_outbox (thread_id, committed_revision, payload, created_at) "
    "VALUES (?, ?, ?, ?) ON CONFLICT (thread_id, committed_revision) DO UPDATE SET "
    "payload = excluded.payload, "
    "attempts = CASE WHEN dead THEN 0 ELSE attempts END, "
    "visible_at = CASE WHEN dead THEN 0 ELSE visible_at END, "
    "error = CASE WHEN dead THEN '' ELSE error END, "
    "dead = 0"
)


def _message_id(message_id: str) -> int | None:
    try:
        return int(message_id)
    except ValueError:
        return None


class SQLiteOutbox(SQLiteResource):
    """Hand-off outbox and consumer in a SQLite file (transactional with a
    ``SQLiteCheckpointer`` on the same :class:`SQLiteDatabase`).

    Args:
        database: a path, or the ``SQLiteDatabase`` shared with the checkpointer.
        max_attempts: deliveries without an ack before a message is dead-lettered.
        poll_interval: seconds between looks at the table while ``claim`` waits.
    """

    def __init__(
        self,
        database: StrPath | SQLiteDatabase,
        *,
        max_attempts: int = 5,
        poll_interval: float = 0.05,
    ) -> None:
        super().__init__(database)
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts!r}")
        if poll_interval <= 0:
            raise ValueError(f"poll_interval must be positive, got {poll_interval!r}")
        self.max_attempts = max_attempts
        self.poll_interval = poll_interval

    def _insert(self, conn: sqlite3.Connection, intent: HandoffIntent) -> None:
        conn.execute(
            _UPSERT,
            (
                intent.thread_id,
                intent.committed_snapshot_revision,
                encode_intent(intent),
                self.database.clock(),
            ),
        )

    async def enqueue_intent(self, intent: HandoffIntent) -> None:
        """Durably enqueue ``intent`` in its own transaction."""
        await self.database.run(
            lambda conn: immediate(conn, lambda: self._insert(conn, intent)),
            f"enqueue the hand-off intent {intent.intent_id!r}",
        )
        self.database.notify()

    async def enqueue_intent_tx(self, tx: object, intent: HandoffIntent) -> None:
        """Enqueue ``intent`` inside the ``save_with_outbox`` transaction ``tx``."""
        if not isinstance(tx, SQLiteTransaction):
            raise TypeError(
                "SQLiteOutbox.enqueue_intent_tx needs the SQLiteTransaction that "
                f"SQLiteCheckpointer.save_with_outbox passes to enqueue, got "
                f"{type(tx).__name__} {tx!r}"
            )
        # run_in refuses a transaction of another connection, even on the same file.
        await self.database.run_in(
            tx,
            lambda conn: self._insert(conn, intent),
            f"enqueue the hand-off intent {intent.intent_id!r}",
        )

    def _claim_now(
        self, conn: sqlite3.Connection, limit: int, visibility_timeout: float
    ) -> list[OutboxMessage]:
        now = self.database.clock()
        # Most polls find nothing: look before taking the write lock.
        if (
            conn.execute(
                "SELECT 1 FROM flowy_outbox WHERE dead = 0 AND visible_at <= ? LIMIT 1", (now,)
            ).fetchone()
            is None
        ):
            return []

        def body() -> list[OutboxMessage]:
            conn.execute(
                "UPDATE flowy_outbox SET dead = 1, error = CASE WHEN error = '' THEN ? "
                "ELSE error END WHERE dead = 0 AND visible_at <= ? AND attempts >= ?",
                (
                    f"not acked after {self.max_attempts} deliveries",
                    now,
                    self.max_attempts,
                ),
            )
            rows = conn.execute(
                "SELECT id, payload, attempts FROM flowy_outbox "
                "WHERE dead = 0 AND visible_at <= ? ORDER BY id LIMIT ?",
                (now, limit),
            ).fetchall()
            out: list[OutboxMessage] = []
            for row_id, payload, attempts in rows:
                try:
                    intent = decode_intent(bytes(payload))
                except ValueError as exc:
                    conn.execute(
                        "UPDATE flowy_outbox SET dead = 1, error = ? WHERE id = ?",
                        (str(exc), row_id),
                    )
                    continue
                conn.execute(
                    "UPDATE flowy_outbox SET attempts = attempts + 1, visible_at = ? WHERE id = ?",
                    (now + visibility_timeout, row_id),
                )
                out.append(OutboxMessage(str(row_id), intent, int(attempts) + 1))
            return out

        return immediate(conn, body)

    async def claim(
        self, limit: int, visibility_timeout: float, wait: float = 0.0
    ) -> list[OutboxMessage]:
        """Claim up to ``limit`` visible messages, waiting up to ``wait`` seconds."""
        if limit <= 0:
            return []
        deadline = time.monotonic() + wait
        while True:
            self.database.clear_notified()
            got = await self.database.run(
                lambda conn: self._claim_now(conn, limit, visibility_timeout),
                "claim outbox messages",
            )
            remaining = deadline - time.monotonic()
            if got or remaining <= 0:
                return got
            await self.database.wait_notified(min(remaining, self.poll_interval))

    async def ack(self, message: OutboxMessage) -> None:
        """Remove a delivered message for good (an unknown id is ignored)."""
        row_id = _message_id(message.message_id)
        if row_id is None:
            return
        await self.database.run(
            lambda conn: immediate(
                conn,
                lambda: conn.execute(
                    "DELETE FROM flowy_outbox WHERE id = ? AND dead = 0", (row_id,)
                ),
            ),
            f"ack outbox message {message.message_id!r}",
        )

    async def release(self, message: OutboxMessage, *, error: str = "") -> None:
        """Make a claimed message claimable again, or dead-letter it after
        ``max_attempts`` deliveries."""
        row_id = _message_id(message.message_id)
        if row_id is None:
            return

        def body(conn: sqlite3.Connection) -> None:
            row = conn.execute(
                "SELECT attempts FROM flowy_outbox WHERE id = ? AND dead = 0", (row_id,)
            ).fetchone()
            if row is None:
                return
            if int(row[0]) >= self.max_attempts:
                conn.execute(
                    "UPDATE flowy_outbox SET dead = 1, error = ? WHERE id = ?", (error, row_id)
                )
            else:
                conn.execute(
                    "UPDATE flowy_outbox SET visible_at = 0, error = ? WHERE id = ?",
                    (error, row_id),
                )

        await self.database.run(
            lambda conn: immediate(conn, lambda: body(conn)),
            f"release outbox message {message.message_id!r}",
        )
        self.database.notify()

    async def dead_letters(self, limit: int = 100) -> list[OutboxMessage]:
        """List dead-lettered messages, oldest first."""

        def job(conn: sqlite3.Connection) -> list[OutboxMessage]:
            rows = conn.execute(
                "SELECT id, payload, attempts FROM flowy_outbox WHERE dead = 1 ORDER BY id LIMIT ?",
                (max(limit, 0),),
            ).fetchall()
            out: list[OutboxMessage] = []
            for row_id, payload, attempts in rows:
                try:
                    intent = decode_intent(bytes(payload))
                except ValueError:
                    continue  # unreadable payloads stay in the table for inspection
                out.append(OutboxMessage(str(row_id), intent, int(attempts)))
            return out

        return await self.database.run(job, "list dead letters")

    async def retry_dead_letter(self, message_id: str) -> None:
        """Move a dead letter back to the outbox with its attempts reset; ``KeyError``
        if there is no dead letter with that id."""
        row_id = _message_id(message_id)

        def job(conn: sqlite3.Connection) -> int:
            return immediate(
                conn,
                lambda: (
                    conn.execute(
                        "UPDATE flowy_outbox SET dead = 0, attempts = 0, visible_at = 0, "
                        "error = '' WHERE id = ? AND dead = 1",
                        (row_id,),
                    ).rowcount
                ),
            )

        if row_id is None or not await self.database.run(job, f"retry dead letter {message_id!r}"):
            raise KeyError(f"no dead letter with id {message_id!r}")
        self.database.notify()

    async def pending_count(self) -> int:
        """Messages not yet acked (claimed or not), dead letters excluded."""
        return await self.database.run(
            lambda conn: int(
                conn.execute("SELECT count(*) FROM flowy_outbox WHERE dead = 0").fetchone()[0]
            ),
            "count outbox messages",
        )
