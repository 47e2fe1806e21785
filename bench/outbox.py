"""Outbox: hand-offs consumed per second by 4 workers on PostgreSQL and Redis, and the
latency from an enqueue's commit to its claim.

Workers are asyncio tasks in this one process, sharing one backend (PostgreSQL: a pool
of 16). The backlog is enqueued first (untimed); then the clock runs until the 4 workers
have consumed all of it:

- **Worker resumes**: threads were started that hand off at once (``work`` →
  ``handoff`` → ``finish``); 4 ``flowy.Worker`` (concurrency 4 each) claim the messages,
  resume each thread's one-node continuation (evaluate, lease, load, save, release),
  and ack. This is what "consumed" means for an application: the budget's row.
- **claim + ack**: intents enqueued straight into the outbox; 4 consumer tasks claim
  batches of 16 and ack each message. No run is resumed, so this is an upper bound of
  the rate (a lower bound of the cost).

Budget: ≥ 5,000 hand-offs/s consumed by 4 workers. Then, on PostgreSQL with
LISTEN/NOTIFY (the default of ``flowy.connect``), one consumer waits in ``claim`` while
another backend enqueues one intent at a time: the latency from the enqueue to the
claim's return, timed from the enqueue's call (an upper bound of commit → claim: the
commit happens inside the call). Budget: p50 ≤ 10 ms. The same is shown for
Redis (a blocking stream read) and for PostgreSQL without LISTEN (polling every 0.1 s)
for information.

    uv run --frozen --all-packages python bench/outbox.py [--handoffs 1500] [--intents 4000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import _common as c

import flowy
from flowy.storage import HandoffIntent, HandoffStatus, ResumeToken

WORKERS = 4
TARGET = 5_000.0
LATENCY_BUDGET = 0.010


def intent(thread_id: str) -> HandoffIntent:
    return HandoffIntent(
        thread_id, 2, 2, 2, ResumeToken(thread_id, 2), HandoffStatus.ENQUEUED, "bench", "finish"
    )


def handoff_graph() -> flowy.Graph[dict[str, Any], Any]:
    async def work(state: dict[str, Any]) -> tuple[dict[str, Any], flowy.Directive[Any]]:
        return {**state, "worked": True}, flowy.handoff("bench", resume_at="finish")

    async def finish(state: dict[str, Any]) -> tuple[dict[str, Any], flowy.Directive[Any]]:
        return {**state, "finished": True}, flowy.end()

    b = flowy.GraphBuilder[dict[str, Any], Any]()
    b.add_node("work", work).add_node("finish", finish).add_edge("work", "finish")
    b.allow_no_outgoing_route("finish")
    return b.compile()


async def gather_bounded(calls: list[Callable[[], Any]], parallel: int) -> None:
    sem = asyncio.Semaphore(parallel)

    async def one(call: Callable[[], Any]) -> None:
        async with sem:
            await call()

    await asyncio.gather(*(one(call) for call in calls))


async def claim_ack(backend: Any, intents: int) -> float:
    """Hand-offs per second of 4 consumer tasks doing claim + ack (backlog first)."""
    base = f"bench-{uuid.uuid4().hex[:8]}"
    outbox = backend.outbox
    await gather_bounded(
        [lambda i=i: outbox.enqueue_intent(intent(f"{base}-{i}")) for i in range(intents)], 32
    )
    consumer = backend.consumer
    done = 0

    async def drain() -> None:
        nonlocal done
        while batch := await consumer.claim(16, 60.0):
            for message in batch:
                await consumer.ack(message)
            done += len(batch)

    began, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(drain() for _ in range(WORKERS)))
    elapsed = time.perf_counter() - began
    assert done == intents, (done, intents)
    print(f"   claim+ack: this process's CPU {c.us((time.process_time() - cpu) / intents)}/message")
    return intents / elapsed


@contextlib.contextmanager
def statement_census() -> Any:
    """Counts and times every statement asyncpg runs (by its first words) while open;
    yields the dict it fills. Nothing is counted if asyncpg's internals differ."""
    counts: dict[str, list[float]] = {}
    try:
        from asyncpg.connection import Connection

        original = Connection._execute
    except (ImportError, AttributeError):
        yield counts
        return

    async def execute(self: Any, query: str, *args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return await original(self, query, *args, **kwargs)
        finally:
            words = " ".join(query.split()[:6])
            counts.setdefault(words, []).append(time.perf_counter() - began)

    Connection._execute = execute
    try:
        yield counts
    finally:
        Connection._execute = original


async def worker_resumes(backend: Any, handoffs: int) -> tuple[float, dict[str, int]]:
    """Hand-offs per second of 4 Workers resuming a one-node continuation."""
    runner = flowy.Runner(handoff_graph(), backend)
    base = f"bench-{uuid.uuid4().hex[:8]}"

    async def start(i: int) -> None:
        result = await runner.start(f"{base}-{i}", {"n": i})
        assert result.status is flowy.RunStatus.HANDOFF, result

    await gather_bounded([lambda i=i: start(i) for i in range(handoffs)], 32)
    finished = 0
    all_done = asyncio.Event()

    def on_result(_: Any, result: flowy.RunResult[Any, Any]) -> None:
        nonlocal finished
        assert result.status is flowy.RunStatus.COMPLETED, result
        finished += 1
        if finished == handoffs:
            all_done.set()

    workers = [
        flowy.Worker(runner, concurrency=4, poll_interval=0.05, on_result=on_result, owner=f"w{i}")
        for i in range(WORKERS)
    ]
    with statement_census() as census:
        began, cpu = time.perf_counter(), time.process_time()
        tasks = [asyncio.ensure_future(w.run()) for w in workers]
        await all_done.wait()
        elapsed, cpu = time.perf_counter() - began, time.process_time() - cpu
        for w in workers:
            w.stop()
        await asyncio.gather(*tasks)
    print(
        f"   Worker resumes: this process's CPU {c.us(cpu / handoffs)}/hand-off "
        f"({cpu / elapsed:.0%} of one core)"
    )
    if census:
        print("   statements per hand-off (median time each, as the client saw it):")
        for words, times in sorted(census.items(), key=lambda kv: -len(kv[1])):
            print(f"     {len(times) / handoffs:5.2f} x {c.ms(c.median(times)):>9}  {words[:70]}")
    outcomes: dict[str, int] = {}
    for w in workers:
        for k, v in w.stats.outcomes.items():
            outcomes[k] = outcomes.get(k, 0) + v
    return handoffs / elapsed, outcomes


async def latency(
    producer: Any, consumer_backend: Any, samples: int
) -> tuple[list[float], list[float]]:
    """One enqueue at a time, claimed by a consumer waiting in ``claim``: seconds from
    the enqueue's call to the claim's return (an upper bound of commit → claim: the
    commit happens inside the call), and from the call's return to the claim's return
    (about commit → claim; slightly negative when the claim returns first)."""
    consumer = consumer_backend.consumer
    base = f"bench-{uuid.uuid4().hex[:8]}"
    claimed: dict[str, float] = {}
    arrived = asyncio.Event()

    async def consume() -> None:
        while len(claimed) < samples:
            got = await consumer.claim(1, 60.0, wait=5.0)
            now = time.perf_counter()
            for message in got:
                claimed[message.intent.thread_id] = now
                await consumer.ack(message)
                arrived.set()

    task = asyncio.ensure_future(consume())
    await asyncio.sleep(0.3)  # the consumer is waiting (and listening) before the first
    from_call: list[float] = []
    from_return: list[float] = []
    for i in range(samples):
        tid = f"{base}-{i}"
        arrived.clear()
        called = time.perf_counter()
        await producer.outbox.enqueue_intent(intent(tid))
        returned = time.perf_counter()
        while tid not in claimed:
            await asyncio.wait_for(arrived.wait(), 10)
            arrived.clear()
        from_call.append(claimed[tid] - called)
        from_return.append(claimed[tid] - returned)
        await asyncio.sleep(0.01)  # let the consumer go back to waiting
    await task
    return from_call, from_return


@contextlib.asynccontextmanager
async def postgres(**options: Any) -> AsyncIterator[Callable[[], Any]]:
    """Yields an opener of backends on one fresh schema (dropped at the end)."""
    import asyncpg

    schema = f"bench_{uuid.uuid4().hex[:8]}"
    url = c.with_query(c.postgres_dsn(), schema=schema, **options)
    try:
        yield lambda: flowy.connect(url)
    finally:
        driver: Any = asyncpg
        conn = await driver.connect(c.postgres_dsn())
        await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await conn.close()


@contextlib.asynccontextmanager
async def redis(**options: Any) -> AsyncIterator[Callable[[], Any]]:
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    url = c.with_query(c.redis_url(), namespace=namespace, **options)
    try:
        yield lambda: flowy.connect(url)
    finally:
        async with flowy.connect(url) as backend:
            await backend.purge()


def latency_row(
    key: str, what: str, measured: tuple[list[float], list[float]], budget: bool
) -> c.Row:
    lat, after = measured
    p50, p99 = c.median(lat), c.quantile(lat, 0.99)
    values = {"flowy": p50, "p99": p99, "samples": float(len(lat)), "from_return": c.median(after)}
    cell = f"p50 {p50 * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms"
    if not budget:
        return c.Row(key, what, cell, "", None, "—", "info", values)
    verdict = "within" if p50 <= LATENCY_BUDGET else "over"
    return c.Row(key, what, cell, "", None, "p50 ≤ 10 ms", verdict, values)


async def store_rows(key: str, title: str, args: argparse.Namespace) -> list[c.Row]:
    opener = postgres if key == "postgres" else redis
    options: dict[str, Any] = {"pool_size": 16} if key == "postgres" else {}
    rows: list[c.Row] = []
    async with opener(**options) as open_backend, open_backend() as backend:
        resumed, outcomes = await worker_resumes(backend, args.handoffs)
        acked = await claim_ack(backend, args.intents)
    print(
        f"{title}: {WORKERS} Workers (asyncio tasks, concurrency 4 each) resumed "
        f"{args.handoffs:,} hand-offs at {resumed:,.0f}/s (outcomes {outcomes}); "
        f"{WORKERS} consumer tasks claimed + acked {args.intents:,} at {acked:,.0f}/s",
        flush=True,
    )
    rows.append(
        c.Row(
            f"{key}.outbox_worker",
            f"{title} outbox: hand-offs/s resumed by {WORKERS} Workers (vs claim+ack alone)",
            c.per_s(resumed),
            f"claim+ack {c.per_s(acked)}",
            resumed / acked,
            f"≥ {TARGET:,.0f}/s",
            "within" if resumed >= TARGET else "over",
            {"flowy": resumed, "baseline": acked, "handoffs": float(args.handoffs)},
        )
    )
    rows.append(
        c.Row(
            f"{key}.outbox_claim_ack",
            f"{title} outbox: claim+ack/s by {WORKERS} consumer tasks (upper bound)",
            c.per_s(acked),
            "",
            None,
            f"≥ {TARGET:,.0f}/s",
            "within" if acked >= TARGET else "over",
            {"flowy": acked, "intents": float(args.intents)},
        )
    )
    async with opener(**options) as open_backend:
        async with open_backend() as producer, open_backend() as consumer:
            lat = await latency(producer, consumer, args.samples)
        listening = key == "postgres"
        label = "LISTEN/NOTIFY" if listening else "blocking stream read"
        print(
            f"{title}: enqueue -> claim ({label}), {len(lat[0])} one at a time: from the "
            f"enqueue call p50 {c.ms(c.median(lat[0]))}, p99 {c.ms(c.quantile(lat[0], 0.99))}; "
            f"from its return p50 {c.ms(c.median(lat[1]))}",
            flush=True,
        )
        rows.append(
            latency_row(
                f"{key}.handoff_latency",
                f"{title} hand-off latency, enqueue (commit) → claim ({label})",
                lat,
                budget=listening,
            )
        )
    if key == "postgres":
        async with (
            postgres(listen="false") as open_backend,
            open_backend() as producer,
            open_backend() as consumer,
        ):
            polled = await latency(producer, consumer, max(args.samples // 4, 10))
        print(
            f"{title}: the same without LISTEN (polling every 0.1 s): p50 "
            f"{c.ms(c.median(polled[0]))}, p99 {c.ms(c.quantile(polled[0], 0.99))}"
        )
        rows.append(
            latency_row(
                "postgres.handoff_latency_poll",
                "PostgreSQL hand-off latency without LISTEN (polls every 0.1 s)",
                polled,
                budget=False,
            )
        )
    return rows


TITLES = {"postgres": "PostgreSQL", "redis": "Redis"}


def placeholders(key: str, verdict: Callable[[str, str], c.Row]) -> list[c.Row]:
    title = TITLES[key]
    rows = [
        verdict(f"{key}.outbox_worker", f"{title} outbox: hand-offs/s resumed by Workers"),
        verdict(f"{key}.outbox_claim_ack", f"{title} outbox: claim+ack/s"),
        verdict(f"{key}.handoff_latency", f"{title} hand-off latency, enqueue → claim"),
    ]
    if key == "postgres":
        rows.append(verdict("postgres.handoff_latency_poll", "PostgreSQL latency, polling"))
    return rows


async def main(args: argparse.Namespace) -> list[c.Row]:
    # Hand-offs claimed while the start that enqueued them is still returning are given
    # back ("thread busy") and retried; their warnings would flood the output.
    logging.getLogger("flowy.worker").setLevel(logging.ERROR)
    rows: list[c.Row] = []
    for key, missing in (("postgres", c.postgres_missing), ("redis", c.redis_missing)):
        if args.quick:
            rows += placeholders(key, lambda i, w: c.skipped(i, w, "--quick"))
            continue
        if why := await missing():
            print(f"{TITLES[key]}: skipped: {why}")
            rows += placeholders(key, lambda i, w: c.skipped(i, w, "no server"))
            continue
        try:
            rows += await store_rows(key, TITLES[key], args)
        except Exception as exc:  # noqa: BLE001 - one broken store must not hide the other
            print(f"{TITLES[key]}: failed: {exc!r}")
            rows += placeholders(key, lambda i, w, e=exc: c.failed(i, w, e))
    return rows


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--handoffs", type=int, default=1500, help="for the Worker figure")
    parser.add_argument("--intents", type=int, default=4000, help="for claim+ack")
    parser.add_argument("--samples", type=int, default=200, help="latency samples")


if __name__ == "__main__":
    arguments = c.arguments(__doc__ or "", _options)
    c.report(asyncio.run(main(arguments)), arguments)
