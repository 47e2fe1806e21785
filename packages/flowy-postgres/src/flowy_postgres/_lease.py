"""``PostgresLeaseManager``: the lease primitives on the leases table, one statement each.

Expiry is judged by the database clock. A thread's row exists while it is leased (release
deletes it, a delete of the thread removes it once not live, an acquisition replaces an
expired one); the fencing token ``max(previous + 1, the clock in microseconds)`` never
goes back for a thread, even after its row was deleted. A takeover locks the row ``FOR
UPDATE``, so it waits for any save in flight under the old lease (a save holds the row
``FOR KEY SHARE``): once a new owner has the thread, no write of the old one can commit.
Renew is a plain update, which ``KEY SHARE`` does not block; release deletes the row or,
while a save of the lease sits in an open application transaction, marks it released.
"""

from __future__ import annotations

from collections.abc import Hashable

from flowy.storage import Lease
from flowy.storage.dialect import BaseLeaseManager, Busy, show_id

from ._conn import Connector
from ._schema import TableNames, thread_key

__all__ = ["PostgresLeaseManager", "acquire_sql"]

_LIVE = "expires_at > clock_timestamp()"
_NOW_US = "(extract(epoch FROM clock_timestamp()) * 1e6)::bigint"
_UNTIL = "clock_timestamp() + make_interval(secs => $4::float8)"
_MINE = "thread_key = $1 AND thread_id = $2::text AND owner = $3::text AND token = $4::bigint"


def acquire_sql(n: TableNames, head: str = "") -> str:
    """The acquisition statement: $1 key, $2 thread id, $3 owner, $4 ttl (seconds);
    ``head`` adds columns to its one row (the checkpointer reads the head with it)."""
    return f"""
WITH cur AS (
    SELECT owner, token, expires_at, coalesce({_LIVE}, false) AS live
    FROM {n.leases} WHERE thread_key = $1 FOR UPDATE
), taken AS (
    UPDATE {n.leases} AS l
    SET owner = $3::text, token = greatest(l.token + 1, {_NOW_US}), expires_at = {_UNTIL}
    FROM cur WHERE l.thread_key = $1 AND NOT cur.live
    RETURNING l.token, l.expires_at
), created AS (
    INSERT INTO {n.leases} (thread_key, thread_id, owner, token, expires_at)
    SELECT $1, $2::text, $3::text, {_NOW_US}, {_UNTIL}
    WHERE NOT EXISTS (SELECT FROM cur)
    ON CONFLICT (thread_key) DO NOTHING
    RETURNING token, expires_at
), won AS (
    SELECT token, expires_at FROM taken UNION ALL SELECT token, expires_at FROM created
)
SELECT won.token, extract(epoch FROM won.expires_at)::float8 AS expires_at,
       cur.owner AS holder, cur.token AS holder_token,
       extract(epoch FROM cur.expires_at)::float8 AS holder_expires{head}
FROM (SELECT 1) AS one LEFT JOIN won ON true LEFT JOIN cur ON cur.live
"""


class _Sql:
    def __init__(self, n: TableNames) -> None:
        self.acquire = acquire_sql(n)
        # $1 key, $2 thread id, $3 owner, $4 token, $5 ttl (seconds)
        self.renew = f"""
UPDATE {n.leases} SET expires_at = clock_timestamp() + make_interval(secs => $5::float8)
WHERE {_MINE} AND {_LIVE}
RETURNING extract(epoch FROM expires_at)::float8
"""
        # A save in flight holds the row FOR KEY SHARE: mark it released rather than wait.
        self.release = f"""
WITH gone AS (
    DELETE FROM {n.leases} WHERE thread_key = $1 AND ctid = (
        SELECT ctid FROM {n.leases} WHERE {_MINE} AND {_LIVE} FOR UPDATE SKIP LOCKED)
    RETURNING token
), marked AS (
    UPDATE {n.leases} SET owner = NULL, expires_at = NULL
    WHERE {_MINE} AND {_LIVE} AND NOT EXISTS (SELECT FROM gone)
    RETURNING token
)
SELECT token FROM gone UNION ALL SELECT token FROM marked
"""
        self.holder = f"""
SELECT owner, token, extract(epoch FROM expires_at)::float8 AS expires_at
FROM {n.leases} WHERE thread_key = $1 AND thread_id = $2::text AND {_LIVE}
"""


class PostgresLeaseManager(BaseLeaseManager):
    """The run leases of a :class:`~flowy_postgres.PostgresBackend`, timed by the
    database clock; its checkpointer checks them in the same statement as each save."""

    def __init__(self, connector: Connector) -> None:
        self.connector = connector
        self.domain: Hashable = connector.domain
        self._sql = _Sql(connector.names)

    async def _acquire(self, thread_id: str, owner: str, ttl: float) -> Lease | Busy:
        action = f"acquire a lease on thread {show_id(thread_id)} for {owner!r:.80}"
        while True:
            args = (thread_key(thread_id), thread_id, owner, ttl)
            row = await self.connector.fetchrow(action, self._sql.acquire, *args)
            assert row is not None
            if row["token"] is not None:
                return Lease(thread_id, owner, int(row["token"]), float(row["expires_at"]))
            if row["holder"] is not None:
                expires = float(row["holder_expires"])
                return Busy(Lease(thread_id, str(row["holder"]), int(row["holder_token"]), expires))
            # Another acquisition created the row at the same moment: report its holder
            # (or, should that lease be gone already, try again).
            if (holder := await self._holder(thread_id)) is not None:
                return Busy(holder)

    async def _renew(self, lease: Lease, ttl: float) -> Lease | None:
        tid, owner, token = lease.thread_id, lease.owner, lease.fencing_token
        action = f"renew lease {token} on thread {show_id(tid)}"
        args = (thread_key(tid), tid, owner, token, ttl)
        row = await self.connector.fetchrow(action, self._sql.renew, *args)
        return None if row is None else Lease(tid, owner, token, float(row[0]))

    async def _release(self, lease: Lease) -> bool:
        tid, token = lease.thread_id, lease.fencing_token
        action = f"release lease {token} on thread {show_id(tid)}"
        args = (thread_key(tid), tid, lease.owner, token)
        return await self.connector.fetchrow(action, self._sql.release, *args) is not None

    async def _holder(self, thread_id: str) -> Lease | None:
        action = f"read the lease of thread {show_id(thread_id)}"
        args = (thread_key(thread_id), thread_id)
        row = await self.connector.fetchrow(action, self._sql.holder, *args, read=True)
        if row is None:
            return None
        return Lease(thread_id, str(row["owner"]), int(row["token"]), float(row["expires_at"]))
