"""The ``flowy`` command: its parser, and running one subcommand.

Subcommands: ``demo``, ``threads``, ``show``, ``history``, ``timers``, ``graph``,
``check``, ``recover``, ``resume``, ``fork``, ``signal``, ``worker``, ``dead-letters``,
``schedules``, ``queues`` and ``ui``; every one but ``demo``, ``graph`` and ``check`` works on any
store, named by ``--backend URL`` (or ``FLOWY_BACKEND``), or ``--db FILE`` for a SQLite
file. A mistake
prints one line on standard error, never a traceback, and exits 2 when the command line
is wrong (a usage
error, a bad URL, a missing adapter or file, a ``--graph`` that cannot be loaded) or 1
when the operation fails. Standard library only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn, Protocol, cast

from .._errors import BackendURLError, FlowyError
from .._runner import DEFAULT_HANDOFF_STALE_AFTER, DEFAULT_LEASE_TTL
from .._version import __version__
from ..storage import RunStatus
from ._bulk import RESUMABLE, cmd_dead_letters_any, cmd_resume_any
from ._check import cmd_check
from ._history import cmd_history
from ._inspect import cmd_graph, cmd_timers
from ._operate import cmd_fork, cmd_recover, cmd_signal
from ._options import (
    CliError,
    after_revision,
    concurrency,
    count,
    one_line,
    positive_seconds,
    revision,
    seconds,
    seed,
)
from ._queues import add_queues, cmd_threads_any, queue_name
from ._render import ColorMode, Console, set_console
from ._schedules import cmd_schedules, interval
from ._serve import cmd_worker
from ._show import cmd_show
from ._stop import CANCELABLE, add_filters, age, cmd_cancel, cmd_terminate
from ._store import ENV_VAR, scrub
from ._story import DEFAULT_DEMO_DB, cmd_demo
from ._ui import cmd_ui, port
from ._watch import cmd_watch

__all__ = ["CliError", "build_parser", "main"]


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (raised, printed by ``main``)."""

    def error(self, message: str) -> NoReturn:
        raise CliError(f"{message} (see '{self.prog} --help')", 2, prog=self.prog)


_GRAPH = "MODULE:ATTR"


class _Subcommands(Protocol):
    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser: ...


def _parents() -> dict[str, _Parser]:
    common = _Parser(add_help=False)
    common.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="colour the output: auto (a terminal, unless NO_COLOR is set), always, never",
    )
    store = _Parser(add_help=False)
    where = store.add_argument_group("store")
    which = where.add_mutually_exclusive_group()
    which.add_argument(
        "--backend",
        metavar="URL",
        help="the store: sqlite:///FILE, postgresql://..., redis://..., redis+cluster://..., "
        f"dynamodb://TABLE?region=..., memory:// (default: ${ENV_VAR})",
    )
    which.add_argument(
        "--db",
        type=Path,
        metavar="FILE",
        help="a flowy SQLite database file (short for --backend sqlite:///FILE)",
    )
    where.add_argument(
        "--codec",
        metavar=_GRAPH,
        help="how states were saved: a codec (object, class or factory) or the state class "
        "to decode them into (default: JSON, or the state type of a typed --graph)",
    )
    as_json = _Parser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="print JSON for scripts")
    return {"common": common, "store": store, "json": as_json}


def _lease_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--owner", metavar="NAME", help="the run lease's owner name (default: host-pid)")
    p.add_argument(
        "--lease-ttl",
        type=positive_seconds,
        default=DEFAULT_LEASE_TTL,
        metavar="S",
        help=f"seconds a run lease lasts between renewals (default: {DEFAULT_LEASE_TTL:g})",
    )


def _stale_after(p: argparse.ArgumentParser, *, default_text: str) -> None:
    p.add_argument(
        "--stale-after",
        type=seconds,
        default=DEFAULT_HANDOFF_STALE_AFTER,
        metavar="S",
        help=f"a pending hand-off is stale after S seconds ({default_text})",
    )


