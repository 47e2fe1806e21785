"""Benchmark: a durable save on DynamoDB vs the raw conditional write it is built on.

Measures, on the same endpoint in the same run, the median latency of
``DynamoCheckpointer.save`` (a ~1 KiB state; one ``TransactWriteItems`` of the head
update and the history entry, run off the event loop) against a raw boto3 conditional
``UpdateItem`` of a 1 KiB item, and prints the ratio. For scale it also times the same
two-item transaction sent raw (what the save costs the service, without flowy).

The endpoint is ``FLOWY_DYNAMODB_ENDPOINT`` if set, else moto's server mode started here
(an in-process emulator: its figures say nothing about DynamoDB's own latency).

    uv run --frozen --all-packages python bench/backend_dynamodb.py [--rounds 8] [--per-round 50]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, cast

from flowy.storage import Snapshot, new_write_id
from flowy_dynamodb import DynamoBackend, create_table, make_client

STATE = {"blob": "x" * 1000, "step": 0}  # ~1 KiB encoded


def start_endpoint() -> tuple[str, str, Any]:
    explicit = os.environ.get("FLOWY_DYNAMODB_ENDPOINT")
    if explicit:
        return explicit, "FLOWY_DYNAMODB_ENDPOINT", None
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    return f"http://{host}:{port}", "moto server mode (in-process emulator)", server


def client_for(endpoint: str) -> Any:
    if not os.environ.get("AWS_ACCESS_KEY_ID"):  # an emulator takes any credentials
        os.environ["AWS_ACCESS_KEY_ID"] = os.environ["AWS_SECRET_ACCESS_KEY"] = "bench"
    return make_client(
        endpoint_url=endpoint, region=os.environ.get("AWS_DEFAULT_REGION", "us-east-1")
    )


def forget_moto_instances() -> None:
    """moto keeps every model object it ever made (and a transaction copies its table):
    drop that record between rounds so the emulator's garbage does not stall the run."""
    from moto.core.model_instances import reset_model_data

    reset_model_data()


def trim(client: Any, table: str, pk: str, keep: int) -> None:
    """Delete the raw transaction's history entries except the newest."""
    items = client.query(
        TableName=table,
        KeyConditionExpression="#p = :p AND begins_with(#s, :r)",
        ExpressionAttributeNames={"#p": "pk", "#s": "sk"},
        ExpressionAttributeValues={":p": {"S": pk}, ":r": {"S": "rev#"}},
        ProjectionExpression="#p, #s",
    )["Items"]
    doomed = [i for i in items if i["sk"]["S"] != f"rev#{keep:020d}"]
    for first in range(0, len(doomed), 25):
        client.batch_write_item(
            RequestItems={
                table: [{"DeleteRequest": {"Key": key}} for key in doomed[first : first + 25]]
            }
        )


async def timed(fn: Callable[[], Awaitable[None]], count: int, out: list[float]) -> None:
    for _ in range(count):
        started = time.perf_counter()
        await fn()
        out.append(time.perf_counter() - started)


