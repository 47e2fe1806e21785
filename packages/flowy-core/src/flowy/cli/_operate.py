"""The commands that move threads on: ``recover``, ``resume``, ``fork``, ``signal`` and
``dead-letters`` (``worker`` is in :mod:`._serve`).

Each works through a ``flowy.Runner`` on the opened ``Backend`` or through the
backend's consumer, so it behaves the same on every store.
"""

from __future__ import annotations

import argparse
import time
from typing import Any, cast

from .._errors import (
    ConcurrencyConflictError,
    FlowyError,
    HandoffOrphanedError,
    HandoffPendingError,
    ThreadCompletedError,
    ThreadLeaseBusyError,
    ThreadNotFoundError,
)
from .._plan import ResumePlan, resume_to
from .._results import RunResult
from .._runner import Runner, default_owner
from .._waits import durable_of, send_signal
from ..storage import HandoffStatus, RunStatus, ThreadSummary
from ._inspect import dead_letter_json, list_threads, not_found, print_json, summary_json
from ._options import (
    CliError,
    load_graph,
    one_line,
    parse_json,
    parse_overlay,
    quote,
    resume_token,
)
from ._render import Console, EventPrinter, clean, fmt_time, main_path, result_line
from ._store import codec_for, locate, open_store

__all__ = [
    "cmd_dead_letters",
    "cmd_fork",
    "cmd_recover",
    "cmd_resume",
    "cmd_signal",
    "result_json",
]


# ---------------------------------------------------------------------------- recover


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


def _recover_result(row: dict[str, Any]) -> str:
    if row["recovered"]:
        return f"re-enqueued at revision {row['revision_after']}"
    if row["error"] is not None:
        return "failed: " + clean(row["error"], 120)
    return "-"


async def cmd_recover(args: argparse.Namespace, out: Console) -> int:
    """``flowy recover``."""
    store = locate(args.backend, args.db)
    graph = load_graph(args.graph) if args.graph else None
    statuses = {HandoffStatus.PENDING, HandoffStatus.ORPHANED}
    if args.force:
        statuses.add(HandoffStatus.ENQUEUED)
    failures = 0
    rows: list[dict[str, Any]] = []
    async with open_store(store, codec_for(args.codec, graph)) as backend:
        cp = backend.checkpointer
        found: list[ThreadSummary] = []
        more = False
        if args.thread:
            for thread in cast(list[str], args.thread):
                try:
                    snap, revision = await cp.load(thread)
                except ThreadNotFoundError:
                    raise not_found(thread, store) from None
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
        else:
            found, more = await list_threads(cp, limit=args.limit, statuses=frozenset(statuses))
        runner: Runner[Any, Any] | None = Runner(graph, backend) if graph is not None else None
        now = time.time()
        for s in found:
            ok, action = _recovery_action(s, now, args.stale_after, args.force)
            row = {**summary_json(s), "action": action, "recovered": False, "error": None}
            del row["dead_letters"]
            if runner is not None and ok:
                if not runner.graph.has_node(s.execution_pointer):
                    row["error"] = f"pointer {s.execution_pointer!r} is not a node of the graph"
                else:
                    try:
                        res = await runner.recover_stale_handoff(
                            s.thread_id, stale_after=args.stale_after, force_reenqueue=args.force
                        )
                        row["recovered"] = True
                        row["revision_after"] = res.snapshot_revision
                    except FlowyError as exc:
                        row["error"] = f"{type(exc).__name__}: {one_line(str(exc))}"
                if row["error"] is not None:
                    failures += 1
            rows.append(row)
    if args.json:
        print_json(out, rows)
        return 1 if failures else 0
    if not rows:
        out.line(f"no hand-offs to recover in {clean(store.label)}")
        return 0
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
                *([_recover_result(r)] if runner is not None else []),
            ]
            for r in rows
        ],
    )
    if more:
        out.line(out.paint(f"more hand-offs follow: raise --limit (now {args.limit})", "dim"))
    if runner is None:
        out.line("(listing only: add --graph MODULE:ATTR to re-enqueue)")
    return 1 if failures else 0


