"""``PostgresLeaseManager`` beyond the conformance suite: the database clock, tokens from
that clock, and lease rows that go away once a thread is released, expired or deleted."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pg_support import Sql, acquired, as_asyncpg, snap, sql

from flowy.errors import LeaseLostError
from flowy_postgres import PostgresBackend
from flowy_postgres._schema import thread_key

pytestmark = pytest.mark.anyio


async def lease_rows(backend: PostgresBackend[Any], thread_id: str) -> list[tuple[Any, ...]]:
    rows = await sql(backend.pool).fetch(
        f"SELECT owner, token FROM {backend.names.leases} WHERE thread_key = $1",
        thread_key(thread_id),
    )
    return [tuple(r) for r in rows]


async def now_us(db: Sql) -> int:
    return int(await db.fetchval("SELECT (extract(epoch FROM clock_timestamp()) * 1e6)::bigint"))


async def test_expiry_and_tokens_follow_the_database_clock(backend: PostgresBackend[Any]) -> None:
    db = sql(backend.pool)
    before = await now_us(db)
    lease = await backend.leases.acquire("clocked", "owner", 60)
    after = await now_us(db)
    assert before <= lease.fencing_token <= after
    assert before / 1e6 + 59 < lease.expires_at <= after / 1e6 + 60.5


async def test_a_released_thread_leaves_no_lease_row(backend: PostgresBackend[Any]) -> None:
    first = await backend.leases.acquire("released", "owner", 30)
    assert await lease_rows(backend, "released") == [("owner", first.fencing_token)]
    await backend.leases.release(first)
    assert await lease_rows(backend, "released") == []
    second = await backend.leases.acquire("released", "owner", 30)
    assert second.fencing_token > first.fencing_token


async def test_a_deleted_thread_leaves_no_lease_row(backend: PostgresBackend[Any]) -> None:
    cp, leases = backend.checkpointer, backend.leases
    first = await leases.acquire("deleted", "owner", 0.2)
    await cp.save(0, snap("deleted"), lease=first)
    await asyncio.sleep(0.3)  # expired, never released
    await cp.delete_if_idle("deleted")
    assert await lease_rows(backend, "deleted") == []
    second = await leases.acquire("deleted", "owner", 30)
    assert second.fencing_token > first.fencing_token
    # A delete while the lease is live keeps it (the run still holds the thread).
    await cp.save(0, snap("deleted"), lease=second)
    await cp.delete("deleted")
    assert await lease_rows(backend, "deleted") == [("owner", second.fencing_token)]
    assert await leases.holder("deleted") == second


async def test_an_expired_row_is_replaced_by_the_next_acquisition(
    backend: PostgresBackend[Any],
) -> None:
    first = await backend.leases.acquire("expired", "old", 0.2)
    await asyncio.sleep(0.3)
    with pytest.raises(LeaseLostError):
        await backend.leases.release(first)
    second = await backend.leases.acquire("expired", "new", 30)
    assert await lease_rows(backend, "expired") == [("new", second.fencing_token)]
    assert second.fencing_token > first.fencing_token


async def test_tokens_grow_even_within_one_microsecond(backend: PostgresBackend[Any]) -> None:
    """The token is max(previous + 1, clock): a forward jump of the counter is kept."""
    lease = await backend.leases.acquire("jump", "owner", 30)
    far = lease.fencing_token + 10**12
    await sql(backend.pool).execute(
        f"UPDATE {backend.names.leases} SET token = $2, expires_at = clock_timestamp() "
        "WHERE thread_key = $1",
        thread_key("jump"),
        far,
    )
    assert (await backend.leases.acquire("jump", "owner", 30)).fencing_token == far + 1


async def test_release_during_an_open_save_marks_the_row_instead_of_waiting(
    backend: PostgresBackend[Any],
) -> None:
    """A save in an uncommitted application transaction holds the lease row; release
    does not wait for it: it marks the row released, and the next acquisition (after the
    transaction) replaces it with a larger token."""
    cp, leases = backend.checkpointer, backend.leases
    lease = await leases.acquire("open-tx", "owner", 30)
    async with acquired(backend.pool) as conn, conn.transaction():
        assert await cp.bind(as_asyncpg(conn)).save(0, snap("open-tx"), lease=lease) == 1
        await asyncio.wait_for(leases.release(lease), 2.0)
        assert await leases.holder("open-tx") is None
        assert await lease_rows(backend, "open-tx") == [(None, lease.fencing_token)]
    again = await leases.acquire("open-tx", "other", 30)
    assert again.fencing_token > lease.fencing_token
    assert await lease_rows(backend, "open-tx") == [("other", again.fencing_token)]


async def test_owners_are_stored_exactly(backend: PostgresBackend[Any]) -> None:
    owner = "worker-é 🦜 'quoted' \"double\" " + "x" * 900
    lease = await backend.leases.acquire("exact-owner", owner, 30)
    assert await backend.leases.holder("exact-owner") == lease
    await backend.leases.release(lease)
