"""The hand-off outbox on DynamoDB: :class:`DynamoOutbox` and :class:`DynamoConsumer`.

The message of a thread's committed revision is the item ``outbox#<revision>`` in the
thread's partition, so it is unique per (thread, committed revision) and a
transactional save writes it with the checkpoint. A live message carries
``live_key`` (``live#<shard>``), ``visible_at``, ``attempts`` and ``error``; the sparse
``outbox`` index finds visible messages oldest first, and a claim is a conditional
``UpdateItem`` on the ``visible_at`` it saw, so two consumers never both win one
delivery. A dead letter carries ``dead_key`` and ``dead_at`` instead, listed by the
``dead_letters`` index. Index reads are eventually consistent: on DynamoDB a new or
released message may take a moment to be claimable.
"""

from __future__ import annotations

import asyncio
from typing import Any

from flowy.storage import BaseConsumer, BaseOutbox, OutboxRow, RawMessage

from ._store import (
    DEAD_INDEX,
    MESSAGE_PREFIX,
    OUTBOX_INDEX,
    PK,
    SHARDS,
    SK,
    A,
    ConditionFailed,
    DynamoTable,
    Expression,
    Item,
    get_b,
    get_int,
    get_n,
    get_s,
    n,
    s,
    shard_of,
    thread_key,
)

__all__ = ["DynamoConsumer", "DynamoOutbox", "message_write"]

_PARTITIONS = ("thread#", "thread-sha256#", "legacy#")


def _message_id(key: Item) -> str:
    return f"{key[SK]['S']}|{key[PK]['S']}"  # a sort key never holds "|"


def _key(message_id: str) -> Item | None:
    sk, sep, pk = message_id.partition("|")
    if not sep or not sk.startswith(MESSAGE_PREFIX) or not pk.startswith(_PARTITIONS):
        return None
    return {PK: s(pk), SK: s(sk)}


def _revive(expr: Expression, pk: str, now: float) -> str:
    return (
        f"SET {expr.name(A.LIVE)} = {expr.value('live', s(f'live#{shard_of(pk)}'))}, "
        f"{expr.name(A.VISIBLE)} = {expr.value('now', n(now))}, "
        f"{expr.name(A.ATTEMPTS)} = {expr.value('zero', n(0))}, "
        f"{expr.name(A.ERROR)} = {expr.value('empty', s(''))} "
        f"REMOVE {expr.name(A.DEAD)}, {expr.name(A.DEAD_AT)}"
    )


def message_write(
    table: DynamoTable, row: OutboxRow, now: float, *, revive: bool
) -> dict[str, Any]:
    """The ``UpdateItem`` parameters that add ``row``'s message: a new one is created,
    a live one left exactly as it is (condition: it is not dead); with ``revive`` a dead
    one comes back with its attempts and error reset (condition: it is dead)."""
    pk = thread_key(row.thread_id)
    expr = Expression()
    if revive:
        update = _revive(expr, pk, now)
        condition = f"attribute_exists({expr.name(A.DEAD)})"
    else:

        def keep(attribute: str, label: str, value: dict[str, Any]) -> str:
            name = expr.name(attribute)
            return f"{name} = if_not_exists({name}, {expr.value(label, value)})"

        update = (
            f"SET {expr.name(A.THREAD_ID)} = {expr.value('tid', s(row.thread_id))}, "
            f"{expr.name(A.LIVE)} = {expr.value('live', s(f'live#{shard_of(pk)}'))}, "
            f"{keep(A.PAYLOAD, 'payload', {'B': row.payload})}, "
            f"{keep(A.VISIBLE, 'now', n(now))}, {keep(A.ATTEMPTS, 'zero', n(0))}, "
            f"{keep(A.ERROR, 'empty', s(''))}"
        )
        condition = f"attribute_not_exists({expr.name(A.DEAD)})"
    return {
        "TableName": table.name,
        "Key": {PK: s(pk), SK: s(f"{MESSAGE_PREFIX}{row.committed_revision:020d}")},
        "UpdateExpression": update,
        "ConditionExpression": condition,
        **expr.params(),
    }


class DynamoOutbox(BaseOutbox):
    """The producing side: one conditional ``UpdateItem`` per message (or, through
    ``save_with_outbox``, an action of the checkpoint's transaction)."""

    def __init__(self, table: DynamoTable) -> None:
        self.table = table
        self.domain = table.domain

    async def _append(self, row: OutboxRow) -> None:
        for revive in (False, True, False):  # live/new, else dead, else raced: look again
            try:
                await self.table.call(
                    "update_item",
                    **message_write(self.table, row, self.table.clock(), revive=revive),
                )
                break
            except ConditionFailed:
                continue
        self.table.notify()


