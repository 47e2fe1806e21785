"""The primitives of the SQLite store: checkpointer, lease manager, outbox and consumer
over one :class:`SQLiteDatabase` (one file, one coordination domain).

Every write is one job on the database's worker thread inside ``BEGIN IMMEDIATE``, so
"revision matches AND lease is mine", "checkpoint + outbox rows" and "claim this batch"
are each one transaction. The file holds:

- ``flowy_threads``: the head of each thread (revision, pointer, status, reason,
  hand-off status and time, updated-at as columns, plus the head record), so ``load``
  is one row read and ``list_threads`` an index range; a partial index of the suspended
  and waiting heads by ``updated_at`` answers ``oldest_heads``, and an index of each
  head's save second (``recent_second``, written by a save only when its second differs
  from the head's before) and thread id answers ``recent_threads``;
- ``flowy_history``: every stored record, keyed by (thread, revision);
- ``flowy_leases``: owner, fencing token and expiry of each held lease; a released
  lease's row is deleted, as is a deleted thread's, and rows of leases that expired an
  hour ago are swept by later acquisitions (tokens are floored by the clock, so they
  never go back);
- ``flowy_outbox``: one row per (thread, committed revision), with attempts,
  visibility, the last error, a dead-letter flag, when it was enqueued (or came
  back from the dead letters), its route (queue, partition key, priority) and until
  when its claim holds a slot of its queue (``claimed_until``, NULL when not in
  flight); indexes of each queue's live messages in claim order, by visibility and in
  flight;
- ``flowy_queues``: the limits of each queue that has some, as JSON;
- ``flowy_queue_starts``: the starts (queue, partition, time) of rate-limited queues,
  swept by the queue's claims once older than its rate period;
- ``flowy_signals``: each thread's inbox, by (thread, seq), unique by (thread, signal
  id); the head's ``wake_at`` column has a partial index, which ``timers`` reads;
- ``flowy_journal``: each thread's activity records, by (thread, key).
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from collections import Counter
from collections.abc import Callable, Hashable
from typing import Any, Generic

from .._errors import SnapshotTooLargeError, StorageError
from .._types import S
from ..storage import HandoffStatus, Lease, OutboxStats, RunStatus, StateCodec, ThreadSummary, Timer
from ..storage._model import DEFAULT_QUEUE
from ..storage._queues import NO_LIMITS, QueueLimits
from ..storage._recent import RecentCursor, recent_second
from ..storage.dialect import (
    BaseCheckpointer,
    BaseConsumer,
    BaseLeaseManager,
    BaseOutbox,
    BaseScheduleStore,
    Busy,
    OutboxRow,
    QueueCounts,
    RawMessage,
    Refused,
    Write,
    next_fencing_token,
)
from ..storage.dialect import message_row_id as _row_id
from ._db import SQLiteDatabase, immediate, snapshot

__all__ = [
    "LEASE_RECORD_GRACE",
    "SQLiteCheckpointer",
    "SQLiteScheduleStore",
    "SQLiteConsumer",
    "SQLiteLeaseManager",
    "SQLiteOutbox",
]

LEASE_RECORD_GRACE = 3600.0
"""Seconds a lease record is kept after it expired, before an acquisition sweeps it."""

_INSERT_HEAD = (
    "INSERT INTO flowy_threads (revision, pointer, status, reason, handoff_pending_at, "
    "updated_at, graph_version, record, handoff_status, wake_at, recent_second, thread_id) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_HEAD_COLUMNS = (
    "revision = ?, pointer = ?, status = ?, reason = ?, handoff_pending_at = ?, "
    "updated_at = ?, graph_version = ?, record = ?"
)
# The hand-off status, wake-up time and save second are indexed: SQLite rewrites an
# index entry whenever its column is assigned, even to the same value, so a save leaves
# out those it keeps (the save second: every save but the first in a new second).
_UPDATE_HEAD = {
    (handoff, recent): (
        f"UPDATE flowy_threads SET {_HEAD_COLUMNS}"
        + (", handoff_status = ?, wake_at = ?" if handoff else "")
        + (", recent_second = ?" if recent else "")
        + " WHERE thread_id = ?"
    )
    for handoff in (False, True)
    for recent in (False, True)
}

# A live message is left as it is; a dead one comes back with its attempts reset,
# enqueued again now.
# A revived message keeps its route.
_APPEND = (
    "INSERT INTO flowy_outbox (thread_id, committed_revision, payload, created_at, queue, "
    "partition_key, priority) VALUES (?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (thread_id, committed_revision) DO UPDATE SET "
    "payload = excluded.payload, attempts = 0, visible_at = 0, error = '', dead = 0, "
    "claimed_until = NULL, created_at = excluded.created_at WHERE dead = 1"
)

_SUMMARY_COLUMNS = (
    "thread_id, revision, pointer, status, reason, handoff_status, handoff_pending_at, "
    "updated_at, wake_at, graph_version"
)


def _live_lease(conn: sqlite3.Connection, thread_id: str, now: float) -> Lease | None:
    row = conn.execute(
        "SELECT owner, token, expires_at FROM flowy_leases WHERE thread_id = ?", (thread_id,)
    ).fetchone()
    if row is None or row[0] is None or float(row[2]) <= now:
        return None
    return Lease(thread_id, str(row[0]), int(row[1]), float(row[2]))


def _holds(conn: sqlite3.Connection, lease: Lease, now: float) -> bool:
    live = _live_lease(conn, lease.thread_id, now)
    return (
        live is not None and live.owner == lease.owner and live.fencing_token == lease.fencing_token
    )


def _append(conn: sqlite3.Connection, row: OutboxRow, now: float) -> None:
    route = row.route
    conn.execute(
        _APPEND,
        (
            row.thread_id,
            row.committed_revision,
            row.payload,
            now,
            route.queue,
            route.partition_key,
            route.priority,
        ),
    )


def _head(conn: sqlite3.Connection, thread_id: str) -> tuple[int, bytes] | None:
    """The head's revision and record, or ``None``."""
    row = conn.execute(
        "SELECT revision, record FROM flowy_threads WHERE thread_id = ?", (thread_id,)
    ).fetchone()
    return None if row is None else (int(row[0]), bytes(row[1]))


