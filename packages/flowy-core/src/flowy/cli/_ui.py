r"""``flowy ui``: a small local web inspector of a store's threads.

Server-rendered HTML (no JavaScript) on Starlette, served by uvicorn: the optional
``ui`` extra (``pip install "flowy-core[ui]"``). Both are imported only when the command
runs or :func:`build_app` is called, so the core still needs the standard library alone.

Safety: it binds to 127.0.0.1 by default; a request whose ``Host`` is not the bound
address or ``localhost`` (with the port) is refused (400), against DNS rebinding; every
request needs the random token printed at start (as ``?token=`` once, then an HttpOnly
SameSite=Strict cookie named after the port, so two inspectors never share one); every
action (a POST) also needs the per-process CSRF value of its form. Everything a store
holds is escaped with ``html.escape``, control and bidi characters as ``\uXXXX``.
Actions go through the same public API as the other commands (``Runner.resume``,
``recover_stale_handoff``, ``fork``, the consumer's ``retry_dead_letter``). A page or
action that fails (a missing thread, an undecodable record, an unreachable store) shows
one line on the page with a 4xx/5xx status; the traceback goes to the ``flowy.cli.ui``
logger at debug level, never to the terminal.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import html
import ipaddress
import json
import logging
import secrets
import signal
import socket
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from .._errors import InvalidThreadIdError, StorageUnavailableError, ThreadNotFoundError
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
from ._inspect import dead_letter_json, list_threads, state_diff
from ._options import CliError, load_graph, one_line, parse_overlay
from ._render import Console, compact_json, pretty_json
from ._store import codec_for, dead_letters_by_thread, locate, open_store

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response

__all__ = ["COOKIE", "build_app", "cmd_ui", "cookie_name", "port"]

COOKIE = "flowy_ui_token"
"""The prefix of the cookie that carries the access token (see :func:`cookie_name`)."""

log = logging.getLogger("flowy.cli.ui")

MAX_FORM = 1_000_000
"""The largest action form body accepted, in bytes."""

_LIMIT = 500
_STOP_ACTIONS_TIMEOUT = 15.0  # a cancelled resume's save is bounded at 10 s
_STUCK = frozenset({HandoffStatus.PENDING, HandoffStatus.ORPHANED})
_RESUMABLE = frozenset(
    {RunStatus.SUSPENDED, RunStatus.CANCELED, RunStatus.WAITING, RunStatus.FAILED}
)
_MISSING = 'flowy ui needs Starlette and uvicorn: pip install "flowy-core[ui]"'

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
nav a{margin-right:1em}
table{border-collapse:collapse;margin:.5em 0}
th,td{border:1px solid #ccc;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#f3f3f3}
pre{background:#f7f7f7;border:1px solid #ddd;padding:.5em;overflow:auto;max-height:30em}
.msg{background:#e7f6e7;border:1px solid #7c7;padding:.5em}
.err{background:#fbe9e9;border:1px solid #d77;padding:.5em}
.status{font-weight:bold}
form.inline{display:inline}
textarea{width:30em;height:6em;font-family:monospace}
dt{font-weight:bold;float:left;width:9em;clear:left}
dd{margin-left:10em}
"""

