"""Ctrl-C in the ``flowy`` commands that run graphs: the real process gets SIGINT while
a node blocks, saves the cancel snapshot and lets go of the lease before its store
closes, so the thread is resumable at once (not after a lease TTL) and nothing fails.

The graph the processes load is ``test_cli_interrupt:blocking_graph``: ``start`` hands
off (or, with ``BLOCK_SUSPEND=1``, suspends) to ``stall``, which touches the file named
by ``BLOCK_MARKER`` and then waits for ever.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from http.cookiejar import CookieJar
from pathlib import Path
from typing import Any

import pytest
from cli_support import TESTS_DIR
from stores_support import Store, environment, fresh_store
from stores_support import dynamodb_endpoint as dynamodb_endpoint  # a fixture

import flowy
from flowy.testing import Scenario

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

GRAPH = "test_cli_interrupt:blocking_graph"
State = dict[str, Any]


def _merge(state: State, update: State) -> State:
    return {**state, **update}


def blocking_graph() -> flowy.Graph[State, Any]:
    """``start`` → ``stall`` (blocks for ever once it has touched ``BLOCK_MARKER``)."""

    async def start(s: State) -> tuple[State, flowy.Directive[Any]]:
        if os.environ.get("BLOCK_SUSPEND") == "1":
            return {}, flowy.suspend("before_stall", resume_at="stall")
        return {}, flowy.handoff("to_worker", resume_at="stall")

    async def stall(s: State) -> tuple[State, flowy.Directive[Any]]:
        await asyncio.to_thread(Path(os.environ["BLOCK_MARKER"]).touch)
        await asyncio.Event().wait()  # not a sleep: the checker's clock skips those
        return {}, flowy.end()

    builder: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(_merge)
    builder.add_node("start", start).add_node("stall", stall).add_edge("start", "stall")
    builder.allow_no_outgoing_route("stall")
    return builder.compile(version="blocking")


@pytest.fixture(params=["sqlite", "postgres", "redis"])
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    """A fresh store of each kind (SQLite and two servers)."""
    with fresh_store(request, "sigint") as made:
        yield made


async def _start(url: str, thread: str, *, suspend: bool) -> str:
    """Start ``thread`` (it suspends or hands off before ``stall``); its resume token."""
    os.environ["BLOCK_SUSPEND"] = "1" if suspend else "0"
    try:
        async with flowy.connect(url) as backend:
            result = await flowy.Runner(blocking_graph(), backend).start(thread, {})
            return str(result.resume_token)
    finally:
        os.environ.pop("BLOCK_SUSPEND", None)


async def _after(url: str, thread: str) -> tuple[flowy.storage.Snapshot[Any], object]:
    async with flowy.connect(url) as backend:
        head, _ = await backend.checkpointer.load(thread)
        return head, await backend.leases.holder(thread)


def _interrupt(
    store: Store,
    marker: Path,
    *args: str,
    signals: int = 1,
    ready: str = "",
    backend: bool = True,
    then: Callable[[str], object] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``flowy ARGS --backend URL``; once ``marker`` exists (or, with ``ready``, once
    that text is on standard output), send SIGINT ``signals`` times (a second apart) and
    wait for the process to end. With ``then``, once ``ready`` is printed, ``then(output)``
    runs in a thread of its own and the marker is waited for after all."""
    env = {
        **os.environ,
        **store.env,
        "PYTHONPATH": str(TESTS_DIR),
        "PYTHONIOENCODING": "utf-8",
        "PYTHONUNBUFFERED": "1",
        "BLOCK_MARKER": str(marker),
    }
    env.pop("FLOWY_BACKEND", None)
    command = [sys.executable, "-m", "flowy.cli", *args]
    if backend:
        command += ["--backend", store.url]
    lines: list[str] = []
    errors: list[str] = []
    with subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        encoding="utf-8",
    ) as proc:  # fmt: skip
        stdout, stderr = proc.stdout, proc.stderr
        assert stdout is not None and stderr is not None
        reader = threading.Thread(target=lambda: lines.extend(iter(stdout.readline, "")))
        err_reader = threading.Thread(target=lambda: errors.append(stderr.read()))
        reader.start()
        err_reader.start()
        try:
            deadline = time.monotonic() + 30
            while not (ready in "".join(lines) if ready else marker.exists()):
                assert proc.poll() is None, "".join(lines) + "".join(errors)
                assert time.monotonic() < deadline, "the node never started"
                time.sleep(0.02)
            if then is not None:
                threading.Thread(target=then, args=("".join(lines),), daemon=True).start()
                while not marker.exists():
                    assert proc.poll() is None, "".join(lines)
                    assert time.monotonic() < deadline, "the node never started"
                    time.sleep(0.02)
            for i in range(signals):
                if i:
                    time.sleep(1.0)
                proc.send_signal(signal.SIGINT)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            reader.join()
            err_reader.join()
    return subprocess.CompletedProcess(proc.args, proc.returncode, "".join(lines), "".join(errors))


