"""The first-app guide (docs/first-app.md) and its app (examples/approval_app).

The app runs end to end over HTTP (httpx's ASGI transport, the app's own lifespan) with
its worker in a process of its own, on every store: SQLite always, PostgreSQL when a
server answers. The guide's code is the app's code, line for line.
"""

from __future__ import annotations

import asyncio
import difflib
import importlib
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

import flowy
from examples.approval_app.graph import THRESHOLD, Payments
from examples.approval_app.web import create_app
from flowy.testing.backends import backend_missing, port_open

pytestmark = pytest.mark.anyio

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "examples" / "approval_app"
GUIDE = ROOT / "docs" / "first-app.md"
DEADLINE = 15.0  # seconds any one wait may take; the whole module runs in a few
POSTGRES_DSN = "postgresql://postgres@127.0.0.1:5432/test"

Json = dict[str, Any]


# -- stores, the worker process, polling --------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
async def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """The URL of a fresh store: a SQLite file, or a PostgreSQL schema of its own."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'approvals.db'}"
        return
    dsn = os.environ.get("FLOWY_POSTGRES_DSN") or POSTGRES_DSN
    if not os.environ.get("FLOWY_POSTGRES_DSN") and not port_open("127.0.0.1", 5432):
        backend_missing("PostgreSQL is not on 127.0.0.1:5432 and FLOWY_POSTGRES_DSN is unset")
    schema = f"approvals_{uuid.uuid4().hex[:12]}"
    url = f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}"
    backend = await flowy.connect(url)  # creates the schema
    await backend.aclose()
    try:
        yield url
    finally:
        await drop_schema(dsn, schema)


async def drop_schema(dsn: str, schema: str) -> None:
    asyncpg: Any = importlib.import_module("asyncpg")  # asyncpg ships no types
    conn = await asyncpg.connect(dsn.partition("?")[0])
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


async def until(check: Callable[[], Awaitable[T | None]], what: str, log: Path) -> T:
    """Poll ``check`` until it returns something, for at most DEADLINE seconds."""
    deadline = time.monotonic() + DEADLINE
    while True:
        value = await check()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"waited {DEADLINE}s for {what}; the worker said:\n{read_log(log)}")
        await asyncio.sleep(0.05)


def read_log(log: Path) -> str:
    return log.read_text() if log.exists() else "(nothing)"


class WorkerProcess:
    """``python -m examples.approval_app.worker`` on the test's store, output to a file."""

    def __init__(self, url: str, payments: Path, log: Path) -> None:
        self.url = url
        self.payments = payments
        self.log = log
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        with self.log.open("wb") as out:
            self.proc = await asyncio.create_subprocess_exec(
                *(sys.executable, "-m", "examples.approval_app.worker"),
                *("--backend", self.url, "--payments", str(self.payments)),
                *("--owner", "worker-1"),
                cwd=ROOT,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
            )

        async def ready() -> bool | None:
            assert self.proc is not None
            if self.proc.returncode is not None:
                pytest.fail(f"the worker exited with {self.proc.returncode}:\n{self.output}")
            return True if "waiting for payments" in self.output else None

        await until(ready, "the worker to start", self.log)

    @property
    def output(self) -> str:
        return read_log(self.log)

    async def stop(self) -> str:
        """SIGTERM, as a process manager would; the worker drains and exits 0."""
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), DEADLINE)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        return self.output


@pytest.fixture
async def worker(store_url: str, tmp_path: Path) -> AsyncIterator[WorkerProcess]:
    process = WorkerProcess(store_url, tmp_path / "payments.db", tmp_path / "worker.log")
    await process.start()
    try:
        yield process
    finally:
        await process.stop()