# ----------------------------------------------------------------------------- resume


def result_json(result: RunResult[Any, Any]) -> dict[str, Any]:
    """A run result as JSON."""
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
        "error": None if result.error is None else one_line(str(result.error)),
        "state": result.state,
    }


async def cmd_resume(args: argparse.Namespace, out: Console) -> int:
    """``flowy resume``."""
    token = resume_token(cast(str, args.thread), cast("int | None", args.revision))
    thread = token.thread_id
    store = locate(args.backend, args.db)
    graph = load_graph(args.graph)
    codec = codec_for(args.codec, graph)
    overlay = parse_overlay(args.overlay, codec)
    target = cast("str | None", args.at)

    def policy(state: Any, _pointer: str) -> tuple[Any, ResumePlan]:
        assert target is not None
        return state, resume_to(target)

    async with open_store(store, codec) as backend:
        runner: Runner[Any, Any] = Runner(
            graph, backend, run_lease=(args.owner or default_owner(), args.lease_ttl)
        )
        try:
            head, head_revision = await backend.checkpointer.load(thread)
        except ThreadNotFoundError:
            raise not_found(thread, store) from None
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
            )
        except ThreadNotFoundError:
            raise not_found(thread, store) from None
        except ConcurrencyConflictError as exc:
            current = quote(f"{thread}@{exc.actual}")
            raise CliError(
                f"revision {token.snapshot_revision} of thread {thread!r} is stale: the thread "
                f"is at revision {exc.actual}; look at it with "
                f"`{store.command('show', quote(thread))}`, then resume {current} "
                f"(or --revision {exc.actual})"
            ) from None
        except (HandoffPendingError, HandoffOrphanedError) as exc:
            raise CliError(
                f"{one_line(str(exc))} (`{store.command('recover')}` lists it)"
            ) from None
        except ThreadLeaseBusyError as exc:
            raise CliError(f"{one_line(str(exc))}; try again when it is free") from None
        except ValueError as exc:  # the overlay names an unknown field, or does not fit
            if overlay is None:
                raise
            raise CliError(f"--overlay: {one_line(str(exc))}", 2) from None
        printer = EventPrinter(out, path=main_path(graph))
        # On Ctrl-C the handle stops the run and waits for its cancel save and lease
        # release, before the store closes.
        async with handle:
            async for event in handle:
                if not args.json:
                    printer.event(event)
            result = await handle.wait_result()
    if args.json:
        print_json(out, result_json(result))
    else:
        out.line("  " + result_line(out, result))
        if result.status is RunStatus.HANDOFF:
            worker = store.command("worker", "--graph", quote(args.graph))
            out.line(f"  a worker resumes it: {clean(worker)}")
    return 1 if result.status is RunStatus.FAILED else 0


# ------------------------------------------------------------------------------- fork


async def cmd_fork(args: argparse.Namespace, out: Console) -> int:
    """``flowy fork``."""
    store = locate(args.backend, args.db)
    graph = load_graph(args.graph)
    codec = codec_for(args.codec, graph)
    overlay = parse_overlay(args.overlay, codec)
    thread = cast(str, args.thread)
    async with open_store(store, codec) as backend:
        runner: Runner[Any, Any] = Runner(graph, backend)
        try:
            token = await runner.fork(
                thread,
                at_revision=args.revision,
                new_thread_id=args.new_thread,
                state_overlay=overlay,
                resume_at=args.at,
            )
        except ConcurrencyConflictError:
            raise CliError(
                f"thread {args.new_thread!r} already exists; fork to a new thread id"
            ) from None
        except ValueError as exc:  # the overlay names an unknown field, or does not fit
            if overlay is None:
                raise
            raise CliError(f"--overlay: {one_line(str(exc))}", 2) from None
        head, _ = await backend.checkpointer.load(token.thread_id)
    if args.json:
        print_json(
            out,
            {
                "thread_id": token.thread_id,
                "revision": token.snapshot_revision,
                "resume_token": str(token),
                "parent_thread_id": thread,
                "parent_revision": args.revision,
                "execution_pointer": head.execution_pointer,
                "graph_version": head.graph_version,
            },
        )
        return 0
    resume = store.command("resume", quote(str(token)), "--graph", quote(args.graph))
    out.line(
        f"forked {clean(thread, 80)}@{args.revision} to {clean(token.thread_id, 80)} "
        f"(suspended at {clean(head.execution_pointer, 40)}, resume token {clean(str(token))}); "
        f"{clean(thread, 80)} is unchanged"
    )
    out.line(f"  resume it: {clean(resume)}")
    return 0


