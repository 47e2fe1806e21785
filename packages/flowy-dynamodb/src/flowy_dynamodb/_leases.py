"""Fenced run leases on the head items of the table, and the lease conditions the
checkpointer's writes share.

A lease is three attributes of the thread's head item (``lease_owner``,
``lease_expires_at``, ``lease_token``), so one condition checks revision and lease.
Expiry is judged by the clients' clocks: a lease counts as live ``clock_skew`` seconds
past its expiry when another client decides whether to take it over (or to write
without it); its holder stops trusting it at the expiry itself. The fencing token is
``max(previous + 1, now in microseconds)``, so a lease record may go without tokens
going back: release removes the lease attributes, the token too once ``clock_skew`` has
passed since it was issued (no client can issue a smaller one after that), and an item
holding nothing but a lease has a time to live that outlasts the lease.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from typing import Any

from flowy.errors import StorageUnavailableError
from flowy.storage import Lease
from flowy.storage.dialect import BaseLeaseManager, Busy, next_fencing_token

from ._layout import (
    TTL,
    A,
    Expression,
    Item,
    check_stored_id,
    get_int,
    get_n,
    get_s,
    head_key,
    n,
    s,
)
from ._table import ConditionFailed, DynamoTable

__all__ = [
    "ATTEMPTS",
    "DynamoLeaseManager",
    "keep_alive",
    "lease_free",
    "lease_held",
    "lease_ttl",
    "live_lease",
    "take_lease",
]

ATTEMPTS = 4
"""Tries of a write that a concurrent one may cancel (a save, a lease, a delete)."""


def live_lease(thread_id: str, item: Mapping[str, Any] | None, cutoff: float) -> Lease | None:
    """The lease recorded in ``item`` if it expires after ``cutoff``."""
    owner, token, expires = get_s(item, A.OWNER), get_int(item, A.TOKEN), get_n(item, A.EXPIRES)
    if owner is None or token is None or expires is None or expires <= cutoff:
        return None
    return Lease(thread_id, owner, token, float(expires))


def lease_free(expr: Expression, cutoff: float) -> str:
    """Condition: no lease, or one that expired at or before ``cutoff``."""
    return f"(attribute_not_exists({expr(A.EXPIRES)}) OR {expr(A.EXPIRES)} <= {expr.v(n(cutoff))})"


def lease_held(expr: Expression, lease: Lease, now: float) -> str:
    """Condition: ``lease`` (thread, owner and token) is the live lease at ``now``."""
    return (
        f"{expr(A.THREAD_ID)} = {expr.v(s(lease.thread_id))} AND "
        f"{expr(A.OWNER)} = {expr.v(s(lease.owner))} AND "
        f"{expr(A.TOKEN)} = {expr.v(n(lease.fencing_token))} AND "
        f"{expr(A.EXPIRES)} > {expr.v(n(now))}"
    )


def lease_ttl(table: DynamoTable, lease_end: float, token: int) -> int:
    """The time to live (epoch second) an item needs to outlast a lease ending at
    ``lease_end``, and for no client to issue a token below ``token`` once it is gone."""
    return math.ceil(max(lease_end, token / 1e6) + table.clock_skew) + 1


async def take_lease(
    table: DynamoTable, thread_id: str, owner: str, ttl: float
) -> tuple[Lease | Busy, Item]:
    """Take ``thread_id`` for ``owner`` (``BaseLeaseManager._acquire``), with the head
    item as it is after (``{}`` when busy): one ``UpdateItem``, and one more only to
    give an item that holds nothing but the lease a time to live."""
    table.check_clock("take")
    seen = 0
    for _ in range(ATTEMPTS):
        now = table.clock()
        lease = Lease(thread_id, owner, next_fencing_token(seen, now), now + ttl)
        expr = Expression()
        fields = {A.THREAD_ID: s(thread_id), A.OWNER: s(owner), A.EXPIRES: n(lease.expires_at)}
        update = expr.sets({**fields, A.TOKEN: n(lease.fencing_token)})  # :v0 … :v3
        tid, tok = expr(A.THREAD_ID), expr(A.TOKEN)
        condition = (
            f"(attribute_not_exists({tid}) OR {tid} = :v0) AND "
            f"{lease_free(expr, now - table.clock_skew)} AND "
            f"(attribute_not_exists({tok}) OR {tok} < :v3)"
        )
        try:
            result = await table.update(head_key(thread_id), expr, update, condition)
        except ConditionFailed as failed:
            check_stored_id(thread_id, failed.item)
            live = live_lease(thread_id, failed.item, now - table.clock_skew)
            mine = (owner, lease.fencing_token)
            if live is not None and (live.owner, live.fencing_token) == mine:
                # This very update landed, its answer was lost, and botocore sent it
                # again: the retry found the lease the first attempt wrote, ours.
                result = failed.item or {}
            elif live is not None:
                return Busy(live), {}
            else:
                seen = get_int(failed.item, A.TOKEN) or 0  # issued by a clock ahead of ours
                continue
        if await keep_alive(table, lease, result):
            return lease, result
    raise StorageUnavailableError(
        f"could not lease a thread of table {table.name!r} in {ATTEMPTS} attempts: its "
        "lease record kept changing; try again"
    )


async def keep_alive(table: DynamoTable, lease: Lease, item: Mapping[str, Any]) -> bool:
    """Give an item that holds only the lease a time to live that outlasts it (and
    push back a completed head's that would end sooner). False if the item is gone:
    its own time to live had passed."""
    need = lease_ttl(table, lease.expires_at, lease.fencing_token)
    current = get_int(item, TTL)
    if A.REVISION in item and (current is None or current >= need):
        return True
    expr = Expression()
    update = expr.sets({TTL: n(need)})  # :v0
    condition = (
        f"{expr(A.TOKEN)} = {expr.v(n(lease.fencing_token))} AND "
        f"(attribute_not_exists({expr(A.REVISION)}) OR {expr(TTL)} < :v0)"
    )
    try:
        await table.update(head_key(lease.thread_id), expr, update, condition)
    except ConditionFailed as failed:
        return failed.item is not None
    return True


class DynamoLeaseManager(BaseLeaseManager):
    """Exclusive, expiring, fenced leases on the head items of one table (build it
    through :class:`~flowy_dynamodb.DynamoBackend`)."""

    def __init__(self, table: DynamoTable) -> None:
        self.table = table
        self.domain: Hashable = table.domain

    async def _acquire(self, thread_id: str, owner: str, ttl: float) -> Lease | Busy:
        return (await take_lease(self.table, thread_id, owner, ttl))[0]

    async def _update_held(self, lease: Lease, expr: Expression, update: str) -> Item | None:
        condition = lease_held(expr, lease, self.table.clock())
        try:
            return await self.table.update(head_key(lease.thread_id), expr, update, condition)
        except ConditionFailed:
            return None

    async def _renew(self, lease: Lease, ttl: float) -> Lease | None:
        self.table.check_clock("renew")
        renewed = Lease(lease.thread_id, lease.owner, lease.fencing_token, self.table.clock() + ttl)
        expr = Expression()
        item = await self._update_held(lease, expr, expr.sets({A.EXPIRES: n(renewed.expires_at)}))
        if item is None or not await keep_alive(self.table, renewed, item):
            return None
        return renewed

    async def _release(self, lease: Lease) -> bool:
        table = self.table
        # Once clock_skew has passed since the token was issued, no client (their clocks
        # are within clock_skew) can issue a smaller one: the token may go too.
        spent = table.clock() - lease.fencing_token / 1e6 >= table.clock_skew
        expr = Expression()
        removed = expr.removes([A.OWNER, A.EXPIRES, *([A.TOKEN] if spent else [])])
        item = await self._update_held(lease, expr, removed.strip())
        if item is None:
            return False
        if A.REVISION not in item and spent:  # nothing left but the key
            expr = Expression()
            condition = expr.all_absent(A.REVISION, A.TOKEN)
            try:
                await table.delete(head_key(lease.thread_id), expr, condition)
            except ConditionFailed:
                pass  # saved or leased again meanwhile
        return True

    async def _holder(self, thread_id: str) -> Lease | None:
        item = await self.table.get(head_key(thread_id), (A.THREAD_ID, A.OWNER, A.EXPIRES, A.TOKEN))
        check_stored_id(thread_id, item)
        return live_lease(thread_id, item, self.table.clock() - self.table.clock_skew)

    def __repr__(self) -> str:
        return f"DynamoLeaseManager(table={self.table.name!r})"