def _add_inspect(sub: _Subcommands) -> None:
    parents = _parents()
    store = [parents["common"], parents["store"], parents["json"]]
    p = sub.add_parser(
        "threads",
        parents=store,
        help="list the threads of a store, a page at a time",
        description="List threads ordered by id (--recent: most recently saved first, to "
        "the second): status, reason, pointer, revision, hand-off, dead-lettered hand-off "
        "messages, updated at.",
    )
    p.add_argument("--limit", type=count, default=100, metavar="N", help="at most N threads")
    p.add_argument("--after", metavar="THREAD", help="start after this thread id (the next page)")
    p.add_argument(
        "--recent",
        action="store_true",
        help="most recently saved first, to the second (then by thread id, descending)",
    )
    p.add_argument(
        "--before",
        metavar="SECOND~THREAD",
        help="with --recent, start below this save second and thread id (the next page)",
    )
    p.add_argument(
        "--version",
        metavar="V",
        help="only the threads whose head was saved by graph version V (flowy graph prints "
        "a graph's version)",
    )
    p.add_argument(
        "--queue",
        type=queue_name,
        metavar="NAME",
        help="the threads with a message in queue NAME, in the order a worker takes them",
    )
    p.set_defaults(handler=cmd_threads_any)

    p = sub.add_parser(
        "show",
        parents=store,
        help="show a thread's current snapshot",
        description="Show a thread's head snapshot: state, budgets, lease holder, "
        "dead-lettered hand-off, and the command that moves it on.",
    )
    p.add_argument("thread", metavar="THREAD", help="the thread id")
    p.add_argument(
        "--graph",
        metavar=_GRAPH,
        help="the thread's graph: shows its budget limits and decodes typed states",
    )
    p.set_defaults(handler=cmd_show)

    p = sub.add_parser(
        "history",
        parents=store,
        help="list a thread's saved revisions, newest first",
        description="List the saved revisions of a thread, newest first.",
    )
    p.add_argument("thread", metavar="THREAD", help="the thread id")
    p.add_argument("--limit", type=count, default=50, metavar="N", help="at most N revisions")
    p.add_argument(
        "--graph", metavar=_GRAPH, help="the thread's graph: decodes typed states (with --json)"
    )
    p.add_argument(
        "--diff",
        action="store_true",
        help="show what changed in the state from each revision to the next, oldest first",
    )
    p.set_defaults(handler=cmd_history)

    p = sub.add_parser(
        "watch",
        parents=store,
        help="follow a thread: each saved snapshot and its nodes' progress, until it ends",
        description="Follow a thread from any process: print each snapshot it saves, in "
        "order, and the progress its nodes send (flowy.live.progress) between them, until "
        "it completes (exit 0) or fails (exit 1). A thread not saved yet is waited for. "
        "Progress from another process needs a store with a channel (PostgreSQL, Redis); "
        "SQLite and DynamoDB show the snapshots only.",
    )
    p.add_argument("thread", metavar="THREAD", help="the thread id")
    p.add_argument(
        "--after",
        type=after_revision,
        metavar="REV",
        help="start after revision REV (0: every kept snapshot); default: the current head",
    )
    p.add_argument(
        "--poll",
        type=positive_seconds,
        default=0.5,
        metavar="S",
        help="seconds between reads of the store when nothing says the thread moved (default: 0.5)",
    )
    p.add_argument(
        "--graph", metavar=_GRAPH, help="the thread's graph: decodes typed states (with --json)"
    )
    p.set_defaults(handler=cmd_watch)

    p = sub.add_parser(
        "timers",
        parents=store,
        help="list the wake-up times of waiting threads, soonest first",
        description="List the timers of threads that sleep or wait for a signal with a "
        "deadline, soonest first: due ones and upcoming ones (--due: only the due).",
    )
    p.add_argument("--due", action="store_true", help="only the timers that are due now")
    p.add_argument("--limit", type=count, default=100, metavar="N", help="at most N timers")
    p.set_defaults(handler=cmd_timers)

    p = sub.add_parser(
        "graph",
        parents=[parents["common"], parents["json"]],
        help="print a graph's nodes and routes (or Mermaid, or draw it as SVG)",
        description="Load a flowy.Graph (or a zero-argument factory returning one) and "
        "print its nodes and routes.",
    )
    p.add_argument("spec", metavar=_GRAPH, help="the graph, or a function returning it")
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--mermaid", action="store_true", help="print a Mermaid flowchart")
    shape.add_argument(
        "--svg",
        metavar="FILE",
        help="write the graph drawn as SVG to FILE ('-': print it)",
    )
    p.set_defaults(handler=cmd_graph)

    p = sub.add_parser(
        "check",
        parents=[parents["common"]],
        help="run a graph through random crashes and faults, and check it stays safe",
        description="Run a graph through its scenario under random fault schedules "
        "(crashes at every save, lost acks, lease takeovers, concurrent resumes, store "
        "faults) and check that the thread ends well, that no hand-off is lost or resumed "
        "twice and that activities ran once, with your invariants and post-conditions. "
        "A failure is shrunk and printed with a command that replays it.",
    )
    p.add_argument("spec", metavar=_GRAPH, help="the graph, or a function returning it")
    p.add_argument(
        "--scenario",
        required=True,
        metavar="MODULE:FN",
        help="a function returning a fresh flowy.testing.Scenario for each run",
    )
    p.add_argument("--seeds", type=count, default=1000, metavar="N", help="schedules to try")
    p.add_argument(
        "--seed", type=seed, default=0, metavar="N", help="the first seed (or the replayed one)"
    )
    p.add_argument(
        "--max-faults",
        type=count,
        default=3,
        metavar="N",
        help="the most faults in one schedule (default: 3)",
    )
    p.add_argument(
        "--backend",
        metavar="URL",
        help="a store to run on: the check writes only in a scratch namespace of its own "
        "there (a schema, key namespace, table or file), removed afterwards; a store "
        "that cannot be namespaced is refused (default: a fresh memory store per run; "
        f"${ENV_VAR} is not used)",
    )
    p.add_argument(
        "--replay",
        metavar="SCHEDULE",
        help="run only this schedule, as a failure prints it (e.g. crash-before@6)",
    )
    p.set_defaults(handler=cmd_check)


