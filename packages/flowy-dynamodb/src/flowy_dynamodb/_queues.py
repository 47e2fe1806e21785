"""Queues on the table: the claim of a queue's messages within its limits, the queue
items that hold the limits and count against them, and what ``backend.queues`` reads.

A live message carries its route (``queue``, ``partition``, ``priority``) and its
place in the sparse ``queues`` index: ``queue_key`` (the queue and the shard of its
thread) and ``queue_order`` (priority, then enqueue time); a dead letter leaves the
index. A claim sets ``in_flight_until`` with the new ``visible_at``; an ack or a
release removes it, and the end of the visibility timeout ends the flight by itself.

A queue with limits has an item ``queue#<name>`` in the partition ``flowy#queues``:
``limits`` (the JSON of :class:`~flowy.storage.QueueLimits`), ``flying`` (a map from
the message id of each claim counted against the limits to ``{u: in flight until, p:
partition}``), ``starts`` (``"<time>|<partition>"`` of each start in the rate window,
kept while the queue has a rate limit) and ``version``.

A claim is one primitive call:

1. at once, a strongly consistent ``GetItem`` of the queue item and one ``Query`` per
   shard of the ``queues`` index for visible messages in claim order (a filter on
   ``visible_at``: what it reads past are the queue's hidden messages ahead of them),
   read further only when full partitions are skipped;
2. without limits, one conditional ``UpdateItem`` per message taken, at once (the
   condition: the ``visible_at`` read), as the claim of flowy-dynamodb 0.2;
   with limits, the room and the messages are worked out from the queue item, claims
   whose visibility ended being pruned from ``flying`` and starts older than the rate
   period from ``starts``, then ONE ``TransactWriteItems``: the queue item's update,
   conditioned on the ``version`` read, and each message's, conditioned on the
   ``visible_at`` read. A lost race (another claim changed the queue item, or took one
   of the messages) cancels it and nothing is written, so no limit is ever exceeded;
   the claim starts again from step 1 (up to 8 times, then it takes nothing this time);
3. with limits, one strongly consistent ``BatchGetItem`` of the payloads taken (a
   transaction returns no items).

An unlimited claim is two round trips, as before queues; a limited one three. An ack
or a release of a message counted in ``flying`` also removes its entry (one more
``UpdateItem``, conditioned on the entry being that claim's).
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter, deque
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, cast

from flowy.errors import StorageError
from flowy.queues import DEFAULT_QUEUE, QueueLimits
from flowy.storage.dialect import BaseConsumer, QueueCounts, RawMessage

from ._layout import (
    OUTBOX_INDEX,
    PK,
    QUEUES_INDEX,
    QUEUES_PK,
    SHARDS,
    SK,
    A,
    Expression,
    Item,
    get_b,
    get_int,
    get_n,
    get_s,
    key_of,
    message_id,
    n,
    s,
)
from ._table import ConditionFailed, DynamoTable

__all__ = ["QueueClaims", "raw_message"]

_ATTEMPTS = 8
"""Claims of a limited queue sent before one gives up on a race it keeps losing."""
_MAX_TAKEN = 99
"""The most messages a limited claim takes: a transaction holds 100 actions."""
_MAX_PAGE = 1000
_BODY = (A.PAYLOAD, A.ATTEMPTS, A.ERROR)


def raw_message(item: Item) -> RawMessage:
    """The message of a message item (payload, attempts and error read)."""
    payload, error = get_b(item, A.PAYLOAD) or b"", get_s(item, A.ERROR) or ""
    return RawMessage(message_id(item), payload, get_int(item, A.ATTEMPTS) or 0, error)


def queue_item_key(queue: str) -> Item:
    """The key of ``queue``'s item (its limits and what counts against them)."""
    return {PK: s(QUEUES_PK), SK: s(f"queue#{queue}")}


