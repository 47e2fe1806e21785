"""A store that goes away and comes back under a working ``flowy worker`` process.

300 hand-offs are queued; a worker process drains them through a TCP proxy in front of
the real server (PostgreSQL, Redis). Midway the proxy cuts every connection and refuses
new ones for a few seconds, as a server restart would; the shared server itself is never
touched. Every thread completes once, and the last one within a few seconds of the store
coming back: an ack or release that failed while it was away goes through when it
answers, instead of its message waiting out the visibility timeout (4 × the lease TTL).

The one exception, which no worker can avoid: a claim that went through on the server
while its reply was lost hides its messages until their visibility timeout (20 s here)
runs out. The worker's output shows them (their first delivery it sees is the second);
they must complete too, but are not held to the few seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import re
import sys
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

import flowy
from flowy.storage import Backend
from flowy.testing.backends import backend_missing, port_open

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[1]
HANDOFFS = int(os.environ.get("FLOWY_OUTAGE_HANDOFFS", "300"))
"""Hand-offs queued (``make verify-stress`` runs more, with more outages)."""
OUTAGES = int(os.environ.get("FLOWY_OUTAGES", "1"))
"""How many times the store goes away, spread over the drain."""
OUTAGE = 3.0
GRAPH = "test_store_outage:graph"
State = dict[str, Any]


def _merge(state: State, update: State) -> State:
    return {**state, **update}


def graph() -> flowy.Graph[State, Any]:
    """``start`` hands off to ``finish``, which a worker runs."""

    async def start(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {}, flowy.handoff("to_worker", resume_at="finish")

    async def finish(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {"finished": True}, flowy.end()

    builder: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(_merge)
    builder.add_node("start", start).add_node("finish", finish).add_edge("start", "finish")
    builder.allow_no_outgoing_route("finish")
    return builder.compile(version="outage")


class OutageProxy:
    """A TCP proxy to ``host:port`` that can cut every connection and refuse new ones
    (``down()``) until ``up()``."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.listening = 0
        self.is_down = False
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def url(self, url: str) -> str:
        """``url`` with its host and port replaced by this proxy's."""
        parts = urlsplit(url)
        userinfo = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
        return urlunsplit(parts._replace(netloc=f"{userinfo}127.0.0.1:{self.listening}"))

    async def __aenter__(self) -> OutageProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.listening = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        self._cut()
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        await self._server.wait_closed()

    def down(self) -> None:
        """Cut every connection; refuse new ones."""
        self.is_down = True
        self._cut()

    def up(self) -> None:
        """Accept connections again."""
        self.is_down = False

    def _cut(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.is_down:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))
        self._spawn(self._pump(reader, up_writer))
        self._spawn(self._pump(up_reader, writer))

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            self._writers.discard(writer)
            writer.transport.abort()


