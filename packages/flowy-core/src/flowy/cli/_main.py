"""The ``flowy`` command: the demo, and a look inside any thread of a SQLite database.

Subcommands: ``demo``, ``threads``, ``show``, ``history``, ``graph``, ``recover``,
``resume``, ``worker`` and ``dead-letters``. Tables for people by default, ``--json`` for scripts. A
mistake (an unknown thread, a stale revision, a missing file, a bad ``module:attr``)
prints one line on standard error and exits non-zero: 2 when the command line itself is
wrong (a usage error, a missing ``--db`` file, a ``--graph`` that cannot be loaded),
1 when the operation fails. Standard library only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import inspect
import json
import os
import shlex
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn, cast

from .._errors import (
    ConcurrencyConflictError,
    FlowyError,
    GraphValidationError,
    HandoffOrphanedError,
    HandoffPendingError,
    ThreadLeaseBusyError,
    ThreadNotFoundError,
)
from .._graph import Graph
from .._plan import ResumePlan, resume_to
from .._results import RunResult
from .._runner import DEFAULT_HANDOFF_STALE_AFTER, Runner
from .._worker import Outcome, Worker
from ..sqlite import SQLiteBackend
from ..storage import (
    HandoffStatus,
    OutboxConsumer,
    OutboxMessage,
    ResumeToken,
    RunStatus,
    Snapshot,
    StateCodec,
    ThreadSummary,
)
from ._render import (
    ColorMode,
    Console,
    EventPrinter,
    clean,
    compact_json,
    fmt_time,
    main_path,
    pretty_json,
    result_line,
    set_console,
)

__all__ = ["CliError", "build_parser", "main"]

DEFAULT_DEMO_DB = Path(".flowy-demo") / "demo.db"


class CliError(Exception):
    """A user-facing failure: printed as one line; ``code`` is the exit status (2 for a
    usage error, 1 for an operational one)."""

    def __init__(self, message: str, code: int = 1, *, prog: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.prog = prog


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (raised, printed by ``main``)."""

    def error(self, message: str) -> NoReturn:
        raise CliError(f"{message} (see '{self.prog} --help')", 2, prog=self.prog)


def _one_line(text: str) -> str:
    return clean(" ".join(text.split()))


# -------------------------------------------------------------------- loading objects


