"""Helpers of the ``flowy`` command's tests: run the command as a real process, check
one-line errors, and fill a store (any store, by URL) with threads in every state.

Graphs the subprocesses load live here too (``cli_support:failing_graph``, …); the
tests directory is on their ``PYTHONPATH``.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from core_graphs import State, approval_graph, merge

import flowy

TESTS_DIR = Path(__file__).resolve().parent
GRAPH = "core_graphs:approval_graph"
DEAD_ERROR = "card declined by the gateway"


def require_ui_extra(*modules: str) -> None:
    """Import the ``ui`` extra's ``modules`` or skip the test module; under
    ``FLOWY_REQUIRE_BROWSER=1`` (CI) a missing one is an error, not a skip."""
    for name in modules:
        if os.environ.get("FLOWY_REQUIRE_BROWSER") == "1":
            importlib.import_module(name)
        else:
            pytest.importorskip(
                name, reason=f"{name} comes with the ui extra: pip install 'flowy-core[ui]'"
            )


def run_flowy(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m flowy.cli ARGS`` with the tests directory importable."""
    full_env = {**os.environ, "PYTHONPATH": str(TESTS_DIR), "PYTHONIOENCODING": "utf-8"}
    full_env.pop("NO_COLOR", None)
    full_env.pop("FLOWY_BACKEND", None)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "flowy.cli", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=timeout,
        check=False,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    """``proc`` failed with exit status ``code`` and one line on standard error, naming
    every one of ``needles``, and printed nothing on standard output."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("flowy"), lines
    assert ": error: " in lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert proc.stdout == ""


@dataclass(frozen=True)
class Threads:
    """What :func:`populate` made: a suspended thread ``susp``, an enqueued hand-off
    ``ho`` (one live outbox message), an orphaned hand-off ``orph`` and a hand-off
    ``dl`` whose message was dead-lettered (with ``DEAD_ERROR``)."""

    susp_revision: int
    handoff_revision: int
    orphan_revision: int
    dead_revision: int
    dead_message_id: str
    max_attempts: int


async def populate(url: str) -> Threads:
    """Fill the store at ``url`` (through ``flowy.connect``) with :class:`Threads`."""
    async with flowy.connect(url) as backend:
        runner = flowy.Runner(approval_graph(), backend, run_lease=("setup", 5.0))
        # First the thread whose message dies: the consumer claims oldest first.
        dl = await runner.start("dl", {})
        assert dl.resume_token is not None
        dl = await runner.resume(dl.resume_token, state_overlay={"approved": True})
        consumer = backend.consumer
        dead_id = ""
        for _ in range(consumer.max_attempts):
            (message,) = await consumer.claim(1, 30)
            dead_id = message.message_id
            await consumer.release(message, error=DEAD_ERROR)
        assert [d.message_id for d in await consumer.dead_letters()] == [dead_id]
        susp = await runner.start("susp", {})
        ho = await runner.start("ho", {})
        assert ho.resume_token is not None
        ho = await runner.resume(ho.resume_token, state_overlay={"approved": True})
        await runner.start("orph", {})
        snap, revision = await backend.checkpointer.load("orph")
        orphan = replace(
            snap,
            status=flowy.RunStatus.HANDOFF,
            handoff_status=flowy.HandoffStatus.ORPHANED,
            execution_pointer="act",
            reason="to_worker",
        )
        orphan_revision = await backend.checkpointer.save(revision, orphan)
        return Threads(
            susp.revision,
            ho.revision,
            orphan_revision,
            dl.revision,
            dead_id,
            consumer.max_attempts,
        )


async def load(url: str, thread: str) -> tuple[flowy.storage.Snapshot[Any], int]:
    """The head of ``thread`` in the store at ``url``."""
    async with flowy.connect(url) as backend:
        return await backend.checkpointer.load(thread)


# ------------------------------------------------------------ graphs for subprocesses


def failing_graph() -> flowy.Graph[State, Any]:
    """``approval_graph``, but ``act`` raises when a worker runs it."""

    async def plan(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {"planned": True}, flowy.completed()

    async def ask(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {}, flowy.completed()

    async def act(s: State) -> tuple[State, flowy.Directive[Any]]:
        raise RuntimeError("the payment service is down")

    async def done(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {}, flowy.completed()

    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    b.add_node("plan", plan).add_node("ask", ask).add_node("act", act).add_node("done", done)
    b.add_edge("plan", "ask").add_edge("ask", "act").add_edge("act", "done")
    b.allow_no_outgoing_route("done")
    return b.compile()


@dataclasses.dataclass
class Ticket:
    """A typed state: ``--graph cli_support:typed_graph`` decodes states into it."""

    title: str
    count: int = 0


def typed_graph() -> flowy.Graph[Ticket, Any]:
    """One node over :class:`Ticket` that suspends."""

    async def wait(s: Ticket) -> tuple[Ticket, flowy.Directive[Any]]:
        return Ticket(s.title, s.count + 1), flowy.suspend("waiting")

    b: flowy.GraphBuilder[Ticket, Any] = flowy.GraphBuilder(lambda _old, new: new, state=Ticket)
    b.add_node("wait", wait).allow_no_outgoing_route("wait")
    return b.compile()


# ---------------------------------------------------- a graph that sleeps and waits

WAITING_GRAPH = "cli_support:waiting_graph"


async def _park(state: State) -> tuple[State, flowy.Directive[Any]]:
    if state.get("nap"):
        return {}, flowy.sleep(0.0, resume_at="pay")
    return {}, flowy.wait_for("approval", timeout=3600, resume_at="pay")


async def _charge(amount: int) -> dict[str, Any]:
    return {"charged": amount}


async def _pay(state: State) -> tuple[State, flowy.Directive[Any]]:
    receipt = await flowy.activity(_charge, 42, key="charge")
    return {"receipt": receipt}, flowy.completed()


def waiting_graph() -> flowy.Graph[State, Any]:
    """``park`` sleeps (``nap``) or waits for "approval"; ``pay`` charges as an activity."""
    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    b.add_node("park", _park).add_node("pay", _pay).add_edge("park", "pay")
    return b.allow_no_outgoing_route("pay").compile()


async def park_two(url: str) -> None:
    """Start ``sleepy`` (due at once) and ``waiter`` (waits an hour for "approval")."""
    async with flowy.connect(url) as backend:
        runner = flowy.Runner(waiting_graph(), backend, run_lease=("setup", 5.0))
        await runner.start("sleepy", {"nap": True})
        await runner.start("waiter", {})
