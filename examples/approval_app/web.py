"""The web app: start a request, show what it waits for, approve it, follow it live.

Serve it with any ASGI server, e.g. ``uvicorn examples.approval_app.web:app``.
"""

import contextlib
import json
import secrets
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import asdict
from typing import Any, cast

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

import flowy

from .graph import THRESHOLD, Expense, graph, store_url

ExpenseRunner = flowy.Runner[Expense, flowy.NoEffect]


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncGenerator[None]:
    # One store for the app's lifetime: opened at startup, closed at shutdown.
    async with flowy.connect(app.state.backend_url) as backend:
        app.state.backend = backend
        app.state.runner = flowy.Runner(graph, backend)
        yield


def runner_of(request: Request) -> ExpenseRunner:
    runner: ExpenseRunner = request.app.state.runner
    return runner


class Refused(Exception):
    """An error answer: its HTTP status and its JSON body."""

    def __init__(self, code: int, error: str, **details: object) -> None:
        super().__init__(error)
        self.code = code
        self.body = {"error": error, **details}


async def refused(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, Refused)
    return JSONResponse(exc.body, status_code=exc.code)


async def json_body(request: Request) -> dict[str, Any]:
    try:
        body: object = await request.json()
    except ValueError:
        raise Refused(400, "the body must be JSON") from None
    if not isinstance(body, dict):
        raise Refused(400, "the body must be a JSON object")
    return cast(dict[str, Any], body)  # the keys of a JSON object are strings


