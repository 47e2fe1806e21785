"""``PostgresCheckpointer``: the checkpointer primitives in SQL.

A save is ONE statement, one round trip: it locks the thread's lease row (if any) ``FOR
KEY SHARE`` and checks the lease by the database clock, updates (or creates) the head
row only if it is at the expected revision, appends the record to the history (its only
copy: the head's record is its history entry) and inserts a transactional save's outbox
rows, notifying consumers. When nothing was written the same statement reports what it
saw; one more read happens only when a racing save or takeover committed while it
waited for a lock. The save that ends a leased segment also releases the lease, and
the one that ends a run a worker resumed also deletes the message it was resumed for
(both only when written). Each case (create or update, with or without a lease or
outbox rows, releasing, acknowledging) has its own statement, so PostgreSQL settles on
one generic plan for each. The head's wake-up time, graph version and save second
(``recent_second``, the key of the recency index) are columns of its row, written by the
same statement; timers are read from the wake-up time's partial
index, and the oldest suspended and waiting heads from the partial index of those heads
(one query grouped by status).

A thread's signals are numbered by one statement that inserts ``max(seq) + 1`` unless
the signal id is there: a sender racing for the same number (or id) waits for the other
to commit, then stores nothing and tries again with a fresh snapshot, so number ``n + 1``
is never written before ``n`` has committed.
"""

from __future__ import annotations

import copy
from collections.abc import Hashable
from typing import TYPE_CHECKING, Generic, TypeVar

from flowy.errors import SnapshotEnvelopeInvalidError
from flowy.storage import HandoffStatus, Lease, RunStatus, StateCodec, ThreadSummary, Timer
from flowy.storage.dialect import BaseCheckpointer, Busy, OutboxRow, Refused, Write, show_id
from flowy.storage.dialect import message_row_id as _row_id

from ._conn import Connector, PgConnection, Row
from ._lease import acquire_sql
from ._schema import ID_PREFIX, TableNames, text_key, thread_key

if TYPE_CHECKING:
    import asyncpg
    from asyncpg.pool import PoolConnectionProxy
    from sqlalchemy.ext.asyncio import AsyncConnection

__all__ = ["PostgresCheckpointer"]

S = TypeVar("S")

_LIVE = "expires_at > clock_timestamp()"
_EPOCH = "extract(epoch FROM expires_at)::float8"


def _numbered(sql: str, names: tuple[str, ...]) -> str:
    """Replace ``:name`` placeholders with ``$1``, ``$2``, ... in the order of ``names``."""
    numbers = {name: index for index, name in enumerate(names, 1)}
    for name in sorted(names, key=len, reverse=True):  # longest first: no prefix clash
        sql = sql.replace(f":{name}", f"${numbers[name]}")
    return sql


_WRITE = (
    *("key", "tid", "record", "pointer", "status", "reason", "handoff", "pending", "updated"),
    *("wake", "graph_version"),
)
_OUTBOX = (
    *("o_keys", "o_ids", "o_revisions", "o_payloads", "o_queues", "o_partitions", "o_priorities"),
    "channel",
)