def _makers() -> Any:
    spec = importlib.util.spec_from_file_location(
        "stress_stores_script", ROOT / "scripts" / "stress_stores.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.MAKERS


def _unusual(output: str) -> str:
    """The worker's lines other than claims, acks and the steps of runs that went well."""
    usual = ("⇣", "✓", "▸", "■", "[t")
    return "\n".join(line for line in output.splitlines() if not line.strip().startswith(usual))


async def _completed(backend: Backend[Any]) -> set[str]:
    done: set[str] = set()
    after: str | None = None
    while True:
        page = await backend.checkpointer.list_threads(limit=500, after=after)
        done.update(t.thread_id for t in page if t.status is flowy.RunStatus.COMPLETED)
        if len(page) < 500:
            return done
        after = page[-1].thread_id


def _claim_lost(output: str) -> set[str]:
    """Threads whose first delivery the worker never saw: a claim that took it went
    through on the server while the store's reply was lost in the outage. Nothing can
    tell a worker which messages such a claim hid, so they come back when their
    visibility timeout runs out."""
    first: dict[str, int] = {}
    for match in re.finditer(r"⇣ (t\d+)@\d+ delivery (\d+)", output):
        thread, delivery = match[1], int(match[2])
        first[thread] = min(first.get(thread, delivery), delivery)
    return {thread for thread, delivery in first.items() if delivery > 1}


async def _enqueue(backend: Backend[Any], threads: list[str]) -> None:
    runner = flowy.Runner(graph(), backend)
    gate = asyncio.Semaphore(16)

    async def one(thread: str) -> None:
        async with gate:
            result = await runner.start(thread, {})
            assert result.status is flowy.RunStatus.HANDOFF, result

    await asyncio.gather(*(one(t) for t in threads))


@pytest.mark.parametrize(("store", "port"), [("postgres", 5432), ("redis", 6379)])
async def test_a_store_outage_under_a_worker_holds_no_message_back(
    store: str, port: int, tmp_path: Path
) -> None:
    if not port_open("127.0.0.1", port):
        backend_missing(f"no {store} server on 127.0.0.1:{port}")
    threads = [f"t{i}" for i in range(HANDOFFS)]
    async with (
        _makers()[store]() as url,
        OutageProxy("127.0.0.1", port) as proxy,
        flowy.connect(url) as backend,
    ):
        await _enqueue(backend, threads)
        env = {**os.environ, "PYTHONPATH": str(ROOT / "tests"), "PYTHONIOENCODING": "utf-8"}
        env.pop("FLOWY_BACKEND", None)
        out, err = tmp_path / "worker.out", tmp_path / "worker.err"
        with out.open("w") as stdout, err.open("w") as stderr:
            worker = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "flowy.cli", "worker", "--graph", GRAPH,
                "--backend", proxy.url(url), "--concurrency", "8", "--poll-interval", "0.1",
                "--recovery-interval", "0", "--lease-ttl", "5", env=env, stdout=stdout,
                stderr=stderr,
            )  # fmt: skip
        try:
            deadline = time.monotonic() + 60 + HANDOFFS / 10
            left = HANDOFFS
            for outage in range(OUTAGES):
                # The first outage after a fifth of them, the last before three quarters.
                cut_at = HANDOFFS // 5 + outage * (HANDOFFS // 2) // OUTAGES
                while (done := len(await _completed(backend))) < cut_at:
                    assert worker.returncode is None, err.read_text()
                    assert time.monotonic() < deadline, "the worker does not get through them"
                    await asyncio.sleep(0.05)
                left = HANDOFFS - done
                proxy.down()
                await asyncio.sleep(OUTAGE)
                proxy.up()
            back = time.monotonic()
            finished: dict[str, float] = {}
            wait = 30 + left / 50
            while len(finished) < HANDOFFS:
                now = time.monotonic() - back
                for thread in await _completed(backend):
                    finished.setdefault(thread, now)
                assert now < wait, (
                    f"{len(finished)} of {HANDOFFS} completed {wait:.0f}s after the store came "
                    "back; "
                    f"not {sorted(set(threads) - set(finished))}\n"
                    + _unusual(out.read_text() + err.read_text())
                )
                await asyncio.sleep(0.1)
        finally:
            if worker.returncode is None:
                worker.terminate()
                await worker.wait()
        output = out.read_text() + err.read_text()
        assert "Traceback" not in output, _unusual(output)
        lost = _claim_lost(output)
        last = max(t for thread, t in finished.items() if thread not in lost)
        print(
            f"{store}: the last thread finished {last:.1f}s after the store came back "
            f"(claims whose reply was lost: {sorted(lost)})"
        )
        assert last < 10.0 + left / 100, (
            f"the last thread finished {last:.1f}s after the store came back\n{_unusual(output)}"
        )
        assert len(lost) <= 8 * OUTAGES, lost  # one claim's reply per outage (--concurrency 8)
        for thread in threads:
            history = await backend.checkpointer.get_history(thread, 100)
            ends = [s for s in history if s.status is flowy.RunStatus.COMPLETED]
            assert len(ends) == 1, (thread, [s.status for s in history])