def _limits(queue: str, text: object) -> QueueLimits:
    """The limits stored for ``queue`` (``StorageError`` if they do not read back)."""
    try:
        return QueueLimits.from_json(json.loads(str(text)))
    except (ValueError, TypeError) as exc:
        raise StorageError(
            f"the limits stored for queue {queue!r} do not read back ({exc}); set them "
            "again (backend.queues.configure, or reset)"
        ) from exc


def _take(
    conn: sqlite3.Connection,
    queue: str,
    limit: int,
    visibility_timeout: float,
    held: int,
    now: float,
) -> list[RawMessage]:
    """Claim messages of ``queue`` within its limits (``_claim_queue``), in the caller's
    write transaction."""
    row = conn.execute("SELECT limits FROM flowy_queues WHERE queue = ?", (queue,)).fetchone()
    limits = NO_LIMITS if row is None else _limits(queue, row[0])
    room = limit
    if limits.worker_concurrency is not None:
        room = min(room, limits.worker_concurrency - held)
    flying: Counter[str] = Counter()
    if limits.global_concurrency is not None or limits.partition_concurrency is not None:
        for key, count in conn.execute(
            "SELECT partition_key, count(*) FROM flowy_outbox "
            "WHERE queue = ? AND claimed_until > ? GROUP BY partition_key",
            (queue, now),
        ):
            flying[str(key)] = int(count)
        if limits.global_concurrency is not None:
            room = min(room, limits.global_concurrency - flying.total())
    # Starts older than the window are swept (those of a queue whose rate limit was
    # removed too, after the default period).
    since = now - limits.rate_period
    conn.execute("DELETE FROM flowy_queue_starts WHERE queue = ? AND at <= ?", (queue, since))
    started: Counter[str] = Counter()
    if limits.rate_limited:
        for key, count in conn.execute(
            "SELECT partition_key, count(*) FROM flowy_queue_starts WHERE queue = ? "
            "GROUP BY partition_key",
            (queue,),
        ):
            started[str(key)] = int(count)
        if limits.rate_limit is not None:
            room = min(room, limits.rate_limit - started.total())
    if room <= 0:
        return []
    partitioned = (
        limits.partition_concurrency is not None or limits.partition_rate_limit is not None
    )
    # Walk the live messages in claim order, passing over the hidden ones, rather than
    # sort every visible message of a long backlog (SQLite's choice without the hint).
    sql = (
        "SELECT id, payload, attempts, error, partition_key FROM flowy_outbox "
        "INDEXED BY flowy_outbox_order "
        "WHERE queue = ? AND dead = 0 AND visible_at <= ? ORDER BY priority, id"
    )
    params: list[object] = [queue, now]
    if not partitioned:  # the first ``room`` visible ones
        sql += " LIMIT ?"
        params.append(room)
    taken: list[tuple[Any, ...]] = []
    cursor = conn.execute(sql, params)
    try:
        for candidate in cursor:
            key = str(candidate[4])
            if key and limits.partition_full(flying[key], started[key]):
                continue  # its partition is full: look behind it
            flying[key] += 1
            started[key] += 1
            taken.append(candidate)
            if len(taken) >= room:
                break
    finally:
        cursor.close()
    until = now + visibility_timeout
    conn.executemany(
        "UPDATE flowy_outbox SET attempts = attempts + 1, visible_at = ?, claimed_until = ? "
        "WHERE id = ?",
        [(until, until, r[0]) for r in taken],
    )
    if limits.rate_limited:
        conn.executemany(
            "INSERT INTO flowy_queue_starts (queue, at, partition_key) VALUES (?, ?, ?)",
            [(queue, now, r[4]) for r in taken],
        )
    return [RawMessage(str(r[0]), bytes(r[1]), int(r[2]) + 1, str(r[3])) for r in taken]