def _save_sql(
    n: TableNames,
    create: bool,
    leased: bool,
    outbox: bool,
    release: bool = False,
    ack: bool = False,
) -> tuple[str, tuple[str, ...]]:
    """The save statement of one case, and its parameter names.

    The lease row is locked ``FOR KEY SHARE`` (without a lease: live or not) before the
    head row is written, so a takeover waits for this save and a save waits for a
    takeover in progress. The report columns are computed only when nothing was written.
    With ``release`` (leased only), a written save also marks its lease released (owner
    and expiry cleared, the token kept), as the lease manager's release does while a
    save holds the row. With ``ack`` (releasing only), a written save also deletes the
    live outbox message of row id ``:ack``, as the consumer's ack does: a message in
    flight counts against its queue's limits only while its row is there.
    """
    params = (*_WRITE, *(() if create else ("expected",)), *(("owner", "token") if leased else ()))
    params += _OUTBOX if outbox else ()
    params += ("ack",) if ack else ()
    lease = f"SELECT owner, token, expires_at FROM {n.leases} WHERE thread_key = :key"
    if leased:  # a lease that does not match refuses the save: no lock needed then
        mine = "owner = :owner::text AND token = :token::bigint"
        fence = f"EXISTS ({lease} AND {mine} AND {_LIVE} FOR KEY SHARE)"
    else:
        fence = f"NOT EXISTS (SELECT FROM ({lease} FOR KEY SHARE) AS l WHERE l.{_LIVE})"
    columns = "pointer, status, reason, handoff_status, handoff_pending_at, updated_at, wake_at, "
    columns += "graph_version, recent_second"
    values = ":pointer::text, :status::text, :reason::text, :handoff::text, "
    values += ":pending::float8, :updated::float8, :wake::float8, :graph_version::text, "
    # The recency index's key: the same value for every save of a head within one
    # second, so those updates stay HOT; only the first save in a new second moves it.
    values += "floor(:updated::float8)::bigint"
    if create:
        write = f"""INSERT INTO {n.threads} (thread_key, thread_id, revision, {columns}, saved_at)
    SELECT :key, :tid::text, 1, {values}, clock_timestamp() WHERE {fence}
    ON CONFLICT (thread_key) DO NOTHING RETURNING revision"""
    else:
        write = f"""UPDATE {n.threads} SET revision = revision + 1,
        ({columns}, saved_at) = ({values}, clock_timestamp())
    WHERE thread_key = :key AND thread_id = :tid::text AND revision = :expected::bigint
      AND {fence}
    RETURNING revision"""
    queued = notified = ""
    if outbox:
        # The rule of BaseOutbox._append: a live message stays as it is, a dead one lives again.
        queued = f""", queued AS (
    INSERT INTO {n.outbox} AS o
        (thread_key, thread_id, committed_revision, payload, queue, partition_key, priority)
    SELECT r.* FROM appended, unnest(:o_keys::bytea[], :o_ids::text[], :o_revisions::bigint[],
        :o_payloads::bytea[], :o_queues::text[], :o_partitions::text[], :o_priorities::int[]) AS r
    ON CONFLICT (thread_key, committed_revision) DO UPDATE SET payload = EXCLUDED.payload,
        attempts = 0, dead = false, last_error = '', visible_at = clock_timestamp(),
        created_at = clock_timestamp(), claimed_until = NULL
    WHERE o.dead
    RETURNING 1
), notified AS (SELECT pg_notify(:channel::text, '') FROM (SELECT FROM queued LIMIT 1) AS q)"""
        notified = ", (SELECT count(*) FROM notified)"
    released = ""
    if release:
        released = f""", released AS (
    UPDATE {n.leases} SET owner = NULL, expires_at = NULL
    WHERE thread_key = :key AND owner = :owner::text AND token = :token::bigint
      AND EXISTS (SELECT FROM written)
)"""
    acked = ""
    if ack:  # the consumer's ack (``_outbox``), for a written save only
        acked = f""", acked AS (
    DELETE FROM {n.outbox} WHERE id = :ack::bigint AND NOT dead AND EXISTS (SELECT FROM written)
)"""
    holder = f"FROM {n.leases} WHERE thread_key = :key AND {_LIVE}"
    sql = f"""
WITH written AS (
    {write}
), appended AS (
    INSERT INTO {n.history} (thread_key, revision, record)
    SELECT :key, revision, :record::bytea FROM written RETURNING revision
){released}{acked}{queued}, outcome AS (SELECT (SELECT revision FROM appended) AS saved{notified})
SELECT saved,
    CASE WHEN saved IS NULL THEN (SELECT revision FROM {n.threads}
        WHERE thread_key = :key AND thread_id = :tid::text) END AS actual,
    CASE WHEN saved IS NULL THEN (SELECT owner {holder}) END AS holder,
    CASE WHEN saved IS NULL THEN (SELECT token {holder}) END AS holder_token,
    CASE WHEN saved IS NULL THEN (SELECT {_EPOCH} {holder}) END AS holder_expires
FROM outcome"""
    return _numbered(sql, params), params


