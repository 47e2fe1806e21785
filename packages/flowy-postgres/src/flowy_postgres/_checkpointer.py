"""``PostgresCheckpointer``: strict-OCC snapshots with native fencing and a transactional
outbox path, and ``PostgresTransaction``, the handle its enqueue callbacks receive.

A save is one statement, so one round trip: it locks the thread's lease row
``FOR KEY SHARE`` and checks the lease by the database clock, updates (or creates) the
head row only if it is at the expected revision, and appends the record to the history;
when nothing was written the same statement reports why (the lease, the revision), so
conflict, lost lease and busy thread are told apart without another query (one more read
only when a racing save or takeover committed while this one waited). A load is one
primary-key read of the head row.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Generic, Self, TypeVar, cast

from flowy import (
    ConcurrencyConflictError,
    FlowyError,
    LeaseLostError,
    SnapshotEnvelopeInvalidError,
    ThreadLeaseBusyError,
    ThreadNotFoundError,
)
from flowy.checkpoint import (
    EnqueueCallback,
    HandoffStatus,
    Lease,
    LeaseManager,
    RunStatus,
    Snapshot,
    StateCodec,
    ThreadSummary,
    decode_snapshot,
    encode_snapshot,
    validate_thread_id,
)

from ._conn import PgComponent, PgConnection, Row, atomic, create_pool
from ._errors import show_id
from ._lease import PostgresLeaseManager
from ._schema import DEFAULT_PREFIX, DEFAULT_SCHEMA, TableNames, thread_key

if TYPE_CHECKING:
    import asyncpg
    from asyncpg.pool import PoolConnectionProxy
    from sqlalchemy.ext.asyncio import AsyncConnection

S = TypeVar("S")

__all__ = ["PostgresCheckpointer", "PostgresTransaction"]


def _numbered(sql: str, names: tuple[str, ...]) -> str:
    """Replace ``:name`` placeholders with ``$1``, ``$2``, ... in the order of ``names``."""
    numbers = {name: index for index, name in enumerate(names, 1)}
    for name in sorted(names, key=len, reverse=True):  # longest first: no prefix clash
        sql = sql.replace(f":{name}", f"${numbers[name]}")
    return sql


_WRITE_PARAMS = (
    "key",
    "thread_id",
    "record",
    "pointer",
    "status",
    "reason",
    "handoff_status",
    "pending_at",
    "updated_at",
)


def _save_sql(n: TableNames, *, create: bool, leased: bool) -> tuple[str, tuple[str, ...]]:
    """One save statement and its parameter names, specialised for creating or updating,
    with or without a lease.

    The lease row is locked ``FOR KEY SHARE`` (whether live or not) before the head row is
    written, so a takeover waits for this save and a save waits for a takeover in
    progress. The report columns are computed only when nothing was written.
    Specialising keeps every statement free of parameter-dependent branches, so once
    PostgreSQL has seen a few executions it reuses one generic plan instead of planning
    each save again (planning a statement like this costs more than executing it).
    """
    params = (
        _WRITE_PARAMS
        + (() if create else ("expected",))
        + (("lease_owner", "lease_token") if leased else ())
    )
    locked_lease = (
        f"SELECT owner, token, expires_at FROM {n.leases} WHERE thread_key = :key FOR KEY SHARE"
    )
    if leased:
        fence = f"""EXISTS (SELECT FROM ({locked_lease}) AS lease
            WHERE lease.owner = :lease_owner::text AND lease.token = :lease_token::bigint
              AND lease.expires_at > clock_timestamp())"""
    else:
        fence = f"""NOT EXISTS (SELECT FROM ({locked_lease}) AS lease
            WHERE lease.expires_at > clock_timestamp())"""
    if create:
        write = f"""INSERT INTO {n.threads} (thread_key, thread_id, revision, pointer, status,
        reason, handoff_status, handoff_pending_at, updated_at, saved_at, record)
    SELECT :key, :thread_id::text, 1, :pointer::text, :status::text, :reason::text,
           :handoff_status::text, :pending_at::float8, :updated_at::float8,
           clock_timestamp(), :record::bytea
    WHERE {fence}
    ON CONFLICT (thread_key) DO NOTHING
    RETURNING revision"""
    else:
        write = f"""UPDATE {n.threads}
    SET revision = revision + 1, pointer = :pointer::text, status = :status::text,
        reason = :reason::text, handoff_status = :handoff_status::text,
        handoff_pending_at = :pending_at::float8, updated_at = :updated_at::float8,
        saved_at = clock_timestamp(), record = :record::bytea
    WHERE thread_key = :key AND thread_id = :thread_id::text
      AND revision = :expected::bigint AND {fence}
    RETURNING revision"""
    sql = f"""
