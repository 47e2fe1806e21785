"""DynamoDB: flowy's own share of a durable save, against a raw ``TransactWriteItems`` of
the very same items (information; no budget).

A run saves a ~1 KiB state 10 times on a fresh thread through ``DynamoCheckpointer``,
whose boto3 client records the time of each ``TransactWriteItems`` call and the request
itself. After each save (alternating which goes first), the same request is sent raw by
boto3, with the table name changed, to a mirror table that receives every write flowy
makes in the same order: the same items against the same table contents, so the same
work for the emulator. Then:

- the save's time vs the raw request's time (medians);
- flowy's own share of a save: the save's time outside its boto3 call (encoding,
  building the request, the hop to the pool thread and back), and the CPU time of a save
  against a client that answers at once (flowy alone, no boto3 and no I/O).

The endpoint is ``FLOWY_DYNAMODB_ENDPOINT`` if set, else moto in server mode, run here
one request at a time (the tests' stand-in, ``packages/flowy-dynamodb/tests``): an
emulator whose figures say nothing about DynamoDB's own latency, only about flowy's share.

    uv run --frozen --all-packages python bench/backend_dynamodb.py [--runs 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from typing import Any

import _common as c

from flowy.storage import Snapshot
from flowy.storage.dialect import new_write_id

WRITES = ("transact_write_items", "put_item", "update_item", "delete_item", "batch_write_item")


def start_endpoint() -> tuple[str, Any]:
    """The endpoint, and the moto server started here (``None`` for an explicit one)."""
    explicit = os.environ.get("FLOWY_DYNAMODB_ENDPOINT")
    if explicit:
        return explicit, None
    sys.path.insert(0, str(c.ROOT / "packages" / "flowy-dynamodb" / "tests"))
    from moto_server import SerializedMotoServer  # the tests' serialized stand-in

    server = SerializedMotoServer()
    return server.start(), server


def renamed(value: Any, old: str, new: str) -> Any:
    """``value`` (a boto3 request) with the table name ``old`` replaced by ``new``."""
    if isinstance(value, dict):
        return {(new if k == old else k): renamed(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [renamed(v, old, new) for v in value]
    return new if value == old else value


class Recorder:
    """Wraps the write calls of a boto3 client: each call is timed and kept (in order)
    for the mirror table."""

    def __init__(self, client: Any) -> None:
        self.calls: list[tuple[str, dict[str, Any], float]] = []
        for name in WRITES:
            setattr(client, name, self._wrap(name, getattr(client, name)))

    def _wrap(self, name: str, inner: Any) -> Any:
        def call(**params: Any) -> Any:
            began = time.perf_counter()
            try:
                return inner(**params)
            finally:
                self.calls.append((name, params, time.perf_counter() - began))

        return call


async def measure(args: argparse.Namespace) -> list[c.Row]:
    from flowy_dynamodb import DynamoBackend, create_table, make_client

    endpoint, server = start_endpoint()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")  # an emulator takes any credentials
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    region = os.environ.get("AWS_DEFAULT_REGION", "us-east-1")
    table, mirror = f"flowy-bench-{uuid.uuid4().hex[:10]}", f"flowy-mirror-{uuid.uuid4().hex[:8]}"
    raw: Any = make_client(endpoint_url=endpoint, region=region)
    flowy_client: Any = make_client(endpoint_url=endpoint, region=region)
    create_table(raw, table)
    create_table(raw, mirror)
    recorder = Recorder(flowy_client)
    backend = await DynamoBackend[Any].from_client(flowy_client, table, max_workers=4).open()
    cp = backend.checkpointer
    synced = len(recorder.calls)  # writes of the mirror so far (the schema record too)

    def mirror_pending(timed: list[float] | None) -> None:
        """Send the mirror table every write flowy made since the last call."""
        nonlocal synced
        while synced < len(recorder.calls):
            name, params, _ = recorder.calls[synced]
            synced += 1
            began = time.perf_counter()
            getattr(raw, name)(**renamed(params, table, mirror))
            if timed is not None and name == "transact_write_items":
                timed.append(time.perf_counter() - began)

    mirror_pending(None)
    saves: list[float] = []
    inside: list[float] = []
    replays: list[float] = []
    runs = 4 if args.quick else args.runs
    try:
        for r in range(runs + 1):  # the first run warms up
            tid = f"bench-{uuid.uuid4().hex}"
            for revision in range(c.STEPS):
                snap: Snapshot[Any] = Snapshot(
                    tid,
                    {"n": revision + 1, "node": revision, "text": c.TEXT},
                    f"n{revision}",
                    updated_at=time.time(),
                    write_id=new_write_id(),
                )
                mark = len(recorder.calls)
                replay_first = revision % 2 == 1 and mark > synced
                if replay_first:  # keep the mirror one write behind, then catch up first
                    mirror_pending(replays if r else None)
                began = time.perf_counter()
                await cp.save(revision, snap)
                elapsed = time.perf_counter() - began
                ours = [t for n, _, t in recorder.calls[mark:] if n == "transact_write_items"]
                if not replay_first:
                    mirror_pending(replays if r else None)
                if r:
                    saves.append(elapsed)
                    inside.append(sum(ours))
            await cp.delete(tid)  # keep the tables small: moto copies a table per transaction
            mirror_pending(None)
            if server is not None:
                server.forget_tracked_instances()
    finally:
        await backend.aclose()
        for name in (table, mirror):
            raw.delete_table(TableName=name)
        if server is not None:
            server.stop()

    # flowy alone: the same saves against a client that answers at once.
    class NoopClient:
        meta = flowy_client.meta

        def transact_write_items(self, **_: Any) -> dict[str, Any]:
            return {}

    noop = DynamoBackend[Any].from_client(NoopClient(), table, max_workers=1)  # type: ignore[arg-type]
    noop_cp = noop.checkpointer
    count = 200 if args.quick else 2000
    snap = Snapshot("bench-noop", {"n": 1, "node": 0, "text": c.TEXT}, "n0", write_id="x")
    for i in range(50):
        await noop_cp.save(i, snap)
    cpu, began = time.process_time(), time.perf_counter()
    for i in range(count):
        await noop_cp.save(i, snap)
    noop_cpu = (time.process_time() - cpu) / count
    noop_wall = (time.perf_counter() - began) / count
    await noop.aclose()

    save, replay = c.median(saves), c.median(replays)
    share = c.median([s - i for s, i in zip(saves, inside, strict=True)])
    where = "moto server mode" if server is not None else endpoint
    print(f"DynamoDB ({where}), {len(saves)} saves of a ~1 KiB state, fresh thread per 10:")
    print(f"   save (TransactWriteItems of head + history)       {c.us(save)}")
    print(f"     its boto3 call                                  {c.us(c.median(inside))}")
    print(f"     flowy's share (outside the boto3 call)          {c.us(share)}")
    print(f"   raw TransactWriteItems of the same items (mirror) {c.us(replay)}")
    print(f"   flowy alone (no-op client): wall {c.us(noop_wall)}, CPU {c.us(noop_cpu)} per save")
    values = {"share": share, "noop_cpu": noop_cpu, "noop_wall": noop_wall}
    return [
        c.info(
            "dynamodb.save",
            "DynamoDB (moto) save vs raw TransactWriteItems of the same items",
            save,
            replay,
            **values,
        ),
        c.Row(
            "dynamodb.share",
            "DynamoDB flowy's own share per save: wall outside boto3 / CPU (no-op client)",
            f"{c.us(share)} / {c.us(noop_cpu)}",
            f"save {c.us(save)}",
            share / save,
            "—",
            "info",
            {"flowy": share, "baseline": save, **values},
        ),
    ]


def main() -> None:
    args = c.arguments(
        __doc__ or "",
        lambda p: p.add_argument("--runs", type=int, default=20, help="runs of 10 saves"),
    )
    try:
        import flowy_dynamodb  # noqa: F401

        if args.quick:
            rows = [
                c.skipped("dynamodb.save", "DynamoDB save", "--quick"),
                c.skipped("dynamodb.share", "DynamoDB flowy's own share", "--quick"),
            ]
        else:
            rows = asyncio.run(measure(args))
    except ImportError as exc:
        rows = [
            c.skipped("dynamodb.save", "DynamoDB save", f"not installed ({exc.name})"),
            c.skipped("dynamodb.share", "DynamoDB flowy's own share", "not installed"),
        ]
    c.report(rows, args)


if __name__ == "__main__":
    main()
