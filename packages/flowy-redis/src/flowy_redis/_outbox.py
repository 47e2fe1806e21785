"""The hand-off outbox on Redis Streams: ``RedisOutbox`` (producer, transactional with
``RedisCheckpointer``), ``RedisTransaction`` (the handle ``save_with_outbox`` passes) and
``RedisOutboxConsumer`` (consumer group, visibility timeouts, dead letters).

The outbox is sharded: shard ``i`` is the stream ``<ns>:{<ns>:i}:outbox``, in the hash slot
of the threads assigned to it, so a save and its intent are one script. A consumer reads
every shard. Each delivery is recorded in the consumer group's pending list (delivery
count) and in the shard's ``vis`` sorted set (when it becomes claimable again); claims,
releases, acks and dead-lettering are each one script per shard.
"""

from __future__ import annotations

import asyncio
import math
import os
import socket
import time
import uuid
from typing import Any

from flowy.checkpoint import (
    HandoffIntent,
    OutboxMessage,
    decode_intent,
    encode_intent,
    validate_thread_id,
)

from ._keys import DEFAULT_NAMESPACE, DEFAULT_SHARDS, KeyLayout, ShardKeys, describe
from ._scripts import ACK, CLAIM, DEAD_LIST, RELEASE_MESSAGE, RETRY_DEAD
from ._store import RedisClient, StoreUser, connect

__all__ = ["RedisOutbox", "RedisOutboxConsumer", "RedisTransaction"]


class RedisTransaction:
    """The transaction handle of ``RedisCheckpointer.save_with_outbox``.

    Redis has no interactive transactions: ``enqueue_intent_tx`` only collects the
    encoded intents here, and the checkpointer's save script appends them to the
    thread's outbox shard atomically with the snapshot after ``enqueue`` returns. The
    handle is closed once ``enqueue`` returns; intents can only be for the saved thread's
    shard (normally the saved thread itself).
    """

    __slots__ = ("_intents", "_open", "layout", "shard", "thread_id")

    def __init__(self, layout: KeyLayout, thread_id: str) -> None:
        self.layout = layout
        self.thread_id = thread_id
        self.shard = layout.shard_of(thread_id)
        self._intents: list[bytes] = []
        self._open = True

    @property
    def intents(self) -> list[bytes]:
        """The encoded intents collected so far."""
        return list(self._intents)

    def close(self) -> None:
        """Refuse further intents (the save is under way or done)."""
        self._open = False

    def add(self, intent: HandoffIntent) -> None:
        """Collect ``intent`` for the save script."""
        if not self._open:
            raise RuntimeError(
                "this RedisTransaction is closed: enqueue_intent_tx must be awaited inside "
                "the enqueue callback of save_with_outbox, before it returns"
            )
        thread_id = validate_thread_id(intent.thread_id)
        if self.layout.shard_of(thread_id) != self.shard:
            raise ValueError(
                f"the intent names thread {describe(thread_id)}, whose outbox shard is "
                f"{self.layout.shard_of(thread_id)}, but the save is of thread "
                f"{describe(self.thread_id)} in shard {self.shard}: one save script can only "
                f"append to its own shard. Enqueue intents of the saved thread."
            )
        self._intents.append(encode_intent(intent))


class RedisOutbox(StoreUser):
    """The producing side of the outbox: appends intents to the thread's shard stream.

    Args:
        client: a ``redis.asyncio.Redis`` or ``redis.asyncio.RedisCluster`` client.
        namespace: the prefix of every key (as the checkpointer's).
        shards: the namespace's outbox shard count (as the checkpointer's).
    """

    def __init__(
        self,
        client: RedisClient,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        shards: int = DEFAULT_SHARDS,
    ) -> None:
        super().__init__(client, namespace=namespace, shards=shards)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        cluster: bool = False,
        namespace: str = DEFAULT_NAMESPACE,
        shards: int = DEFAULT_SHARDS,
        **client_options: Any,
    ) -> RedisOutbox:
        """An outbox with its own client for ``url``; ``aclose()`` closes it."""
        outbox = cls(
            connect(url, cluster=cluster, **client_options), namespace=namespace, shards=shards
        )
        return outbox._owning_client()

    async def enqueue_intent(self, intent: HandoffIntent) -> None:
        """Append ``intent`` to its thread's shard stream (``XADD``)."""
        thread_id = validate_thread_id(intent.thread_id)
        stream = self._store.layout.thread(thread_id).stream
        await self._store.execute(
            lambda: f"enqueuing the hand-off of thread {describe(thread_id)}",
            "XADD",
            stream,
            "*",
            "intent",
            encode_intent(intent),
        )

    async def enqueue_intent_tx(self, tx: object, intent: HandoffIntent) -> None:
        """Collect ``intent`` in ``tx``, the handle of ``RedisCheckpointer.save_with_outbox``;
        the save script appends it atomically with the snapshot."""
        if not isinstance(tx, RedisTransaction):
            raise TypeError(
                f"RedisOutbox.enqueue_intent_tx needs the handle that "
                f"RedisCheckpointer.save_with_outbox passes to enqueue, got "
                f"{type(tx).__name__}"
            )
        if tx.layout != self._store.layout:
            raise ValueError(
                f"the transaction is of {tx.layout!r} but this outbox is of "
                f"{self._store.layout!r}; use the same namespace and shards"
            )
        tx.add(intent)


