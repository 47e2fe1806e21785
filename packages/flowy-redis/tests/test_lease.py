"""``RedisLeaseManager`` beyond the conformance suite: the server's clock, the token
counter outliving release and thread deletion, resent calls, argument checks."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from redis.asyncio import RedisCluster
from redis_support import BackendFactory

from flowy import LeaseLostError, ThreadLeaseBusyError
from flowy.checkpoint import Snapshot
from flowy_redis._scripts import ACQUIRE, RELEASE

pytestmark = pytest.mark.anyio


def _tid() -> str:
    return f"lease-{uuid.uuid4().hex[:8]}"


async def test_expiry_is_on_the_servers_clock(make_backend: BackendFactory) -> None:
    backend = make_backend()
    tid = _tid()
    client: Any = backend.client
    lease = await backend.leases.acquire(tid, "owner", 10)
    if isinstance(backend.client, RedisCluster):  # the clock of the node holding the lease
        node = client.get_node_from_key(backend.leases.layout.thread(tid).lease)
        seconds, micros = await client.time(target_nodes=node)
    else:
        seconds, micros = await client.time()
    server_now = seconds + micros / 1e6
    assert 9.0 <= lease.expires_at - server_now <= 10.0
    stored = await client.hget(backend.leases.layout.thread(tid).lease, "exp")
    assert int(stored) == round(lease.expires_at * 1e6)


async def test_the_token_counter_outlives_release_and_deletion(
    make_backend: BackendFactory,
) -> None:
    backend = make_backend()
    tid = _tid()
    first = await backend.leases.acquire(tid, "owner", 30)
    await backend.checkpointer.save(0, Snapshot(tid, {}, "start"), lease=first)
    await backend.leases.release(first)
    await backend.checkpointer.delete_if_idle(tid)
    second = await backend.leases.acquire(tid, "owner", 30)
    assert second.token == first.token + 1
    with pytest.raises(LeaseLostError):
        await backend.checkpointer.save(0, Snapshot(tid, {}, "start"), lease=first)
    assert await backend.checkpointer.save(0, Snapshot(tid, {}, "start"), lease=second) == 1


async def test_resent_acquire_and_release_are_not_refused(make_backend: BackendFactory) -> None:
    """The scripts recognise their own call (its nonce) when a driver resends it."""
    backend = make_backend()
    store = backend.leases._store  # pyright: ignore[reportPrivateUsage]
    key = backend.leases.layout.thread(tid := _tid()).lease
    nonce = uuid.uuid4().hex
    first = await store.run(ACQUIRE, [key], ["owner", 30_000_000, nonce], "test")
    again = await store.run(ACQUIRE, [key], ["owner", 30_000_000, nonce], "test")
    assert int(first[0]) == int(again[0]) == 0
    assert (int(first[1]), first[2]) == (int(again[1]), again[2])
    with pytest.raises(ThreadLeaseBusyError):
        await backend.leases.acquire(tid, "owner", 30)
    token = int(first[1])
    release_nonce = uuid.uuid4().hex
    assert await store.run(RELEASE, [key], ["owner", token, release_nonce], "test") == [0]
    assert await store.run(RELEASE, [key], ["owner", token, release_nonce], "test") == [0]
    assert await backend.leases.holder(tid) is None


@pytest.mark.parametrize("ttl", [0, -1, float("nan"), float("inf")])
async def test_bad_ttls_are_refused(make_backend: BackendFactory, ttl: float) -> None:
    leases = make_backend().leases
    with pytest.raises(ValueError, match="ttl"):
        await leases.acquire(_tid(), "owner", ttl)


async def test_owner_must_be_text(make_backend: BackendFactory) -> None:
    leases = make_backend().leases
    with pytest.raises(TypeError, match="owner"):
        await leases.acquire(_tid(), b"owner", 5)  # type: ignore[arg-type]
