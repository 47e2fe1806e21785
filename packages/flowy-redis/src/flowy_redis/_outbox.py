"""The hand-off outbox on Redis Streams: ``RedisOutbox`` (producer), ``RedisConsumer``
(consumer group, visibility, dead letters) and ``RedisQueueConsumer`` (the same with
named queues and their limits, on a standalone server).

Shard ``i``'s stream ``<ns>:{<ns>:i}:outbox`` lives in the hash slot of the threads of
shard ``i``, so a save and its hand-off are one script. A message is unique per (thread,
committed revision) through the shard's ``ids`` hash. A consumer reads every shard. The
backlog (``stats``) is each shard's stream and dead-letter stream lengths and the id of
its first entry, which carries the time it was added (a dead letter that comes back is
added again).

Each message also has a route (queue, partition key, priority) in its entry. A visible
message is a member of its shard's ready set of its queue (``ready:<queue>``, scored by
priority; the member is its enqueue order, entry id and partition key); a hidden one
(claimed, or released with a delay) is in the shard's ``vis`` set until its time is up,
when a claim puts it back in its ready set. The queues' limits, the messages in flight
and the starts of each queue live under ``{<ns>:queues}``.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import uuid
from collections.abc import Hashable
from typing import Any

from flowy.queues import DEFAULT_QUEUE
from flowy.storage import OutboxStats, QueueLimits
from flowy.storage.dialect import (
    BaseConsumer,
    BaseOutbox,
    OutboxRow,
    QueueCounts,
    RawMessage,
    show_id,
)

from ._keys import ShardKeys
from ._scripts import (
    ACK,
    APPEND,
    CLAIM,
    DEAD_LIST,
    QUEUE_COUNTS,
    QUEUE_MESSAGES,
    RELEASE_MESSAGE,
    RETRY_DEAD,
    STATS,
)
from ._store import Store

__all__ = ["RedisConsumer", "RedisOutbox", "RedisQueueConsumer"]


def route_args(row: OutboxRow) -> tuple[str, int, str]:
    """The append scripts' arguments of ``row``'s route: queue, priority, partition."""
    route = row.route
    return route.queue, route.priority, route.partition_key


class RedisOutbox(BaseOutbox):
    """The producing side: appends hand-offs to their thread's shard stream."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.domain: Hashable = store.domain

    async def _append(self, row: OutboxRow) -> None:
        thread_id = row.thread_id
        await self.store.run(
            APPEND,
            self.store.layout.thread(thread_id).shard.outbox,
            [f"{row.committed_revision}:{thread_id}", row.payload, *route_args(row)],
            lambda: f"enqueuing the hand-off of thread {show_id(thread_id)}",
        )