# The arguments of BaseCheckpointer.summary, in order.
_COLUMNS = (
    "thread_id, revision, pointer, status, reason, handoff_status, handoff_pending_at, "
    "updated_at, wake_at, graph_version"
)
_ORDER = f'{ID_PREFIX}, thread_id COLLATE "C"'  # code point order, through the indexes
_ID_DESC = f'{ID_PREFIX} DESC, thread_id COLLATE "C" DESC'


class _Sql:
    def __init__(self, n: TableNames) -> None:
        self.save = {
            (create, leased, outbox, release): _save_sql(n, create, leased, outbox, release)
            for create in (False, True)
            for leased in (False, True)
            for outbox in (False, True)
            for release in ((False, True) if leased else (False,))
        }
        # A releasing save that also acknowledges a message: statements of their own,
        # so that every other save runs its statement unchanged.
        self.save_ack = {
            (create, outbox): _save_sql(n, create, True, outbox, release=True, ack=True)
            for create in (False, True)
            for outbox in (False, True)
        }
        # The lease taken as the lease manager takes it, and the head: as of the
        # statement's snapshot (with its record) and as locked after the lease was taken
        # (the newest committed revision); they differ only when a save committed after
        # the statement began (while it waited for the lease row, or for a save without
        # a lease still in flight on the head row), and then the head is read again.
        # The lock is FOR SHARE because a save's update conflicts with it: FOR KEY SHARE
        # does not, and PostgreSQL then locks the row version of the snapshot, whose
        # revision is the one before the save.
        where = "t.thread_key = $1 AND t.thread_id = $2::text"
        self.acquire_head = acquire_sql(
            n,
            f""",
       (SELECT t.revision FROM {n.threads} AS t WHERE {where}) AS head_revision,
       (SELECT h.record FROM {n.threads} AS t JOIN {n.history} AS h
            ON h.thread_key = t.thread_key AND h.revision = t.revision
        WHERE {where}) AS head_record,
       (SELECT t.revision FROM {n.threads} AS t WHERE {where} FOR SHARE) AS head_now""",
        )
        self.diagnose = f"""
SELECT (SELECT revision FROM {n.threads} WHERE thread_key = $1 AND thread_id = $2::text)
           AS actual, owner AS holder, token AS holder_token, {_EPOCH} AS holder_expires
FROM (SELECT 1) AS one LEFT JOIN {n.leases} ON thread_key = $1 AND {_LIVE}
"""
        self.load = f"""
SELECT t.revision, h.record FROM {n.threads} AS t
LEFT JOIN {n.history} AS h ON h.thread_key = t.thread_key AND h.revision = t.revision
WHERE t.thread_key = $1 AND t.thread_id = $2::text
"""
        self.history = f"""
SELECT revision, record FROM {n.history} WHERE thread_key = $1
ORDER BY revision DESC LIMIT $2::bigint
"""
        self.prune = f"""
DELETE FROM {n.history}
WHERE thread_key = $1 AND revision < (
    SELECT revision FROM {n.history} WHERE thread_key = $1
    ORDER BY revision DESC OFFSET $2::bigint - 1 LIMIT 1)
"""
        # One statement takes the head and the lease row (unless live); the history
        # goes in a second one, which sees entries of saves that committed while the
        # first waited for their locks.
        self.delete = f"""
WITH lease AS (
    SELECT owner, token, expires_at, coalesce({_LIVE}, false) AS live
    FROM {n.leases} WHERE thread_key = $1 FOR UPDATE
), head AS (
    DELETE FROM {n.threads} WHERE thread_key = $1 AND thread_id = $2::text
      AND NOT ($3::bool AND EXISTS (SELECT FROM lease WHERE live))
    RETURNING 1
), lease_gone AS (
    DELETE FROM {n.leases} AS l USING lease
    WHERE l.thread_key = $1 AND NOT lease.live
    RETURNING 1
)
SELECT owner, token, {_EPOCH} AS expires FROM lease WHERE live AND $3::bool
"""
        self.delete_rest = f"""
WITH inbox AS (DELETE FROM {n.signals} WHERE thread_key = $1 AND thread_id = $2::text),
journal AS (DELETE FROM {n.journal} WHERE thread_key = $1 AND thread_id = $2::text)
DELETE FROM {n.history} WHERE thread_key = $1
"""
        order = f"ORDER BY {_ORDER} LIMIT $1::bigint"
        after = f'{ID_PREFIX} >= substr($2::text, 1, 200) AND thread_id COLLATE "C" > $2::text'
        self.list: dict[tuple[str | None, bool], str] = {}
        for statuses in (None, "any", "handoff"):
            for paged in (False, True):
                where = [after] if paged else []
                nth = 3 if paged else 2
                if statuses is not None:
                    where.append(f"handoff_status = ANY(${nth}::text[])")
                if statuses == "handoff":  # lets PostgreSQL use the partial index
                    where.append("handoff_status <> 'none'")
                clause = f"WHERE {' AND '.join(where)}" if where else ""
                self.list[(statuses, paged)] = (
                    f"SELECT {_COLUMNS} FROM {n.threads} {clause} {order}"
                )
        recent = f"""SELECT {_COLUMNS} FROM {n.threads}{{}}
ORDER BY recent_second DESC, {_ID_DESC} LIMIT $1::bigint"""
        self.recent = recent.format("")
        # Row values compare column by column, each with its own collation: (second,
        # prefix, id) orders as (second, id), and the first two are the index's.
        self.recent_before = recent.format(
            """
WHERE (recent_second, substr(thread_id, 1, 200) COLLATE "C", thread_id COLLATE "C")
    < ($2::bigint, substr($3::text, 1, 200) COLLATE "C", $3::text COLLATE "C")"""
        )
        self.timers = f"""
SELECT thread_id, wake_at FROM {n.threads} WHERE wake_at IS NOT NULL AND wake_at <= $1::float8
ORDER BY wake_at, {_ORDER} LIMIT $2::bigint
"""
        # The literal IN list lets PostgreSQL use the partial index threads_parked_idx
        # in a generic plan.
        self.oldest_heads = f"""
SELECT status, min(updated_at) AS oldest FROM {n.threads}
WHERE status IN ('suspended', 'waiting') AND status = ANY($1::text[])
GROUP BY status
"""
        # Either the signal already there (added = false), or the new one numbered after
        # the thread's last, or (added = null) the last when the next would pass $6 (the
        # inbox is full); no row when a racing sender took that number or id first.
        self.append_signal = f"""
WITH found AS (
    SELECT seq FROM {n.signals}
    WHERE thread_key = $1 AND id_key = $3 AND thread_id = $2::text AND signal_id = $4::text
), last AS (
    SELECT coalesce(max(seq), 0) AS seq FROM {n.signals} WHERE thread_key = $1
), added AS (
    INSERT INTO {n.signals} (thread_key, seq, id_key, thread_id, signal_id, data)
    SELECT $1, last.seq + 1, $3, $2::text, $4::text, $5::bytea
    FROM last WHERE NOT EXISTS (SELECT FROM found) AND last.seq < $6::bigint
    ON CONFLICT DO NOTHING
    RETURNING seq
)
SELECT seq, true AS added FROM added UNION ALL SELECT seq, false FROM found
UNION ALL SELECT seq, NULL FROM last
WHERE NOT EXISTS (SELECT FROM found) AND last.seq >= $6::bigint
"""
        self.signals = f"""
SELECT seq, data FROM {n.signals} WHERE thread_key = $1 AND thread_id = $2::text
  AND seq > $3::bigint ORDER BY seq LIMIT $4::bigint
"""
        self.put_activity = f"""
INSERT INTO {n.journal} (thread_key, activity_key, thread_id, key, data)
VALUES ($1, $3, $2::text, $4::text, $5::bytea)
ON CONFLICT (thread_key, activity_key) DO UPDATE SET data = EXCLUDED.data
"""
        self.get_activity = f"""
SELECT data FROM {n.journal} WHERE thread_key = $1 AND activity_key = $3
  AND thread_id = $2::text AND key = $4::text
"""
        self.activities = (
            f"SELECT data FROM {n.journal} WHERE thread_key = $1 AND thread_id = $2::text"
        )


