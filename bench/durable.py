"""A durable Runner step (engine + one checkpoint save) against the raw driver.

For each reachable backend, a Runner executes a graph whose every step updates a ~1 KiB
state and saves it (``save_every_step``); the baseline is the driver's own conditional
update of a ~1 KiB row, one round trip per op. Each step runs one baseline op inside its
node (timed on its own), so the two alternate op by op and machine noise hits both
alike. Prints per-step medians and the ratio (budget for PostgreSQL and Redis: <= 1.5x).

Backends: SQLite (a temp file, synchronous=FULL, vs a raw sqlite3 conditional UPDATE in
a BEGIN IMMEDIATE transaction), PostgreSQL (``FLOWY_POSTGRES_DSN`` or 127.0.0.1:5432),
Redis (``FLOWY_REDIS_URL`` or 127.0.0.1:6379). An unreachable server is skipped.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import flowy

STEPS = 50
ROUNDS = 12
PAYLOAD = "x" * 900

State = dict[str, Any]


def graph(
    raw_op: Callable[[int], Awaitable[None]], marks: list[float], raws: list[float]
) -> flowy.Graph[State, Any]:
    """Each step first runs one raw driver op (timed on its own), then returns; the time
    from one step's entry to the next, minus that raw op, is one durable Runner step
    (engine + checkpoint save). So the two alternate op by op."""

    async def step(state: State) -> tuple[State, flowy.Directive[Any]]:
        marks.append(time.perf_counter())
        began = time.perf_counter()
        await raw_op(len(raws))
        raws.append(time.perf_counter() - began)
        n = state["n"] + 1
        return {"n": n, "blob": PAYLOAD}, (flowy.completed() if n < STEPS else flowy.end())

    b = flowy.GraphBuilder[State, Any]()
    b.add_node("a", step).add_node("b", step).add_edge("a", "b").add_edge("b", "a")
    return b.compile(max_steps=STEPS + 1)


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


async def compare(
    name: str,
    checkpointer: flowy.Checkpointer[State],
    raw_op: Callable[[int], Awaitable[None]],
) -> None:
    durable: list[float] = []
    raws: list[float] = []
    base = f"bench-{uuid.uuid4().hex[:8]}"
    for i in range(ROUNDS):
        marks: list[float] = []
        before = len(raws)
        runner = flowy.Runner(graph(raw_op, marks, raws), checkpointer)
        result = await runner.start(f"{base}-{i}", {"n": 0, "blob": ""})
        assert result.status is flowy.RunStatus.COMPLETED, result
        if i < 2:
            continue  # warm-up rounds
        for k in range(len(marks) - 1):
            durable.append(marks[k + 1] - marks[k] - raws[before + k])
    d, r = statistics.median(durable), statistics.median(raws[2 * STEPS :])
    print(
        f"   {name:<10} durable Runner step {d * 1e6:8.1f} us   raw conditional update "
        f"{r * 1e6:8.1f} us   ratio {d / r:.2f}x"
    )


async def bench_sqlite() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.db"
        async with flowy.SQLiteBackend(path) as backend:
            raw_path = Path(tmp) / "raw.db"
            conn = sqlite3.connect(raw_path, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("CREATE TABLE t (id TEXT PRIMARY KEY, rev INTEGER, body BLOB)")
            conn.execute("INSERT INTO t VALUES ('k', 0, '')")
            loop = asyncio.get_running_loop()
            body = PAYLOAD.encode() + b"x" * 124

            def update(rev: int) -> None:
                conn.execute("BEGIN IMMEDIATE")
                cur = conn.execute(
                    "UPDATE t SET rev = ?, body = ? WHERE id = 'k' AND rev = ?",
                    (rev + 1, body, rev),
                )
                assert cur.rowcount == 1
                conn.execute("COMMIT")

            async def raw_op(rev: int) -> None:
                await loop.run_in_executor(None, update, rev)

            await compare("sqlite", backend.checkpointer, raw_op)
            conn.close()


async def bench_postgres() -> None:
    dsn = os.environ.get("FLOWY_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test")
    if "FLOWY_POSTGRES_DSN" not in os.environ and not port_open("127.0.0.1", 5432):
        print("   postgres   skipped: no server on 127.0.0.1:5432 (set FLOWY_POSTGRES_DSN)")
        return
    import asyncpg

    from flowy_postgres import PostgresBackend, create_pool

    schema = f"bench_{uuid.uuid4().hex[:8]}"
    pool = await create_pool(dsn, min_size=1, max_size=2)
    backend: Any = PostgresBackend.from_pool(pool, schema=schema, listen=False)
    await backend.migrate()
    driver: Any = asyncpg
    raw = await driver.connect(dsn)
    await raw.execute(f"CREATE TABLE {schema}.raw (id text PRIMARY KEY, rev bigint, body bytea)")
    await raw.execute(f"INSERT INTO {schema}.raw VALUES ('k', 0, ''::bytea)")
    body = PAYLOAD.encode() + b"x" * 124

    async def raw_op(rev: int) -> None:
        status = await raw.execute(
            f"UPDATE {schema}.raw SET rev = $1, body = $2 WHERE id = 'k' AND rev = $3",
            rev + 1,
            body,
            rev,
        )
        assert status == "UPDATE 1"

    try:
        await compare("postgres", backend.checkpointer, raw_op)
    finally:
        await raw.execute(f"DROP SCHEMA {schema} CASCADE")
        await raw.close()
        await backend.close()
        await pool.close()


async def bench_redis() -> None:
    url = os.environ.get("FLOWY_REDIS_URL", "redis://127.0.0.1:6379/0")
    if "FLOWY_REDIS_URL" not in os.environ and not port_open("127.0.0.1", 6379):
        print("   redis      skipped: no server on 127.0.0.1:6379 (set FLOWY_REDIS_URL)")
        return
    import redis.asyncio as aioredis

    from flowy_redis import RedisBackend, purge_namespace

    client: Any = aioredis.Redis.from_url(url)
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    backend: Any = RedisBackend(client, namespace=namespace)
    script = (
        "if tonumber(redis.call('HGET', KEYS[1], 'rev') or '0') ~= tonumber(ARGV[1]) then "
        "return 0 end redis.call('HSET', KEYS[1], 'rev', ARGV[1] + 1, 'body', ARGV[2]) "
        "return 1"
    )
    sha = await client.script_load(script)
    key = f"{namespace}:raw"
    body = PAYLOAD.encode() + b"x" * 124

    async def raw_op(rev: int) -> None:
        assert await client.evalsha(sha, 1, key, rev, body) == 1

    try:
        await compare("redis", backend.checkpointer, raw_op)
    finally:
        await client.delete(key)
        await purge_namespace(client, namespace)
        await client.aclose()


async def main() -> None:
    print(f"durable Runner step vs raw driver ({STEPS} steps x {ROUNDS} rounds, ~1 KiB state)")
    for bench in (bench_sqlite, bench_postgres, bench_redis):
        try:
            await bench()
        except Exception as exc:  # noqa: BLE001 - a broken backend must not hide the others' figures
            print(f"   {bench.__name__}: failed: {exc!r}", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main())
