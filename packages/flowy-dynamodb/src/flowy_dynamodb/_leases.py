"""Fenced run leases on the head item of a thread: :class:`DynamoLeaseManager`.

A lease is three attributes of the thread's head item, ``lease_owner``,
``lease_expires_at`` (epoch seconds) and ``lease_token``, so a save checks the revision
and the lease in one condition. DynamoDB has no clock usable in a condition: expiry is
judged by the clients' clocks. A lease counts as live for ``clock_skew`` seconds past
its expiry when another client decides whether to take it over (or to write without
it), while its holder stops trusting it at the expiry itself; every client refuses to
take or renew leases while its clock is more than ``clock_skew / 2`` from DynamoDB's
(:class:`~flowy_dynamodb.ClockSkewError`).

The fencing token of an acquisition is ``max(previous + 1, now in microseconds)``, so a
lease record may go away without tokens going back: release removes the lease
attributes (the token too once ``clock_skew`` has passed since it was issued, as no
client can issue a smaller one after that), and an item holding nothing but a lease
carries a time to live that lets DynamoDB delete it after the lease.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from flowy.errors import StorageUnavailableError
from flowy.storage import BaseLeaseManager, Busy, Lease

from ._store import (
    TTL,
    A,
    ConditionFailed,
    DynamoTable,
    Expression,
    check_stored_id,
    get_float,
    get_int,
    get_s,
    head_key,
    n,
    s,
)

__all__ = ["DynamoLeaseManager", "lease_free", "lease_held", "live_lease"]

ATTEMPTS = 4


def live_lease(thread_id: str, item: Mapping[str, Any] | None, cutoff: float) -> Lease | None:
    """The lease recorded in ``item`` if it expires after ``cutoff``."""
    owner, token = get_s(item, A.OWNER), get_int(item, A.TOKEN)
    expires = get_float(item, A.EXPIRES)
    if owner is None or token is None or expires is None or expires <= cutoff:
        return None
    return Lease(thread_id, owner, token, expires)


def lease_free(expr: Expression, cutoff: float) -> str:
    """Condition: no lease, or one that expired at or before ``cutoff``."""
    exp = expr.name(A.EXPIRES)
    return f"(attribute_not_exists({exp}) OR {exp} <= {expr.value('cutoff', n(cutoff))})"


def lease_held(expr: Expression, lease: Lease, now: float) -> str:
    """Condition: ``lease`` (owner and token) is the live lease at ``now``."""
    return (
        f"{expr.name(A.OWNER)} = {expr.value('lease_owner', s(lease.owner))} AND "
        f"{expr.name(A.TOKEN)} = {expr.value('lease_token', n(lease.fencing_token))} AND "
        f"{expr.name(A.EXPIRES)} > {expr.value('now', n(now))}"
    )


def lease_ttl(table: DynamoTable, lease_end: float, token: int) -> int:
    """The time to live (epoch second) an item needs to outlast a lease ending at
    ``lease_end``, and for no client to issue a token below ``token`` after it is gone."""
    return math.ceil(max(lease_end, token / 1e6) + table.clock_skew) + 1


class DynamoLeaseManager(BaseLeaseManager):
    """Exclusive, expiring, fenced leases on the head items of one table.

    Build it through :class:`~flowy_dynamodb.DynamoBackend`; its checkpointer checks
    these leases in the same conditional write as the revision.
    """

    def __init__(self, table: DynamoTable) -> None:
        self.table = table
        self.domain = table.domain

    async def _acquire(self, thread_id: str, owner: str, ttl: float) -> Lease | Busy:
        table = self.table
        table.check_clock("take")
        seen = 0
        for _ in range(ATTEMPTS):
            now = table.clock()
            lease = Lease(thread_id, owner, max(int(now * 1e6), seen + 1), now + ttl)
            expr = Expression()
            tid, tok = expr.name(A.THREAD_ID), expr.name(A.TOKEN)
            tid_value = expr.value("tid", s(thread_id))
            tok_value = expr.value("token", n(lease.fencing_token))
            update = (
                f"SET {tid} = {tid_value}, {expr.name(A.OWNER)} = {expr.value('owner', s(owner))}"
                f", {expr.name(A.EXPIRES)} = {expr.value('expires', n(lease.expires_at))}"
                f", {tok} = {tok_value}"
            )
            condition = (
                f"(attribute_not_exists({tid}) OR {tid} = {tid_value}) AND "
                f"{lease_free(expr, now - table.clock_skew)} AND "
                f"(attribute_not_exists({tok}) OR {tok} < {tok_value})"
            )
            try:
                result = await table.update(
                    head_key(thread_id), expr, update, condition, ReturnValues="ALL_NEW"
                )
            except ConditionFailed as failed:
                check_stored_id(thread_id, failed.item)
                live = live_lease(thread_id, failed.item, now - table.clock_skew)
                if live is not None:
                    return Busy(live)
                seen = get_int(failed.item, A.TOKEN) or 0  # a token from a clock ahead
                continue
            if await self._keep_alive(lease, result.get("Attributes") or {}):
                return lease
        raise StorageUnavailableError(
            f"could not lease a thread on table {table.name!r} in {ATTEMPTS} attempts "
            "(its lease record kept changing); try again"
        )

    async def _keep_alive(self, lease: Lease, item: Mapping[str, Any]) -> bool:
        """Make the item's time to live outlast ``lease``: an item that holds only the
        lease gets one, a completed head whose time to live would end sooner gets a later
        one. False if the item is gone (its time to live had passed)."""
        need = lease_ttl(self.table, lease.expires_at, lease.fencing_token)
        current = get_int(item, TTL)
        if A.REVISION in item and (current is None or current >= need):
            return True
        expr = Expression()
        exp, need_value = expr.name(TTL), expr.value("need", n(need))
        condition = (
            f"{expr.name(A.TOKEN)} = {expr.value('token', n(lease.fencing_token))} AND "
            f"(attribute_not_exists({expr.name(A.REVISION)}) OR {exp} < {need_value})"
        )
        try:
            await self.table.update(
                head_key(lease.thread_id), expr, f"SET {exp} = {need_value}", condition
            )
        except ConditionFailed as failed:
            return failed.item is not None  # else: deleted by its time to live meanwhile
        return True

    async def _update_held(
        self, lease: Lease, expr: Expression, update: str, now: float
    ) -> dict[str, Any] | None:
        condition = (
            f"{expr.name(A.THREAD_ID)} = {expr.value('tid', s(lease.thread_id))} AND "
            + lease_held(expr, lease, now)
        )
        try:
            result = await self.table.update(
                head_key(lease.thread_id), expr, update, condition, ReturnValues="ALL_NEW"
            )
        except ConditionFailed:
            return None
        return result.get("Attributes") or {}

    async def _renew(self, lease: Lease, ttl: float) -> Lease | None:
        self.table.check_clock("renew")
        now = self.table.clock()
        renewed = Lease(lease.thread_id, lease.owner, lease.fencing_token, now + ttl)
        expr = Expression()
        update = f"SET {expr.name(A.EXPIRES)} = {expr.value('expires', n(renewed.expires_at))}"
        item = await self._update_held(lease, expr, update, now)
        if item is None or not await self._keep_alive(renewed, item):
            return None
        return renewed

    async def _release(self, lease: Lease) -> bool:
        table = self.table
        now = table.clock()
        # Once clock_skew has passed since the token was issued, no client (clocks within
        # clock_skew of each other) can issue a smaller one: the token may go too.
        spent = now - lease.fencing_token / 1e6 >= table.clock_skew
        expr = Expression()
        removed = [A.OWNER, A.EXPIRES, *([A.TOKEN] if spent else [])]
        update = "REMOVE " + ", ".join(expr.name(a) for a in removed)
        item = await self._update_held(lease, expr, update, now)
        if item is None:
            return False
        if A.REVISION not in item and spent:  # nothing left but the key: delete the item
            expr = Expression()
            condition = " AND ".join(
                f"attribute_not_exists({expr.name(a)})" for a in (A.REVISION, A.TOKEN)
            )
            try:
                await table.call(
                    "delete_item",
                    TableName=table.name,
                    Key=head_key(lease.thread_id),
                    ConditionExpression=condition,
                    **expr.params(),
                )
            except ConditionFailed:
                pass  # saved or leased again meanwhile: it is theirs now
        return True

    async def _holder(self, thread_id: str) -> Lease | None:
        item = await self.table.get(head_key(thread_id), (A.THREAD_ID, A.OWNER, A.EXPIRES, A.TOKEN))
        check_stored_id(thread_id, item)
        return live_lease(thread_id, item, self.table.clock() - self.table.clock_skew)

    def __repr__(self) -> str:
        return f"DynamoLeaseManager(table={self.table.name!r})"
