"""The commands that look without touching: ``threads``, ``timers`` and ``graph`` here,
``show`` in :mod:`._show`, ``history`` in :mod:`._history`, with the JSON shapes and
helpers they share.

They read through the ``Backend`` API only (``list_threads``, ``load``,
``get_history``, the lease holder, the consumer's dead letters), so they work the same
on every store, and they never write. Tables for people, ``--json`` for scripts.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from .._errors import InvalidThreadIdError
from .._graph import Graph
from ..storage import (
    ActivityRecord,
    Checkpointer,
    DeadLetter,
    DurableCheckpointer,
    HandoffStatus,
    Lease,
    Signal,
    Snapshot,
    ThreadSummary,
)
from ..storage._recent import RecentCursor, cursor_text, parse_cursor, recent_key, recent_threads
from ._options import CliError, load_graph, quote
from ._render import Console, clean, fmt_time, pretty_json
from ._store import Store, codec_for, dead_letters_by_thread, locate, open_store
from ._svg import to_svg

__all__ = [
    "PAGE",
    "cmd_graph",
    "cmd_threads",
    "cmd_timers",
    "dead_letter_json",
    "journal_and_inbox",
    "lease_json",
    "list_recent",
    "list_threads",
    "not_found",
    "print_json",
    "signal_json",
    "snapshot_json",
    "status_styler",
    "summary_json",
]

PAGE = 500
"""Threads asked of a store in one ``list_threads`` call."""


def print_json(out: Console, value: object) -> None:
    """Write ``value`` as indented JSON."""
    out.block(pretty_json(value))


def not_found(thread: str, store: Store) -> CliError:
    """The error for a thread that is not in ``store``."""
    return CliError(
        f"no thread {thread!r} in {store.label!r}; `{store.command('threads')}` lists the threads"
    )


def status_styler(out: Console, column: int) -> Any:
    """A table styler colouring the run status in ``column``."""

    def styler(i: int, value: str, padded: str) -> str:
        return out.status(value, padded) if i == column else padded

    return styler


async def list_threads(
    checkpointer: Checkpointer[Any],
    *,
    limit: int,
    after: str | None = None,
    statuses: frozenset[HandoffStatus] | None = None,
    version: str | None = None,
) -> tuple[list[ThreadSummary], bool]:
    """Up to ``limit`` thread heads past ``after`` (only those saved by graph ``version``
    if given), asked for a page at a time; and whether more follow."""
    rows: list[ThreadSummary] = []
    cursor = after
    while len(rows) <= limit:
        want = PAGE if version is not None else min(PAGE, limit + 1 - len(rows))
        try:
            page = await checkpointer.list_threads(
                handoff_statuses=statuses, limit=want, after=cursor
            )
        except InvalidThreadIdError as exc:
            raise CliError(f"--after: {exc}", 2) from None
        rows.extend(s for s in page if version is None or s.graph_version == version)
        if len(page) < want:
            break
        cursor = page[-1].thread_id
    return rows[:limit], len(rows) > limit


async def list_recent(
    checkpointer: Checkpointer[Any],
    *,
    limit: int,
    before: RecentCursor | None = None,
    version: str | None = None,
) -> tuple[list[ThreadSummary], bool]:
    """Up to ``limit`` thread heads most recently saved first (to the second), below
    ``before`` (only those saved by graph ``version`` if given), asked for a page at a
    time through the store's recency cursor; and whether more follow."""
    rows: list[ThreadSummary] = []
    cursor = before
    while len(rows) <= limit:
        want = PAGE if version is not None else min(PAGE, limit + 1 - len(rows))
        page = await recent_threads(checkpointer, limit=want, before=cursor)
        rows.extend(s for s in page if version is None or s.graph_version == version)
        if len(page) < want:
            break
        cursor = recent_key(page[-1])
    return rows[:limit], len(rows) > limit


# ------------------------------------------------------------------------ json shapes


def dead_letter_json(letter: DeadLetter) -> dict[str, Any]:
    """A dead letter as JSON (``thread_id`` and the intent's fields are ``null`` when its
    payload does not decode)."""
    intent = letter.intent
    return {
        "message_id": letter.message_id,
        "thread_id": intent.thread_id if intent else None,
        "revision": intent.snapshot_revision if intent else None,
        "attempts": letter.attempts,
        "reason": intent.reason if intent else None,
        "pointer": intent.execution_pointer if intent else None,
        "error": letter.error,
        "decodable": intent is not None,
    }


