"""``PostgresLeaseManager``: exclusive, expiring, fenced run leases in the leases table.

One row per thread that was ever leased: the current owner and expiry (by the database
clock, ``clock_timestamp()``) and the fencing token, a counter that only grows and
survives release. Each operation is one statement.

A takeover locks the lease row ``FOR UPDATE`` and so waits for any save still in flight
under the old lease (a save holds the row ``FOR KEY SHARE`` until its transaction ends):
once a new owner has the thread, no write of the old owner can commit. Renew and release
are plain updates, which a ``KEY SHARE`` lock does not block, so a holder can renew or
release while its own save sits in an uncommitted application transaction.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import TYPE_CHECKING, Self, cast

from flowy import Lease, LeaseLostError, ThreadLeaseBusyError
from flowy.checkpoint import validate_thread_id

from ._conn import PgComponent, PgConnection, create_pool
from ._errors import show_id
from ._schema import DEFAULT_PREFIX, DEFAULT_SCHEMA, TableNames, thread_key

if TYPE_CHECKING:
    import asyncpg

__all__ = ["PostgresLeaseManager"]


class _Sql:
    def __init__(self, n: TableNames) -> None:
        self.acquire = f"""
WITH cur AS (
    SELECT owner, token, expires_at,
           coalesce(expires_at > clock_timestamp(), false) AS live
    FROM {n.leases}
    WHERE thread_key = $1
    FOR UPDATE
), taken AS (
    UPDATE {n.leases} AS l
    SET owner = $3::text, token = l.token + 1,
        expires_at = clock_timestamp() + make_interval(secs => $4::float8)
    FROM cur
    WHERE l.thread_key = $1 AND l.thread_id = $2::text AND NOT cur.live
    RETURNING l.token, l.expires_at
), created AS (
    INSERT INTO {n.leases} (thread_key, thread_id, owner, token, expires_at)
    SELECT $1, $2::text, $3::text, 1,
           clock_timestamp() + make_interval(secs => $4::float8)
    WHERE NOT EXISTS (SELECT 1 FROM cur)
    ON CONFLICT (thread_key) DO NOTHING
    RETURNING token, expires_at
), won AS (
    SELECT token, expires_at FROM taken UNION ALL SELECT token, expires_at FROM created
)
SELECT won.token, extract(epoch FROM won.expires_at)::float8 AS expires_at,
       cur.owner AS holder, cur.token AS holder_token,
       extract(epoch FROM cur.expires_at - clock_timestamp())::float8 AS remaining
FROM (SELECT 1) AS one
LEFT JOIN won ON true
LEFT JOIN cur ON true
"""
        self.renew = f"""
UPDATE {n.leases}
SET expires_at = clock_timestamp() + make_interval(secs => $5::float8)
WHERE thread_key = $1 AND thread_id = $2::text AND owner = $3::text AND token = $4::bigint
  AND expires_at > clock_timestamp()
RETURNING extract(epoch FROM expires_at)::float8
"""
        self.release = f"""
UPDATE {n.leases}
SET owner = NULL, expires_at = NULL
WHERE thread_key = $1 AND thread_id = $2::text AND owner = $3::text AND token = $4::bigint
  AND expires_at > clock_timestamp()
RETURNING token
"""
        self.holder = f"""
