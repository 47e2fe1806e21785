"""The ``flowy`` command (``cli.py``): every subcommand run as a real process.

Each test builds its own SQLite file with the approval graph of ``core_graphs`` and runs
``python -m flowy.cli`` (or the installed ``flowy`` script) on it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from core_graphs import approval_graph

import flowy
from flowy import storage
from flowy.sqlite import SQLiteBackend

TESTS_DIR = Path(__file__).resolve().parent
DOCS_CLI = TESTS_DIR.parents[2] / "docs" / "cli.md"
GRAPH = "core_graphs:approval_graph"


def run_flowy(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m flowy.cli ARGS`` with ``core_graphs`` importable."""
    full_env = {**os.environ, "PYTHONPATH": str(TESTS_DIR), "PYTHONIOENCODING": "utf-8"}
    full_env.pop("NO_COLOR", None)
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
        runner = flowy.Runner(
            approval_graph(),
            backend.checkpointer,
            lease_manager=backend.leases,
            handoff_outbox=backend.outbox,
        )
        lease = ("setup", 5.0)
        susp = await runner.start("susp", {}, run_lease=lease)
        ho = await runner.start("ho", {}, run_lease=lease)
        assert ho.resume_token is not None
        ho = await runner.resume(ho.resume_token, state_overlay={"approved": True}, run_lease=lease)
        await runner.start("orph", {}, run_lease=lease)
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
        "THREAD", "STATUS", "REASON", "POINTER", "REVISION", "HANDOFF", "UPDATED"
    ]  # fmt: skip
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert set(rows) == {"susp", "ho", "orph"}
    assert rows["susp"][1:5] == ["suspended", "awaiting_approval", "ask", str(db.susp_revision)]
    assert rows["ho"][1:6] == ["handoff", "to_worker", "act", str(db.handoff_revision), "enqueued"]
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
    assert fields["next"] == (
        f"flowy resume susp --revision {db.susp_revision} --graph MODULE:ATTR --db {db.arg}"
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
            await flowy.Runner(graph, backend.checkpointer).start("t", {})

    asyncio.run(start())
    proc = run_flowy("show", "t", "--db", "b.db", "--graph", "budget_graph:build", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "budgets   tokens 3/10" in proc.stdout


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
    assert f"⇣ ho@{db.handoff_revision} delivery 1 (to_worker at act)" in out
    assert "✓ completed (completed) · at done" in out
    assert "✓ acked: resumed" in out
    assert out.splitlines()[-1] == "w1: 1 message(s) processed (resumed 1)"
    snap, _ = load(db.path, "ho")
    assert snap.status is flowy.RunStatus.COMPLETED
    assert snap.state["log"] == ["plan", "ask", "act", "done"]


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


# -------------------------------------------------------------------- error paths


@pytest.mark.parametrize(
    ("args", "code", "needles"),
    [
        (["show", "nope"], 1, ["flowy show: error:", "no thread 'nope'"]),
        (["history", "nope"], 1, ["flowy history: error:", "no thread 'nope'"]),
        (
            ["resume", "nope", "--revision", "1", "--graph", GRAPH],
            1,
            ["no thread 'nope'"],
        ),
        (
            ["resume", "susp", "--revision", "1", "--graph", GRAPH],
            1,
            ["revision 1 of thread 'susp' is stale", "resume with --revision 2"],
        ),
        (
            ["resume", "ho", "--revision", "1", "--graph", GRAPH, "--json"],
            1,
            ["is stale", "--revision 4"],
        ),
        (
            ["recover", "--thread", "nope"],
            1,
            ["no thread 'nope'"],
        ),
        (["resume", "susp", "--revision", "2", "--graph", "x"], 2, ["'package.module:attribute'"]),
        (["worker", "--graph", "no_such_module:g"], 2, ["no module named 'no_such_module'"]),
        (["worker", "--graph", "core_graphs:nope"], 2, ["has no attribute 'nope'"]),
        (["worker", "--graph", "core_graphs:State"], 2, ["not a flowy.Graph"]),
        (["threads", "--limit", "x"], 2, ["--limit", "expected a whole number"]),
        (
            ["resume", "susp", "--revision", "2", "--graph", GRAPH, "--overlay", "{"],
            2,
            ["--overlay is not valid JSON"],
        ),
        (["show", "susp", "--codec", "core_graphs:merge"], 2, ["--codec"]),
    ],
)
def test_user_mistakes_are_one_line(db: Db, args: list[str], code: int, needles: list[str]) -> None:
    assert_one_line_error(run_flowy(*args, "--db", db.arg), code, *needles)


@pytest.mark.parametrize(
    "args",
    [
        ["threads"],
        ["show", "t"],
        ["history", "t"],
        ["recover"],
        ["resume", "t", "--revision", "1", "--graph", GRAPH],
        ["worker", "--graph", GRAPH, "--once"],
    ],
)
def test_missing_database_is_an_error_and_is_not_created(tmp_path: Path, args: list[str]) -> None:
    missing = tmp_path / "missing.db"
    proc = run_flowy(*args, "--db", str(missing))
    assert_one_line_error(proc, 2, "no database file at", str(missing))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["graph", "nocolon"], ["must look like 'package.module:attribute'"]),
        (["graph", "no_such_module:g"], ["no module named 'no_such_module'"]),
        (["graph", "core_graphs:missing"], ["has no attribute 'missing'"]),
        (["graph", "core_graphs:merge"], ["calling it failed: TypeError"]),
        (["graph", "flowy:GraphBuilder"], ["returned a GraphBuilder, not a flowy.Graph"]),
        (["threads"], ["the following arguments are required: --db"]),
        ([], ["the following arguments are required: COMMAND"]),
        (["nonsense"], ["invalid choice: 'nonsense'"]),
    ],
)
def test_usage_errors_are_one_line(args: list[str], needles: list[str]) -> None:
    assert_one_line_error(run_flowy(*args), 2, *needles)


