"""``RedisLeaseManager`` beyond the conformance suite: the server's clock, tokens from
that clock, lease records that do not outlive their use, and resent calls."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from redis.asyncio import RedisCluster
from redis_support import BackendFactory

from flowy import LeaseLostError, ThreadLeaseBusyError
from flowy.storage import Snapshot
from flowy_redis import RedisBackend
from flowy_redis._scripts import ACQUIRE, RELEASE, RELEASED_TTL_MS

pytestmark = pytest.mark.anyio


def _tid() -> str:
    return f"lease-{uuid.uuid4().hex[:8]}"


async def _server_now(backend: RedisBackend[Any], key: bytes) -> float:
    client: Any = backend.client
    if isinstance(backend.client, RedisCluster):  # the clock of the node holding the key
        seconds, micros = await client.time(target_nodes=client.get_node_from_key(key))
    else:
        seconds, micros = await client.time()
    return seconds + micros / 1e6


async def test_expiry_and_tokens_are_on_the_servers_clock(make_backend: BackendFactory) -> None:
    backend = make_backend()
    tid = _tid()
    key = backend.store.layout.thread(tid).lease
    lease = await backend.leases.acquire(tid, "owner", 10)
    now = await _server_now(backend, key)
    assert 9.0 <= lease.expires_at - now <= 10.0
    assert int(await backend.client.hget(key, "exp")) == round(lease.expires_at * 1e6)  # type: ignore[misc]
    # The token is the server's time of acquisition in µs.
    assert now - 5 <= lease.fencing_token / 1e6 <= now
    # The record expires with the lease, not later than a millisecond after it.
    ttl_ms = await backend.client.pttl(key)
    assert 9_000 <= ttl_ms <= 10_001


async def test_released_and_deleted_threads_leave_no_lease_record(
    make_backend: BackendFactory,
) -> None:
    backend = make_backend()
    client: Any = backend.client
    tid = _tid()
    key = backend.store.layout.thread(tid).lease
    first = await backend.leases.acquire(tid, "owner", 30)
    await backend.checkpointer.save(0, Snapshot(tid, {}, "start"), lease=first)
    await backend.leases.release(first)
    # A release leaves a tombstone that expires soon (a resent release finds it) ...
    assert 0 < await client.pttl(key) <= RELEASED_TTL_MS + 1
    # ... and deleting the thread removes it at once.
    await backend.checkpointer.delete_if_idle(tid)
    assert await client.exists(key) == 0
    second = await backend.leases.acquire(tid, "owner", 30)
    assert second.fencing_token > first.fencing_token
    with pytest.raises(LeaseLostError):
        await backend.checkpointer.save(0, Snapshot(tid, {}, "start"), lease=first)
    assert await backend.checkpointer.save(0, Snapshot(tid, {}, "start"), lease=second) == 1
    # An expired lease's record is gone with it; the next token is still larger.
    other = _tid()
    short = await backend.leases.acquire(other, "owner", 0.05)
    await asyncio.sleep(0.2)
    assert await client.exists(backend.store.layout.thread(other).lease) == 0
    assert (await backend.leases.acquire(other, "owner", 30)).fencing_token > short.fencing_token
    # A delete leaves a live lease alone: it still fences the thread.
    await backend.checkpointer.delete(tid)
    assert await client.exists(key) == 1
    assert await backend.leases.holder(tid) == second


async def test_no_lease_record_lives_forever(make_backend: BackendFactory) -> None:
    backend = make_backend(completed_ttl=30)
    client: Any = backend.client
    tid = _tid()
    lease = await backend.leases.acquire(tid, "owner", 30)
    await backend.leases.renew(lease, 60)
    assert 59_000 <= await client.pttl(backend.store.layout.thread(tid).lease) <= 60_001
    async for key in backend.store.scan(backend.store.layout.pattern(b"lease:")):
        assert await client.pttl(key) > 0


async def test_resent_acquire_and_release_are_not_refused(make_backend: BackendFactory) -> None:
    """The scripts recognise their own call (its nonce) when a driver resends it."""
    backend = make_backend()
    store = backend.store
    key = store.layout.thread(tid := _tid()).lease
    nonce = uuid.uuid4().hex
    first = await store.run(ACQUIRE, [key], ["owner", 30_000_000, nonce], "test")
    again = await store.run(ACQUIRE, [key], ["owner", 30_000_000, nonce], "test")
    assert first == again and int(first[0]) == 1
    with pytest.raises(ThreadLeaseBusyError):
        await backend.leases.acquire(tid, "owner", 30)
    token = first[1]
    release_nonce = uuid.uuid4().hex
    assert await store.run(RELEASE, [key], ["owner", token, release_nonce], "test") == 1
    assert await store.run(RELEASE, [key], ["owner", token, release_nonce], "test") == 1
    assert await store.run(RELEASE, [key], ["owner", token, uuid.uuid4().hex], "test") == 0
    assert await backend.leases.holder(tid) is None
