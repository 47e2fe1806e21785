"""The commands that look without touching: ``threads``, ``show``, ``history`` and
``graph``.

They read through the ``Backend`` API only (``list_threads``, ``load``,
``get_history``, the lease holder, the consumer's dead letters), so they work the same
on every store, and they never write. Tables for people, ``--json`` for scripts.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any, cast

from .._errors import InvalidThreadIdError, ThreadNotFoundError
from .._graph import Graph
from ..storage import (
    ActivityRecord,
    Checkpointer,
    DeadLetter,
    DurableCheckpointer,
    HandoffStatus,
    Lease,
    RunStatus,
    Signal,
    Snapshot,
    ThreadSummary,
)
from ._options import CliError, load_graph, quote
from ._render import Console, clean, compact_json, fmt_time, pretty_json
from ._store import Store, codec_for, dead_letters_by_thread, locate, open_store

__all__ = [
    "PAGE",
    "state_diff",
    "cmd_graph",
    "cmd_history",
    "cmd_show",
    "cmd_threads",
    "cmd_timers",
    "dead_letter_json",
    "list_threads",
    "not_found",
    "print_history",
    "print_json",
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


def _signal_json(signal: Signal) -> dict[str, Any]:
    return {
        "seq": signal.seq,
        "name": signal.name,
        "signal_id": signal.signal_id,
        "payload": signal.payload,
        "sent_at": signal.sent_at,
    }


async def _journal_and_inbox(
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


def _lease_json(lease: Lease | None) -> dict[str, Any] | None:
    if lease is None:
        return None
    return {"owner": lease.owner, "token": lease.fencing_token, "expires_at": lease.expires_at}


# ---------------------------------------------------------------------------- threads


def _dead_cell(dead: Sequence[DeadLetter]) -> str:
    return clean(",".join(d.message_id for d in dead), 80) if dead else "-"


async def cmd_threads(args: argparse.Namespace, out: Console) -> int:
    """``flowy threads``."""
    store = locate(args.backend, args.db)
    after = cast("str | None", args.after)
    async with open_store(store, codec_for(args.codec, None)) as backend:
        rows, more = await list_threads(
            backend.checkpointer, limit=args.limit, after=after, version=args.version
        )
        dead = await dead_letters_by_thread(backend.consumer) if rows else {}
    if args.json:
        print_json(out, [summary_json(s, dead.get(s.thread_id, ())) for s in rows])
        return 0
    if not rows:
        past = f" after {clean(after, 60)!r}" if after is not None else ""
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


# ------------------------------------------------------------------------------- show

_RESUMABLE = frozenset(
    {RunStatus.SUSPENDED, RunStatus.CANCELED, RunStatus.HANDOFF, RunStatus.WAITING}
)


_APP_HINT = " (or --app MODULE:FACTORY instead of --graph, for an app whose nodes need bindings)"


def _next_step(
    snap: Snapshot[Any],
    revision: int,
    store: Store,
    graph: str | None,
    dead: Sequence[DeadLetter],
) -> str | None:
    """The command that moves the thread on; without a known ``graph``, the worker's
    hint names ``--app`` too (a factory that gives the runs their bindings)."""
    app = "" if graph else _APP_HINT
    graph = graph or "MODULE:ATTR"
    stuck = snap.status in (RunStatus.HANDOFF, RunStatus.RUNNING)
    if dead and stuck:
        retry = store.command("dead-letters", "--retry", quote(dead[-1].message_id))
        return f"requeue its dead-lettered hand-off once the cause is fixed: {retry}"
    if snap.handoff_status in (HandoffStatus.PENDING, HandoffStatus.ORPHANED):
        return store.command("recover", "--graph", graph)
    if snap.status is RunStatus.HANDOFF:
        return "a worker resumes it: " + store.command("worker", "--graph", graph) + app
    if snap.status is RunStatus.WAITING:
        how = "when its time comes" if not snap.waiting_for else "when its signal arrives"
        text = f"a worker resumes it {how}: " + store.command("worker", "--graph", graph) + app
        if snap.waiting_for:
            send = store.command(
                "signal", quote(snap.thread_id), quote(snap.waiting_for), "--json", "'{...}'"
            )
            text += f"; send the signal: {send}"
        return text
    if snap.status in (RunStatus.SUSPENDED, RunStatus.CANCELED):
        token = f"{snap.thread_id}@{revision}"
        return store.command("resume", quote(token), "--graph", graph)
    return None


def _dead_text(out: Console, letter: DeadLetter) -> str:
    revision = f" of revision {letter.intent.snapshot_revision}" if letter.intent else ""
    error = clean(" ".join(letter.error.split()), 160) or "-"
    return (
        f"{out.paint('dead-lettered', 'red', 'bold')} message {clean(letter.message_id, 80)}"
        f"{revision} after {letter.attempts} deliveries: {error}"
    )


async def cmd_show(args: argparse.Namespace, out: Console) -> int:
    """``flowy show``."""
    store = locate(args.backend, args.db)
    thread = cast(str, args.thread)
    graph = load_graph(args.graph) if args.graph else None
    async with open_store(store, codec_for(args.codec, graph)) as backend:
        try:
            snap, revision = await backend.checkpointer.load(thread)
        except ThreadNotFoundError:
            raise not_found(thread, store) from None
        lease = await backend.leases.holder(thread)
        dead = (await dead_letters_by_thread(backend.consumer)).get(thread, [])
        journal, pending = await _journal_and_inbox(backend, snap)
    if args.json:
        data = _snapshot_json(snap, revision)
        data["lease"] = _lease_json(lease)
        data["dead_letters"] = [dead_letter_json(d) for d in dead]
        data["journal"] = [r.as_json() for r in journal]
        data["pending_signals"] = [_signal_json(s) for s in pending]
        print_json(out, data)
        return 0
    dot = out.sym("dot")
    limits: Mapping[str, int] = graph.budgets if graph is not None else {}
    budgets = ", ".join(
        f"{clean(name, 40)} {snap.budget_counts.get(name, 0)}"
        + (f"/{limits[name]}" if name in limits else "")
        for name in sorted({*snap.budget_counts, *limits})
    )
    lease_text = (
        "none"
        if lease is None
        else f"{clean(lease.owner, 60)} (fencing token {lease.fencing_token}, expires in "
        f"{max(lease.expires_at - time.time(), 0.0):.1f}s)"
    )
    resume = f" {dot} resume token {clean(snap.thread_id)}@{revision}"
    handoff = snap.handoff_status.value
    if snap.handoff_pending_at:
        handoff += f" since {fmt_time(snap.handoff_pending_at)}"
    if dead:
        handoff += f" {dot} " + out.paint("its message is DEAD-LETTERED", "red", "bold")
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
        ("hand-off", handoff),
        *(("dead", _dead_text(out, d)) for d in dead),
        *((("waiting", _wait_text(out, snap)),) if snap.status is RunStatus.WAITING else ()),
        *(
            (
                (
                    "signals",
                    f"{len(pending)} not yet taken: "
                    + ", ".join(f"#{s.seq} {clean(s.name, 40)}" for s in pending[:10]),
                ),
            )
            if pending
            else ()
        ),
        *((("inside", _nested_text(out, snap)),) if snap.nested else ()),
        *((("forked", _lineage_text(snap)),) if snap.parent_thread_id else ()),
        *((("graph", f"version {clean(snap.graph_version, 60)}"),) if snap.graph_version else ()),
        ("updated", fmt_time(snap.updated_at)),
        ("lease", lease_text),
        ("budgets", budgets or "none"),
        ("metadata", compact_json(dict(snap.metadata)) if snap.metadata else "none"),
    ]
    hint = _next_step(snap, revision, store, args.graph and quote(args.graph), dead)
    if hint is not None:
        fields.append(("next", clean(hint)))
    for key, value in fields:
        out.line(f"{out.paint(key.ljust(9), 'bold')} {value}")
    out.line(out.paint("state", "bold"))
    for line in pretty_json(snap.state).splitlines():
        out.line("  " + line)
    if journal:
        out.line(out.paint("journal", "bold"))
        out.table(
            ["KEY", "STATUS", "ATTEMPTS", "STARTED", "RESULT / ERROR"],
            [
                [
                    clean(r.key, 48),
                    r.status.value,
                    str(r.attempts),
                    fmt_time(r.started_at),
                    clean(r.error or compact_json(r.result), 80)
                    + (f" (next attempt {fmt_time(r.retry_at)})" if r.retry_at else ""),
                ]
                for r in journal
            ],
        )
    return 0


def _nested_text(out: Console, snap: Snapshot[Any]) -> str:
    node = clean(str(snap.nested.get("node", "")), 60)
    pointer = clean(str(snap.nested.get("pointer", "")), 60)
    return f"subgraph {node} {out.sym('arrow')} at {pointer} (its state is saved with this one)"


def _lineage_text(snap: Snapshot[Any]) -> str:
    parent = f"{snap.parent_thread_id}@{snap.parent_revision}"
    return f"from {clean(parent, 120)} (its history is its own from there)"


def _wait_text(out: Console, snap: Snapshot[Any]) -> str:
    dot = out.sym("dot")
    parts = [f"for signal {clean(snap.waiting_for, 60)!r}" if snap.waiting_for else "asleep"]
    if snap.wake_at is not None:
        left = snap.wake_at - time.time()
        when = "due now" if left <= 0 else f"in {left:.1f}s"
        parts.append(f"until {fmt_time(snap.wake_at)} ({when})")
        parts.append(f"then at {clean(snap.on_timeout or snap.execution_pointer, 60)}")
    return f" {dot} ".join(parts)


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


# ---------------------------------------------------------------------------- history


async def print_history(
    out: Console, checkpointer: Checkpointer[Any], store: Store, thread: str, limit: int
) -> None:
    """The revisions table of ``thread``, newest first."""
    snaps = await _history(checkpointer, store, thread, limit)
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
        styler=status_styler(out, 1),
    )


async def _history(
    checkpointer: Checkpointer[Any], store: Store, thread: str, limit: int
) -> list[Snapshot[Any]]:
    snaps = await checkpointer.get_history(thread, limit)
    if not snaps:
        try:
            await checkpointer.load(thread)
        except ThreadNotFoundError:
            raise not_found(thread, store) from None
    return snaps


def state_diff(before: Any, after: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """What changed from ``before`` to ``after``, as ``(path, old, new)`` rows: keys of
    mappings are followed, anything else that differs is one row (``...`` marks a
    missing side)."""
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        rows: list[tuple[str, Any, Any]] = []
        old = cast(Mapping[str, Any], before)
        new = cast(Mapping[str, Any], after)
        for key in [*old, *(k for k in new if k not in old)]:
            where = f"{path}.{key}" if path else str(key)
            if key not in new:
                rows.append((where, old[key], ...))
            elif key not in old:
                rows.append((where, ..., new[key]))
            else:
                rows.extend(state_diff(old[key], new[key], where))
        return rows
    if before != after:
        return [(path or "state", before, after)]
    return []


def _print_diffs(out: Console, snaps: Sequence[Snapshot[Any]]) -> None:
    """Each revision and how its state differs from the one before (oldest first)."""
    ordered = sorted(snaps, key=lambda s: s.revision)
    for older, newer in zip([None, *ordered], ordered, strict=False):
        head = (
            f"revision {newer.revision} {out.sym('dot')} {newer.status.value} "
            f"{out.sym('dot')} at {clean(newer.execution_pointer, 40)}"
        )
        out.line(out.paint(head, "bold"))
        if older is None:
            out.line(f"  {compact_json(newer.state)[:200]}")
            continue
        changes = state_diff(_plain(older.state), _plain(newer.state))
        if not changes:
            out.line("  (state unchanged)")
        for where, old, new in changes:
            shown_old = "(absent)" if old is ... else compact_json(old)[:80]
            shown_new = "(absent)" if new is ... else compact_json(new)[:80]
            out.line(f"  {clean(where, 60)}: {shown_old} {out.sym('arrow')} {shown_new}")


def _plain(state: Any) -> Any:
    """A typed state as plain JSON values (what the diff compares)."""
    return json.loads(compact_json(state))


async def cmd_history(args: argparse.Namespace, out: Console) -> int:
    """``flowy history``."""
    store = locate(args.backend, args.db)
    graph = load_graph(args.graph) if args.graph else None
    async with open_store(store, codec_for(args.codec, graph)) as backend:
        if args.diff:
            snaps = await _history(backend.checkpointer, store, args.thread, args.limit)
            if args.json:
                ordered = sorted(snaps, key=lambda s: s.revision)
                print_json(
                    out,
                    [
                        {
                            "revision": newer.revision,
                            "changes": [
                                {
                                    "path": w,
                                    "old": None if o is ... else o,
                                    "new": None if n is ... else n,
                                }
                                for w, o, n in state_diff(_plain(older.state), _plain(newer.state))
                            ],
                        }
                        for older, newer in itertools.pairwise(ordered)
                    ],
                )
            else:
                _print_diffs(out, snaps)
            return 0
        if args.json:
            snaps = await _history(backend.checkpointer, store, args.thread, args.limit)
            print_json(out, [_snapshot_json(s, s.revision) for s in snaps])
        else:
            await print_history(out, backend.checkpointer, store, args.thread, args.limit)
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
