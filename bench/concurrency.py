"""64 threads at once: aggregate durable steps per second of 64 concurrent tasks, each
running the 10-node chain (a save after every step, ~1 KiB state) on fresh threads, on
PostgreSQL (a pool of 16 connections) and on Redis (16 connections), against the raw
driver doing the same node calls and one conditional write per step with the same
concurrency and pool size.

Phases of a few seconds alternate (flowy, flowy with a fenced run lease, raw; the order
rotates each round); a phase's figure is the steps of the runs its 64 tasks completed
divided by its time (a task finishes the run it is in). The step latency of one step is
the time from a node's call to the next node's call (or the run's end), so it holds the
save: p50 and p99 over all steps of all phases.

Budget (DESIGN §6): flowy ≥ 0.8× the raw driver's steps/s (without the run lease; the
leased figure is shown for information).

Pools: flowy's own (``pool_size=16``; for Redis a client on a blocking pool of 16);
the raw PostgreSQL pool is ``asyncpg.create_pool(max_size=16)`` with the same setting
flowy's pools use (no reset query when a connection goes back: it would cost a round
trip per write), the raw Redis client a blocking pool of 16.

    uv run --frozen --all-packages python bench/concurrency.py [--tasks 64] [--seconds 2.5]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import _common as c

import flowy
from flowy.storage import as_backend

POOL = 16

Write = Callable[[str], Callable[[int], Awaitable[None]]]


class Phases:
    """Runs phases of ``tasks`` concurrent tasks and keeps their figures."""

    def __init__(self, tasks: int, seconds: float) -> None:
        self.tasks, self.seconds = tasks, seconds
        self.rates: dict[str, list[float]] = {}
        self.latencies: dict[str, list[float]] = {}
        self.cpu: dict[str, list[float]] = {}

    async def phase(
        self, name: str, run: Callable[[str], Awaitable[None]], seconds: float, keep: bool
    ) -> None:
        base = f"bench-{uuid.uuid4().hex[:8]}"
        deadline = time.perf_counter() + seconds
        steps = 0
        gaps: list[float] = []

        async def task(t: int) -> None:
            nonlocal steps
            n = 0
            while time.perf_counter() < deadline:
                stamps: list[float] = []
                token = c.STAMPS.set(stamps)
                try:
                    await run(f"{base}-{t}-{n}")
                finally:
                    c.STAMPS.reset(token)
                stamps.append(time.perf_counter())
                gaps.extend(b - a for a, b in itertools.pairwise(stamps))
                steps += c.STEPS
                n += 1

        began, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(task(t) for t in range(self.tasks)))
        elapsed = time.perf_counter() - began
        if keep:
            self.cpu.setdefault(name, []).append((time.process_time() - cpu) / steps)
            self.rates.setdefault(name, []).append(steps / elapsed)
            self.latencies.setdefault(name, []).extend(gaps)

    async def rounds(self, variants: dict[str, Callable[[str], Awaitable[None]]], n: int) -> None:
        names = list(variants)
        for name in names:  # warm-up: connections, prepared statements, scripts
            await self.phase(name, variants[name], 1.0, keep=False)
        for r in range(n):
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:
                await self.phase(name, variants[name], self.seconds, keep=True)


def flowy_runs(backend: Any) -> dict[str, Callable[[str], Awaitable[None]]]:
    graph = c.chain_graph()
    bare = flowy.Runner(graph, as_backend(backend.checkpointer))
    leased = flowy.Runner(graph, backend)

    async def start(runner: flowy.Runner[c.State, Any], tid: str) -> None:
        result = await runner.start(tid, c.initial_state())
        assert result.status is flowy.RunStatus.COMPLETED, result

    return {
        "flowy": lambda tid: start(bare, tid),
        "flowy+lease": lambda tid: start(leased, tid),
    }


def rows_for(key: str, title: str, phases: Phases) -> list[c.Row]:
    rate = {k: c.median(v) for k, v in phases.rates.items()}
    lat = phases.latencies
    p50 = {k: c.median(v) for k, v in lat.items()}
    p99 = {k: c.quantile(v, 0.99) for k, v in lat.items()}
    rounds = len(phases.rates["flowy"])
    print(
        f"{title}: {phases.tasks} tasks, pool {POOL}, {rounds} rounds of "
        f"{phases.seconds:g} s phases (medians of phases):"
    )
    cpu = {k: c.median(v) for k, v in phases.cpu.items()}
    for k in ("flowy", "flowy+lease", "raw"):
        print(
            f"   {k:<12} {rate[k]:8,.0f} steps/s   step latency p50 {p50[k] * 1e3:6.2f} ms"
            f"   p99 {p99[k] * 1e3:6.2f} ms   this process's CPU {cpu[k] * 1e6:5.0f} µs/step"
        )
    what = f"{title}: {phases.tasks} threads at once, pool {POOL}: durable steps/s"
    tasks = float(phases.tasks)
    latency = c.Row(
        f"{key}.concurrency_latency",
        f"{title}: {phases.tasks} threads at once: step latency p50 / p99",
        f"{p50['flowy'] * 1e3:.1f} / {p99['flowy'] * 1e3:.1f} ms",
        f"{p50['raw'] * 1e3:.1f} / {p99['raw'] * 1e3:.1f} ms",
        p50["flowy"] / p50["raw"],
        "—",
        "info",
        {
            "flowy_p50": p50["flowy"],
            "flowy_p99": p99["flowy"],
            "baseline_p50": p50["raw"],
            "baseline_p99": p99["raw"],
            "lease_p50": p50["flowy+lease"],
            "lease_p99": p99["flowy+lease"],
        },
    )
    return [
        c.at_least(
            f"{key}.concurrency",
            what,
            rate["flowy"],
            rate["raw"],
            0.8,
            tasks=tasks,
            flowy_cpu=cpu["flowy"],
            baseline_cpu=cpu["raw"],
        ),
        c.info(
            f"{key}.concurrency_lease",
            f"{title}: {phases.tasks} threads at once, fenced run leases: steps/s",
            rate["flowy+lease"],
            rate["raw"],
            fmt=c.per_s,
            tasks=tasks,
        ),
        latency,
    ]


async def bench_postgres(args: argparse.Namespace) -> list[c.Row]:
    import asyncpg

    dsn = c.postgres_dsn()
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    driver: Any = asyncpg

    async def keep_session(_: object) -> None:
        """No reset query when a connection goes back (as flowy's pools)."""

    pool = await driver.create_pool(dsn, min_size=POOL, max_size=POOL, reset=keep_session)
    try:
        await pool.execute(f"CREATE SCHEMA {schema}")
        await pool.execute(
            f"CREATE TABLE {schema}.raw_head (id text PRIMARY KEY, rev bigint NOT NULL, "
            "body bytea NOT NULL)"
        )
        record = await c.sample_record()
        create = f"INSERT INTO {schema}.raw_head VALUES ($1, 1, $2) ON CONFLICT (id) DO NOTHING"
        update = f"UPDATE {schema}.raw_head SET rev = rev + 1, body = $2 WHERE id = $1 AND rev = $3"

        def raw(tid: str) -> Callable[[int], Awaitable[None]]:
            async def write(rev: int) -> None:
                async with pool.acquire() as conn:
                    if rev == 0:
                        assert await conn.execute(create, tid, record) == "INSERT 0 1"
                    else:
                        assert await conn.execute(update, tid, record, rev) == "UPDATE 1"

            return write

        url = c.with_query(dsn, schema=schema, listen="false", pool_size=POOL)
        async with flowy.connect(url) as backend:
            phases = Phases(args.tasks, args.seconds)
            runs = flowy_runs(backend)
            runs["raw"] = lambda tid: c.raw_chain(raw(tid))
            await phases.rounds(runs, args.rounds)
        return rows_for("postgres", "PostgreSQL", phases)
    finally:
        await pool.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await pool.close()


CAS = """
local rev = tonumber(redis.call('HGET', KEYS[1], 'rev') or '0')
if rev ~= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'rev', rev + 1, 'body', ARGV[2])
return 1
"""


async def bench_redis(args: argparse.Namespace) -> list[c.Row]:
    from redis.asyncio import BlockingConnectionPool, Redis

    from flowy_redis import RedisBackend

    url = c.redis_url()
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    prefix = f"{namespace}-raw"

    def client() -> Any:
        return Redis(connection_pool=BlockingConnectionPool.from_url(url, max_connections=POOL))

    raw_client = client()
    record = await c.sample_record()
    sha = await raw_client.script_load(CAS)

    def raw(tid: str) -> Callable[[int], Awaitable[None]]:
        key = f"{prefix}:{{{tid}}}"

        async def write(rev: int) -> None:
            assert await raw_client.evalsha(sha, 1, key, rev, record) == 1

        return write

    # A client of our own: redis-py's default pool raises past max_connections
    # instead of waiting, so flowy.connect's ?max_connections= would not do here.
    backend = RedisBackend[Any].from_client(client(), namespace=namespace, owns_client=True)
    try:
        async with backend:
            phases = Phases(args.tasks, args.seconds)
            runs = flowy_runs(backend)
            runs["raw"] = lambda tid: c.raw_chain(raw(tid))
            await phases.rounds(runs, args.rounds)
            await backend.purge()
        return rows_for("redis", "Redis", phases)
    finally:
        async for key in raw_client.scan_iter(match=f"{prefix}:*", count=1000):
            await raw_client.unlink(key)
        await raw_client.aclose()


TITLES = {"postgres": "PostgreSQL", "redis": "Redis"}


def placeholders(key: str, verdict: Callable[[str, str], c.Row]) -> list[c.Row]:
    title = TITLES[key]
    return [
        verdict(f"{key}.concurrency", f"{title}: threads at once: durable steps/s"),
        verdict(f"{key}.concurrency_lease", f"{title}: threads at once, leased: steps/s"),
        verdict(f"{key}.concurrency_latency", f"{title}: threads at once: step latency"),
    ]


async def main(args: argparse.Namespace) -> list[c.Row]:
    rows: list[c.Row] = []
    benches = {
        "postgres": (bench_postgres, c.postgres_missing),
        "redis": (bench_redis, c.redis_missing),
    }
    for key, (bench, missing) in benches.items():
        if args.quick:
            rows += placeholders(key, lambda i, w: c.skipped(i, w, "--quick"))
            continue
        why = await missing()
        if why:
            print(f"{key}: skipped: {why}")
            rows += placeholders(key, lambda i, w: c.skipped(i, w, "no server"))
            continue
        try:
            rows += await bench(args)
        except Exception as exc:  # noqa: BLE001 - one broken store must not hide the other
            print(f"{key}: failed: {exc!r}")
            rows += placeholders(key, lambda i, w, e=exc: c.failed(i, w, e))
    return rows


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=2.5, help="length of a phase")
    parser.add_argument("--rounds", type=int, default=3)


if __name__ == "__main__":
    arguments = c.arguments(__doc__ or "", _options)
    c.report(asyncio.run(main(arguments)), arguments)
