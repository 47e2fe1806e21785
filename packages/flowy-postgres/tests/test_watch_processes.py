"""A watcher in this process follows a thread that a worker in another process runs:
every snapshot, and the progress the worker's node sends, through PostgreSQL's
``LISTEN/NOTIFY`` (``PostgresBackend._publish`` / ``_subscribe``)."""

from __future__ import annotations

import asyncio
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any, cast

import pytest

import flowy
from flowy.storage import RunStatus

pytestmark = pytest.mark.anyio

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


async def test_progress_of_a_worker_process_reaches_a_watcher(
    flowy_url: str, tmp_path: Path
) -> None:
    await follow_a_worker_process(flowy_url, tmp_path)


async def test_progress_resumes_after_the_listening_connection_is_lost(
    flowy_url: str, postgres_dsn: str
) -> None:
    import asyncpg

    thread_id = f"lost-{uuid.uuid4().hex}"
    gate = asyncio.Event()

    def merge(s: dict[str, Any], u: dict[str, Any]) -> dict[str, Any]:
        return {**s, **u}

    async def first(s: dict[str, Any]) -> tuple[dict[str, Any], flowy.Directive[Any]]:
        return {"first": True}, flowy.completed()

    async def talk(s: dict[str, Any]) -> tuple[dict[str, Any], flowy.Directive[Any]]:
        await gate.wait()
        for i in range(5):
            flowy.live.progress(i)
        return {"said": 5}, flowy.completed()

    b: flowy.GraphBuilder[dict[str, Any], Any] = flowy.GraphBuilder(merge)
    b.add_node("first", first).add_node("talk", talk).add_edge("first", "talk")
    b.allow_no_outgoing_route("talk")
    graph = b.compile(save_every_step=True)
    async with await flowy.connect(flowy_url) as watcher, await flowy.connect(flowy_url) as runs:
        events: list[Any] = []

        async def follow() -> None:
            async for event in watcher.watch(thread_id, after=0, poll=0.05):
                events.append(event.data if event.kind == "progress" else event.revision)
                if event.kind == "snapshot":
                    gate.set()

        watching = asyncio.ensure_future(follow())
        live_channels: Any = cast(Any, watcher)._live
        async with asyncio.timeout(30):
            while live_channels._conn is None:  # noqa: ASYNC110 - the watch's own task sets it
                await asyncio.sleep(0.01)
            # The server drops the listening session (a restart, a pooler, a timeout).
            admin: Any = await cast(Any, asyncpg).connect(postgres_dsn)
            try:
                pid = live_channels._conn.get_server_pid()
                await admin.execute("SELECT pg_terminate_backend($1)", pid)
            finally:
                await admin.close()
            while not live_channels._conn.is_closed():  # noqa: ASYNC110 - asyncpg notices
                await asyncio.sleep(0.01)
            await flowy.Runner(graph, store=runs).start(thread_id, {})
            await watching
    assert events == [1, 0, 1, 2, 3, 4, 2]
