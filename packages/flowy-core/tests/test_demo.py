"""``flowy demo`` (``flowy/cli/_story.py`` playing ``flowy/cli/demo.py``): the real
command, end to end, what it leaves in the database (the escalation by a timer, the
decisions that came as signals, the refund activity in the journal, one refund and one
gateway request in the ledger), the files it refuses to touch, the commands it prints,
run as printed, and the demo's graph on ``flowy worker`` processes."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
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
from flowy.cli._render import Console, set_console
from flowy.cli.demo import (
    GRAPH_SPEC,
    THREAD_ID,
    build_graph,
    open_ledger,
    payments_path,
    read_ledger,
)
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
        # 1. the first proposal waits for a review, with a deadline
        "review › P1 ($129.00) waits for a reviewer; escalates in 0.2s without a decision",
        "… waiting (awaiting_approval) · at await_approval · revision 4 · resume token "
        "refund-A1001@4",
        "a durable wait: revision 4 holds its deadline, indexed as a timer due in",
        # 2. nobody decides: the timer fires and the run escalates
        "Nobody decides on P1 within 0.2s: the timer fires, the run escalates",
        "worker.fire_timers()",
        "escalate › no decision on P1 within 0.2s → paged the senior reviewer, dana",
        "… waiting (escalated) · at await_approval · revision 5 · resume token refund-A1001@5",
        # 3. the customer writes again; the app's stale token is refused
        "✗ rejected by OCC: ConcurrencyConflictError: resume token refund-A1001@4 is stale",
        "evaluate_resume(refund-A1001@4) → stale_token, current token refund-A1001@5",
        '⚡ effect refund_proposed {"proposal": "P2", "amount": "$24.00"',
        "review › P2 ($24.00) waits for dana's decision, without a deadline now",
        "… waiting (awaiting_approval) · at await_approval · revision 7",
        # 4. a decision about the stale proposal arrives as a signal: kept, not applied
        'signal(refund-A1001, "review", {approval of P1}, signal_id="review-dana-P1")',
        "→ signal #1 stored in the thread's inbox",
        "⇣ refund-A1001@7 (signal:review at await_approval)",
        "review › dana's decision is about P1 ($129.00), not the current P2 ($24.00): kept, "
        "not applied → still waiting",
        "… waiting (awaiting_approval) · at await_approval · revision 8",
        "(a webhook retry, same signal_id) → signal #1 as stored before, nothing new: "
        "1 signal in the inbox, 0 wake-up messages in the outbox",
        # 5. the decision on the current proposal hands the refund off
        'signal(refund-A1001, "review", {approval of P2}, signal_id="review-dana-P2")',
        "→ signal #2 stored in the thread's inbox",
        "⇣ refund-A1001@8 (signal:review at await_approval)",
        "review › dana approved P2 ($24.00)",
        "⇢ handed off (refund_approved) · at issue_refund · revision 9 · hand-off enqueued",
        "the checkpoint (revision 9) and the outbox message (1 waiting) were written",
        # 6. worker-1 dies between the gateway's answer and the journal's record
        "worker-1 runs in a separate process: a flowy worker on this database",
        "worker-1 │ ⇣ refund-A1001@9 delivery 1 (refund_approved at issue_refund)",
        "worker-1 │       gateway › refund re_",
        "the worker process is killed after the gateway's answer, before the journal records it",
        "no ack, no checkpoint",
        "journal: refund:P2 started (attempt 1), its outcome never recorded · "
        "payments ledger: 1 refund",
        "head still at revision 9 (handoff, hand-off enqueued)",
        "lease expired, message visible again",
        # 8. worker-2 reconciles instead of calling the gateway again
        "worker-2 recovers from the last checkpoint and the journal",
        "worker-2 │ ⇣ refund-A1001@9 delivery 2",
        "worker-2 │       journal › refund:P2 started before and its outcome was never "
        "recorded → reconcile",
        "worker-2 │       ledger › key rf_",
        "exists: that is the outcome, the gateway is not called again",
        "worker-2 │   ✓ completed (completed) · at notify_customer · revision 11",
        "worker-2 │ ✓ acked: resumed",
        # 9. exactly once
        "journal: refund:P2 succeeded after 1 attempt → re_",
        "its outcome found by reconcile after the crash",
        "payments ledger: 1 refund for key rf_",
        "(1 gateway request)",
        "thread refund-A1001: completed at revision 11",
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
    # The gateway was called once, by worker-1; worker-2 never asked it again.
    assert out.count("gateway ›") == 1
    assert "was used before" not in out
    history = out.split("The thread's history", 1)[1].splitlines()[1:13]
    assert history[0].split()[:3] == ["REV", "STATUS", "REASON"]
    assert [int(line.split()[0]) for line in history[1:]] == list(range(11, 0, -1))
    rows = {int(line.split()[0]): line.split()[1:3] for line in history[1:]}
    assert rows[4] == ["waiting", "awaiting_approval"]
    assert rows[5] == ["waiting", "escalated"]
    assert rows[9] == ["handoff", "refund_approved"]


async def _read(db: Path) -> tuple[storage.Snapshot[Any], int, list[storage.Snapshot[Any]]]:
    async with SQLiteBackend[Any](db) as backend:
        snap, revision = await backend.checkpointer.load(THREAD_ID)
        history = await backend.checkpointer.get_history(THREAD_ID, 100)
        assert await backend.leases.holder(THREAD_ID) is None
        assert await backend.consumer.pending_count() == 0
        return snap, revision, history


async def _durable(
    db: Path, thread: str = THREAD_ID
) -> tuple[list[storage.ActivityRecord], list[storage.Signal], list[storage.Timer]]:
    async with SQLiteBackend[Any](db) as backend:
        cp = backend.checkpointer
        return await cp.journal(thread), await cp.signals(thread), await cp.timers(limit=100)


def test_demo_refunds_exactly_once(demo: DemoRun) -> None:
    assert demo.proc.returncode == 0
    snap, revision, history = asyncio.run(_read(demo.db))
    assert snap.status is flowy.RunStatus.COMPLETED
    assert revision == 11
    state = snap.state
    key = state["proposal"]["idempotency_key"]
    assert state["proposal"]["amount_cents"] == 2400  # the revised proposal, not the stale one
    assert state["approval"]["proposal_id"] == state["proposal"]["id"] == "P2"
    assert state["escalated_to"] == "dana"
    assert state["refund"]["idempotency_key"] == key
    # The result of the one gateway call, as reconcile found it in the ledger.
    assert state["refund"]["replayed"] is False
    # The key was checkpointed with the hand-off, before any worker touched the gateway.
    handoff = next(s for s in history if s.status is flowy.RunStatus.HANDOFF)
    assert handoff.state["proposal"]["idempotency_key"] == key
    assert "refund" not in handoff.state
    # One refund, and the gateway was asked once: worker-2 reconciled, it did not ask again.
    ledger = read_ledger(payments_path(demo.db))
    assert ledger == [(key, state["refund"]["refund_id"], 2400, 1)]
    journal, _, timers = asyncio.run(_durable(demo.db))
    assert [(r.key, r.status, r.attempts) for r in journal] == [
        ("refund:P2", storage.ActivityStatus.SUCCEEDED, 1)
    ]
    assert journal[0].name == "PaymentsGateway.refund"
    assert journal[0].result == state["refund"]
    assert timers == []


def test_demo_escalates_on_the_timer_and_takes_decisions_as_signals(demo: DemoRun) -> None:
    assert demo.proc.returncode == 0
    snap, _, history = asyncio.run(_read(demo.db))
    by_revision = {s.revision: s for s in history}
    # The first wait had a deadline, and the timeout route to escalate.
    first = by_revision[4]
    assert first.status is flowy.RunStatus.WAITING and first.reason == "awaiting_approval"
    assert first.waiting_for == "review" and first.on_timeout == "escalate"
    assert first.wake_at is not None
    # The timer took the run to escalate, which waits for the review without one.
    escalated = by_revision[5]
    assert escalated.status is flowy.RunStatus.WAITING and escalated.reason == "escalated"
    assert escalated.state["escalated_to"] == "dana"
    assert escalated.waiting_for == "review" and escalated.wake_at is None
    # The stale decision was taken (the cursor moved) and kept, but the run waited on.
    stale = by_revision[8]
    assert stale.status is flowy.RunStatus.WAITING
    assert stale.state["approval"]["proposal_id"] == "P1"
    assert stale.state["proposal"]["id"] == "P2"
    assert dict(stale.signal_cursors) == {"review": 1}
    # Both decisions came as signals; the repeated signal_id stored nothing.
    _, signals, _ = asyncio.run(_durable(demo.db))
    assert [(s.seq, s.name, s.signal_id) for s in signals] == [
        (1, "review", "review-dana-P1"),
        (2, "review", "review-dana-P2"),
    ]
    assert [s.payload for s in signals] == [
        {"proposal_id": "P1", "decision": "approve", "reviewer": "dana", "amount_cents": 12900},
        {"proposal_id": "P2", "decision": "approve", "reviewer": "dana", "amount_cents": 2400},
    ]
    assert dict(snap.signal_cursors) == {"review": 2}


def _flowy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flowy.cli", *args],
        env={**os.environ, "PYTHONIOENCODING": "utf-8", "NO_COLOR": "1"},
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=60,
        check=False,
    )


def test_demo_database_is_inspectable(demo: DemoRun) -> None:
    for args in (["threads"], ["show", THREAD_ID], ["history", THREAD_ID]):
        proc = _flowy(*args, "--db", str(demo.db))
        assert proc.returncode == 0, proc.stderr
        assert "completed" in proc.stdout
    show = _flowy("show", THREAD_ID, "--db", str(demo.db)).stdout
    journal = show.split("\njournal\n", 1)[1].splitlines()
    assert journal[0].split() == ["KEY", "STATUS", "ATTEMPTS", "STARTED", "RESULT", "/", "ERROR"]
    assert journal[1].split()[:3] == ["refund:P2", "succeeded", "1"]
    assert _flowy("timers", "--db", str(demo.db)).stdout.strip() == "no timers"


async def _start_waiting(db: Path) -> float:
    """Start the demo's thread on ``db`` (pace 0) up to its first wait; its deadline."""
    set_console(Console(io.StringIO()))  # the nodes' lines are not this test's business
    ledger = payments_path(db)
    open_ledger(str(ledger)).close()
    async with SQLiteBackend[Any](db) as backend:
        runner = flowy.Runner(build_graph(), backend)
        result = await runner.start(
            THREAD_ID,
            {"order_id": "A-1001", "customer_messages": ["the mug and the plates are smashed"]},
            metadata={"payments_db": str(ledger), "pace": 0.0},
        )
        assert result.status is flowy.RunStatus.WAITING, result
        head, _ = await runner.head(THREAD_ID)
        assert head.wake_at is not None and head.waiting_for == "review"
        return head.wake_at