@pytest.fixture
async def client(store_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """The app over HTTP, its lifespan (open the store, close it) around the test."""
    app = create_app(store_url)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            yield http


async def ask(client: httpx.AsyncClient, who: str, amount: int, reason: str) -> Json:
    response = await client.post("/requests", json={"who": who, "amount": amount, "reason": reason})
    assert response.status_code == 201, response.text
    body: Json = response.json()
    assert response.headers["location"] == f"/requests/{body['thread_id']}"
    return body


async def approve(
    client: httpx.AsyncClient, thread_id: str, token: str, approved: bool = True
) -> httpx.Response:
    return await client.post(
        f"/requests/{thread_id}/approve",
        json={"token": token, "approver": "maria", "approved": approved},
    )


async def completed(client: httpx.AsyncClient, thread_id: str, worker: WorkerProcess) -> Json:
    async def check() -> Json | None:
        response = await client.get(f"/requests/{thread_id}")
        assert response.status_code == 200, response.text
        body: Json = response.json()
        assert body["status"] in ("handoff", "running", "completed"), body
        return body if body["status"] == "completed" else None

    return await until(check, f"{thread_id} to complete", worker.log)


def payments_of(worker: WorkerProcess, thread_id: str) -> list[tuple[str, str, int, int]]:
    return [row for row in Payments(str(worker.payments)).rows() if row[0] == thread_id]


# -- the app -------------------------------------------------------------------------


async def test_a_large_request_waits_for_approval_then_the_worker_pays_it_once(
    client: httpx.AsyncClient, worker: WorkerProcess
) -> None:
    asked = await ask(client, "ana", THRESHOLD + 150, "conference ticket")
    thread_id = asked["thread_id"]
    token = asked["resume_token"]
    assert asked["status"] == "suspended" and asked["reason"] == "awaiting_approval"
    assert asked["waiting_for"] == "approval"
    assert flowy.ResumeToken.parse(token).thread_id == thread_id

    # What it waits for, and the token that approves it.
    shown = (await client.get(f"/requests/{thread_id}")).json()
    assert shown["status"] == "suspended" and shown["reason"] == "awaiting_approval"
    assert shown["waiting_for"] == "approval" and shown["resume_token"] == token
    assert shown["expense"] == {
        "who": "ana",
        "amount": 250,
        "reason": "conference ticket",
        "summary": "ana asks for 250 for 'conference ticket'",
        "approver": "",
        "approved": False,
        "payment_id": "",
    }

    # A stale token (an older snapshot): 409 with the current token.
    revision = flowy.ResumeToken.parse(token).snapshot_revision
    stale = await approve(client, thread_id, f"{thread_id}@{revision - 1}")
    assert stale.status_code == 409, stale.text
    assert stale.json()["resume_token"] == token and "stale" in stale.json()["error"]

    # Garbled tokens, tokens of other requests, unknown requests.
    for garbled in ("garbled", f"{thread_id}@", f"{thread_id}@0", f"{thread_id}@x"):
        refused = await approve(client, thread_id, garbled)
        assert refused.status_code == 400, (garbled, refused.text)
    other = await approve(client, thread_id, "req-other@2")
    assert other.status_code == 400 and "not a resume token of" in other.json()["error"]
    assert (await approve(client, "req-nope", "req-nope@2")).status_code == 404
    assert (await client.get("/requests/req-nope")).status_code == 404
    bad_body = await client.post(f"/requests/{thread_id}/approve", json={"token": token})
    assert bad_body.status_code == 400, bad_body.text

    # Approve: the agent hands the payment off to the worker.
    approved = await approve(client, thread_id, token)
    assert approved.status_code == 200, approved.text
    handed = approved.json()
    assert handed["status"] == "handoff" and handed["reason"] == "payment_queued"
    assert handed["waiting_for"] == "worker"

    # The same approval again: the token is used up.
    again = await approve(client, thread_id, token)
    assert again.status_code == 409, again.text
    assert again.json()["resume_token"] != token

    # The worker process finishes the run and pays exactly once.
    done = await completed(client, thread_id, worker)
    assert done["waiting_for"] is None
    assert done["expense"]["approver"] == "maria" and done["expense"]["approved"] is True
    assert done["expense"]["payment_id"] == f"pay-{thread_id}"
    assert payments_of(worker, thread_id) == [(thread_id, "ana", 250, 1)]
    # ... and a finished request takes no more approvals.
    late = await approve(client, thread_id, done["resume_token"])
    assert late.status_code == 409 and late.json()["status"] == "completed", late.text

    output = await worker.stop()
    assert worker.proc is not None and worker.proc.returncode == 0, output
    assert f"{thread_id}: completed pay-{thread_id}" in output
    assert "worker worker-1 stopped" in output


async def test_a_small_request_needs_no_approval(
    client: httpx.AsyncClient, worker: WorkerProcess
) -> None:
    asked = await ask(client, "ben", THRESHOLD, "taxi")
    thread_id = asked["thread_id"]
    assert asked["status"] == "handoff" and asked["reason"] == "payment_queued", asked
    assert asked["waiting_for"] == "worker"

    done = await completed(client, thread_id, worker)
    assert done["expense"]["approver"] == "auto" and done["expense"]["approved"] is True
    assert payments_of(worker, thread_id) == [(thread_id, "ben", THRESHOLD, 1)]
    output = await worker.stop()
    assert worker.proc is not None and worker.proc.returncode == 0, output


async def test_a_rejected_request_is_never_paid(client: httpx.AsyncClient) -> None:
    asked = await ask(client, "chloe", 900, "a yacht")
    rejected = await approve(client, asked["thread_id"], asked["resume_token"], approved=False)
    assert rejected.status_code == 200, rejected.text
    assert rejected.json()["status"] == "completed" and rejected.json()["waiting_for"] is None
    shown = (await client.get(f"/requests/{asked['thread_id']}")).json()
    assert shown["expense"]["approved"] is False and shown["expense"]["payment_id"] == ""


async def test_two_approvals_of_one_request_at_once_one_wins(client: httpx.AsyncClient) -> None:
    asked = await ask(client, "dev", 400, "a laptop")
    responses = await asyncio.gather(
        *(approve(client, asked["thread_id"], asked["resume_token"]) for _ in range(4))
    )
    codes = sorted(r.status_code for r in responses)
    assert codes == [200, 409, 409, 409], [r.text for r in responses]


async def test_bad_input_is_a_400_and_an_unusable_thread_id_a_404(
    client: httpx.AsyncClient,
) -> None:
    bodies: list[object] = [[], {"who": "ana", "amount": "ten", "reason": "x"}, {"who": "ana"}]
    for body in bodies:
        response = await client.post("/requests", json=body)
        assert response.status_code == 400, response.text
    response = await client.post("/requests", content=b"{not json")
    assert response.status_code == 400, response.text
    zero = await client.post("/requests", json={"who": "a", "amount": 0, "reason": "x"})
    assert zero.status_code == 400, zero.text
    # A thread id no store accepts (over 16 KiB): no such request, and no such token.
    long_id = "req-" + "x" * 20_000
    assert (await client.get(f"/requests/{long_id}")).status_code == 404
    too_long = await approve(client, long_id, f"{long_id}@2")
    assert too_long.status_code == 400, too_long.text


async def test_the_worker_never_prints_the_store_password(tmp_path: Path) -> None:
    # PostgreSQL here trusts local connections, so a URL with any password connects.
    planted = "pl4nted-Secret-9x"
    dsn = os.environ.get("FLOWY_POSTGRES_DSN") or POSTGRES_DSN
    if not os.environ.get("FLOWY_POSTGRES_DSN") and not port_open("127.0.0.1", 5432):
        backend_missing("PostgreSQL is not on 127.0.0.1:5432 and FLOWY_POSTGRES_DSN is unset")
    schema = f"approvals_{uuid.uuid4().hex[:12]}"
    url = f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}".replace(
        "postgres@", f"postgres:{planted}@", 1
    )
    assert planted in url
    process = WorkerProcess(url, tmp_path / "payments.db", tmp_path / "worker.log")
    try:
        await process.start()
        output = await process.stop()
    finally:
        await drop_schema(dsn, schema)
    assert "waiting for payments" in output and "postgres:***@" in output, output
    assert planted not in output, output