def summary_json(s: ThreadSummary, dead: Sequence[DeadLetter] = ()) -> dict[str, Any]:
    """A thread head as JSON, with the ids of its dead-lettered hand-off messages."""
    return {
        "thread_id": s.thread_id,
        "revision": s.revision,
        "status": s.status.value,
        "reason": s.reason,
        "execution_pointer": s.execution_pointer,
        "handoff_status": s.handoff_status.value,
        "handoff_pending_at": s.handoff_pending_at,
        "updated_at": s.updated_at,
        "graph_version": s.graph_version,
        "dead_letters": [d.message_id for d in dead],
    }


def snapshot_json(snap: Snapshot[Any], revision: int) -> dict[str, Any]:
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
        "wake_at": snap.wake_at,
        "waiting_for": snap.waiting_for,
        "on_timeout": snap.on_timeout,
        "signal_cursors": dict(snap.signal_cursors),
        "graph_version": snap.graph_version,
        "parent_thread_id": snap.parent_thread_id or None,
        "parent_revision": snap.parent_revision or None,
        "nested": dict(snap.nested) or None,
        "state": snap.state,
    }


def signal_json(signal: Signal) -> dict[str, Any]:
    return {
        "seq": signal.seq,
        "name": signal.name,
        "signal_id": signal.signal_id,
        "payload": signal.payload,
        "sent_at": signal.sent_at,
    }


async def journal_and_inbox(
    backend: Any, snap: Snapshot[Any]
) -> tuple[list[ActivityRecord], list[Signal]]:
    """The thread's activity journal and its signals not yet taken (empty for a store
    that keeps neither)."""
    cp = backend.checkpointer
    if not isinstance(cp, DurableCheckpointer):
        return [], []
    durable = cast(DurableCheckpointer[Any], cp)
    journal = await durable.journal(snap.thread_id)
    cursors = snap.signal_cursors
    signals = [
        s
        for s in await durable.signals(snap.thread_id, limit=1000)
        if s.seq > cursors.get(s.name, 0)
    ]
    return journal, signals


def lease_json(lease: Lease | None) -> dict[str, Any] | None:
    if lease is None:
        return None
    return {"owner": lease.owner, "token": lease.fencing_token, "expires_at": lease.expires_at}


# ---------------------------------------------------------------------------- threads


def _dead_cell(dead: Sequence[DeadLetter]) -> str:
    return clean(",".join(d.message_id for d in dead), 80) if dead else "-"


def _cursor(text: str | None) -> RecentCursor | None:
    if text is None:
        return None
    try:
        return parse_cursor(text)
    except ValueError as exc:  # InvalidThreadIdError too
        raise CliError(f"--before: {exc}", 2) from None


async def cmd_threads(args: argparse.Namespace, out: Console) -> int:
    """``flowy threads`` (``--recent``: most recently saved first)."""
    store = locate(args.backend, args.db)
    after = cast("str | None", args.after)
    before = _cursor(cast("str | None", args.before))
    recent = bool(args.recent) or before is not None
    if recent and after is not None:
        raise CliError("--after pages by thread id; with --recent, page with --before", 2)
    async with open_store(store, codec_for(args.codec, None)) as backend:
        if recent:
            rows, more = await list_recent(
                backend.checkpointer, limit=args.limit, before=before, version=args.version
            )
        else:
            rows, more = await list_threads(
                backend.checkpointer, limit=args.limit, after=after, version=args.version
            )
        dead = await dead_letters_by_thread(backend.consumer) if rows else {}
    if args.json:
        print_json(out, [summary_json(s, dead.get(s.thread_id, ())) for s in rows])
        return 0
    if not rows:
        past = f" after {clean(after, 60)!r}" if after is not None else ""
        if before is not None:
            past = f" saved before {clean(cursor_text(before), 80)!r}"
        on = f" saved by graph version {clean(args.version, 60)!r}" if args.version else ""
        out.line(f"no threads{on} in {clean(store.label)}{past}")
        return 0
    out.table(
        ["THREAD", "STATUS", "REASON", "POINTER", "REVISION", "HANDOFF", "DEAD", "UPDATED"],
        [
            [
                clean(s.thread_id, 48),
                s.status.value,
                clean(s.reason, 32),
                clean(s.execution_pointer, 32),
                str(s.revision),
                s.handoff_status.value,
                _dead_cell(dead.get(s.thread_id, ())),
                fmt_time(s.updated_at),
            ]
            for s in rows
        ],
        styler=_threads_styler(out),
    )
    if more:
        words = ["threads", "--after", quote(rows[-1].thread_id)]
        if recent:
            words = ["threads", "--recent", "--before", quote(cursor_text(recent_key(rows[-1])))]
        if args.version is not None:
            words += ["--version", quote(args.version)]
        if args.limit != 100:
            words += ["--limit", str(args.limit)]
        out.line(out.paint(f"more threads follow: {store.command(*words)}", "dim"))
    return 0