class _Shard:
    """One shard of a queue in the ``queues`` index, read page by page in claim order
    (only messages visible at ``visible_by``, if given); each page reads more."""

    def __init__(self, table: DynamoTable, key: str, page: int, visible_by: float | None):
        self.table, self.key, self.page, self.visible_by = table, key, page, visible_by
        self.items: deque[Item] = deque()
        self.start: Item | None = None
        self.done = False

    async def fill(self) -> None:
        """Read pages until there is an item, or none is left."""
        while not self.items and not self.done:
            expr = Expression()
            params: dict[str, Any] = {
                "IndexName": QUEUES_INDEX,
                "KeyConditionExpression": f"{expr(A.QUEUE_KEY)} = {expr.v(s(self.key))}",
                "Limit": self.page,
            }
            if self.visible_by is not None:
                params["FilterExpression"] = f"{expr(A.VISIBLE)} <= {expr.v(n(self.visible_by))}"
            if self.start is not None:
                params["ExclusiveStartKey"] = self.start
            page = await self.table.call(
                "query", TableName=self.table.name, **params, **expr.params()
            )
            self.items.extend(page.get("Items") or [])
            self.start = page.get("LastEvaluatedKey")
            self.done = self.start is None
            self.page = min(self.page * 4, _MAX_PAGE)


def _order(item: Item) -> tuple[str, str, str]:
    return (get_s(item, A.QUEUE_ORDER) or "", get_s(item, PK) or "", get_s(item, SK) or "")


async def _in_order(
    table: DynamoTable, queue: str, page: int, visible_by: float | None
) -> AsyncIterator[Item]:
    """The live messages of ``queue`` in claim order (visible at ``visible_by`` only, if
    given): a merge of its shards, each read only as far as the merge needs."""
    shards = [_Shard(table, f"{queue}#{shard}", page, visible_by) for shard in range(SHARDS)]
    await asyncio.gather(*(shard.fill() for shard in shards))
    while True:
        ready = [shard for shard in shards if shard.items]
        if not ready:
            return
        best = min(ready, key=lambda shard: _order(shard.items[0]))
        yield best.items.popleft()
        await best.fill()


def _limits(queue: str, item: Item | None) -> QueueLimits | None:
    raw = get_s(item, A.LIMITS)
    if raw is None:
        return None
    try:
        return QueueLimits.from_json(json.loads(raw))
    except (ValueError, TypeError) as exc:
        raise StorageError(f"the stored limits of queue {queue!r} are unreadable: {exc}") from exc


def _flying(item: Item | None, now: float) -> tuple[dict[str, tuple[float, str]], list[str]]:
    """The claims counted in a queue item that are still in flight (message id ->
    (until, partition)), and the message ids of those that ended."""
    raw = cast(Mapping[str, Any], (item or {}).get(A.FLYING, {}).get("M") or {})
    live: dict[str, tuple[float, str]] = {}
    ended: list[str] = []
    for mid, value in raw.items():
        entry = cast(Mapping[str, Any], cast(Mapping[str, Any], value).get("M") or {})
        until = float(get_n(entry, "u") or 0)
        if until > now:
            live[mid] = (until, get_s(entry, "p") or "")
        else:
            ended.append(mid)
    return live, ended


def _starts(item: Item | None, now: float, period: float) -> list[tuple[float, str]]:
    """The starts a queue item records within the rate window ending ``now``."""
    raw = cast(list[Mapping[str, Any]], (item or {}).get(A.STARTS, {}).get("L") or [])
    out: list[tuple[float, str]] = []
    for value in raw:
        at, _, partition = str(value.get("S") or "").partition("|")
        if float(at or 0) > now - period:
            out.append((float(at), partition))
    return out