# -- the CLI worker runs the app ------------------------------------------------------


async def flowy_cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """``flowy ARGS`` from the repository root: its exit status and its output."""
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "flowy.cli", *args),
        cwd=ROOT,
        env={**os.environ, "NO_COLOR": "1", **(env or {})},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), DEADLINE * 2)
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def test_the_cli_worker_pays_with_the_apps_bindings_through_app(
    client: httpx.AsyncClient, store_url: str, tmp_path: Path
) -> None:
    asked = await ask(client, "ben", 40, "taxi")  # small: handed off at once
    thread_id = asked["thread_id"]
    payments = tmp_path / "cli-payments.db"
    env = {"APP_PAYMENTS": str(payments)}

    # `flowy show` names both ways to run a worker: --graph, and --app for bindings.
    code, shown = await flowy_cli("show", thread_id, "--backend", store_url)
    assert code == 0, shown
    assert "flowy worker --graph MODULE:ATTR" in shown, shown
    assert "--app MODULE:FACTORY" in shown, shown

    # --graph alone cannot give `pay` its ledger: the run fails and is released.
    code, output = await flowy_cli(
        *("worker", "--graph", "examples.approval_app.graph:graph", "--backend", store_url),
        *("--once", "--retry-delay", "1"),
        env=env,
    )
    assert code == 1 and "MissingBindingError" in output, output
    assert "released for another delivery" in output, output  # back in 1s or so

    # --app takes the app's own worker factory: its runner and its bindings.
    app = "examples.approval_app.worker:make_worker"
    code, output = await flowy_cli(
        *("worker", "--app", app, "--backend", store_url, "--once", "--idle-wait", "5"), env=env
    )
    assert code == 0, output
    assert f"app {app}" in output and "acked: resumed" in output, output
    done = (await client.get(f"/requests/{thread_id}")).json()
    assert done["status"] == "completed", done
    assert done["expense"]["payment_id"] == f"pay-{thread_id}"
    rows = [row for row in Payments(str(payments)).rows() if row[0] == thread_id]
    assert rows == [(thread_id, "ben", 40, 1)]