def _add_operate(sub: _Subcommands) -> None:
    parents = _parents()
    store = [parents["common"], parents["store"], parents["json"]]
    p = sub.add_parser(
        "recover",
        parents=store,
        help="list (or, with --graph, re-enqueue) stale and orphaned hand-offs",
        description="List hand-offs that are orphaned or stale pending; with --graph, "
        "re-enqueue them for the workers running that graph.",
    )
    p.add_argument("--graph", metavar=_GRAPH, help="re-enqueue for workers of this graph")
    _stale_after(p, default_text=f"default: {DEFAULT_HANDOFF_STALE_AFTER:g}")
    p.add_argument(
        "--force",
        action="store_true",
        help="also re-enqueue enqueued hand-offs (when their message is known lost)",
    )
    p.add_argument(
        "--thread", action="append", metavar="THREAD", help="only this thread (repeatable)"
    )
    p.add_argument("--limit", type=count, default=1000, metavar="N", help="at most N threads")
    p.set_defaults(handler=cmd_recover)

    p = sub.add_parser(
        "resume",
        parents=store,
        help="resume a thread at a revision and stream its events",
        description="Resume a thread from a revision - a resume token THREAD@N as flowy "
        "prints it, or THREAD --revision N - with the graph, printing events as they stream.",
    )
    p.add_argument("thread", nargs="?", metavar="THREAD[@N]", help="a resume token, or a thread id")
    p.add_argument(
        "--revision",
        type=revision,
        metavar="N",
        help="the revision to resume (the thread's head; not needed with THREAD@N)",
    )
    p.add_argument("--graph", required=True, metavar=_GRAPH, help="the thread's graph")
    _lease_options(p)
    p.add_argument(
        "--overlay", metavar="JSON", help="a JSON state update merged by the graph's reducer"
    )
    p.add_argument("--at", metavar="NODE", help="resume at NODE instead of the saved pointer")
    add_filters(p, RESUMABLE, "resume", default=(RunStatus.CANCELED,))
    p.set_defaults(handler=cmd_resume_any)

    p = sub.add_parser(
        "worker",
        parents=[parents["common"], parents["store"]],
        help="run a background worker on a store's outbox",
        description="Claim hand-offs from the store's outbox and resume them with the "
        "graph. With --once, the exit status is 1 if a message failed or was dead-lettered.",
    )
    app = p.add_mutually_exclusive_group(required=True)
    app.add_argument("--graph", metavar=_GRAPH, help="the graph to resume with")
    app.add_argument(
        "--app",
        metavar="MODULE:FACTORY",
        help="a function taking the opened backend and returning a flowy.Worker (or "
        "flowy.Runner): its runner, and the bindings its resume_options give each run",
    )
    _lease_options(p)
    p.add_argument(
        "--once", action="store_true", help="exit when the outbox is idle (run_until_idle)"
    )
    p.add_argument(
        "--visibility-timeout",
        type=positive_seconds,
        metavar="S",
        help="how long a claimed message stays hidden (default: 4 x lease TTL)",
    )
    p.add_argument(
        "--concurrency", type=concurrency, default=1, metavar="N", help="runs in flight at most"
    )
    p.add_argument(
        "--idle-wait",
        type=seconds,
        default=0.5,
        metavar="S",
        help="with --once: exit after S seconds without a message (default: 0.5)",
    )
    p.add_argument(
        "--poll-interval",
        type=positive_seconds,
        default=1.0,
        metavar="S",
        help="seconds a claim waits for a message before looking again (default: 1)",
    )
    p.add_argument(
        "--recovery-interval",
        type=seconds,
        default=60.0,
        metavar="S",
        help="re-enqueue stale/orphaned hand-offs every S seconds (0: never; default: 60)",
    )
    p.add_argument(
        "--retry-delay",
        type=seconds,
        default=1.0,
        metavar="S",
        help="a failed message is delivered again after S seconds, doubling on each "
        "failure up to 300 (default: 1)",
    )
    p.add_argument(
        "--queue",
        dest="queues",
        action="append",
        type=queue_name,
        metavar="NAME",
        help="serve queue NAME (repeat for several; default: the default queue)",
    )
    _stale_after(p, default_text="for --recovery-interval")
    p.set_defaults(handler=cmd_worker)

    p = sub.add_parser(
        "fork",
        parents=store,
        help="start a new thread from a past revision of a thread (it stays as it is)",
        description="Copy revision N of a thread into a new thread (suspended, with its "
        "lineage), brought to the graph's version by its migrations, with an optional "
        "overlay and resume node; then resume the fork with the token printed.",
    )
    p.add_argument("thread", metavar="THREAD", help="the thread to fork")
    p.add_argument(
        "--revision", type=revision, required=True, metavar="N", help="the revision to copy"
    )
    p.add_argument("--new-thread", required=True, metavar="ID", help="the id of the new thread")
    p.add_argument("--graph", required=True, metavar=_GRAPH, help="the thread's graph")
    p.add_argument("--overlay", metavar="JSON", help="merged into the copied state")
    p.add_argument("--at", metavar="NODE", help="the node the fork resumes at")
    p.set_defaults(handler=cmd_fork)

    p = sub.add_parser(
        "signal",
        parents=[parents["common"], parents["store"]],
        help="send a signal to a thread (what its wait_for waits for)",
        description="Store a signal in a thread's inbox; a thread waiting for it is woken "
        "by a worker, otherwise its next wait for that name takes it.",
    )
    p.add_argument("thread", metavar="THREAD", help="the thread id")
    p.add_argument("name", metavar="NAME", help="the signal's name")
    p.add_argument(
        "--json", dest="payload", metavar="PAYLOAD", help="the signal's payload, as JSON"
    )
    p.add_argument(
        "--id",
        dest="signal_id",
        metavar="ID",
        help="the signal's id: sending the same id again stores nothing (default: random)",
    )
    p.set_defaults(handler=cmd_signal)

    p = sub.add_parser(
        "cancel",
        parents=store,
        help="cancel a thread (or, with filters, many) from any process",
        description="Cancel a thread: its head becomes canceled at once (suspended, waiting "
        "or handed off), or at the next save of the worker running it. Resume it on purpose "
        "later with `flowy resume`, or fork it. With filters instead of THREAD, cancel every "
        "matching thread in pages (--dry-run lists them); safe to interrupt and run again.",
    )
    p.add_argument("thread", nargs="?", metavar="THREAD", help="the thread to cancel")
    p.add_argument("--reason", metavar="TEXT", help="why (kept in the thread's reason)")
    add_filters(p, CANCELABLE, "cancel")
    p.set_defaults(handler=cmd_cancel)

    p = sub.add_parser(
        "terminate",
        parents=store,
        help="fail a thread at once and take the lease of the run holding it",
        description="Terminate a thread: its head becomes failed (reason terminated) and the "
        "lease of the run holding it is taken away, so its next save and lease renewal are "
        "refused; a node that never returns is interrupted at its next renewal.",
    )
    p.add_argument("thread", metavar="THREAD", help="the thread to terminate")
    p.add_argument("--reason", metavar="TEXT", help="why (kept in the thread's reason)")
    p.set_defaults(handler=cmd_terminate, status=None, node=None, older_than=None)
    p.set_defaults(dry_run=False, limit=None)

    p = sub.add_parser(
        "dead-letters",
        parents=store,
        help="list or requeue hand-offs whose deliveries kept failing",
        description="List the outbox's dead letters with the error that buried each, or "
        "requeue them with --retry ID once the cause is fixed.",
    )
    p.add_argument("--retry", action="append", metavar="ID", help="requeue this dead letter")
    p.add_argument("--limit", type=count, default=100, metavar="N", help="at most N dead letters")
    bulk = p.add_argument_group("bulk requeue")
    bulk.add_argument(
        "--requeue",
        action="store_true",
        help="requeue every dead letter that matches the filters below (all without any)",
    )
    bulk.add_argument("--node", metavar="NODE", help="only hand-offs resuming at NODE")
    bulk.add_argument(
        "--older-than",
        type=age,
        metavar="AGE",
        help="only hand-offs made longer ago than AGE (30s, 15m, 12h, 7d, 2w)",
    )
    bulk.add_argument("--error", metavar="TEXT", help="only letters whose error contains TEXT")
    bulk.add_argument(
        "--page-size", type=count, default=100, metavar="N", help="letters per progress line"
    )
    bulk.add_argument("--dry-run", action="store_true", help="list them; requeue nothing")
    p.set_defaults(handler=cmd_dead_letters_any)
    _add_schedules(sub, store)
    add_queues(sub, store)

    p = sub.add_parser(
        "ui",
        parents=[parents["common"], parents["store"]],
        help="serve a local web inspector of the threads (needs flowy-core[ui])",
        description="Serve a small web page of the store's threads, their history and "
        "dead letters, with resume, recover, fork and requeue buttons. It listens on "
        "127.0.0.1 and prints a URL with a random access token.",
    )
    p.add_argument("--graph", required=True, metavar=_GRAPH, help="the threads' graph")
    p.add_argument(
        "--host", default="127.0.0.1", help="the address to listen on (default: 127.0.0.1)"
    )
    p.add_argument(
        "--port", type=port, default=8765, metavar="PORT", help="the port (default: 8765)"
    )
    p.set_defaults(handler=cmd_ui)


