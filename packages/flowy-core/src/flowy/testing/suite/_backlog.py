"""Backlog contract tests: the consumer's ``stats()`` (messages pending delivery, when the
oldest was enqueued, dead letters held) and the checkpointer's ``oldest_heads()`` (when
the oldest suspended and waiting heads were saved), which ``flowy.otel``'s gauges
report.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, ClassVar

import pytest

from ...storage import Backend, Outbox, OutboxMessage, OutboxStats, RunStatus
from ...storage.dialect import BaseCheckpointer, BaseConsumer
from ._support import (
    Suite,
    fixed_time,
    make_intent,
    make_snapshot,
    max_attempts_of,
    new_thread_id,
    require_consumer,
)

__all__ = ["BacklogSuite"]

GAP = 0.3
"""Seconds between two enqueues whose order the store's enqueue times must show."""


def _backlog(backend: Backend[Any]) -> tuple[Outbox, BaseConsumer]:
    outbox, consumer = require_consumer(backend)
    if not isinstance(consumer, BaseConsumer):
        pytest.skip(f"{type(consumer).__name__} is not a BaseConsumer: it reports no backlog")
    return outbox, consumer


def _checkpointer(backend: Backend[Any]) -> BaseCheckpointer[Any]:
    cp = backend.checkpointer
    if not isinstance(cp, BaseCheckpointer):
        pytest.skip(f"{type(cp).__name__} is not a BaseCheckpointer: it reports no backlog")
    return cp


async def _bury(consumer: BaseConsumer, message: OutboxMessage, long_ttl: float) -> None:
    """Deliver ``message`` (claimed once already) until the consumer dead-letters it."""
    for _ in range(max_attempts_of(consumer) - message.attempts):
        await consumer.release(message, error="boom")
        [message] = await consumer.claim(10, long_ttl)
    await consumer.release(message, error="boom")


