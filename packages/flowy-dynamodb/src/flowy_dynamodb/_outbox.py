"""The outbox and its consumer: the message items of the threads' partitions.

The message of a thread's committed revision is the item ``outbox#<revision>`` of the
thread: unique per (thread, revision), written in the save's transaction. A live one has
``live_key``, ``visible_at``, ``attempts``, ``error`` and ``enqueued_at`` (when it was
enqueued, or came back from the dead letters; a message written by flowy-dynamodb 0.2.0
has none) (the ``outbox`` index finds visible ones, oldest first; a claim is a
conditional update on the ``visible_at`` it saw); a dead letter has ``dead_key`` and
``dead_at`` instead. Index reads are eventually consistent: on DynamoDB a new message
may take a moment to be claimable. The backlog (``stats``) reads the ``outbox`` index of
every shard, the ``enqueued_at`` of each live message it lists (``BatchGetItem``, so
O(messages pending)), and counts the ``dead_letters`` index.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable

from flowy.storage import OutboxStats
from flowy.storage.dialect import BaseConsumer, BaseOutbox, OutboxRow, RawMessage

from ._layout import (
    DEAD_INDEX,
    MESSAGE,
    OUTBOX_INDEX,
    PK,
    SHARDS,
    SK,
    A,
    Expression,
    Item,
    entry_key,
    get_b,
    get_int,
    get_n,
    get_s,
    key_of,
    n,
    s,
    shard_of,
)
from ._table import ConditionFailed, DynamoTable

__all__ = ["DynamoConsumer", "DynamoOutbox", "message_write"]

_LIVE = [f"live#{shard}" for shard in range(SHARDS)]
"""The partitions of the ``outbox`` index: one per shard."""


def _message_id(item: Item) -> str:
    return f"{item[SK]['S']}|{item[PK]['S']}"  # a sort key never holds "|"


def _message_key(message_id: str) -> Item | None:
    sk, sep, pk = message_id.partition("|")
    if not sep or not sk.startswith(MESSAGE) or not pk.startswith(("thread", "legacy#")):
        return None
    return {PK: s(pk), SK: s(sk)}


def _raw_message(item: Item) -> RawMessage:
    payload, error = get_b(item, A.PAYLOAD) or b"", get_s(item, A.ERROR) or ""
    return RawMessage(_message_id(item), payload, get_int(item, A.ATTEMPTS) or 0, error)


def _revive(expr: Expression, pk: str, now: float, payload: bytes | None = None) -> str:
    fields: Item = {
        A.LIVE: s(f"live#{shard_of(pk)}"),
        A.VISIBLE: n(now),
        A.ATTEMPTS: n(0),
        A.ERROR: s(""),
        A.ENQUEUED: n(now),
    }
    if payload is not None:  # written again: the new row's payload
        fields[A.PAYLOAD] = {"B": payload}
    return expr.sets(fields) + expr.removes([A.DEAD, A.DEAD_AT])


def message_write(table: DynamoTable, row: OutboxRow, now: float, *, revive: bool) -> Item:
    """``UpdateItem`` parameters that add ``row``'s message: a new one is created, a live
    one left exactly as it is (condition: not dead); with ``revive``, a dead one comes
    back with ``row``'s payload, its attempts and error reset (condition: dead)."""
    key = entry_key(row.thread_id, MESSAGE, row.committed_revision)
    expr = Expression()
    if revive:
        update = _revive(expr, key[PK]["S"], now, row.payload)
    else:
        kept = {A.PAYLOAD: {"B": row.payload}, A.VISIBLE: n(now), A.ATTEMPTS: n(0), A.ERROR: s("")}
        kept[A.ENQUEUED] = n(now)
        update = expr.sets(
            {A.THREAD_ID: s(row.thread_id), A.LIVE: s(f"live#{shard_of(key[PK]['S'])}")}
        )
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


class DynamoConsumer(BaseConsumer):
    """The consuming side, for ``flowy.Worker``: a claim queries the ``outbox`` index of
    every shard; while there is nothing, ``claim(wait=...)`` polls with a growing pause
    (up to ``poll_interval``) and wakes at once for messages this store adds."""

    def __init__(
        self, table: DynamoTable, *, max_attempts: int = 5, poll_interval: float = 0.5
    ) -> None:
        super().__init__(max_attempts=max_attempts, poll_interval=poll_interval)
        self.table = table
        self.domain: Hashable = table.domain
        self._pause = 0.02

    async def _claim(self, limit: int, visibility_timeout: float) -> list[RawMessage]:
        now = self.table.clock()
        found = await self.table.query_index(
            OUTBOX_INDEX, A.LIVE, _LIVE, limit, lambda e: f"{e(A.VISIBLE)} <= {e.v(n(now))}"
        )
        oldest = sorted(found, key=lambda i: get_n(i, A.VISIBLE) or 0)
        taken = await asyncio.gather(
            *(self._take(i, now, visibility_timeout) for i in oldest[:limit])
        )
        claimed = [message for message in taken if message is not None]
        if claimed:
            self._pause = 0.02
        return claimed

    async def _take(self, item: Item, now: float, visibility_timeout: float) -> RawMessage | None:
        expr = Expression()
        update = expr.sets({A.VISIBLE: n(now + visibility_timeout)})
        update += f", {expr(A.ATTEMPTS)} = {expr(A.ATTEMPTS)} + {expr.v(n(1))}"
        condition = (
            f"attribute_exists({expr(A.LIVE)}) AND {expr(A.VISIBLE)} = {expr.v(item[A.VISIBLE])}"
        )
        try:
            return _raw_message(await self.table.update(key_of(item), expr, update, condition))
        except ConditionFailed:
            return None  # claimed, released or acked by someone else meanwhile

    async def _change(
        self, message_id: str, expr: Expression, update: str | None, live: bool
    ) -> bool:
        key = _message_key(message_id)
        if key is None:
            return False
        condition = f"attribute_exists({expr(A.LIVE if live else A.DEAD)})"
        try:
            if update is None:
                await self.table.delete(key, expr, condition)
            else:
                await self.table.update(key, expr, update, condition)
        except ConditionFailed:
            return False
        return True

    async def _ack(self, message_id: str) -> None:
        await self._change(message_id, Expression(), None, live=True)

    async def _release(self, message_id: str, *, error: str, delay: float, dead: bool) -> None:
        now = self.table.clock()
        expr = Expression()
        if dead:
            fields = {A.DEAD: s("dead"), A.DEAD_AT: n(now), A.ERROR: s(error)}
            update = expr.sets(fields) + expr.removes([A.LIVE, A.VISIBLE])
        else:
            update = expr.sets({A.VISIBLE: n(now + delay), A.ERROR: s(error)})
        if await self._change(message_id, expr, update, live=True) and not dead:
            self.table.wakeups.notify()

    async def _dead_letters(self, limit: int) -> list[RawMessage]:
        items = await self.table.query_index(DEAD_INDEX, A.DEAD, ["dead"], limit)
        return [_raw_message(item) for item in items]

    async def _retry_dead_letter(self, message_id: str) -> bool:
        expr = Expression()
        pk = message_id.partition("|")[2]
        revived = await self._change(
            message_id, expr, _revive(expr, pk, self.table.clock()), live=False
        )
        if revived:
            self.table.wakeups.notify()
        return revived

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