def _default_consumer_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _entry_order(entry_id: bytes) -> tuple[int, int]:
    ms, _, seq = entry_id.partition(b"-")
    return int(ms), int(seq or 0)


class RedisOutboxConsumer(StoreUser):
    """The consuming side of the outbox (``flowy.Worker`` uses it): a consumer group over
    every shard stream, with per-claim visibility timeouts and dead letters.

    A claim first takes deliveries whose visibility ran out (a consumer crashed or gave
    up: ``XCLAIM`` moves them to this consumer and counts the delivery), then entries
    never delivered (``XREADGROUP``). ``attempts`` is the consumer group's delivery
    count. ``release`` makes a message claimable again at once, keeping its id and count,
    or dead-letters it once ``max_attempts`` deliveries were made; a delivery whose
    visibility runs out on the last allowed attempt is dead-lettered by the next claim.
    ``retry_dead_letter`` puts a dead letter back as a new stream entry that keeps its
    message id, with the count reset.

    Waiting claims block on ``XREAD`` across all shards on a standalone server (woken by
    any new entry, and at least every ``poll_interval`` seconds for released or timed-out
    messages); on a cluster they poll every ``poll_interval`` seconds.

    Args:
        client: a ``redis.asyncio.Redis`` or ``redis.asyncio.RedisCluster`` client.
        namespace: the prefix of every key (as the outbox's).
        shards: the namespace's outbox shard count (as the outbox's).
        group: the consumer group; every worker of one outbox uses the same group.
        consumer: this consumer's name in the group (unique per process by default).
        max_attempts: deliveries after which a message is dead-lettered.
        poll_interval: seconds between looks for released or timed-out messages while a
            claim waits.
    """

    def __init__(
        self,
        client: RedisClient,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        shards: int = DEFAULT_SHARDS,
        group: str = "flowy",
        consumer: str | None = None,
        max_attempts: int = 5,
        poll_interval: float = 0.1,
    ) -> None:
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f"max_attempts must be an int >= 1, got {max_attempts!r}")
        if not (math.isfinite(poll_interval) and poll_interval > 0):
            raise ValueError(f"poll_interval must be a positive number, got {poll_interval!r}")
        if not group:
            raise ValueError("the consumer group name must not be empty")
        super().__init__(client, namespace=namespace, shards=shards)
        self.group = group
        self.consumer = consumer or _default_consumer_name()
        self.max_attempts = max_attempts
        self.poll_interval = poll_interval
        self._next_shard = 0

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        cluster: bool = False,
        namespace: str = DEFAULT_NAMESPACE,
        shards: int = DEFAULT_SHARDS,
        group: str = "flowy",
        consumer: str | None = None,
        max_attempts: int = 5,
        **client_options: Any,
    ) -> RedisOutboxConsumer:
        """A consumer with its own client for ``url``; ``aclose()`` closes it."""
        made = cls(
            connect(url, cluster=cluster, **client_options),
            namespace=namespace,
            shards=shards,
            group=group,
            consumer=consumer,
            max_attempts=max_attempts,
        )
        return made._owning_client()

    def _rotation(self) -> list[ShardKeys]:
        shards = self._store.layout.all_shards()
        start = self._next_shard
        self._next_shard = (start + 1) % len(shards)
        return [*shards[start:], *shards[:start]]

    async def claim(
        self, limit: int, visibility_timeout: float, wait: float = 0.0
    ) -> list[OutboxMessage]:
        """Claim up to ``limit`` messages, hidden from other claims for
        ``visibility_timeout`` seconds; wait up to ``wait`` seconds for one."""
        if limit <= 0:
            return []
        if not (math.isfinite(visibility_timeout) and visibility_timeout > 0):
            raise ValueError(
                f"visibility_timeout must be a positive number of seconds, got "
                f"{visibility_timeout!r}"
            )
        vis_ms = max(1, math.ceil(visibility_timeout * 1000))
        deadline = time.monotonic() + max(wait, 0.0)
        while True:
            messages, wake = await self._claim_once(int(limit), vis_ms)
            if messages:
                return messages
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            pause = min(remaining, self.poll_interval)
            if wake is None:
                await asyncio.sleep(pause)
            else:
                await self._block(wake, pause)

    async def _claim_once(
        self, limit: int, vis_ms: int
    ) -> tuple[list[OutboxMessage], list[tuple[bytes, bytes]] | None]:
        shards = self._rotation()
        args = [self.group, self.consumer, limit, vis_ms, self.max_attempts]
        if not self._store.cluster:
            reply: list[Any] = await self._store.run(
                CLAIM,
                [key for shard in shards for key in shard.consumer_keys],
                args,
                "claiming outbox messages",
            )
            delivered, lasts = reply
            wake = [(shard.stream, last) for shard, last in zip(shards, lasts, strict=True)]
            return await self._messages(shards, delivered), wake
        # On a cluster each shard is its own script (own slot); go shard by shard so a
        # claim never takes more than ``limit`` messages.
        out: list[OutboxMessage] = []
        for shard in shards:
            args[2] = limit - len(out)
            reply = await self._store.run(
                CLAIM, shard.consumer_keys, args, "claiming outbox messages"
            )
            out.extend(await self._messages([shard], reply[0]))
            if len(out) >= limit:
                break
        return out, None

    async def _messages(self, shards: list[ShardKeys], delivered: list[Any]) -> list[OutboxMessage]:
        out: list[OutboxMessage] = []
        layout = self._store.layout
        for position, mid, payload, attempts in delivered:
            shard = shards[int(position) - 1]
            message_id = layout.message_id(shard.shard, mid)
            try:
                intent = decode_intent(payload)
            except ValueError as exc:
                # Not an intent flowy wrote: dead-letter it now rather than fail every claim.
                await self._store.run(
                    RELEASE_MESSAGE,
                    shard.consumer_keys,
                    [self.group, mid, f"undecodable outbox entry: {exc}", 1],
                    f"dead-lettering outbox message {message_id!r}",
                )
                continue
            out.append(OutboxMessage(message_id, intent, int(attempts)))
        return out

    async def _block(self, wake: list[tuple[bytes, bytes]], pause: float) -> None:
        """Block until an entry newer than ``wake`` arrives in any shard, or ``pause``."""
        timeout = self._store.client.connection_pool.connection_kwargs.get("socket_timeout")  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType, reportUnknownVariableType]
        if isinstance(timeout, int | float) and timeout > 0:
            pause = min(pause, timeout / 2)
        streams = [stream for stream, _ in wake]
        ids = [last for _, last in wake]
        await self._store.execute(
            "waiting for outbox messages",
            "XREAD",
            "COUNT",
            1,
            "BLOCK",
            max(1, round(pause * 1000)),
            "STREAMS",
            *streams,
            *ids,
        )

    def _parse(self, message_id: object, action: str) -> tuple[ShardKeys, str]:
        parsed = self._store.layout.parse_message_id(message_id)
        if parsed is None:
            raise ValueError(
                f"cannot {action} message {message_id!r}: it is not a message id of a "
                f"RedisOutboxConsumer of {self._store.layout!r}"
            )
        shard, entry = parsed
        return self._store.layout.shard(shard), entry

    async def ack(self, message: OutboxMessage) -> None:
        """Remove a delivered message for good (``XACK`` + ``XDEL``)."""
        shard, entry = self._parse(message.message_id, "ack")
        await self._store.run(
            ACK,
            shard.consumer_keys,
            [self.group, entry],
            f"acking outbox message {message.message_id!r}",
        )

    async def release(self, message: OutboxMessage, *, error: str = "") -> None:
        """Make a claimed message claimable again at once, or dead-letter it once it was
        delivered ``max_attempts`` times. ``error`` is kept for the dead letter."""
        shard, entry = self._parse(message.message_id, "release")
        await self._store.run(
            RELEASE_MESSAGE,
            shard.consumer_keys,
            [self.group, entry, error, self.max_attempts],
            f"releasing outbox message {message.message_id!r}",
        )

    async def dead_letters(self, limit: int = 100) -> list[OutboxMessage]:
        """Dead-lettered messages, oldest first."""
        if limit <= 0:
            return []
        shards = list(self._store.layout.all_shards())
        replies = await self._store.run_sharded(
            DEAD_LIST,
            [shard.consumer_keys for shard in shards],
            [int(limit)],
            "listing dead letters",
        )
        rows: list[tuple[tuple[int, int], OutboxMessage]] = []
        for call, reply in enumerate(replies):
            for position, dead_id, mid, payload, attempts, _error in reply:
                shard = shards[call + int(position) - 1]
                message_id = self._store.layout.message_id(shard.shard, mid)
                try:
                    intent = decode_intent(payload)
                except ValueError:
                    continue  # an undecodable entry stays listed nowhere but in Redis
                rows.append(
                    (_entry_order(dead_id), OutboxMessage(message_id, intent, int(attempts)))
                )
        rows.sort(key=lambda row: row[0])
        return [message for _, message in rows[:limit]]

    async def retry_dead_letter(self, message_id: str) -> None:
        """Put a dead letter back in the outbox with its attempts reset; ``KeyError`` if
        ``message_id`` is not a dead letter."""
        parsed = self._store.layout.parse_message_id(message_id)
        if parsed is None:
            raise KeyError(f"no dead letter with id {message_id!r}")
        shard, entry = parsed
        keys = self._store.layout.shard(shard)
        done = await self._store.run(
            RETRY_DEAD,
            keys.consumer_keys,
            [entry],
            f"retrying dead letter {message_id!r}",
        )
        if int(done) == 0:
            raise KeyError(f"no dead letter with id {message_id!r}")