class RedisConsumer(BaseConsumer):
    """The consuming side (``flowy.Worker`` uses it): a consumer group over every shard.

    A claim makes the hidden messages whose time is up (a visibility timeout that ran
    out, or a release whose delay is over) visible again, then takes the default
    queue's visible messages by priority, then enqueue order (``XCLAIM`` moves each to
    this consumer and counts the delivery). ``attempts`` is the group's delivery count.
    A waiting claim blocks on ``XREAD`` across the shards on a standalone server (woken
    by a new entry, and at least every ``poll_interval`` seconds for released or
    timed-out messages); on a cluster it polls. This consumer keeps no queue limits:
    a cluster's shards live in different hash slots, so no one script could count a
    queue's messages in flight across them (:class:`RedisQueueConsumer` does, on a
    standalone server).

    Args:
        store: the store's connection.
        group: the consumer group; every worker of one outbox uses the same group.
        consumer: this consumer's name in the group (unique per process by default).
        max_attempts: deliveries after which a message is dead-lettered.
        poll_interval: seconds between looks for released or timed-out messages while a
            claim waits.
    """

    def __init__(
        self,
        store: Store,
        *,
        group: str = "flowy",
        consumer: str | None = None,
        max_attempts: int = 5,
        poll_interval: float = 0.1,
    ) -> None:
        super().__init__(max_attempts=max_attempts, poll_interval=poll_interval)
        if not group:
            raise ValueError("the consumer group name must not be empty")
        self.store = store
        self.domain: Hashable = store.domain
        self.group = group
        unique = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.consumer: str = consumer or unique
        self._next_shard = 0
        self._lasts: list[tuple[bytes, bytes]] = []

    def _rotation(self) -> list[ShardKeys]:
        shards = self.store.layout.all_shards()
        start = self._next_shard
        self._next_shard = (start + 1) % len(shards)
        return [*shards[start:], *shards[:start]]

    @property
    def _queues(self) -> bytes:
        """The prefix of the queues' keys the scripts count in (none: no counts)."""
        return b""

    async def _claim(self, limit: int, visibility_timeout: float) -> list[RawMessage]:
        return await self._claim_from(DEFAULT_QUEUE, limit, visibility_timeout, 0)

    async def _claim_from(
        self, queue: str, limit: int, visibility_timeout: float, held: int
    ) -> list[RawMessage]:
        shards = self._rotation()
        hide = max(1, round(visibility_timeout * 1e3))
        args: list[Any] = [self.group, self.consumer, limit, hide, queue, held, self._queues]
        # One script for every shard on a standalone server. On a cluster each shard is
        # its own script (own slot): shard by shard, so a claim never takes more than
        # `limit` messages.
        out: list[RawMessage] = []
        for group in [[s] for s in shards] if self.store.cluster else [shards]:
            args[2] = limit - len(out)
            keys = [key for shard in group for key in shard.outbox]
            delivered, lasts = await self.store.run(CLAIM, keys, args, "claiming outbox messages")
            self._lasts = [(s.stream, last) for s, last in zip(group, lasts, strict=False)]
            out += self._raw(group, delivered)
            if len(out) >= limit:
                break
        return out

    def _raw(self, shards: list[ShardKeys], delivered: list[Any]) -> list[RawMessage]:
        return [
            RawMessage(
                self.store.layout.message_id(shards[int(position) - 1].shard, mid),
                payload,
                int(attempts),
                error.decode("utf-8", "replace"),
            )
            for position, mid, payload, attempts, error in delivered
        ]

    async def _wait(self, seconds: float) -> None:
        pause = min(seconds, self.poll_interval)
        lasts, self._lasts = self._lasts, []
        if self.store.cluster or not lasts:
            await asyncio.sleep(pause)
            return
        kwargs = self.store.client.connection_pool.connection_kwargs  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType, reportUnknownVariableType]
        timeout = kwargs.get("socket_timeout")  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
        if isinstance(timeout, int | float) and timeout > 0:
            pause = min(pause, timeout / 2)  # a blocked read must not time the socket out
        await self.store.execute(
            "waiting for outbox messages",
            "XREAD",
            "COUNT",
            1,
            "BLOCK",
            max(1, round(pause * 1e3)),
            "STREAMS",
            *(stream for stream, _ in lasts),
            *(last for _, last in lasts),
        )

    async def _shard_call(self, script: Any, message_id: str, args: list[Any], what: str) -> Any:
        parsed = self.store.layout.parse_message_id(message_id)
        if parsed is None:
            return None  # not an id of this store: no such message
        shard, entry = parsed
        return await self.store.run(
            script, shard.outbox, [*args[:1], entry, *args[1:]], f"{what} {message_id!r}"
        )

    def ack_arguments(self, message_id: str) -> tuple[ShardKeys, list[bytes | str]] | None:
        """The shard of message ``message_id`` and what acknowledging it takes (the
        group, its entry id, the prefix of the queues' keys): the arguments of the ack
        script and of the acking save script (``RedisCheckpointer._write_ack``);
        ``None`` for an id this store did not make (no such message)."""
        parsed = self.store.layout.parse_message_id(message_id)
        if parsed is None:
            return None
        shard, entry = parsed
        return shard, [self.group, entry, self._queues]

    async def _ack(self, message_id: str) -> None:
        target = self.ack_arguments(message_id)
        if target is not None:
            shard, args = target
            what = f"acking outbox message {message_id!r}"
            await self.store.run(ACK, shard.outbox, args, what)

    async def _release(self, message_id: str, *, error: str, delay: float, dead: bool) -> None:
        await self._shard_call(
            RELEASE_MESSAGE,
            message_id,
            [self.group, error, round(delay * 1e3), "1" if dead else "0", self._queues],
            "releasing outbox message",
        )

    async def _dead_letters(self, limit: int) -> list[RawMessage]:
        shards = self.store.layout.all_shards()
        replies = await self.store.run_sharded(
            DEAD_LIST, [s.outbox for s in shards], [limit], "listing dead letters"
        )
        rows: list[tuple[tuple[int, int], RawMessage]] = []
        for call, reply in enumerate(replies):
            for position, dead_id, mid, payload, attempts, error in reply:
                shard = shards[call + int(position) - 1]
                millis, _, seq = dead_id.partition(b"-")
                message_id = self.store.layout.message_id(shard.shard, mid)
                raw = RawMessage(
                    message_id, payload, int(attempts), error.decode("utf-8", "replace")
                )
                rows.append(((int(millis), int(seq or 0)), raw))
        rows.sort(key=lambda row: row[0])
        return [raw for _, raw in rows[:limit]]

    async def _retry_dead_letter(self, message_id: str) -> bool:
        return bool(await self._shard_call(RETRY_DEAD, message_id, [], "retrying dead letter"))

    async def _stats(self) -> OutboxStats:
        shards = self.store.layout.all_shards()
        replies = await self.store.run_sharded(
            STATS, [s.outbox for s in shards], [], "reading the outbox backlog"
        )
        pending = dead = 0
        oldest: float | None = None
        for reply in replies:
            for live, first, buried in reply:
                pending, dead = pending + int(live), dead + int(buried)
                if first:
                    added = int(bytes(first).partition(b"-")[0]) / 1e3
                    oldest = added if oldest is None else min(oldest, added)
        return OutboxStats(pending, oldest, dead)


