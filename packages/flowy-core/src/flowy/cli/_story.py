"""``flowy demo``: play the refund agent of :mod:`flowy.cli.demo` against a SQLite file
and tell the story as it happens.

The demo only ever replaces files it made itself: its database carries a marker table
(``flowy_demo``) and its payments ledger an application id of its own, and anything
else at those paths is refused before a byte changes. The commands it prints at the end
run as printed from the current directory: ``flowy …`` when the ``flowy`` on ``PATH`` is
this environment's, else the path to this environment's ``flowy``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import sqlite3
import sys
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from .._errors import ConcurrencyConflictError, FlowyError
from .._events import StreamHandle
from .._plan import ResumePlan, resume_to
from .._results import RunResult
from .._runner import Runner
from ..sqlite import APPLICATION_ID, SQLiteBackend
from ..storage import HandoffStatus, ResumeToken, RunStatus
from ._inspect import print_history
from ._options import CliError, quote
from ._render import ColorMode, Console, EventPrinter, clean, main_path, result_line
from ._store import Store
from .demo import (
    CRASHING_GRAPH_SPEC,
    FIRST_MESSAGE,
    FOLLOW_UP,
    GRAPH_SPEC,
    LEDGER_APPLICATION_ID,
    THREAD_ID,
    Approval,
    DemoEffect,
    RefundState,
    build_graph,
    money,
    money_of,
    open_ledger,
    payments_path,
    proposal_of,
    read_ledger,
    refund_of,
)

__all__ = [
    "DEFAULT_DEMO_DB",
    "MARKER_TABLE",
    "DemoError",
    "DemoRefused",
    "DemoReport",
    "DemoSettings",
    "cmd_demo",
    "describe_failure",
    "flowy_program",
    "inspect_commands",
    "run_demo",
]

DEFAULT_DEMO_DB = Path(".flowy-demo") / "demo.db"
"""Where ``flowy demo`` keeps its database unless ``--db`` says otherwise."""

MARKER_TABLE = "flowy_demo"
"""The table that marks a flowy database as one the demo created (and may replace)."""

_SIDECARS = ("-wal", "-shm", "-journal")


class DemoError(Exception):
    """The demo did not go as scripted."""


class DemoRefused(DemoError):
    """The demo was pointed at files it did not create (a usage error)."""


@dataclass(frozen=True, slots=True)
class DemoSettings:
    """Timing of one demo run. ``fast`` drops the simulated latencies."""

    db: Path
    fast: bool = False
    color: ColorMode = "never"

    @property
    def pace(self) -> float:
        """Multiplier of the simulated latencies."""
        return 0.0 if self.fast else 1.0

    @property
    def lease_ttl(self) -> float:
        """Run lease TTL of the workers (seconds)."""
        return 0.4 if self.fast else 0.5

    @property
    def visibility_timeout(self) -> float:
        """How long a claimed outbox message stays hidden (seconds)."""
        return 0.8 if self.fast else 1.0


@dataclass(frozen=True, slots=True)
class DemoReport:
    """What the demo did, for the closing lines and for tests."""

    thread_id: str
    revision: int
    refund_id: str
    idempotency_key: str
    gateway_requests: int
    refunds_issued: int


# ------------------------------------------------------------------------ its own files


def _read_only(path: Path) -> sqlite3.Connection:
    # immutable: no locks, no -wal or -shm files made next to a database that may not
    # be ours (a database in use may hide its latest pages from this look; the demo
    # then refuses it, which is the safe side).
    uri = "file:" + urllib.parse.quote(str(path.resolve())) + "?mode=ro&immutable=1"
    return sqlite3.connect(uri, uri=True, timeout=5.0)


def _made_by_demo(db: Path) -> bool:
    """True if ``db`` is a flowy database carrying the demo's marker table."""
    try:
        with contextlib.closing(_read_only(db)) as conn:
            app_id = int(conn.execute("PRAGMA application_id").fetchone()[0])
            marked = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (MARKER_TABLE,)
            ).fetchone()
    except sqlite3.Error:
        return False
    return app_id == APPLICATION_ID and marked is not None


def _is_ledger(path: Path) -> bool:
    """True if ``path`` is a payments ledger the demo wrote (its header says so)."""
    try:
        with path.open("rb") as f:
            header = f.read(100)
    except OSError:
        return False
    return (
        len(header) == 100
        and header.startswith(b"SQLite format 3\x00")
        and int.from_bytes(header[68:72], "big") == LEDGER_APPLICATION_ID
    )


def _refuse(path: Path, why: str) -> DemoRefused:
    return DemoRefused(
        f"refusing to replace {str(path)!r}: {why}; the demo only replaces files it created "
        "itself - choose another --db path"
    )