class SQLiteCheckpointer(BaseCheckpointer[S], Generic[S]):
    """The checkpointer of a SQLite file (native fencing, transactional).

    Args:
        database: the SQLite file, shared by the components of one store.
        codec: the state codec (JSON by default; a runner gives a typed graph's type).
    """

    def __init__(self, database: SQLiteDatabase, *, codec: StateCodec[S] | None = None) -> None:
        super().__init__(codec=codec)
        self.database = database
        self.domain: Hashable = database.domain

    def _body(self, conn: sqlite3.Connection, write: Write) -> Refused | None:
        now = self.database.clock()
        thread_id = write.thread_id
        holder = _live_lease(conn, thread_id, now)
        lease = write.lease
        if lease is None:
            fenced = holder is None
        else:
            fenced = (
                holder is not None
                and holder.owner == lease.owner
                and holder.fencing_token == lease.fencing_token
            )
        row = conn.execute(
            "SELECT revision, handoff_status, wake_at, recent_second FROM flowy_threads "
            "WHERE thread_id = ?",
            (thread_id,),
        ).fetchone()
        actual = int(row[0]) if row is not None else 0
        if not fenced or actual != write.expected_revision:
            return Refused(actual, holder)
        limit = conn.getlimit(sqlite3.SQLITE_LIMIT_LENGTH)
        if len(write.record) > limit:
            raise SnapshotTooLargeError(
                f"the record of thread {thread_id!r:.80} is {len(write.record)} bytes; this "
                f"SQLite stores at most {limit} bytes per value. Keep large data outside the "
                "state (store a reference)",
                size=len(write.record),
                limit=limit,
            )
        head = write.summary
        conn.execute(
            "INSERT OR REPLACE INTO flowy_history (thread_id, revision, record) VALUES (?, ?, ?)",
            (thread_id, write.revision, write.record),
        )
        values = [
            write.revision,
            head.execution_pointer,
            head.status.value,
            head.reason,
            head.handoff_pending_at,
            head.updated_at,
            head.graph_version,
            write.record,
        ]
        handoff = head.handoff_status.value
        second = recent_second(head.updated_at)
        if row is None:
            conn.execute(_INSERT_HEAD, (*values, handoff, head.wake_at, second, thread_id))
        else:
            moved = row[1] != handoff or row[2] != head.wake_at
            if moved:
                values += [handoff, head.wake_at]
            newer = row[3] != second
            if newer:
                values.append(second)
            conn.execute(_UPDATE_HEAD[(moved, newer)], (*values, thread_id))
        for outbox_row in write.outbox:
            _append(conn, outbox_row, now)
        if write.release:  # fenced above: the lease is this write's
            conn.execute("DELETE FROM flowy_leases WHERE thread_id = ?", (thread_id,))
        acked = None if write.ack is None else _row_id(write.ack)
        if acked is not None:
            conn.execute("DELETE FROM flowy_outbox WHERE id = ? AND dead = 0", (acked,))
        return None

    async def _write(self, write: Write) -> Refused | None:
        return await self._commit_write(write)

    async def _write_release(self, write: Write) -> Refused | None:
        return await self._commit_write(write)  # ``_body`` deletes the lease

    async def _write_ack(self, write: Write) -> Refused | None:
        return await self._commit_write(write)  # ``_body`` also deletes the message

    async def _acquire_head(
        self, thread_id: str, owner: str, ttl: float
    ) -> tuple[Lease | Busy, tuple[int, bytes] | None]:
        database = self.database

        def body(conn: sqlite3.Connection) -> tuple[Lease | Busy, tuple[int, bytes] | None]:
            got = _take_lease(conn, database, thread_id, owner, ttl)
            return got, _head(conn, thread_id)

        return await database.run(
            lambda conn: immediate(conn, lambda: body(conn)),
            f"acquire a lease on thread {thread_id!r:.80} and load it",
        )

    async def _commit_write(self, write: Write) -> Refused | None:
        refused = await self.database.run(
            lambda conn: immediate(conn, lambda: self._body(conn, write)),
            f"save thread {write.thread_id!r:.80} at revision {write.revision}",
        )
        if refused is None and write.outbox:
            self.database.wakeups.notify()
        return refused

    async def _read_head(self, thread_id: str) -> tuple[int, bytes] | None:
        return await self.database.run(
            lambda conn: _head(conn, thread_id), f"load thread {thread_id!r:.80}"
        )

    async def _read_history(self, thread_id: str, limit: int) -> list[tuple[int, bytes]]:
        rows: list[tuple[Any, ...]] = await self.database.run(
            lambda conn: conn.execute(
                "SELECT revision, record FROM flowy_history WHERE thread_id = ? "
                "ORDER BY revision DESC LIMIT ?",
                (thread_id, limit),
            ).fetchall(),
            f"read the history of thread {thread_id!r:.80}",
        )
        return [(int(revision), bytes(record)) for revision, record in rows]

    async def _prune(self, thread_id: str, keep: int) -> None:
        def body(conn: sqlite3.Connection) -> None:
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
            f"prune the history of thread {thread_id!r:.80}",
        )

    async def _delete(self, thread_id: str, *, if_idle: bool) -> Lease | None:
        def body(conn: sqlite3.Connection) -> Lease | None:
            live = _live_lease(conn, thread_id, self.database.clock())
            if if_idle and live is not None:
                return live
            for table in ("flowy_history", "flowy_threads", "flowy_signals", "flowy_journal"):
                conn.execute(f"DELETE FROM {table} WHERE thread_id = ?", (thread_id,))
            if live is None:
                conn.execute("DELETE FROM flowy_leases WHERE thread_id = ?", (thread_id,))
            return None

        return await self.database.run(
            lambda conn: immediate(conn, lambda: body(conn)), f"delete thread {thread_id!r:.80}"
        )

    async def _list_heads(
        self, statuses: frozenset[HandoffStatus] | None, limit: int, after: str | None
    ) -> list[ThreadSummary]:
        sql = f"SELECT {_SUMMARY_COLUMNS} FROM flowy_threads WHERE thread_id > ?"
        params: list[object] = [after or ""]
        if statuses is not None:
            values = sorted(s.value for s in statuses)
            sql += f" AND handoff_status IN ({', '.join('?' * len(values))})"
            params.extend(values)
        sql += " ORDER BY thread_id LIMIT ?"
        params.append(limit)
        rows: list[tuple[Any, ...]] = await self.database.run(
            lambda conn: conn.execute(sql, params).fetchall(), "list threads"
        )
        return [self.summary(str(row[0]), *row[1:]) for row in rows]

    async def _recent_heads(self, limit: int, before: RecentCursor | None) -> list[ThreadSummary]:
        sql = f"SELECT {_SUMMARY_COLUMNS} FROM flowy_threads"
        params: list[object] = []
        if before is not None:
            # Row values compare as the index orders (BINARY: UTF-8 bytes, code points).
            sql += " WHERE (recent_second, thread_id) < (?, ?)"
            params += before
        sql += " ORDER BY recent_second DESC, thread_id DESC LIMIT ?"
        params.append(limit)
        rows: list[tuple[Any, ...]] = await self.database.run(
            lambda conn: conn.execute(sql, params).fetchall(), "list recent threads"
        )
        return [self.summary(str(row[0]), *row[1:]) for row in rows]

    async def _oldest_heads(self, statuses: frozenset[RunStatus]) -> dict[RunStatus, float]:
        values = sorted(s.value for s in statuses)
        # The literal IN list lets SQLite use the partial index flowy_threads_parked.
        sql = (
            "SELECT status, min(updated_at) FROM flowy_threads "
            "WHERE status IN ('suspended', 'waiting') "
            f"AND status IN ({', '.join('?' * len(values))}) GROUP BY status"
        )
        rows: list[tuple[Any, ...]] = await self.database.run(
            lambda conn: conn.execute(sql, values).fetchall(), "read the oldest parked threads"
        )
        return {RunStatus(str(status)): float(at) for status, at in rows}

    async def _timers(self, before: float, limit: int) -> list[Timer]:
        rows: list[tuple[Any, ...]] = await self.database.run(
            lambda conn: conn.execute(
                "SELECT thread_id, wake_at FROM flowy_threads WHERE wake_at IS NOT NULL "
                "AND wake_at <= ? ORDER BY wake_at, thread_id LIMIT ?",
                (before, limit),
            ).fetchall(),
            "list timers",
        )
        return [Timer(str(thread_id), float(at)) for thread_id, at in rows]

    async def _append_signal(
        self, thread_id: str, signal_id: str, data: bytes, max_seq: int
    ) -> tuple[int, bool] | None:
        def body(conn: sqlite3.Connection) -> tuple[int, bool] | None:
            row = conn.execute(
                "SELECT seq FROM flowy_signals WHERE thread_id = ? AND signal_id = ?",
                (thread_id, signal_id),
            ).fetchone()
            if row is not None:
                return int(row[0]), False
            (last,) = conn.execute(
                "SELECT coalesce(max(seq), 0) FROM flowy_signals WHERE thread_id = ?",
                (thread_id,),
            ).fetchone()
            seq = int(last) + 1
            if seq > max_seq:
                return None
            conn.execute(
                "INSERT INTO flowy_signals (thread_id, seq, signal_id, data) VALUES (?, ?, ?, ?)",
                (thread_id, seq, signal_id, data),
            )
            return seq, True

        return await self.database.run(
            lambda conn: immediate(conn, lambda: body(conn)),
            f"signal thread {thread_id!r:.80}",
        )

    async def _read_signals(
        self, thread_id: str, after: int, limit: int
    ) -> list[tuple[int, bytes]]:
        rows: list[tuple[Any, ...]] = await self.database.run(
            lambda conn: conn.execute(
                "SELECT seq, data FROM flowy_signals WHERE thread_id = ? AND seq > ? "
                "ORDER BY seq LIMIT ?",
                (thread_id, after, limit),
            ).fetchall(),
            f"read the signals of thread {thread_id!r:.80}",
        )
        return [(int(seq), bytes(data)) for seq, data in rows]

    async def _put_activity(self, thread_id: str, key: str, data: bytes) -> None:
        await self.database.run(
            lambda conn: immediate(
                conn,
                lambda: conn.execute(
                    "INSERT OR REPLACE INTO flowy_journal (thread_id, key, data) VALUES (?, ?, ?)",
                    (thread_id, key, data),
                ),
            ),
            f"record activity {key!r:.80} of thread {thread_id!r:.80}",
        )

    async def _get_activity(self, thread_id: str, key: str) -> bytes | None:
        row = await self.database.run(
            lambda conn: conn.execute(
                "SELECT data FROM flowy_journal WHERE thread_id = ? AND key = ?",
                (thread_id, key),
            ).fetchone(),
            f"read activity {key!r:.80} of thread {thread_id!r:.80}",
        )
        return None if row is None else bytes(row[0])

    async def _list_activities(self, thread_id: str) -> list[bytes]:
        rows: list[tuple[Any, ...]] = await self.database.run(
            lambda conn: conn.execute(
                "SELECT data FROM flowy_journal WHERE thread_id = ?", (thread_id,)
            ).fetchall(),
            f"read the journal of thread {thread_id!r:.80}",
        )
        return [bytes(row[0]) for row in rows]