WITH written AS (
    {write}
), appended AS (
    INSERT INTO {n.history} (thread_key, revision, record)
    SELECT :key, revision, :record::bytea FROM written
    RETURNING revision
), outcome AS (
    SELECT (SELECT revision FROM appended) AS saved
)
SELECT saved,
    CASE WHEN saved IS NULL THEN (SELECT revision FROM {n.threads}
        WHERE thread_key = :key AND thread_id = :thread_id::text) END AS actual,
    CASE WHEN saved IS NULL THEN (SELECT owner FROM {n.leases}
        WHERE thread_key = :key AND expires_at > clock_timestamp()) END AS holder,
    CASE WHEN saved IS NULL THEN (SELECT token FROM {n.leases}
        WHERE thread_key = :key AND expires_at > clock_timestamp()) END AS holder_token
FROM outcome
"""
    return _numbered(sql, params), params


class _Sql:
    def __init__(self, n: TableNames) -> None:
        # (create, leased) -> (statement, parameter names)
        self.save = {
            (create, leased): _save_sql(n, create=create, leased=leased)
            for create in (False, True)
            for leased in (False, True)
        }
        self.diagnose = f"""
SELECT (SELECT revision FROM {n.threads}
        WHERE thread_key = $1 AND thread_id = $2::text) AS actual,
       (SELECT owner FROM {n.leases}
        WHERE thread_key = $1 AND expires_at > clock_timestamp()) AS holder,
       (SELECT token FROM {n.leases}
        WHERE thread_key = $1 AND expires_at > clock_timestamp()) AS holder_token
"""
        self.load = f"""
SELECT revision, pointer, record FROM {n.threads}
WHERE thread_key = $1 AND thread_id = $2::text
"""
        self.history = f"""
SELECT revision, record FROM {n.history}
WHERE thread_key = $1
ORDER BY revision DESC
LIMIT $2::bigint
"""
        self.prune = f"""
DELETE FROM {n.history}
WHERE thread_key = $1 AND revision < (
    SELECT revision FROM {n.history}
    WHERE thread_key = $1
    ORDER BY revision DESC
    OFFSET $2::bigint - 1
    LIMIT 1
)
"""
        self.delete_head = f"""
DELETE FROM {n.threads} WHERE thread_key = $1 AND thread_id = $2::text
"""
        self.delete_idle_head = f"""
WITH lease AS (
    SELECT owner, token, coalesce(expires_at > clock_timestamp(), false) AS live
    FROM {n.leases}
    WHERE thread_key = $1
    FOR KEY SHARE
), gone AS (
    DELETE FROM {n.threads}
    WHERE thread_key = $1 AND thread_id = $2::text
      AND NOT EXISTS (SELECT 1 FROM lease WHERE live)
    RETURNING 1
)
SELECT lease.owner, lease.token, (SELECT count(*) FROM gone) AS deleted
FROM (SELECT 1) AS one LEFT JOIN lease ON lease.live
"""
        self.delete_history = f"""
DELETE FROM {n.history} WHERE thread_key = $1
"""
        columns = (
            "thread_id, revision, pointer, status, reason, handoff_status, "
            "handoff_pending_at, updated_at"
        )
        self.list_all = f"""
