"""Queues (``backend.queues``, ``claim(queue=...)``): limits never exceeded by racing
claimers (the highest in-flight count sampled by an observer, not timed), partitions
that do not block each other, priority order, rate limits over a window, slots given
back when a claimer dies or its claim runs out, live limit changes, and messages of an
unserved queue kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import sys
import time
import uuid
from collections import Counter
from typing import Any, ClassVar

import pytest

from ...storage import Backend, HandoffStatus, OutboxMessage
from ...storage._model import Route
from ...storage._queue_admin import Queues, queues_of
from ...storage._queues import QueueLimits
from ...storage.dialect import BaseConsumer
from ._support import (
    Suite,
    make_intent,
    make_snapshot,
    new_thread_id,
    peer_of,
    require_transactional,
)

__all__ = ["QueueSuite"]


def _queue(label: str) -> str:
    return f"{label}-{uuid.uuid4().hex[:10]}"


async def _enqueue(backend: Backend[Any], route: Route, label: str = "q") -> str:
    """Enqueue one intent on ``route``; its thread id."""
    tid = new_thread_id(label)
    await backend.outbox.enqueue_intent(make_intent(tid, 1, route=route))
    return tid


def _consumer(backend: Backend[Any]) -> BaseConsumer:
    """The store's consumer, which claims from queues (a store with queues builds it
    on ``BaseConsumer``)."""
    consumer = backend.consumer
    assert isinstance(consumer, BaseConsumer), f"{type(consumer).__name__} keeps no queues"
    return consumer


def _threads(messages: list[OutboxMessage]) -> list[str]:
    return [m.intent.thread_id for m in messages]


class _Observer:
    """Counts the messages in flight as the claimers report them, and the most seen."""

    def __init__(self) -> None:
        self.now: Counter[str] = Counter()
        self.most: Counter[str] = Counter()
        self.done = 0

    def start(self, key: str) -> None:
        self.now[key] += 1
        self.most[key] = max(self.most[key], self.now[key])

    def stop(self, key: str) -> None:
        self.now[key] -= 1
        if key == "*":
            self.done += 1


_KILLED_CLAIMER = """
import asyncio, sys
import flowy

async def main() -> None:
    async with await flowy.connect(sys.argv[1]) as backend:
        got = await backend.consumer.claim(1, float(sys.argv[3]), queue=sys.argv[2])
        print(len(got), flush=True)
        await asyncio.sleep(3600)