@pytest.mark.parametrize(
    ("app", "error"),
    [
        ("examples.approval_app.worker", "must look like 'package.module:attribute'"),
        ("examples.approval_app.worker:nothing", "has no attribute 'nothing'"),
        ("examples.approval_app.graph:THRESHOLD", "is a int, not a function"),
        ("examples.approval_app.graph:store_url", "calling it failed: TypeError"),
        ("examples.approval_app.graph:Expense", "calling it failed: TypeError"),
        ("examples.approval_app.web:create_app", "returned a Starlette, not a flowy.Worker"),
    ],
)
async def test_a_bad_app_is_one_clear_line_and_exit_2(app: str, error: str, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'approvals.db'}"
    await (await flowy.connect(url)).aclose()  # the store exists: the app is what is wrong
    code, output = await flowy_cli("worker", "--app", app, "--backend", url, "--once")
    assert code == 2, output
    assert error in output, output
    assert "Traceback" not in output and len(output.strip().splitlines()) == 1, output


async def test_the_cli_worker_takes_a_graph_or_an_app_not_both(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'approvals.db'}"
    graph, app = "examples.approval_app.graph:graph", "examples.approval_app.worker:make_worker"
    code, output = await flowy_cli("worker", "--graph", graph, "--app", app, "--backend", url)
    assert code == 2 and "not allowed with argument" in output, output
    code, output = await flowy_cli("worker", "--backend", url)
    assert code == 2 and "one of the arguments --graph --app is required" in output, output


