"""``flowy demo``: play the refund agent of :mod:`flowy.cli.demo` against a SQLite file
and tell the story as it happens.

Which files the demo may replace, and the commands it prints at the end, are in
:mod:`._story_files`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .._errors import ConcurrencyConflictError
from .._events import StreamHandle
from .._plan import ResumePlan, resume_to
from .._results import RunResult
from .._runner import Runner
from .._worker import Outcome, Worker, WorkerOptions
from ..sqlite import SQLiteBackend
from ..storage import (
    ActivityStatus,
    HandoffIntent,
    HandoffStatus,
    ResumeToken,
    RunStatus,
    Signal,
)
from ._history import print_history
from ._options import CliError, quote
from ._render import (
    ColorMode,
    Console,
    EventPrinter,
    effect_text,
    main_path,
    result_line,
)
from ._store import Store
from ._story_files import (
    MARKER_TABLE,
    DemoError,
    DemoRefusedError,
    describe_failure,
    flowy_program,
    fresh_files,
    inspect_commands,
    mark_as_demo,
)
from .demo import (
    CRASHING_GRAPH_SPEC,
    FIRST_MESSAGE,
    FOLLOW_UP,
    GRAPH_SPEC,
    REVIEW_SIGNAL,
    SENIOR_REVIEWER,
    THREAD_ID,
    Approval,
    DemoEffect,
    RefundState,
    activity_key,
    approval_payload,
    approval_timeout,
    build_graph,
    money,
    money_of,
    proposal_of,
    read_ledger,
    refund_of,
)

__all__ = [
    "DEFAULT_DEMO_DB",
    "MARKER_TABLE",
    "DemoError",
    "DemoRefusedError",
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
    escalated_to: str
    signals: int
    activity_key: str
    activity_attempts: int


# -------------------------------------------------------------------------- the story


class _Story:
    def __init__(self, settings: DemoSettings, out: Console) -> None:
        self.settings = settings
        self.out = out
        self.printer = EventPrinter(out, path=main_path(build_graph()))
        self.chapter = 0
        self.results: list[RunResult[RefundState, DemoEffect]] = []

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
        async with handle:  # Ctrl-C: the run's cancel save and lease release come first
            async for event in handle:
                self.printer.event(event)
            result = await handle.wait_result()
        self.note(result_line(self.out, result))
        return result

    def on_result(self, _intent: HandoffIntent, result: RunResult[RefundState, DemoEffect]) -> None:
        """The ``on_result`` hook of the app's worker: print how the run it resumed ended."""
        for emitted in result.effects:
            self.out.line(
                f"      {self.out.paint(self.out.sym('effect'), 'magenta')} effect "
                f"{effect_text(self.out, emitted)}"
            )
        self.note(result_line(self.out, result))
        self.results.append(result)

    def last_result(self) -> RunResult[RefundState, DemoEffect]:
        """The last run the app's worker resumed."""
        if not self.results:
            raise DemoError("the app's worker resumed no run")
        return self.results[-1]

    async def signal(
        self,
        runner: Runner[RefundState, DemoEffect],
        backend: SQLiteBackend[RefundState],
        approval: Approval,
        signal_id: str,
    ) -> Signal:
        """Send ``approval`` as the ``"review"`` signal, and say what was stored."""
        self.note(
            f'signal({THREAD_ID}, "{REVIEW_SIGNAL}", {{approval of {approval["proposal_id"]}}}, '
            f'signal_id="{signal_id}")'
        )
        sent = await runner.signal(
            THREAD_ID, REVIEW_SIGNAL, approval_payload(approval), signal_id=signal_id
        )
        pending = await backend.consumer.pending_count()
        self.note(
            f"{self.out.sym('arrow')} signal #{sent.seq} stored in the thread's inbox; the thread "
            f"waits for it, so a wake-up message went to the outbox ({pending} waiting)"
        )
        if pending != 1:
            raise DemoError(f"the signal {signal_id!r} left {pending} wake-up messages")
        return sent

    async def wake(
        self, app: Worker[RefundState, DemoEffect], backend: SQLiteBackend[RefundState]
    ) -> RunResult[RefundState, DemoEffect]:
        """Let the app's worker take the one wake-up message (and only it: the hand-off
        its run may enqueue is left to the worker processes)."""
        s = self.settings
        messages = await backend.consumer.claim(1, s.visibility_timeout, 1.0)
        if not messages:
            raise DemoError("no wake-up message in the outbox")
        intent = messages[0].intent
        self.note(
            f"a flowy.Worker in this process takes it: {self.out.sym('claim')} "
            f"{intent.resume_token} ({intent.reason} at {intent.execution_pointer})"
        )
        before = len(self.results)
        outcome = await app.process(messages[0])
        if outcome is not Outcome.RESUMED or len(self.results) == before:
            raise DemoError(f"the app's worker did not resume the thread ({outcome.value})")
        return self.results[-1]

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
    ledger = fresh_files(settings.db)
    story = _Story(settings, out)
    dot = out.paint(out.sym("dot"), "dim")
    arrow = out.sym("arrow")
    out.line(
        out.paint("flowy demo", "bold")
        + f" {dot} a refund agent that waits for a reviewer, escalates and survives a crash"
    )
    story.note(f"database  {settings.db} (SQLite, new)   thread  {THREAD_ID}")

    backend: SQLiteBackend[RefundState] = SQLiteBackend(settings.db)
    async with backend:
        mark_as_demo(settings.db)
        checkpointer = backend.checkpointer
        # The support app's runs hold a lease of their own; the workers take theirs.
        runner: Runner[RefundState, DemoEffect] = Runner(
            build_graph(), backend, run_lease=("support-app", 10.0)
        )
        # The app's own flowy.Worker: it fires due timers and takes the wake-up messages
        # of signals; the hand-off goes to the worker processes.
        app = Worker(
            runner,
            options=WorkerOptions(
                owner="app-worker",
                lease_ttl=settings.lease_ttl,
                visibility_timeout=settings.visibility_timeout,
                timer_interval=None,
                on_result=story.on_result,
            ),
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
        token1 = _expect_token(first, RunStatus.WAITING)
        waiting, _ = await checkpointer.load(THREAD_ID)
        timers = [t for t in await checkpointer.timers(limit=100) if t.thread_id == THREAD_ID]
        if waiting.wake_at is None or len(timers) != 1:
            raise DemoError("the wait for a review was saved without its deadline")
        wake_at = waiting.wake_at
        story.note(
            f"a durable wait: revision {token1.snapshot_revision} holds its deadline, indexed "
            f"as a timer due in {max(wake_at - time.time(), 0):.1f}s (`flowy timers` lists it); "
            f'a "{REVIEW_SIGNAL}" signal ends it sooner'
        )

        p1 = proposal_of(first.state)
        timeout = approval_timeout(settings.pace)
        story.title(
            f"Nobody decides on {p1['id']} within {timeout:g}s: the timer fires, the run escalates"
        )
        if out.interactive:
            while (left := wake_at - time.time()) > 0:
                out.redraw(f"  {out.sym('wait')} the timer is due in {left:.1f}s")
                await asyncio.sleep(min(left, 0.1))
            out.redraw("")
        await asyncio.sleep(max(wake_at - time.time(), 0.0) + 0.02)
        story.note(
            "a flowy.Worker in this process fires the due timer: worker.fire_timers() "
            "(a `flowy worker` process does the same)"
        )
        if await app.fire_timers() != 1:
            raise DemoError("the due timer of the wait for a review did not fire")
        escalated = story.last_result()
        token_escalated = _expect_token(escalated, RunStatus.WAITING)
        if escalated.state.get("escalated_to") != SENIOR_REVIEWER:
            raise DemoError("the timer did not take the run to escalate")

        story.title("The customer writes again")
        story.person("customer", f'"{FOLLOW_UP}"')
        messages = [*escalated.state.get("customer_messages", []), FOLLOW_UP]

        def back_to_proposal(state: RefundState, _pointer: str) -> tuple[RefundState, ResumePlan]:
            return state, resume_to("propose_refund")

        story.note(
            f"the support app resumes {token1}, the token it got when the run started, at "
            "propose_refund with the new message"
        )
        try:
            await runner.resume(
                token1,
                state_overlay={"customer_messages": messages},
                resume_target_policy=back_to_proposal,
            )
        except ConcurrencyConflictError as exc:
            story.note(
                out.paint(f"{out.sym('fail')} rejected by OCC: ", "red", "bold")
                + f"ConcurrencyConflictError: {exc}"
            )
        else:
            raise DemoError(f"the resume with the stale token {token1} was not rejected")
        decision = await runner.evaluate_resume(token1)
        if decision.resume_token != token_escalated:
            raise DemoError(f"evaluate_resume({token1}) found {decision.resume_token}")
        story.note(
            f"the escalation moved the thread on; nothing ran and nothing was written: "
            f"evaluate_resume({token1}) {arrow} {decision.kind.value}, current token "
            f"{decision.resume_token}"
        )
        story.note(f"the app resumes {token_escalated} at propose_refund with the new message")
        second = await story.follow(
            await runner.resume_stream(
                token_escalated,
                state_overlay={"customer_messages": messages},
                resume_target_policy=back_to_proposal,
            )
        )
        _expect_token(second, RunStatus.WAITING)
        p2 = proposal_of(second.state)

        story.title(
            f"{SENIOR_REVIEWER} approves the card she opened earlier: {p1['id']} for {money_of(p1)}"
        )
        stale: Approval = {
            "proposal_id": p1["id"],
            "decision": "approve",
            "reviewer": SENIOR_REVIEWER,
            "amount_cents": p1["amount_cents"],
        }
        stale_id = f"review-{SENIOR_REVIEWER}-{p1['id']}"
        sent = await story.signal(runner, backend, stale, stale_id)
        third = await story.wake(app, backend)
        _expect_token(third, RunStatus.WAITING)
        if third.state.get("approval") != stale or proposal_of(third.state) != p2:
            raise DemoError("the stale decision was not kept as it came, unapplied")
        again = await runner.signal(
            THREAD_ID, REVIEW_SIGNAL, approval_payload(stale), signal_id=stale_id
        )
        inbox = await checkpointer.signals(THREAD_ID)
        pending = await backend.consumer.pending_count()
        story.note(
            f"the review tool sends it again (a webhook retry, same signal_id) {arrow} "
            f"signal #{again.seq} as stored before, nothing new: {_count(len(inbox), 'signal')} "
            f"in the inbox, {_count(pending, 'wake-up message')} in the outbox"
        )
        if again.seq != sent.seq or len(inbox) != 1 or pending != 0:
            raise DemoError(f"re-sending signal_id {stale_id!r} stored or woke something new")

        story.title(
            f"{SENIOR_REVIEWER} reloads the card and approves {p2['id']} for {money_of(p2)}"
        )
        approval: Approval = {
            "proposal_id": p2["id"],
            "decision": "approve",
            "reviewer": SENIOR_REVIEWER,
            "amount_cents": p2["amount_cents"],
        }
        await story.signal(runner, backend, approval, f"review-{SENIOR_REVIEWER}-{p2['id']}")
        handed = await story.wake(app, backend)
        handoff_token = _expect_token(handed, RunStatus.HANDOFF)
        pending = await backend.consumer.pending_count()
        story.note(
            f"the checkpoint (revision {handed.revision}) and the outbox message ({pending} "
            "waiting) were written in one SQLite transaction"
        )

        key = activity_key(p2)
        story.title("worker-1, a separate process, takes the hand-off and dies mid-refund")
        code, crashed_at = await story.worker("worker-1", CRASHING_GRAPH_SPEC)
        if code == 0:
            raise DemoError("worker-1 was expected to crash but exited normally")
        snapshot, revision = await checkpointer.load(THREAD_ID)
        holder = await backend.leases.holder(THREAD_ID)
        story.note(
            out.paint(f"{out.sym('crash')} worker-1 {_exit_text(code)}", "red", "bold")
            + ": no ack, no checkpoint"
        )
        entries = await checkpointer.journal(THREAD_ID)
        if [(e.key, e.status, e.attempts) for e in entries] != [(key, ActivityStatus.STARTED, 1)]:
            raise DemoError(f"the journal after the crash is not one started {key!r}: {entries}")
        refunds = [row for row in read_ledger(ledger) if row[0] == p2["idempotency_key"]]
        story.note(
            f"journal: {key} {entries[0].status.value} (attempt 1), its outcome never recorded "
            f"{dot} payments ledger: {_count(len(refunds), 'refund')}"
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

        story.title("worker-2 recovers from the last checkpoint and the journal")
        code, _ = await story.worker("worker-2", GRAPH_SPEC)
        if code != 0:
            raise DemoError(f"worker-2 failed ({_exit_text(code)})")
        snapshot, revision = await checkpointer.load(THREAD_ID)
        if (
            snapshot.status is not RunStatus.COMPLETED
            or snapshot.handoff_status is not HandoffStatus.NONE
        ):
            raise DemoError(f"the thread ended {snapshot.status.value}, not completed")

        story.title("Exactly once")
        idempotency_key = proposal_of(snapshot.state)["idempotency_key"]
        refund = refund_of(snapshot.state)
        record = await checkpointer.get_activity(THREAD_ID, key)
        if record is None or record.status is not ActivityStatus.SUCCEEDED:
            raise DemoError(f"the journal has no succeeded {key!r}: {record}")
        story.note(
            f"journal: {key} {record.status.value} after {_count(record.attempts, 'attempt')} "
            f"{arrow} {refund['refund_id']} {money(refund['amount_cents'])}, its outcome found "
            "by reconcile after the crash (`flowy show` lists the journal)"
        )
        rows = [row for row in read_ledger(ledger) if row[0] == idempotency_key]
        requests = rows[0][3] if rows else 0
        story.note(
            f"payments ledger: {_count(len(rows), 'refund')} for key {idempotency_key} "
            f"({_count(requests, 'gateway request')}) {dot} {refund['refund_id']} "
            f"{money(refund['amount_cents'])}"
        )
        story.note(f"thread {THREAD_ID}: {out.status(RunStatus.COMPLETED)} at revision {revision}")
        if len(rows) != 1 or refund["idempotency_key"] != idempotency_key:
            raise DemoError(
                f"expected exactly one refund for {idempotency_key}, the ledger has {len(rows)}"
            )
        if requests != 1 or record.attempts != 1 or record.result != refund:
            raise DemoError(
                f"the gateway was asked {requests} times ({record.attempts} attempts) for "
                f"{idempotency_key}; reconcile should have found the first refund"
            )
        return DemoReport(
            thread_id=THREAD_ID,
            revision=revision,
            refund_id=refund["refund_id"],
            idempotency_key=idempotency_key,
            gateway_requests=requests,
            refunds_issued=len(rows),
            escalated_to=snapshot.state.get("escalated_to", ""),
            signals=len(await checkpointer.signals(THREAD_ID)),
            activity_key=key,
            activity_attempts=record.attempts,
        )


def _count(n: int, word: str) -> str:
    """``1 refund``, ``2 refunds``."""
    return f"{n} {word}{'' if n == 1 else 's'}"


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
    except DemoRefusedError as exc:
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