async def run(rounds: int, per_round: int) -> None:
    endpoint, kind, server = start_endpoint()
    client = client_for(endpoint)
    table = f"flowy-bench-{uuid.uuid4().hex[:10]}"
    create_table(client, table)
    # The checkpointer gets its own client whose TransactWriteItems is timed from inside,
    # so flowy's own share of a save (encoding, expressions, the hop to the pool
    # thread) can be told apart from the request itself.
    cp_client = client_for(endpoint)
    inner: list[float] = []
    send = cp_client.transact_write_items

    def timed_send(**params: Any) -> Any:
        started = time.perf_counter()
        try:
            return send(**params)
        finally:
            inner.append(time.perf_counter() - started)

    cp_client.transact_write_items = timed_send
    backend = await DynamoBackend[Any].from_client(cp_client, table, max_workers=4).open()
    cp = backend.checkpointer
    thread_id = f"bench-{uuid.uuid4().hex}"
    revision = 0
    raw_revision = 0
    tx_revision = 0
    payload = b"x" * 1024

    async def durable_save() -> None:
        nonlocal revision
        snapshot: Snapshot[Any] = Snapshot(
            thread_id=thread_id,
            state={**STATE, "step": revision},
            execution_pointer="step",
            write_id=new_write_id(),
        )
        revision = await cp.save(revision, snapshot)

    async def raw_update() -> None:
        nonlocal raw_revision
        condition = "attribute_not_exists(#r)" if raw_revision == 0 else "#r = :e"
        values: dict[str, Any] = {":n": {"N": str(raw_revision + 1)}, ":d": {"B": payload}}
        if raw_revision:
            values[":e"] = {"N": str(raw_revision)}
        client.update_item(
            TableName=table,
            Key={"pk": {"S": "bench#raw"}, "sk": {"S": "head"}},
            UpdateExpression="SET #r = :n, #d = :d",
            ConditionExpression=condition,
            ExpressionAttributeNames={"#r": "revision", "#d": "data"},
            ExpressionAttributeValues=values,
        )
        raw_revision += 1

    async def raw_transaction() -> None:
        nonlocal tx_revision
        condition = "attribute_not_exists(#r)" if tx_revision == 0 else "#r = :e"
        values: dict[str, Any] = {":n": {"N": str(tx_revision + 1)}, ":d": {"B": payload}}
        if tx_revision:
            values[":e"] = {"N": str(tx_revision)}
        client.transact_write_items(
            TransactItems=[
                {
                    "Update": {
                        "TableName": table,
                        "Key": {"pk": {"S": "bench#tx"}, "sk": {"S": "head"}},
                        "UpdateExpression": "SET #r = :n, #d = :d",
                        "ConditionExpression": condition,
                        "ExpressionAttributeNames": {"#r": "revision", "#d": "data"},
                        "ExpressionAttributeValues": values,
                    }
                },
                {
                    "Put": {
                        "TableName": table,
                        "Item": {
                            "pk": {"S": "bench#tx"},
                            "sk": {"S": f"rev#{tx_revision + 1:020d}"},
                            "data": {"B": payload},
                        },
                        "ConditionExpression": "attribute_not_exists(#p)",
                        "ExpressionAttributeNames": {"#p": "pk"},
                    }
                },
            ]
        )
        tx_revision += 1

    samples: dict[str, list[float]] = {"save": [], "raw": [], "tx": []}
    try:
        for warm in (durable_save, raw_update, raw_transaction):
            await timed(warm, 20, [])
        inner.clear()
        for _ in range(rounds):  # interleaved, so drift hits all three alike
            await timed(durable_save, per_round, samples["save"])
            await timed(raw_update, per_round, samples["raw"])
            await timed(raw_transaction, per_round, samples["tx"])
            # Untimed: keep the history short, as retention does in production (and
            # because moto copies the whole table on every transaction).
            await cp.prune(thread_id, 1)
            trim(client, table, "bench#tx", tx_revision)
            if server is not None:
                forget_moto_instances()
    finally:
        client.delete_table(TableName=table)
        await backend.aclose()
        if server is not None:
            server.stop()

    # The same saves against a client that answers at once: flowy's cost per save
    # (encoding, expressions, the hop to a pool thread and back) with no I/O at all.
    class NoopClient:
        meta = cp_client.meta

        def transact_write_items(self, **_: Any) -> dict[str, Any]:
            return {}

    noop_backend = DynamoBackend[Any].from_client(cast(Any, NoopClient()), table, max_workers=1)
    noop = noop_backend.checkpointer
    noop_samples: list[float] = []

    async def noop_save() -> None:
        snapshot: Snapshot[Any] = Snapshot(
            thread_id=thread_id, state=STATE, execution_pointer="step", write_id=new_write_id()
        )
        await noop.save(len(noop_samples), snapshot)

    await timed(noop_save, 200, [])
    await timed(noop_save, 2000, noop_samples)
    await noop_backend.aclose()
    samples["noop"] = noop_samples

    def median_us(name: str) -> float:
        return statistics.median(samples[name]) * 1e6

    def p90_us(name: str) -> float:
        return statistics.quantiles(samples[name], n=10)[-1] * 1e6

    save, raw, tx = median_us("save"), median_us("raw"), median_us("tx")
    own = statistics.median(
        outer - call for outer, call in zip(samples["save"], inner, strict=True)
    )
    print(f"endpoint: {endpoint} ({kind})")
    print(f"samples per measurement: {len(samples['save'])} ({rounds} rounds x {per_round})")
    print(
        f"DynamoCheckpointer.save (1 KiB state, TransactWriteItems of 2 items): "
        f"median {save:,.0f} us, p90 {p90_us('save'):,.0f} us"
    )
    print(
        f"raw conditional UpdateItem (1 KiB, boto3 direct):                    "
        f"median {raw:,.0f} us, p90 {p90_us('raw'):,.0f} us"
    )
    print(
        f"raw TransactWriteItems (same 2 items, boto3 direct):                 "
        f"median {tx:,.0f} us, p90 {p90_us('tx'):,.0f} us"
    )
    print(
        f"flowy's own share of a save (outside the boto3 call):                 "
        f"median {own * 1e6:,.0f} us"
    )
    print(
        f"DynamoCheckpointer.save against a no-op client (flowy alone, no I/O): "
        f"median {median_us('noop'):,.0f} us"
    )
    print(f"ratio save / raw UpdateItem: {save / raw:.2f}x")
    print(f"ratio save / raw TransactWriteItems: {save / tx:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--per-round", type=int, default=50)
    args = parser.parse_args()
    asyncio.run(run(args.rounds, args.per_round))


if __name__ == "__main__":
    main()
