"""A watcher in this process follows a thread that a worker in another process runs:
every snapshot, and the progress the worker's node sends, through PostgreSQL's
``LISTEN/NOTIFY`` (``PostgresBackend._publish`` / ``_subscribe``)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any, cast

import pytest
from watch_support import follow_a_worker_process

import flowy

pytestmark = pytest.mark.anyio


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
