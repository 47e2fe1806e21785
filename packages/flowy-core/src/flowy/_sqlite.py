"""Embedded durable backend on one SQLite file (standard library ``sqlite3`` only).

``SQLiteBackend(path)`` opens the file once and exposes a checkpointer, a lease manager
and an outbox that share its connection, so "revision matches AND lease is mine" and
"checkpoint + outbox message" are each one ``BEGIN IMMEDIATE`` transaction. Several
processes on one machine may open the same file; SQLite's file locks keep one history
chain per thread. The file holds:

- ``flowy_threads``: the head of each thread (revision, pointer, status, reason, hand-off
  status and time, updated-at as columns, plus the head record), so ``load`` is one row
  read and ``list_threads`` a query on columns;
- ``flowy_history``: every stored record, keyed by (thread, revision);
- ``flowy_leases`` and ``flowy_outbox`` (see their modules);
- the schema version in ``PRAGMA user_version`` (``application_id`` marks the file as
  flowy's). A new file gets the schema on first use; an older one is upgraded by an
  explicit ``await backend.migrate()``.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any, Generic, Literal

from ._checkpoint import (
    EnqueueCallback,
    HandoffStatus,
    Lease,
    LeaseManager,
    RunStatus,
    Snapshot,
    ThreadSummary,
    validate_thread_id,
)
from ._codecs import StateCodec
from ._errors import (
    ConcurrencyConflictError,
    LeaseLostError,
    SnapshotTooLargeError,
    ThreadLeaseBusyError,
    ThreadNotFoundError,
)
from ._records import decode_snapshot, encode_snapshot
from ._sqlite_db import (
    Clock,
    SQLiteDatabase,
    SQLiteFileError,
    SQLiteResource,
    SQLiteTransaction,
    StrPath,
    immediate,
)
from ._sqlite_leases import SQLiteLeaseManager, live_lease
from ._sqlite_outbox import SQLiteOutbox
from ._types import S

__all__ = [
    "SQLiteBackend",
    "SQLiteCheckpointer",
    "SQLiteDatabase",
    "SQLiteFileError",
    "SQLiteLeaseManager",
    "SQLiteOutbox",
    "SQLiteTransaction",
]

_UPSERT_HEAD = (
    "INSERT INTO flowy_threads (thread_id, revision, pointer, status, reason, "
    "handoff_status, handoff_pending_at, updated_at, record) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (thread_id) DO UPDATE SET "
    "revision = excluded.revision, pointer = excluded.pointer, status = excluded.status, "
    "reason = excluded.reason, handoff_status = excluded.handoff_status, "
    "handoff_pending_at = excluded.handoff_pending_at, updated_at = excluded.updated_at, "
    "record = excluded.record"
)


def _fence(conn: sqlite3.Connection, thread_id: str, lease: Lease | None, now: float) -> None:
    live = live_lease(conn, thread_id, now)
    if lease is None:
        if live is not None:
            raise ThreadLeaseBusyError(
                f"thread {thread_id!r} is leased by {live.owner!r}; save with its lease"
            )
    elif live is None or live.token != lease.token or live.owner != lease.owner:
        raise LeaseLostError(
            f"save refused: lease {lease.token} of {lease.owner!r} on thread "
            f"{thread_id!r} is no longer live (fenced)"
        )


def _head_revision(conn: sqlite3.Connection, thread_id: str) -> int:
    row = conn.execute(
        "SELECT revision FROM flowy_threads WHERE thread_id = ?", (thread_id,)
    ).fetchone()
    return int(row[0]) if row is not None else 0


class SQLiteCheckpointer(SQLiteResource, Generic[S]):
    """Strict-OCC checkpointer in a SQLite file; a native (fencing) checkpointer for the
    ``SQLiteLeaseManager`` of the same file.

    Lease check, revision check, history insert and head update of a save are one
    ``BEGIN IMMEDIATE`` transaction. A save without ``lease`` fails while any live lease
    in the file holds the thread.

    Args:
        database: a path (this checkpointer opens its own connection) or a
            :class:`SQLiteDatabase` shared with a lease manager and an outbox.
        codec: the state codec (``JSONCodec()`` by default).
    """

    def __init__(
        self, database: StrPath | SQLiteDatabase, codec: StateCodec[S] | None = None
    ) -> None:
        super().__init__(database)
        self.codec = codec

    def fences(self, leases: LeaseManager) -> bool:
        """True for a ``SQLiteLeaseManager`` of the same database file."""
        return isinstance(leases, SQLiteLeaseManager) and self.database.same_domain(leases.database)

    def _write(
        self,
        conn: sqlite3.Connection,
        expected_revision: int,
        snapshot: Snapshot[S],
        data: bytes,
        lease: Lease | None,
    ) -> int:
        """Check and write one save inside the caller's transaction (worker thread)."""
        thread_id = snapshot.thread_id
        _fence(conn, thread_id, lease, self.database.clock())
        actual = _head_revision(conn, thread_id)
        if actual != expected_revision:
            raise ConcurrencyConflictError(
                f"thread {thread_id!r} is at revision {actual}, not {expected_revision}",
                thread_id=thread_id,
                expected=expected_revision,
                actual=actual,
            )
        limit = conn.getlimit(sqlite3.SQLITE_LIMIT_LENGTH)
        if len(data) > limit:
            raise SnapshotTooLargeError(
                f"the record of thread {thread_id!r} is {len(data)} bytes; SQLite stores at "
                f"most {limit} bytes per value. Keep large data outside the state",
                size=len(data),
                limit=limit,
            )
        revision = expected_revision + 1
        conn.execute(
            "INSERT OR REPLACE INTO flowy_history (thread_id, revision, record) VALUES (?, ?, ?)",
            (thread_id, revision, data),
        )
        conn.execute(
            _UPSERT_HEAD,
            (
                thread_id,
                revision,
                snapshot.execution_pointer,
                RunStatus(snapshot.status).value,
                snapshot.reason,
                HandoffStatus(snapshot.handoff_status).value,
                snapshot.handoff_pending_at,
                snapshot.updated_at,
                data,
            ),
        )
        return revision

    async def save(
        self, expected_revision: int, snapshot: Snapshot[S], *, lease: Lease | None = None
    ) -> int:
        """Store ``snapshot`` at ``expected_revision + 1`` (see ``Checkpointer.save``)."""
        thread_id = validate_thread_id(snapshot.thread_id)
        # Encoded on the event loop: the state is the caller's object.
        data = encode_snapshot(snapshot, expected_revision + 1, self.codec)
        return await self.database.run(
            lambda conn: immediate(
                conn, lambda: self._write(conn, expected_revision, snapshot, data, lease)
            ),
            f"save thread {thread_id!r} at revision {expected_revision + 1}",
        )

    async def save_with_outbox(
        self,
        expected_revision: int,
        snapshot: Snapshot[S],
        enqueue: EnqueueCallback,
        *,
        lease: Lease | None = None,
    ) -> int:
        """Save like ``save`` and ``await enqueue(tx, new_revision)`` in the same
        transaction; ``tx`` is a :class:`SQLiteTransaction`. Nothing commits if either
        fails."""
        thread_id = validate_thread_id(snapshot.thread_id)
        revision = expected_revision + 1
        data = encode_snapshot(snapshot, revision, self.codec)
        action = f"save thread {thread_id!r} at revision {revision} with its outbox"
        async with self.database.transaction(action) as tx:
            await tx.run(
                lambda conn: self._write(conn, expected_revision, snapshot, data, lease),
                action,
            )
            await enqueue(tx, revision)
        return revision

    async def load(self, thread_id: str) -> tuple[Snapshot[S], int]:
        """Return the head snapshot and its revision (one row read)."""
        validate_thread_id(thread_id)
        row = await self.database.run(
            lambda conn: conn.execute(
                "SELECT revision, pointer, record FROM flowy_threads WHERE thread_id = ?",
                (thread_id,),
            ).fetchone(),
            f"load thread {thread_id!r}",
        )
        if row is None:
            raise ThreadNotFoundError(f"no checkpoint for thread {thread_id!r}")
        revision, pointer, record = int(row[0]), str(row[1]), bytes(row[2])
        snapshot = decode_snapshot(
            record, self.codec, thread_id=thread_id, revision=revision, execution_pointer=pointer
        )
        return snapshot, revision

    async def get_history(self, thread_id: str, limit: int = 100) -> list[Snapshot[S]]:
        """Return up to ``limit`` stored snapshots, newest first."""
        validate_thread_id(thread_id)
        if limit <= 0:
            return []
        rows: list[tuple[Any, ...]] = await self.database.run(
            lambda conn: conn.execute(
                "SELECT revision, record FROM flowy_history WHERE thread_id = ? "
                "ORDER BY revision DESC LIMIT ?",
                (thread_id, limit),
            ).fetchall(),
            f"read the history of thread {thread_id!r}",
        )
        return [
            decode_snapshot(bytes(record), self.codec, thread_id=thread_id, revision=int(rev))
            for rev, record in rows
        ]

    async def prune(self, thread_id: str, retain: int) -> None:
        """Keep only the newest ``retain`` history entries (at least the head)."""
        validate_thread_id(thread_id)
        keep = max(retain, 1)

        def body(conn: sqlite3.Connection) -> None:
            # The newest `keep` revisions and the head stay.
            conn.execute(
                "DELETE FROM flowy_history WHERE thread_id = ? AND revision <= ("
                "SELECT revision FROM flowy_history WHERE thread_id = ? "
                "ORDER BY revision DESC LIMIT 1 OFFSET ?) "
                "AND revision <> coalesce("
                "(SELECT revision FROM flowy_threads WHERE thread_id = ?), -1)",
                (thread_id, thread_id, keep, thread_id),
            )

        await self.database.run(
            lambda conn: immediate(conn, lambda: body(conn)),
            f"prune the history of thread {thread_id!r}",
        )

    @staticmethod
    def _delete(conn: sqlite3.Connection, thread_id: str) -> None:
        conn.execute("DELETE FROM flowy_history WHERE thread_id = ?", (thread_id,))
        conn.execute("DELETE FROM flowy_threads WHERE thread_id = ?", (thread_id,))

    async def delete(self, thread_id: str) -> None:
        """Delete the thread's head and history (its lease token counter stays)."""
        validate_thread_id(thread_id)
        await self.database.run(
            lambda conn: immediate(conn, lambda: self._delete(conn, thread_id)),
            f"delete thread {thread_id!r}",
        )

    async def delete_if_idle(self, thread_id: str) -> None:
        """Delete the thread unless a live lease holds it (``ThreadLeaseBusyError``)."""
        validate_thread_id(thread_id)

        def body(conn: sqlite3.Connection) -> None:
            live = live_lease(conn, thread_id, self.database.clock())
            if live is not None:
                raise ThreadLeaseBusyError(
                    f"thread {thread_id!r} is leased by {live.owner!r}; not deleting"
                )
            self._delete(conn, thread_id)

        await self.database.run(
            lambda conn: immediate(conn, lambda: body(conn)),
            f"delete thread {thread_id!r}",
        )

    async def list_threads(
        self,
        *,
        handoff_statuses: frozenset[HandoffStatus] | None = None,
        limit: int = 100,
    ) -> list[ThreadSummary]:
        """List thread heads from their columns (no record is decoded)."""
        if limit <= 0 or (handoff_statuses is not None and not handoff_statuses):
            return []
        sql = (
            "SELECT thread_id, revision, pointer, status, reason, handoff_status, "
            "handoff_pending_at, updated_at FROM flowy_threads"
        )
        params: list[object] = []
        if handoff_statuses is not None:
            statuses = sorted(HandoffStatus(s).value for s in handoff_statuses)
            sql += f" WHERE handoff_status IN ({', '.join('?' * len(statuses))})"
            params.extend(statuses)
        sql += " ORDER BY thread_id LIMIT ?"
        params.append(limit)
        rows: list[tuple[Any, ...]] = await self.database.run(
            lambda conn: conn.execute(sql, params).fetchall(), "list threads"
        )
        return [
            ThreadSummary(
                thread_id=str(row[0]),
                revision=int(row[1]),
                execution_pointer=str(row[2]),
                status=RunStatus(row[3]),
                reason=str(row[4]),
                handoff_status=HandoffStatus(row[5]),
                handoff_pending_at=None if row[6] is None else float(row[6]),
                updated_at=float(row[7]),
            )
            for row in rows
        ]

    async def corrupt(self, thread_id: str) -> None:
        """Flip one byte of the thread's head record (for corruption tests)."""
        validate_thread_id(thread_id)

        def body(conn: sqlite3.Connection) -> None:
            row = conn.execute(
                "SELECT revision, record FROM flowy_threads WHERE thread_id = ?", (thread_id,)
            ).fetchone()
            if row is None:
                raise ThreadNotFoundError(f"no checkpoint for thread {thread_id!r}")
            data = bytearray(row[1])
            data[len(data) // 2] ^= 0xFF
            conn.execute(
                "UPDATE flowy_threads SET record = ? WHERE thread_id = ?", (bytes(data), thread_id)
            )
            conn.execute(
                "UPDATE flowy_history SET record = ? WHERE thread_id = ? AND revision = ?",
                (bytes(data), thread_id, row[0]),
            )

        await self.database.run(
            lambda conn: immediate(conn, lambda: body(conn)), f"corrupt thread {thread_id!r}"
        )


class SQLiteBackend(SQLiteResource, Generic[S]):
    """A SQLite file as one coordination domain: ``checkpointer``, ``leases`` and
    ``outbox`` (also the consumer) share one connection and worker thread.

    Use it as an async context manager, or call :meth:`aclose` when done::

        async with SQLiteBackend("flowy.db") as backend:
            runner = Runner(
                graph,
                backend.checkpointer,
                lease_manager=backend.leases,
                handoff_outbox=backend.outbox,
            )

    A new file gets the schema on first use. A file of an older flowy schema raises
    ``SchemaVersionError`` until ``await backend.migrate()`` upgrades it (back it up
    first); a file of a newer schema always raises it. Leases use the local clock, so
    the processes sharing the file must run on one machine.

    Args:
        path: the database file (created if missing).
        codec: the state codec of ``checkpointer`` (``JSONCodec()`` by default).
        max_attempts: outbox deliveries without an ack before a message is dead-lettered.
        busy_timeout: seconds a write waits for another process's lock before it fails
            with ``StorageUnavailableError``.
        clock: time source of leases and outbox visibility (``time.time``).
        synchronous: ``"FULL"`` (default) or ``"NORMAL"``; see :class:`SQLiteDatabase`.
        poll_interval: seconds between looks at the outbox while ``claim`` waits.
    """

    def __init__(
        self,
        path: StrPath,
        codec: StateCodec[S] | None = None,
        *,
        max_attempts: int = 5,
        busy_timeout: float = 5.0,
        clock: Clock = time.time,
        synchronous: Literal["FULL", "NORMAL"] = "FULL",
        poll_interval: float = 0.05,
    ) -> None:
        super().__init__(
            SQLiteDatabase(path, busy_timeout=busy_timeout, clock=clock, synchronous=synchronous)
        )
        self.checkpointer: SQLiteCheckpointer[S] = SQLiteCheckpointer(self.database, codec)
        self.leases: SQLiteLeaseManager = SQLiteLeaseManager(self.database)
        self.outbox: SQLiteOutbox = SQLiteOutbox(
            self.database, max_attempts=max_attempts, poll_interval=poll_interval
        )

    def __repr__(self) -> str:
        return f"SQLiteBackend({self.path!r})"

    async def corrupt(self, thread_id: str) -> None:
        """Flip one byte of the thread's head record (for corruption tests)."""
        await self.checkpointer.corrupt(thread_id)