class DynamoConsumer(BaseConsumer):
    """The consuming side, for ``flowy.Worker``: claims query the ``outbox`` index of
    every shard; while there is nothing, ``claim(wait=...)`` polls with a growing pause
    (up to ``poll_interval``) and wakes at once for messages this store adds."""

    def __init__(
        self, table: DynamoTable, *, max_attempts: int = 5, poll_interval: float = 0.5
    ) -> None:
        super().__init__(max_attempts=max_attempts, poll_interval=poll_interval)
        self.table = table
        self.domain = table.domain
        self._pause = 0.02

    async def _claim(self, limit: int, visibility_timeout: float) -> list[RawMessage]:
        now = self.table.clock()

        async def visible(shard: int) -> list[Item]:
            expr = Expression()
            return await self.table.query(
                limit,
                IndexName=OUTBOX_INDEX,
                KeyConditionExpression=(
                    f"{expr.name(A.LIVE)} = {expr.value('live', s(f'live#{shard}'))} AND "
                    f"{expr.name(A.VISIBLE)} <= {expr.value('now', n(now))}"
                ),
                Limit=limit,
                **expr.params(),
            )

        shards = await asyncio.gather(*(visible(shard) for shard in range(SHARDS)))
        candidates = sorted(
            (item for items in shards for item in items),
            key=lambda item: float(get_n(item, A.VISIBLE) or 0),
        )[:limit]
        taken = await asyncio.gather(*(self._take(i, now, visibility_timeout) for i in candidates))
        claimed = [message for message in taken if message is not None]
        if claimed:
            self._pause = 0.02
        return claimed

    async def _take(self, item: Item, now: float, visibility_timeout: float) -> RawMessage | None:
        key = {PK: item[PK], SK: item[SK]}
        expr = Expression()
        attempts, visible = expr.name(A.ATTEMPTS), expr.name(A.VISIBLE)
        update = (
            f"SET {visible} = {expr.value('until', n(now + visibility_timeout))}, "
            f"{attempts} = {attempts} + {expr.value('one', n(1))}"
        )
        seen = expr.value("seen", item[A.VISIBLE])
        condition = f"attribute_exists({expr.name(A.LIVE)}) AND {visible} = {seen}"
        try:
            result = await self.table.update(key, expr, update, condition, ReturnValues="ALL_NEW")
        except ConditionFailed:
            return None  # claimed, released or acked by someone else meanwhile
        claimed = result.get("Attributes") or {}
        return RawMessage(
            _message_id(key),
            get_b(claimed, A.PAYLOAD) or b"",
            get_int(claimed, A.ATTEMPTS) or 1,
            get_s(claimed, A.ERROR) or "",
        )

    async def _settle(self, message_id: str, update: str, expr: Expression, alive: bool) -> bool:
        key = _key(message_id)
        if key is None:
            return False
        condition = f"attribute_exists({expr.name(A.LIVE if alive else A.DEAD)})"
        try:
            await self.table.update(key, expr, update, condition)
        except ConditionFailed:
            return False
        return True

    async def _ack(self, message_id: str) -> None:
        key = _key(message_id)
        if key is None:
            return
        expr = Expression()
        try:
            await self.table.call(
                "delete_item",
                TableName=self.table.name,
                Key=key,
                ConditionExpression=f"attribute_exists({expr.name(A.LIVE)})",
                **expr.params(),
            )
        except ConditionFailed:
            pass  # acked already, or dead: no live message with that id

    async def _release(self, message_id: str, *, error: str, delay: float, dead: bool) -> None:
        now = self.table.clock()
        expr = Expression()
        error_set = f"{expr.name(A.ERROR)} = {expr.value('error', s(error))}"
        if dead:
            update = (
                f"SET {expr.name(A.DEAD)} = {expr.value('dead', s('dead'))}, "
                f"{expr.name(A.DEAD_AT)} = {expr.value('now', n(now))}, {error_set} "
                f"REMOVE {expr.name(A.LIVE)}, {expr.name(A.VISIBLE)}"
            )
        else:
            visible = expr.value("visible", n(now + delay))
            update = f"SET {expr.name(A.VISIBLE)} = {visible}, {error_set}"
        await self._settle(message_id, update, expr, alive=True)
        if not dead:
            self.table.notify()

    async def _dead_letters(self, limit: int) -> list[RawMessage]:
        expr = Expression()
        items = await self.table.query(
            limit,
            IndexName=DEAD_INDEX,
            KeyConditionExpression=f"{expr.name(A.DEAD)} = {expr.value('dead', s('dead'))}",
            Limit=limit,
            **expr.params(),
        )
        return [
            RawMessage(
                _message_id({PK: i[PK], SK: i[SK]}),
                get_b(i, A.PAYLOAD) or b"",
                get_int(i, A.ATTEMPTS) or 0,
                get_s(i, A.ERROR) or "",
            )
            for i in items
        ]

    async def _retry_dead_letter(self, message_id: str) -> bool:
        key = _key(message_id)
        if key is None:
            return False
        expr = Expression()
        revived = await self._settle(
            message_id, _revive(expr, key[PK]["S"], self.table.clock()), expr, alive=False
        )
        if revived:
            self.table.notify()
        return revived

    async def _wait(self, seconds: float) -> None:
        await self.table.wait_notified(min(seconds, self._pause))
        self._pause = min(self._pause * 2, self.poll_interval)

    def __repr__(self) -> str:
        return f"DynamoConsumer(table={self.table.name!r}, max_attempts={self.max_attempts})"
