"""``RedisLeaseManager``: exclusive, expiring, fenced run leases in the thread's own hash
slot, timed by the Redis server's clock.
"""

from __future__ import annotations

import uuid
from collections.abc import Hashable
from operator import attrgetter
from typing import Any

from flowy.storage import Lease
from flowy.storage.dialect import BaseLeaseManager, Busy

from ._checkpointer import lease_of
from ._scripts import ACQUIRE, HOLDER, RELEASE, RENEW
from ._store import Store

__all__ = ["RedisLeaseManager"]

_LEASE = attrgetter("lease")


class RedisLeaseManager(BaseLeaseManager):
    """The lease manager of a Redis store (standalone or Cluster).

    A thread's lease is a hash beside its checkpoint: owner, fencing token and expiry in
    µs of the server's clock (``TIME``). The token is ``max(previous + 1, now in µs)``,
    so it grows on every acquisition although the record expires with the lease and is
    removed on release and on the thread's deletion. Acquire and release carry a nonce,
    so a call the driver resends after a timeout is recognised, not refused.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self.domain: Hashable = store.domain

    async def _acquire(self, thread_id: str, owner: str, ttl: float) -> Lease | Busy:
        args = [owner, max(1, round(ttl * 1e6)), uuid.uuid4().hex]
        reply: list[Any] = await self.store.call(
            ACQUIRE, thread_id, _LEASE, args, "acquiring the lease of"
        )
        if int(reply[0]):
            return Lease(thread_id, owner, int(reply[1]), int(reply[2]) / 1e6)
        return Busy(lease_of(thread_id, *reply[1:4]))

    async def _renew(self, lease: Lease, ttl: float) -> Lease | None:
        thread_id, owner, token = lease.thread_id, lease.owner, lease.fencing_token
        args = [owner, str(token), max(1, round(ttl * 1e6))]
        exp = await self.store.call(RENEW, thread_id, _LEASE, args, "renewing the lease of")
        return None if exp is None else Lease(thread_id, owner, token, int(exp) / 1e6)

    async def _release(self, lease: Lease) -> bool:
        args = [lease.owner, str(lease.fencing_token), uuid.uuid4().hex]
        what = "releasing the lease of"
        return bool(await self.store.call(RELEASE, lease.thread_id, _LEASE, args, what))

    async def _holder(self, thread_id: str) -> Lease | None:
        reply: list[bytes] = await self.store.call(
            HOLDER, thread_id, _LEASE, [], "reading the lease of"
        )
        return lease_of(thread_id, *reply) if reply else None