SELECT owner, token, extract(epoch FROM expires_at)::float8 AS expires_at
FROM {n.leases}
WHERE thread_key = $1 AND thread_id = $2::text AND expires_at > clock_timestamp()
"""


@lru_cache(maxsize=64)
def _sql(names: TableNames) -> _Sql:
    return _Sql(names)


def _check_ttl(ttl: float) -> float:
    value = cast(object, ttl)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"lease ttl must be a finite number of seconds, got {ttl!r}")
    if ttl <= 0:
        raise ValueError(f"lease ttl must be positive, got {ttl!r}")
    return float(ttl)


class PostgresLeaseManager(PgComponent):
    """Run leases on threads, stored in PostgreSQL and timed by the database clock.

    Give it the same pool, schema and prefix as the ``PostgresCheckpointer`` so the
    checkpointer fences its saves with these leases (``checkpointer.fences(leases)``).
    """

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
        """A lease manager on a pool of its own (closed by :meth:`close`)."""
        pool = await create_pool(dsn, pooler_mode=pooler_mode, min_size=min_size, max_size=max_size)
        manager = cls(pool, schema=schema, prefix=prefix, acquire_timeout=acquire_timeout)
        return manager._owning_pool()

    async def acquire(self, thread_id: str, owner: str, ttl: float) -> Lease:
        """Take the thread for ``ttl`` seconds; ``ThreadLeaseBusyError`` while another live
        lease (of any owner, this one included) holds it. The fencing token is one more
        than the thread's previous one."""
        validate_thread_id(thread_id)
        seconds = _check_ttl(ttl)
        owner = _check_owner(owner)
        action = f"acquire a lease on thread {show_id(thread_id)} for {owner!r}"
        async with self._connector.connection(action) as conn:
            row = await conn.fetchrow(
                self._sql.acquire, thread_key(thread_id), thread_id, owner, seconds
            )
        assert row is not None
        if row["token"] is None:
            holder = row["holder"]
            if holder is None:  # another acquire created the row at the same moment
                raise ThreadLeaseBusyError(
                    f"thread {show_id(thread_id)} was leased by another owner at the same "
                    f"moment; try again after its lease ends"
                )
            remaining = row["remaining"] or 0.0
            raise ThreadLeaseBusyError(
                f"thread {show_id(thread_id)} is leased by {holder!r} (token "
                f"{row['holder_token']}) for {remaining:.1f}s more; wait for it to be "
                f"released or to expire"
            )
        return Lease(thread_id, owner, int(row["token"]), float(row["expires_at"]))

    async def renew(self, lease: Lease, ttl: float) -> Lease:
        """Extend a live lease to now + ``ttl``; ``LeaseLostError`` if it is not current."""
        validate_thread_id(lease.thread_id)
        seconds = _check_ttl(ttl)
        action = f"renew lease {lease.token} on thread {show_id(lease.thread_id)}"
        async with self._connector.connection(action) as conn:
            expires_at = await conn.fetchval(
                self._sql.renew,
                thread_key(lease.thread_id),
                lease.thread_id,
                lease.owner,
                lease.token,
                seconds,
            )
        if expires_at is None:
            raise self._lost(lease, "renew")
        return Lease(lease.thread_id, lease.owner, lease.token, float(expires_at))

    async def release(self, lease: Lease) -> None:
        """Give the lease up (its token stays counted); ``LeaseLostError`` if it expired
        or was taken over."""
        validate_thread_id(lease.thread_id)
        action = f"release lease {lease.token} on thread {show_id(lease.thread_id)}"
        async with self._connector.connection(action) as conn:
            token = await conn.fetchval(
                self._sql.release,
                thread_key(lease.thread_id),
                lease.thread_id,
                lease.owner,
                lease.token,
            )
        if token is None:
            raise self._lost(lease, "release")

    async def holder(self, thread_id: str) -> Lease | None:
        """The live lease on the thread, or ``None``. Read-only."""
        validate_thread_id(thread_id)

        async def query(conn: PgConnection) -> Lease | None:
            row = await conn.fetchrow(self._sql.holder, thread_key(thread_id), thread_id)
            if row is None:
                return None
            return Lease(thread_id, str(row["owner"]), int(row["token"]), float(row["expires_at"]))

        return await self._connector.read(f"read the lease of thread {show_id(thread_id)}", query)

    @staticmethod
    def _lost(lease: Lease, action: str) -> LeaseLostError:
        return LeaseLostError(
            f"cannot {action} lease {lease.token} of {lease.owner!r} on thread "
            f"{show_id(lease.thread_id)}: it expired, was released or was taken over; "
            f"acquire the thread again"
        )


def _check_owner(owner: object) -> str:
    if not isinstance(owner, str) or not owner:
        raise ValueError(f"lease owner must be a non-empty str, got {owner!r}")
    if "\x00" in owner:
        raise ValueError(f"lease owner must not contain NUL characters: {owner!r}")
    return owner
