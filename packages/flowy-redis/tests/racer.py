"""A worker process for the two-process race test (run as a script, not collected).

Usage: ``python racer.py STORE_URL THREAD_ID WORKER ROUNDS START_AT`` (the store URL as
``flowy.connect`` takes it).
Each round appends the worker's name to the state list: half the rounds under a lease
(acquire, load, fenced save, release), half with plain strict OCC; conflicts and busy
leases are retried. Prints the number of rounds done.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import flowy
from flowy import ConcurrencyConflictError, ThreadLeaseBusyError, ThreadNotFoundError
from flowy.storage import Backend, Snapshot
from flowy.storage.dialect import new_write_id


async def _round(backend: Backend[Any], thread_id: str, worker: str, leased: bool) -> None:
    while True:
        lease = None
        try:
            if leased:
                lease = await backend.leases.acquire(thread_id, worker, 5.0)
            try:
                head, revision = await backend.checkpointer.load(thread_id)
                state = list(head.state)
            except ThreadNotFoundError:
                revision, state = 0, []
            snapshot = Snapshot(thread_id, [*state, worker], "step", write_id=new_write_id())
            await backend.checkpointer.save(revision, snapshot, lease=lease)
            return
        except (ConcurrencyConflictError, ThreadLeaseBusyError):
            await asyncio.sleep(0)
        finally:
            if lease is not None:
                await backend.leases.release(lease)


async def main(argv: list[str]) -> None:
    url, thread_id, worker, rounds, start_at = argv
    async with flowy.connect(url) as backend:
        await asyncio.sleep(max(0.0, float(start_at) - time.time()))
        for index in range(int(rounds)):
            await _round(backend, thread_id, worker, leased=index % 2 == 0)
        print(rounds)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