def _assert_let_go(
    store: Store,
    thread: str,
    proc: subprocess.CompletedProcess[str],
    *,
    pointer: str | None = "stall",
) -> None:
    """The thread is saved as cancelled (at ``pointer``) and nobody holds it: resumable
    now."""
    assert "failed" not in proc.stderr + proc.stdout, proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    with environment(store):
        head, holder = asyncio.run(_after(store.url, thread))
    assert holder is None, holder
    assert head.status is flowy.RunStatus.CANCELED, head
    if pointer is not None:
        assert head.execution_pointer == pointer


def test_ctrl_c_in_resume_saves_and_lets_go(store: Store, tmp_path: Path) -> None:
    with environment(store):
        token = asyncio.run(_start(store.url, "t1", suspend=True))
    proc = _interrupt(store, tmp_path / "marker", "resume", token, "--graph", GRAPH)
    assert proc.returncode == 130, proc
    _assert_let_go(store, "t1", proc)


def test_ctrl_c_in_demo_saves_and_lets_go(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    store = Store("sqlite", f"sqlite:///{db}")
    proc = _interrupt(
        store, tmp_path / "marker", "demo", "--db", str(db), ready="▸ step", backend=False
    )
    assert proc.returncode == 130, proc
    _assert_let_go(store, "refund-A1001", proc, pointer=None)


async def _redelivered(url: str) -> list[int]:
    async with flowy.connect(url) as backend:
        return [m.attempts for m in await backend.consumer.claim(10, 30.0)]


def test_ctrl_c_twice_in_worker_stops_the_run_and_gives_the_message_back(
    store: Store, tmp_path: Path
) -> None:
    with environment(store):
        asyncio.run(_start(store.url, "t1", suspend=False))
    proc = _interrupt(
        store, tmp_path / "marker", "worker", "--graph", GRAPH, "--poll-interval", "0.1",
        signals=2,
    )  # fmt: skip
    assert proc.returncode == 130, proc
    assert "Ctrl-C again stops them now" in proc.stdout
    _assert_let_go(store, "t1", proc)
    with environment(store):
        assert asyncio.run(_redelivered(store.url)) == [2]  # at once, not after the timeout


def _resume_through_the_ui(thread: str, revision: int) -> Callable[[str], object]:
    """Open the page of ``thread`` with the printed URL, then post its resume form (the
    request stays open while the resumed node blocks)."""

    def post(output: str) -> None:
        match = re.search(r"open (http://\S+)/\?token=(\S+)", output)
        assert match is not None, output
        base, token = match[1], match[2]
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(CookieJar()))
        for _ in range(100):  # the server listens a moment after it printed the URL
            try:
                page = opener.open(f"{base}/threads/{thread}?token={token}", timeout=10).read()
                break
            except urllib.error.URLError:
                time.sleep(0.1)
        else:
            raise AssertionError("the inspector never answered")
        csrf = re.search(rb"name='csrf' value='([^']+)'", page)
        assert csrf is not None, page[:2000]
        form = {"thread": thread, "revision": str(revision), "csrf": csrf[1].decode()}
        with contextlib.suppress(OSError):  # the server goes away before it answers
            opener.open(f"{base}/actions/resume", urllib.parse.urlencode(form).encode(), 60)

    return post


def test_ctrl_c_in_ui_stops_a_resume_it_runs(store: Store, tmp_path: Path) -> None:
    pytest.importorskip("uvicorn", reason="flowy ui needs the ui extra")
    with environment(store):
        asyncio.run(_start(store.url, "t1", suspend=True))
    proc = _interrupt(
        store, tmp_path / "marker", "ui", "--graph", GRAPH, "--port", "0",
        ready="Ctrl-C stops it", then=_resume_through_the_ui("t1", 1),
    )  # fmt: skip
    assert proc.returncode == 130, proc
    _assert_let_go(store, "t1", proc)


def blocking_scenario() -> Scenario[State]:
    """The crash-safety checker's story of ``blocking_graph``: it hands off to a node
    that never ends."""
    return Scenario(state={})


def test_ctrl_c_in_check_stops_its_runs(tmp_path: Path) -> None:
    store = Store("sqlite", f"sqlite:///{tmp_path / 'unused.db'}")
    proc = _interrupt(
        store, tmp_path / "marker", "check", GRAPH, "--scenario",
        "test_cli_interrupt:blocking_scenario", "--seeds", "3", backend=False,
    )  # fmt: skip
    assert proc.returncode == 130, proc
    assert "failed" not in proc.stderr + proc.stdout, proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr


def test_ctrl_c_in_worker_once_stops_the_run_and_gives_the_message_back(
    store: Store, tmp_path: Path
) -> None:
    with environment(store):
        asyncio.run(_start(store.url, "t1", suspend=False))
    proc = _interrupt(store, tmp_path / "marker", "worker", "--graph", GRAPH, "--once")
    assert proc.returncode == 130, proc
    _assert_let_go(store, "t1", proc)
    with environment(store):
        assert asyncio.run(_redelivered(store.url)) == [2]
