"""``RedisLeaseManager``: exclusive, expiring, fenced run leases kept in the thread's own
hash slot, timed by the Redis server's clock.
"""

from __future__ import annotations

import math
import uuid
from typing import Any

from flowy import LeaseLostError, ThreadLeaseBusyError
from flowy.checkpoint import Lease, validate_thread_id

from ._keys import DEFAULT_NAMESPACE, DEFAULT_SHARDS, describe
from ._scripts import ACQUIRE, HOLDER, OK, RELEASE, RENEW
from ._store import RedisClient, StoreUser, connect

__all__ = ["RedisLeaseManager"]


def _ttl_us(ttl: float) -> int:
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not math.isfinite(ttl):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ValueError(f"lease ttl must be a finite number of seconds, got {ttl!r}")
    if ttl <= 0:
        raise ValueError(f"lease ttl must be positive, got {ttl!r}")
    return max(1, round(ttl * 1_000_000))


def _expires(value: bytes | int) -> float:
    return int(value) / 1_000_000


def _owner(owner: object) -> str:
    if not isinstance(owner, str):
        raise TypeError(f"lease owner must be a str, got {type(owner).__name__} {owner!r}")
    return owner


class RedisLeaseManager(StoreUser):
    """Fenced run leases on Redis (standalone or Cluster).

    A thread's lease is a hash beside its checkpoint (same hash slot): owner, fencing
    token and expiry in microseconds of the server's clock (``TIME``). The token is a
    counter that release, expiry and ``RedisCheckpointer.delete`` keep, so it grows on
    every acquisition and never goes back. Pair it with a ``RedisCheckpointer`` of the
    same namespace: its saves check these leases atomically.

    Args:
        client: a ``redis.asyncio.Redis`` or ``redis.asyncio.RedisCluster`` client.
        namespace: the prefix of every key (as the checkpointer's).
        shards: the namespace's outbox shard count (as the checkpointer's).
    """

    def __init__(
        self,
        client: RedisClient,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        shards: int = DEFAULT_SHARDS,
    ) -> None:
        super().__init__(client, namespace=namespace, shards=shards)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        cluster: bool = False,
        namespace: str = DEFAULT_NAMESPACE,
        shards: int = DEFAULT_SHARDS,
        **client_options: Any,
    ) -> RedisLeaseManager:
        """A lease manager with its own client for ``url``; ``aclose()`` closes it."""
        manager = cls(
            connect(url, cluster=cluster, **client_options), namespace=namespace, shards=shards
        )
        return manager._owning_client()

    @property
    def client(self) -> RedisClient:
        """The Redis client."""
        return self._store.client

    async def acquire(self, thread_id: str, owner: str, ttl: float) -> Lease:
        """Take the thread for ``ttl`` seconds; ``ThreadLeaseBusyError`` while any live
        lease holds it (even one of the same owner)."""
        thread_id = validate_thread_id(thread_id)
        owner = _owner(owner)
        ttl_us = _ttl_us(ttl)
        keys = self._store.layout.thread(thread_id)
        reply: list[Any] = await self._store.run(
            ACQUIRE,
            [keys.lease],
            [owner, ttl_us, uuid.uuid4().hex],
            lambda: f"acquiring the lease of thread {describe(thread_id)}",
        )
        if int(reply[0]) == OK:
            return Lease(thread_id, owner, int(reply[1]), _expires(reply[2]))
        holder = reply[1].decode("utf-8", "replace")
        left = (int(reply[3]) - int(reply[4])) / 1e6
        raise ThreadLeaseBusyError(
            f"thread {describe(thread_id)} is leased by {holder!r} (token {int(reply[2])}) "
            f"for {left:.1f}s more; {owner!r} cannot take it until it is released or expires"
        )

    async def renew(self, lease: Lease, ttl: float) -> Lease:
        """Extend a live lease to now + ``ttl``; ``LeaseLostError`` if it is not current."""
        thread_id = validate_thread_id(lease.thread_id)
        ttl_us = _ttl_us(ttl)
        keys = self._store.layout.thread(thread_id)
        reply: list[Any] = await self._store.run(
            RENEW,
            [keys.lease],
            [_owner(lease.owner), int(lease.token), ttl_us],
            lambda: f"renewing the lease of thread {describe(thread_id)}",
        )
        if int(reply[0]) == OK:
            return Lease(thread_id, lease.owner, lease.token, _expires(reply[1]))
        raise self._lost(lease, "renew")

    async def release(self, lease: Lease) -> None:
        """Give the lease up; ``LeaseLostError`` if it expired or was taken over."""
        thread_id = validate_thread_id(lease.thread_id)
        keys = self._store.layout.thread(thread_id)
        reply: list[Any] = await self._store.run(
            RELEASE,
            [keys.lease],
            [_owner(lease.owner), int(lease.token), uuid.uuid4().hex],
            lambda: f"releasing the lease of thread {describe(thread_id)}",
        )
        if int(reply[0]) != OK:
            raise self._lost(lease, "release")

    async def holder(self, thread_id: str) -> Lease | None:
        """The live lease on the thread, or ``None``. Changes nothing."""
        thread_id = validate_thread_id(thread_id)
        keys = self._store.layout.thread(thread_id)
        reply: list[Any] = await self._store.run(
            HOLDER,
            [keys.lease],
            [],
            lambda: f"reading the lease of thread {describe(thread_id)}",
        )
        if int(reply[0]) == 0:
            return None
        return Lease(
            thread_id, reply[1].decode("utf-8", "replace"), int(reply[2]), _expires(reply[3])
        )

    @staticmethod
    def _lost(lease: Lease, action: str) -> LeaseLostError:
        return LeaseLostError(
            f"cannot {action} lease {lease.token} of {lease.owner!r} on thread "
            f"{describe(lease.thread_id)}: it expired, was released or was taken over. "
            f"Stop writing to the thread; acquire a new lease to continue."
        )