def _outbox_args(rows: tuple[OutboxRow, ...], channel: str) -> list[object]:
    ids = [r.thread_id for r in rows]
    keys = [thread_key(i) for i in ids]
    revisions, payloads = [r.committed_revision for r in rows], [r.payload for r in rows]
    routes = [r.route for r in rows]
    queues, partitions = [r.queue for r in routes], [r.partition_key for r in routes]
    return [
        keys,
        ids,
        revisions,
        payloads,
        queues,
        partitions,
        [r.priority for r in routes],
        channel,
    ]


def _refused(row: Row, tid: str) -> Refused:
    owner, token, expires = row["holder"], row["holder_token"], row["holder_expires"]
    holder = None if owner is None else Lease(tid, str(owner), int(token), float(expires))
    return Refused(int(row["actual"] or 0), holder)


class PostgresCheckpointer(BaseCheckpointer[S], Generic[S]):
    """The checkpointer of a :class:`~flowy_postgres.PostgresBackend`: strict OCC, fenced
    by its leases and transactional with its outbox, on a pooled connection per operation
    (or, through :meth:`bind`, on the application's own connection and transaction)."""

    max_record_bytes: int | None = (1 << 30) - 1  # PostgreSQL's largest field value

    def __init__(self, connector: Connector, *, codec: StateCodec[S] | None = None) -> None:
        super().__init__(codec=codec)
        self.connector = connector
        self.domain: Hashable = connector.domain
        self._sql = _Sql(connector.names)

    def bind(
        self, connection: asyncpg.Connection | PoolConnectionProxy | AsyncConnection
    ) -> PostgresCheckpointer[S]:
        """A view running every operation on ``connection``: an asyncpg connection or a
        SQLAlchemy ``AsyncConnection`` on asyncpg (extra ``flowy-postgres[sqlalchemy]``).

        Inside a transaction, a save (with its outbox rows, for ``save_with_outbox``)
        joins it: checkpoint and hand-off commit or roll back with the application's own
        writes. Until then other saves of the thread and a takeover of its lease wait;
        renewing or releasing the lease does not. Use the view from one task at a time,
        like the connection, and not after it.
        """
        view = copy.copy(self)
        view.connector = self.connector.bind(connection)
        return view

    async def _write(self, write: Write) -> Refused | None:
        return await self._save(write)

    async def _write_release(self, write: Write) -> Refused | None:
        return await self._save(write)  # the statement marks the lease released

    async def _write_ack(self, write: Write) -> Refused | None:
        row_id = None if write.ack is None else _row_id(write.ack)
        if row_id is None:  # not an id of this outbox: no message to acknowledge
            return await self._save(write)
        return await self._save(write, row_id)  # the statement deletes the message

    async def _save(self, write: Write, ack: int | None = None) -> Refused | None:
        head = write.summary
        leased = write.lease is not None
        if ack is None:
            sql, _ = self._sql.save[
                (write.expected_revision == 0, leased, bool(write.outbox), leased and write.release)
            ]
        else:
            assert leased and write.release, "an acking save releases its lease"
            sql, _ = self._sql.save_ack[(write.expected_revision == 0, bool(write.outbox))]
        args: list[object] = [thread_key(head.thread_id), head.thread_id, write.record]
        args += (head.execution_pointer, head.status.value, head.reason)
        args += (head.handoff_status.value, head.handoff_pending_at, head.updated_at)
        args += (head.wake_at, head.graph_version)
        if write.expected_revision:
            args.append(write.expected_revision)
        if write.lease is not None:
            args += (write.lease.owner, write.lease.fencing_token)
        if write.outbox:
            args += _outbox_args(write.outbox, self.connector.names.channel)
        action = f"save thread {show_id(head.thread_id)} at revision {write.revision}"
        if ack is not None:
            args.append(ack)
            action += f" and ack outbox message {ack}"
        row = await self.connector.fetchrow(action, sql, *args)
        assert row is not None
        return None if row["saved"] is not None else _refused(row, head.thread_id)

    async def _acquire_head(
        self, thread_id: str, owner: str, ttl: float
    ) -> tuple[Lease | Busy, tuple[int, bytes] | None]:
        action = f"acquire a lease on thread {show_id(thread_id)} for {owner!r:.80} and load it"
        args = (thread_key(thread_id), thread_id, owner, ttl)
        while True:
            row = await self.connector.fetchrow(action, self._sql.acquire_head, *args)
            assert row is not None
            if row["token"] is not None:
                lease = Lease(thread_id, owner, int(row["token"]), float(row["expires_at"]))
                revision = row["head_revision"]
                if revision != row["head_now"] or (revision is not None and not row["head_record"]):
                    return lease, await self._read_head(thread_id)  # a save landed meanwhile
                if revision is None:
                    return lease, None
                return lease, (int(revision), bytes(row["head_record"]))
            if row["holder"] is not None:
                expires = float(row["holder_expires"])
                holder = Lease(thread_id, str(row["holder"]), int(row["holder_token"]), expires)
                return Busy(holder), None
            # Another acquisition created the lease row at the same moment: go again.

    async def _diagnose(self, write: Write) -> Refused:
        tid = write.thread_id
        args = (self._sql.diagnose, thread_key(tid), tid)
        row = await self.connector.fetchrow(f"check thread {show_id(tid)}", *args)
        assert row is not None
        return _refused(row, tid)

    async def _read_head(self, thread_id: str) -> tuple[int, bytes] | None:
        action, args = f"load thread {show_id(thread_id)}", (thread_key(thread_id), thread_id)
        row = await self.connector.fetchrow(action, self._sql.load, *args, read=True)
        if row is None:
            return None
        if row["record"] is None:
            raise SnapshotEnvelopeInvalidError(
                f"the head of thread {show_id(thread_id)} is at revision {row['revision']}, "
                "but the history has no record of it"
            )
        return int(row["revision"]), bytes(row["record"])

    async def _read_history(self, thread_id: str, limit: int) -> list[tuple[int, bytes]]:
        action = f"read the history of thread {show_id(thread_id)}"
        args = (thread_key(thread_id), limit)
        rows = await self.connector.fetch(action, self._sql.history, *args, read=True)
        return [(int(row["revision"]), bytes(row["record"])) for row in rows]

    async def _prune(self, thread_id: str, keep: int) -> None:
        action = f"prune the history of thread {show_id(thread_id)}"
        await self.connector.execute(action, self._sql.prune, thread_key(thread_id), keep)

    async def _delete(self, thread_id: str, *, if_idle: bool) -> Lease | None:
        key = thread_key(thread_id)

        async def body(conn: PgConnection) -> Lease | None:
            row = await conn.fetchrow(self._sql.delete, key, thread_id, if_idle)
            if row is not None:
                return Lease(thread_id, str(row[0]), int(row[1]), float(row[2]))
            await conn.execute(self._sql.delete_rest, key, thread_id)
            return None

        async def delete(conn: PgConnection) -> Lease | None:
            if conn.is_in_transaction():  # the application's: it commits or rolls back both
                return await body(conn)
            async with conn.transaction():
                return await body(conn)

        return await self.connector.run(f"delete thread {show_id(thread_id)}", delete)

    async def _list_heads(
        self, statuses: frozenset[HandoffStatus] | None, limit: int, after: str | None
    ) -> list[ThreadSummary]:
        kind = None if statuses is None else "any" if HandoffStatus.NONE in statuses else "handoff"
        args: list[object] = [limit]
        if after is not None:
            args.append(after)
        if statuses is not None:
            args.append(sorted(s.value for s in statuses))
        sql = self._sql.list[(kind, after is not None)]
        rows = await self.connector.fetch("list threads", sql, *args, read=True)
        return [
            self.summary(str(r[0]), r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9])
            for r in rows
        ]

    async def _recent_heads(
        self, limit: int, before: tuple[int, str] | None
    ) -> list[ThreadSummary]:
        if before is None:
            rows = await self.connector.fetch(
                "list recent threads", self._sql.recent, limit, read=True
            )
        else:
            sql = self._sql.recent_before
            rows = await self.connector.fetch("list recent threads", sql, limit, *before, read=True)
        return [
            self.summary(str(r[0]), r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9])
            for r in rows
        ]

    async def _oldest_heads(self, statuses: frozenset[RunStatus]) -> dict[RunStatus, float]:
        args = (self._sql.oldest_heads, sorted(s.value for s in statuses))
        rows = await self.connector.fetch("read the oldest parked threads", *args, read=True)
        return {RunStatus(str(row[0])): float(row[1]) for row in rows}

    async def _timers(self, before: float, limit: int) -> list[Timer]:
        rows = await self.connector.fetch("list timers", self._sql.timers, before, limit, read=True)
        return [Timer(str(row[0]), float(row[1])) for row in rows]

    async def _append_signal(
        self, thread_id: str, signal_id: str, data: bytes, max_seq: int
    ) -> tuple[int, bool] | None:
        args = (thread_key(thread_id), thread_id, text_key(signal_id), signal_id, data, max_seq)
        action = f"signal thread {show_id(thread_id)}"
        while True:  # each empty answer means a racing signal committed: the next one sees it
            row = await self.connector.fetchrow(action, self._sql.append_signal, *args)
            if row is not None:
                return None if row[1] is None else (int(row[0]), bool(row[1]))

    async def _read_signals(
        self, thread_id: str, after: int, limit: int
    ) -> list[tuple[int, bytes]]:
        action = f"read the signals of thread {show_id(thread_id)}"
        args = (thread_key(thread_id), thread_id, after, limit)
        rows = await self.connector.fetch(action, self._sql.signals, *args, read=True)
        return [(int(row[0]), bytes(row[1])) for row in rows]

    async def _put_activity(self, thread_id: str, key: str, data: bytes) -> None:
        action = f"record activity {show_id(key)} of thread {show_id(thread_id)}"
        args = (thread_key(thread_id), thread_id, text_key(key), key, data)
        await self.connector.execute(action, self._sql.put_activity, *args)

    async def _get_activity(self, thread_id: str, key: str) -> bytes | None:
        action = f"read activity {show_id(key)} of thread {show_id(thread_id)}"
        args = (thread_key(thread_id), thread_id, text_key(key), key)
        row = await self.connector.fetchrow(action, self._sql.get_activity, *args, read=True)
        return None if row is None else bytes(row[0])

    async def _list_activities(self, thread_id: str) -> list[bytes]:
        action = f"read the journal of thread {show_id(thread_id)}"
        args = (thread_key(thread_id), thread_id)
        rows = await self.connector.fetch(action, self._sql.activities, *args, read=True)
        return [bytes(row[0]) for row in rows]