def test_broken_graph_module_and_invalid_graph(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("raise RuntimeError('boom\\nsecond line')\n")
    (tmp_path / "invalid.py").write_text(
        "import flowy\n"
        "async def a(s):\n    return s, flowy.completed()\n"
        "def build():\n"
        "    return flowy.GraphBuilder().add_node('a', a).add_edge('a', 'x').compile()\n",
        encoding="utf-8",
    )
    proc = run_flowy("graph", "broken:g", cwd=tmp_path)
    assert_one_line_error(proc, 2, "importing 'broken' failed: RuntimeError: boom second line")
    proc = run_flowy("graph", "invalid:build", cwd=tmp_path)
    assert_one_line_error(proc, 2, "the graph is invalid", "unknown node 'x'")


def test_not_a_flowy_database(tmp_path: Path) -> None:
    other = tmp_path / "notes.txt"
    other.write_text("hello\n" * 50)
    before = other.read_bytes()
    assert_one_line_error(run_flowy("threads", "--db", str(other)), 1, "not a flowy database")
    assert other.read_bytes() == before


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
    for command in ("demo", "threads", "show", "history", "graph", "recover", "resume", "worker"):
        assert command in proc.stdout
    assert run_flowy("--version").stdout.strip() == f"flowy {flowy.__version__}"
    assert run_flowy("worker", "--help").returncode == 0


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
            argv = command.split()
            assert argv[0] == "flowy", command
            proc = run_flowy(*argv[1:], cwd=tmp_path, env={"COLUMNS": "100"})
            actual = proc.stdout + proc.stderr
            report = f"$ {command}\n--- expected\n{expected}\n--- got\n{actual}"
            assert _matches(expected, actual), report


async def _make_dead_letter(path: Path) -> str:
    async with SQLiteBackend(path, max_attempts=1) as backend:
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
    assert "poison" in listed.stdout and "to_worker" in listed.stdout
    as_json = json.loads(run_flowy("dead-letters", "--db", str(path), "--json").stdout)
    assert as_json == [
        {
            "message_id": message_id,
            "thread_id": "poison",
            "revision": 3,
            "attempts": 1,
            "reason": "to_worker",
            "pointer": "pay",
        }
    ]
    unknown = run_flowy("dead-letters", "--db", str(path), "--retry", "999999")
    assert_one_line_error(unknown, 1, "no dead letter with id '999999'")
    retried = run_flowy("dead-letters", "--db", str(path), "--retry", message_id)
    assert retried.returncode == 0 and f"requeued dead letter {message_id}" in retried.stdout
    assert "no dead letters" in run_flowy("dead-letters", "--db", str(path)).stdout


def test_dead_letters_through_a_consumer_factory(tmp_path: Path) -> None:
    path = tmp_path / "dl.db"
    asyncio.run(_make_dead_letter(path))
    (tmp_path / "myconsumer.py").write_text(
        f"import flowy\nasync def consumer():\n    return SQLiteBackend({str(path)!r}).consumer\n"
    )
    proc = run_flowy("dead-letters", "--consumer", "myconsumer:consumer", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "poison" in proc.stdout
    bad = run_flowy("dead-letters", "--consumer", "json:dumps", cwd=tmp_path)
    assert bad.returncode == 2
    neither = run_flowy("dead-letters")
    assert_one_line_error(neither, 2, "--db FILE")