# -- the guide is the app ------------------------------------------------------------

SECTION_OR_BLOCK = re.compile(r"^(##[^#\n][^\n]*)$|^```(\w*)\n(.*?)^```$", re.M | re.S)
MODULE_IN_HEADING = re.compile(r"examples/approval_app/(\w+\.py)")
# The lines a module needs as a file of a package but that cannot run on the page (the
# page runs as one script): imports of the sibling module and the __main__ guard. The
# guide names them in its text instead.
PACKAGE_ONLY = re.compile(
    r'^from \.\w+ import [^\n]*\n|^if __name__ == "__main__":\n    \w+\(\)\n', re.M
)


def guide_modules() -> dict[str, list[str]]:
    """The guide's python blocks, by the module the heading of their section names."""
    modules: dict[str, list[str]] = {}
    current: str | None = None
    for match in SECTION_OR_BLOCK.finditer(GUIDE.read_text()):
        heading, lang, body = match.groups()
        if heading is not None:
            named = MODULE_IN_HEADING.search(heading)
            current = named.group(1) if named else None
        elif lang == "python" and current is not None:
            modules.setdefault(current, []).append(body)
    return modules


def blank_lines_normalised(code: str) -> str:
    return re.sub(r"\n{3,}", "\n\n\n", code.strip("\n")) + "\n"


def test_the_guide_shows_every_module_of_the_app_line_for_line() -> None:
    shown = guide_modules()
    on_disk = sorted(p.name for p in APP.glob("*.py"))
    assert sorted(shown) == on_disk
    guide_text = " ".join(GUIDE.read_text().split())
    for name in on_disk:
        source = (APP / name).read_text()
        for line in PACKAGE_ONLY.findall(source):
            assert f"`{' '.join(line.split())}`" in guide_text, (
                f"{name}: the guide should name {line.strip()!r} in its text"
            )
        expected = blank_lines_normalised(PACKAGE_ONLY.sub("", source))
        actual = blank_lines_normalised("\n\n\n".join(b.strip("\n") for b in shown[name]))
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                actual.splitlines(keepends=True),
                f"examples/approval_app/{name}",
                f"docs/first-app.md ({name})",
            )
        )
        assert not diff, f"the guide and the app differ (edit both):\n{diff}"


# -- the guide's commands run as written -----------------------------------------------

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_BLOCK = re.compile(r"^```(?:text|console|sh|bash)\n(.*?)^```$", re.M | re.S)


def commands(text: str) -> list[str]:
    """The commands of ``text``'s shell blocks (the lines after ``$ ``) and of its
    inline code spans."""
    found = [
        line.removeprefix("$ ")
        for block in SHELL_BLOCK.findall(text)
        for line in block.splitlines()
        if line.startswith("$ ")
    ]
    prose = re.sub(r"^```.*?^```$", "", text, flags=re.M | re.S)
    return found + re.findall(r"`([^`]+)`", " ".join(prose.split()))


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_docs_name_python3_never_python(page: Path) -> None:
    # Debian and Ubuntu have no `python` command; `python3` is everywhere.
    bad = [c for c in commands(page.read_text()) if re.search(r"(^|[\s|;&(])python\s", c)]
    assert not bad, f"{page.name}: say python3: {bad}"


def test_the_guide_installs_from_the_clone_names_uv_by_its_path_and_creates_the_database() -> None:
    guide = GUIDE.read_text()
    steps = commands(guide)
    # flowy is not on the package index: it installs from the clone or a built wheel.
    installs = [c for c in steps if "pip install" in c]
    assert installs, steps
    for install in installs:
        assert not re.search(r"pip install\s+(-e\s+)?[\"']?flowy", install), install
    assert 'python3 -m pip install -e "./packages/flowy-core[ui]" httpx' in steps
    assert "python3 -m pip install dist/flowy_core-*.whl starlette uvicorn httpx" in steps
    # `make` puts uv in .tools/uv-venv/bin when it is not on PATH.
    uv = [c for c in steps if re.match(r"uv\s", c)]
    assert not uv, f"name uv by the path make gives it: {uv}"
    assert any(c.startswith(".tools/uv-venv/bin/uv build --package flowy-core") for c in steps)
    # The database exists before the first connection.
    assert guide.index("$ createdb ") < guide.index("export APP_BACKEND='postgresql://")