SELECT {columns} FROM {n.threads} ORDER BY thread_key LIMIT $1::bigint
"""
        # The extra predicate lets PostgreSQL use the partial index on hand-off status.
        self.list_handoff = f"""
SELECT {columns} FROM {n.threads}
WHERE handoff_status = ANY($1::text[]) AND handoff_status <> 'none'
ORDER BY thread_key LIMIT $2::bigint
"""
        self.list_status = f"""
SELECT {columns} FROM {n.threads}
WHERE handoff_status = ANY($1::text[])
ORDER BY thread_key LIMIT $2::bigint
"""


@lru_cache(maxsize=64)
def _sql(names: TableNames) -> _Sql:
    return _Sql(names)


class PostgresTransaction:
    """The transaction handle ``save_with_outbox`` passes to its enqueue callback.

    ``connection`` is the asyncpg connection (possibly a pool's proxy of one) inside the
    transaction that also holds the checkpoint write; statements run on it commit or roll
    back with the checkpoint. Give the handle to ``PostgresOutbox.enqueue_intent_tx``.
    """

    __slots__ = ("connection", "revision", "thread_id")

    def __init__(self, connection: asyncpg.Connection, thread_id: str, revision: int) -> None:
        self.connection = connection
        self.thread_id = thread_id
        self.revision = revision

    def __repr__(self) -> str:
        return f"PostgresTransaction(thread_id={show_id(self.thread_id)}, revision={self.revision})"


def _check_revision(expected_revision: int) -> int:
    value = cast(object, expected_revision)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"expected_revision must be an int, got {type(expected_revision).__name__} "
            f"{expected_revision!r}"
        )
    return expected_revision


def _summary(row: Row) -> ThreadSummary:
    thread_id = str(row["thread_id"])
    try:
        status = RunStatus(row["status"])
        handoff_status = HandoffStatus(row["handoff_status"])
    except ValueError as exc:
        raise SnapshotEnvelopeInvalidError(
            f"the head row of thread {show_id(thread_id)} has an unknown status: {exc}"
        ) from exc
    pending_at = row["handoff_pending_at"]
    return ThreadSummary(
        thread_id=thread_id,
        revision=int(row["revision"]),
        execution_pointer=str(row["pointer"]),
        status=status,
        reason=str(row["reason"]),
        handoff_status=handoff_status,
        handoff_pending_at=None if pending_at is None else float(pending_at),
        updated_at=float(row["updated_at"]),
    )


class PostgresCheckpointer(PgComponent, Generic[S]):
    """Strict-OCC checkpointer on PostgreSQL; fencing and transactional.

    Build it from the same pool, schema and prefix as the ``PostgresLeaseManager`` and
    ``PostgresOutbox`` it works with; run ``await flowy_postgres.migrate(pool, ...)``
    once beforehand. ``codec`` encodes states (JSON by default).

    Every operation takes a connection from the pool for its duration, waiting at most
    ``acquire_timeout`` seconds (then ``flowy.StorageUnavailableError`` names the pool's
    size). :meth:`bind` gives a view that runs on the application's own connection and
    transaction instead.
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        schema: str = DEFAULT_SCHEMA,
        prefix: str = DEFAULT_PREFIX,
        codec: StateCodec[S] | None = None,
        acquire_timeout: float = 10.0,
    ) -> None:
        self.names = TableNames(schema, prefix)
        self.codec = codec
        super().__init__(pool, acquire_timeout=acquire_timeout)
        self._sql = _sql(self.names)

    @classmethod
    async def from_dsn(
        cls,
        dsn: str,
        *,
        schema: str = DEFAULT_SCHEMA,
        prefix: str = DEFAULT_PREFIX,
        codec: StateCodec[S] | None = None,
        acquire_timeout: float = 10.0,
        pooler_mode: bool = False,
        min_size: int = 1,
        max_size: int = 10,
    ) -> Self:
        """A checkpointer on a pool of its own (closed by :meth:`close`).

        ``pooler_mode=True`` creates the pool with ``statement_cache_size=0`` for
        transaction-mode poolers such as PgBouncer.
        """
        pool = await create_pool(dsn, pooler_mode=pooler_mode, min_size=min_size, max_size=max_size)
        checkpointer = cls(
            pool, schema=schema, prefix=prefix, codec=codec, acquire_timeout=acquire_timeout
        )
        return checkpointer._owning_pool()

    def bind(
        self, connection: asyncpg.Connection | PoolConnectionProxy | AsyncConnection
    ) -> PostgresCheckpointer[S]:
        """A view of this checkpointer that runs every operation on ``connection``.

        ``connection`` is an asyncpg connection or a SQLAlchemy ``AsyncConnection`` on the
        asyncpg driver (extra ``flowy-postgres[sqlalchemy]``). When it is inside a
        transaction, saves join that transaction and ``save_with_outbox`` works in a
        savepoint of it: the checkpoint and its outbox row commit or roll back with the
        application's own writes. Until the application commits, the thread's head row
        stays locked (other saves of the thread wait) and a takeover of its lease waits;
        renewing or releasing the lease does not. A bound view serves one task at a time,
        like the connection itself, and must not outlive it.
        """
        view = copy.copy(self)
        view._connector = self._connector.bind(connection)
        view._owns_pool = False
        return view

    def fences(self, leases: LeaseManager) -> bool:
        """True for a ``PostgresLeaseManager`` on the same pool, schema and prefix: saves
        check its leases in the same statement as the revision."""
        return (
            isinstance(leases, PostgresLeaseManager)
            and leases.names == self.names
            and leases.pool is self.pool
        )

    def _save_statement(
        self, expected_revision: int, snapshot: Snapshot[S], lease: Lease | None
    ) -> tuple[str, list[object]]:
        """The save statement for this case and its arguments."""
        thread_id = snapshot.thread_id
        values: dict[str, object] = {
            "key": thread_key(thread_id),
            "thread_id": thread_id,
            "record": encode_snapshot(snapshot, expected_revision + 1, self.codec),
            "pointer": snapshot.execution_pointer,
            "status": snapshot.status.value,
            "reason": snapshot.reason,
            "handoff_status": snapshot.handoff_status.value,
            "pending_at": snapshot.handoff_pending_at,
            "updated_at": snapshot.updated_at,
            "expected": expected_revision,
            "lease_owner": None if lease is None else lease.owner,
            "lease_token": None if lease is None else lease.token,
        }
        sql, params = self._sql.save[(expected_revision == 0, lease is not None)]
        return sql, [values[name] for name in params]

    async def _refusal(
        self,
        conn: PgConnection,
        row: Row | None,
        snapshot: Snapshot[S],
        expected_revision: int,
        lease: Lease | None,
    ) -> FlowyError:
        """Why the save statement wrote nothing, from its own report; when that report
        explains nothing (a racing save or takeover committed while this one waited for
        its lock), from one fresh read."""
        assert row is not None
        error = self._explain(row, snapshot.thread_id, expected_revision, lease)
        if error is None:
            fresh = await conn.fetchrow(
                self._sql.diagnose, thread_key(snapshot.thread_id), snapshot.thread_id
            )
            assert fresh is not None
            error = self._explain(fresh, snapshot.thread_id, expected_revision, lease, final=True)
        assert error is not None
        return error

    @staticmethod
    def _explain(
        row: Row,
        thread_id: str,
        expected_revision: int,
        lease: Lease | None,
        *,
        final: bool = False,
    ) -> FlowyError | None:
        """The error the observed state explains (lease first, as the fence is checked
        first), or ``None``."""
        holder, holder_token = row["holder"], row["holder_token"]
        actual = int(row["actual"] or 0)
        if lease is not None:
            if holder != lease.owner or holder_token != lease.token:
                now = f"held by {holder!r} (token {holder_token})" if holder else "free"
                return LeaseLostError(
                    f"save refused: lease {lease.token} of {lease.owner!r} on thread "
                    f"{show_id(thread_id)} is no longer live (fenced; the thread is {now}); "
                    f"stop this run, it lost the thread"
                )
        elif holder is not None:
            return ThreadLeaseBusyError(
                f"thread {show_id(thread_id)} is leased by {holder!r} (token {holder_token}); "
                f"save with its lease, or wait for it to end"
            )
        if actual != expected_revision or final:
            return ConcurrencyConflictError(
                f"thread {show_id(thread_id)} is at revision {actual}, not "
                f"{expected_revision}; reload it and decide again",
                thread_id=thread_id,
                expected=expected_revision,
                actual=actual,
            )
        return None

    def _check(self, expected_revision: int, snapshot: Snapshot[S], lease: Lease | None) -> str:
        thread_id = validate_thread_id(snapshot.thread_id)
        _check_revision(expected_revision)
        if lease is not None and lease.thread_id != thread_id:
            raise LeaseLostError(
                f"save refused: the lease given is for thread {show_id(lease.thread_id)}, "
                f"not {show_id(thread_id)}"
            )
        return thread_id

    async def save(
        self, expected_revision: int, snapshot: Snapshot[S], *, lease: Lease | None = None
    ) -> int:
        """Store ``snapshot`` as revision ``expected_revision + 1`` in one statement.

        Raises ``ConcurrencyConflictError`` if the head is not at ``expected_revision``,
        ``LeaseLostError`` if ``lease`` is not the thread's live lease,
        ``ThreadLeaseBusyError`` if no lease is given while one is live, and
        ``StorageUnavailableError`` if the connection broke (the write may have landed:
        ``flowy.checkpoint.durable_save`` resolves that). Nothing is retried here.
        """
        thread_id = self._check(expected_revision, snapshot, lease)
        sql, args = self._save_statement(expected_revision, snapshot, lease)
        action = f"save thread {show_id(thread_id)} at revision {expected_revision + 1}"
        async with self._connector.connection(action) as conn:
            row = await conn.fetchrow(sql, *args)
            if row is not None and row["saved"] is not None:
                return int(row["saved"])
            raise await self._refusal(conn, row, snapshot, expected_revision, lease)

    async def save_with_outbox(
        self,
        expected_revision: int,
        snapshot: Snapshot[S],
        enqueue: EnqueueCallback,
        *,
        lease: Lease | None = None,
    ) -> int:
        """Save like :meth:`save` and ``await enqueue(tx, new_revision)`` in the same
        transaction; if either fails, nothing is committed.

        ``tx`` is a :class:`PostgresTransaction`; pass it to
        ``PostgresOutbox.enqueue_intent_tx``. On a bound view (:meth:`bind`) the work runs
        in a savepoint of the application's transaction and commits with it.
        """
        thread_id = self._check(expected_revision, snapshot, lease)
        sql, args = self._save_statement(expected_revision, snapshot, lease)
        action = (
            f"save thread {show_id(thread_id)} at revision {expected_revision + 1} "
            f"with its outbox message"
        )
        async with self._connector.connection(action) as conn, atomic(conn):
            row = await conn.fetchrow(sql, *args)
            if row is None or row["saved"] is None:
                raise await self._refusal(conn, row, snapshot, expected_revision, lease)
            revision = int(row["saved"])
            tx = PostgresTransaction(cast("asyncpg.Connection", conn), thread_id, revision)
            await enqueue(tx, revision)
        return revision

    async def load(self, thread_id: str) -> tuple[Snapshot[S], int]:
        """The head snapshot and its revision (one primary-key read);
        ``ThreadNotFoundError`` if the thread has none."""
        validate_thread_id(thread_id)

        async def query(conn: PgConnection) -> Row | None:
            return await conn.fetchrow(self._sql.load, thread_key(thread_id), thread_id)

        row = await self._connector.read(f"load thread {show_id(thread_id)}", query)
        if row is None:
            raise ThreadNotFoundError(f"no checkpoint for thread {show_id(thread_id)}")
        revision = int(row["revision"])
        snapshot: Snapshot[S] = decode_snapshot(
            bytes(row["record"]),
            self.codec,
            thread_id=thread_id,
            revision=revision,
            execution_pointer=str(row["pointer"]),
        )
        return snapshot, revision

    async def get_history(self, thread_id: str, limit: int = 100) -> list[Snapshot[S]]:
        """Up to ``limit`` stored snapshots, newest first (an index range scan)."""
        validate_thread_id(thread_id)
        if limit <= 0:
            return []

        async def query(conn: PgConnection) -> list[Row]:
            return await conn.fetch(self._sql.history, thread_key(thread_id), limit)

        rows = await self._connector.read(f"read the history of thread {show_id(thread_id)}", query)
        return [
            decode_snapshot(
                bytes(row["record"]), self.codec, thread_id=thread_id, revision=int(row["revision"])
            )
            for row in rows
        ]

    async def prune(self, thread_id: str, retain: int) -> None:
        """Delete all but the newest ``retain`` history entries (at least the head stays)."""
        validate_thread_id(thread_id)
        keep = max(int(retain), 1)
        action = f"prune the history of thread {show_id(thread_id)}"
        async with self._connector.connection(action) as conn:
            await conn.execute(self._sql.prune, thread_key(thread_id), keep)

    async def delete(self, thread_id: str) -> None:
        """Delete the thread's head and history (a missing thread is fine). Its lease
        row stays, so fencing tokens keep growing if the thread is used again."""
        validate_thread_id(thread_id)
        key = thread_key(thread_id)
        async with (
            self._connector.connection(f"delete thread {show_id(thread_id)}") as conn,
            atomic(conn),
        ):
            await conn.execute(self._sql.delete_head, key, thread_id)
            # A separate statement: it sees history rows of saves that committed while
            # the head delete waited for their lock.
            await conn.execute(self._sql.delete_history, key)

    async def delete_if_idle(self, thread_id: str) -> None:
        """Like :meth:`delete`, but ``ThreadLeaseBusyError`` while a live lease holds the
        thread (checked in the same statement as the delete)."""
        validate_thread_id(thread_id)
        key = thread_key(thread_id)
        async with (
            self._connector.connection(f"delete idle thread {show_id(thread_id)}") as conn,
            atomic(conn),
        ):
            row = await conn.fetchrow(self._sql.delete_idle_head, key, thread_id)
            assert row is not None
            if row["owner"] is not None:
                raise ThreadLeaseBusyError(
                    f"thread {show_id(thread_id)} is leased by {row['owner']!r} (token "
                    f"{row['token']}); not deleting it while its run may be alive"
                )
            await conn.execute(self._sql.delete_history, key)

    async def list_threads(
        self,
        *,
        handoff_statuses: frozenset[HandoffStatus] | None = None,
        limit: int = 100,
    ) -> list[ThreadSummary]:
        """Thread heads from their columns (no record is decoded), optionally only those
        whose hand-off status is in ``handoff_statuses``."""
        if limit <= 0 or (handoff_statuses is not None and not handoff_statuses):
            return []

        async def query(conn: PgConnection) -> list[Row]:
            if handoff_statuses is None:
                return await conn.fetch(self._sql.list_all, limit)
            statuses: Sequence[str] = sorted(HandoffStatus(s).value for s in handoff_statuses)
            sql = (
                self._sql.list_status
                if HandoffStatus.NONE in handoff_statuses
                else self._sql.list_handoff
            )
            return await conn.fetch(sql, list(statuses), limit)

        rows = await self._connector.read("list threads", query)
        return [_summary(row) for row in rows]