def _threads_styler(out: Console) -> Any:
    def styler(i: int, value: str, padded: str) -> str:
        if i == 1:
            return out.status(value, padded)
        if i == 6 and value != "-":
            return out.paint(padded, "red", "bold")
        return padded

    return styler


# ----------------------------------------------------------------------------- timers


async def cmd_timers(args: argparse.Namespace, out: Console) -> int:
    """``flowy timers``."""
    store = locate(args.backend, args.db)
    now = time.time()
    async with open_store(store, None) as backend:
        cp = backend.checkpointer
        if not isinstance(cp, DurableCheckpointer):
            raise CliError(f"{type(cp).__name__} keeps no timers")
        durable: DurableCheckpointer[Any] = cp
        timers = await durable.timers(before=now if args.due else math.inf, limit=args.limit)
    if args.json:
        print_json(
            out,
            [
                {"thread_id": t.thread_id, "wake_at": t.wake_at, "due": t.wake_at <= now}
                for t in timers
            ],
        )
        return 0
    if not timers:
        out.line("no due timers" if args.due else "no timers")
        return 0
    out.table(
        ["THREAD", "WAKE AT", "WHEN"],
        [
            [
                clean(t.thread_id, 64),
                fmt_time(t.wake_at),
                "due" if t.wake_at <= now else f"in {t.wake_at - now:.1f}s",
            ]
            for t in timers
        ],
    )
    return 0


# ------------------------------------------------------------------------------ graph


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
    if name in graph.timeout_routes:
        parts.append(f"timeout {arrow} {graph.timeout_routes[name]}")
    return clean("; ".join(parts))


async def cmd_graph(args: argparse.Namespace, out: Console) -> int:
    """``flowy graph``."""
    graph = load_graph(args.spec)
    if args.svg is not None:
        drawn = to_svg(graph, title=f"the graph {args.spec}") + "\n"
        if args.svg == "-":
            out.block(drawn.rstrip("\n"))
            return 0
        try:
            await asyncio.to_thread(Path(args.svg).write_text, drawn, encoding="utf-8")
        except OSError as exc:
            raise CliError(f"--svg: cannot write {args.svg!r}: {exc.strerror or exc}", 2) from None
        out.line(f"wrote {clean(args.svg)} ({len(graph.nodes)} nodes)")
        return 0
    if args.mermaid:
        out.block(graph.to_mermaid().rstrip("\n"))
        return 0
    if args.json:
        print_json(
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
                "timeout_routes": dict(graph.timeout_routes),
                "version": graph.version,
            },
        )
        return 0
    dot = out.sym("dot")
    budgets = ", ".join(f"{clean(k)} {v}" for k, v in graph.budgets.items()) or "none"
    out.line(
        f"{out.paint(clean(args.spec), 'bold')} {dot} {len(graph.nodes)} nodes {dot} entry "
        f"{clean(graph.entry)} {dot} max_steps {graph.max_steps} {dot} budgets {budgets} "
        f"{dot} version {clean(graph.version, 40)}"
    )
    out.table(
        ["NODE", "ROUTE"],
        [[clean(name), _route_text(graph, name, out.sym("arrow"))] for name in graph.nodes],
    )
    return 0
