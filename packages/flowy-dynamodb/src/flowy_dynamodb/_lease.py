"""Fenced run leases on the head item of a thread: :class:`DynamoLeaseManager`.

The lease lives in three attributes of the thread's head item: ``lease_owner``,
``lease_expires_at`` (epoch seconds) and ``lease_token`` (the fencing token). Acquire is
one conditional ``UpdateItem`` that increments the token with ``if_not_exists``; release
removes owner and expiry but keeps the token, so tokens never go back.

DynamoDB has no server clock usable in a condition, so expiry is judged by the client's
clock with a skew allowance: a lease counts as live for ``clock_skew`` seconds past its
expiry when another client decides whether it may take it over (or write without it),
while its holder stops trusting it at the expiry itself. As long as the clocks of the
clients differ by less than ``clock_skew``, an old holder's last fenced write and a new
holder's first one never overlap. This module also owns the condition fragments the
checkpointer uses to check the lease in the same write as the revision.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import flowy
from flowy.checkpoint import Lease, validate_thread_id

from ._executor import ConditionFailed, DynamoExecutor
from ._table import (
    A_EXPIRES,
    A_OWNER,
    A_THREAD_ID,
    A_TOKEN,
    HEAD_SK,
    PK,
    SK,
    Clock,
    DynamoTable,
    Expression,
    get_float,
    get_int,
    get_s,
    n,
    s,
    show_id,
    thread_key,
)

if TYPE_CHECKING:
    from botocore.client import BaseClient

__all__ = [
    "DEFAULT_CLOCK_SKEW",
    "DynamoLeaseManager",
    "head_key",
    "holds",
    "lease_free_condition",
    "lease_held_condition",
    "live_lease",
    "update_head",
]

DEFAULT_CLOCK_SKEW = 1.0
"""Seconds by which the clocks of two clients of one table may differ (default)."""


def head_key(thread_id: str) -> dict[str, Any]:
    """The primary key of a thread's head item."""
    return {PK: s(thread_key(thread_id)), SK: s(HEAD_SK)}


async def update_head(
    table: DynamoTable,
    thread_id: str,
    expr: Expression,
    update: str,
    condition: str,
    **options: Any,
) -> dict[str, Any]:
    """One conditional ``UpdateItem`` of the thread's head item; ``ConditionFailed`` when
    ``condition`` is false. ``options`` are further ``UpdateItem`` parameters."""
    return await table.call(
        "update_item",
        TableName=table.name,
        Key=head_key(thread_id),
        UpdateExpression=update,
        ConditionExpression=condition,
        **options,
        **expr.params(),
    )


def lease_free_condition(expr: Expression, cutoff: float) -> str:
    """Condition text: no lease, or one that expired at or before ``cutoff``."""
    exp = expr.name(A_EXPIRES)
    return f"(attribute_not_exists({exp}) OR {exp} <= {expr.value('lease_cutoff', n(cutoff))})"


def lease_held_condition(expr: Expression, lease: Lease, now: float) -> str:
    """Condition text: ``lease`` (owner and token) is the live lease at ``now``."""
    return (
        f"{expr.name(A_OWNER)} = {expr.value('lease_owner', s(lease.owner))} AND "
        f"{expr.name(A_TOKEN)} = {expr.value('lease_token', n(lease.token))} AND "
        f"{expr.name(A_EXPIRES)} > {expr.value('now', n(now))}"
    )


def live_lease(thread_id: str, item: Mapping[str, Any] | None, cutoff: float) -> Lease | None:
    """The lease recorded in ``item`` if it expires after ``cutoff``, else ``None``."""
    if item is None:
        return None
    owner = get_s(item, A_OWNER)
    expires = get_float(item, A_EXPIRES)
    token = get_int(item, A_TOKEN)
    if owner is None or expires is None or token is None or expires <= cutoff:
        return None
    return Lease(thread_id, owner, token, expires)