class BacklogSuite(Suite):
    """``stats()`` and ``oldest_heads()``: what is waiting in the store, and since when."""

    requires: ClassVar[tuple[str, ...]] = ("backlog",)

    async def test_an_empty_store_has_no_backlog(self, flowy_backend: Backend[Any]) -> None:
        _, consumer = _backlog(flowy_backend)
        assert await consumer.stats() == OutboxStats(0, None, 0)
        assert await _checkpointer(flowy_backend).oldest_heads() == {}

    async def test_pending_counts_live_messages_claimed_or_not(
        self, flowy_backend: Backend[Any]
    ) -> None:
        outbox, consumer = _backlog(flowy_backend)
        for index in range(3):
            await outbox.enqueue_intent(make_intent(new_thread_id(f"pending-{index}"), 1))
        assert (await consumer.stats()).pending == 3
        first, second = await consumer.claim(2, self.long_ttl)
        assert (await consumer.stats()).pending == 3  # in flight is still pending
        await consumer.ack(first)
        assert (await consumer.stats()).pending == 2
        await consumer.release(second, error="later", delay=self.long_ttl)
        assert (await consumer.stats()).pending == 2  # hidden for a while, still pending
        [third] = await consumer.claim(10, self.long_ttl)
        await _bury(consumer, third, self.long_ttl)
        stats = await consumer.stats()
        assert (stats.pending, stats.dead_letters) == (1, 1)
        assert stats.oldest_pending_at is not None

    async def test_oldest_pending_is_the_first_enqueued_and_not_acked(
        self, flowy_backend: Backend[Any]
    ) -> None:
        outbox, consumer = _backlog(flowy_backend)
        first, second = make_intent(new_thread_id("first"), 1), make_intent(new_thread_id("2nd"), 1)
        before = time.time()
        await outbox.enqueue_intent(first)
        between = time.time()
        await asyncio.sleep(GAP)
        await outbox.enqueue_intent(second)
        after = time.time()
        enqueued = await consumer.stats()
        assert enqueued.pending == 2
        oldest = enqueued.oldest_pending_at
        assert oldest is not None
        assert before - self.clock_skew <= oldest <= between + self.clock_skew
        claimed = {m.intent.thread_id: m for m in await consumer.claim(10, self.long_ttl)}
        assert (await consumer.stats()).oldest_pending_at == oldest  # claims change nothing
        await consumer.ack(claimed[first.thread_id])
        left = await consumer.stats()
        assert left.pending == 1 and left.oldest_pending_at is not None
        assert left.oldest_pending_at - oldest >= GAP / 2, (oldest, left)
        assert between - self.clock_skew <= left.oldest_pending_at <= after + self.clock_skew
        await consumer.ack(claimed[second.thread_id])
        assert await consumer.stats() == OutboxStats(0, None, 0)

    async def test_dead_letters_are_counted_until_retried(
        self, flowy_backend: Backend[Any]
    ) -> None:
        outbox, consumer = _backlog(flowy_backend)
        await outbox.enqueue_intent(make_intent(new_thread_id("dead"), 1))
        enqueued = await consumer.stats()
        assert enqueued.oldest_pending_at is not None
        [message] = await consumer.claim(10, self.long_ttl)
        await _bury(consumer, message, self.long_ttl)
        assert await consumer.stats() == OutboxStats(0, None, 1)
        [dead] = await consumer.dead_letters()
        await asyncio.sleep(GAP)
        retried_at = time.time()
        await consumer.retry_dead_letter(dead.message_id)
        back = await consumer.stats()
        assert (back.pending, back.dead_letters) == (1, 0)
        # A dead letter put back counts as enqueued when it came back.
        assert back.oldest_pending_at is not None
        assert back.oldest_pending_at - enqueued.oldest_pending_at >= GAP / 2, (enqueued, back)
        assert back.oldest_pending_at >= retried_at - self.clock_skew

    async def test_a_dead_letter_enqueued_again_is_pending_again(
        self, flowy_backend: Backend[Any]
    ) -> None:
        outbox, consumer = _backlog(flowy_backend)
        intent = make_intent(new_thread_id("again"), 1)
        await outbox.enqueue_intent(intent)
        [message] = await consumer.claim(10, self.long_ttl)
        await _bury(consumer, message, self.long_ttl)
        assert await consumer.stats() == OutboxStats(0, None, 1)
        await outbox.enqueue_intent(intent)
        stats = await consumer.stats()
        assert (stats.pending, stats.dead_letters) == (1, 0)

    async def test_oldest_heads_per_status(self, flowy_backend: Backend[Any]) -> None:
        cp = _checkpointer(flowy_backend)
        heads = [
            (RunStatus.SUSPENDED, 30.0),
            (RunStatus.SUSPENDED, 10.0),
            (RunStatus.SUSPENDED, 20.0),
            (RunStatus.WAITING, 50.0),
            (RunStatus.WAITING, 5.0),
            (RunStatus.RUNNING, 1.0),  # older, but not parked
            (RunStatus.HANDOFF, 2.0),
            (RunStatus.COMPLETED, 0.0),
            (RunStatus.FAILED, 3.0),
        ]
        for index, (status, offset) in enumerate(heads):
            tid = new_thread_id(f"{status.value}-{index}")
            await cp.save(0, make_snapshot(tid, status=status, updated_at=fixed_time + offset))
        suspended, waiting = RunStatus.SUSPENDED, RunStatus.WAITING
        oldest = {suspended: fixed_time + 10, waiting: fixed_time + 5}
        assert await cp.oldest_heads() == oldest
        assert await cp.oldest_heads([waiting]) == {waiting: fixed_time + 5}
        assert await cp.oldest_heads({suspended}) == {suspended: fixed_time + 10}
        assert await cp.oldest_heads([]) == {}
        with pytest.raises(ValueError, match="suspended and waiting"):
            await cp.oldest_heads([RunStatus.RUNNING])
        with pytest.raises(TypeError, match="single status"):
            await cp.oldest_heads(waiting)  # pyright: ignore[reportArgumentType]

    async def test_oldest_heads_follow_threads_that_move_on_or_go(
        self, flowy_backend: Backend[Any]
    ) -> None:
        cp = _checkpointer(flowy_backend)
        suspended, waiting = RunStatus.SUSPENDED, RunStatus.WAITING
        ids: dict[str, str] = {}
        for name, status, offset in (
            ("a", suspended, 10.0),
            ("b", suspended, 20.0),
            ("c", suspended, 30.0),
            ("w", waiting, 5.0),
            ("x", waiting, 50.0),
        ):
            ids[name] = new_thread_id(f"moves-{name}")
            snap = make_snapshot(ids[name], status=status, updated_at=fixed_time + offset)
            await cp.save(0, snap)
        assert await cp.oldest_heads() == {suspended: fixed_time + 10, waiting: fixed_time + 5}
        # The oldest suspended run is resumed: the next one is the oldest now.
        await cp.save(1, make_snapshot(ids["a"], updated_at=fixed_time + 60))
        assert (await cp.oldest_heads())[suspended] == fixed_time + 20
        # Suspended again later: it counts from its new save.
        await cp.save(1, make_snapshot(ids["b"], status=suspended, updated_at=fixed_time + 70))
        assert (await cp.oldest_heads())[suspended] == fixed_time + 30
        await cp.delete(ids["w"])
        assert await cp.oldest_heads() == {suspended: fixed_time + 30, waiting: fixed_time + 50}
        for name, revision in (("b", 2), ("c", 1)):
            done = make_snapshot(ids[name], status=RunStatus.COMPLETED, updated_at=fixed_time + 80)
            await cp.save(revision, done)
        assert await cp.oldest_heads() == {waiting: fixed_time + 50}
