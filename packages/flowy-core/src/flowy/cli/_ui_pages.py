"""The inspector's pages and actions (``flowy ui``): one :class:`Inspector` per app,
over one opened backend and one graph. Pages are server-rendered HTML built from
:mod:`._ui_html`; actions go through the same public API as the other commands
(``Runner.resume``, ``recover_stale_handoff``, ``fork``, ``Runner.cancel``,
``Runner.terminate``, the consumer's ``retry_dead_letter``). Serving, the token, the
CSRF check and the command are in :mod:`._ui`.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .._cancel import is_canceled_from_outside
from .._graph import Graph
from .._runner import DEFAULT_LEASE_TTL, Runner, default_owner
from ..storage import (
    ActivityRecord,
    Backend,
    DurableCheckpointer,
    HandoffStatus,
    ResumeToken,
    RunStatus,
    Snapshot,
)
from ._history import state_diff
from ._inspect import dead_letter_json, list_threads
from ._options import CliError, one_line, parse_overlay
from ._render import compact_json, pretty_json
from ._store import codec_for, dead_letters_by_thread
from ._ui_html import (
    CSS,
    age,
    e,
    in_seconds,
    mermaid_marked,
    plain,
    table,
    thread_href,
    thread_path,
    when,
)

if TYPE_CHECKING:
    from starlette.requests import Request

__all__ = ["Inspector"]

_LIMIT = 500
_STOP_ACTIONS_TIMEOUT = 15.0  # a cancelled resume's save is bounded at 10 s
_STUCK = frozenset({HandoffStatus.PENDING, HandoffStatus.ORPHANED})
_RESUMABLE = frozenset(
    {RunStatus.SUSPENDED, RunStatus.CANCELED, RunStatus.WAITING, RunStatus.FAILED}
)


class Inspector:
    """The pages and actions of one app (one backend, one graph)."""

    def __init__(self, backend: Backend[Any], graph: Graph[Any, Any], token: str) -> None:
        self.backend = backend
        self.graph = graph
        self.token = token
        self.csrf = secrets.token_urlsafe(32)
        self.codec = codec_for(None, graph)
        self.runner: Runner[Any, Any] = Runner(
            graph, backend, run_lease=(default_owner(), DEFAULT_LEASE_TTL)
        )
        self.acting: set[asyncio.Task[Any]] = set()  # the requests running an action
        self.stopping = False

    async def stop_actions(self) -> None:
        """Cancel the actions in flight and wait for them: a resume saves its cancel
        snapshot and lets go of its lease while the store is still open, and its request
        is answered with 503."""
        self.stopping = True
        tasks = {t for t in self.acting if not t.done()}
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=_STOP_ACTIONS_TIMEOUT)

    # -- layout

    def page(self, title: str, body: str, request: Request) -> str:
        """A whole HTML page around ``body`` (escaped already), with the flash message."""
        flash = ""
        if msg := request.query_params.get("msg"):
            flash += f'<p class="msg" id="msg">{e(one_line(msg)[:500])}</p>'
        if err := request.query_params.get("err"):
            flash += f'<p class="err" id="err">{e(one_line(err)[:500])}</p>'
        return (
            "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>{e(title)} - flowy ui</title><style>{CSS}</style></head><body>"
            "<nav><a href='/'>Threads</a><a href='/dead-letters'>Dead letters</a></nav>"
            f"<h1>{e(title)}</h1>{flash}{body}</body></html>"
        )

    def form(self, action: str, fields: Mapping[str, str], inner: str, label: str) -> str:
        hidden = "".join(
            f"<input type='hidden' name='{e(k)}' value='{e(v)}'>"
            for k, v in {**fields, "csrf": self.csrf}.items()
        )
        return (
            f"<form method='post' action='/actions/{e(action)}' class='inline'>{hidden}"
            f"{inner}<button type='submit' name='do' value='{e(action)}'>{e(label)}</button>"
            "</form>"
        )

    # -- pages

    async def threads(self, request: Request) -> str:
        status = request.query_params.get("status", "")
        node = request.query_params.get("node", "")
        rows, more = await list_threads(self.backend.checkpointer, limit=_LIMIT)
        shown = [
            s
            for s in rows
            if (not status or s.status.value == status)
            and (not node or s.execution_pointer == node)
        ]
        dead = await dead_letters_by_thread(self.backend.consumer) if shown else {}
        now = time.time()
        options = "".join(
            f"<option value='{e(v)}'{' selected' if v == status else ''}>{e(v or 'any')}</option>"
            for v in ["", *(s.value for s in RunStatus)]
        )
        filters = (
            "<form method='get' action='/'>"
            f"<label>status <select name='status'>{options}</select></label> "
            f"<label>node <input name='node' value='{e(node)}'></label> "
            "<button type='submit'>Filter</button></form>"
        )
        listing = table(
            ["thread", "status", "reason", "pointer", "revision", "hand-off", "updated"],
            (
                [
                    f"<a href='{thread_href(s.thread_id)}'>{e(s.thread_id)}</a>",
                    f"<span class='status'>{e(s.status.value)}</span>",
                    e(s.reason),
                    e(s.execution_pointer),
                    e(s.revision),
                    e(s.handoff_status.value)
                    + (" <strong>(dead letter)</strong>" if s.thread_id in dead else ""),
                    e(age(s.updated_at, now)),
                ]
                for s in shown
            ),
            "no threads" + (" match" if status or node else ""),
        )
        note = f"<p><em>only the first {_LIMIT} threads are listed</em></p>" if more else ""
        return self.page("Threads", filters + listing + note, request)

    async def thread(self, request: Request, thread: str) -> str:
        snap, token = await self.runner.head(thread)
        cp = self.backend.checkpointer
        history = sorted(await cp.get_history(thread, 50), key=lambda s: s.revision)
        journal: list[ActivityRecord] = []
        timers: list[float] = []
        if isinstance(cp, DurableCheckpointer):
            durable: DurableCheckpointer[Any] = cp
            journal = await durable.journal(thread)
            timers = [t.wake_at for t in await durable.timers(limit=1000) if t.thread_id == thread]
        now = time.time()
        head = [
            ("status", f"<span class='status' id='status'>{e(snap.status.value)}</span>"),
            ("reason", e(snap.reason or "-")),
            ("pointer", e(snap.execution_pointer)),
            ("revision", e(token.snapshot_revision)),
            ("hand-off", e(snap.handoff_status.value)),
            ("updated", e(age(snap.updated_at, now))),
            ("graph version", e(snap.graph_version or "-")),
        ]
        if snap.parent_thread_id:
            parent = f"{snap.parent_thread_id}@{snap.parent_revision}"
            head.append(
                (
                    "forked from",
                    f"<a href='{thread_href(snap.parent_thread_id)}'>{e(parent)}</a>",
                )
            )
        if snap.nested:
            where = f"subgraph {snap.nested.get('node', '')} at {snap.nested.get('pointer', '')}"
            head.append(("inside", e(where)))
        if snap.status is RunStatus.WAITING or snap.wake_at is not None or snap.waiting_for:
            wait = f"for signal {snap.waiting_for!r}" if snap.waiting_for else "asleep"
            if snap.wake_at is not None:
                left = snap.wake_at - now
                wait += ", due now" if left <= 0 else f", wakes {in_seconds(left)}"
            head.append(("waiting", e(wait)))
        facts = "<dl>" + "".join(f"<dt>{e(k)}</dt><dd>{v}</dd>" for k, v in head) + "</dl>"
        sections = [
            facts,
            self._actions(snap, token),
            "<h2>State</h2>",
            f"<pre id='state'>{e(pretty_json(snap.state))}</pre>",
            "<h2>History</h2>",
            self._history(history),
            "<h2>Effects</h2>",
            table(
                ["revision", "effect"],
                (
                    [e(s.revision), f"<code>{e(compact_json(x))}</code>"]
                    for s in history
                    for x in s.effects
                ),
                "no effects",
            ),
            "<h2>Activity journal</h2>",
            table(
                ["key", "status", "attempts", "result / error"],
                (
                    [
                        e(r.key),
                        e(r.status.value),
                        e(r.attempts),
                        e(r.error or compact_json(r.result)),
                    ]
                    for r in journal
                ),
                "no activities",
            ),
            "<h2>Timers</h2>",
            table(
                ["wake at", "when"],
                (
                    [
                        e(when(w)),
                        e("due" if w <= now else in_seconds(w - now)),
                    ]
                    for w in timers
                ),
                "no pending timers",
            ),
            "<h2>Graph (Mermaid)</h2>",
            f"<pre id='graph'>{e(mermaid_marked(self.graph, snap))}</pre>",
        ]
        return self.page(f"Thread {thread}", "".join(sections), request)

    def _history(self, history: Sequence[Snapshot[Any]]) -> str:
        rows: list[list[str]] = []
        for older, newer in zip([None, *history], history, strict=False):
            if older is None:
                change = f"<code>{e(compact_json(newer.state, 300))}</code>"
            else:
                diffs = state_diff(plain(older.state), plain(newer.state))
                change = (
                    "<br>".join(
                        f"<code>{e(w)}: "
                        f"{e('(absent)' if o is ... else compact_json(o, 120))} → "
                        f"{e('(absent)' if n is ... else compact_json(n, 120))}</code>"
                        for w, o, n in diffs
                    )
                    or "<em>(state unchanged)</em>"
                )
            rows.append(
                [
                    e(newer.revision),
                    e(newer.status.value),
                    e(newer.reason),
                    e(newer.execution_pointer),
                    e(newer.handoff_status.value),
                    change,
                ]
            )
        return (
            "<div id='history'>"
            + table(
                ["rev", "status", "reason", "pointer", "hand-off", "changes"],
                reversed(rows),
                "no history",
            )
            + "</div>"
        )

    def _actions(self, snap: Snapshot[Any], token: ResumeToken) -> str:
        thread = snap.thread_id
        revision = str(token.snapshot_revision)
        parts: list[str] = ["<h2>Actions</h2>"]
        if snap.status in _RESUMABLE:
            parts.append(
                "<p>"
                + self.form(
                    "resume",
                    {"thread": thread, "revision": revision},
                    "<label>state overlay (JSON)<br>"
                    "<textarea name='overlay' id='overlay'>{}</textarea></label><br>",
                    "Resume",
                )
                + "</p>"
            )
        if snap.handoff_status in _STUCK:
            parts.append(
                "<p>"
                + self.form("recover", {"thread": thread, "back": "thread"}, "", "Recover hand-off")
                + "</p>"
            )
        if snap.status not in (RunStatus.COMPLETED, RunStatus.FAILED):
            for action, label, what in (
                ("cancel", "Cancel", "cancel it: it stops and stays canceled until resumed"),
                ("terminate", "Terminate", "fail it now and take its run's lease"),
            ):
                if action == "cancel" and is_canceled_from_outside(snap.status, snap.reason):
                    continue
                parts.append(
                    "<p>"
                    + self.form(
                        action,
                        {"thread": thread},
                        f"<label>reason <input name='reason' id='{action}-reason'></label> "
                        f"<label><input type='checkbox' name='confirm' value='yes' "
                        f"id='{action}-confirm' required> yes, {e(what)}</label> ",
                        label,
                    )
                    + "</p>"
                )
        parts.append(
            "<p>"
            + self.form(
                "fork",
                {"thread": thread},
                f"<label>revision <input name='revision' value='{e(revision)}' size='6'></label> "
                "<label>new thread id <input name='new_thread'></label> ",
                "Fork",
            )
            + "</p>"
        )
        return "".join(parts)

    async def dead_letters(self, request: Request) -> str:
        letters = [dead_letter_json(d) for d in await self.backend.consumer.dead_letters(1000)]
        stuck, _ = await list_threads(self.backend.checkpointer, limit=_LIMIT, statuses=_STUCK)
        now = time.time()
        body = [
            "<h2>Dead letters</h2>",
            table(
                ["message", "thread", "revision", "attempts", "error", ""],
                (
                    [
                        e(d["message_id"]),
                        (
                            f"<a href='{thread_href(d['thread_id'])}'>{e(d['thread_id'])}</a>"
                            if d["thread_id"] is not None
                            else "<em>(undecodable)</em>"
                        ),
                        e(d["revision"] if d["revision"] is not None else "-"),
                        e(d["attempts"]),
                        e(one_line(d["error"])[:300]),
                        self.form("requeue", {"message": d["message_id"]}, "", "Requeue"),
                    ]
                    for d in letters
                ),
                "no dead letters",
            ),
            "<h2>Stuck hand-offs (pending or orphaned)</h2>",
            table(
                ["thread", "hand-off", "pointer", "revision", "pending since", ""],
                (
                    [
                        f"<a href='{thread_href(s.thread_id)}'>{e(s.thread_id)}</a>",
                        e(s.handoff_status.value),
                        e(s.execution_pointer),
                        e(s.revision),
                        e(age(s.handoff_pending_at, now)),
                        self.form(
                            "recover",
                            {"thread": s.thread_id, "back": "dead-letters"},
                            "",
                            "Recover",
                        ),
                    ]
                    for s in stuck
                ),
                "no stuck hand-offs",
            ),
        ]
        return self.page("Dead letters and stuck hand-offs", "".join(body), request)

    # -- actions: each returns (where to go back to, the outcome message)

    async def act(self, name: str, form: Mapping[str, str]) -> tuple[str, str]:
        thread = form.get("thread", "")
        if name == "resume":
            revision = _whole(form.get("revision", ""), "revision")
            try:
                overlay = parse_overlay(form.get("overlay", "").strip() or "null", self.codec)
            except CliError as exc:
                raise ValueError(str(exc).replace("--overlay", "the overlay")) from None
            result = await self.runner.resume(ResumeToken(thread, revision), state_overlay=overlay)
            return thread_path(thread), (
                f"resumed {thread}: {result.status.value} ({result.reason}) at "
                f"{result.execution_pointer}, revision {result.revision}"
            )
        if name == "recover":
            res = await self.runner.recover_stale_handoff(thread)
            back = "/dead-letters" if form.get("back") == "dead-letters" else None
            return back or thread_path(thread), (
                f"re-enqueued the hand-off of {thread} at revision {res.snapshot_revision}"
            )
        if name == "fork":
            revision = _whole(form.get("revision", ""), "revision")
            new = form.get("new_thread", "").strip()
            if not new:
                raise ValueError("give the new thread's id")
            token = await self.runner.fork(thread, at_revision=revision, new_thread_id=new)
            return thread_path(new), (
                f"forked {thread}@{revision} into {new} (resume token {token.thread_id}@"
                f"{token.snapshot_revision})"
            )
        if name in ("cancel", "terminate"):
            if form.get("confirm") != "yes":
                raise ValueError(f"tick the box to confirm the {name}; nothing was done")
            act = self.runner.cancel if name == "cancel" else self.runner.terminate
            outcome = await act(thread, reason=form.get("reason", "").strip() or None)
            done = "canceled" if name == "cancel" else "terminated"
            if not outcome.changed:
                return thread_path(thread), f"{thread} was {done} already"
            return thread_path(thread), (
                f"{done} {thread} at revision {outcome.revision} (was "
                f"{outcome.previous_status.value}): {outcome.reason}"
            )
        if name == "requeue":
            message = form.get("message", "")
            await self.backend.consumer.retry_dead_letter(message)
            return "/dead-letters", f"requeued dead letter {message}"
        raise ValueError(f"no action {name!r}")


def _whole(text: str, what: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(f"the {what} must be a whole number, got {text[:40]!r}") from None
    if not 1 <= value <= 2**63 - 1:
        raise ValueError(f"the {what} is out of range: {value}")
    return value
