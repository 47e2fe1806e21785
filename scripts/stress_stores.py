"""The hand-off stress run on every real store: ``make verify-stress STRESS_STORES=...``.

For each store named in ``--stores`` (sqlite, postgres, redis, dynamodb) it makes a fresh,
isolated store on this machine's services (a temporary SQLite file, a new PostgreSQL
schema, a new Redis namespace, a new DynamoDB table on ``FLOWY_DYNAMODB_ENDPOINT`` or on
moto in server mode), runs ``flowy.testing.stress_stores`` against it, prints its
summary line, and removes the store. Exit status 1 if any store lost a hand-off or
resumed one twice.

Service addresses: ``FLOWY_POSTGRES_DSN`` (default
``postgresql://postgres@127.0.0.1:5432/test``), ``FLOWY_REDIS_URL`` (default
``redis://127.0.0.1:6379/0``), ``FLOWY_DYNAMODB_ENDPOINT``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from flowy.testing import stress_stores

ROOT = Path(__file__).resolve().parents[1]
STORES = ("sqlite", "postgres", "redis", "dynamodb")


@contextlib.asynccontextmanager
async def _sqlite() -> AsyncIterator[str]:
    with tempfile.TemporaryDirectory(prefix="flowy-stress-") as folder:
        yield f"sqlite:///{Path(folder) / 'stress.db'}"


@contextlib.asynccontextmanager
async def _postgres() -> AsyncIterator[str]:
    import asyncpg  # a dependency of flowy-postgres

    dsn = os.environ.get("FLOWY_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test")
    schema = f"flowy_stress_{uuid.uuid4().hex[:12]}"
    try:
        yield f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}"
    finally:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()


@contextlib.asynccontextmanager
async def _redis() -> AsyncIterator[str]:
    import redis.asyncio as redis  # a dependency of flowy-redis

    from flowy_redis import purge_namespace

    base = os.environ.get("FLOWY_REDIS_URL", "redis://127.0.0.1:6379/0")
    namespace = f"flowy-stress-{uuid.uuid4().hex[:12]}"
    try:
        yield f"{base}{'&' if '?' in base else '?'}namespace={namespace}"
    finally:
        client: Any = redis.Redis.from_url(base)
        try:
            await purge_namespace(client, namespace)
        finally:
            await client.aclose()


@contextlib.asynccontextmanager
async def _dynamodb() -> AsyncIterator[str]:
    from flowy_dynamodb import make_client

    table = f"flowy-stress-{uuid.uuid4().hex[:12]}"
    region = os.environ.get("AWS_DEFAULT_REGION", "us-east-1")
    endpoint = os.environ.get("FLOWY_DYNAMODB_ENDPOINT")
    server: Any = None
    if not endpoint:
        # moto in server mode, one request at a time (see its module); the workers are
        # other processes, so they reach it over HTTP like any DynamoDB endpoint.
        sys.path.insert(0, str(ROOT / "packages" / "flowy-dynamodb" / "tests"))
        from moto_server import SerializedMotoServer

        os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
        server = SerializedMotoServer()
        endpoint = server.start()
    stop = threading.Event()
    if server is not None:
        # moto keeps every model object it made; drop them now and then (see its module).
        def forget() -> None:
            while not stop.wait(30):
                server.forget_tracked_instances()

        threading.Thread(target=forget, daemon=True).start()
    try:
        yield f"dynamodb://{table}?region={region}&endpoint_url={endpoint}"
    finally:
        stop.set()
        client = make_client(region=region, endpoint_url=endpoint)
        with contextlib.suppress(Exception):
            client.delete_table(TableName=table)
        client.close()
        if server is not None:
            server.stop()


# moto answers a save in about 90 ms and a 1,000-thread listing in seconds, one request
# at a time: the workers poll and recover less often there.
PACE = {"dynamodb": 5.0}

MAKERS: dict[str, Callable[[], contextlib.AbstractAsyncContextManager[str]]] = {
    "sqlite": _sqlite,
    "postgres": _postgres,
    "redis": _redis,
    "dynamodb": _dynamodb,
}


async def _main(args: argparse.Namespace) -> int:
    failed = False
    for name in args.stores:
        handoffs = args.handoffs
        if name == "dynamodb" and args.dynamodb_handoffs is not None:
            handoffs = args.dynamodb_handoffs
        async with MAKERS[name]() as url:
            summary = await stress_stores.run(
                url,
                handoffs,
                workers=args.workers,
                kills=args.kills,
                fault_rate=args.fault_rate,
                pace=PACE.get(name, 1.0),
                seed=args.seed,
                deadline_seconds=args.timeout,
            )
        summary["store"] = name
        print(" ".join(f"{k}={v}" for k, v in summary.items()), flush=True)
        failed |= summary["lost"] != 0 or summary["double_resumed"] != 0
    return 1 if failed else 0


def _stores(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = sorted(set(names) - set(STORES))
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown store(s) {', '.join(unknown) or '(none)'}; choose from {', '.join(STORES)}"
        )
    return names


def main() -> int:
    """The command line."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--stores", type=_stores, default=list(STORES), help="comma-separated")
    parser.add_argument("--handoffs", type=int, default=10_000, help="threads per store")
    parser.add_argument(
        "--dynamodb-handoffs",
        type=int,
        default=None,
        help="threads on DynamoDB (default: --handoffs); moto, the local stand-in, "
        "serves about ten saves a second",
    )
    parser.add_argument("--workers", type=int, default=4, help="worker processes at a time")
    parser.add_argument("--kills", type=int, default=5, help="workers SIGKILLed per store")
    parser.add_argument("--fault-rate", type=float, default=0.1, help="chance of a fault")
    parser.add_argument("--seed", type=int, default=1, help="random seed")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per store")
    args = parser.parse_args()
    import logging

    logging.getLogger("flowy").setLevel(logging.CRITICAL)  # injected faults are expected
    return asyncio.run(_main(args))


if __name__ == "__main__":
    sys.exit(main())
