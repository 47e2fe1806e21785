"""One OS process of the two-process race in ``test_dynamodb_hazards`` (not a test).

Usage: ``python dynamo_race_worker.py URL THREAD_ID SAVES MODE START_AT NAME``.
It waits until the epoch second ``START_AT``, then performs ``SAVES`` successful
read-modify-write increments of the thread's counter, retrying every conflict; with
MODE ``lease`` each increment runs under a fenced lease. Prints a JSON summary.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import flowy
from flowy.errors import ConcurrencyConflictError, ThreadLeaseBusyError, ThreadNotFoundError
from flowy.storage import Lease, Snapshot
from flowy.storage.dialect import new_write_id


async def race(
    url: str, thread_id: str, saves: int, mode: str, start_at: float, name: str
) -> dict[str, Any]:
    backend = await flowy.connect(url)
    cp, leases = backend.checkpointer, backend.leases
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
    await backend.aclose()
    return {
        "name": name,
        "saves": done,
        "conflicts": conflicts,
        "busy": busy,
        "seconds": round(time.monotonic() - started, 3),
    }


def main(argv: list[str]) -> None:
    url, thread_id, saves, mode, start_at, name = argv
    summary = asyncio.run(race(url, thread_id, int(saves), mode, float(start_at), name))
    print(json.dumps(summary))


if __name__ == "__main__":
    main(sys.argv[1:])
