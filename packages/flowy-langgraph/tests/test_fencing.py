"""Two real LangGraph invocations on one thread, from two processes at once, on every
store two processes can share (SQLite, PostgreSQL, Redis, DynamoDB).

Unfenced, ``FlowySaver`` behaves like LangGraph's own savers: both invocations succeed,
the thread's history forks (two checkpoints with the same parent) and the latest state
silently lacks one writer's step. Fenced, exactly one invocation wins; the other fails
with ``ThreadForkedError`` and the history stays one line.
"""

from __future__ import annotations

import asyncio
import collections
import os
import sys
import uuid
from pathlib import Path

import pytest
from lg_race_worker import build

from flowy_langgraph import FlowySaver

pytestmark = pytest.mark.anyio

WORKER = Path(__file__).resolve().parent / "lg_race_worker.py"


async def race(url: str, thread: str, folder: Path, fenced: bool) -> dict[str, tuple[int, str]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    mode = "fenced" if fenced else "unfenced"
    procs = {
        name: await asyncio.create_subprocess_exec(
            sys.executable,
            str(WORKER),
            url,
            thread,
            name,
            str(folder),
            mode,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        for name in ("a", "b")
    }
    out: dict[str, tuple[int, str]] = {}
    for name, proc in procs.items():
        stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout=180)
        assert proc.returncode in (0, 3), stderr.decode()
        out[name] = (proc.returncode, stdout.decode().strip())
    return out


async def history(saver: FlowySaver, thread: str) -> tuple[list[str], dict[str | None, int]]:
    """The latest messages of ``thread`` and how many checkpoints each parent has."""
    config = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    children: collections.Counter[str | None] = collections.Counter()
    async for tup in saver.alist(config):  # pyright: ignore[reportArgumentType]
        parent = tup.parent_config["configurable"]["checkpoint_id"] if tup.parent_config else None
        children[parent] += 1
    latest = await saver.aget_tuple(config)  # pyright: ignore[reportArgumentType]
    assert latest is not None
    return list(latest.checkpoint["channel_values"]["messages"]), dict(children)


@pytest.mark.parametrize("store_url", ["sqlite", "postgres", "redis", "dynamodb"], indirect=True)
@pytest.mark.parametrize("fenced", [False, True], ids=["unfenced", "fenced"])
async def test_two_processes_on_one_thread(store_url: str, fenced: bool, tmp_path: Path) -> None:
    thread = f"race-{uuid.uuid4().hex[:8]}"
    async with FlowySaver.from_url(store_url, fenced=fenced) as saver:
        graph = build("start", tmp_path, "start").compile(checkpointer=saver)
        await graph.ainvoke({"messages": []}, {"configurable": {"thread_id": thread}})
        for name in ("a", "b"):
            (tmp_path / f"ready-{name}").unlink(missing_ok=True)

        results = await race(store_url, thread, tmp_path, fenced)
        messages, children = await history(saver, thread)

    winners = [n for n, (code, _) in results.items() if code == 0]
    forks = {p: n for p, n in children.items() if n > 1}
    print(f"{'fenced' if fenced else 'unfenced'}: {results}; latest {messages}; forks {forks}")
    if not fenced:
        # The silent fork LangGraph's own savers give: both succeed, one step is lost.
        assert sorted(winners) == ["a", "b"]
        assert forks, children
        assert messages.count("a") + messages.count("b") == 1, messages
    else:
        assert len(winners) == 1, results
        (loser,) = {"a", "b"} - set(winners)
        assert results[loser][1].startswith("forked: "), results  # ThreadForkedError
        assert not forks, children
        assert messages == ["start", winners[0]], messages
