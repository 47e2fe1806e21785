"""The hand-off outbox on DynamoDB: :class:`DynamoOutbox` writes intents,
:class:`DynamoOutboxConsumer` delivers them to workers.

Messages live in a fixed number of partitions ``outbox#<shard>`` (a thread's intents
always go to the same shard), sorted by enqueue time, so consumers find them with a
strongly consistent ``Query``. Each item carries the intent bytes
(``flowy.checkpoint.encode_intent``), the number of deliveries so far and the time it is
visible again. A claim is a conditional ``UpdateItem`` (the attempts count must be the
one just read), so two consumers never both claim one delivery; an unacked claim becomes
visible again after its visibility timeout. After ``max_attempts`` deliveries a message
moves, in one transaction, to ``dead#<shard>``; ``retry_dead_letter`` moves it back.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import flowy
from flowy.checkpoint import HandoffIntent, OutboxMessage, decode_intent, encode_intent

from ._executor import ConditionFailed, DynamoExecutor, TransactionCancelled
from ._table import (
    A_ATTEMPTS,
    A_DEAD_AT,
    A_ENQUEUED,
    A_ERROR,
    A_PAYLOAD,
    A_VISIBLE,
    PK,
    SK,
    Clock,
    DynamoTable,
    DynamoTransaction,
    Expression,
    Item,
    b,
    get_b,
    get_int,
    get_s,
    n,
    s,
    shard_of,
)

if TYPE_CHECKING:
    from botocore.client import BaseClient

__all__ = ["DEFAULT_OUTBOX_SHARDS", "DynamoOutbox", "DynamoOutboxConsumer"]

DEFAULT_OUTBOX_SHARDS = 8
"""Outbox partitions (every producer and consumer of a table must use the same)."""

_OUTBOX = "outbox#"
_DEAD = "dead#"
_MAX_ERROR_CHARS = 2000


def _check_shards(shards: int) -> int:
    if shards < 1:
        raise ValueError(f"shards must be at least 1, got {shards!r}")
    return shards


def _message_id(shard: int, sk: str) -> str:
    return f"{shard}:{sk}"


def _parse_id(message_id: str, shards: int) -> tuple[int, str] | None:
    shard_text, sep, sk = message_id.partition(":")
    if not sep or not shard_text.isdigit() or not sk:
        return None
    shard = int(shard_text)
    if shard >= shards:
        return None
    return shard, sk


def _key(prefix: str, shard: int, sk: str) -> Item:
    return {PK: s(f"{prefix}{shard}"), SK: s(sk)}


class DynamoOutbox:
    """The producing side of the outbox: ``enqueue_intent`` writes one item;
    ``enqueue_intent_tx`` adds it to the transaction of
    ``DynamoCheckpointer.save_with_outbox`` so it commits with the checkpoint.

    Args:
        client: a boto3 DynamoDB client.
        table_name: the table made by :func:`flowy_dynamodb.create_table`.
        shards: outbox partitions; the consumers must use the same number.
        executor: the bounded thread pool for boto3 calls (a private one if omitted).
        clock: epoch seconds (``time.time``); replaceable for tests.
    """

    def __init__(
        self,
        client: BaseClient,
        table_name: str,
        *,
        shards: int = DEFAULT_OUTBOX_SHARDS,
        executor: DynamoExecutor | None = None,
        clock: Clock = time.time,
    ) -> None:
        self.shards = _check_shards(shards)
        self._table = DynamoTable(client, table_name, executor=executor, clock=clock)

    @property
    def table_name(self) -> str:
        """The DynamoDB table holding the outbox."""
        return self._table.name

    def _put(self, intent: HandoffIntent) -> dict[str, Any]:
        now = self._table.clock()
        shard = shard_of(intent.thread_id, self.shards)
        sk = f"{time.time_ns():020d}#{uuid.uuid4().hex}"
        item: Item = {
            **_key(_OUTBOX, shard, sk),
            A_PAYLOAD: b(encode_intent(intent)),
            A_ATTEMPTS: n(0),
            A_VISIBLE: n(0),
            A_ENQUEUED: n(now),
        }
        return {
            "TableName": self._table.name,
            "Item": item,
            "ConditionExpression": "attribute_not_exists(#pk)",
            "ExpressionAttributeNames": {"#pk": PK},
        }

    async def enqueue_intent(self, intent: HandoffIntent) -> None:
        """Durably enqueue ``intent`` (one ``PutItem``; at-least-once delivery)."""
        try:
            await self._table.call("put_item", **self._put(intent))
        except ConditionFailed:  # pragma: no cover - the sort key is unique
            raise flowy.StorageError(
                f"outbox item for thread {intent.thread_id[:80]!r} collided with an "
                "existing one; enqueue it again"
            ) from None

    async def enqueue_intent_tx(self, tx: object, intent: HandoffIntent) -> None:
        """Add the outbox item for ``intent`` to ``tx``, the :class:`DynamoTransaction`
        that ``DynamoCheckpointer.save_with_outbox`` passed to its callback."""
        if not isinstance(tx, DynamoTransaction):
            raise TypeError(
                f"DynamoOutbox.enqueue_intent_tx needs the DynamoTransaction handle of "
                f"DynamoCheckpointer.save_with_outbox, got {type(tx).__name__}"
            )
        tx.add({"Put": self._put(intent)})

    async def close(self) -> None:
        """Release the executor this outbox created (a shared one is left alone)."""
        self._table.close()

    def __repr__(self) -> str:
        return f"DynamoOutbox(table={self._table.name!r}, shards={self.shards})"


class DynamoOutboxConsumer:
    """The consuming side of the outbox, for ``flowy.Worker``.

    ``claim`` hides each claimed message for ``visibility_timeout`` seconds and counts
    the delivery; ``ack`` deletes it; ``release`` makes it visible at once, or moves it
    to the dead letters once it has been delivered ``max_attempts`` times (a message
    found visible again after its last delivery's timeout moves there too).

    Args:
        client: a boto3 DynamoDB client.
        table_name: the table made by :func:`flowy_dynamodb.create_table`.
        shards: outbox partitions; the producers must use the same number.
        max_attempts: deliveries before a message is dead-lettered.
        poll_interval: the longest sleep between polls while ``claim`` waits.
        executor: the bounded thread pool for boto3 calls (a private one if omitted).
        clock: epoch seconds (``time.time``); replaceable for tests.
    """

    def __init__(
        self,
        client: BaseClient,
        table_name: str,
        *,
        shards: int = DEFAULT_OUTBOX_SHARDS,
        max_attempts: int = 5,
        poll_interval: float = 0.2,
        executor: DynamoExecutor | None = None,
        clock: Clock = time.time,
    ) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts!r}")
        if poll_interval <= 0:
            raise ValueError(f"poll_interval must be positive, got {poll_interval!r}")
        self.shards = _check_shards(shards)
        self.max_attempts = max_attempts
        self.poll_interval = poll_interval
        self._table = DynamoTable(client, table_name, executor=executor, clock=clock)
        self._next_shard = 0

    @property
    def table_name(self) -> str:
        """The DynamoDB table holding the outbox."""
        return self._table.name

    # -- claiming ---------------------------------------------------------------------

    async def claim(
        self, limit: int, visibility_timeout: float, wait: float = 0.0
    ) -> list[OutboxMessage]:
        """Claim up to ``limit`` visible messages, hidden from other consumers for
        ``visibility_timeout`` seconds; poll (with short sleeps) for up to ``wait``
        seconds while there is none."""
        if limit <= 0:
            return []
        if visibility_timeout <= 0:
            raise ValueError(f"visibility_timeout must be positive, got {visibility_timeout!r}")
        deadline = time.monotonic() + max(wait, 0.0)
        delay = min(0.02, self.poll_interval)
        while True:
            got = await self._claim_once(limit, visibility_timeout)
            remaining = deadline - time.monotonic()
            if got or remaining <= 0:
                return got
            await asyncio.sleep(min(delay, remaining))
            delay = min(delay * 2, self.poll_interval)

    async def _claim_once(self, limit: int, visibility_timeout: float) -> list[OutboxMessage]:
        out: list[OutboxMessage] = []
        start = self._next_shard
        self._next_shard = (start + 1) % self.shards
        for step in range(self.shards):
            shard = (start + step) % self.shards
            now = self._table.clock()
            candidates = await self._visible(shard, now, limit - len(out))
            claimed = await asyncio.gather(
                *(self._try_claim(shard, item, now, visibility_timeout) for item in candidates)
            )
            out.extend(m for m in claimed if m is not None)
            if len(out) >= limit:
                break
        return out[:limit]

    async def _visible(self, shard: int, now: float, want: int) -> list[Item]:
        expr = Expression()
        return await self._table.query_all(
            want,
            TableName=self._table.name,
            KeyConditionExpression=f"{expr.name(PK)} = {expr.value('pk', s(f'{_OUTBOX}{shard}'))}",
            FilterExpression=f"{expr.name(A_VISIBLE)} <= {expr.value('now', n(now))}",
            ConsistentRead=True,
            Limit=max(want, 25),
            **expr.params(),
        )

    async def _try_claim(
        self, shard: int, item: Item, now: float, visibility_timeout: float
    ) -> OutboxMessage | None:
        sk = get_s(item, SK) or ""
        attempts = get_int(item, A_ATTEMPTS) or 0
        if attempts >= self.max_attempts:
            await self._bury(shard, item, get_s(item, A_ERROR) or "")
            return None
        expr = Expression()
        att, vis = expr.name(A_ATTEMPTS), expr.name(A_VISIBLE)
        try:
            result = await self._table.call(
                "update_item",
                TableName=self._table.name,
                Key=_key(_OUTBOX, shard, sk),
                UpdateExpression=(
                    f"SET {vis} = {expr.value('until', n(now + visibility_timeout))}, "
                    f"{att} = {att} + {expr.value('one', n(1))}"
                ),
                ConditionExpression=(
                    f"{att} = {expr.value('seen', n(attempts))} AND "
                    f"{vis} <= {expr.value('now', n(now))}"
                ),
                ReturnValues="ALL_NEW",
                **expr.params(),
            )
        except ConditionFailed:
            return None  # another consumer claimed (or acked) it first
        claimed: Item = result.get("Attributes") or {}
        payload = get_b(claimed, A_PAYLOAD) or b""
        try:
            intent = decode_intent(payload)
        except ValueError as exc:
            await self._bury(shard, claimed, f"undecodable intent: {exc}")
            return None
        return OutboxMessage(
            _message_id(shard, sk), intent, get_int(claimed, A_ATTEMPTS) or attempts + 1
        )

    async def _bury(self, shard: int, item: Mapping[str, Any], error: str) -> None:
        """Move a message to the dead letters, unless someone changed it meanwhile."""
        sk = get_s(item, SK) or ""
        attempts = get_int(item, A_ATTEMPTS) or 0
        expr = Expression()
        dead: Item = {
            **_key(_DEAD, shard, sk),
            A_PAYLOAD: b(get_b(item, A_PAYLOAD) or b""),
            A_ATTEMPTS: n(attempts),
            A_ERROR: s(error[:_MAX_ERROR_CHARS]),
            A_DEAD_AT: n(self._table.clock()),
        }
        enqueued = get_int(item, A_ENQUEUED)
        if enqueued is not None:
            dead[A_ENQUEUED] = item[A_ENQUEUED]
        try:
            await self._table.call(
                "transact_write_items",
                TransactItems=[
                    {
                        "Delete": {
                            "TableName": self._table.name,
                            "Key": _key(_OUTBOX, shard, sk),
                            "ConditionExpression": (
                                f"{expr.name(A_ATTEMPTS)} = {expr.value('att', n(attempts))}"
                            ),
                            **expr.params(),
                        }
                    },
                    {"Put": {"TableName": self._table.name, "Item": dead}},
                ],
            )
        except TransactionCancelled:
            pass  # acked, claimed or buried by someone else in between

    # -- settling ---------------------------------------------------------------------

    def _parse(self, message_id: str) -> tuple[int, str]:
        parsed = _parse_id(message_id, self.shards)
        if parsed is None:
            raise ValueError(
                f"{message_id!r} is not a message id of this outbox ({self.shards} shards); "
                "pass the OutboxMessage that claim returned"
            )
        return parsed

    async def ack(self, message: OutboxMessage) -> None:
        """Remove a delivered message for good (one ``DeleteItem``)."""
        shard, sk = self._parse(message.message_id)
        await self._table.call(
            "delete_item", TableName=self._table.name, Key=_key(_OUTBOX, shard, sk)
        )

    async def release(self, message: OutboxMessage, *, error: str = "") -> None:
        """Make a claimed message visible again at once, or dead-letter it once it has
        been delivered ``max_attempts`` times. An acked message is left alone."""
        shard, sk = self._parse(message.message_id)
        expr = Expression()
        try:
            await self._table.call(
                "update_item",
                TableName=self._table.name,
                Key=_key(_OUTBOX, shard, sk),
                UpdateExpression=(
                    f"SET {expr.name(A_VISIBLE)} = {expr.value('zero', n(0))}, "
                    f"{expr.name(A_ERROR)} = {expr.value('error', s(error[:_MAX_ERROR_CHARS]))}"
                ),
                ConditionExpression=(
                    f"attribute_exists({expr.name(PK)}) AND "
                    f"{expr.name(A_ATTEMPTS)} < {expr.value('max', n(self.max_attempts))}"
                ),
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
                **expr.params(),
            )
        except ConditionFailed as failed:
            if failed.item is not None:
                await self._bury(shard, failed.item, error)

    # -- dead letters -----------------------------------------------------------------

    async def dead_letters(self, limit: int = 100) -> list[OutboxMessage]:
        """List up to ``limit`` dead-lettered messages (``attempts`` = deliveries made)."""
        out: list[OutboxMessage] = []
        if limit <= 0:
            return out
        for shard in range(self.shards):
            expr = Expression()
            items = await self._table.query_all(
                limit - len(out),
                TableName=self._table.name,
                KeyConditionExpression=(
                    f"{expr.name(PK)} = {expr.value('pk', s(f'{_DEAD}{shard}'))}"
                ),
                ConsistentRead=True,
                Limit=min(limit - len(out), 1000),
                **expr.params(),
            )
            for item in items:
                try:
                    intent = decode_intent(get_b(item, A_PAYLOAD) or b"")
                except ValueError:
                    continue  # an undecodable payload cannot be represented as a message
                sk = get_s(item, SK) or ""
                out.append(
                    OutboxMessage(_message_id(shard, sk), intent, get_int(item, A_ATTEMPTS) or 0)
                )
            if len(out) >= limit:
                break
        return out[:limit]

    async def retry_dead_letter(self, message_id: str) -> None:
        """Move a dead-lettered message back to the outbox with its attempts reset
        (``KeyError`` if there is no dead letter with that id)."""
        parsed = _parse_id(message_id, self.shards)
        if parsed is None:
            raise KeyError(f"no dead letter with id {message_id!r}")
        shard, sk = parsed
        result = await self._table.call(
            "get_item",
            TableName=self._table.name,
            Key=_key(_DEAD, shard, sk),
            ConsistentRead=True,
        )
        item = result.get("Item")
        if item is None:
            raise KeyError(f"no dead letter with id {message_id!r}")
        revived: Item = {
            **_key(_OUTBOX, shard, sk),
            A_PAYLOAD: b(get_b(item, A_PAYLOAD) or b""),
            A_ATTEMPTS: n(0),
            A_VISIBLE: n(0),
            A_ENQUEUED: item.get(A_ENQUEUED) or n(self._table.clock()),
        }
        expr = Expression()
        try:
            await self._table.call(
                "transact_write_items",
                TransactItems=[
                    {
                        "Delete": {
                            "TableName": self._table.name,
                            "Key": _key(_DEAD, shard, sk),
                            "ConditionExpression": f"attribute_exists({expr.name(PK)})",
                            **expr.params(),
                        }
                    },
                    {"Put": {"TableName": self._table.name, "Item": revived}},
                ],
            )
        except TransactionCancelled:
            raise KeyError(f"no dead letter with id {message_id!r}") from None

    async def close(self) -> None:
        """Release the executor this consumer created (a shared one is left alone)."""
        self._table.close()

    def __repr__(self) -> str:
        return (
            f"DynamoOutboxConsumer(table={self._table.name!r}, shards={self.shards}, "
            f"max_attempts={self.max_attempts})"
        )