def _check_replaceable(db: Path) -> None:
    """Raise :class:`DemoRefused` unless every file the demo would delete is its own."""
    if db.is_dir():
        raise DemoRefused(f"--db {str(db)!r} is a directory; give the demo a file path")
    if db.exists():
        if not _made_by_demo(db):
            raise _refuse(db, "it is not a database the demo created")
    else:
        for suffix in _SIDECARS:
            stray = Path(str(db) + suffix)
            if stray.exists():
                raise _refuse(stray, f"it belongs to a database file {str(db)!r} that is gone")
    ledger = payments_path(db)
    if ledger.exists() and not _is_ledger(ledger):
        raise _refuse(ledger, "it is not the demo's payments ledger")


def _fresh(settings: DemoSettings) -> Path:
    """Remove the demo's earlier files (only those) and make a new ledger."""
    db = settings.db
    _check_replaceable(db)
    db.parent.mkdir(parents=True, exist_ok=True)
    ledger = payments_path(db)
    for path in (db, ledger):
        for suffix in ("", *_SIDECARS):
            with contextlib.suppress(FileNotFoundError):
                Path(str(path) + suffix).unlink()
    with contextlib.closing(open_ledger(str(ledger))):
        pass
    return ledger


def _mark(db: Path) -> None:
    """Put the demo's marker table into its (just created) database."""
    with contextlib.closing(sqlite3.connect(db, timeout=5.0, isolation_level=None)) as conn:
        conn.execute(f"CREATE TABLE IF NOT EXISTS {MARKER_TABLE} (created_at REAL NOT NULL)")
        conn.execute(f"INSERT INTO {MARKER_TABLE} VALUES (?)", (time.time(),))


# -------------------------------------------------------------------------- the story


class _Story:
    def __init__(self, settings: DemoSettings, out: Console) -> None:
        self.settings = settings
        self.out = out
        self.printer = EventPrinter(out, path=main_path(build_graph()))
        self.chapter = 0

    def title(self, text: str) -> None:
        self.chapter += 1
        self.out.line()
        self.out.line(self.out.paint(f"{self.chapter}. {text}", "bold"))

    def note(self, text: str) -> None:
        self.out.line(f"  {text}")

    def person(self, who: str, text: str) -> None:
        self.out.line(f"  {self.out.paint(who, 'yellow', 'bold')} {self.out.sym('say')} {text}")

    async def follow(
        self, handle: StreamHandle[RefundState, DemoEffect]
    ) -> RunResult[RefundState, DemoEffect]:
        async for event in handle:
            self.printer.event(event)
        result = await handle.wait_result()
        self.note(result_line(self.out, result))
        return result

    async def worker(self, name: str, spec: str) -> tuple[int, float]:
        """Run ``flowy worker --once`` in a child process, echoing its output live."""
        s = self.settings
        cmd = [
            sys.executable, "-m", "flowy.cli", "worker",
            "--graph", spec, "--db", str(s.db), "--owner", name, "--once",
            "--lease-ttl", str(s.lease_ttl),
            "--visibility-timeout", str(s.visibility_timeout),
            "--idle-wait", "0.2",
            "--color", "always" if self.out.color else "never",
        ]  # fmt: skip
        self.note(
            self.out.paint(
                f"{name} runs in a separate process: a flowy worker on this database, graph {spec}",
                "dim",
            )
        )
        proc = await asyncio.create_subprocess_exec(
            *cmd,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={
                **os.environ,
                "PYTHONUNBUFFERED": "1",
                # The child draws the same symbols as this console (or ASCII ones).
                "PYTHONIOENCODING": "utf-8" if self.out.unicode else "ascii",
            },
        )
        assert proc.stdout is not None
        bar = self.out.paint(f"{name} {self.out.sym('bar')}", "magenta")
        while line := await proc.stdout.readline():
            self.out.line(f"  {bar} {line.decode('utf-8', 'replace').rstrip()}")
        code = await proc.wait()
        return code, time.time()


