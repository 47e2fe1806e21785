"""One OS process of the two-process race in ``test_dynamodb_hazards`` (not a test).

Usage: ``python dynamo_race_worker.py ENDPOINT TABLE THREAD_ID SAVES MODE START_AT NAME``.
It waits until the epoch second ``START_AT``, then performs ``SAVES`` successful
read-modify-write increments of the thread's counter, retrying every conflict; with
MODE ``lease`` each increment runs under a fenced lease. Prints a JSON summary.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

from flowy import ConcurrencyConflictError, Snapshot, ThreadLeaseBusyError, ThreadNotFoundError
from flowy.checkpoint import Lease, new_write_id
from flowy_dynamodb import DynamoCheckpointer, DynamoExecutor, DynamoLeaseManager, make_client


async def race(
    endpoint: str, table: str, thread_id: str, saves: int, mode: str, start_at: float, name: str
) -> dict[str, Any]:
    credentials: dict[str, Any] = {}
    if not os.environ.get("AWS_ACCESS_KEY_ID"):
        credentials = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
    client = make_client(
        endpoint_url=endpoint,
        region_name=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
        **credentials,
    )
    executor = DynamoExecutor(2)
    cp = DynamoCheckpointer[Any](client, table, clock_skew=0.0, executor=executor)
    leases = DynamoLeaseManager(client, table, clock_skew=0.0, executor=executor)
    await asyncio.sleep(max(0.0, start_at - time.time()))
    done = conflicts = busy = 0
    started = time.monotonic()
    while done < saves:
        lease: Lease | None = None
        if mode == "lease":
            try:
                lease = await leases.acquire(thread_id, name, 10.0)
            except ThreadLeaseBusyError:
                busy += 1
                await asyncio.sleep(0.001)
                continue
        try:
            try:
                head, revision = await cp.load(thread_id)
                count = int(head.state["count"])
            except ThreadNotFoundError:
                revision, count = 0, 0
            snapshot: Snapshot[Any] = Snapshot(
                thread_id=thread_id,
                state={"count": count + 1, "by": name},
                execution_pointer="step",
                write_id=new_write_id(),
            )
            try:
                await cp.save(revision, snapshot, lease=lease)
                done += 1
            except ConcurrencyConflictError:
                conflicts += 1
        finally:
            if lease is not None:
                await leases.release(lease)
    executor.close()
    return {
        "name": name,
        "saves": done,
        "conflicts": conflicts,
        "busy": busy,
        "seconds": round(time.monotonic() - started, 3),
    }


def main(argv: list[str]) -> None:
    endpoint, table, thread_id, saves, mode, start_at, name = argv
    summary = asyncio.run(race(endpoint, table, thread_id, int(saves), mode, float(start_at), name))
    print(json.dumps(summary))


if __name__ == "__main__":
    main(sys.argv[1:])
