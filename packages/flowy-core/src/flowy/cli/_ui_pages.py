"""The inspector's pages and actions (``flowy ui``): one :class:`Inspector` per app,
over one opened backend and one graph. Pages are server-rendered HTML built from
:mod:`._ui_html`; actions go through the same public API as the other commands
(``Runner.resume``, ``recover_stale_handoff``, ``Runner.signal``, ``fork``,
``Runner.cancel``, ``Runner.terminate``, the consumer's ``retry_dead_letter``, one
letter at a time or in bulk through :func:`._bulk.requeue_pages`). A thread page
follows its thread through ``Backend.watch`` (:meth:`Inspector.events`, a stream of
server-sent events). Serving, the token, the CSRF check and the command are in
:mod:`._ui`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
import urllib.parse
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .._cancel import is_canceled_from_outside
from .._errors import ThreadNotFoundError
from .._graph import Graph
from .._runner import DEFAULT_LEASE_TTL, Runner, default_owner
from .._types import JSON
from .._version import __version__
from ..queues import queues_of
from ..storage import (
    Backend,
    HandoffStatus,
    OutboxStats,
    ResumeToken,
    RunStatus,
    Snapshot,
    redact_url,
)
from ..storage._watch import WatchEvent
from ..storage.dialect import BaseCheckpointer, BaseConsumer
from ._bulk import SCAN as LETTERS
from ._bulk import Requeued, requeue_pages
from ._inspect import dead_letter_json, journal_and_inbox, list_threads
from ._options import CliError, one_line, parse_json, parse_overlay
from ._render import pretty_json
from ._store import codec_for, dead_letters_by_thread
from ._ui_fleet import (
    SCAN,
    backlog,
    counts,
    filter_form,
    listing,
    parse_filters,
    recent_page,
    with_queue,
)
from ._ui_html import (
    CSS,
    drawn_graph,
    e,
    relative,
    table,
    thread_href,
    thread_path,
)
from ._ui_thread import facts, head_json, journal, signals, timeline, timers

if TYPE_CHECKING:
    from starlette.requests import Request

__all__ = ["Inspector"]

log = logging.getLogger("flowy.cli.ui")

_LIMIT = 500
_LETTERS_SHOWN = 1000  # dead letters the page lists
_HISTORY = 200  # revisions the timeline shows
_LINEAGE = 20  # forks the lineage follows back
_STOP_ACTIONS_TIMEOUT = 15.0  # a cancelled resume's save is bounded at 10 s
_WATCH_POLL = 0.5  # seconds between a thread stream's reads of the head
_KEEPALIVE = 15.0  # seconds of quiet after which a thread stream sends a comment
_STUCK = frozenset({HandoffStatus.PENDING, HandoffStatus.ORPHANED})
_RESUMABLE = frozenset(
    {RunStatus.SUSPENDED, RunStatus.CANCELED, RunStatus.WAITING, RunStatus.FAILED}
)


class Inspector:
    """The pages and actions of one app (one backend, one graph)."""

    def __init__(
        self,
        backend: Backend[Any],
        graph: Graph[Any, Any],
        token: str,
        *,
        store: str = "",
        refresh: float = 3.0,
    ) -> None:
        self.backend = backend
        self.graph = graph
        self.token = token
        self.store = redact_url(store) if store else type(backend).__name__
        self.refresh = refresh
        self.csrf = secrets.token_urlsafe(32)
        self.codec = codec_for(None, graph)
        self.runner: Runner[Any, Any] = Runner(
            graph, backend, run_lease=(default_owner(), DEFAULT_LEASE_TTL)
        )
        self.acting: set[asyncio.Task[Any]] = set()  # the requests running an action
        self.stopping = False
        self.watching = callable(getattr(backend, "watch", None))
        """Whether thread pages follow their thread through the store's watch (every
        ``Backend`` has one; a store object without it keeps the periodic refresh)."""
        self.streams = 0  # the thread streams opened so far
        self._closing = asyncio.Event()

    async def stop_actions(self) -> None:
        """End the thread streams, then cancel the actions in flight and wait for them:
        a resume saves its cancel snapshot and lets go of its lease while the store is
        still open, and its request is answered with 503."""
        self.stopping = True
        self._closing.set()
        tasks = {t for t in self.acting if not t.done()}
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=_STOP_ACTIONS_TIMEOUT)

    # -- layout

    def page(self, title: str, body: str, request: Request, events: str = "") -> str:
        """A whole HTML page around ``body`` (escaped already), with the flash message:
        a header naming the store and the flowy version, and ``body`` in the part that
        refreshes in place (``/live.js``; a plain refresh with JavaScript off), also as
        soon as the stream at ``events`` (server-sent events) says a revision was
        saved."""
        flash = ""
        if msg := request.query_params.get("msg"):
            flash += f'<p class="msg" id="msg">{e(one_line(msg)[:500])}</p>'
        if err := request.query_params.get("err"):
            flash += f'<p class="err" id="err">{e(one_line(err)[:500])}</p>'
        every = f"{self.refresh:g}"
        quiet = max(self.refresh * 3, 10.0)
        return (
            "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width,initial-scale=1'>"
            f"<noscript><meta http-equiv='refresh' content='{quiet:.0f}'></noscript>"
            f"<title>{e(title)} - flowy ui</title><style>{CSS}</style>"
            "<script src='/live.js' defer></script></head>"
            f"<body data-refresh='{e(every)}'"
            + (f" data-events='{e(events)}'" if events else "")
            + "><header><span class='brand'>flowy ui</span>"
            "<nav><a href='/'>Threads</a><a href='/dead-letters'>Dead letters</a></nav>"
            f"<span class='store' id='store' title='the store'>{e(self.store)}</span>"
            f"<span class='muted' id='version'>flowy {e(__version__)}</span>"
            f"<span class='live' id='updated'>live: every {e(every)} s"
            f"<noscript> (JavaScript off: the page reloads every {quiet:.0f} s)</noscript>"
            f"</span></header><main><h1>{e(title)}</h1>{flash}"
            f"<div id='live'>{body}</div></main></body></html>"
        )

    def form(
        self, action: str, fields: Mapping[str, str], inner: str, label: str, ident: str = ""
    ) -> str:
        hidden = "".join(
            f"<input type='hidden' name='{e(k)}' value='{e(v)}'>"
            for k, v in {**fields, "csrf": self.csrf}.items()
        )
        at = f" id='{e(ident)}'" if ident else ""
        return (
            f"<form method='post' action='/actions/{e(action)}' class='inline'{at}>{hidden}"
            f"{inner}<button type='submit' name='do' value='{e(action)}'>{e(label)}</button>"
            "</form>"
        )

    # -- pages

    async def threads(self, request: Request) -> str:
        queues = queues_of(self.backend) if self.backend.capabilities.queues else None
        filters = await with_queue(parse_filters(request.query_params), queues)
        names = None if queues is None else [q.queue for q in await queues.list()]
        cp = self.backend.checkpointer
        rows, truncated = await list_threads(cp, limit=SCAN)
        dead = await dead_letters_by_thread(self.backend.consumer) if rows else {}
        stats, oldest = await self._backlog()
        now = time.time()
        shown, following = await recent_page(cp, filters, now)
        body = [
            backlog(stats, oldest, now),
            counts(rows, filters),
            "<h2>Threads, most recently saved first</h2>",
            filter_form(rows, filters, names),
            listing(rows, shown, following, filters, dead, now, truncated),
        ]
        return self.page("Threads", "".join(body), request)

    async def _backlog(self) -> tuple[OutboxStats | None, dict[RunStatus, float]]:
        """The outbox's backlog and the oldest parked heads, for stores with them."""
        stats: OutboxStats | None = None
        oldest: dict[RunStatus, float] = {}
        consumer, cp = self.backend.consumer, self.backend.checkpointer
        if isinstance(consumer, BaseConsumer):
            stats = await consumer.stats()
        if isinstance(cp, BaseCheckpointer):
            parked = (RunStatus.SUSPENDED, RunStatus.WAITING)
            oldest = await cp.oldest_heads(parked)
        return stats, oldest

    async def thread(self, request: Request, thread: str) -> str:
        snap, token = await self.runner.head(thread)
        cp = self.backend.checkpointer
        history = sorted(await cp.get_history(thread, _HISTORY), key=lambda s: s.revision)
        records, pending = await journal_and_inbox(self.backend, snap)
        lineage = await self._lineage(snap)
        now = time.time()
        revision = token.snapshot_revision
        chosen = request.query_params.get("fork", "")
        sections = [
            "<div class='grid'><div>",
            facts(snap, revision, self.graph, lineage, now),
            "</div><div>",
            self._actions(snap, token, history, chosen),
            "</div></div>",
            "<div class='grid'><div><h2>Graph</h2>",
            f"<div id='graph' class='graph'>{drawn_graph(self.graph, snap, history)}</div>",
            "</div><div><h2>State</h2>",
            f"<pre id='state'>{e(pretty_json(snap.state))}</pre>",
            head_json(snap, revision),
            "</div></div>",
            "<h2>Timeline</h2>",
            timeline(history, now),
            (
                f"<p class='muted'><em>the latest {_HISTORY} revisions (the visit counts "
                "count these)</em></p>"
                if len(history) >= _HISTORY
                else ""
            ),
            "<h2>Activity journal</h2>",
            journal(records, now),
            "<div class='grid'><div><h2>Timers</h2>",
            timers(snap, records, now),
            "</div><div><h2>Pending signals</h2>",
            signals(pending, now),
            "</div></div>",
        ]
        events = ""
        if self.watching:
            after = urllib.parse.urlencode({"after": revision})
            events = "/events/" + urllib.parse.quote(thread, safe="") + "?" + after
        return self.page(f"Thread {thread}", "".join(sections), request, events)

    async def events(self, thread: str, after: int | None) -> AsyncIterator[str]:
        """The thread's stream of server-sent events, from ``Backend.watch``: each
        snapshot saved after revision ``after`` (``event: snapshot``, its revision as the
        id, so a browser that reconnects goes on from there), each progress event
        (``event: progress``), a comment after a quiet while, and ``event: end`` once
        the run completed or failed. It ends when the inspector stops."""
        self.streams += 1
        watch = self.backend.watch(thread, after=after, poll=_WATCH_POLL)

        async def following() -> WatchEvent[Any]:
            return await anext(watch)

        closing = asyncio.ensure_future(self._closing.wait())
        step: asyncio.Future[WatchEvent[Any]] | None = None
        try:
            yield "retry: 3000\n\n"
            while not self._closing.is_set():
                if step is None:
                    step = asyncio.ensure_future(following())
                done, _ = await asyncio.wait(
                    {step, closing}, timeout=_KEEPALIVE, return_when=asyncio.FIRST_COMPLETED
                )
                if step not in done:
                    if closing not in done:
                        yield ": watching\n\n"
                    continue
                try:
                    event = step.result()
                except StopAsyncIteration:
                    yield "event: end\ndata: {}\n\n"
                    return
                except Exception as exc:
                    log.debug("flowy ui: watching %r failed", thread, exc_info=exc)
                    return
                step = None
                yield _sse(event)
        finally:
            closing.cancel()
            if step is not None:
                step.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await step
            close = getattr(watch, "aclose", None)  # an async generator's
            if close is not None:
                with contextlib.suppress(Exception):
                    await close()

    async def _lineage(self, snap: Snapshot[Any]) -> list[tuple[str, int]]:
        """The forks ``snap``'s thread came from, nearest first (a deleted parent ends
        the chain)."""
        chain: list[tuple[str, int]] = []
        seen = {snap.thread_id}
        parent, at = snap.parent_thread_id, snap.parent_revision
        while parent and parent not in seen and len(chain) < _LINEAGE:
            chain.append((parent, at or 0))
            seen.add(parent)
            try:
                up, _ = await self.backend.checkpointer.load(parent)
            except ThreadNotFoundError:
                break
            parent, at = up.parent_thread_id, up.parent_revision
        return chain

    def _actions(
        self,
        snap: Snapshot[Any],
        token: ResumeToken,
        history: Sequence[Snapshot[Any]],
        chosen: str,
    ) -> str:
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
            waiting = snap.waiting_for or ""
            parts.append(
                "<p>"
                + self.form(
                    "signal",
                    {"thread": thread},
                    f"<label>signal <input name='signal' id='signal-name' value='{e(waiting)}' "
                    "required size='16'></label> "
                    "<label>payload (JSON, optional)<br>"
                    "<textarea name='payload' id='signal-payload'></textarea></label><br>",
                    "Send signal",
                    "signal",
                )
                + "</p>"
            )
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
        revisions = sorted({s.revision for s in history} | {token.snapshot_revision}, reverse=True)
        at = chosen if chosen in {str(r) for r in revisions} else revision
        nodes = {s.revision: s.execution_pointer for s in history}
        options = "".join(
            f"<option value='{r}'{' selected' if str(r) == at else ''}>"
            f"{r}{e(' · ' + nodes[r]) if r in nodes else ''}</option>"
            for r in revisions
        )
        parts.append(
            "<p>"
            + self.form(
                "fork",
                {"thread": thread},
                f"<label>at revision <select name='revision' id='fork-revision'>{options}"
                "</select></label> "
                "<label>new thread id <input name='new_thread' id='fork-new' required></label> ",
                "Fork",
                "fork",
            )
            + "</p>"
        )
        return "".join(parts)

    async def dead_letters(self, request: Request) -> str:
        letters = [
            dead_letter_json(d) for d in await self.backend.consumer.dead_letters(_LETTERS_SHOWN)
        ]
        stuck, _ = await list_threads(self.backend.checkpointer, limit=_LIMIT, statuses=_STUCK)
        now = time.time()
        bulk = ""
        if letters:
            bulk = (
                "<form method='post' action='/actions/requeue-many' id='requeue-many' "
                "class='bulk'>"
                f"<input type='hidden' name='csrf' value='{e(self.csrf)}'>"
                "<label><input type='checkbox' name='confirm' value='yes' "
                "id='requeue-confirm' required> yes, requeue them: each is delivered to a "
                "worker again</label>"
                "<button type='submit' name='which' value='checked' id='requeue-checked'>"
                "Requeue checked</button>"
                "<button type='submit' name='which' value='all' id='requeue-all'>"
                f"Requeue all ({len(letters)}{'+' if len(letters) >= _LETTERS_SHOWN else ''})"
                "</button></form>"
            )
        body = [
            "<h2>Dead letters</h2>",
            table(
                ["", "message", "thread", "revision", "attempts", "error", ""],
                (
                    [
                        f"<input type='checkbox' name='letter' value='{e(d['message_id'])}' "
                        f"form='requeue-many' title='requeue it with the others checked' "
                        f"aria-label='choose {e(d['message_id'])}'>",
                        e(d["message_id"]),
                        (
                            f"<a href='{thread_href(d['thread_id'])}'>{e(d['thread_id'])}</a>"
                            if d["thread_id"] is not None
                            else "<em>(undecodable)</em>"
                        ),
                        e(d["revision"] if d["revision"] is not None else "-"),
                        e(d["attempts"]),
                        _error(d["error"], f"error-{d['message_id']}"),
                        self.form("requeue", {"message": d["message_id"]}, "", "Requeue"),
                    ]
                    for d in letters
                ),
                "no dead letters",
                ident="letters",
            ),
            bulk,
            "<h2>Stuck hand-offs (pending or orphaned)</h2>",
            table(
                ["thread", "hand-off", "pointer", "revision", "pending since", ""],
                (
                    [
                        f"<a href='{thread_href(s.thread_id)}'>{e(s.thread_id)}</a>",
                        e(s.handoff_status.value),
                        e(s.execution_pointer),
                        e(s.revision),
                        relative(s.handoff_pending_at, now),
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

    async def act(
        self, name: str, form: Mapping[str, str], letters: Sequence[str] = ()
    ) -> tuple[str, str]:
        """Do the action ``name`` with the values of its ``form`` (``letters``: the
        dead letters checked, for ``requeue-many``); where to go back to and what
        happened, in one line. A refusal raises."""
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
        if name == "signal":
            return thread_path(thread), await self._signal(thread, form)
        if name == "requeue":
            message = form.get("message", "")
            await self.backend.consumer.retry_dead_letter(message)
            return "/dead-letters", f"requeued dead letter {message}"
        if name == "requeue-many":
            return "/dead-letters", await self._requeue_many(form, letters)
        raise ValueError(f"no action {name!r}")

    async def _signal(self, thread: str, form: Mapping[str, str]) -> str:
        name = form.get("signal", "").strip()
        if not name:
            raise ValueError("give the signal's name")
        text = form.get("payload", "").strip()
        payload: JSON = None
        if text:
            try:
                payload = parse_json(text, "the payload")
            except CliError as exc:
                raise ValueError(str(exc)) from None
        stored = await self.runner.signal(thread, name, payload)
        head, revision = await self.backend.checkpointer.load(thread)
        if head.status is RunStatus.WAITING and head.waiting_for == stored.name:
            after = (
                f"the thread waits for it at revision {revision}: a worker resumes it, "
                "and its new revision shows here"
            )
        else:
            after = "kept until the thread waits for it"
        return (
            f"signal {stored.name!r} #{stored.seq} (id {stored.signal_id}) sent to {thread}; "
            + after
        )

    async def _requeue_many(self, form: Mapping[str, str], letters: Sequence[str]) -> str:
        """Requeue every dead letter (``which=all``) or those checked, confirmed by the
        ticked box: how many were, and which were not and why."""
        which = form.get("which", "")
        if form.get("confirm") != "yes":
            raise ValueError("tick the box to confirm the requeue; nothing was done")
        wanted = set(letters)
        if which == "checked" and not wanted:
            raise ValueError("check the dead letters to requeue (or requeue all); nothing was done")
        if which not in ("all", "checked"):
            raise ValueError(f"requeue 'all' or 'checked', got {which[:40]!r}")
        done: list[Requeued] = []
        async for page in requeue_pages(
            self.backend.consumer,
            lambda d: which == "all" or d.message_id in wanted,
            limit=LETTERS,
            page_size=100,
        ):
            done += page.done
        requeued = [r.letter for r in done if r.outcome == "requeued"]
        missed = [
            (r.letter.message_id, r.error or "no longer a dead letter")
            for r in done
            if r.outcome != "requeued"
        ]
        seen = {r.letter.message_id for r in done}
        missed += [(m, "no longer a dead letter") for m in sorted(wanted - seen)]
        total = len(requeued) + len(missed)
        text = f"requeued {len(requeued)} of {total} dead letter(s)"
        if requeued:
            text += f" ({_ids([d.message_id for d in requeued])})"
        if missed:
            shown = ", ".join(f"id {m} ({why})" for m, why in missed[:5])
            text += f"; not requeued: {shown}" + (", …" if len(missed) > 5 else "")
        return text


def _ids(ids: Sequence[str]) -> str:
    """``id 7`` or ``ids 7, 9, …``: the first few of ``ids``."""
    if len(ids) == 1:
        return f"id {ids[0]}"
    return "ids " + ", ".join(ids[:5]) + (", …" if len(ids) > 5 else "")


def _sse(event: WatchEvent[Any]) -> str:
    """One server-sent event of a watched thread."""
    snap = event.snapshot
    if snap is None:
        data = {"revision": event.revision, "node": event.node, "data": event.data}
        return f"event: progress\ndata: {json.dumps(data, default=str)}\n\n"
    data = {
        "revision": event.revision,
        "status": snap.status.value,
        "reason": snap.reason,
        "node": snap.execution_pointer,
    }
    return f"id: {event.revision}\nevent: snapshot\ndata: {json.dumps(data)}\n\n"


def _error(text: str, ident: str) -> str:
    """An error: its first line, and the whole of it (a traceback) behind a toggle
    (``ident`` keeps it open across live refreshes)."""
    first = one_line(text)[:300]
    if "\n" not in text.strip():
        return f"<span class='err-text'>{e(first)}</span>"
    return (
        f"<details id='{e(ident)}'><summary>{e(first)}</summary>"
        f"<pre class='traceback'>{e(text)}</pre></details>"
    )


def _whole(text: str, what: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(f"the {what} must be a whole number, got {text[:40]!r}") from None
    if not 1 <= value <= 2**63 - 1:
        raise ValueError(f"the {what} is out of range: {value}")
    return value