def _take_lease(
    conn: sqlite3.Connection, database: SQLiteDatabase, thread_id: str, owner: str, ttl: float
) -> Lease | Busy:
    """Take ``thread_id`` for ``owner`` unless a live lease holds it (in a transaction)."""
    now = database.clock()
    live = _live_lease(conn, thread_id, now)
    if live is not None:
        return Busy(live)
    row = conn.execute(
        "SELECT token FROM flowy_leases WHERE thread_id = ?", (thread_id,)
    ).fetchone()
    token = next_fencing_token(int(row[0]) if row else None, now)
    lease = Lease(thread_id, owner, token, now + ttl)
    conn.execute(
        "INSERT INTO flowy_leases (thread_id, owner, token, expires_at) "
        "VALUES (?, ?, ?, ?) ON CONFLICT (thread_id) DO UPDATE SET "
        "owner = excluded.owner, token = excluded.token, "
        "expires_at = excluded.expires_at",
        (thread_id, owner, lease.fencing_token, lease.expires_at),
    )
    # Records of leases that expired long ago (crashed owners) go away a few at a
    # time; tokens are floored by the clock, so none ever goes back.
    conn.execute(
        "DELETE FROM flowy_leases WHERE rowid IN (SELECT rowid FROM flowy_leases "
        "WHERE expires_at < ? LIMIT 16)",
        (now - LEASE_RECORD_GRACE,),
    )
    return lease