asyncio.run(main())
"""


class QueueSuite(Suite):
    """Queues keep their limits across racing claimers and processes."""

    requires: ClassVar[tuple[str, ...]] = ("queues", "consumer")

    claimers: int = 8
    """Concurrent claimers (each its own backend over the store) in the race tests."""

    async def _race(
        self,
        backend: Backend[Any],
        queue: str,
        routes: list[Route],
        *,
        batch: int = 2,
    ) -> _Observer:
        """Enqueue one message per route, then let ``claimers`` peers take them until
        all are acked, each reporting what it holds to one observer: the whole queue as
        ``"*"``, each partition by its key."""
        for route in routes:
            await _enqueue(backend, route, "race")
        seen = _Observer()
        total = len(routes)

        async def claimer(peer: Backend[Any]) -> None:
            consumer = _consumer(peer)
            held = 0
            deadline = time.monotonic() + 60
            while seen.done < total and time.monotonic() < deadline:
                got = await consumer.claim(batch, self.long_ttl, queue=queue, held=held)
                if not got:
                    await asyncio.sleep(random.uniform(0.001, 0.01))
                    continue
                keys = [m.intent.route.partition_key or "-" for m in got]
                for key in keys:
                    seen.start("*")
                    seen.start(key)
                held += len(got)
                await asyncio.sleep(random.uniform(0.005, 0.03))
                for message, key in zip(got, keys, strict=True):
                    # The observer forgets the message before the store does.
                    seen.stop("*")
                    seen.stop(key)
                    await consumer.ack(message)
                    held -= 1

        async with contextlib.AsyncExitStack() as stack:
            opened = [
                await stack.enter_async_context(peer_of(backend)) for _ in range(self.claimers)
            ]
            await asyncio.gather(*(claimer(peer) for peer in opened))
        assert seen.done == total, f"only {seen.done} of {total} messages were processed"
        return seen

    async def test_racing_claimers_never_exceed_the_global_limit(
        self, flowy_backend: Backend[Any]
    ) -> None:
        queue = _queue("global")
        await queues_of(flowy_backend).configure(queue, global_concurrency=3)
        seen = await self._race(flowy_backend, queue, [Route(queue)] * 30)
        assert 1 <= seen.most["*"] <= 3, f"{seen.most['*']} messages were in flight at once"

    async def test_racing_claimers_never_exceed_a_partition_limit(
        self, flowy_backend: Backend[Any]
    ) -> None:
        queue = _queue("part")
        await queues_of(flowy_backend).configure(queue, partition_concurrency=1)
        routes = [Route(queue, f"customer-{i % 3}") for i in range(18)]
        seen = await self._race(flowy_backend, queue, routes)
        for key in ("customer-0", "customer-1", "customer-2"):
            assert seen.most[key] == 1, f"{seen.most[key]} runs of {key} were in flight at once"

    async def test_worker_concurrency_counts_what_the_caller_holds(
        self, flowy_backend: Backend[Any]
    ) -> None:
        queue = _queue("worker")
        for _ in range(5):
            await _enqueue(flowy_backend, Route(queue))
        await queues_of(flowy_backend).configure(queue, worker_concurrency=2)
        consumer = _consumer(flowy_backend)
        assert len(await consumer.claim(5, self.long_ttl, queue=queue)) == 2
        assert await consumer.claim(5, self.long_ttl, queue=queue, held=2) == []
        assert len(await consumer.claim(5, self.long_ttl, queue=queue, held=1)) == 1
        # Another worker (holding none) has its own two.
        async with peer_of(flowy_backend) as peer:
            assert len(await _consumer(peer).claim(5, self.long_ttl, queue=queue)) == 2

    async def test_a_full_partition_does_not_block_the_others(
        self, flowy_backend: Backend[Any]
    ) -> None:
        queue = _queue("iso")
        await queues_of(flowy_backend).configure(queue, partition_concurrency=1)
        a1 = await _enqueue(flowy_backend, Route(queue, "a"), "a1")
        a2 = await _enqueue(flowy_backend, Route(queue, "a"), "a2")
        a3 = await _enqueue(flowy_backend, Route(queue, "a"), "a3")
        b1 = await _enqueue(flowy_backend, Route(queue, "b"), "b1")
        free = await _enqueue(flowy_backend, Route(queue), "free")
        consumer = _consumer(flowy_backend)
        first = await consumer.claim(5, self.long_ttl, queue=queue)
        assert sorted(_threads(first)) == sorted([a1, b1, free])
        assert await consumer.claim(5, self.long_ttl, queue=queue) == []
        await consumer.ack(next(m for m in first if m.intent.thread_id == a1))
        assert _threads(await consumer.claim(5, self.long_ttl, queue=queue)) == [a2]
        assert a3  # still waiting behind a2

    async def test_lower_priority_numbers_go_first_then_fifo(
        self, flowy_backend: Backend[Any]
    ) -> None:
        queue = _queue("prio")
        order = [(5, "p5"), (1, "p1-first"), (3, "p3"), (1, "p1-second"), (0, "p0")]
        ids = {
            label: await _enqueue(flowy_backend, Route(queue, "", p), label) for p, label in order
        }
        consumer = _consumer(flowy_backend)
        taken: list[str] = []
        for _ in order:
            got = await consumer.claim(1, self.long_ttl, queue=queue)
            assert len(got) == 1
            taken.append(got[0].intent.thread_id)
        expected = ["p0", "p1-first", "p1-second", "p3", "p5"]
        assert taken == [ids[label] for label in expected]
        listed = await queues_of(flowy_backend).messages(queue)
        assert [m.intent.thread_id for m in listed if m.intent] == taken

    async def test_the_rate_limit_holds_over_the_window(self, flowy_backend: Backend[Any]) -> None:
        queue = _queue("rate")
        period, limit = 1.0, 3
        await queues_of(flowy_backend).configure(queue, rate_limit=limit, rate_period=period)
        for _ in range(12):
            await _enqueue(flowy_backend, Route(queue))
        consumer = _consumer(flowy_backend)
        # Each start happened while its claim was in flight: between the two stamps.
        before = time.monotonic()
        first = await consumer.claim(12, self.long_ttl, queue=queue)
        assert len(first) == limit
        starts = [(before, time.monotonic())] * len(first)
        for message in first:
            await consumer.ack(message)
        until = time.monotonic() + 2.6 * period
        while time.monotonic() < until:
            before = time.monotonic()
            got = await consumer.claim(12, self.long_ttl, queue=queue)
            starts += [(before, time.monotonic())] * len(got)
            for message in got:
                await consumer.ack(message)
            await asyncio.sleep(0.05)
        # Starts whose claims all ran within one period of each other, however long each
        # claim took, started within one period: no more than the limit of them.
        for i, (earliest, _) in enumerate(starts):
            inside = sum(1 for _, latest in starts[i:] if latest - earliest < period)
            assert inside <= limit, f"{inside} starts within {period}s: {starts!r}"
        assert len(starts) >= 2 * limit, f"only {len(starts)} starts in 2.6 rate periods"
        stats = {s.queue: s for s in await queues_of(flowy_backend).list()}
        assert 0 <= stats[queue].started <= limit

    async def test_a_partition_rate_limit_counts_each_partition(
        self, flowy_backend: Backend[Any]
    ) -> None:
        queue = _queue("prate")
        await queues_of(flowy_backend).configure(queue, partition_rate_limit=1, rate_period=60)
        for key in ("a", "a", "b", "b", ""):
            await _enqueue(flowy_backend, Route(queue, key))
        consumer = _consumer(flowy_backend)
        got = await consumer.claim(5, self.long_ttl, queue=queue)
        assert sorted(m.intent.route.partition_key for m in got) == ["", "a", "b"]
        for message in got:
            await consumer.ack(message)
        assert await consumer.claim(5, self.long_ttl, queue=queue) == []

    async def test_a_claim_that_runs_out_gives_its_slot_back(
        self, flowy_backend: Backend[Any]
    ) -> None:
        queue = _queue("expire")
        await queues_of(flowy_backend).configure(queue, global_concurrency=1)
        for _ in range(2):
            await _enqueue(flowy_backend, Route(queue))
        consumer = _consumer(flowy_backend)
        assert len(await consumer.claim(2, self.short_ttl, queue=queue)) == 1
        assert await consumer.claim(2, self.long_ttl, queue=queue) == []
        await self.expire()
        assert len(await consumer.claim(2, self.long_ttl, queue=queue)) == 1

    async def test_ack_and_release_give_slots_back_and_a_delay_holds_none(
        self, flowy_backend: Backend[Any]
    ) -> None:
        queue = _queue("slots")
        await queues_of(flowy_backend).configure(queue, global_concurrency=1)
        for _ in range(3):
            await _enqueue(flowy_backend, Route(queue))
        consumer = _consumer(flowy_backend)
        [one] = await consumer.claim(3, self.long_ttl, queue=queue)
        await consumer.release(one, error="try later", delay=self.long_ttl)
        [two] = await consumer.claim(3, self.long_ttl, queue=queue)
        assert two.message_id != one.message_id
        await consumer.ack(two)
        [three] = await consumer.claim(3, self.long_ttl, queue=queue)
        assert three.message_id not in (one.message_id, two.message_id)
        stats = {s.queue: s for s in await queues_of(flowy_backend).list()}[queue]
        assert (stats.in_flight, stats.pending) == (1, 1)
        assert stats.oldest_pending_at is not None

    async def test_a_killed_claimer_gives_its_slot_back(self, flowy_backend: Backend[Any]) -> None:
        if flowy_backend.url.startswith("memory:"):
            pytest.skip("a memory:// store lives in one process: no other process can claim")
        queue = _queue("killed")
        await queues_of(flowy_backend).configure(queue, global_concurrency=1)
        for _ in range(2):
            await _enqueue(flowy_backend, Route(queue))
        hide = 4.0
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _KILLED_CLAIMER,
            flowy_backend.url,
            queue,
            str(hide),
            stdout=asyncio.subprocess.PIPE,
            env=os.environ.copy(),
        )
        try:
            assert child.stdout is not None
            line = await asyncio.wait_for(child.stdout.readline(), 60)
            claimed_at = time.monotonic()
            assert line.strip() == b"1", f"the claimer printed {line!r}"
        finally:
            if child.returncode is None:
                child.send_signal(signal.SIGKILL)
            await child.wait()
        consumer = _consumer(flowy_backend)
        assert await consumer.claim(2, self.long_ttl, queue=queue) == []
        await asyncio.sleep(max(0.0, claimed_at + hide - time.monotonic()) + self.settle)
        assert len(await consumer.claim(2, self.long_ttl, queue=queue)) == 1

    async def test_a_limit_changed_live_takes_effect_on_the_next_claim(
        self, flowy_backend: Backend[Any]
    ) -> None:
        queue = _queue("live")
        for _ in range(4):
            await _enqueue(flowy_backend, Route(queue))
        await queues_of(flowy_backend).configure(queue, global_concurrency=0)
        consumer = _consumer(flowy_backend)
        assert await consumer.claim(4, self.long_ttl, queue=queue) == []
        async with peer_of(flowy_backend) as peer:
            limits = await queues_of(peer).configure(queue, global_concurrency=1)
            assert limits == QueueLimits(global_concurrency=1)
        assert len(await consumer.claim(4, self.long_ttl, queue=queue)) == 1
        assert await consumer.claim(4, self.long_ttl, queue=queue) == []
        await queues_of(flowy_backend).configure(queue, global_concurrency=3, rate_limit=10)
        assert len(await consumer.claim(4, self.long_ttl, queue=queue)) == 2
        assert await queues_of(flowy_backend).limits(queue) == QueueLimits(
            global_concurrency=3, rate_limit=10
        )
        await queues_of(flowy_backend).configure(queue, global_concurrency=None)
        assert await queues_of(flowy_backend).limits(queue) == QueueLimits(rate_limit=10)
        await queues_of(flowy_backend).reset(queue)
        assert await queues_of(flowy_backend).limits(queue) == QueueLimits()
        assert len(await consumer.claim(4, self.long_ttl, queue=queue)) == 1

    async def test_an_unserved_queue_keeps_its_messages(self, flowy_backend: Backend[Any]) -> None:
        queue = _queue("unserved")
        tid = await _enqueue(flowy_backend, Route(queue, "k", 7), "unserved")
        plain = await _enqueue(flowy_backend, Route(), "plain")
        consumer = _consumer(flowy_backend)
        for _ in range(5):  # more claims of the default queue than max_attempts
            got = await consumer.claim(10, self.short_ttl)
            assert _threads(got) in ([plain], [])
            for message in got:
                await consumer.release(message, error="again")
        stats = {s.queue: s for s in await queues_of(flowy_backend).list()}
        assert (stats[queue].pending, stats[queue].in_flight) == (1, 0)
        assert "default" in stats
        assert all(d.thread_id != tid for d in await consumer.dead_letters())
        [message] = await consumer.claim(10, self.long_ttl, queue=queue)
        assert message.intent.thread_id == tid
        assert message.intent.route == Route(queue, "k", 7)
        assert message.attempts == 1

    async def test_a_dead_letter_comes_back_to_its_queue(self, flowy_backend: Backend[Any]) -> None:
        queue = _queue("dead")
        tid = await _enqueue(flowy_backend, Route(queue, "p", 2))
        consumer = _consumer(flowy_backend)
        [message] = await consumer.claim(1, self.long_ttl, queue=queue)
        await consumer.release(message, error="boom", dead=True)
        await consumer.retry_dead_letter(message.message_id)
        assert _threads(await consumer.claim(5, self.long_ttl)) == []
        [back] = await consumer.claim(5, self.long_ttl, queue=queue)
        assert back.intent.thread_id == tid and back.intent.route == Route(queue, "p", 2)

    async def test_a_transactional_hand_off_keeps_its_route(
        self, flowy_backend: Backend[Any]
    ) -> None:
        tx = require_transactional(flowy_backend)
        queue = _queue("tx")
        tid = new_thread_id("tx-route")
        route = Route(queue, "customer-9", 4)

        async def enqueue(handle: object, revision: int) -> None:
            await tx.outbox.enqueue_intent_tx(handle, make_intent(tid, revision, route=route))

        snap = make_snapshot(tid, handoff_status=HandoffStatus.ENQUEUED)
        await tx.checkpointer.save_with_outbox(0, snap, enqueue)
        assert await _consumer(flowy_backend).claim(5, self.long_ttl) == []
        [message] = await _consumer(flowy_backend).claim(5, self.long_ttl, queue=queue)
        assert message.intent.route == route

    async def test_stats_and_messages_report_each_queue(self, flowy_backend: Backend[Any]) -> None:
        queue = _queue("stats")
        await queues_of(flowy_backend).configure(queue, rate_limit=100)
        before = time.time()
        ids = [await _enqueue(flowy_backend, Route(queue, "", p), f"s{p}") for p in (2, 1)]
        [taken] = await _consumer(flowy_backend).claim(1, self.long_ttl, queue=queue)
        assert taken.intent.thread_id == ids[1]
        stats = {s.queue: s for s in await queues_of(flowy_backend).list()}[queue]
        assert (stats.in_flight, stats.pending, stats.started) == (1, 1, 1)
        assert stats.limits == QueueLimits(rate_limit=100)
        assert stats.oldest_pending_at is not None
        assert abs(stats.oldest_pending_at - before) < self.clock_skew + 5
        listed = await queues_of(flowy_backend).messages(queue)
        assert [m.intent.thread_id for m in listed if m.intent] == [ids[1], ids[0]]
        assert [m.attempts for m in listed] == [1, 0]
        assert await queues_of(flowy_backend).messages(queue, 1) != []
        assert await queues_of(flowy_backend).messages(_queue("empty")) == []

    @pytest.mark.parametrize(
        ("changes", "error", "match"),
        [
            ({"global_concurrency": -1}, ValueError, "global_concurrency"),
            ({"rate_limit": 1.5}, TypeError, "rate_limit"),
            ({"worker_concurrency": True}, TypeError, "worker_concurrency"),
            ({"rate_period": 0}, ValueError, "rate_period"),
            ({"rate_period": float("nan")}, ValueError, "rate_period"),
            ({"burst": 3}, TypeError, "unknown queue limit"),
        ],
    )
    async def test_bad_limits_are_refused_and_nothing_changes(
        self,
        flowy_backend: Backend[Any],
        changes: dict[str, Any],
        error: type[Exception],
        match: str,
    ) -> None:
        queue = _queue("bad")
        await queues_of(flowy_backend).configure(queue, global_concurrency=2)
        with pytest.raises(error, match=match):
            await queues_of(flowy_backend).configure(queue, **changes)
        assert await queues_of(flowy_backend).limits(queue) == QueueLimits(global_concurrency=2)

    async def test_bad_queue_names_and_routes_are_refused(
        self, flowy_backend: Backend[Any]
    ) -> None:
        queues: Queues = queues_of(flowy_backend)
        for name in ("", "has space", "-lead", "x" * 65, "nul\x00"):
            with pytest.raises(ValueError, match="queue name"):
                await queues.configure(name, global_concurrency=1)
            with pytest.raises(ValueError, match="queue name"):
                await _consumer(flowy_backend).claim(1, self.long_ttl, queue=name)
        with pytest.raises(ValueError, match="priority"):
            Route("ok", "", -1)
        with pytest.raises(ValueError, match="partition_key"):
            Route("ok", "k" * 300)
        with pytest.raises(ValueError, match="held"):
            await _consumer(flowy_backend).claim(1, self.long_ttl, held=-1)