# ----------------------------------------------------------------------------- signal


async def cmd_signal(args: argparse.Namespace, out: Console) -> int:
    """``flowy signal``."""
    store = locate(args.backend, args.db)
    payload = None if args.payload is None else parse_json(args.payload, "--json")
    thread = cast(str, args.thread)
    async with open_store(store, None) as backend:
        try:
            stored = await send_signal(
                durable_of(backend.checkpointer, "Runner.signal"),
                backend.outbox,
                thread,
                args.name,
                payload,
                args.signal_id,
                time.time(),
            )
        except ThreadNotFoundError:
            raise not_found(thread, store) from None
        except ThreadCompletedError as exc:  # the operation fails: not a usage error
            raise CliError(one_line(str(exc))) from None
        except (ValueError, TypeError) as exc:  # a bad name, id or payload
            raise CliError(one_line(str(exc)), 2) from None
        head, _ = await backend.checkpointer.load(thread)
    waiting = head.status is RunStatus.WAITING and head.waiting_for == stored.name
    after = (
        "the thread waits for it: a worker resumes it"
        if waiting
        else "kept until the thread waits for it"
    )
    out.line(
        f"signal {clean(stored.name, 60)!r} #{stored.seq} (id {clean(stored.signal_id, 60)}) "
        f"stored for thread {clean(thread, 80)}; {after}"
    )
    return 0


# ----------------------------------------------------------------------- dead-letters


async def cmd_dead_letters(args: argparse.Namespace, out: Console) -> int:
    """``flowy dead-letters``."""
    store = locate(args.backend, args.db)
    retries = cast("list[str]", args.retry or [])
    async with open_store(store, None) as backend:
        consumer = backend.consumer
        for message_id in retries:
            try:
                await consumer.retry_dead_letter(message_id)
            # The SQLite store turns a numeric id into a 64-bit integer before looking it
            # up; a longer one cannot name a dead letter there.
            except (KeyError, OverflowError):
                raise CliError(
                    f"no dead letter with id {message_id!r}; "
                    f"`{store.command('dead-letters')}` lists them"
                ) from None
            out.line(f"requeued dead letter {clean(message_id)}")
        if retries:
            return 0
        dead = await consumer.dead_letters(args.limit)
    if args.json:
        print_json(out, [dead_letter_json(m) for m in dead])
        return 0
    if not dead:
        out.line("no dead letters")
        return 0
    out.table(
        ["ID", "THREAD", "REVISION", "ATTEMPTS", "REASON", "POINTER", "ERROR"],
        [
            [
                clean(m.message_id, 80),
                clean(m.intent.thread_id, 48) if m.intent else "(undecodable)",
                str(m.intent.snapshot_revision) if m.intent else "-",
                str(m.attempts),
                clean(m.intent.reason, 32) if m.intent else "-",
                clean(m.intent.execution_pointer, 32) if m.intent else "-",
                clean(" ".join(m.error.split()), 100) or "-",
            ]
            for m in dead
        ],
    )
    retry = store.command("dead-letters", "--retry", "ID")
    out.line(out.paint(f"requeue one once its cause is fixed: {clean(retry)}", "dim"))
    return 0
