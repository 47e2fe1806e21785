"""The sections of the inspector's thread page (``flowy ui``), from what the store
holds of one thread: the facts of its head, the timeline of its revisions (each with
the effects it emitted, once, and its state changes folded), the activity journal, its
timers, its pending signals and its head as JSON. Every value is escaped with
:func:`._ui_html.e`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._compiled import Graph
from ..storage import ActivityRecord, RunStatus, Signal, Snapshot
from ._history import state_diff
from ._inspect import snapshot_json
from ._render import compact_json, pretty_json
from ._ui_html import e, plain, relative, span, status_badge, table, thread_href, when

__all__ = [
    "Lineage",
    "emitted",
    "facts",
    "head_json",
    "journal",
    "signals",
    "timeline",
    "timers",
]

Lineage = Sequence[tuple[str, int]]
"""The forks a thread came from, nearest first: ``(thread id, revision)``."""


def facts(
    snap: Snapshot[Any],
    revision: int,
    graph: Graph[Any, Any],
    lineage: Lineage,
    now: float,
) -> str:
    """The head at a glance: status, reason, node, revision, hand-off, when, graph
    version, the forks it came from, where inside a subgraph, and the wait."""
    rows: list[tuple[str, str]] = [
        ("status", status_badge(snap.status.value, "status")),
        ("reason", e(snap.reason or "-")),
        ("node", f"<span id='pointer'>{e(snap.execution_pointer)}</span>"),
        ("revision", f"<span class='num' id='revision'>{e(revision)}</span>"),
        ("hand-off", e(snap.handoff_status.value)),
        ("updated", relative(snap.updated_at, now)),
    ]
    version = e(snap.graph_version or "-")
    if snap.graph_version and snap.graph_version != graph.version:
        version += f" <span class='muted'>(the graph shown is {e(graph.version)})</span>"
    rows.append(("graph version", f"<code id='graph-version'>{version}</code>"))
    if lineage:
        links = " ← ".join(
            f"<a href='{thread_href(t)}'>{e(t)}</a>@<span class='num'>{e(r)}</span>"
            for t, r in lineage
        )
        rows.append(("forked from", f"<span id='lineage'>{links}</span>"))
    if snap.nested:
        where = f"subgraph {snap.nested.get('node', '')} at {snap.nested.get('pointer', '')}"
        rows.append(("inside", e(where)))
    if snap.status is RunStatus.WAITING or snap.wake_at is not None or snap.waiting_for:
        wait = e(f"for signal {snap.waiting_for!r}" if snap.waiting_for else "asleep")
        if snap.wake_at is not None:
            wait += ", due now" if snap.wake_at <= now else f", wakes {relative(snap.wake_at, now)}"
        rows.append(("waiting", wait))
    return "<dl class='facts'>" + "".join(f"<dt>{e(k)}</dt><dd>{v}</dd>" for k, v in rows) + "</dl>"


def emitted(older: Snapshot[Any] | None, newer: Snapshot[Any]) -> Sequence[Any]:
    """The effects ``newer`` emitted: a snapshot holds every effect its segment emitted
    so far, so those its predecessor in the same segment held already are not new."""
    if older is None or older.segment != newer.segment:
        return newer.effects
    before = list(older.effects)
    if list(newer.effects[: len(before)]) == before:
        return newer.effects[len(before) :]
    return newer.effects


def _changes(older: Snapshot[Any] | None, newer: Snapshot[Any], ident: str) -> str:
    if older is None:
        inner = f"<pre>{e(pretty_json(newer.state))}</pre>"
        summary = "initial state"
    else:
        diffs = state_diff(plain(older.state), plain(newer.state))
        if not diffs:
            return "<span class='muted'>(state unchanged)</span>"
        inner = "<br>".join(
            f"<code>{e(w)}: {e('(absent)' if o is ... else compact_json(o, 120))} → "
            f"{e('(absent)' if n is ... else compact_json(n, 120))}</code>"
            for w, o, n in diffs
        )
        fields = "field" if len(diffs) == 1 else "fields"
        summary = f"{len(diffs)} {fields} changed"
    return f"<details id='{e(ident)}'><summary>{e(summary)}</summary>{inner}</details>"


def timeline(history: Sequence[Snapshot[Any]], now: float) -> str:
    """The revisions, newest first: when, how long after the one before, node, status,
    reason, the effects emitted there, the state changes (folded), and a link that
    chooses the revision in the fork form (``?fork=N#fork``)."""
    rows: list[list[str]] = []
    for older, newer in zip([None, *history], history, strict=False):
        after = "" if older is None else "+" + span(newer.updated_at - older.updated_at)
        effects = "<br>".join(f"<code>{e(compact_json(x))}</code>" for x in emitted(older, newer))
        rows.append(
            [
                e(newer.revision),
                relative(newer.updated_at, now),
                f"<span title='{e(when(newer.updated_at))}'>{e(after)}</span>",
                e(newer.execution_pointer),
                status_badge(newer.status.value),
                e(newer.reason or ""),
                effects,
                _changes(older, newer, f"diff-{newer.revision}"),
                f"<a href='?fork={e(newer.revision)}#fork' id='fork-at-{e(newer.revision)}' "
                f"title='fork the thread at revision {e(newer.revision)}'>fork here</a>",
            ]
        )
    return (
        "<div id='history'>"
        + table(
            ["rev", "time", "after", "node", "status", "reason", "effects", "state", ""],
            reversed(rows),
            "no history",
            nums=(0, 2),
            ident="timeline",
        )
        + "</div>"
    )


def journal(records: Sequence[ActivityRecord], now: float) -> str:
    """The activity journal: each call's status, attempts, result or error."""
    rows: list[list[str]] = []
    for r in records:
        if r.error:
            first, _, rest = r.error.partition("\n")
            outcome = f"<span class='err-text'>{e(first)}</span>"
            if rest.strip():
                outcome = (
                    f"<details id='error-{e(r.key)}'><summary>{e(first)}</summary>"
                    f"<pre>{e(r.error)}</pre></details>"
                )
        else:
            outcome = f"<code>{e(compact_json(r.result, 300))}</code>"
        rows.append(
            [
                e(r.key),
                e(r.name or "-"),
                e(r.status.value),
                e(r.attempts),
                outcome,
                relative(r.updated_at, now),
                relative(r.retry_at, now) if r.retry_at else "-",
            ]
        )
    return table(
        ["key", "activity", "status", "attempts", "result / error", "updated", "next retry"],
        rows,
        "no activities",
        nums=(3,),
        ident="journal",
    )


def timers(snap: Snapshot[Any], records: Sequence[ActivityRecord], now: float) -> str:
    """The thread's timers: its wake-up time, and its activities' retries."""
    due: list[tuple[float, str]] = []
    if snap.wake_at is not None:
        what = f"signal {snap.waiting_for!r} times out" if snap.waiting_for else "wakes up"
        due.append((snap.wake_at, what))
    due += [(r.retry_at, f"activity {r.key!r} retries") for r in records if r.retry_at]
    return table(
        ["due at", "when", "what"],
        (
            [
                f"<time>{e(when(at))}</time>",
                e("due now") if at <= now else relative(at, now),
                e(what),
            ]
            for at, what in sorted(due)
        ),
        "no pending timers",
        ident="timers",
    )


def signals(pending: Sequence[Signal], now: float) -> str:
    """The signals sent to the thread that it has not taken yet."""
    return table(
        ["#", "name", "payload", "sent", "id"],
        (
            [
                e(s.seq),
                e(s.name),
                f"<code>{e(compact_json(s.payload, 300))}</code>",
                relative(s.sent_at, now),
                e(s.signal_id),
            ]
            for s in pending
        ),
        "no pending signals",
        nums=(0,),
        ident="signals",
    )


def head_json(snap: Snapshot[Any], revision: int) -> str:
    """The whole head, as ``flowy show --json`` prints it, behind a toggle."""
    return (
        "<details id='head-json'><summary>The whole head as JSON</summary>"
        f"<pre>{e(pretty_json(snapshot_json(snap, revision)))}</pre></details>"
    )