class SQLiteLeaseManager(BaseLeaseManager):
    """Run leases in a SQLite file, by the local clock (the processes sharing the file
    must run on one machine).

    Args:
        database: the SQLite file, shared by the components of one store.
    """

    def __init__(self, database: SQLiteDatabase) -> None:
        self.database = database
        self.domain: Hashable = database.domain

    async def _acquire(self, thread_id: str, owner: str, ttl: float) -> Lease | Busy:
        database = self.database
        return await database.run(
            lambda conn: immediate(
                conn, lambda: _take_lease(conn, database, thread_id, owner, ttl)
            ),
            f"acquire a lease on thread {thread_id!r:.80}",
        )

    async def _renew(self, lease: Lease, ttl: float) -> Lease | None:
        def body(conn: sqlite3.Connection) -> Lease | None:
            now = self.database.clock()
            if not _holds(conn, lease, now):
                return None
            conn.execute(
                "UPDATE flowy_leases SET expires_at = ? WHERE thread_id = ?",
                (now + ttl, lease.thread_id),
            )
            return Lease(lease.thread_id, lease.owner, lease.fencing_token, now + ttl)

        return await self.database.run(
            lambda conn: immediate(conn, lambda: body(conn)),
            f"renew the lease on thread {lease.thread_id!r:.80}",
        )

    async def _release(self, lease: Lease) -> bool:
        def body(conn: sqlite3.Connection) -> bool:
            if not _holds(conn, lease, self.database.clock()):
                return False
            conn.execute("DELETE FROM flowy_leases WHERE thread_id = ?", (lease.thread_id,))
            return True

        return await self.database.run(
            lambda conn: immediate(conn, lambda: body(conn)),
            f"release the lease on thread {lease.thread_id!r:.80}",
        )

    async def _holder(self, thread_id: str) -> Lease | None:
        return await self.database.run(
            lambda conn: _live_lease(conn, thread_id, self.database.clock()),
            f"read the lease on thread {thread_id!r:.80}",
        )


