"""``PostgresLeaseManager`` beyond the conformance suite: the database clock, argument
checks, and long thread ids."""

from __future__ import annotations

import asyncpg
import pytest
from pg_support import sql

from flowy.checkpoint import LeaseManager
from flowy_postgres import PostgresBackend, PostgresLeaseManager

pytestmark = pytest.mark.anyio


async def test_expiry_follows_the_database_clock(pg_pool: asyncpg.Pool, pg_schema: str) -> None:
    leases = PostgresLeaseManager(pg_pool, schema=pg_schema)
    assert isinstance(leases, LeaseManager)
    lease = await leases.acquire("clocked", "owner", 60)
    now = await sql(pg_pool).fetchval("SELECT extract(epoch FROM clock_timestamp())::float8")
    assert now + 59 < lease.expires_at <= now + 60.5


@pytest.mark.parametrize("ttl", [0, -1, float("nan"), float("inf"), True])
async def test_ttl_is_validated(backend: PostgresBackend[object], ttl: float) -> None:
    with pytest.raises(ValueError, match="ttl"):
        await backend.leases.acquire("ttl", "owner", ttl)


@pytest.mark.parametrize("owner", ["", "nul\x00"])
async def test_owner_is_validated(backend: PostgresBackend[object], owner: str) -> None:
    with pytest.raises(ValueError, match="owner"):
        await backend.leases.acquire("owner", owner, 10)


async def test_owners_are_stored_exactly(backend: PostgresBackend[object]) -> None:
    owner = "worker-é 🦜 'quoted' \"double\" " + "x" * 5000
    lease = await backend.leases.acquire("exact-owner", owner, 30)
    holder = await backend.leases.holder("exact-owner")
    assert holder is not None
    assert (holder.owner, holder.token) == (owner, lease.token)
    await backend.leases.release(lease)
