"""``flowy watch THREAD``: each saved snapshot and the progress between them, until the
thread completes (exit 0) or fails (exit 1); ``--after``, ``--json``; on every store a
process can open, and live, with progress, from a run in another process on the stores
that carry it (``cli/_watch.py``)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from cli_support import TESTS_DIR, assert_one_line_error, run_flowy
from stores_support import SHARED_STORES, Store, environment, fresh_store
from stores_support import dynamodb_endpoint as dynamodb_endpoint  # a fixture

import flowy
from flowy import live

State = dict[str, Any]


@pytest.fixture(params=SHARED_STORES)
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    """A fresh, empty store of each kind, by URL."""
    with fresh_store(request, "watch") as made:
        yield made


def _merge(state: State, update: State) -> State:
    return {**state, **update}


def _graph(gate: asyncio.Event | None = None, *, fails: bool = False) -> flowy.Graph[State, Any]:
    """``first`` saves; ``talk`` (after ``gate``) sends three tokens, then completes or
    fails."""

    async def first(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {"first": True}, flowy.completed()

    async def talk(s: State) -> tuple[State, flowy.Directive[Any]]:
        if gate is not None:
            await gate.wait()
        for token in ("one", "two", "three"):
            live.progress({"token": token})
        return {"said": 3}, flowy.fail("broken") if fails else flowy.completed()

    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(_merge)
    b.add_node("first", first).add_node("talk", talk).add_edge("first", "talk")
    b.allow_no_outgoing_route("talk")
    return b.compile(save_every_step=True)


async def _run(url: str, thread_id: str, **kw: Any) -> flowy.RunResult[State, Any]:
    async with await flowy.connect(url) as backend:
        return await flowy.Runner(_graph(**kw), store=backend).start(thread_id, {})


def test_watch_prints_every_snapshot_then_ends(store: Store) -> None:
    with environment(store):
        asyncio.run(_run(store.url, "done"))
        asyncio.run(_run(store.url, "broken", fails=True))
    proc = store.flowy("watch", "done", "--after", "0")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split()[:4] for line in lines] == [
        ["revision", "1", "·", "running"],
        ["revision", "2", "·", "completed"],
    ]
    proc = store.flowy("watch", "done", "--after", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    [event] = [json.loads(line) for line in proc.stdout.splitlines()]
    assert (event["kind"], event["revision"], event["status"]) == ("snapshot", 2, "completed")
    assert event["state"] == {"first": True, "said": 3}
    failed = store.flowy("watch", "broken")
    assert failed.returncode == 1, failed.stderr
    assert failed.stdout.split()[:4] == ["revision", "2", "·", "failed"]


@pytest.mark.parametrize("after", ["-1", "x", "1.5"])
def test_a_bad_after_is_a_usage_error(after: str) -> None:
    proc = run_flowy("watch", "t", "--backend", "memory://", "--after", after)
    assert_one_line_error(proc, 2, "--after")


@pytest.mark.anyio
@pytest.mark.parametrize("store", ["postgres", "redis"], indirect=True)
async def test_watch_follows_a_run_of_another_process_with_its_progress(store: Store) -> None:
    thread_id = f"live-{uuid.uuid4().hex}"
    env = {**os.environ, **store.env, "PYTHONPATH": str(TESTS_DIR), "PYTHONIOENCODING": "utf-8"}
    env.pop("NO_COLOR", None)
    watcher = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "flowy.cli", "watch", thread_id, "--after", "0",
        "--backend", store.url, "--json", env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert watcher.stdout is not None
    gate = asyncio.Event()
    events: list[dict[str, Any]] = []

    async def read() -> None:
        assert watcher.stdout is not None
        async for line in watcher.stdout:
            events.append(json.loads(line))
            if events[-1]["kind"] == "snapshot":
                gate.set()  # the watcher listens: let the node talk

    try:
        async with asyncio.timeout(60):
            reading = asyncio.ensure_future(read())
            with environment(store):
                result = await _run(store.url, thread_id, gate=gate)
            assert result.status is flowy.RunStatus.COMPLETED
            await reading
            assert await watcher.wait() == 0
    finally:
        if watcher.returncode is None:
            watcher.kill()
            await watcher.wait()
    assert [(e["kind"], e.get("status") or e["data"]) for e in events] == [
        ("snapshot", "running"),
        ("progress", {"token": "one"}),
        ("progress", {"token": "two"}),
        ("progress", {"token": "three"}),
        ("snapshot", "completed"),
    ]
    assert {e["node"] for e in events if e["kind"] == "progress"} == {"talk"}
