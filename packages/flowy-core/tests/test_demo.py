"""``flowy demo`` (``flowy/cli/_story.py`` playing ``flowy/cli/demo.py``): the real
command, end to end, what it leaves in the database, the files it refuses to touch, and
the commands it prints, run as printed."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import flowy
from flowy import storage
from flowy.cli.demo import THREAD_ID, payments_path, read_ledger
from flowy.sqlite import SQLiteBackend


@dataclass(frozen=True)
class DemoRun:
    db: Path
    proc: subprocess.CompletedProcess[str]
    seconds: float


BINDIR = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[3]


def _path(with_bindir: bool) -> str:
    """``PATH`` with this environment's bin directory first, or without it."""
    parts = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p]
    parts = [p for p in parts if Path(p).resolve() != BINDIR.resolve()]
    return os.pathsep.join([str(BINDIR), *parts] if with_bindir else parts)


def run_demo(
    *args: str, cwd: Path, on_path: bool = True
) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {**os.environ, "PYTHONIOENCODING": "utf-8", "PATH": _path(on_path)}
    env.pop("NO_COLOR", None)
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "flowy.cli", "demo", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=60,
        check=False,
    )
    return proc, time.monotonic() - started


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """One ``flowy demo --fast`` run in a fresh directory, shared by the tests below."""
    root = tmp_path_factory.mktemp("demo")
    db = root / "state" / "demo.db"
    proc, seconds = run_demo("--db", str(db), "--fast", cwd=root)
    return DemoRun(db, proc, seconds)


def test_demo_exits_zero_quickly(demo: DemoRun) -> None:
    assert demo.proc.returncode == 0, demo.proc.stdout + demo.proc.stderr
    assert demo.seconds < 30
    assert demo.proc.stderr == ""


def test_demo_tells_the_story(demo: DemoRun) -> None:
    out = demo.proc.stdout
    assert "\x1b[" not in out  # not a terminal: no colour
    expected_in_order = [
        "⏸ suspended (awaiting_approval) · at await_approval · revision 4 · resume token "
        "refund-A1001@4",
        "⚡ effect refund_proposed",
        "⏸ suspended (awaiting_approval) · at await_approval · revision 6",
        "✗ rejected by OCC: ConcurrencyConflictError: resume token refund-A1001@4 is stale",
        "evaluate_resume(refund-A1001@4) → stale_token, current token refund-A1001@6",
        "⇢ handed off (refund_approved) · at issue_refund · revision 7 · hand-off enqueued",
        "worker-1 runs in a separate process: a flowy worker on this database",
        "worker-1 │ ⇣ refund-A1001@7 delivery 1",
        "the worker process is killed after the gateway call",
        "no ack, no checkpoint",
        "head still at revision 7 (handoff, hand-off enqueued)",
        "lease expired, message visible again",
        "worker-2 recovers from the last checkpoint",
        "worker-2 │ ⇣ refund-A1001@7 delivery 2",
        "was used before → same refund",
        "worker-2 │   ✓ completed (completed) · at notify_customer · revision 9",
        "worker-2 │ ✓ acked: resumed",
        "payments ledger: 1 refund for key rf_",
        "thread refund-A1001: completed at revision 9",
        f"The thread's history (flowy history refund-A1001 --db {demo.db}):",
        "Look inside it yourself:",
        f"flowy threads --db {demo.db}",
        f"flowy show refund-A1001 --db {demo.db}",
        f"flowy history refund-A1001 --db {demo.db}",
    ]
    position = 0
    for needle in expected_in_order:
        found = out.find(needle, position)
        assert found >= 0, f"missing (in order): {needle!r}\n{out}"
        position = found + len(needle)
    if sys.platform != "win32":
        assert "worker-1 killed by SIGKILL" in out
    history = out.split("The thread's history", 1)[1].splitlines()[1:11]
    assert history[0].split()[:3] == ["REV", "STATUS", "REASON"]
    assert [int(line.split()[0]) for line in history[1:]] == list(range(9, 0, -1))


async def _read(db: Path) -> tuple[storage.Snapshot[Any], int, list[storage.Snapshot[Any]]]:
    async with SQLiteBackend[Any](db) as backend:
        snap, revision = await backend.checkpointer.load(THREAD_ID)
        history = await backend.checkpointer.get_history(THREAD_ID, 100)
        assert await backend.leases.holder(THREAD_ID) is None
        assert await backend.consumer.pending_count() == 0
        return snap, revision, history


