"""Fenced run leases stored in the SQLite file (table ``flowy_leases``).

A row per thread keeps the owner, the fencing token and the expiry. Releasing clears
the owner but keeps the row, so the next acquisition's token is still greater than
every earlier one. Expiry is judged by the local clock of the process that writes
(``time.time()`` by default), inside the write transaction.
"""

from __future__ import annotations

import sqlite3
from dataclasses import replace

from ._checkpoint import Lease, validate_thread_id
from ._errors import LeaseLostError, ThreadLeaseBusyError
from ._sqlite_db import SQLiteResource, immediate

__all__ = ["SQLiteLeaseManager", "live_lease"]


def live_lease(conn: sqlite3.Connection, thread_id: str, now: float) -> Lease | None:
    """The live lease on ``thread_id`` at ``now``, read on the worker thread."""
    row = conn.execute(
        "SELECT owner, token, expires_at FROM flowy_leases WHERE thread_id = ?", (thread_id,)
    ).fetchone()
    if row is None or row[0] is None or float(row[2]) <= now:
        return None
    return Lease(thread_id, str(row[0]), int(row[1]), float(row[2]))


def _check_current(conn: sqlite3.Connection, lease: Lease, now: float, action: str) -> None:
    live = live_lease(conn, lease.thread_id, now)
    if live is None or live.token != lease.token or live.owner != lease.owner:
        raise LeaseLostError(
            f"cannot {action} lease {lease.token} of {lease.owner!r} on thread "
            f"{lease.thread_id!r}: it expired or was taken over"
        )


class SQLiteLeaseManager(SQLiteResource):
    """Run leases in a SQLite file, shared by every process that opens the file.

    A ``SQLiteCheckpointer`` on the same file checks these leases in the transaction of
    each save (it ``fences`` this manager). Leases expire by the local clock, so all
    processes sharing the file must run on one machine.
    """

    async def acquire(self, thread_id: str, owner: str, ttl: float) -> Lease:
        validate_thread_id(thread_id)
        if ttl <= 0:
            raise ValueError(f"lease ttl must be positive, got {ttl!r}")
        clock = self.database.clock

        def job(conn: sqlite3.Connection) -> Lease:
            def body() -> Lease:
                now = clock()
                live = live_lease(conn, thread_id, now)
                if live is not None:
                    raise ThreadLeaseBusyError(
                        f"thread {thread_id!r} is leased by {live.owner!r} (token "
                        f"{live.token}) for {live.expires_at - now:.1f}s more"
                    )
                row = conn.execute(
                    "SELECT token FROM flowy_leases WHERE thread_id = ?", (thread_id,)
                ).fetchone()
                lease = Lease(thread_id, owner, (int(row[0]) if row else 0) + 1, now + ttl)
                conn.execute(
                    "INSERT INTO flowy_leases (thread_id, owner, token, expires_at) "
                    "VALUES (?, ?, ?, ?) ON CONFLICT (thread_id) DO UPDATE SET "
                    "owner = excluded.owner, token = excluded.token, "
                    "expires_at = excluded.expires_at",
                    (thread_id, owner, lease.token, lease.expires_at),
                )
                return lease

            return immediate(conn, body)

        return await self.database.run(job, f"acquire a lease on thread {thread_id!r}")

    async def renew(self, lease: Lease, ttl: float) -> Lease:
        clock = self.database.clock

        def job(conn: sqlite3.Connection) -> Lease:
            def body() -> Lease:
                now = clock()
                _check_current(conn, lease, now, "renew")
                renewed = replace(lease, expires_at=now + ttl)
                conn.execute(
                    "UPDATE flowy_leases SET expires_at = ? WHERE thread_id = ?",
                    (renewed.expires_at, lease.thread_id),
                )
                return renewed

            return immediate(conn, body)

        return await self.database.run(job, f"renew the lease on thread {lease.thread_id!r}")

    async def release(self, lease: Lease) -> None:
        clock = self.database.clock

        def job(conn: sqlite3.Connection) -> None:
            def body() -> None:
                _check_current(conn, lease, clock(), "release")
                # The row (and its token) stays so that tokens never go back.
                conn.execute(
                    "UPDATE flowy_leases SET owner = NULL, expires_at = 0 WHERE thread_id = ?",
                    (lease.thread_id,),
                )

            immediate(conn, body)

        await self.database.run(job, f"release the lease on thread {lease.thread_id!r}")

    async def holder(self, thread_id: str) -> Lease | None:
        validate_thread_id(thread_id)
        clock = self.database.clock
        return await self.database.run(
            lambda conn: live_lease(conn, thread_id, clock()),
            f"read the lease on thread {thread_id!r}",
        )