def _exit_text(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


async def run_demo(settings: DemoSettings, out: Console) -> DemoReport:
    """Play the refund story against a fresh SQLite file and print it to ``out``.

    Raises :class:`DemoError` if anything does not happen as scripted.
    """
    ledger = _fresh(settings)
    story = _Story(settings, out)
    dot = out.paint(out.sym("dot"), "dim")
    out.line(out.paint("flowy demo", "bold") + f" {dot} a refund agent that survives a crash")
    story.note(f"database  {settings.db} (SQLite, new)   thread  {THREAD_ID}")

    backend: SQLiteBackend[RefundState] = SQLiteBackend(settings.db)
    async with backend:
        _mark(settings.db)
        # The support app's runs hold a lease of their own; the workers take theirs.
        runner: Runner[RefundState, DemoEffect] = Runner(
            build_graph(), backend, run_lease=("support-app", 10.0)
        )

        story.title("A customer asks for a refund; the agent starts")
        story.person("customer", f'"{FIRST_MESSAGE}"')
        first = await story.follow(
            await runner.stream(
                THREAD_ID,
                {"order_id": "A-1001", "customer_messages": [FIRST_MESSAGE]},
                metadata={"payments_db": str(ledger.resolve()), "pace": settings.pace},
            )
        )
        token1 = _expect_token(first, RunStatus.SUSPENDED)

        story.title(
            f"A reviewer opens the approval card (token {token1}); the customer writes again"
        )
        story.person("customer", f'"{FOLLOW_UP}"')
        story.note(f"the app resumes {token1} at propose_refund with the new message")

        def back_to_proposal(state: RefundState, _pointer: str) -> tuple[RefundState, ResumePlan]:
            return state, resume_to("propose_refund")

        second = await story.follow(
            await runner.resume_stream(
                token1,
                state_overlay={
                    "customer_messages": [*first.state.get("customer_messages", []), FOLLOW_UP]
                },
                resume_target_policy=back_to_proposal,
            )
        )
        token2 = _expect_token(second, RunStatus.SUSPENDED)

        p1 = proposal_of(first.state)
        story.title(f"The reviewer approves the card they opened: {p1['id']} for {money_of(p1)}")
        story.note(f"resume({token1}, state_overlay={{approval of {p1['id']}}})")
        stale: Approval = {
            "proposal_id": p1["id"],
            "decision": "approve",
            "reviewer": "dana",
            "amount_cents": p1["amount_cents"],
        }
        try:
            await runner.resume(token1, state_overlay={"approval": stale})
        except ConcurrencyConflictError as exc:
            story.note(
                out.paint(f"{out.sym('fail')} rejected by OCC: ", "red", "bold")
                + f"ConcurrencyConflictError: {exc}"
            )
        else:
            raise DemoError(f"the stale approval with {token1} was not rejected")
        decision = await runner.evaluate_resume(token1)
        story.note(
            f"nothing ran and nothing was written; evaluate_resume({token1}) {out.sym('arrow')} "
            f"{decision.kind.value}, current token {decision.resume_token}"
        )

        p2 = proposal_of(second.state)
        story.title(f"The reviewer reloads the card and approves {p2['id']} for {money_of(p2)}")
        approval: Approval = {
            "proposal_id": p2["id"],
            "decision": "approve",
            "reviewer": "dana",
            "amount_cents": p2["amount_cents"],
        }
        story.note(f"resume({token2}, state_overlay={{approval of {p2['id']}}})")
        third = await story.follow(
            await runner.resume_stream(token2, state_overlay={"approval": approval})
        )
        handoff_token = _expect_token(third, RunStatus.HANDOFF)
        pending = await backend.consumer.pending_count()
        story.note(
            f"the checkpoint (revision {third.revision}) and the outbox message ({pending} "
            "waiting) were written in one SQLite transaction"
        )

        story.title("worker-1, a separate process, takes the hand-off and dies mid-refund")
        code, crashed_at = await story.worker("worker-1", CRASHING_GRAPH_SPEC)
        if code == 0:
            raise DemoError("worker-1 was expected to crash but exited normally")
        snapshot, revision = await backend.checkpointer.load(THREAD_ID)
        holder = await backend.leases.holder(THREAD_ID)
        story.note(
            out.paint(f"{out.sym('crash')} worker-1 {_exit_text(code)}", "red", "bold")
            + ": no ack, no checkpoint"
        )
        lease_text = (
            f"held by {holder.owner} for {max(holder.expires_at - time.time(), 0):.1f}s more"
            if holder is not None
            else "expired"
        )
        story.note(
            f"head still at revision {revision} ({snapshot.status.value}, hand-off "
            f"{snapshot.handoff_status.value}) {dot} lease {lease_text} {dot} "
            f"outbox: {await backend.consumer.pending_count()} message not acked"
        )
        if revision != handoff_token.snapshot_revision:
            raise DemoError(f"the crash moved the head to revision {revision}")

        story.title("Waiting for the dead worker's lease and message to time out")
        deadline = crashed_at + settings.visibility_timeout + 0.05
        story.note(
            f"lease TTL {settings.lease_ttl:g}s, visibility timeout "
            f"{settings.visibility_timeout:g}s {out.sym('wait')}"
        )
        if out.interactive:
            lease_end = holder.expires_at if holder is not None else 0.0
            ticks = max(int((deadline - time.time()) / 0.1), 0)
            for _ in range(ticks):
                now = time.time()
                out.redraw(
                    f"  {out.sym('wait')} lease free in {max(lease_end - now, 0):.1f}s {dot} "
                    f"message visible in {max(deadline - now, 0):.1f}s"
                )
                await asyncio.sleep(0.1)
            out.redraw("")
        await asyncio.sleep(max(deadline - time.time(), 0.0))
        if await backend.leases.holder(THREAD_ID) is not None:
            raise DemoError("worker-1's lease did not expire")
        story.note(f"{out.paint(out.sym('ok'), 'green')} lease expired, message visible again")

        story.title("worker-2 recovers from the last checkpoint")
        code, _ = await story.worker("worker-2", GRAPH_SPEC)
        if code != 0:
            raise DemoError(f"worker-2 failed ({_exit_text(code)})")
        snapshot, revision = await backend.checkpointer.load(THREAD_ID)
        if (
            snapshot.status is not RunStatus.COMPLETED
            or snapshot.handoff_status is not HandoffStatus.NONE
        ):
            raise DemoError(f"the thread ended {snapshot.status.value}, not completed")

        story.title("Exactly once")
        key = proposal_of(snapshot.state)["idempotency_key"]
        refund = refund_of(snapshot.state)
        rows = [row for row in read_ledger(ledger) if row[0] == key]
        requests = rows[0][3] if rows else 0
        story.note(
            f"payments ledger: {len(rows)} refund for key {key} ({requests} requests) "
            f"{dot} {refund['refund_id']} {money(refund['amount_cents'])}"
        )
        story.note(f"thread {THREAD_ID}: {out.status(RunStatus.COMPLETED)} at revision {revision}")
        if len(rows) != 1 or refund["idempotency_key"] != key:
            raise DemoError(f"expected exactly one refund for {key}, the ledger has {len(rows)}")
        return DemoReport(
            thread_id=THREAD_ID,
            revision=revision,
            refund_id=refund["refund_id"],
            idempotency_key=key,
            gateway_requests=requests,
            refunds_issued=len(rows),
        )


def _expect_token(result: RunResult[RefundState, DemoEffect], status: RunStatus) -> ResumeToken:
    if result.status is not status or result.resume_token is None:
        raise DemoError(
            f"expected the run to end {status.value}, it ended {result.status.value} "
            f"({result.reason}): {result.error!r}"
        )
    return result.resume_token


async def cmd_demo(args: argparse.Namespace, out: Console) -> int:
    """``flowy demo``."""
    db = Path(args.db)
    settings = DemoSettings(db=db, fast=args.fast, color=args.color)
    try:
        report = await run_demo(settings, out)
    except DemoRefused as exc:
        raise CliError(describe_failure(exc), 2) from exc
    except DemoError as exc:
        raise CliError(f"the demo failed: {describe_failure(exc)}") from exc
    program = flowy_program()
    store = Store(str(db), str(db), f"--db {quote(db)}")
    out.line()
    out.line(
        out.paint("The thread's history", "bold")
        + f" ({program} history {report.thread_id} --db {quote(db)}):"
    )
    async with SQLiteBackend[RefundState](db) as backend:
        await print_history(out, backend.checkpointer, store, report.thread_id, 50)
    out.line()
    out.line(out.paint("Look inside it yourself:", "bold"))
    for command in inspect_commands(db, program):
        out.line(f"  {command}")
    return 0


# ----------------------------------------------------------------------- printed commands


def _shown_path(path: Path) -> str:
    """``path`` relative to the current directory when it lies below it, else absolute."""
    absolute = Path(os.path.abspath(path))
    try:
        return str(absolute.relative_to(Path.cwd()))
    except ValueError:
        return str(absolute)


def flowy_program() -> str:
    """How to type this environment's ``flowy`` from the current directory: ``flowy``
    when that is the one on ``PATH``, else a path to it (or to ``python -m flowy.cli``)."""
    bindir = Path(sys.executable).parent
    own = bindir / ("flowy.exe" if os.name == "nt" else "flowy")
    found = shutil.which("flowy")
    if found is not None and own.exists():
        with contextlib.suppress(OSError):
            if os.path.samefile(found, own):
                return "flowy"
    if own.exists():
        return quote(_shown_path(own))
    return f"{quote(_shown_path(Path(sys.executable)))} -m flowy.cli"


def inspect_commands(db: Path, program: str = "flowy") -> list[str]:
    """The commands that look inside the demo's database."""
    q = quote(db)
    return [
        f"{program} threads --db {q}",
        f"{program} show {THREAD_ID} --db {q}",
        f"{program} history {THREAD_ID} --db {q}",
        f"{program} graph {GRAPH_SPEC}",
    ]


def describe_failure(exc: BaseException) -> str:
    """One line for a demo that went wrong."""
    if isinstance(exc, DemoError | FlowyError):
        return clean(" ".join(str(exc).split()))
    return f"{type(exc).__name__}: {clean(' '.join(str(exc).split()))}"