class RedisQueueConsumer(RedisConsumer):
    """The consumer of a standalone Redis server, which keeps named queues.

    Every claim is one script over every shard and the queue's keys: it reads the
    queue's limits (``{<ns>:queues}:limits``, a JSON object per queue), prunes and
    counts its messages in flight (a sorted set of message -> in flight until, per
    queue and per partition) and, while a rate limit is set, its starts in the window,
    then takes the ready messages of every shard merged by priority, then enqueue
    order, skipping those of full partitions. An ack, a release or a dead-lettering
    takes the message out of the in-flight sets in its own script; a claim whose
    visibility timeout ran out stops counting by itself (its score is past).
    """

    @property
    def _queues(self) -> bytes:
        return self.store.layout.queues

    async def _claim_queue(
        self, queue: str, limit: int, visibility_timeout: float, held: int
    ) -> list[RawMessage]:
        return await self._claim_from(queue, limit, visibility_timeout, held)

    async def _set_limits(self, queue: str, limits: QueueLimits | None) -> None:
        key = self._queues + b"limits"
        what = f"setting the limits of queue {queue!r}"
        if limits is None:
            await self.store.execute(what, "HDEL", key, queue)
        else:
            await self.store.execute(what, "HSET", key, queue, json.dumps(limits.to_json()))

    async def _read_limits(self) -> dict[str, QueueLimits]:
        rows: dict[bytes, bytes] = await self.store.execute(
            "reading the queues' limits", "HGETALL", self._queues + b"limits"
        )
        return {
            name.decode("utf-8"): QueueLimits.from_json(json.loads(raw))
            for name, raw in rows.items()
        }

    async def _queue_counts(self) -> dict[str, QueueCounts]:
        shards = self.store.layout.all_shards()
        keys = [key for shard in shards for key in shard.outbox]
        rows = await self.store.run(QUEUE_COUNTS, keys, [self._queues], "counting the queues")
        return {
            name.decode("utf-8"): QueueCounts(
                int(flying),
                int(pending),
                int(bytes(oldest)[:16]) / 1e6 if oldest else None,
                int(started),
            )
            for name, flying, pending, oldest, started in rows
        }

    async def _queue_messages(self, queue: str, limit: int) -> list[RawMessage]:
        shards = self.store.layout.all_shards()
        keys = [key for shard in shards for key in shard.outbox]
        rows: list[list[Any]] = await self.store.run(
            QUEUE_MESSAGES, keys, [queue, limit, self.group], f"listing queue {queue!r}"
        )
        rows.sort(key=lambda row: (int(row[1]), bytes(row[2])))
        return [
            RawMessage(
                self.store.layout.message_id(shards[int(position) - 1].shard, mid),
                payload,
                int(attempts),
                error.decode("utf-8", "replace"),
            )
            for position, _, _, mid, payload, attempts, error in rows[:limit]
        ]