class QueueClaims(BaseConsumer):
    """The queue primitives of the consumer of one table (``_claim_queue`` and the four
    others), and the end of a counted claim on ack or release."""

    table: DynamoTable
    _pause: float

    async def _claim_queue(
        self, queue: str, limit: int, visibility_timeout: float, held: int
    ) -> list[RawMessage]:
        for attempt in range(_ATTEMPTS):
            now = self.table.clock()
            page = min(limit, _MAX_TAKEN) + 16  # room for a few hidden messages ahead
            order = _in_order(self.table, queue, page, now)
            item, first = await asyncio.gather(
                self.table.get(queue_item_key(queue), [A.LIMITS, A.FLYING, A.STARTS, A.VERSION]),
                anext(order, None),
            )
            limits = _limits(queue, item)
            if limits is None:
                claimed = await self._take_freely(order, first, limit, now, visibility_timeout)
            else:
                try:
                    claimed = await self._take_within(
                        queue, limits, item, order, first, (limit, held), now, visibility_timeout
                    )
                except ConditionFailed as lost:
                    if lost.failed() or lost.transient():  # a race lost: read again
                        await asyncio.sleep(random.uniform(0.002, 0.01) * (attempt + 1))
                        continue
                    raise StorageError(
                        f"a claim of queue {queue!r} on DynamoDB table {self.table.name!r} "
                        f"was cancelled: {lost.describe()}"
                    ) from lost
            if claimed:
                self._pause = 0.02
            return claimed
        return []

    async def _take_freely(
        self,
        order: AsyncIterator[Item],
        first: Item | None,
        limit: int,
        now: float,
        visibility_timeout: float,
    ) -> list[RawMessage]:
        """Take the first ``limit`` visible messages, each with its own conditional
        ``UpdateItem`` (a message another consumer took meanwhile is left out)."""
        found: list[Item] = []
        item = first
        while item is not None:
            found.append(item)
            if len(found) >= limit:
                break
            item = await anext(order, None)
        taken = await asyncio.gather(
            *(self._take(i, now + visibility_timeout, None) for i in found)
        )
        return [message for message in taken if message is not None]

    def _claim_update(self, item: Item, until: float, counted_in: str | None) -> dict[str, Any]:
        """The ``Update`` of a message claim: hidden and in flight until ``until``, one
        more delivery; condition: still live, with the ``visible_at`` read."""
        expr = Expression()
        fields: Item = {A.VISIBLE: n(until), A.IN_FLIGHT: n(until)}
        if counted_in is not None:
            fields[A.COUNTED_IN] = s(counted_in)
        update = expr.sets(fields)
        update += f", {expr(A.ATTEMPTS)} = {expr(A.ATTEMPTS)} + {expr.v(n(1))}"
        seen = expr.v(item[A.VISIBLE])
        condition = f"attribute_exists({expr(A.LIVE)}) AND {expr(A.VISIBLE)} = {seen}"
        return {
            "TableName": self.table.name,
            "Key": key_of(item),
            "UpdateExpression": update,
            "ConditionExpression": condition,
            **expr.params(),
        }

    async def _take(self, item: Item, until: float, counted_in: str | None) -> RawMessage | None:
        params = self._claim_update(item, until, counted_in)
        try:
            result = await self.table.call("update_item", ReturnValues="ALL_NEW", **params)
        except ConditionFailed:
            return None  # claimed, released or acked by someone else meanwhile
        return raw_message(result.get("Attributes") or {})

    async def _take_within(
        self,
        queue: str,
        limits: QueueLimits,
        item: Item | None,
        order: AsyncIterator[Item],
        first: Item | None,
        asked: tuple[int, int],
        now: float,
        visibility_timeout: float,
    ) -> list[RawMessage]:
        """Take what the queue item's limits allow, in one transaction with the queue
        item's update (``ConditionFailed``: a race lost, nothing written)."""
        limit, held = asked
        flying, ended = _flying(item, now)
        starts = _starts(item, now, limits.rate_period) if limits.rate_limited else []
        room = min(limit, _MAX_TAKEN)
        if limits.worker_concurrency is not None:
            room = min(room, limits.worker_concurrency - held)
        if limits.global_concurrency is not None:
            room = min(room, limits.global_concurrency - len(flying))
        if limits.rate_limit is not None:
            room = min(room, limits.rate_limit - len(starts))
        in_flight = Counter(partition for _, partition in flying.values())
        started = Counter(partition for _, partition in starts)
        taken: list[Item] = []
        candidate = first
        while candidate is not None and len(taken) < room:
            key = get_s(candidate, A.PARTITION) or ""
            full = bool(key) and limits.partition_full(in_flight[key], started[key])
            # An index that lags may still show a message in flight as visible.
            if not full and message_id(candidate) not in flying:
                in_flight[key] += 1
                started[key] += 1
                taken.append(candidate)
            if len(taken) < room:
                candidate = await anext(order, None)
        if not taken:
            return []
        until = now + visibility_timeout
        expr = Expression()
        flying_name = expr(A.FLYING)
        sets = [f"{expr(A.VERSION)} = {expr.v(n((get_int(item, A.VERSION) or 0) + 1))}"]
        ids = [message_id(i) for i in taken]
        for mid, message in zip(ids, taken, strict=True):
            entry = {"M": {"u": n(until), "p": s(get_s(message, A.PARTITION) or "")}}
            sets.append(f"{flying_name}.{expr.key(mid)} = {expr.v(entry)}")
        removed = [f"{flying_name}.{expr.key(mid)}" for mid in ended if mid not in ids]
        if limits.rate_limited:
            starts += [(now, get_s(message, A.PARTITION) or "") for message in taken]
            recorded = {"L": [s(f"{at!r}|{partition}") for at, partition in starts]}
            sets.append(f"{expr(A.STARTS)} = {expr.v(recorded)}")
        elif A.STARTS in (item or {}):
            removed.append(expr(A.STARTS))
        update = "SET " + ", ".join(sets) + (f" REMOVE {', '.join(removed)}" if removed else "")
        version = get_int(item, A.VERSION) or 0
        queue_update = {
            "TableName": self.table.name,
            "Key": queue_item_key(queue),
            "UpdateExpression": update,
            "ConditionExpression": f"{expr(A.VERSION)} = {expr.v(n(version))}",
            **expr.params(),
        }
        actions = [{"Update": queue_update}]
        actions += [{"Update": self._claim_update(i, until, queue)} for i in taken]
        await self.table.call("transact_write_items", TransactItems=actions)
        read = await self.table.get_keys([key_of(i) for i in taken], _BODY, consistent=True)
        by_id = {message_id(i): i for i in read}
        return [raw_message(by_id[mid]) for mid in ids if mid in by_id]

    async def _uncount(self, message_id: str, old: Item | None) -> None:
        """End the counted claim of a message acked or released (``old``: the message
        item before): remove its entry from its queue item's ``flying``, unless the
        entry is another claim's."""
        queue, until = get_s(old, A.COUNTED_IN), (old or {}).get(A.IN_FLIGHT)
        if queue is None or until is None:
            return
        expr = Expression()
        entry = f"{expr(A.FLYING)}.{expr.key(message_id)}"
        try:
            await self.table.update(
                queue_item_key(queue),
                expr,
                f"REMOVE {entry}",
                f"{entry}.{expr('u')} = {expr.v(until)}",
            )
        except ConditionFailed:
            pass  # that claim was pruned, or its queue's limits lifted
        self.table.wakeups.notify()  # a slot of the queue is free again

    async def _set_limits(self, queue: str, limits: QueueLimits | None) -> None:
        key = queue_item_key(queue)
        if limits is None:  # what was counted is forgotten with the limits
            expr = Expression()
            version = expr(A.VERSION)
            update = f"SET {version} = if_not_exists({version}, {expr.v(n(0))}) + {expr.v(n(1))}"
            update += expr.removes([A.LIMITS, A.FLYING, A.STARTS])
            await self.table.call(
                "update_item",
                TableName=self.table.name,
                Key=key,
                UpdateExpression=update,
                **expr.params(),
            )
            self.table.wakeups.notify()
            return
        stored = json.dumps(limits.to_json(), sort_keys=True)
        for _ in range(_ATTEMPTS):
            item = await self.table.get(key, [A.LIMITS, A.VERSION])
            version = get_int(item, A.VERSION)
            fields: Item = {A.LIMITS: s(stored), A.VERSION: n((version or 0) + 1)}
            if get_s(item, A.LIMITS) is None:  # newly limited: count what is in flight
                fields[A.FLYING] = {"M": await self._in_flight(queue)}
            expr = Expression()
            condition = (
                f"attribute_not_exists({expr(A.VERSION)})"
                if version is None
                else f"{expr(A.VERSION)} = {expr.v(n(version))}"
            )
            try:
                await self.table.update(key, expr, expr.sets(fields), condition)
            except ConditionFailed:
                continue  # changed meanwhile (a claim, another change): read again
            self.table.wakeups.notify()  # a raised limit lets waiting claims take more
            return
        raise StorageError(
            f"the limits of queue {queue!r} on DynamoDB table {self.table.name!r} changed "
            f"{_ATTEMPTS} times while being set; nothing was written"
        )

    async def _in_flight(self, queue: str) -> dict[str, Any]:
        """The ``flying`` entries of the queue's messages in flight now (read from the
        index when a queue gets limits: claims taken without them count too, until
        their visibility ends)."""
        now = self.table.clock()
        out: dict[str, Any] = {}
        async for item in _in_order(self.table, queue, _MAX_PAGE, None):
            until = float(get_n(item, A.IN_FLIGHT) or 0)
            if until > now:
                partition = s(get_s(item, A.PARTITION) or "")
                out[message_id(item)] = {"M": {"u": n(until), "p": partition}}
        return out

    async def _queue_items(self) -> list[Item]:
        """Every queue item (strongly consistent)."""
        expr = Expression()
        return await self.table.query(
            None,
            KeyConditionExpression=f"{expr(PK)} = {expr.v(s(QUEUES_PK))}",
            ConsistentRead=True,
            **expr.params(),
        )

    async def _read_limits(self) -> dict[str, QueueLimits]:
        out: dict[str, QueueLimits] = {}
        for item in await self._queue_items():
            queue = (get_s(item, SK) or "").removeprefix("queue#")
            limits = _limits(queue, item)
            if limits is not None:
                out[queue] = limits
        return out

    async def _queue_counts(self) -> dict[str, QueueCounts]:
        lives = [f"live#{shard}" for shard in range(SHARDS)]
        listed, queue_items = await asyncio.gather(
            self.table.query_index(OUTBOX_INDEX, A.LIVE, lives, None), self._queue_items()
        )
        items = await self.table.get_keys(
            [key_of(i) for i in listed], (A.LIVE, A.QUEUE, A.IN_FLIGHT, A.ENQUEUED, A.VISIBLE)
        )
        now = self.table.clock()
        flying: Counter[str] = Counter()
        waiting: dict[str, list[float]] = {}
        for item in items:
            if A.LIVE not in item:  # acked or dead since the index was read
                continue
            queue = get_s(item, A.QUEUE) or DEFAULT_QUEUE
            if float(get_n(item, A.IN_FLIGHT) or 0) > now:
                flying[queue] += 1
            else:
                at = get_n(item, A.ENQUEUED) or get_n(item, A.VISIBLE) or 0
                waiting.setdefault(queue, []).append(float(at))
        started: dict[str, int] = {}
        for item in queue_items:
            queue = (get_s(item, SK) or "").removeprefix("queue#")
            limits = _limits(queue, item)
            if limits is not None and limits.rate_limited:
                started[queue] = len(_starts(item, now, limits.rate_period))
        return {
            queue: QueueCounts(
                flying[queue],
                len(waiting.get(queue, ())),
                min(waiting.get(queue, ()), default=None),
                started.get(queue, 0),
            )
            for queue in {*flying, *waiting, *started}
        }

    async def _queue_messages(self, queue: str, limit: int) -> list[RawMessage]:
        listed: list[Item] = []
        async for item in _in_order(self.table, queue, min(limit, _MAX_PAGE), None):
            listed.append(item)
            if len(listed) >= limit:
                break
        return await self._bodies(listed)

    async def _bodies(self, listed: Sequence[Item]) -> list[RawMessage]:
        """The messages of ``listed`` index items still live, in that order."""
        read = await self.table.get_keys(
            [key_of(i) for i in listed], (A.LIVE, *_BODY), consistent=True
        )
        by_id = {message_id(i): i for i in read if A.LIVE in i}
        ids = [message_id(i) for i in listed]
        return [raw_message(by_id[mid]) for mid in ids if mid in by_id]
