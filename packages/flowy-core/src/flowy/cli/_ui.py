r"""``flowy ui``: a small local web inspector of a store's threads.

Server-rendered HTML on Starlette, served by uvicorn (one small script, ``/live.js``,
refreshes a page's content in place: a thread page's as soon as the store's watch says
a revision was saved, through a stream of server-sent events at ``/events/THREAD``, and
periodically only while that stream is not connected; the other pages periodically;
with JavaScript off a page reloads itself): the
optional ``ui`` extra (``pip install "flowy-core[ui]"``). Both are imported only when the command
runs or :func:`build_app` is called, so the core still needs the standard library alone.

Safety: it binds to 127.0.0.1 by default; a request whose ``Host`` is not the bound
address or ``localhost`` (with the port) is refused (400), against DNS rebinding; every
request needs the random token printed at start (as ``?token=`` once, then an HttpOnly
SameSite=Strict cookie named after the port, so two inspectors never share one); every
action (a POST) also needs the per-process CSRF value of its form. Everything a store
holds is escaped with ``html.escape``, control and bidi characters as ``\uXXXX``.
Actions go through the same public API as the other commands (``Runner.resume``,
``recover_stale_handoff``, ``Runner.signal``, ``fork`` at a chosen revision,
``Runner.cancel`` and ``Runner.terminate`` (each confirmed by a ticked box), the
consumer's ``retry_dead_letter``, also for every or every checked dead letter, confirmed
by a ticked box, through the paging of ``flowy dead-letters --requeue``). A page or
action that fails (a missing thread, an undecodable record, an unreachable store) shows
one line on the page with a 4xx/5xx status; the traceback goes to the ``flowy.cli.ui``
logger at debug level, never to the terminal.

This module serves the app (host check, token, CSRF, routes) and runs the command; the
pages and actions are in :mod:`._ui_pages`, their HTML building blocks in
:mod:`._ui_html`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import ipaddress
import logging
import secrets
import signal
import socket
import urllib.parse
from collections.abc import Awaitable, Callable, Generator
from typing import TYPE_CHECKING, Any, cast

from .._errors import InvalidThreadIdError, StorageUnavailableError, ThreadNotFoundError
from .._graph import Graph
from ..storage import (
    Backend,
)
from ..storage._watch import TERMINAL_STATUSES
from ._options import CliError, load_graph, one_line
from ._render import Console
from ._store import codec_for, locate, open_store
from ._ui_fleet import BadQueryError
from ._ui_html import LIVE_JS, e, thread_path
from ._ui_html import in_seconds as _in  # noqa: F401  # pyright: ignore[reportUnusedImport]
from ._ui_html import when as _when  # noqa: F401  # pyright: ignore[reportUnusedImport]
from ._ui_pages import Inspector

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

_MISSING = 'flowy ui needs Starlette and uvicorn: pip install "flowy-core[ui]"'

_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
    "script-src 'self'; connect-src 'self'; img-src 'self'; "
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


def _same(given: str | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def _revision(text: str) -> int:
    """A stream's ``after`` (or ``Last-Event-ID``): a revision, a whole number."""
    if not text.isdecimal() or len(text) > 18:
        raise ValueError(f"after must be a revision (a whole number), got {text[:40]!r}")
    return int(text)


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
    backend: Backend[Any],
    graph: Graph[Any, Any],
    *,
    token: str,
    host: str,
    port: int,
    store: str = "",
    refresh: float = 3.0,
) -> Starlette:
    """The inspector's ASGI app over an opened ``backend``, for threads of ``graph``,
    served on ``host``:``port``. The pages name ``store`` (a URL, its password masked)
    and refresh their content in place every ``refresh`` seconds (a thread page only
    while its stream of the store's watch is not connected).

    A request whose ``Host`` header is not ``host`` or ``localhost`` with ``port`` gets
    400. Every request must carry ``token`` (``?token=`` once, which sets an HttpOnly
    SameSite=Strict cookie named :func:`cookie_name` of ``port``, or that cookie); every
    POST also the form's CSRF value. A page that fails shows one line with a 4xx/5xx
    status and logs its traceback at debug level. Needs Starlette (the ``ui`` extra).
    """
    from starlette.applications import Starlette
    from starlette.responses import (
        HTMLResponse,
        PlainTextResponse,
        RedirectResponse,
        Response,
        StreamingResponse,
    )
    from starlette.routing import Route

    if not token:
        raise ValueError("the access token must not be empty")
    if not refresh > 0:
        raise ValueError(f"refresh must be a positive number of seconds, got {refresh!r}")
    ui = Inspector(backend, graph, token, store=store, refresh=refresh)
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
        elif isinstance(exc, BadQueryError):
            title, status = "Bad request", 400
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
        pairs = urllib.parse.parse_qsl(body.decode("utf-8", "replace"))
        form = dict(pairs)
        letters = [v for k, v in pairs if k == "letter"]
        if not _same(form.get("csrf"), ui.csrf):
            return refuse("the form's CSRF token is missing or wrong (reload the page)")
        name = cast(str, request.path_params["name"])
        thread = form.get("thread", "")
        fallback = thread_path(thread) if thread else "/dead-letters"
        task = asyncio.current_task()
        if task is not None:
            ui.acting.add(task)
        try:
            back, message = await ui.act(name, form, letters)
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

    async def live_js(request: Request) -> Response:
        """The script that keeps pages live: the same for everyone, so no token (the
        page it refreshes asks for one)."""
        if (refused := foreign(request)) is not None:
            return refused
        return Response(LIVE_JS, media_type="text/javascript; charset=utf-8", headers=_HEADERS)

    async def events(request: Request) -> Response:
        """The thread's stream of server-sent events (``Inspector.events``): from the
        revision after ``Last-Event-ID`` (a reconnecting browser) or ``?after=``; 204
        once the run has finished and that revision was its last, which stops the
        browser's ``EventSource`` from reconnecting."""
        if (refused := foreign(request)) is not None:
            return refused
        if not _same(request.cookies.get(cookie), token):
            return refuse("open the URL with the token that flowy ui printed")
        thread = cast(str, request.path_params["thread"])
        if not ui.watching:
            return PlainTextResponse(
                "404 this store cannot be watched: the page refreshes itself instead",
                status_code=404,
                headers=_HEADERS,
            )
        last = request.headers.get("last-event-id") or request.query_params.get("after")
        try:
            after = None if last is None else _revision(last)
            snap, revision = await backend.checkpointer.load(thread)
        except (ThreadNotFoundError, InvalidThreadIdError, ValueError) as exc:
            status = 404 if isinstance(exc, (ThreadNotFoundError, InvalidThreadIdError)) else 400
            return PlainTextResponse(
                f"{status} {one_line(str(exc))}"[:500], status_code=status, headers=_HEADERS
            )
        except Exception as exc:
            log.debug("flowy ui: the stream of %r failed", thread, exc_info=exc)
            return PlainTextResponse("503 the store is unavailable", status_code=503)
        if snap.status in TERMINAL_STATUSES and after is not None and after >= revision:
            return Response(status_code=204, headers=_HEADERS)
        headers = {**_HEADERS, "X-Accel-Buffering": "no"}
        return StreamingResponse(
            ui.events(thread, after), media_type="text/event-stream", headers=headers
        )

    routes = [
        Route("/live.js", live_js, methods=["GET"]),
        Route("/events/{thread:path}", events, methods=["GET"]),
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
            app = build_app(backend, graph, token=token, host=host, port=bound, store=store.label)
            shown = f"[{host}]" if ":" in host else host
            out.line(f"flowy ui on {store.label}: open http://{shown}:{bound}/?token={token}")
            if not _loopback(host):
                out.line(
                    f"warning: {host} is not a loopback address; anyone who can reach it "
                    "and sees the token can act on the threads"
                )
            out.line("(Ctrl-C stops it)")
            config = uvicorn.Config(app, log_level="warning", lifespan="off")
            inspector = cast(Inspector, app.state.inspector)
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
