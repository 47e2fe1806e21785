"""The outbox and its consumer: the message items of the threads' partitions.

The message of a thread's committed revision is the item ``outbox#<revision>`` of the
thread: unique per (thread, revision), written in the save's transaction. A live one has
``live_key``, ``visible_at``, ``attempts``, ``error``, ``enqueued_at`` (when it was
enqueued, or came back from the dead letters; a message written by flowy-dynamodb 0.2.0
has none) and its route with its place in the ``queues`` index (see ``_queues``, which
also holds the claim); a dead letter has ``dead_key`` and ``dead_at`` instead, and is
out of both indexes of live messages. Index reads are eventually consistent: on
DynamoDB a new message may take a moment to be claimable. The backlog (``stats``) reads
the ``outbox`` index of every shard, the ``enqueued_at`` of each live message it lists
(``BatchGetItem``, so O(messages pending)), and counts the ``dead_letters`` index.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable

from flowy.queues import DEFAULT_QUEUE, Route
from flowy.storage import OutboxStats
from flowy.storage.dialect import BaseOutbox, OutboxRow, RawMessage

from ._layout import (
    DEAD_INDEX,
    MESSAGE,
    OUTBOX_INDEX,
    PK,
    SHARDS,
    A,
    Expression,
    Item,
    entry_key,
    get_int,
    get_n,
    get_s,
    key_of,
    message_key,
    n,
    queue_key,
    queue_order,
    s,
    shard_of,
)
from ._queues import QueueClaims, raw_message
from ._table import ConditionFailed, DynamoTable

__all__ = ["DynamoConsumer", "DynamoOutbox", "message_write"]

_LIVE = [f"live#{shard}" for shard in range(SHARDS)]
"""The partitions of the ``outbox`` index: one per shard."""


def route_fields(route: Route, pk: str, now: float) -> Item:
    """The attributes of a message of ``route`` in the partition ``pk``, enqueued
    ``now``: its route, and its place in the ``queues`` index."""
    return {
        A.QUEUE: s(route.queue),
        A.PARTITION: s(route.partition_key),
        A.PRIORITY: n(route.priority),
        A.QUEUE_KEY: s(queue_key(route.queue, pk)),
        A.QUEUE_ORDER: s(queue_order(route.priority, now)),
    }


def stored_route(item: Item | None) -> Route:
    """The route stored on a message item (the default one for a message written
    before queues)."""
    queue = get_s(item, A.QUEUE)
    if queue is None:
        return Route()
    return Route(queue, get_s(item, A.PARTITION) or "", get_int(item, A.PRIORITY) or 0)


def _revive(
    expr: Expression, pk: str, now: float, route: Route, payload: bytes | None = None
) -> str:
    fields: Item = {
        A.LIVE: s(f"live#{shard_of(pk)}"),
        A.VISIBLE: n(now),
        A.ATTEMPTS: n(0),
        A.ERROR: s(""),
        A.ENQUEUED: n(now),
        **route_fields(route, pk, now),
    }
    if payload is not None:  # written again: the new row's payload
        fields[A.PAYLOAD] = {"B": payload}
    return expr.sets(fields) + expr.removes([A.DEAD, A.DEAD_AT])


def message_write(table: DynamoTable, row: OutboxRow, now: float, *, revive: bool) -> Item:
    """``UpdateItem`` parameters that add ``row``'s message: a new one is created, a live
    one left exactly as it is (condition: not dead); with ``revive``, a dead one comes
    back with ``row``'s payload and route, its attempts and error reset (condition:
    dead)."""
    key = entry_key(row.thread_id, MESSAGE, row.committed_revision)
    pk = key[PK]["S"]
    expr = Expression()
    if revive:
        update = _revive(expr, pk, now, row.route, row.payload)
    else:
        kept = {A.PAYLOAD: {"B": row.payload}, A.VISIBLE: n(now), A.ATTEMPTS: n(0), A.ERROR: s("")}
        kept[A.ENQUEUED] = n(now)
        kept |= route_fields(row.route, pk, now)
        update = expr.sets({A.THREAD_ID: s(row.thread_id), A.LIVE: s(f"live#{shard_of(pk)}")})
        update += "".join(
            f", {expr(k)} = if_not_exists({expr(k)}, {expr.v(v)})" for k, v in kept.items()
        )
    condition = f"attribute_{'exists' if revive else 'not_exists'}({expr(A.DEAD)})"
    return {
        "TableName": table.name,
        "Key": key,
        "UpdateExpression": update,
        "ConditionExpression": condition,
        **expr.params(),
    }


class DynamoOutbox(BaseOutbox):
    """The producing side: one conditional ``UpdateItem`` per message (or, through
    ``save_with_outbox``, an action of the checkpoint's transaction)."""

    def __init__(self, table: DynamoTable) -> None:
        self.table = table
        self.domain: Hashable = table.domain

    async def _append(self, row: OutboxRow) -> None:
        for revive in (False, True, False):  # new or live; else dead; else raced: again
            try:
                params = message_write(self.table, row, self.table.clock(), revive=revive)
                await self.table.call("update_item", **params)
                break
            except ConditionFailed:
                continue
        self.table.wakeups.notify()


class DynamoConsumer(QueueClaims):
    """The consuming side, for ``flowy.Worker``: a claim queries the ``queues`` index of
    every shard of its queue (see :class:`~flowy_dynamodb._queues.QueueClaims`); while
    there is nothing, ``claim(wait=...)`` polls with a growing pause (up to
    ``poll_interval``) and wakes at once for messages this store adds."""

    def __init__(
        self, table: DynamoTable, *, max_attempts: int = 5, poll_interval: float = 0.5
    ) -> None:
        super().__init__(max_attempts=max_attempts, poll_interval=poll_interval)
        self.table = table
        self.domain: Hashable = table.domain
        self._pause = 0.02

    async def _claim(self, limit: int, visibility_timeout: float) -> list[RawMessage]:
        return await self._claim_queue(DEFAULT_QUEUE, limit, visibility_timeout, 0)

    async def _ack(self, message_id: str) -> None:
        key = message_key(message_id)
        if key is None:
            return
        expr = Expression()
        try:
            result = await self.table.call(
                "delete_item",
                TableName=self.table.name,
                Key=key,
                ConditionExpression=f"attribute_exists({expr(A.LIVE)})",
                ReturnValues="ALL_OLD",
                **expr.params(),
            )
        except ConditionFailed:
            return
        await self._uncount(message_id, result.get("Attributes"))

    async def _release(self, message_id: str, *, error: str, delay: float, dead: bool) -> None:
        key = message_key(message_id)
        if key is None:
            return
        now = self.table.clock()
        expr = Expression()
        gone = [A.IN_FLIGHT, A.COUNTED_IN]
        if dead:
            fields = {A.DEAD: s("dead"), A.DEAD_AT: n(now), A.ERROR: s(error)}
            gone += [A.LIVE, A.VISIBLE, A.QUEUE_KEY]
        else:
            fields = {A.VISIBLE: n(now + delay), A.ERROR: s(error)}
        update = expr.sets(fields) + expr.removes(gone)
        condition = f"attribute_exists({expr(A.LIVE)})"
        try:
            old = await self.table.update(key, expr, update, condition, returns="ALL_OLD")
        except ConditionFailed:
            return
        await self._uncount(message_id, old)
        if not dead:
            self.table.wakeups.notify()

    async def _dead_letters(self, limit: int) -> list[RawMessage]:
        items = await self.table.query_index(DEAD_INDEX, A.DEAD, ["dead"], limit)
        return [raw_message(item) for item in items]

    async def _retry_dead_letter(self, message_id: str) -> bool:
        key = message_key(message_id)
        if key is None:
            return False
        # The route is on the item (a message of flowy-dynamodb 0.2 has the default one).
        item = await self.table.get(key, [A.DEAD, A.QUEUE, A.PARTITION, A.PRIORITY])
        if item is None or A.DEAD not in item:
            return False
        expr = Expression()
        update = _revive(expr, key[PK]["S"], self.table.clock(), stored_route(item))
        try:
            await self.table.update(key, expr, update, f"attribute_exists({expr(A.DEAD)})")
        except ConditionFailed:
            return False
        self.table.wakeups.notify()
        return True

    async def _stats(self) -> OutboxStats:
        async def dead() -> int:
            expr = Expression()
            condition = f"{expr(A.DEAD)} = {expr.v(s('dead'))}"
            return await self.table.count(
                IndexName=DEAD_INDEX, KeyConditionExpression=condition, **expr.params()
            )

        listed, buried = await asyncio.gather(
            self.table.query_index(OUTBOX_INDEX, A.LIVE, _LIVE, None), dead()
        )
        # The index is KEYS_ONLY: the enqueue times are on the items. A message acked
        # since the index was read is gone (or dead) by now, and not counted.
        items = await self.table.get_keys(
            [key_of(item) for item in listed], (A.LIVE, A.ENQUEUED, A.VISIBLE)
        )
        times = [
            get_n(i, A.ENQUEUED) or get_n(i, A.VISIBLE) or 0  # 0.2.0 messages: visible_at
            for i in items
            if A.LIVE in i
        ]
        oldest = float(min(times)) if times else None
        return OutboxStats(len(times), oldest, buried)

    async def _wait(self, seconds: float) -> None:
        await self.table.wakeups.wait(min(seconds, self._pause))
        self._pause = min(self._pause * 2, self.poll_interval)

    def __repr__(self) -> str:
        return f"DynamoConsumer(table={self.table.name!r}, max_attempts={self.max_attempts})"
