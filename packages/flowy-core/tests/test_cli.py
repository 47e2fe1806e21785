"""The ``flowy`` command (``flowy/cli``) on a SQLite file named with ``--db``: every
subcommand run as a real process.

Each test builds its own SQLite file with the approval graph of ``core_graphs`` and runs
``python -m flowy.cli`` (or the installed ``flowy`` script) on it. The same commands on
every store, by ``--backend URL``, are in ``test_cli_stores.py``; mistakes and hostile
input in ``test_cli_errors.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import pytest
from cli_support import GRAPH, TESTS_DIR, assert_one_line_error, run_flowy
from core_graphs import approval_graph

import flowy
from flowy import storage
from flowy.cli._svg import to_svg
from flowy.sqlite import SQLiteBackend
from flowy.storage import as_backend

DOCS_CLI = TESTS_DIR.parents[2] / "docs" / "cli.md"


@dataclass(frozen=True)
class Db:
    path: Path
    susp_revision: int
    handoff_revision: int
    orphan_revision: int

    @property
    def arg(self) -> str:
        return str(self.path)


async def _populate(path: Path) -> Db:
    async with SQLiteBackend[Any](path) as backend:
        runner = flowy.Runner(approval_graph(), backend, run_lease=("setup", 5.0))
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
        return Db(path, susp.revision, ho.revision, orphan_revision)


@pytest.fixture
def db(tmp_path: Path) -> Db:
    """A database with a suspended thread ``susp``, an enqueued hand-off ``ho`` (one
    outbox message) and an orphaned hand-off ``orph``."""
    return asyncio.run(_populate(tmp_path / "flowy.db"))


async def _load(path: Path, thread: str) -> tuple[storage.Snapshot[Any], int]:
    async with SQLiteBackend[Any](path) as backend:
        return await backend.checkpointer.load(thread)


def load(path: Path, thread: str) -> tuple[storage.Snapshot[Any], int]:
    return asyncio.run(_load(path, thread))


# ------------------------------------------------------------------------- threads


def test_threads_table(db: Db) -> None:
    proc = run_flowy("threads", "--db", db.arg)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == [
        "THREAD", "STATUS", "REASON", "POINTER", "REVISION", "HANDOFF", "DEAD", "UPDATED"
    ]  # fmt: skip
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert set(rows) == {"susp", "ho", "orph"}
    assert rows["susp"][1:5] == ["suspended", "awaiting_approval", "ask", str(db.susp_revision)]
    assert rows["ho"][1:7] == [
        "handoff", "to_worker", "act", str(db.handoff_revision), "enqueued", "-"
    ]  # fmt: skip
    assert rows["orph"][5] == "orphaned"
    assert "\x1b[" not in proc.stdout  # not a terminal: no colour


def test_threads_json(db: Db) -> None:
    proc = run_flowy("threads", "--db", db.arg, "--json")
    assert proc.returncode == 0, proc.stderr
    data = {row["thread_id"]: row for row in json.loads(proc.stdout)}
    assert data["susp"]["status"] == "suspended"
    assert data["susp"]["revision"] == db.susp_revision
    assert data["ho"]["handoff_status"] == "enqueued"
    assert data["orph"]["handoff_status"] == "orphaned"
    assert isinstance(data["susp"]["updated_at"], float)
    limited = json.loads(run_flowy("threads", "--db", db.arg, "--json", "--limit", "1").stdout)
    assert len(limited) == 1


def test_threads_of_empty_database(tmp_path: Path) -> None:
    async def create() -> None:
        async with SQLiteBackend[Any](tmp_path / "empty.db"):
            pass

    asyncio.run(create())
    proc = run_flowy("threads", "--db", str(tmp_path / "empty.db"))
    assert proc.returncode == 0
    assert proc.stdout.startswith("no threads in ")


def test_threads_pages_through_a_long_list(tmp_path: Path) -> None:
    async def many() -> None:
        async with SQLiteBackend[Any](tmp_path / "many.db") as backend:
            for i in range(1203):
                await backend.checkpointer.save(0, storage.Snapshot(f"t{i:05d}", {}, "n"))

    asyncio.run(many())
    db = str(tmp_path / "many.db")
    listed = json.loads(run_flowy("threads", "--db", db, "--limit", "1100", "--json").stdout)
    assert [row["thread_id"] for row in listed] == [f"t{i:05d}" for i in range(1100)]
    rest = run_flowy("threads", "--db", db, "--limit", "1100", "--after", "t01099")
    assert [line.split()[0] for line in rest.stdout.splitlines()[1:]] == [
        f"t{i:05d}" for i in range(1100, 1203)
    ]
    first = run_flowy("threads", "--db", db, "--limit", "2").stdout.splitlines()
    assert first[-1] == f"more threads follow: flowy threads --after t00001 --limit 2 --db {db}"


def test_threads_recent_pages_most_recently_saved_first(tmp_path: Path) -> None:
    base = 1_700_000_000

    async def saved() -> None:
        async with SQLiteBackend[Any](tmp_path / "recent.db") as backend:
            for i in range(7):  # two threads a second, the newest second last
                snap = storage.Snapshot(f"r{i}", {}, "n", updated_at=base + i // 2 + 0.5)
                await backend.checkpointer.save(0, snap)

    asyncio.run(saved())
    db = str(tmp_path / "recent.db")
    want = ["r6", "r5", "r4", "r3", "r2", "r1", "r0"]
    listed = json.loads(run_flowy("threads", "--db", db, "--recent", "--json").stdout)
    assert [row["thread_id"] for row in listed] == want
    first = run_flowy("threads", "--db", db, "--recent", "--limit", "3").stdout.splitlines()
    assert [line.split()[0] for line in first[1:-1]] == want[:3]
    assert first[-1] == (
        f"more threads follow: flowy threads --recent --before '{base + 2}~r4' --limit 3 --db {db}"
    )
    rest = run_flowy("threads", "--db", db, "--before", f"{base + 2}~r4", "--json")
    assert [row["thread_id"] for row in json.loads(rest.stdout)] == want[3:]
    none = run_flowy("threads", "--db", db, "--before", f"{base}~r0")
    assert none.stdout.startswith("no threads in ") and f"saved before '{base}~r0'" in none.stdout
    for bad in (["--before", "soon"], ["--before", "12~"], ["--recent", "--after", "r1"]):
        proc = run_flowy("threads", "--db", db, *bad)
        assert proc.returncode == 2, bad
        assert (
            proc.stderr.startswith("flowy threads: error: ") and len(proc.stderr.splitlines()) == 1
        )


# ---------------------------------------------------------------------------- show


def test_show_snapshot(db: Db) -> None:
    proc = run_flowy("show", "susp", "--db", db.arg)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    fields = dict(
        line.split(None, 1) for line in out.splitlines() if line and not line.startswith(" ")
        if len(line.split(None, 1)) == 2
    )  # fmt: skip
    assert fields["thread"] == "susp"
    assert fields["status"] == "suspended (awaiting_approval)"
    assert fields["pointer"] == "ask"
    assert fields["revision"].startswith(f"{db.susp_revision} ")
    assert f"susp@{db.susp_revision}" in fields["revision"]
    assert fields["lease"] == "none"
    assert "dead" not in fields
    assert fields["next"] == (
        f"flowy resume susp@{db.susp_revision} --graph MODULE:ATTR --db {db.arg}"
    )
    state = json.loads(out.split("\nstate\n", 1)[1])
    assert state == {"planned": True, "log": ["plan"]}


def test_show_json_with_lease_holder(db: Db) -> None:
    async def hold() -> storage.Lease:
        async with SQLiteBackend[Any](db.path) as backend:
            return await backend.leases.acquire("susp", "ops-console", 60.0)

    lease = asyncio.run(hold())
    proc = run_flowy("show", "susp", "--db", db.arg, "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["lease"] == {
        "owner": "ops-console",
        "token": lease.fencing_token,
        "expires_at": lease.expires_at,
    }
    assert data["revision"] == db.susp_revision
    assert data["status"] == "suspended"
    assert data["state"] == {"planned": True, "log": ["plan"]}
    table = run_flowy("show", "susp", "--db", db.arg).stdout
    assert f"ops-console (fencing token {lease.fencing_token}, expires in" in table


def test_show_budget_limits_from_graph(tmp_path: Path) -> None:
    module = tmp_path / "budget_graph.py"
    module.write_text(
        "import flowy\n"
        "async def spend(s):\n"
        "    flowy.use_budget('tokens', 3)\n"
        "    return s, flowy.suspend('wait')\n"
        "def build():\n"
        "    b = flowy.GraphBuilder()\n"
        "    b.add_node('spend', spend).allow_no_outgoing_route('spend')\n"
        "    return b.compile(budgets={'tokens': 10})\n",
        encoding="utf-8",
    )

    spec = importlib.util.spec_from_file_location("budget_graph", module)
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    graph: flowy.Graph[Any, Any] = loaded.build()

    async def start() -> None:
        async with SQLiteBackend[Any](tmp_path / "b.db") as backend:
            await flowy.Runner(graph, as_backend(backend.checkpointer)).start("t", {})

    asyncio.run(start())
    proc = run_flowy("show", "t", "--db", "b.db", "--graph", "budget_graph:build", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "budgets   tokens 3/10" in proc.stdout


def test_typed_graph_and_codec_class_decode_states(tmp_path: Path) -> None:
    async def save() -> None:
        async with SQLiteBackend[Any](tmp_path / "t.db") as backend:
            state = {"title": "printer", "count": 2, "stray": True}
            await backend.checkpointer.save(0, storage.Snapshot("t", state, "wait"))

    asyncio.run(save())
    db = str(tmp_path / "t.db")
    plain = json.loads(run_flowy("show", "t", "--db", db, "--json").stdout)["state"]
    assert plain == {"title": "printer", "count": 2, "stray": True}
    for option in (["--graph", "cli_support:typed_graph"], ["--codec", "cli_support:Ticket"]):
        typed = run_flowy("show", "t", "--db", db, "--json", *option)
        assert typed.returncode == 0, typed.stderr
        assert json.loads(typed.stdout)["state"] == {"title": "printer", "count": 2}
    history = run_flowy("history", "t", "--db", db, "--json", "--graph", "cli_support:typed_graph")
    assert json.loads(history.stdout)[0]["state"] == {"title": "printer", "count": 2}
    resumed = run_flowy(
        "resume", "t@1", "--db", db, "--graph", "cli_support:typed_graph", "--json",
        "--overlay", '{"title": "scanner"}',
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    # the overlay names one field: the stored count (2) is kept, and the node adds one
    assert json.loads(resumed.stdout)["state"] == {"title": "scanner", "count": 3}
    misfit = run_flowy(
        "resume", "t@2", "--db", db, "--graph", "cli_support:typed_graph",
        "--overlay", '{"count": "three"}',
    )  # fmt: skip
    assert_one_line_error(misfit, 2, "--overlay", "does not fit Ticket", "state.count")
    unknown = run_flowy(
        "resume", "t@2", "--db", db, "--graph", "cli_support:typed_graph",
        "--overlay", '{"cuont": 3}',
    )  # fmt: skip
    assert_one_line_error(unknown, 2, "--overlay", "'cuont', not fields of Ticket")
    partial = run_flowy(
        "resume", "t@2", "--db", db, "--graph", "cli_support:typed_graph", "--json",
        "--overlay", '{"count": 10}',
    )  # fmt: skip
    assert partial.returncode == 0, partial.stderr
    assert json.loads(partial.stdout)["state"] == {"title": "scanner", "count": 11}


# ------------------------------------------------------------------------- history


def test_history_newest_first(db: Db) -> None:
    proc = run_flowy("history", "ho", "--db", db.arg)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:3] == ["REV", "STATUS", "REASON"]
    revisions = [int(line.split()[0]) for line in lines[1:]]
    assert revisions == list(range(db.handoff_revision, 0, -1))
    assert lines[1].split()[1:5] == ["handoff", "to_worker", "act", "enqueued"]

    one = run_flowy("history", "ho", "--db", db.arg, "--limit", "2", "--json")
    data = json.loads(one.stdout)
    assert [d["revision"] for d in data] == [db.handoff_revision, db.handoff_revision - 1]
    assert data[0]["state"]["in_background"] is True


# --------------------------------------------------------------------------- graph


def test_graph_table_json_and_mermaid() -> None:
    proc = run_flowy("graph", GRAPH)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"{GRAPH} · 4 nodes · entry plan")
    routes = {line.split()[0]: line.split(None, 1)[1] for line in lines[2:]}
    assert routes == {"plan": "→ ask", "ask": "→ act", "act": "→ done", "done": "(end)"}

    data = json.loads(run_flowy("graph", GRAPH, "--json").stdout)
    assert data["entry"] == "plan"
    assert data["nodes"] == ["plan", "ask", "act", "done"]
    assert data["edges"] == {"plan": "ask", "ask": "act", "act": "done"}
    assert data["terminal_nodes"] == ["done"]

    mermaid = run_flowy("graph", GRAPH, "--mermaid")
    assert mermaid.returncode == 0
    assert mermaid.stdout == approval_graph().to_mermaid()


def test_graph_svg_writes_the_drawing(tmp_path: Path) -> None:
    target = tmp_path / "graph.svg"
    proc = run_flowy("graph", GRAPH, "--svg", str(target))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"wrote {target} (4 nodes)\n"
    drawn = target.read_text(encoding="utf-8")
    assert drawn == to_svg(approval_graph(), title=f"the graph {GRAPH}") + "\n"
    assert run_flowy("graph", GRAPH, "--svg", "-").stdout == drawn
    missing = run_flowy("graph", GRAPH, "--svg", str(tmp_path / "no" / "graph.svg"))
    assert_one_line_error(missing, 2, "--svg: cannot write")
    both = run_flowy("graph", GRAPH, "--svg", "-", "--mermaid")
    assert both.returncode == 2 and "not allowed with" in both.stderr


def test_graph_accepts_a_graph_object(tmp_path: Path) -> None:
    (tmp_path / "objgraph.py").write_text(
        "from core_graphs import linear_graph\nGRAPH = linear_graph(2)\n", encoding="utf-8"
    )
    proc = run_flowy("graph", "objgraph:GRAPH", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "n0    → n1" in proc.stdout.splitlines()


# ------------------------------------------------------------------------- recover


def test_recover_lists_without_graph(db: Db) -> None:
    proc = run_flowy("recover", "--db", db.arg)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:3] == ["THREAD", "HANDOFF", "REVISION"]
    assert [line.split()[0] for line in lines[1:-1]] == ["orph"]
    assert "re-enqueue (orphaned)" in lines[1]
    assert lines[-1] == "(listing only: add --graph MODULE:ATTR to re-enqueue)"
    _, revision = load(db.path, "orph")
    assert revision == db.orphan_revision  # listing changes nothing

    forced = json.loads(run_flowy("recover", "--db", db.arg, "--force", "--json").stdout)
    assert {row["thread_id"]: row["action"] for row in forced} == {
        "ho": "re-enqueue (forced)",
        "orph": "re-enqueue (orphaned)",
    }
    first = run_flowy("recover", "--db", db.arg, "--force", "--limit", "1").stdout.splitlines()
    assert [line.split()[0] for line in first[1:-2]] == ["ho"]
    assert first[-2] == "more hand-offs follow: raise --limit (now 1)"


def test_recover_with_graph_reenqueues(db: Db) -> None:
    proc = run_flowy("recover", "--db", db.arg, "--graph", GRAPH, "--json")
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(proc.stdout)
    assert row["thread_id"] == "orph"
    assert row["recovered"] is True
    assert row["revision_after"] == db.orphan_revision + 1
    snap, revision = load(db.path, "orph")
    assert revision == db.orphan_revision + 1
    assert snap.handoff_status is flowy.HandoffStatus.ENQUEUED
    again = run_flowy("recover", "--db", db.arg, "--graph", GRAPH)
    assert again.returncode == 0
    assert again.stdout.strip() == f"no hand-offs to recover in {db.arg}"


def test_recover_single_thread_without_handoff(db: Db) -> None:
    proc = run_flowy("recover", "--db", db.arg, "--thread", "susp", "--graph", GRAPH)
    assert proc.returncode == 0, proc.stderr
    assert "no hand-off" in proc.stdout
    assert load(db.path, "susp")[1] == db.susp_revision


# -------------------------------------------------------------------------- resume


def test_resume_streams_events_and_hands_off(db: Db) -> None:
    proc = run_flowy(
        "resume", "susp", "--revision", str(db.susp_revision), "--graph", GRAPH,
        "--db", db.arg, "--overlay", '{"approved": true}', "--owner", "ops",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["▸", "step", "1", "ask", "■■□□", "2/4"]
    assert lines[1].split() == ["▸", "step", "2", "act", "■■■□", "3/4"]
    assert lines[2].lstrip().startswith("⇢ handed off (to_worker) · at act · revision")
    assert lines[3].strip() == f"a worker resumes it: flowy worker --graph {GRAPH} --db {db.arg}"
    snap, revision = load(db.path, "susp")
    assert snap.status is flowy.RunStatus.HANDOFF and revision == db.susp_revision + 2


def test_resume_by_printed_token(db: Db) -> None:
    token = f"susp@{db.susp_revision}"
    proc = run_flowy("resume", token, "--graph", GRAPH, "--db", db.arg, "--at", "done")
    assert proc.returncode == 0, proc.stderr
    assert load(db.path, "susp")[0].status is flowy.RunStatus.COMPLETED
    # A thread id may hold "@": the revision is after the last one; --revision wins.
    assert_one_line_error(
        run_flowy("resume", "susp", "--graph", GRAPH, "--db", db.arg),
        2,
        "give the revision to resume: 'susp' --revision N",
    )
    assert_one_line_error(
        run_flowy("resume", "a@b@x", "--graph", GRAPH, "--db", db.arg),
        2,
        "the revision of resume token 'a@b@x' must be a positive integer",
    )
    assert_one_line_error(
        run_flowy("resume", "no@pe", "--revision", "3", "--graph", GRAPH, "--db", db.arg),
        1,
        "no thread 'no@pe'",
    )


def test_resume_refuses_a_completed_thread_without_at(db: Db) -> None:
    done = run_flowy(
        "resume", "susp", "--revision", str(db.susp_revision), "--graph", GRAPH,
        "--db", db.arg, "--at", "done",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    _, revision = load(db.path, "susp")
    again = run_flowy(
        "resume", "susp", "--revision", str(revision), "--graph", GRAPH, "--db", db.arg
    )
    assert_one_line_error(again, 1, f"thread 'susp' is completed at revision {revision}", "--at")
    assert load(db.path, "susp")[1] == revision


def test_resume_json_at_node(db: Db) -> None:
    proc = run_flowy(
        "resume", "susp", "--revision", str(db.susp_revision), "--graph", GRAPH,
        "--db", db.arg, "--at", "done", "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["status"] == "completed"
    assert data["execution_pointer"] == "done"
    assert data["state"]["log"] == ["plan", "done"]


# -------------------------------------------------------------------------- worker


def test_worker_once_drains_the_outbox(db: Db) -> None:
    proc = run_flowy(
        "worker", "--graph", GRAPH, "--db", db.arg, "--once", "--owner", "w1",
        "--idle-wait", "0.2",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.splitlines()[0] == f"w1 · claiming hand-offs from {db.arg} · graph {GRAPH}"
    assert f"⇣ ho@{db.handoff_revision} delivery 1 (to_worker at act)" in out
    assert "✓ completed (completed) · at done" in out
    assert "✓ acked: resumed" in out
    assert out.splitlines()[-1] == "w1: 1 message(s) processed (resumed 1)"
    snap, _ = load(db.path, "ho")
    assert snap.status is flowy.RunStatus.COMPLETED
    assert snap.state["log"] == ["plan", "ask", "act", "done"]


def test_worker_reports_a_duplicate_delivery(db: Db) -> None:
    async def duplicate() -> None:
        async with SQLiteBackend[Any](db.path) as backend:
            runner = flowy.Runner(approval_graph(), backend, run_lease=("setup", 5.0))
            (message,) = await backend.consumer.claim(1, 0.1)
            await runner.resume(message.intent.resume_token)  # ran, but never acked

    asyncio.run(duplicate())
    time.sleep(0.15)
    proc = run_flowy(
        "worker", "--graph", GRAPH, "--db", db.arg, "--once", "--owner", "w1",
        "--idle-wait", "0.2",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"⇣ ho@{db.handoff_revision} delivery 2" in proc.stdout
    assert "was already resumed" in proc.stdout
    assert "✓ acked: nothing left to run" in proc.stdout
    assert proc.stdout.splitlines()[-1] == "w1: 1 message(s) processed (duplicate 1)"


def test_worker_runs_until_sigint(db: Db) -> None:
    if sys.platform == "win32":
        pytest.skip("POSIX signals")
    env = {**os.environ, "PYTHONPATH": str(TESTS_DIR), "PYTHONIOENCODING": "utf-8"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "flowy.cli", "worker", "--graph", GRAPH, "--db", db.arg,
         "--owner", "w2", "--poll-interval", "0.1", "--recovery-interval", "0.2",
         "--stale-after", "0"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, encoding="utf-8",
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            ho, orph = load(db.path, "ho")[0], load(db.path, "orph")[0]
            if ho.status is orph.status is flowy.RunStatus.COMPLETED:
                break
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert "stopping: finishing the runs in flight" in out
    assert load(db.path, "orph")[0].status is flowy.RunStatus.COMPLETED  # recovered, then run


# ------------------------------------------------------------------- dead letters


async def _make_dead_letter(path: Path) -> str:
    async with SQLiteBackend[Any](path, max_attempts=1) as backend:
        intent = storage.HandoffIntent(
            thread_id="poison",
            pending_snapshot_revision=3,
            committed_snapshot_revision=3,
            snapshot_revision=3,
            resume_token=flowy.ResumeToken("poison", 3),
            handoff_status=flowy.HandoffStatus.ENQUEUED,
            reason="to_worker",
            execution_pointer="pay",
        )
        await backend.outbox.enqueue_intent(intent)
        (msg,) = await backend.consumer.claim(1, 30)
        await backend.consumer.release(msg, error="always fails")
        (dead,) = await backend.consumer.dead_letters()
        return dead.message_id


def test_dead_letters_list_and_retry(tmp_path: Path) -> None:
    path = tmp_path / "dl.db"
    message_id = asyncio.run(_make_dead_letter(path))
    listed = run_flowy("dead-letters", "--db", str(path))
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[1].split() == [
        message_id, "poison", "3", "1", "to_worker", "pay", "always", "fails"
    ]  # fmt: skip
    as_json = json.loads(run_flowy("dead-letters", "--db", str(path), "--json").stdout)
    assert as_json == [
        {
            "message_id": message_id,
            "thread_id": "poison",
            "revision": 3,
            "attempts": 1,
            "reason": "to_worker",
            "pointer": "pay",
            "error": "always fails",
            "decodable": True,
        }
    ]
    unknown = run_flowy("dead-letters", "--db", str(path), "--retry", "999999")
    assert_one_line_error(unknown, 1, "no dead letter with id '999999'")
    retried = run_flowy("dead-letters", "--db", str(path), "--retry", message_id)
    assert retried.returncode == 0 and f"requeued dead letter {message_id}" in retried.stdout
    assert "no dead letters" in run_flowy("dead-letters", "--db", str(path)).stdout


def test_undecodable_dead_letters_are_shown(tmp_path: Path) -> None:
    path = tmp_path / "poison.db"
    asyncio.run(_make_dead_letter(path))
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("UPDATE flowy_outbox SET payload = X'00ff1b5b33316d'")
    listed = run_flowy("dead-letters", "--db", str(path))
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[1].split()[:3] == ["1", "(undecodable)", "-"]
    (row,) = json.loads(run_flowy("dead-letters", "--db", str(path), "--json").stdout)
    assert row["decodable"] is False and row["thread_id"] is None
    threads = run_flowy("threads", "--db", str(path))
    assert threads.returncode == 0 and threads.stdout.startswith("no threads")


def test_worker_reports_messages_buried_while_claiming(tmp_path: Path) -> None:
    path = tmp_path / "poison.db"

    async def poison() -> None:
        async with SQLiteBackend[Any](path) as backend:
            intent = storage.HandoffIntent(
                "p", 1, 1, 1, flowy.ResumeToken("p", 1), flowy.HandoffStatus.ENQUEUED, "r", "x"
            )
            await backend.outbox.enqueue_intent(intent)

    asyncio.run(poison())
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("UPDATE flowy_outbox SET payload = X'00ff'")
    proc = run_flowy("worker", "--graph", GRAPH, "--db", str(path), "--once", "--idle-wait", "0.2")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "✗ dead-lettered while claiming: message 1 of an undecodable message" in proc.stdout
    assert "0 message(s) processed; 1 dead-lettered" in proc.stdout.splitlines()[-1]


def test_dead_letters_through_backend_url_and_environment(tmp_path: Path) -> None:
    path = tmp_path / "dl.db"
    asyncio.run(_make_dead_letter(path))
    for args, env in (
        (["--backend", f"sqlite:///{path}"], {}),
        (["--backend", str(path)], {}),
        ([], {"FLOWY_BACKEND": f"sqlite:///{path}"}),
    ):
        proc = run_flowy("dead-letters", *args, env=env)
        assert proc.returncode == 0, proc.stderr
        assert "poison" in proc.stdout
    # The command line wins over the environment.
    other = run_flowy("dead-letters", "--db", str(path), env={"FLOWY_BACKEND": "nowhere.db"})
    assert other.returncode == 0, other.stderr


# ------------------------------------------------------------------- presentation


def test_colour_only_when_asked_or_on_a_terminal(db: Db) -> None:
    plain = run_flowy("threads", "--db", db.arg)
    coloured = run_flowy("threads", "--db", db.arg, "--color", "always")
    assert "\x1b[" not in plain.stdout
    assert "\x1b[" in coloured.stdout
    assert re.sub(r"\x1b\[[0-9;]*m", "", coloured.stdout) == plain.stdout
    no_color = run_flowy("threads", "--db", db.arg, "--color", "auto", env={"NO_COLOR": "1"})
    assert "\x1b[" not in no_color.stdout


def test_help_and_version() -> None:
    proc = run_flowy("--help")
    assert proc.returncode == 0
    for command in (
        "demo", "threads", "show", "history", "graph", "recover", "resume", "worker",
        "dead-letters",
    ):  # fmt: skip
        assert command in proc.stdout
    assert run_flowy("--version").stdout.strip() == f"flowy {flowy.__version__}"
    assert run_flowy("worker", "--help").returncode == 0


def test_every_option_has_help() -> None:
    from flowy.cli._main import build_parser

    missing: list[str] = []

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        for action in parser._actions:
            name = f"{prefix} {'/'.join(action.option_strings) or action.dest}"
            if action.nargs == argparse.PARSER:  # the subcommands
                choices = cast(dict[str, argparse.ArgumentParser], action.choices)
                for command, sub in choices.items():
                    walk(sub, f"{prefix} {command}")
                continue
            if not action.help or action.help == argparse.SUPPRESS:
                missing.append(name)

    walk(build_parser(), "flowy")
    assert missing == []


def test_python_m_and_main_module_work() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "flowy.cli", "--version"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.startswith("flowy ")


def test_installed_console_script(db: Db) -> None:
    bindir = Path(sys.executable).parent
    script = shutil.which("flowy", path=str(bindir))
    if script is None:
        pytest.skip("the flowy console script is not installed next to this interpreter")
    env = {**os.environ, "PYTHONPATH": str(TESTS_DIR)}
    proc = subprocess.run(
        [script, "threads", "--db", db.arg, "--json"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert {row["thread_id"] for row in json.loads(proc.stdout)} == {"susp", "ho", "orph"}


# --------------------------------------------------------------------------- docs


def _console_blocks(text: str) -> list[list[tuple[str, str]]]:
    """The ``console`` blocks of a Markdown page as (command, expected output) pairs."""
    blocks: list[list[tuple[str, str]]] = []
    for body in re.findall(r"^```console\n(.*?)^```", text, flags=re.M | re.S):
        pairs: list[tuple[str, str]] = []
        for chunk in re.split(r"^\$ ", body, flags=re.M)[1:]:
            command, _, output = chunk.partition("\n")
            pairs.append((command, output))
        blocks.append(pairs)
    return blocks


def _matches(expected: str, actual: str) -> bool:
    """Compare outputs line by line; ``...`` in the expected text matches anything."""
    norm_expected = "\n".join(line.rstrip() for line in expected.strip("\n").splitlines())
    norm_actual = "\n".join(line.rstrip() for line in actual.strip("\n").splitlines())
    pattern = ".*?".join(re.escape(part) for part in norm_expected.split("..."))
    return re.fullmatch(pattern, norm_actual, flags=re.S) is not None


def test_docs_cli_console_blocks_match_real_output(tmp_path: Path) -> None:
    blocks = _console_blocks(DOCS_CLI.read_text(encoding="utf-8"))
    assert blocks, "docs/cli.md has no console blocks"
    for block in blocks:
        for command, expected in block:
            argv = shlex.split(command)
            assert argv[0] == "flowy", command
            # The demo prints `flowy ...` when this environment's flowy is on PATH.
            path = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])
            proc = run_flowy(*argv[1:], cwd=tmp_path, env={"COLUMNS": "100", "PATH": path})
            actual = proc.stdout + proc.stderr
            report = f"$ {command}\n--- expected\n{expected}\n--- got\n{actual}"
            assert _matches(expected, actual), report