class SQLiteOutbox(BaseOutbox):
    """The hand-off outbox in a SQLite file.

    Args:
        database: the SQLite file, shared by the components of one store.
    """

    def __init__(self, database: SQLiteDatabase) -> None:
        self.database = database
        self.domain: Hashable = database.domain

    async def _append(self, row: OutboxRow) -> None:
        await self.database.run(
            lambda conn: immediate(conn, lambda: _append(conn, row, self.database.clock())),
            f"enqueue a hand-off of thread {row.thread_id!r:.80}",
        )
        self.database.wakeups.notify()


class SQLiteConsumer(BaseConsumer):
    """The outbox consumer of a SQLite file: consumers of this process are woken at once
    by an enqueue; other processes' messages are seen by polling. It keeps queues: a
    claim takes one queue's messages within the limits stored in the file.

    Args:
        database: the SQLite file, shared by the components of one store.
        max_attempts: deliveries of a message without an ack before it is
            dead-lettered.
        poll_interval: seconds between looks at the outbox while ``claim`` waits.
    """

    def __init__(
        self, database: SQLiteDatabase, *, max_attempts: int = 5, poll_interval: float = 0.05
    ) -> None:
        super().__init__(max_attempts=max_attempts, poll_interval=poll_interval)
        self.database = database
        self.domain: Hashable = database.domain

    async def _claim(self, limit: int, visibility_timeout: float) -> list[RawMessage]:
        return await self._claim_queue(DEFAULT_QUEUE, limit, visibility_timeout, 0)

    async def _claim_queue(
        self, queue: str, limit: int, visibility_timeout: float, held: int
    ) -> list[RawMessage]:
        clock = self.database.clock

        def job(conn: sqlite3.Connection) -> list[RawMessage]:
            # Most polls find nothing: look before taking the write lock.
            if (
                conn.execute(
                    "SELECT 1 FROM flowy_outbox WHERE queue = ? AND dead = 0 AND visible_at <= ? "
                    "LIMIT 1",
                    (queue, clock()),
                ).fetchone()
                is None
            ):
                return []
            # The time is read under the lock, so the starts of the claims are recorded
            # in the order they were made.
            return immediate(
                conn, lambda: _take(conn, queue, limit, visibility_timeout, held, clock())
            )

        return await self.database.run(job, f"claim outbox messages of queue {queue!r}")

    async def _set_limits(self, queue: str, limits: QueueLimits | None) -> None:
        def body(conn: sqlite3.Connection) -> None:
            if limits is None:
                conn.execute("DELETE FROM flowy_queues WHERE queue = ?", (queue,))
            else:
                conn.execute(
                    "INSERT INTO flowy_queues (queue, limits) VALUES (?, ?) "
                    "ON CONFLICT (queue) DO UPDATE SET limits = excluded.limits",
                    (queue, json.dumps(limits.to_json())),
                )

        await self.database.run(
            lambda conn: immediate(conn, lambda: body(conn)), f"set the limits of queue {queue!r}"
        )
        self.database.wakeups.notify()  # a raised limit lets waiting claims take more

    async def _read_limits(self) -> dict[str, QueueLimits]:
        rows: list[tuple[Any, ...]] = await self.database.run(
            lambda conn: conn.execute("SELECT queue, limits FROM flowy_queues").fetchall(),
            "read the limits of the queues",
        )
        return {str(queue): _limits(str(queue), text) for queue, text in rows}

    async def _queue_counts(self) -> dict[str, QueueCounts]:
        clock = self.database.clock

        def body(conn: sqlite3.Connection) -> dict[str, QueueCounts]:
            now = clock()
            limits = {
                str(queue): _limits(str(queue), text)
                for queue, text in conn.execute("SELECT queue, limits FROM flowy_queues")
            }
            out: dict[str, QueueCounts] = {}
            for queue, live, flying, oldest in conn.execute(
                "SELECT queue, count(*), coalesce(sum(claimed_until > ?), 0), "
                "min(CASE WHEN claimed_until IS NULL OR claimed_until <= ? THEN created_at END) "
                "FROM flowy_outbox WHERE dead = 0 GROUP BY queue",
                (now, now),
            ).fetchall():
                pending = int(live) - int(flying)
                out[str(queue)] = QueueCounts(
                    int(flying), pending, None if oldest is None else float(oldest), 0
                )
            starts = conn.execute(
                "SELECT queue, max(at) FROM flowy_queue_starts GROUP BY queue"
            ).fetchall()
            for name, last in starts:
                queue = str(name)
                queue_limits = limits.get(queue, NO_LIMITS)
                since = now - queue_limits.rate_period
                if float(last) <= since:
                    continue  # none in the window: swept by the queue's next claim
                started = 0
                if queue_limits.rate_limited:
                    (started,) = conn.execute(
                        "SELECT count(*) FROM flowy_queue_starts WHERE queue = ? AND at > ?",
                        (queue, since),
                    ).fetchone()
                counts = out.get(queue, QueueCounts(0, 0, None, 0))
                out[queue] = dataclasses.replace(counts, started=int(started))
            return out

        return await self.database.run(
            lambda conn: snapshot(conn, lambda: body(conn)), "count the messages of the queues"
        )

    async def _queue_messages(self, queue: str, limit: int) -> list[RawMessage]:
        rows: list[tuple[Any, ...]] = await self.database.run(
            lambda conn: conn.execute(
                "SELECT id, payload, attempts, error FROM flowy_outbox "
                "WHERE queue = ? AND dead = 0 ORDER BY priority, id LIMIT ?",
                (queue, limit),
            ).fetchall(),
            f"list the messages of queue {queue!r}",
        )
        return [RawMessage(str(r[0]), bytes(r[1]), int(r[2]), str(r[3])) for r in rows]

    async def _ack(self, message_id: str) -> None:
        row_id = _row_id(message_id)
        if row_id is None:
            return
        await self.database.run(
            lambda conn: immediate(
                conn,
                lambda: conn.execute(
                    "DELETE FROM flowy_outbox WHERE id = ? AND dead = 0", (row_id,)
                ),
            ),
            f"ack outbox message {message_id!r}",
        )

    async def _release(self, message_id: str, *, error: str, delay: float, dead: bool) -> None:
        row_id = _row_id(message_id)
        if row_id is None:
            return
        now = self.database.clock()
        await self.database.run(
            lambda conn: immediate(
                conn,
                lambda: conn.execute(
                    "UPDATE flowy_outbox SET dead = ?, error = ?, visible_at = ?, "
                    "claimed_until = NULL WHERE id = ? AND dead = 0",
                    (int(dead), error, now + delay, row_id),
                ),
            ),
            f"release outbox message {message_id!r}",
        )
        self.database.wakeups.notify()

    async def _dead_letters(self, limit: int) -> list[RawMessage]:
        rows: list[tuple[Any, ...]] = await self.database.run(
            lambda conn: conn.execute(
                "SELECT id, payload, attempts, error FROM flowy_outbox WHERE dead = 1 "
                "ORDER BY id LIMIT ?",
                (limit,),
            ).fetchall(),
            "list dead letters",
        )
        return [RawMessage(str(r[0]), bytes(r[1]), int(r[2]), str(r[3])) for r in rows]

    async def _retry_dead_letter(self, message_id: str) -> bool:
        row_id = _row_id(message_id)
        if row_id is None:
            return False
        changed = await self.database.run(
            lambda conn: immediate(
                conn,
                lambda: (
                    conn.execute(
                        "UPDATE flowy_outbox SET dead = 0, attempts = 0, visible_at = 0, "
                        "claimed_until = NULL, error = '', created_at = ? "
                        "WHERE id = ? AND dead = 1",
                        (self.database.clock(), row_id),
                    ).rowcount
                ),
            ),
            f"retry dead letter {message_id!r}",
        )
        if changed:
            self.database.wakeups.notify()
        return bool(changed)

    async def _stats(self) -> OutboxStats:
        row = await self.database.run(
            lambda conn: conn.execute(
                "SELECT coalesce(sum(dead = 0), 0), min(CASE WHEN dead = 0 THEN created_at END), "
                "coalesce(sum(dead = 1), 0) FROM flowy_outbox"
            ).fetchone(),
            "read the outbox backlog",
        )
        pending, oldest, dead = row
        return OutboxStats(int(pending), None if oldest is None else float(oldest), int(dead))

    async def _wait(self, seconds: float) -> None:
        await self.database.wakeups.wait(min(seconds, self.poll_interval))

    async def pending_count(self) -> int:
        """Messages not yet acked (claimed or not), dead letters excluded."""
        return await self.database.run(
            lambda conn: int(
                conn.execute("SELECT count(*) FROM flowy_outbox WHERE dead = 0").fetchone()[0]
            ),
            "count outbox messages",
        )