def holds(item: Mapping[str, Any] | None, lease: Lease, now: float) -> bool:
    """True if ``item`` records ``lease`` (same owner and token) as live at ``now``."""
    if item is None:
        return False
    expires = get_float(item, A_EXPIRES)
    return (
        get_s(item, A_OWNER) == lease.owner
        and get_int(item, A_TOKEN) == lease.token
        and expires is not None
        and expires > now
    )


def check_stored_id(thread_id: str, item: Mapping[str, Any] | None) -> None:
    """Raise ``SnapshotEnvelopeInvalidError`` if ``item`` belongs to another thread id."""
    if item is None:
        return
    stored = get_s(item, A_THREAD_ID)
    if stored is not None and stored != thread_id:
        raise flowy.SnapshotEnvelopeInvalidError(
            f"the head item for thread {show_id(thread_id)} names thread {show_id(stored)}: "
            "the stored item does not match its key; it was written by something else or "
            "is corrupt"
        )


class DynamoLeaseManager:
    """Exclusive, expiring, fenced run leases stored on the threads' head items.

    ``DynamoCheckpointer`` over the same table checks these leases in the same
    conditional write as the revision (``fences`` returns True for this manager).

    Args:
        client: a boto3 DynamoDB client (see :func:`flowy_dynamodb.make_client`).
        table_name: the table made by :func:`flowy_dynamodb.create_table`.
        clock_skew: seconds the clocks of this table's clients may differ. A lease is
            taken over (or a lease-less save allowed) only ``clock_skew`` seconds after
            its expiry; ``holder`` reports it until then.
        executor: the bounded thread pool for boto3 calls (a private one if omitted).
        clock: epoch seconds (``time.time``); replaceable for tests.
    """

    def __init__(
        self,
        client: BaseClient,
        table_name: str,
        *,
        clock_skew: float = DEFAULT_CLOCK_SKEW,
        executor: DynamoExecutor | None = None,
        clock: Clock = time.time,
    ) -> None:
        if clock_skew < 0:
            raise ValueError(f"clock_skew must be >= 0 seconds, got {clock_skew!r}")
        self._table = DynamoTable(client, table_name, executor=executor, clock=clock)
        self.clock_skew = clock_skew

    @property
    def table_name(self) -> str:
        """The DynamoDB table holding the leases."""
        return self._table.name

    @property
    def domain(self) -> tuple[str, str, str]:
        """Endpoint, region and table: the coordination domain of these leases."""
        return self._table.domain

    async def acquire(self, thread_id: str, owner: str, ttl: float) -> Lease:
        """Take the thread for ``ttl`` seconds (see ``flowy.checkpoint.LeaseManager``).

        Raises ``ThreadLeaseBusyError`` while a live lease exists (even one of the same
        owner); an expired lease is taken over ``clock_skew`` seconds after its expiry.
        """
        validate_thread_id(thread_id)
        if ttl <= 0:
            raise ValueError(f"lease ttl must be positive, got {ttl!r}")
        now = self._table.clock()
        expires = now + ttl
        expr = Expression()
        tid, tok = expr.name(A_THREAD_ID), expr.name(A_TOKEN)
        tid_value = expr.value("tid", s(thread_id))
        update = (
            f"SET {tid} = {tid_value}, "
            f"{expr.name(A_OWNER)} = {expr.value('owner', s(owner))}, "
            f"{expr.name(A_EXPIRES)} = {expr.value('expires', n(expires))}, "
            f"{tok} = if_not_exists({tok}, {expr.value('zero', n(0))}) + "
            f"{expr.value('one', n(1))}"
        )
        condition = (
            f"(attribute_not_exists({tid}) OR {tid} = {tid_value}) AND "
            f"{lease_free_condition(expr, now - self.clock_skew)}"
        )
        try:
            result = await update_head(
                self._table,
                thread_id,
                expr,
                update,
                condition,
                ReturnValues="UPDATED_NEW",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ConditionFailed as failed:
            check_stored_id(thread_id, failed.item)
            live = live_lease(thread_id, failed.item, now - self.clock_skew)
            if live is None:  # pragma: no cover - only if the item changed in between
                raise flowy.ThreadLeaseBusyError(
                    f"thread {show_id(thread_id)} could not be leased: its lease changed "
                    "while acquiring; try again"
                ) from None
            raise flowy.ThreadLeaseBusyError(
                f"thread {show_id(thread_id)} is leased by {live.owner!r} (token "
                f"{live.token}) until {live.expires_at:.3f} ({live.expires_at - now:.1f}s "
                f"from now, plus a clock-skew allowance of {self.clock_skew}s); retry "
                "after it expires or is released"
            ) from None
        token = get_int(result.get("Attributes") or {}, A_TOKEN)
        if token is None:  # pragma: no cover - UPDATED_NEW always carries it
            raise flowy.StorageError(
                f"DynamoDB did not return the fencing token of thread {show_id(thread_id)}"
            )
        return Lease(thread_id, owner, token, expires)

    async def _update_held(
        self, lease: Lease, expr: Expression, update: str, now: float, action: str
    ) -> None:
        """Apply ``update`` to the head item if ``lease`` is its live lease at ``now``,
        else raise ``LeaseLostError`` for ``action``."""
        tid = expr.name(A_THREAD_ID)
        condition = f"{tid} = {expr.value('tid', s(lease.thread_id))} AND " + (
            lease_held_condition(expr, lease, now)
        )
        try:
            await update_head(self._table, lease.thread_id, expr, update, condition)
        except ConditionFailed:
            raise self._lost(lease, action) from None

    def _lost(self, lease: Lease, action: str) -> flowy.LeaseLostError:
        return flowy.LeaseLostError(
            f"cannot {action} lease {lease.token} of {lease.owner!r} on thread "
            f"{show_id(lease.thread_id)}: it expired or was taken over; acquire a new lease"
        )

    async def renew(self, lease: Lease, ttl: float) -> Lease:
        """Extend a live lease to now + ``ttl``; ``LeaseLostError`` if it is not current."""
        validate_thread_id(lease.thread_id)
        if ttl <= 0:
            raise ValueError(f"lease ttl must be positive, got {ttl!r}")
        now = self._table.clock()
        expires = now + ttl
        expr = Expression()
        update = f"SET {expr.name(A_EXPIRES)} = {expr.value('expires', n(expires))}"
        await self._update_held(lease, expr, update, now, "renew")
        return Lease(lease.thread_id, lease.owner, lease.token, expires)

    async def release(self, lease: Lease) -> None:
        """Give the lease up (the fencing token stays); ``LeaseLostError`` if it expired
        or was taken over."""
        validate_thread_id(lease.thread_id)
        now = self._table.clock()
        expr = Expression()
        update = f"REMOVE {expr.name(A_OWNER)}, {expr.name(A_EXPIRES)}"
        await self._update_held(lease, expr, update, now, "release")

    async def holder(self, thread_id: str) -> Lease | None:
        """The lease that holds the thread, or ``None`` (a strongly consistent read).

        A lease is reported until it can be taken over: up to ``clock_skew`` seconds
        past its ``expires_at``.
        """
        validate_thread_id(thread_id)
        expr = Expression()
        projection = ", ".join(expr.name(a) for a in (A_THREAD_ID, A_OWNER, A_EXPIRES, A_TOKEN))
        result = await self._table.call(
            "get_item",
            TableName=self._table.name,
            Key=head_key(thread_id),
            ConsistentRead=True,
            ProjectionExpression=projection,
            **expr.params(),
        )
        item = result.get("Item")
        check_stored_id(thread_id, item)
        return live_lease(thread_id, item, self._table.clock() - self.clock_skew)

    async def close(self) -> None:
        """Release the executor this manager created (a shared one is left alone)."""
        self._table.close()

    def __repr__(self) -> str:
        return f"DynamoLeaseManager(table={self._table.name!r}, clock_skew={self.clock_skew})"
