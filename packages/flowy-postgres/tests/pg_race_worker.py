"""One worker process of the two-process race test (run by test_hazards.py).

Usage: python pg_race_worker.py URL THREAD_ID NAME SAVES

Opens the store at URL (a pool of its own), prints ``ready``, waits for ``go`` on stdin,
then saves SAVES snapshots on THREAD_ID: load the head, save at its revision, and on a
conflict load again. Prints ``done <conflicts>``.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import flowy
from flowy.errors import ConcurrencyConflictError, ThreadNotFoundError
from flowy.storage import Snapshot


async def main(url: str, thread_id: str, name: str, saves: int) -> None:
    async with flowy.connect(url) as backend:
        checkpointer = backend.checkpointer
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        conflicts = 0
        done = 0
        while done < saves:
            try:
                _, revision = await checkpointer.load(thread_id)
            except ThreadNotFoundError:
                revision = 0
            snapshot = Snapshot[dict[str, Any]](
                thread_id=thread_id,
                state={"writer": name, "n": done},
                execution_pointer=f"{name}-{done}",
            )
            try:
                await checkpointer.save(revision, snapshot)
            except ConcurrencyConflictError:
                conflicts += 1
                continue
            done += 1
    print(f"done {conflicts}", flush=True)


if __name__ == "__main__":
    url, thread_id, name, saves = sys.argv[1:5]
    asyncio.run(main(url, thread_id, name, int(saves)))