def test_demo_refunds_exactly_once(demo: DemoRun) -> None:
    assert demo.proc.returncode == 0
    snap, revision, history = asyncio.run(_read(demo.db))
    assert snap.status is flowy.RunStatus.COMPLETED
    assert revision == 9
    state = snap.state
    key = state["proposal"]["idempotency_key"]
    assert state["proposal"]["amount_cents"] == 2400  # the revised proposal, not the stale one
    assert state["approval"]["proposal_id"] == state["proposal"]["id"] == "P2"
    assert state["refund"]["idempotency_key"] == key
    assert state["refund"]["replayed"] is True  # the second worker got the first refund back
    # The key was checkpointed with the hand-off, before any worker touched the gateway.
    handoff = next(s for s in history if s.status is flowy.RunStatus.HANDOFF)
    assert handoff.state["proposal"]["idempotency_key"] == key
    assert "refund" not in handoff.state
    # Only one refund exists, although the gateway was asked twice.
    ledger = read_ledger(payments_path(demo.db))
    assert ledger == [(key, state["refund"]["refund_id"], 2400, 2)]


def test_demo_database_is_inspectable(demo: DemoRun) -> None:
    for args in (["threads"], ["show", THREAD_ID], ["history", THREAD_ID]):
        proc = subprocess.run(
            [sys.executable, "-m", "flowy.cli", *args, "--db", str(demo.db)],
            capture_output=True,
            text=True,
            encoding="utf-8",
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        assert "completed" in proc.stdout


def _files(directory: Path) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def _assert_refused(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("flowy demo: error: refusing to replace")
    for needle in needles:
        assert needle in proc.stderr, (needle, proc.stderr)
    assert proc.stdout == ""


def test_demo_refuses_to_replace_a_foreign_file(tmp_path: Path) -> None:
    precious = tmp_path / "precious.db"
    precious.write_bytes(b"not a flowy file\n" * 10)
    proc, _ = run_demo("--db", str(precious), "--fast", cwd=tmp_path)
    _assert_refused(proc, str(precious), "choose another --db path")
    assert precious.read_bytes() == b"not a flowy file\n" * 10


async def _app_db(db: Path) -> None:
    async with SQLiteBackend[Any](db) as backend:
        await backend.checkpointer.save(0, storage.Snapshot("orders-7", {"paid": True}, "ship"))


@pytest.mark.parametrize("kind", ["flowy database", "empty file", "leftover -wal", "ledger"])
def test_demo_refuses_files_it_did_not_create(tmp_path: Path, kind: str) -> None:
    db = tmp_path / "app.db"
    if kind == "flowy database":
        asyncio.run(_app_db(db))  # an application's own flowy database
    elif kind == "empty file":
        db.touch()
    elif kind == "leftover -wal":
        Path(str(db) + "-wal").write_bytes(b"\0" * 64)
    else:
        payments_path(db).write_bytes(b"my own payments\n")
    before = _files(tmp_path)
    proc, _ = run_demo("--db", str(db), "--fast", cwd=tmp_path)
    _assert_refused(proc)
    assert _files(tmp_path) == before


def test_demo_replaces_its_own_files(tmp_path: Path) -> None:
    first, _ = run_demo("--fast", cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    db = tmp_path / ".flowy-demo" / "demo.db"
    asyncio.run(_extra_thread(db))
    again, _ = run_demo("--fast", cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    snap, revision, _ = asyncio.run(_read(db))
    assert snap.status is flowy.RunStatus.COMPLETED and revision == 9
    assert "database  .flowy-demo/demo.db (SQLite, new)" in again.stdout
    assert "leftover" not in asyncio.run(_thread_ids(db))


async def _extra_thread(db: Path) -> None:
    async with SQLiteBackend[Any](db) as backend:
        await backend.checkpointer.save(0, storage.Snapshot("leftover", {}, "plan"))


async def _thread_ids(db: Path) -> list[str]:
    async with SQLiteBackend[Any](db) as backend:
        return [s.thread_id for s in await backend.checkpointer.list_threads()]


def _printed_commands(out: str) -> list[str]:
    return [line.strip() for line in out.split("Look inside it yourself:\n", 1)[1].splitlines()]


def _run_as_printed(command: str, cwd: Path, on_path: bool) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": _path(on_path), "NO_COLOR": "1"}
    return subprocess.run(
        command, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip


def test_printed_commands_run_as_printed_with_flowy_on_path(demo: DemoRun) -> None:
    commands = _printed_commands(demo.proc.stdout)
    assert [c.split()[0] for c in commands] == ["flowy"] * 4
    for command in commands:
        proc = _run_as_printed(command, demo.db.parents[1], on_path=True)
        assert proc.returncode == 0, (command, proc.stderr)


def test_printed_commands_run_as_printed_from_the_repository_root(tmp_path: Path) -> None:
    """As after `make demo`: this environment's flowy is not on PATH."""
    db = tmp_path / "demo.db"
    proc, _ = run_demo("--db", str(db), "--fast", cwd=ROOT, on_path=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    program = os.path.relpath(BINDIR / "flowy", ROOT)
    if program.startswith(".."):
        program = str(BINDIR / "flowy")
    commands = _printed_commands(proc.stdout)
    assert commands[0] == f"{shlex.quote(program)} threads --db {db}"
    assert f"The thread's history ({shlex.quote(program)} history refund-A1001" in proc.stdout
    for command in commands:
        ran = _run_as_printed(command, ROOT, on_path=False)
        assert ran.returncode == 0, (command, ran.stderr)