def load_object(spec: str, option: str) -> object:
    """Import ``package.module:attribute`` (the current directory is importable).

    Raises a usage ``CliError`` naming ``option`` when it cannot be loaded.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name.strip() or not attr.strip():
        raise CliError(f"{option} {spec!r} must look like 'package.module:attribute'", 2)
    cwd = os.getcwd()
    if "" not in sys.path and cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or module_name
        if module_name == missing or module_name.startswith(missing + "."):
            raise CliError(
                f"{option} {spec!r}: no module named {missing!r} (is it installed, or in "
                "the current directory?)",
                2,
            ) from exc
        raise CliError(
            f"{option} {spec!r}: importing {module_name!r} failed: {_one_line(str(exc))}", 2
        ) from exc
    except Exception as exc:
        raise CliError(
            f"{option} {spec!r}: importing {module_name!r} failed: "
            f"{type(exc).__name__}: {_one_line(str(exc))}",
            2,
        ) from exc
    obj: object = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise CliError(
                f"{option} {spec!r}: module {module_name!r} has no attribute {attr!r}", 2
            ) from None
    return obj


def _call_factory(obj: object, spec: str, option: str) -> object:
    if not callable(obj):
        return obj
    try:
        return obj()
    except GraphValidationError as exc:
        raise CliError(
            f"{option} {spec!r}: the graph is invalid: " + "; ".join(exc.problems), 2
        ) from exc
    except Exception as exc:
        raise CliError(
            f"{option} {spec!r}: calling it failed: {type(exc).__name__}: {_one_line(str(exc))}",
            2,
        ) from exc


def load_graph(spec: str) -> Graph[Any, Any]:
    """The ``flowy.Graph`` named by ``spec``: a graph object, or a function called with
    no arguments that returns one."""
    obj = load_object(spec, "--graph")
    called = False
    if not isinstance(obj, Graph) and callable(obj):
        called = True
        obj = _call_factory(obj, spec, "--graph")
    if not isinstance(obj, Graph):
        what = "returned" if called else "is"
        raise CliError(
            f"--graph {spec!r} {what} a {type(obj).__name__}, not a flowy.Graph (give a "
            "graph, or a function that takes no arguments and returns one)",
            2,
        )
    return cast(Graph[Any, Any], obj)


def load_codec(spec: str) -> StateCodec[Any]:
    """The state codec named by ``spec``: a codec object, a codec class, or a factory."""
    obj = load_object(spec, "--codec")
    if isinstance(obj, type) or not isinstance(obj, StateCodec):
        obj = _call_factory(obj, spec, "--codec")
    if isinstance(obj, type) or not isinstance(obj, StateCodec):
        raise CliError(
            f"--codec {spec!r} is a {type(obj).__name__}, not a state codec (an object "
            "with name, encode and decode)",
            2,
        )
    return cast(StateCodec[Any], obj)


# ----------------------------------------------------------------------- the database


def _db_path(args: argparse.Namespace) -> Path:
    path = cast(Path, args.db)
    if not path.exists():
        raise CliError(
            f"no database file at {str(path)!r}; check --db (`flowy demo` creates one at "
            f"{str(DEFAULT_DEMO_DB)!r})",
            2,
        )
    if not path.is_file():
        raise CliError(f"--db {str(path)!r} is not a file; give a flowy SQLite database", 2)
    return path


def _open(args: argparse.Namespace) -> SQLiteBackend[Any]:
    """The backend on the existing ``--db`` file (never creates one)."""
    path = _db_path(args)
    spec = cast("str | None", getattr(args, "codec", None))
    return SQLiteBackend(path, load_codec(spec) if spec else None)


def _q(value: object) -> str:
    return shlex.quote(str(value))


def _not_found(thread: str, db: Path) -> CliError:
    return CliError(
        f"no thread {thread!r} in {str(db)!r}; `flowy threads --db {_q(db)}` lists the threads"
    )


# ------------------------------------------------------------------------ json shapes


def _summary_json(s: ThreadSummary) -> dict[str, Any]:
    return {
        "thread_id": s.thread_id,
        "revision": s.revision,
        "status": s.status.value,
        "reason": s.reason,
        "execution_pointer": s.execution_pointer,
        "handoff_status": s.handoff_status.value,
        "handoff_pending_at": s.handoff_pending_at,
        "updated_at": s.updated_at,
    }


def _snapshot_json(snap: Snapshot[Any], revision: int) -> dict[str, Any]:
    return {
        "thread_id": snap.thread_id,
        "revision": revision,
        "status": snap.status.value,
        "reason": snap.reason,
        "execution_pointer": snap.execution_pointer,
        "handoff_status": snap.handoff_status.value,
        "handoff_pending_at": snap.handoff_pending_at,
        "segment": snap.segment,
        "step_count": snap.step_count,
        "total_steps": snap.total_steps,
        "budget_counts": dict(snap.budget_counts),
        "metadata": dict(snap.metadata),
        "updated_at": snap.updated_at,
        "state": snap.state,
    }


def _result_json(result: RunResult[Any, Any]) -> dict[str, Any]:
    return {
        "thread_id": result.thread_id,
        "status": result.status.value,
        "reason": result.reason,
        "execution_pointer": result.execution_pointer,
        "revision": result.revision,
        "resume_token": (
            None if result.resume_token is None else result.resume_token.snapshot_revision
        ),
        "handoff_status": result.handoff_status.value,
        "step_count": result.step_count,
        "total_steps": result.total_steps,
        "segment": result.segment,
        "budget_counts": result.budget_counts,
        "effects": result.effects,
        "error": None if result.error is None else _one_line(str(result.error)),
        "state": result.state,
    }


def _print_json(out: Console, value: object) -> None:
    out.line(pretty_json(value))


# -------------------------------------------------------------------------- commands


def _status_styler(out: Console, column: int) -> Any:
    def styler(i: int, value: str, padded: str) -> str:
        return out.status(value, padded) if i == column else padded

    return styler


async def _cmd_threads(args: argparse.Namespace, out: Console) -> int:
    db = _db_path(args)
    async with _open(args) as backend:
        rows = await backend.checkpointer.list_threads(limit=args.limit)
    if args.json:
        _print_json(out, [_summary_json(s) for s in rows])
        return 0
    if not rows:
        out.line(f"no threads in {db}")
        return 0
    out.table(
        ["THREAD", "STATUS", "REASON", "POINTER", "REVISION", "HANDOFF", "UPDATED"],
        [
            [
                clean(s.thread_id, 48),
                s.status.value,
                clean(s.reason, 32),
                clean(s.execution_pointer, 32),
                str(s.revision),
                s.handoff_status.value,
                fmt_time(s.updated_at),
            ]
            for s in rows
        ],
        styler=_status_styler(out, 1),
    )
    return 0


_RESUMABLE = frozenset({RunStatus.SUSPENDED, RunStatus.CANCELED, RunStatus.HANDOFF})


def _next_step(snap: Snapshot[Any], revision: int, db: Path) -> str | None:
    thread = _q(snap.thread_id)
    if snap.handoff_status in (HandoffStatus.PENDING, HandoffStatus.ORPHANED):
        return f"flowy recover --db {_q(db)} --graph MODULE:ATTR"
    if snap.status is RunStatus.HANDOFF:
        return f"flowy worker --graph MODULE:ATTR --db {_q(db)}"
    if snap.status in (RunStatus.SUSPENDED, RunStatus.CANCELED):
        return f"flowy resume {thread} --revision {revision} --graph MODULE:ATTR --db {_q(db)}"
    return None


async def _cmd_show(args: argparse.Namespace, out: Console) -> int:
    db = _db_path(args)
    thread = cast(str, args.thread)
    graph = load_graph(args.graph) if args.graph else None
    async with _open(args) as backend:
        try:
            snap, revision = await backend.checkpointer.load(thread)
        except ThreadNotFoundError:
            raise _not_found(thread, db) from None
        lease = await backend.leases.holder(thread)
    if args.json:
        data = _snapshot_json(snap, revision)
        data["lease"] = (
            None
            if lease is None
            else {
                "owner": lease.owner,
                "token": lease.fencing_token,
                "expires_at": lease.expires_at,
            }
        )
        _print_json(out, data)
        return 0
    limits: Mapping[str, int] = graph.budgets if graph is not None else {}
    names = sorted({*snap.budget_counts, *limits})
    budgets = ", ".join(
        f"{name} {snap.budget_counts.get(name, 0)}" + (f"/{limits[name]}" if name in limits else "")
        for name in names
    )
    lease_text = (
        "none"
        if lease is None
        else f"{clean(lease.owner, 60)} (fencing token {lease.fencing_token}, expires in "
        f"{max(lease.expires_at - time.time(), 0.0):.1f}s)"
    )
    dot = out.sym("dot")
    resume = f" {dot} resume token {clean(snap.thread_id)}@{revision}"
    fields = [
        ("thread", clean(snap.thread_id)),
        ("status", f"{out.status(snap.status)} ({clean(snap.reason, 80)})"),
        ("pointer", clean(snap.execution_pointer)),
        ("revision", str(revision) + (resume if snap.status in _RESUMABLE else "")),
        (
            "steps",
            f"segment {snap.segment} {dot} {snap.step_count} in this segment {dot} "
            f"{snap.total_steps} in all",
        ),
        (
            "hand-off",
            snap.handoff_status.value
            + (f" since {fmt_time(snap.handoff_pending_at)}" if snap.handoff_pending_at else ""),
        ),
        ("updated", fmt_time(snap.updated_at)),
        ("lease", lease_text),
        ("budgets", budgets or "none"),
        ("metadata", compact_json(dict(snap.metadata)) if snap.metadata else "none"),
    ]
    hint = _next_step(snap, revision, db)
    if hint is not None:
        fields.append(("next", hint))
    for key, value in fields:
        out.line(f"{out.paint(key.ljust(9), 'bold')} {value}")
    out.line(out.paint("state", "bold"))
    for line in pretty_json(snap.state).splitlines():
        out.line("  " + line)
    return 0


async def _print_history(
    out: Console, backend: SQLiteBackend[Any], db: Path, thread: str, limit: int, as_json: bool
) -> None:
    snaps = await backend.checkpointer.get_history(thread, limit)
    if not snaps:
        try:
            await backend.checkpointer.load(thread)
        except ThreadNotFoundError:
            raise _not_found(thread, db) from None
    if as_json:
        _print_json(out, [_snapshot_json(s, s.revision) for s in snaps])
        return
    out.table(
        ["REV", "STATUS", "REASON", "POINTER", "HANDOFF", "SEGMENT", "STEPS", "UPDATED"],
        [
            [
                str(s.revision),
                s.status.value,
                clean(s.reason, 32),
                clean(s.execution_pointer, 32),
                s.handoff_status.value,
                str(s.segment),
                str(s.total_steps),
                fmt_time(s.updated_at),
            ]
            for s in snaps
        ],
        styler=_status_styler(out, 1),
    )


async def _cmd_history(args: argparse.Namespace, out: Console) -> int:
    db = _db_path(args)
    async with _open(args) as backend:
        await _print_history(out, backend, db, args.thread, args.limit, args.json)
    return 0


def _route_text(graph: Graph[Any, Any], name: str, arrow: str) -> str:
    parts: list[str] = []
    if name in graph.edges:
        parts.append(f"{arrow} {graph.edges[name]}")
    elif name in graph.conditional_edges:
        parts.append(f"{arrow} " + " | ".join(graph.conditional_edges[name].targets) + " (router)")
    if name in graph.terminal_nodes:
        parts.append("(end)")
    if name in graph.retry_routes:
        parts.append(f"retries used up {arrow} {graph.retry_routes[name]}")
    return "; ".join(parts)


async def _cmd_graph(args: argparse.Namespace, out: Console) -> int:
    graph = load_graph(args.spec)
    if args.mermaid:
        out.stream.write(graph.to_mermaid())
        out.stream.flush()
        return 0
    if args.json:
        _print_json(
            out,
            {
                "entry": graph.entry,
                "nodes": list(graph.nodes),
                "edges": dict(graph.edges),
                "conditional_edges": {
                    src: list(cond.targets) for src, cond in graph.conditional_edges.items()
                },
                "retry_routes": dict(graph.retry_routes),
                "terminal_nodes": sorted(graph.terminal_nodes),
                "max_steps": graph.max_steps,
                "budgets": dict(graph.budgets),
            },
        )
        return 0
    dot = out.sym("dot")
    budgets = ", ".join(f"{k} {v}" for k, v in graph.budgets.items()) or "none"
    out.line(
        f"{out.paint(args.spec, 'bold')} {dot} {len(graph.nodes)} nodes {dot} entry "
        f"{graph.entry} {dot} max_steps {graph.max_steps} {dot} budgets {budgets}"
    )
    out.table(
        ["NODE", "ROUTE"],
        [[name, _route_text(graph, name, out.sym("arrow"))] for name in graph.nodes],
    )
    return 0


def _recovery_action(
    s: ThreadSummary, now: float, stale_after: float, force: bool
) -> tuple[bool, str]:
    if s.handoff_status is HandoffStatus.ORPHANED:
        return True, "re-enqueue (orphaned)"
    if s.handoff_status is HandoffStatus.PENDING:
        at = s.handoff_pending_at
        if at is None or at <= 0 or now - at >= stale_after:
            return True, "re-enqueue (stale pending)"
        return False, f"wait: pending, stale in {stale_after - (now - at):.0f}s"
    if s.handoff_status is HandoffStatus.ENQUEUED:
        if force:
            return True, "re-enqueue (forced)"
        return False, "enqueued (--force re-enqueues)"
    return False, "no hand-off"


async def _cmd_recover(args: argparse.Namespace, out: Console) -> int:
    db = _db_path(args)
    graph = load_graph(args.graph) if args.graph else None
    statuses = {HandoffStatus.PENDING, HandoffStatus.ORPHANED}
    if args.force:
        statuses.add(HandoffStatus.ENQUEUED)
    failures = 0
    rows: list[dict[str, Any]] = []
    async with _open(args) as backend:
        cp = backend.checkpointer
        found = await cp.list_threads(handoff_statuses=frozenset(statuses), limit=args.limit)
        if args.thread:
            wanted = cast(list[str], args.thread)
            by_id = {s.thread_id: s for s in found}
            found: list[ThreadSummary] = []
            for thread in wanted:
                if thread in by_id:
                    found.append(by_id[thread])
                    continue
                try:
                    snap, revision = await cp.load(thread)
                except ThreadNotFoundError:
                    raise _not_found(thread, db) from None
                found.append(
                    ThreadSummary(
                        snap.thread_id,
                        revision,
                        snap.execution_pointer,
                        snap.status,
                        snap.reason,
                        snap.handoff_status,
                        snap.handoff_pending_at,
                        snap.updated_at,
                    )
                )
        runner: Runner[Any, Any] | None = None
        if graph is not None:
            runner = Runner(graph, cp, lease_manager=backend.leases, handoff_outbox=backend.outbox)
        now = time.time()
        for s in found:
            ok, action = _recovery_action(s, now, args.stale_after, args.force)
            row = {**_summary_json(s), "action": action, "recovered": False, "error": None}
            if runner is not None and ok:
                if graph is not None and not graph.has_node(s.execution_pointer):
                    row["error"] = f"pointer {s.execution_pointer!r} is not a node of the graph"
                else:
                    try:
                        res = await runner.recover_stale_handoff(
                            s.thread_id, stale_after=args.stale_after, force_reenqueue=args.force
                        )
                        row["recovered"] = True
                        row["revision_after"] = res.snapshot_revision
                    except FlowyError as exc:
                        row["error"] = f"{type(exc).__name__}: {_one_line(str(exc))}"
                if row["error"] is not None:
                    failures += 1
            rows.append(row)
    if args.json:
        _print_json(out, rows)
        return 1 if failures else 0
    if not rows:
        out.line(f"no hand-offs to recover in {db}")
        return 0

    def result_text(row: dict[str, Any]) -> str:
        if row["recovered"]:
            return f"re-enqueued at revision {row['revision_after']}"
        if row["error"] is not None:
            return "failed: " + clean(row["error"], 120)
        return "-"

    headers = ["THREAD", "HANDOFF", "REVISION", "POINTER", "PENDING SINCE", "ACTION"]
    if runner is not None:
        headers.append("RESULT")
    out.table(
        headers,
        [
            [
                clean(r["thread_id"], 48),
                r["handoff_status"],
                str(r["revision"]),
                clean(r["execution_pointer"], 32),
                fmt_time(r["handoff_pending_at"]),
                r["action"],
                *([result_text(r)] if runner is not None else []),
            ]
            for r in rows
        ],
    )
    if runner is None:
        out.line("(listing only: add --graph MODULE:ATTR to re-enqueue)")
    return 1 if failures else 0


def _default_owner() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def _parse_overlay(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"--overlay is not valid JSON ({exc}): {clean(text, 60)!r}", 2) from None


async def _cmd_resume(args: argparse.Namespace, out: Console) -> int:
    db = _db_path(args)
    graph = load_graph(args.graph)
    overlay = _parse_overlay(args.overlay)
    thread = cast(str, args.thread)
    token = ResumeToken(thread, cast(int, args.revision))
    target = cast("str | None", args.at)

    def policy(state: Any, _pointer: str) -> tuple[Any, ResumePlan]:
        assert target is not None
        return state, resume_to(target)

    async with _open(args) as backend:
        runner: Runner[Any, Any] = Runner(
            graph, backend.checkpointer, lease_manager=backend.leases, handoff_outbox=backend.outbox
        )
        try:
            head, head_revision = await backend.checkpointer.load(thread)
        except ThreadNotFoundError:
            raise _not_found(thread, db) from None
        if (
            head.status is RunStatus.COMPLETED
            and head_revision == token.snapshot_revision
            and target is None
        ):
            raise CliError(
                f"thread {thread!r} is completed at revision {head_revision}; there is nothing "
                "to resume (pass --at NODE to run from a node again on purpose)"
            )
        try:
            handle = await runner.resume_stream(
                token,
                state_overlay=overlay,
                resume_target_policy=policy if target is not None else None,
                run_lease=(args.owner or _default_owner(), args.lease_ttl),
            )
        except ThreadNotFoundError:
            raise _not_found(thread, db) from None
        except ConcurrencyConflictError as exc:
            raise CliError(
                f"revision {token.snapshot_revision} of thread {thread!r} is stale: the thread "
                f"is at revision {exc.actual}; look at it with `flowy show {_q(thread)} --db "
                f"{_q(db)}`, then resume with --revision {exc.actual}"
            ) from None
        except (HandoffPendingError, HandoffOrphanedError) as exc:
            raise CliError(
                f"{_one_line(str(exc))} (`flowy recover --db {_q(db)}` lists it)"
            ) from None
        except ThreadLeaseBusyError as exc:
            raise CliError(f"{_one_line(str(exc))}; try again when it is free") from None
        printer = EventPrinter(out, path=main_path(graph))
        async for event in handle:
            if not args.json:
                printer.event(event)
        result = await handle.wait_result()
    if args.json:
        _print_json(out, _result_json(result))
    else:
        out.line("  " + result_line(out, result))
        if result.status is RunStatus.HANDOFF:
            out.line(f"  a worker resumes it: flowy worker --graph {_q(args.graph)} --db {_q(db)}")
    return 1 if result.status is RunStatus.FAILED else 0


class _EchoRunner(Runner[Any, Any]):
    """A runner that prints the events of every run it resumes (for ``flowy worker``)."""

    out: Console
    printer: EventPrinter

    async def resume(self, token: ResumeToken, **kwargs: Any) -> RunResult[Any, Any]:
        handle = await self.resume_stream(token, **kwargs)
        async for event in handle:
            self.printer.event(event)
        result = await handle.wait_result()
        self.out.line("  " + result_line(self.out, result))
        return result


class _CliWorker(Worker[Any, Any]):
    """A worker that prints each message it takes and what it did with it."""

    out: Console

    async def process(self, message: OutboxMessage) -> Outcome:
        out = self.out
        intent = message.intent
        out.line(
            f"{out.paint(out.sym('claim'), 'cyan')} "
            f"{out.paint(clean(str(intent.resume_token), 60), 'bold')} "
            f"delivery {message.attempts} ({clean(intent.reason, 40)} at "
            f"{clean(intent.execution_pointer, 40)})"
        )
        outcome = await super().process(message)
        if outcome is Outcome.RETRY:
            out.line(f"{out.paint(out.sym('retry'), 'yellow')} released for another delivery")
        else:
            out.line(f"{out.paint(out.sym('ok'), 'green')} acked: {outcome.value}")
        return outcome


async def _cmd_worker(args: argparse.Namespace, out: Console) -> int:
    db = _db_path(args)
    graph = load_graph(args.graph)
    owner = cast(str, args.owner or _default_owner())
    async with _open(args) as backend:
        recovery = None if args.once or args.recovery_interval <= 0 else args.recovery_interval
        runner = _EchoRunner(
            graph, backend.checkpointer, lease_manager=backend.leases, handoff_outbox=backend.outbox
        )
        runner.out = out
        runner.printer = EventPrinter(
            out, label="" if args.concurrency == 1 else "run", path=main_path(graph)
        )
        consumer: OutboxConsumer = backend.consumer
        worker = _CliWorker(
            runner,
            consumer,
            owner=owner,
            lease_ttl=args.lease_ttl,
            concurrency=args.concurrency,
            visibility_timeout=args.visibility_timeout,
            poll_interval=args.poll_interval,
            recovery_interval=recovery,
            stale_after=args.stale_after,
        )
        worker.out = out
        dot = out.sym("dot")
        out.line(
            out.paint(f"{owner} {dot} claiming hand-offs from {db} {dot} graph {args.graph}", "dim")
        )
        if args.once:
            done = await worker.run_until_idle(args.idle_wait)
        else:
            loop = asyncio.get_running_loop()
            installed: list[int] = []

            def stopping() -> None:
                out.line(out.paint("stopping: finishing the runs in flight", "dim"))
                worker.stop()

            for sig in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.add_signal_handler(sig, stopping)
                    installed.append(sig)
            try:
                await worker.run()
            finally:
                for sig in installed:
                    loop.remove_signal_handler(sig)
            done = sum(worker.stats.outcomes.values())
    counts = ", ".join(f"{k} {v}" for k, v in worker.stats.outcomes.items() if v)
    summary = f"{owner}: {done} message(s) processed" + (f" ({counts})" if counts else "")
    out.line(out.paint(summary, "dim"))
    return 0


async def _open_consumer(
    args: argparse.Namespace,
) -> tuple[OutboxConsumer, Any]:
    """The consumer of ``--consumer`` (any backend) or of the ``--db`` SQLite file, and
    an async callable that closes it."""
    spec = cast("str | None", args.consumer)
    if spec is None:
        if args.db is None:
            raise CliError("give --db FILE (SQLite) or --consumer MODULE:ATTR", 2)
        backend = _open(args)
        return backend.consumer, backend.aclose
    obj = load_object(spec, "--consumer")
    if not isinstance(obj, OutboxConsumer):
        obj = _call_factory(obj, spec, "--consumer")
        if inspect.isawaitable(obj):
            obj = await obj
    if not isinstance(obj, OutboxConsumer):
        raise CliError(
            f"--consumer {spec!r} gave a {type(obj).__name__}, not an outbox consumer (give "
            "one, or a function - sync or async - that returns one)",
            2,
        )
    closer = getattr(obj, "aclose", None) or getattr(obj, "close", None)

    async def close() -> None:
        if callable(closer):
            result = closer()
            if inspect.isawaitable(result):
                await result

    return obj, close


async def _cmd_dead_letters(args: argparse.Namespace, out: Console) -> int:
    consumer, close = await _open_consumer(args)
    try:
        for message_id in cast("list[str]", args.retry or []):
            try:
                await consumer.retry_dead_letter(message_id)
            except KeyError:
                raise CliError(f"no dead letter with id {message_id!r}", 1) from None
            out.line(f"requeued dead letter {message_id}")
        if args.retry:
            return 0
        dead = await consumer.dead_letters(args.limit)
    finally:
        await close()
    if args.json:
        _print_json(
            out,
            [
                {
                    "message_id": m.message_id,
                    "thread_id": m.thread_id,
                    "revision": m.intent.snapshot_revision if m.intent else None,
                    "attempts": m.attempts,
                    "reason": m.intent.reason if m.intent else None,
                    "pointer": m.intent.execution_pointer if m.intent else None,
                    "error": m.error,
                }
                for m in dead
            ],
        )
        return 0
    if not dead:
        out.line("no dead letters")
        return 0
    out.table(
        ["ID", "THREAD", "REVISION", "ATTEMPTS", "REASON", "POINTER"],
        [
            [
                clean(m.message_id, 24),
                clean(m.thread_id or "(undecodable)", 48),
                str(m.intent.snapshot_revision) if m.intent else "-",
                str(m.attempts),
                clean(m.intent.reason if m.intent else m.error, 32),
                clean(m.intent.execution_pointer if m.intent else "-", 32),
            ]
            for m in dead
        ],
    )
    return 0


async def _cmd_demo(args: argparse.Namespace, out: Console) -> int:
    from .demo import DemoError, DemoSettings, describe_failure, inspect_commands, run_demo

    db = cast(Path, args.db)
    settings = DemoSettings(db=db, fast=args.fast, color=args.color)
    try:
        report = await run_demo(settings, out)
    except DemoError as exc:
        raise CliError(f"the demo failed: {describe_failure(exc)}") from exc
    out.line()
    out.line(
        out.paint("The thread's history", "bold")
        + f" (flowy history {report.thread_id} --db {_q(db)}):"
    )
    async with SQLiteBackend[Any](db) as backend:
        await _print_history(out, backend, db, report.thread_id, 50, False)
    out.line()
    out.line(out.paint("Look inside it yourself:", "bold"))
    for command in inspect_commands(db):
        out.line(f"  {command}")
    return 0


# ---------------------------------------------------------------------------- parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {text!r}")
    return value


def _parse_seconds(text: str, *, allow_zero: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if allow_zero and not value >= 0:
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text!r}")
    if not allow_zero and not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    return _parse_seconds(text, allow_zero=False)


def _seconds(text: str) -> float:
    return _parse_seconds(text, allow_zero=True)


def build_parser() -> argparse.ArgumentParser:
    """The ``flowy`` argument parser."""
    from .. import __version__

    common = _Parser(add_help=False)
    common.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="colour the output: auto (a terminal, unless NO_COLOR is set), always, never",
    )
    db_opt = _Parser(add_help=False)
    db_opt.add_argument(
        "--db", required=True, type=Path, metavar="FILE", help="the flowy SQLite database"
    )
    db_opt.add_argument(
        "--codec",
        metavar="MODULE:ATTR",
        help="the state codec the threads were saved with (default: flowy's JSON codec)",
    )
    json_opt = _Parser(add_help=False)
    json_opt.add_argument("--json", action="store_true", help="print JSON for scripts")

    parser = _Parser(
        prog="flowy",
        description="Durable, controlled agentic state machines: run the demo, inspect "
        "threads in a SQLite database, resume them and run background workers.",
    )
    parser.add_argument("--version", action="version", version=f"flowy {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser(
        "demo",
        parents=[common],
        help="watch a refund agent suspend, hand off, survive a crash and finish",
        description="Run the refund-agent demo against a fresh SQLite file.",
    )
    p.add_argument(
        "--db",
        type=Path,
        default=DEFAULT_DEMO_DB,
        metavar="FILE",
        help=f"the demo's database, recreated on every run (default: {DEFAULT_DEMO_DB})",
    )
    p.add_argument("--fast", action="store_true", help="no simulated model latency")
    p.set_defaults(handler=_cmd_demo)

    p = sub.add_parser(
        "threads",
        parents=[common, db_opt, json_opt],
        help="list the threads of a database",
        description="List threads: status, reason, pointer, revision, hand-off, updated at.",
    )
    p.add_argument("--limit", type=_positive_int, default=100, help="at most N threads")
    p.set_defaults(handler=_cmd_threads)

    p = sub.add_parser(
        "show",
        parents=[common, db_opt, json_opt],
        help="show a thread's current snapshot",
        description="Show a thread's head snapshot: state, budgets, lease holder.",
    )
    p.add_argument("thread", metavar="THREAD")
    p.add_argument(
        "--graph", metavar="MODULE:ATTR", help="also show the budget limits of this graph"
    )
    p.set_defaults(handler=_cmd_show)

    p = sub.add_parser(
        "history",
        parents=[common, db_opt, json_opt],
        help="list a thread's saved revisions, newest first",
        description="List the saved revisions of a thread, newest first.",
    )
    p.add_argument("thread", metavar="THREAD")
    p.add_argument("--limit", type=_positive_int, default=50, help="at most N revisions")
    p.set_defaults(handler=_cmd_history)

    p = sub.add_parser(
        "graph",
        parents=[common, json_opt],
        help="print a graph's nodes and routes (or Mermaid)",
        description="Load a flowy.Graph (or a zero-argument factory returning one) and "
        "print its nodes and routes.",
    )
    p.add_argument("spec", metavar="MODULE:ATTR")
    p.add_argument("--mermaid", action="store_true", help="print a Mermaid flowchart")
    p.set_defaults(handler=_cmd_graph)

    p = sub.add_parser(
        "recover",
        parents=[common, db_opt, json_opt],
        help="list (or, with --graph, re-enqueue) stale and orphaned hand-offs",
        description="List hand-offs that are orphaned or stale pending; with --graph, "
        "re-enqueue them for the workers running that graph.",
    )
    p.add_argument("--graph", metavar="MODULE:ATTR", help="re-enqueue for workers of this graph")
    p.add_argument(
        "--stale-after",
        type=_seconds,
        default=DEFAULT_HANDOFF_STALE_AFTER,
        metavar="S",
        help="a pending hand-off is stale after S seconds (default: 300)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="also re-enqueue enqueued hand-offs (when their message is known lost)",
    )
    p.add_argument(
        "--thread", action="append", metavar="THREAD", help="only this thread (repeatable)"
    )
    p.add_argument("--limit", type=_positive_int, default=1000, help="at most N threads")
    p.set_defaults(handler=_cmd_recover)

    p = sub.add_parser(
        "resume",
        parents=[common, db_opt, json_opt],
        help="resume a thread at a revision and stream its events",
        description="Resume THREAD from revision N (its resume token) with the graph, "
        "printing events as they stream.",
    )
    p.add_argument("thread", metavar="THREAD")
    p.add_argument("--revision", type=int, required=True, metavar="N")
    p.add_argument("--graph", required=True, metavar="MODULE:ATTR")
    p.add_argument("--owner", metavar="NAME", help="lease owner (default: host-pid)")
    p.add_argument("--lease-ttl", type=_positive_float, default=30.0, metavar="S")
    p.add_argument(
        "--overlay", metavar="JSON", help="a JSON state update merged by the graph's reducer"
    )
    p.add_argument("--at", metavar="NODE", help="resume at NODE instead of the saved pointer")
    p.set_defaults(handler=_cmd_resume)

    p = sub.add_parser(
        "worker",
        parents=[common, db_opt],
        help="run a background worker on the database's outbox",
        description="Claim hand-offs from the SQLite outbox and resume them with the graph.",
    )
    p.add_argument("--graph", required=True, metavar="MODULE:ATTR")
    p.add_argument("--owner", metavar="NAME", help="lease owner (default: host-pid)")
    p.add_argument(
        "--once", action="store_true", help="exit when the outbox is idle (run_until_idle)"
    )
    p.add_argument("--lease-ttl", type=_positive_float, default=30.0, metavar="S")
    p.add_argument(
        "--visibility-timeout",
        type=_positive_float,
        metavar="S",
        help="how long a claimed message stays hidden (default: 4 x lease TTL)",
    )
    p.add_argument("--concurrency", type=_positive_int, default=1, metavar="N")
    p.add_argument(
        "--idle-wait",
        type=_seconds,
        default=0.5,
        metavar="S",
        help="with --once: exit after S seconds without a message",
    )
    p.add_argument("--poll-interval", type=_positive_float, default=1.0, metavar="S")
    p.add_argument(
        "--recovery-interval",
        type=_seconds,
        default=60.0,
        metavar="S",
        help="re-enqueue stale/orphaned hand-offs every S seconds (0: never)",
    )
    p.add_argument(
        "--stale-after",
        type=_seconds,
        default=DEFAULT_HANDOFF_STALE_AFTER,
        metavar="S",
        help="a pending hand-off is stale after S seconds",
    )
    p.set_defaults(handler=_cmd_worker)

    p = sub.add_parser(
        "dead-letters",
        parents=[common, json_opt],
        help="list or requeue hand-offs whose deliveries kept failing",
        description="List the outbox's dead letters, or requeue them with --retry ID. "
        "Works on a SQLite --db file, or on any backend through --consumer MODULE:ATTR "
        "(an OutboxConsumer, or a function - sync or async - returning one).",
    )
    p.add_argument("--db", type=Path, metavar="FILE", help="a flowy SQLite database")
    p.add_argument("--consumer", metavar="MODULE:ATTR", help="an outbox consumer factory")
    p.add_argument("--codec", metavar="MODULE:ATTR", help=argparse.SUPPRESS)
    p.add_argument("--retry", action="append", metavar="ID", help="requeue this dead letter")
    p.add_argument("--limit", type=_positive_int, default=100, metavar="N")
    p.set_defaults(handler=_cmd_dead_letters)
    return parser


def _error(prog: str, message: str) -> None:
    sys.stderr.write(f"{prog}: error: {_one_line(message)}\n")
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
    mode = cast(ColorMode, args.color)
    out = Console.for_stream(sys.stdout, mode)
    set_console(out)
    try:
        return asyncio.run(args.handler(args, out))
    except CliError as exc:
        _error(exc.prog or prog, str(exc))
        return exc.code
    except FlowyError as exc:
        _error(prog, f"{type(exc).__name__}: {exc}")
        return 1
    except KeyboardInterrupt:
        _error(prog, "interrupted")
        return 130
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): stop quietly.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as exc:
        _error(prog, f"{type(exc).__name__}: {exc}")
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