def _add_schedules(sub: _Subcommands, store: list[_Parser]) -> None:
    p = sub.add_parser(
        "schedules",
        help="list, create, pause, resume or delete durable schedules",
        description="The store's durable schedules: each starts a thread of its graph at "
        "every tick of a cron expression or interval, once per tick across all workers.",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    q = actions.add_parser("list", parents=store, help="list the schedules")
    q.set_defaults(handler=cmd_schedules)
    q = actions.add_parser(
        "create",
        parents=store,
        help="create a schedule",
        description="Create a schedule that starts GRAPH at every tick of --cron (five "
        "fields, read in --tz) or every --every interval.",
    )
    q.add_argument("name", metavar="NAME", help="the schedule's name")
    q.add_argument("--graph", required=True, metavar=_GRAPH, help="the graph it starts")
    q.add_argument("--cron", metavar="EXPR", help="five cron fields, e.g. '0 2 * * *'")
    q.add_argument("--tz", default="UTC", metavar="ZONE", help="the cron's time zone (UTC)")
    q.add_argument(
        "--every", type=interval, metavar="INTERVAL", help="instead of --cron: 90s, 15m, 2h, 1d"
    )
    q.add_argument("--state", metavar="JSON", help="each thread's initial state (default {})")
    q.add_argument(
        "--catch-up",
        choices=("skip", "one", "all"),
        default="skip",
        help="after downtime: skip missed ticks, start one, or all up to the cap (skip)",
    )
    q.add_argument(
        "--catch-up-cap", type=count, default=10, metavar="N", help="with all: at most N (10)"
    )
    q.add_argument("--paused", action="store_true", help="create it paused")
    q.set_defaults(handler=cmd_schedules)
    for action, what in (
        ("pause", "stop starting threads"),
        ("resume", "start threads again from the next tick"),
        ("delete", "remove a schedule (its threads stay)"),
    ):
        q = actions.add_parser(action, parents=store, help=what)
        q.add_argument("name", metavar="NAME", help="the schedule's name")
        q.set_defaults(handler=cmd_schedules)


def build_parser() -> argparse.ArgumentParser:
    """The ``flowy`` argument parser."""
    parser = _Parser(
        prog="flowy",
        description="Durable, controlled agentic state machines: run the demo, inspect "
        "the threads of any store, resume them and run background workers.",
    )
    parser.add_argument("--version", action="version", version=f"flowy {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    p = sub.add_parser(
        "demo",
        parents=[_parents()["common"]],
        help="watch a refund agent wait for a reviewer, escalate, hand off, survive a "
        "crash and finish",
        description="Run the refund-agent demo against a fresh SQLite file.",
    )
    p.add_argument(
        "--db",
        type=Path,
        default=DEFAULT_DEMO_DB,
        metavar="FILE",
        help="the demo's database, recreated on every run; a file the demo did not "
        f"create is refused (default: {DEFAULT_DEMO_DB})",
    )
    p.add_argument("--fast", action="store_true", help="no simulated model latency")
    p.set_defaults(handler=cmd_demo)
    _add_inspect(sub)
    _add_operate(sub)
    return parser


def _error(prog: str, message: str) -> None:
    sys.stderr.write(f"{prog}: error: {one_line(message)}\n")
    sys.stderr.flush()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``flowy`` command with ``argv`` (default: ``sys.argv[1:]``); return the
    exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except CliError as exc:
        _error(exc.prog or "flowy", str(exc))
        return exc.code
    except SystemExit as exc:  # --help and --version
        return exc.code if isinstance(exc.code, int) else 0
    prog = f"flowy {args.command}"
    out = Console.for_stream(sys.stdout, cast(ColorMode, args.color))
    set_console(out)
    urls = [u for u in (getattr(args, "backend", None), os.environ.get(ENV_VAR)) if u]
    try:
        return asyncio.run(args.handler(args, out))
    except CliError as exc:
        _error(exc.prog or prog, scrub(str(exc), urls))
        return exc.code
    except BackendURLError as exc:
        _error(prog, scrub(str(exc), urls))
        return 2
    except FlowyError as exc:
        _error(prog, scrub(f"{type(exc).__name__}: {exc}", urls))
        return 1
    except KeyboardInterrupt:
        _error(prog, "interrupted")
        return 130
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): stop quietly.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except RecursionError:
        _error(prog, "a value nests too deeply to handle")
        return 1
    except Exception as exc:  # noqa: BLE001 - the command line's last resort: one line
        # A store or a graph failed in a way flowy did not name: still one line.
        _error(prog, scrub(f"{type(exc).__name__}: {exc}", urls))
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
