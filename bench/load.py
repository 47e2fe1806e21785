"""``load`` is O(1) in a thread's history length, and ``list_threads`` pages through an
index (its time does not grow with the number of threads).

Per store: a thread with 10,000 revisions and one with 10 (``--quick``: 300 and 10),
saved through the checkpointer; then loads of the two, interleaved, and the ratio of
their medians. Then two stores of the same kind, one with 1,000 threads and one with
20,000 (``--quick``: 200 and 1,000), and ``list_threads(limit=100, after=X)`` from the
middle of each, interleaved.

Budget: the long thread loads within 1.2× the short one; a page of the big store lists
within 1.2× a page of the small one.

Stores: memory, SQLite (a temporary file; built with synchronous=NORMAL, which reads do
not depend on), PostgreSQL and Redis (``FLOWY_POSTGRES_DSN``, ``FLOWY_REDIS_URL``),
and DynamoDB on moto with ``--full`` only (moto copies a table on every transaction, so
building 10,000 revisions there takes many minutes: with ``--full`` the long thread has
2,000 revisions and the listing compares 200 with 2,000 threads).

    uv run --frozen --all-packages python bench/load.py [--quick] [--full] [--store NAME]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import _common as c

import flowy
from flowy.storage import Snapshot

LIMIT = 100
BUDGET = 1.2
MAX_SECONDS = 60.0
"""A comparison stops after this long once it has 5 rounds (moto takes seconds a page)."""


def snap(tid: str, n: int) -> Snapshot[c.State]:
    return Snapshot(
        tid,
        {"n": n, "node": n % c.STEPS, "text": c.TEXT},
        f"n{n % c.STEPS}",
        updated_at=time.time(),
        write_id=f"w{n}",
    )


async def fill_history(cp: Any, tid: str, revisions: int) -> None:
    for rev in range(revisions):
        await cp.save(rev, snap(tid, rev + 1))


async def fill_threads(cp: Any, count: int, parallel: int) -> None:
    sem = asyncio.Semaphore(parallel)

    async def one(i: int) -> None:
        async with sem:
            await cp.save(0, snap(f"t-{i:06d}", 1))

    for first in range(0, count, 2000):  # bounded batches: no 20,000 pending tasks at once
        await asyncio.gather(*(one(i) for i in range(first, min(count, first + 2000))))


Opener = Callable[[str], contextlib.AbstractAsyncContextManager[Any]]


@contextlib.asynccontextmanager
async def memory_store(_: str) -> AsyncIterator[Any]:
    async with flowy.connect("memory://") as backend:
        yield backend


def sqlite_opener(folder: str) -> Opener:
    @contextlib.asynccontextmanager
    async def store(name: str) -> AsyncIterator[Any]:
        async with flowy.connect(f"sqlite:///{folder}/{name}.db?synchronous=NORMAL") as b:
            yield b

    return store


@contextlib.asynccontextmanager
async def postgres_store(name: str) -> AsyncIterator[Any]:
    import asyncpg

    schema = f"bench_{name}_{uuid.uuid4().hex[:6]}"
    url = c.with_query(c.postgres_dsn(), schema=schema, listen="false", pool_size=16)
    try:
        async with flowy.connect(url) as backend:
            yield backend
    finally:
        driver: Any = asyncpg
        conn = await driver.connect(c.postgres_dsn())
        await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await conn.close()


@contextlib.asynccontextmanager
async def redis_store(name: str) -> AsyncIterator[Any]:
    url = c.with_query(c.redis_url(), namespace=f"bench-{name}-{uuid.uuid4().hex[:6]}")
    async with flowy.connect(url) as backend:
        try:
            yield backend
        finally:
            await backend.purge()


def dynamodb_opener(endpoint: str) -> Opener:
    @contextlib.asynccontextmanager
    async def store(name: str) -> AsyncIterator[Any]:
        table = f"flowy-bench-{name}-{uuid.uuid4().hex[:6]}"
        url = f"dynamodb://{table}?region=us-east-1&endpoint_url={endpoint}"
        async with flowy.connect(url) as backend:
            try:
                yield backend
            finally:
                backend.table.client.delete_table(TableName=table)

    return store


def parallelism(key: str) -> int:
    return 16 if key in ("postgres", "redis") else 4 if key == "dynamodb" else 1


async def measure_load(
    key: str, title: str, open_store: Opener, *, long: int, short: int, rounds: int
) -> c.Row:
    began = time.monotonic()
    async with open_store("load") as backend:
        cp = backend.checkpointer
        await fill_history(cp, "long", long)
        await fill_history(cp, "short", short)
        built = time.monotonic() - began
        loads = await c.interleave(
            {
                "long": c.timed(lambda _: cp.load("long")),
                "short": c.timed(lambda _: cp.load("short")),
            },
            rounds,
            warmup=5,
            max_seconds=MAX_SECONDS,
        )
    lo, sh = c.median(loads["long"]), c.median(loads["short"])
    print(
        f"{title}: load of a thread with {long:,} revisions {c.us(lo)}, with {short} "
        f"{c.us(sh)} (medians of {len(loads['long'])}; built in {built:.1f} s)",
        flush=True,
    )
    return c.at_most(
        f"{key}.load",
        f"{title}: load, {long:,} vs {short} revisions",
        lo,
        sh,
        BUDGET,
        revisions=float(long),
    )


async def measure_list(
    key: str, title: str, open_store: Opener, *, big: int, small: int, rounds: int
) -> c.Row:
    parallel = parallelism(key)
    began = time.monotonic()
    async with open_store("big") as big_store, open_store("small") as small_store:
        await fill_threads(big_store.checkpointer, big, parallel)
        await fill_threads(small_store.checkpointer, small, parallel)
        built = time.monotonic() - began
        after_big, after_small = f"t-{big // 4:06d}", f"t-{small // 4:06d}"

        async def page(cp: Any, after: str) -> None:
            got = await cp.list_threads(limit=LIMIT, after=after)
            assert len(got) == LIMIT, len(got)

        pages = await c.interleave(
            {
                "big": c.timed(lambda _: page(big_store.checkpointer, after_big)),
                "small": c.timed(lambda _: page(small_store.checkpointer, after_small)),
            },
            rounds,
            warmup=5,
            max_seconds=MAX_SECONDS,
        )
    bg, sm = c.median(pages["big"]), c.median(pages["small"])
    print(
        f"{title}: list_threads(limit={LIMIT}, after=a quarter in) over {big:,} threads "
        f"{c.us(bg)}, over {small:,} {c.us(sm)} (built in {built:.1f} s)",
        flush=True,
    )
    return c.at_most(
        f"{key}.list",
        f"{title}: list_threads(limit={LIMIT}, after=X), {big:,} vs {small:,} threads",
        bg,
        sm,
        BUDGET,
        threads=float(big),
    )


TITLES = {
    "memory": "memory",
    "sqlite": "SQLite",
    "postgres": "PostgreSQL",
    "redis": "Redis",
    "dynamodb": "DynamoDB (moto)",
}


def placeholders(key: str, reason: str) -> list[c.Row]:
    title = TITLES[key]
    return [
        c.skipped(f"{key}.load", f"{title}: load, long vs short history", reason),
        c.skipped(f"{key}.list", f"{title}: list_threads, many vs few threads", reason),
    ]


async def main(args: argparse.Namespace) -> list[c.Row]:
    rows: list[c.Row] = []
    sizes = (300, 10, 1_000, 200) if args.quick else (10_000, 10, 20_000, 1_000)
    rounds = 20 if args.quick else 300
    with tempfile.TemporaryDirectory() as tmp:
        for key in args.store or list(TITLES):
            title = TITLES[key]
            opener: Opener
            server: Any = None
            store_sizes = sizes
            if key == "memory":
                opener = memory_store
            elif key == "sqlite":
                opener = sqlite_opener(tmp)
            elif args.quick:
                rows += placeholders(key, "--quick")
                continue
            elif key == "postgres":
                if why := await c.postgres_missing():
                    print(f"{title}: skipped: {why}")
                    rows += placeholders(key, "no server")
                    continue
                opener = postgres_store
            elif key == "redis":
                if why := await c.redis_missing():
                    print(f"{title}: skipped: {why}")
                    rows += placeholders(key, "no server")
                    continue
                opener = redis_store
            else:
                if not args.full:
                    rows += placeholders(key, "--full only (moto is slow to fill)")
                    continue
                endpoint = os.environ.get("FLOWY_DYNAMODB_ENDPOINT")
                if endpoint is None:
                    sys.path.insert(0, str(c.ROOT / "packages" / "flowy-dynamodb" / "tests"))
                    from moto_server import SerializedMotoServer

                    server = SerializedMotoServer()
                    endpoint = server.start()
                os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
                os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
                opener = dynamodb_opener(endpoint)
                store_sizes = (2_000, 10, 2_000, 200)
            long, short, big, small = store_sizes
            try:
                for kind, run in (
                    ("load", functools.partial(measure_load, long=long, short=short)),
                    ("list", functools.partial(measure_list, big=big, small=small)),
                ):
                    try:
                        rows.append(await run(key, title, opener, rounds=rounds))
                    except Exception as exc:  # noqa: BLE001 - a failure must not hide the rest
                        print(f"{title}: {kind} failed: {exc!r}")
                        rows.append(c.failed(f"{key}.{kind}", f"{title}: {kind}", exc))
            finally:
                if server is not None:
                    server.stop()
    return rows


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", action="append", choices=sorted(TITLES))


if __name__ == "__main__":
    arguments = c.arguments(__doc__ or "", _options)
    c.report(asyncio.run(main(arguments)), arguments)