def test_demo_graph_on_worker_processes(tmp_path: Path) -> None:
    """``flowy worker`` runs the demo's graph end to end: it fires the wait's timer (the
    run escalates), and a signal sent with ``flowy signal`` wakes the waiting thread,
    which hands off to the same worker and refunds once, through the journal."""
    db = tmp_path / "workers.db"
    wake_at = asyncio.run(_start_waiting(db))
    time.sleep(max(wake_at - time.time(), 0) + 0.05)
    worker = ["worker", "--graph", GRAPH_SPEC, "--db", str(db), "--once", "--idle-wait", "0.2"]
    timer = _flowy(*worker, "--owner", "w1")
    assert timer.returncode == 0, timer.stdout + timer.stderr
    assert "escalate › no decision on P1 within 0.2s → paged the senior reviewer, dana" in (
        timer.stdout
    )
    assert "waiting (escalated) · at await_approval" in timer.stdout
    payload = {
        "proposal_id": "P1",
        "decision": "approve",
        "reviewer": "dana",
        "amount_cents": 12900,
    }
    for _ in range(2):  # the second time, the same id stores nothing
        sent = _flowy(
            "signal", THREAD_ID, "review", "--db", str(db), "--json", json.dumps(payload),
            "--id", "review-1",
        )  # fmt: skip
        assert sent.returncode == 0, sent.stderr
        assert "'review' #1 (id review-1)" in sent.stdout
    woken = _flowy(*worker, "--owner", "w2")
    assert woken.returncode == 0, woken.stdout + woken.stderr
    expected_in_order = [
        "⇣ refund-A1001@5 delivery 1 (signal:review at await_approval)",
        "review › dana approved P1 ($129.00)",
        "handed off (refund_approved) · at issue_refund · revision 6",
        "✓ acked: resumed",
        "⇣ refund-A1001@6 delivery 1 (refund_approved at issue_refund)",
        "gateway › refund re_",
        "✓ completed (completed) · at notify_customer · revision 8",
        "✓ acked: resumed",
    ]
    position = 0
    for needle in expected_in_order:
        found = woken.stdout.find(needle, position)
        assert found >= 0, f"missing (in order): {needle!r}\n{woken.stdout}"
        position = found + len(needle)
    snap, revision, _ = asyncio.run(_read(db))
    assert snap.status is flowy.RunStatus.COMPLETED and revision == 8
    key = snap.state["proposal"]["idempotency_key"]
    assert read_ledger(payments_path(db)) == [(key, snap.state["refund"]["refund_id"], 12900, 1)]
    journal, signals, timers = asyncio.run(_durable(db))
    assert [(r.key, r.status, r.attempts) for r in journal] == [
        ("refund:P1", storage.ActivityStatus.SUCCEEDED, 1)
    ]
    assert [s.signal_id for s in signals] == ["review-1"] and timers == []


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
    assert snap.status is flowy.RunStatus.COMPLETED and revision == 11
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