def test_the_wheel_command_of_the_guide_builds_the_wheel_it_installs(tmp_path: Path) -> None:
    # As the guide runs it: in a fresh venv (`python3 -m venv`), with that venv's pip.
    venv = tmp_path / "venv"
    made = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True)
    assert made.returncode == 0, made.stderr.decode()
    dist = tmp_path / "dist"
    pip = (str(venv / "bin" / "python3"), "-m", "pip")
    package = str(ROOT / "packages" / "flowy-core")
    built = subprocess.run(
        [*pip, "wheel", "--no-deps", "-q", "-w", str(dist), package], capture_output=True
    )
    assert built.returncode == 0, built.stderr.decode()
    wheels = [p.name for p in dist.glob("flowy_core-*.whl")]
    assert len(wheels) == 1 and wheels[0].endswith("-py3-none-any.whl"), wheels
    assert f"Successfully built dist/{wheels[0]}" in GUIDE.read_text()


async def test_the_guides_sample_outputs_have_the_columns_the_commands_print(
    tmp_path: Path,
) -> None:
    store_url = f"sqlite:///{tmp_path / 'approvals.db'}"
    app = create_app(store_url)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            thread_id = (await ask(http, "ana", 250, "conference ticket"))["thread_id"]
    guide = GUIDE.read_text()
    for args in (("threads",), ("history", thread_id)):
        code, output = await flowy_cli(*args, "--backend", store_url)
        assert code == 0, output
        header = output.splitlines()[0].split()
        shown = guide.split(f"$ flowy {args[0]} --db approvals.db", 1)[1].splitlines()[1]
        assert shown.split() == header, f"flowy {args[0]}: the guide shows {shown!r}"


# -- following a request live (server-sent events) -------------------------------------


def sse_events(body: str) -> list[tuple[str, Json, str | None]]:
    """``(event, data, id)`` of each server-sent event of ``body``."""
    events: list[tuple[str, Json, str | None]] = []
    for block in body.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((fields["event"], json.loads(fields["data"]), fields.get("id")))
    return events


async def test_the_events_of_a_request_follow_it_to_the_end(
    client: httpx.AsyncClient, worker: WorkerProcess
) -> None:
    asked = await ask(client, "ben", THRESHOLD, "train ticket")  # paid without approval
    thread_id = asked["thread_id"]
    await completed(client, thread_id, worker)
    whole = await client.get(f"/requests/{thread_id}/events", params={"after": 0})
    assert whole.status_code == 200, whole.text
    assert whole.headers["content-type"].startswith("text/event-stream")
    events = sse_events(whole.text)
    snapshots = [data for kind, data, _ in events if kind == "snapshot"]
    assert [s["revision"] for s in snapshots] == list(range(1, len(snapshots) + 1))
    assert snapshots[-1]["status"] == "completed"
    assert snapshots[-1]["expense"]["payment_id"] == f"pay-{thread_id}"
    assert [kind for kind, _, _ in events][-1] == "end"
    assert [event_id for kind, _, event_id in events if kind == "snapshot"] == [
        str(s["revision"]) for s in snapshots
    ]
    # A reconnecting EventSource sends Last-Event-ID: the stream goes on after it.
    resumed = await client.get(
        f"/requests/{thread_id}/events", headers={"Last-Event-ID": str(len(snapshots) - 1)}
    )
    assert [d["revision"] for k, d, _ in sse_events(resumed.text) if k == "snapshot"] == [
        len(snapshots)
    ]
    # Seen to the end: 204, which tells an EventSource not to reconnect.
    last = {"Last-Event-ID": str(len(snapshots))}
    assert (await client.get(f"/requests/{thread_id}/events", headers=last)).status_code == 204
    assert (await client.get("/requests/req-nope/events")).status_code == 404
    bad = await client.get(f"/requests/{thread_id}/events", params={"after": "-1"})
    assert bad.status_code == 400 and "'after' must be a revision" in bad.json()["error"]