_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def port(text: str) -> int:
    """``--port``: 0 (any free port) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text[:40]!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 0 to 65535, got {value}")
    return value


def cookie_name(port: int) -> str:
    """The token's cookie for an inspector on ``port``: cookies are not scoped to a port,
    so each inspector on one host needs a name of its own."""
    return f"{COOKIE}_{port}"


# ------------------------------------------------------------------------------ html


def e(value: object) -> str:
    r"""``value`` as escaped HTML text; control, format (bidi) and other non-printable
    characters but newlines shown as ``\uXXXX`` escapes, so stored text cannot
    reorder or hide what the page shows."""
    text = str(value)
    if not text.isprintable():
        text = "".join(c if c.isprintable() or c == "\n" else repr(c)[1:-1] for c in text)
    return html.escape(text, quote=True)


def _when(timestamp: float) -> str:
    """``timestamp`` as local time; a time the platform cannot show as a date (past the
    year 9999, or NaN) as its number of seconds."""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))
    except (OverflowError, OSError, ValueError):
        return f"{timestamp:.6g} s since the epoch"


def _in(seconds: float) -> str:
    """``seconds`` from now, for a person."""
    return f"in {seconds:.0f}s" if seconds < 1e12 else f"in {seconds:.3g}s"


def _href(path: str, **params: str) -> str:
    query = urllib.parse.urlencode({k: v for k, v in params.items() if v})
    return e(path + ("?" + query if query else ""))


def _thread_href(thread: str) -> str:
    return _href("/threads/" + urllib.parse.quote(thread, safe=""))


def _age(timestamp: float | None, now: float) -> str:
    if not timestamp:
        return "-"
    return f"{max(now - timestamp, 0.0):.0f}s ago"


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], empty: str) -> str:
    """A table of already-escaped cells."""
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    if not body:
        return f"<p><em>{e(empty)}</em></p>"
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _plain(state: Any) -> Any:
    return json.loads(compact_json(state))


def _ident(name: str) -> str:
    """The Mermaid node id ``Graph.to_mermaid`` gives ``name``."""
    return "n_" + "".join(c if c.isalnum() else "_" for c in name)


def mermaid_marked(graph: Graph[Any, Any], snap: Snapshot[Any]) -> str:
    """``graph.to_mermaid()`` with the node the thread is at (and, inside a subgraph,
    its inner node) in the ``current`` class."""
    text = graph.to_mermaid()
    marked = [_ident(snap.execution_pointer)]
    inner = snap.nested.get("pointer") if snap.nested else None
    if inner is not None:
        marked.append(_ident(snap.execution_pointer) + "__" + _ident(str(inner))[2:])
    lines = ["    classDef current fill:#ffd54f,stroke:#e65100,stroke-width:3px"]
    lines += [f"    class {m} current" for m in marked]
    return text + "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------- app


class _Inspector:
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
            f"<title>{e(title)} - flowy ui</title><style>{_CSS}</style></head><body>"
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
        table = _table(
            ["thread", "status", "reason", "pointer", "revision", "hand-off", "updated"],
            (
                [
                    f"<a href='{_thread_href(s.thread_id)}'>{e(s.thread_id)}</a>",
                    f"<span class='status'>{e(s.status.value)}</span>",
                    e(s.reason),
                    e(s.execution_pointer),
                    e(s.revision),
                    e(s.handoff_status.value)
                    + (" <strong>(dead letter)</strong>" if s.thread_id in dead else ""),
                    e(_age(s.updated_at, now)),
                ]
                for s in shown
            ),
            "no threads" + (" match" if status or node else ""),
        )
        note = f"<p><em>only the first {_LIMIT} threads are listed</em></p>" if more else ""
        return self.page("Threads", filters + table + note, request)

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
            ("updated", e(_age(snap.updated_at, now))),
            ("graph version", e(snap.graph_version or "-")),
        ]
        if snap.parent_thread_id:
            parent = f"{snap.parent_thread_id}@{snap.parent_revision}"
            head.append(
                (
                    "forked from",
                    f"<a href='{_thread_href(snap.parent_thread_id)}'>{e(parent)}</a>",
                )
            )
        if snap.nested:
            where = f"subgraph {snap.nested.get('node', '')} at {snap.nested.get('pointer', '')}"
            head.append(("inside", e(where)))
        if snap.status is RunStatus.WAITING or snap.wake_at is not None or snap.waiting_for:
            wait = f"for signal {snap.waiting_for!r}" if snap.waiting_for else "asleep"
            if snap.wake_at is not None:
                left = snap.wake_at - now
                wait += ", due now" if left <= 0 else f", wakes {_in(left)}"
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
            _table(
                ["revision", "effect"],
                (
                    [e(s.revision), f"<code>{e(compact_json(x))}</code>"]
                    for s in history
                    for x in s.effects
                ),
                "no effects",
            ),
            "<h2>Activity journal</h2>",
            _table(
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
            _table(
                ["wake at", "when"],
                (
                    [
                        e(_when(w)),
                        e("due" if w <= now else _in(w - now)),
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
                diffs = state_diff(_plain(older.state), _plain(newer.state))
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
            + _table(
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
            _table(
                ["message", "thread", "revision", "attempts", "error", ""],
                (
                    [
                        e(d["message_id"]),
                        (
                            f"<a href='{_thread_href(d['thread_id'])}'>{e(d['thread_id'])}</a>"
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
            _table(
                ["thread", "hand-off", "pointer", "revision", "pending since", ""],
                (
                    [
                        f"<a href='{_thread_href(s.thread_id)}'>{e(s.thread_id)}</a>",
                        e(s.handoff_status.value),
                        e(s.execution_pointer),
                        e(s.revision),
                        e(_age(s.handoff_pending_at, now)),
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
            return _thread_href_raw(thread), (
                f"resumed {thread}: {result.status.value} ({result.reason}) at "
                f"{result.execution_pointer}, revision {result.revision}"
            )
        if name == "recover":
            res = await self.runner.recover_stale_handoff(thread)
            back = "/dead-letters" if form.get("back") == "dead-letters" else None
            return back or _thread_href_raw(thread), (
                f"re-enqueued the hand-off of {thread} at revision {res.snapshot_revision}"
            )
        if name == "fork":
            revision = _whole(form.get("revision", ""), "revision")
            new = form.get("new_thread", "").strip()
            if not new:
                raise ValueError("give the new thread's id")
            token = await self.runner.fork(thread, at_revision=revision, new_thread_id=new)
            return _thread_href_raw(new), (
                f"forked {thread}@{revision} into {new} (resume token {token.thread_id}@"
                f"{token.snapshot_revision})"
            )
        if name == "requeue":
            message = form.get("message", "")
            await self.backend.consumer.retry_dead_letter(message)
            return "/dead-letters", f"requeued dead letter {message}"
        raise ValueError(f"no action {name!r}")


def _thread_href_raw(thread: str) -> str:
    return "/threads/" + urllib.parse.quote(thread, safe="")


def _whole(text: str, what: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(f"the {what} must be a whole number, got {text[:40]!r}") from None
    if not 1 <= value <= 2**63 - 1:
        raise ValueError(f"the {what} is out of range: {value}")
    return value


def _same(given: str | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def _hosts(host: str, port: int) -> Callable[[str], bool]:
    """Whether a request's ``Host`` header names this inspector: the bound address or
    ``localhost``, with ``port`` (any name when bound to every interface)."""
    names = {host.lower(), "localhost"}
    anywhere = host in ("0.0.0.0", "::", "")

    def allowed(header: str) -> bool:
        try:
            parts = urllib.parse.urlsplit("//" + header)
            given = parts.port or 80
            name = (parts.hostname or "").lower()
        except ValueError:
            return False
        return given == port and bool(name) and (anywhere or name in names)

    return allowed


def build_app(
    backend: Backend[Any], graph: Graph[Any, Any], *, token: str, host: str, port: int
) -> Starlette:
    """The inspector's ASGI app over an opened ``backend``, for threads of ``graph``,
    served on ``host``:``port``.

    A request whose ``Host`` header is not ``host`` or ``localhost`` with ``port`` gets
    400. Every request must carry ``token`` (``?token=`` once, which sets an HttpOnly
    SameSite=Strict cookie named :func:`cookie_name` of ``port``, or that cookie); every
    POST also the form's CSRF value. A page that fails shows one line with a 4xx/5xx
    status and logs its traceback at debug level. Needs Starlette (the ``ui`` extra).
    """
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse
    from starlette.routing import Route

    if not token:
        raise ValueError("the access token must not be empty")
    ui = _Inspector(backend, graph, token)
    cookie = cookie_name(port)
    host_allowed = _hosts(host, port)

    def refuse(why: str) -> Response:
        return PlainTextResponse(f"403 forbidden: {why}", status_code=403, headers=_HEADERS)

    def foreign(request: Request) -> Response | None:
        """400 for a request addressed to another host (a DNS-rebinding page)."""
        if host_allowed(request.headers.get("host", "")):
            return None
        return PlainTextResponse(
            f"400 bad request: this inspector answers only at {host}:{port} or localhost:{port}",
            status_code=400,
            headers=_HEADERS,
        )

    def failed(request: Request, exc: Exception) -> Response:
        """The page of a render that raised: one line, never a traceback."""
        if isinstance(exc, (ThreadNotFoundError, InvalidThreadIdError)):
            title, status = "Not found", 404
        elif isinstance(exc, StorageUnavailableError):
            title, status = "Store unavailable", 503
        else:
            title, status = "Cannot show this page", 500
        log.debug("flowy ui: %s %s failed", request.method, request.url.path, exc_info=exc)
        message = f"{type(exc).__name__}: {one_line(str(exc))}"[:1000]
        try:
            text = ui.page(title, f"<p class='err' id='err'>{e(message)}</p>", request)
        except Exception:  # noqa: BLE001 - the page around the message must not fail too
            text = f"<!doctype html><title>{e(title)}</title><p>{e(message)}</p>"
        return HTMLResponse(text, status_code=status, headers=_HEADERS)

    def guarded(
        render: Callable[[Request], Awaitable[str]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            if (refused := foreign(request)) is not None:
                return refused
            query = request.query_params.get("token")
            if _same(query, token):
                # Trade the token in the URL for a cookie, and drop it from the address.
                rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
                url = request.url.path + ("?" + urllib.parse.urlencode(rest) if rest else "")
                response = RedirectResponse(url, status_code=303, headers=_HEADERS)
                response.set_cookie(cookie, token, httponly=True, samesite="strict", path="/")
                return response
            if not _same(request.cookies.get(cookie), token):
                return refuse("open the URL with the token that flowy ui printed")
            try:
                text = await render(request)
            except Exception as exc:  # noqa: BLE001 - every failure is a message on the page
                return failed(request, exc)
            return HTMLResponse(text, headers=_HEADERS)

        return endpoint

    async def thread_page(request: Request) -> str:
        return await ui.thread(request, cast(str, request.path_params["thread"]))

    async def action(request: Request) -> Response:
        if (refused := foreign(request)) is not None:
            return refused
        if not (
            _same(request.cookies.get(cookie), token)
            or _same(request.query_params.get("token"), token)
        ):
            return refuse("open the URL with the token that flowy ui printed")
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_FORM:
                return PlainTextResponse("413 the form is too large", status_code=413)
        form = dict(urllib.parse.parse_qsl(body.decode("utf-8", "replace")))
        if not _same(form.get("csrf"), ui.csrf):
            return refuse("the form's CSRF token is missing or wrong (reload the page)")
        name = cast(str, request.path_params["name"])
        thread = form.get("thread", "")
        fallback = _thread_href_raw(thread) if thread else "/dead-letters"
        task = asyncio.current_task()
        if task is not None:
            ui.acting.add(task)
        try:
            back, message = await ui.act(name, form)
            key = "msg"
        except asyncio.CancelledError:
            if not ui.stopping or task is None:
                raise
            task.uncancel()  # stop_actions cancelled it: the run saved where it was
            return PlainTextResponse(
                f"503 the inspector is stopping: {name} was stopped where it was",
                status_code=503,
                headers=_HEADERS,
            )
        except Exception as exc:  # an action's failure is one line on the page
            log.debug("flowy ui: the action %r failed", name, exc_info=exc)
            back, key = fallback, "err"
            message = f"{name} failed: {type(exc).__name__}: {one_line(str(exc))}"
        finally:
            ui.acting.discard(cast("asyncio.Task[Any]", task))
        url = back + "?" + urllib.parse.urlencode({key: message[:500]})
        return RedirectResponse(url, status_code=303, headers=_HEADERS)

    routes = [
        Route("/", guarded(ui.threads), methods=["GET"]),
        Route("/dead-letters", guarded(ui.dead_letters), methods=["GET"]),
        Route("/threads/{thread:path}", guarded(thread_page), methods=["GET"]),
        Route("/actions/{name}", action, methods=["POST"]),
    ]
    app = Starlette(routes=routes)
    app.state.inspector = ui
    return app


# --------------------------------------------------------------------------- command


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def cmd_ui(args: argparse.Namespace, out: Console) -> int:
    """``flowy ui``."""
    try:
        import starlette  # noqa: F401  # pyright: ignore[reportUnusedImport]
        import uvicorn
    except ImportError:
        raise CliError(_MISSING, 2) from None
    store = locate(args.backend, args.db)
    graph = load_graph(args.graph)
    host = cast(str, args.host)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, cast(int, args.port)))
    except (OSError, OverflowError) as exc:
        sock.close()
        raise CliError(f"cannot listen on {host}:{args.port}: {exc}", 2) from None
    try:
        async with open_store(store, codec_for(args.codec, graph)) as backend:
            token = secrets.token_urlsafe(32)
            bound = sock.getsockname()[1]
            app = build_app(backend, graph, token=token, host=host, port=bound)
            shown = f"[{host}]" if ":" in host else host
            out.line(f"flowy ui on {store.label}: open http://{shown}:{bound}/?token={token}")
            if not _loopback(host):
                out.line(
                    f"warning: {host} is not a loopback address; anyone who can reach it "
                    "and sees the token can act on the threads"
                )
            out.line("(Ctrl-C stops it)")
            config = uvicorn.Config(app, log_level="warning", lifespan="off")
            inspector = cast(_Inspector, app.state.inspector)
            stopped = await _serve_until_signal(
                uvicorn.Server, config, sock, inspector.stop_actions
            )
            # Before the store closes: an action still running (a resume) saves its
            # cancel snapshot and lets go of its lease.
            await inspector.stop_actions()
    finally:
        sock.close()
    if stopped:
        raise CliError("interrupted", 130)
    return 0


async def _serve_until_signal(
    server_type: Any,
    config: Any,
    sock: socket.socket,
    on_stop: Callable[[], Awaitable[None]],
) -> bool:
    """Serve until SIGINT or SIGTERM, which also starts ``on_stop()`` (a second one
    stops waiting for the requests in flight); whether a signal stopped it. The server's
    own signal handling is off: it would raise the signal again once it stopped,
    cancelling what comes after."""

    class Server(server_type):
        @contextlib.contextmanager
        def capture_signals(self) -> Generator[None]:
            yield

    server = Server(config)
    loop = asyncio.get_running_loop()
    signals = 0

    stops: list[asyncio.Future[None]] = []

    def stopping() -> None:
        nonlocal signals
        signals += 1
        server.should_exit = True
        if signals == 1:
            stops.append(asyncio.ensure_future(on_stop()))
        else:
            server.force_exit = True

    installed: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stopping)
            installed.append(sig)
    try:
        await server.serve(sockets=[sock])
        if stops:
            await stops[0]
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
    return signals > 0
