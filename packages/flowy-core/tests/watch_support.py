"""What the PostgreSQL and Redis tests of a watcher in another process than the run
share: a worker script whose node sends progress, and the watcher that follows it."""

from __future__ import annotations

import asyncio
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import flowy
from flowy.storage import RunStatus

WORKER = textwrap.dedent(
    """
    import asyncio, sys
    import flowy
    from flowy import live

    def merge(s, u):
        return {**s, **u}

    async def first(s):
        return {"first": True}, flowy.completed()

    async def talk(s):
        sys.stdin.readline()  # the watcher has seen the first snapshot: talk
        for i in range(10):
            live.progress({"token": i})
            await asyncio.sleep(0.01)
        return {"said": 10}, flowy.completed()

    async def main(url, thread_id):
        b = flowy.GraphBuilder(merge)
        b.add_node("first", first).add_node("talk", talk).add_edge("first", "talk")
        b.allow_no_outgoing_route("talk")
        async with await flowy.connect(url) as backend:
            runner = flowy.Runner(b.compile(save_every_step=True), store=backend)
            result = await runner.start(thread_id, {})
            print(result.status.value, flush=True)

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)


async def follow_a_worker_process(url: str, tmp_path: Path) -> None:
    """Run the worker in a process of its own; watch it from here."""
    script = tmp_path / "live_worker.py"
    script.write_text(WORKER)
    thread_id = f"live-{uuid.uuid4().hex}"
    async with await flowy.connect(url) as backend:
        assert backend.capabilities.live_progress
        events: list[tuple[str, Any]] = []
        worker = await asyncio.create_subprocess_exec(
            sys.executable, str(script), url, thread_id,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert worker.stdin is not None and worker.stdout is not None
        try:
            async with asyncio.timeout(60):
                async for event in backend.watch(thread_id, after=0):
                    if event.kind == "snapshot":
                        assert event.snapshot is not None
                        events.append(("snapshot", event.snapshot.status))
                        if event.revision == 1:
                            worker.stdin.write(b"go\n")
                            await worker.stdin.drain()
                    else:
                        events.append(("progress", event.data))
                assert (await worker.stdout.readline()).strip() == b"completed"
        finally:
            if worker.returncode is None:
                worker.kill()
            await worker.wait()
    assert events == [
        ("snapshot", RunStatus.RUNNING),
        *(("progress", {"token": i}) for i in range(10)),
        ("snapshot", RunStatus.COMPLETED),
    ]
