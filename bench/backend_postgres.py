"""Benchmark of flowy-postgres: a durable step vs the raw driver, and outbox throughput.

1. Save latency: ``PostgresCheckpointer.save`` of a ~1 KiB state, against asyncpg's own
   single conditional ``UPDATE`` of a 1 KiB row on a dedicated connection, measured in
   the same run with the two interleaved operation by operation (so load on the machine
   hits both alike). Prints both medians and their ratio (the budget is <= 1.5x).
2. Outbox throughput: N hand-off intents enqueued, then consumed by 4 concurrent
   consumer tasks doing claim / ack. Prints hand-offs per second.

Run: ``uv run --frozen --all-packages python bench/backend_postgres.py [--saves N] [--intents N]``
with ``FLOWY_POSTGRES_DSN`` (default ``postgresql://postgres@127.0.0.1:5432/test``).
Everything happens in a fresh schema, dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid
from typing import Any, Protocol, cast

import asyncpg

from flowy.checkpoint import HandoffIntent, HandoffStatus, ResumeToken, Snapshot, encode_snapshot
from flowy_postgres import PostgresBackend, create_pool, migrate

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"


class _Connection(Protocol):
    """The asyncpg connection methods used here (asyncpg ships no types)."""

    async def execute(self, query: str, *args: object) -> str: ...

    async def close(self) -> None: ...


async def _connect(dsn: str) -> _Connection:
    driver: Any = asyncpg
    return cast(_Connection, await driver.connect(dsn))


def _state() -> dict[str, Any]:
    """A state whose encoded snapshot record is about 1 KiB."""
    return {
        "messages": [f"message {i}: " + "lorem ipsum dolor sit amet " * 3 for i in range(9)],
        "step": 1,
    }


def _quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q * 100) - 1]


async def bench_save(dsn: str, schema: str, saves: int, warmup: int) -> dict[str, float]:
    pool = await create_pool(dsn, min_size=1, max_size=2)
    raw = await _connect(dsn)
    try:
        await migrate(pool, schema=schema)
        backend = PostgresBackend[Any].from_pool(pool, schema=schema)
        cp = backend.checkpointer
        table = f'"{schema}".raw_rows'
        await raw.execute(
            f"CREATE TABLE {table} (id text PRIMARY KEY, revision bigint NOT NULL, "
            f"data bytea NOT NULL)"
        )
        await raw.execute(f"INSERT INTO {table} VALUES ('row', 0, $1)", b"\0" * 1024)
        update = (
            f"UPDATE {table} SET data = $1, revision = revision + 1 WHERE id = $2 AND revision = $3"
        )
        state = _state()
        record_size = len(
            encode_snapshot(Snapshot(thread_id="bench", state=state, execution_pointer="step"), 1)
        )
        payload = os.urandom(1024)
        ours: list[float] = []
        theirs: list[float] = []
        revision = 0
        clock = time.perf_counter
        for i in range(warmup + saves):
            snap = Snapshot(thread_id="bench", state=state, execution_pointer="step")
            start = clock()
            revision = await cp.save(revision, snap)
            mid = clock()
            status = await raw.execute(update, payload, "row", i)
            end = clock()
            assert status == "UPDATE 1", status
            if i >= warmup:
                ours.append(mid - start)
                theirs.append(end - mid)
        return {
            "record_bytes": record_size,
            "save_median_us": statistics.median(ours) * 1e6,
            "save_p90_us": _quantile(ours, 0.9) * 1e6,
            "raw_median_us": statistics.median(theirs) * 1e6,
            "raw_p90_us": _quantile(theirs, 0.9) * 1e6,
        }
    finally:
        await raw.close()
        await pool.close()


async def bench_outbox(dsn: str, schema: str, intents: int, workers: int) -> dict[str, float]:
    pool = await create_pool(dsn, min_size=1, max_size=workers + 2)
    try:
        await migrate(pool, schema=schema)
        backend = PostgresBackend[Any].from_pool(pool, schema=schema)
        start = time.perf_counter()
        for i in range(intents):
            tid = f"thread-{i}"
            await backend.outbox.enqueue_intent(
                HandoffIntent(
                    thread_id=tid,
                    pending_snapshot_revision=2,
                    committed_snapshot_revision=2,
                    snapshot_revision=2,
                    resume_token=ResumeToken(tid, 2),
                    handoff_status=HandoffStatus.ENQUEUED,
                    reason="handoff",
                    execution_pointer="worker",
                )
            )
        enqueue_seconds = time.perf_counter() - start
        consumer = backend.consumer
        done = 0

        async def work() -> None:
            nonlocal done
            while True:
                messages = await consumer.claim(10, 30.0)
                if not messages:
                    return
                for message in messages:
                    await consumer.ack(message)
                    done += 1

        start = time.perf_counter()
        await asyncio.gather(*(work() for _ in range(workers)))
        consume_seconds = time.perf_counter() - start
        assert done == intents, (done, intents)
        await consumer.close()
        return {
            "enqueue_per_s": intents / enqueue_seconds,
            "handoffs_per_s": intents / consume_seconds,
        }
    finally:
        await pool.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description="flowy-postgres benchmark")
    parser.add_argument("--saves", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--intents", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=4)
    args, _ = parser.parse_known_args()  # bench/run.py passes every script the same args
    dsn = os.environ.get("FLOWY_POSTGRES_DSN", DEFAULT_DSN)
    schema = f"flowy_bench_{uuid.uuid4().hex[:8]}"
    try:
        admin = await _connect(dsn)
    except (OSError, asyncpg.PostgresError) as exc:
        print(f"postgres: no server at {dsn} ({exc}); skipped (set FLOWY_POSTGRES_DSN)")
        return
    try:
        save = await bench_save(dsn, schema, args.saves, args.warmup)
        outbox = await bench_outbox(dsn, schema + "_outbox", args.intents, args.workers)
    finally:
        for name in (schema, schema + "_outbox"):
            await admin.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        await admin.close()
    ratio = save["save_median_us"] / save["raw_median_us"]
    print(f"postgres durable step ({args.saves} saves, record {save['record_bytes']} bytes)")
    print(
        f"  PostgresCheckpointer.save  median {save['save_median_us']:8.0f} us   "
        f"p90 {save['save_p90_us']:8.0f} us"
    )
    print(
        f"  raw asyncpg UPDATE (1 KiB) median {save['raw_median_us']:8.0f} us   "
        f"p90 {save['raw_p90_us']:8.0f} us"
    )
    print(f"  ratio {ratio:.2f}x (budget 1.5x) {'OK' if ratio <= 1.5 else 'OVER BUDGET'}")
    print(f"postgres outbox ({args.intents} intents, {args.workers} consumer tasks)")
    print(f"  enqueue  {outbox['enqueue_per_s']:8.0f} intents/s (one at a time)")
    print(f"  consume  {outbox['handoffs_per_s']:8.0f} hand-offs/s (claim 10 + ack each)")


if __name__ == "__main__":
    asyncio.run(main())
