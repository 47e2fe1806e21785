"""``flowy show``: one thread's head, as a person reads it (what it waits for, what it
holds, the command that moves it on) or as ``--json``. It reads through the
``Backend`` API only and never writes.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping, Sequence
from typing import Any, cast

from .._errors import ThreadNotFoundError
from ..storage import (
    DeadLetter,
    HandoffStatus,
    RunStatus,
    Snapshot,
)
from ._inspect import (
    dead_letter_json,
    journal_and_inbox,
    lease_json,
    not_found,
    print_json,
    signal_json,
    snapshot_json,
)
from ._options import load_graph, quote
from ._render import Console, clean, compact_json, fmt_time, pretty_json
from ._store import Store, codec_for, dead_letters_by_thread, locate, open_store

__all__ = ["cmd_show"]

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
        journal, pending = await journal_and_inbox(backend, snap)
    if args.json:
        data = snapshot_json(snap, revision)
        data["lease"] = lease_json(lease)
        data["dead_letters"] = [dead_letter_json(d) for d in dead]
        data["journal"] = [r.as_json() for r in journal]
        data["pending_signals"] = [signal_json(s) for s in pending]
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