class SQLiteScheduleStore(BaseScheduleStore):
    """Durable schedules in a SQLite file: one row per schedule, its version compared
    and set in one statement.

    Args:
        database: the SQLite file, shared by the components of one store.
    """

    def __init__(self, database: SQLiteDatabase) -> None:
        self.database = database
        self.domain: Hashable = database.domain
        self.clock: Callable[[], float] = database.clock

    async def _insert(self, name: str, data: bytes) -> bool:
        def body(conn: sqlite3.Connection) -> bool:
            cursor = conn.execute(
                "INSERT INTO flowy_schedules (name, version, record) VALUES (?, 1, ?) "
                "ON CONFLICT (name) DO NOTHING",
                (name, data),
            )
            return cursor.rowcount == 1

        return await self.database.run(body, "create a schedule")

    async def _read(self, name: str) -> tuple[int, bytes] | None:
        def body(conn: sqlite3.Connection) -> tuple[int, bytes] | None:
            row = conn.execute(
                "SELECT version, record FROM flowy_schedules WHERE name = ?", (name,)
            ).fetchone()
            return None if row is None else (int(row[0]), bytes(row[1]))

        return await self.database.run(body, "read a schedule")

    async def _read_all(self) -> list[tuple[str, int, bytes]]:
        def body(conn: sqlite3.Connection) -> list[tuple[str, int, bytes]]:
            rows = conn.execute("SELECT name, version, record FROM flowy_schedules").fetchall()
            return [(str(r[0]), int(r[1]), bytes(r[2])) for r in rows]

        return await self.database.run(body, "list schedules")

    async def _replace(self, name: str, version: int, data: bytes) -> bool:
        def body(conn: sqlite3.Connection) -> bool:
            cursor = conn.execute(
                "UPDATE flowy_schedules SET version = version + 1, record = ? "
                "WHERE name = ? AND version = ?",
                (data, name, version),
            )
            return cursor.rowcount == 1

        return await self.database.run(body, "update a schedule")

    async def _delete(self, name: str) -> bool:
        def body(conn: sqlite3.Connection) -> bool:
            cursor = conn.execute("DELETE FROM flowy_schedules WHERE name = ?", (name,))
            return cursor.rowcount == 1

        return await self.database.run(body, "delete a schedule")