CHROMIUM = os.environ.get("FLOWY_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("FLOWY_CHROMEDRIVER", "/usr/bin/chromedriver")

FOLLOW = """
window.followed = [];
const source = new EventSource(arguments[0]);
for (const kind of ["snapshot", "progress"]) {
  source.addEventListener(kind, (e) => window.followed.push([kind, JSON.parse(e.data)]));
}
source.addEventListener("end", () => { window.followed.push(["end", {}]); source.close(); });
"""


@pytest.fixture
def browser() -> Iterator[Any]:
    """Headless Chromium through Selenium (the system's; skipped without it, unless
    FLOWY_REQUIRE_BROWSER=1)."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing or importlib.util.find_spec("selenium") is None:
        why = f"no {missing or 'selenium'}: apt-get install chromium chromium-driver"
        if os.environ.get("FLOWY_REQUIRE_BROWSER") == "1":
            pytest.fail(f"FLOWY_REQUIRE_BROWSER=1 but {why}")
        pytest.skip(why)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def served(store_url: str) -> Iterator[str]:
    """The app under uvicorn on a free port, in a thread of its own (its lifespan on)."""
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    config = uvicorn.Config(create_app(store_url), host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=asyncio.run, args=(server.serve(),), daemon=True)
    thread.start()
    deadline = time.monotonic() + DEADLINE
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(DEADLINE)


async def test_a_browser_follows_a_request_while_the_worker_pays_it(
    browser: Any, served: str, store_url: str, worker: WorkerProcess
) -> None:
    async with httpx.AsyncClient(base_url=served) as http:
        asked = await ask(http, "ana", THRESHOLD + 150, "conference ticket")
        thread_id = asked["thread_id"]
        browser.get(f"{served}/requests/{thread_id}")  # the app's origin
        browser.execute_script(FOLLOW, f"/requests/{thread_id}/events")

        def followed() -> list[list[Any]]:
            return browser.execute_script("return window.followed")

        async def seen(kind: str, status: str | None = None) -> bool | None:
            return (
                any(
                    k == kind and (status is None or d.get("status") == status)
                    for k, d in followed()
                )
                or None
            )

        await until(lambda: seen("snapshot", "suspended"), "the browser to see it wait", worker.log)
        approved = await approve(http, thread_id, asked["resume_token"])
        assert approved.status_code == 200, approved.text
        await until(lambda: seen("end"), "the browser to see the end", worker.log)
    events = followed()
    statuses = [d["status"] for k, d in events if k == "snapshot"]
    assert statuses[0] == "suspended" and statuses[-1] == "completed"
    assert "handoff" in statuses  # the hand-off to the worker process
    revisions = [d["revision"] for k, d in events if k == "snapshot"]
    assert revisions == list(range(revisions[0], revisions[0] + len(revisions)))  # no gaps
    assert events[-1] == ["end", {}]
    assert events[-2][1]["expense"]["payment_id"] == f"pay-{thread_id}"
    progress = [d["data"] for k, d in events if k == "progress"]
    if store_url.startswith("postgresql"):
        # PostgreSQL carries the worker's progress to the web process (LISTEN/NOTIFY).
        assert progress == [{"paying": 250}, {"paid": f"pay-{thread_id}"}]
    else:
        assert progress == []  # SQLite: snapshots only from another process