def text(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value.strip():
        raise Refused(400, f"{name!r} must be a non-empty string, got {value!r}")
    return value


def whole_number(body: dict[str, Any], name: str) -> int:
    value = body.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise Refused(400, f"{name!r} must be a positive integer, got {value!r}")
    return value


def yes_or_no(body: dict[str, Any], name: str) -> bool:
    value = body.get(name)
    if not isinstance(value, bool):
        raise Refused(400, f"{name!r} must be true or false, got {value!r}")
    return value


def waiting_for(status: flowy.RunStatus) -> str | None:
    if status is flowy.RunStatus.SUSPENDED:
        return "approval"  # the graph's one suspend: review, over THRESHOLD
    if status is flowy.RunStatus.HANDOFF:
        return "worker"  # in the outbox, or being paid
    return None


def outcome(result: flowy.RunResult[Expense, flowy.NoEffect]) -> dict[str, object]:
    token = result.resume_token
    return {
        "thread_id": result.thread_id,
        "status": result.status.value,
        "reason": result.reason,
        "waiting_for": waiting_for(result.status),
        "resume_token": None if token is None else str(token),  # "req-…@2"
    }


async def create_request(request: Request) -> JSONResponse:
    body = await json_body(request)
    expense = Expense(text(body, "who"), whole_number(body, "amount"), text(body, "reason"))
    thread_id = f"req-{secrets.token_hex(6)}"
    result = await runner_of(request).start(thread_id, expense)
    headers = {"Location": f"/requests/{thread_id}"}
    return JSONResponse(outcome(result), status_code=201, headers=headers)


async def show_request(request: Request) -> JSONResponse:
    thread_id: str = request.path_params["thread_id"]
    try:
        head, token = await runner_of(request).head(thread_id)  # the latest snapshot
    except (flowy.ThreadNotFoundError, flowy.InvalidResumeTokenError):
        raise Refused(404, f"no request {thread_id!r}") from None
    return JSONResponse(
        {
            "thread_id": thread_id,
            "status": head.status.value,
            "reason": head.reason,
            "waiting_for": waiting_for(head.status),
            "resume_token": str(token),
            "threshold": THRESHOLD,
            "expense": asdict(head.state),
        }
    )


def conflict(decision: flowy.ResumeDecision) -> Refused:
    current = decision.resume_token
    status = None if decision.status is None else decision.status.value
    if decision.status is not flowy.RunStatus.SUSPENDED:
        error = f"request {decision.thread_id!r} is not waiting for an approval: it is {status}"
    elif decision.kind is flowy.ResumeDecisionKind.STALE_TOKEN:
        error = f"resume token {decision.requested} is stale: the request is at {current}"
    else:
        error = f"request {decision.thread_id!r} is busy: another approval is running"
    token = None if current is None else str(current)
    return Refused(409, error, status=status, resume_token=token)


async def approve_request(request: Request) -> JSONResponse:
    thread_id: str = request.path_params["thread_id"]
    body = await json_body(request)
    try:
        token = flowy.ResumeToken.parse(text(body, "token"))  # "req-…@2", as printed
    except ValueError as exc:
        raise Refused(400, str(exc)) from None
    if token.thread_id != thread_id:
        raise Refused(400, f"{str(token)!r} is not a resume token of request {thread_id!r}")
    overlay = {"approved": yes_or_no(body, "approved"), "approver": text(body, "approver")}
    runner = runner_of(request)
    # Ask before resuming (this runs nothing): does the token name the latest snapshot,
    # and is that snapshot waiting for an approval? (Not, say, a hand-off to a worker.)
    try:
        decision = await runner.evaluate_resume(token)
    except flowy.InvalidResumeTokenError as exc:
        raise Refused(400, str(exc)) from None
    if decision.kind is flowy.ResumeDecisionKind.NOT_FOUND:
        raise Refused(404, f"no request {thread_id!r}")
    if not decision.resumable or decision.status is not flowy.RunStatus.SUSPENDED:
        raise conflict(decision)
    try:
        result = await runner.resume(token, state_overlay=overlay)  # merged field by field
    except (
        flowy.ConcurrencyConflictError,  # another approval saved first
        flowy.ThreadAlreadyRunningError,  # another approval is running in this process
        flowy.ThreadLeaseBusyError,  # ... or in another one
    ):
        raise conflict(await runner.evaluate_resume(token)) from None
    return JSONResponse(outcome(result))


def server_sent(event: str, data: object, event_id: int | None = None) -> str:
    """One server-sent event: its id (the revision, for Last-Event-ID), type and data."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data)}\n\n"


async def request_events(request: Request) -> Response:
    """Follow a request live: each snapshot it saves (``event: snapshot``, its revision
    as the id) and its nodes' progress (``event: progress``), then ``event: end``.

    A browser's ``EventSource`` reconnects by itself with ``Last-Event-ID``: the stream
    then goes on after that revision, missing no snapshot (``?after=N`` does the same);
    once it has seen the end, the answer is 204, which stops it.
    """
    thread_id: str = request.path_params["thread_id"]
    backend: flowy.Backend[Any] = request.app.state.backend
    last = request.headers.get("last-event-id") or request.query_params.get("after")
    after: int | None = None
    if last is not None:
        if not last.isdecimal() or len(last) > 18:
            raise Refused(400, f"'after' must be a revision (a whole number), got {last!r:.40}")
        after = int(last)
    try:
        head, token = await runner_of(request).head(thread_id)
    except (flowy.ThreadNotFoundError, flowy.InvalidResumeTokenError):
        raise Refused(404, f"no request {thread_id!r}") from None
    finished = head.status in (flowy.RunStatus.COMPLETED, flowy.RunStatus.FAILED)
    if finished and after is not None and after >= token.snapshot_revision:
        return Response(status_code=204)  # seen to the end: EventSource stops reconnecting

    async def stream() -> AsyncIterator[str]:
        async for event in backend.watch(thread_id, after=after):
            if event.snapshot is None:
                yield server_sent("progress", {"node": event.node, "data": event.data})
                continue
            snap = event.snapshot
            state = {
                "revision": event.revision,
                "status": snap.status.value,
                "reason": snap.reason,
                "waiting_for": waiting_for(snap.status),
                "expense": snap.state,
            }
            yield server_sent("snapshot", state, event.revision)
        yield server_sent("end", {})

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(stream(), media_type="text/event-stream", headers=headers)


def create_app(backend_url: str | None = None) -> Starlette:
    app = Starlette(
        routes=[
            Route("/requests", create_request, methods=["POST"]),
            Route("/requests/{thread_id}", show_request, methods=["GET"]),
            Route("/requests/{thread_id}/approve", approve_request, methods=["POST"]),
            Route("/requests/{thread_id}/events", request_events, methods=["GET"]),
        ],
        exception_handlers={Refused: refused},
        lifespan=lifespan,
    )
    app.state.backend_url = backend_url or store_url()
    return app


app = create_app()
