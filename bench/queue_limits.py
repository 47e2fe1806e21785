"""Queue limits: what enforcing a queue's counted limits costs a claim, on PostgreSQL and
Redis (and, for information, the memory store).

Two arms, measured in the same process on the same backend (PostgreSQL: a pool of 16, as
the other rows; Redis standalone), in interleaved rounds (the order rotates each round;
one warm-up round dropped, then 5 by default), each round on fresh queue names:

- **unlimited**: a queue with no limits configured;
- **limited**: a queue like it with ``global_concurrency=64`` (4 consumers × batches of
  16: never fewer free slots than a batch), ``partition_concurrency=64`` (likewise per
  partition) and ``rate_limit=1,000,000`` per ``rate_period=1`` s (never reached). No
  limit ever binds, so the row measures the cost of enforcing counted limits (the
  store counts what is in flight and what started, and records each start, in the claim's
  atomic operation), not throttling.

Each arm: 4,000 intents enqueued (untimed) to its queue over 20 partition keys; then 4
consumer tasks claim batches of 16 from that queue and ack each message, timed until all
are consumed. A sample is the drain's time divided by the messages. The row: the median
time per claimed message with limits over without. Budget: ≤ 1.3× (throughput with
limits ≥ 1/1.3 of the throughput without). A consumer goes on until every message was
claimed; an empty claim (its peers held the rows it reached) is retried after 1 ms. Per
arm, the details count the claims that returned fewer than 16 messages (the last ones
of a drain may) and the empty claims; more of them in the limited arm would mean a limit
bound.

    uv run --frozen --all-packages python bench/queue_limits.py [--intents 4000]
        [--partitions 20] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

import _common as c
from outbox import TITLES as STORE_TITLES
from outbox import gather_bounded, intent, postgres, redis

import flowy
from flowy.queues import Route

CONSUMERS = 4
BATCH = 16
BUDGET = 1.3
LIMITS: dict[str, int | float] = {
    "global_concurrency": CONSUMERS * BATCH,
    "partition_concurrency": CONSUMERS * BATCH,
    "rate_limit": 1_000_000,
    "rate_period": 1.0,
}
TITLES = {**STORE_TITLES, "memory": "memory"}


class Arm:
    """One arm of the comparison: a variant of :func:`_common.interleave` that enqueues
    a backlog to a fresh queue (untimed), drains it with the consumers and returns the
    seconds per claimed message."""

    def __init__(
        self, backend: Any, name: str, limits: dict[str, int | float], args: argparse.Namespace
    ) -> None:
        self.backend, self.name, self.limits = backend, name, limits
        self.intents, self.partitions = args.intents, args.partitions
        self.cpu: list[float] = []
        self.claims = 0
        self.short = 0
        self.empty = 0

    async def __call__(self, r: int) -> float:
        queue = f"{self.name}-{r}"
        if self.limits:
            await self.backend.queues.configure(queue, **self.limits)
        base = f"bench-{queue}"
        outbox = self.backend.outbox

        def one(i: int) -> Any:
            route = Route(queue, f"p{i % self.partitions}")
            return outbox.enqueue_intent(dataclasses.replace(intent(f"{base}-{i}"), route=route))

        await gather_bounded([lambda i=i: one(i) for i in range(self.intents)], 32)
        consumer = self.backend.consumer
        done = claimed = claims = short = empty = 0

        async def drain() -> None:
            nonlocal done, claimed, claims, short, empty
            # Each batch is acked before the next claim: nothing is held at a claim. A
            # consumer goes on until every message was claimed: an empty claim (its
            # peers held the rows it reached) is counted and tried again.
            while claimed < self.intents:
                batch = await consumer.claim(BATCH, 60.0, queue=queue, held=0)
                if not batch:
                    empty += 1
                    await asyncio.sleep(0.001)
                    continue
                claims += 1
                claimed += len(batch)
                short += len(batch) < BATCH
                for message in batch:
                    await consumer.ack(message)
                    done += 1

        began, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(drain() for _ in range(CONSUMERS)))
        elapsed = time.perf_counter() - began
        assert done == self.intents, (self.name, done, self.intents)
        if r > 0:  # the warm-up round is dropped
            self.cpu.append((time.process_time() - cpu) / self.intents)
            self.claims += claims
            self.short += short
            self.empty += empty
        return elapsed / self.intents


def per_message(seconds: float) -> str:
    """Seconds per message, with the throughput it means."""
    return f"{c.us(seconds)} ({1 / seconds:,.0f}/s)"


@contextlib.asynccontextmanager
async def memory() -> AsyncGenerator[Callable[[], Any], None]:
    yield lambda: flowy.connect("memory://")


def row_id(key: str) -> str:
    return f"{key}.queue_limits"


def what(key: str) -> str:
    return (
        f"{TITLES[key]} queue limits on vs off: claim+ack time per message, "
        f"{CONSUMERS} consumer tasks, batches of {BATCH}"
    )


async def store_row(key: str, args: argparse.Namespace) -> c.Row:
    opener = {"postgres": postgres, "redis": redis, "memory": memory}[key]
    options: dict[str, Any] = {"pool_size": 16} if key == "postgres" else {}
    async with opener(**options) as open_backend, open_backend() as backend:
        if not backend.capabilities.queues:
            return c.skipped(row_id(key), what(key), "the store keeps no queues")
        free = Arm(backend, "free", {}, args)
        limited = Arm(backend, "limited", LIMITS, args)
        samples = await c.interleave({"unlimited": free, "limited": limited}, args.rounds, warmup=1)
    off, on = c.median(samples["unlimited"]), c.median(samples["limited"])
    title = TITLES[key]
    print(
        f"{title}: {args.intents:,} messages over {args.partitions} partitions, "
        f"{CONSUMERS} consumers, batches of {BATCH}, {len(samples['limited'])} rounds "
        f"(medians):",
        flush=True,
    )
    for name, arm, median in (("unlimited", free, off), ("limited", limited, on)):
        rates = ", ".join(f"{1 / s:,.0f}" for s in samples[name])
        print(
            f"   {name:>9}: {per_message(median)}, this process's CPU "
            f"{c.us(c.median(arm.cpu))}/message; claims returning < {BATCH}: "
            f"{arm.short} of {arm.claims}, empty claims retried: {arm.empty}; "
            f"per round: {rates} /s",
            flush=True,
        )
    print(f"   limits on / off: {on / off:.2f}× the time per message", flush=True)
    budget = BUDGET if key != "memory" else None
    values = {
        "unlimited_per_s": 1 / off,
        "limited_per_s": 1 / on,
        "rounds": float(len(samples["limited"])),
        "intents": float(args.intents),
        "cpu_unlimited": c.median(free.cpu),
        "cpu_limited": c.median(limited.cpu),
    }
    if budget is None:
        return c.info(row_id(key), what(key), on, off, per_message, **values)
    return c.at_most(row_id(key), what(key), on, off, budget, per_message, **values)


async def main(args: argparse.Namespace) -> list[c.Row]:
    rows: list[c.Row] = []
    stores: list[tuple[str, Callable[[], Any] | None]] = [
        ("memory", None),
        ("postgres", c.postgres_missing),
        ("redis", c.redis_missing),
    ]
    for key, missing in stores:
        if args.quick and key != "memory":
            rows.append(c.skipped(row_id(key), what(key), "--quick"))
            continue
        if missing is not None and (why := await missing()):
            print(f"{TITLES[key]}: skipped: {why}")
            rows.append(c.skipped(row_id(key), what(key), "no server"))
            continue
        try:
            rows.append(await store_row(key, args))
        except Exception as exc:  # noqa: BLE001 - one broken store must not hide the others
            print(f"{TITLES[key]}: failed: {exc!r}")
            rows.append(c.failed(row_id(key), what(key), exc))
    return rows


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--intents", type=int, default=4000, help="messages per arm and round")
    parser.add_argument("--partitions", type=int, default=20, help="partition keys")
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds (+1 warm-up)")


if __name__ == "__main__":
    arguments = c.arguments(__doc__ or "", _options)
    if arguments.quick:
        arguments.intents, arguments.rounds = min(arguments.intents, 320), 2
    c.report(asyncio.run(main(arguments)), arguments)
