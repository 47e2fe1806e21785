"""``flowy ui`` (``flowy/cli/_ui.py``) without a browser: Starlette's TestClient on every
store (``stores_support.py``), each filled with the same threads and opened by URL as
``flowy ui --backend URL`` opens it. Token and CSRF refusal, every page, every action,
and hostile content escaped. The same app in a real browser is in
``test_ui_browser.py``."""

from __future__ import annotations

import asyncio
import contextlib
import html
import re
import sys
import time
import urllib.parse
import warnings
from collections.abc import Callable, Generator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from cli_support import require_ui_extra

require_ui_extra("starlette")

from core_graphs import State, approval_graph, merge
from stores_support import ALL_STORES, Store, environment, fresh_store
from stores_support import dynamodb_endpoint as dynamodb_endpoint  # a fixture

from examples.approval_app.graph import Expense
from examples.approval_app.graph import graph as expense_graph

with warnings.catch_warnings():
    # Starlette 1.x asks for httpx2 under its TestClient; httpx still works.
    warnings.filterwarnings("ignore", message=".*httpx2", category=UserWarning)
    from starlette.testclient import TestClient

import flowy
from flowy.cli import main
from flowy.cli._ui import _in, _when, build_app, cookie_name
from flowy.cli._ui_thread import emitted
from flowy.testing import corrupt_head
from flowy.testing.faults import FaultyBackend, Phase

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

TOKEN = "test-token-123"
PORT = 8765
COOKIE = cookie_name(PORT)
BASE = f"http://127.0.0.1:{PORT}"
HOSTILE = "<script>alert(1)</script>"


async def _populate(url: str) -> None:
    async with flowy.connect(url) as backend:
        runner = flowy.Runner(approval_graph(), backend, run_lease=("setup", 5.0))
        await runner.start("susp", {})
        await runner.start(HOSTILE, {"note": HOSTILE})
        await runner.start("orph", {})
        snap, revision = await backend.checkpointer.load("orph")
        orphan = replace(
            snap,
            status=flowy.RunStatus.HANDOFF,
            handoff_status=flowy.HandoffStatus.ORPHANED,
            execution_pointer="act",
            reason="to_worker",
        )
        await backend.checkpointer.save(revision, orphan)
        # "dead": a hand-off whose deliveries kept failing, with a hostile error.
        dead = await runner.start("dead", {})
        assert dead.resume_token is not None
        await runner.resume(dead.resume_token, state_overlay={"approved": True})
        for _ in range(100):
            if await backend.consumer.dead_letters():
                break
            for message in await backend.consumer.claim(10, 30.0):
                await backend.consumer.release(message, error=HOSTILE)
        assert await backend.consumer.dead_letters()


async def _load(url: str, thread: str) -> flowy.storage.Snapshot[Any]:
    async with flowy.connect(url) as backend:
        snap, _ = await flowy.Runner(approval_graph(), backend).head(thread)
        return snap


async def _charge(amount: int) -> dict[str, Any]:
    return {"charged": amount}


def _paying_graph() -> flowy.Graph[State, Any]:
    """``pay`` charges (an activity), then waits an hour for "approval"; then ``done``."""

    async def pay(s: State) -> tuple[State, flowy.Directive[Any]]:
        receipt = await flowy.activity(_charge, 42, key="charge")
        return {"receipt": receipt}, flowy.wait_for("approval", timeout=3600, resume_at="done")

    async def done(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {}, flowy.completed()

    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    b.add_node("pay", pay).add_node("done", done).add_edge("pay", "done")
    return b.allow_no_outgoing_route("done").compile()


async def _start_paying(url: str) -> None:
    async with flowy.connect(url) as backend:
        runner = flowy.Runner(_paying_graph(), backend, run_lease=("setup", 5.0))
        assert (await runner.start("payer", {})).status is flowy.RunStatus.WAITING


def _inspector(
    url: str, graph: flowy.Graph[Any, Any], wrap: Callable[[Any], Any] | None = None
) -> ASGIApp:
    """The inspector over the store at ``url`` (through ``wrap`` of it, if given), which
    it opens at startup in its own event loop, as ``flowy ui`` opens it in uvicorn's
    (asyncpg's and redis's connections belong to the loop that made them), and closes
    at shutdown."""
    app: list[ASGIApp] = []

    async def opened(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await app[0](scope, receive, send)
            return
        await receive()  # lifespan.startup
        async with flowy.connect(url) as backend:
            served = backend if wrap is None else wrap(backend)
            app.append(build_app(served, graph, token=TOKEN, host="127.0.0.1", port=PORT))
            await send({"type": "lifespan.startup.complete"})
            await receive()  # lifespan.shutdown
        await send({"type": "lifespan.shutdown.complete"})

    return opened


@contextlib.contextmanager
def _client(
    url: str,
    graph: flowy.Graph[Any, Any] | None = None,
    *,
    token: bool = True,
    wrap: Callable[[Any], Any] | None = None,
) -> Generator[TestClient]:
    """A client of the inspector over ``url`` (``wrap`` of it, if given) for threads of
    ``graph`` (the approval graph by default), with the token's cookie when ``token``."""
    app = _inspector(url, graph or approval_graph(), wrap)
    with TestClient(app, base_url=BASE, follow_redirects=False) as c:
        if token:
            c.cookies.set(COOKIE, TOKEN)
        yield c


@pytest.fixture(params=ALL_STORES)
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    """Each store, filled by ``_populate``, its environment set for the whole test."""
    with fresh_store(request, "ui") as made, environment(made):
        asyncio.run(_populate(made.url))
        yield made


@pytest.fixture
def client(store: Store) -> Iterator[TestClient]:
    with _client(store.url) as c:
        yield c


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A filled SQLite file, for the tests of the token and of the command, which do not
    depend on the store."""
    path = tmp_path / "flowy.db"
    asyncio.run(_populate(f"sqlite:///{path}"))
    return path


def _head(store: Store, thread: str) -> flowy.storage.Snapshot[Any]:
    return asyncio.run(_load(store.url, thread))


def _csrf(page: str) -> str:
    found = re.search(r"name='csrf' value='([^']+)'", page)
    assert found is not None, "no CSRF field on the page"
    return found.group(1)


def test_no_token_is_refused(db: Path) -> None:
    with _client(f"sqlite:///{db}", token=False) as c:
        for path in ("/", "/threads/susp", "/dead-letters"):
            assert c.get(path).status_code == 403
        assert c.get("/?token=wrong").status_code == 403
        c.cookies.set(COOKIE, "wrong")
        assert c.get("/").status_code == 403
        assert c.post("/actions/requeue", data={"message": "x"}).status_code == 403


def test_the_token_in_the_url_becomes_a_strict_http_only_cookie(db: Path) -> None:
    with _client(f"sqlite:///{db}", token=False) as c:
        r = c.get(f"/?token={TOKEN}&status=suspended")
        assert r.status_code == 303
        assert r.headers["location"] == "/?status=suspended"
        cookie = r.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie
        page = c.get("/?status=suspended")
        assert page.status_code == 200 and "susp" in page.text
        assert "default-src 'none'" in page.headers["content-security-policy"]


def test_a_post_without_the_csrf_token_is_refused(client: TestClient, store: Store) -> None:
    data = {"thread": "susp", "revision": "2", "overlay": '{"approved": true}'}
    assert client.post("/actions/resume", data=data).status_code == 403
    r = client.post("/actions/resume", data={**data, "csrf": "forged"})
    assert r.status_code == 403
    assert _head(store, "susp").status is flowy.RunStatus.SUSPENDED


def test_threads_page_lists_and_filters(client: TestClient) -> None:
    page = client.get("/").text
    assert "susp" in page and "orph" in page and "awaiting_approval" in page
    rows = page.split("<tr>")
    assert "(dead letter)" in next(r for r in rows if "/threads/dead'" in r)
    assert "(dead letter)" not in next(r for r in rows if "/threads/orph'" in r)
    only = client.get("/?status=handoff").text
    assert "orph" in only and "/threads/susp" not in only
    at_act = client.get("/?node=act").text
    assert "/threads/orph" in at_act and "/threads/susp" not in at_act
    assert "no threads match" in client.get("/?node=nowhere").text


def test_the_fleet_page_counts_and_filters_by_prefix_version_and_age(store: Store) -> None:
    async def fill() -> None:
        async with flowy.connect(store.url) as backend:
            old = time.time() - 2 * 86400
            for i, version in enumerate(["v-old", "v-old", "v-new"]):
                snap = flowy.storage.Snapshot[Any](
                    thread_id=f"zz-{i}",
                    state={},
                    execution_pointer="ask",
                    status=flowy.RunStatus.SUSPENDED,
                    updated_at=old + i,
                    graph_version=version,
                )
                await backend.checkpointer.save(0, snap)

    asyncio.run(fill())
    with _client(store.url) as c:
        page = c.get("/").text
        statuses = page[page.index("id='by-status'") : page.index("id='by-node'")]
        assert "<b class='count'>7</b><span class=''>all threads</span>" in statuses
        assert "href='/?status=suspended'><b class='count'>5</b>" in statuses
        assert "href='/?node=ask'><b class='count'>5</b>" in page
        assert "id='backlog'" in page and "outbox pending" in page

        def listed(query: str) -> list[str]:
            found = c.get("/?" + query)
            assert found.status_code == 200, found.text
            body = found.text[found.text.index("id='threads'") :]
            return re.findall(r"<td><a href='/threads/([^']+)'>", body)

        assert listed("q=zz-") == ["zz-2", "zz-1", "zz-0"]  # most recently saved first
        assert listed("version=v-old") == ["zz-1", "zz-0"]
        assert listed("age=%2B1d") == ["zz-2", "zz-1", "zz-0"]
        assert "zz-0" not in listed("age=-1h") and "susp" in listed("age=-1h")
        assert listed("q=zz-&status=suspended&node=ask&version=v-new") == ["zz-2"]
        for bad in ("age=soon", "before=x", "before=nan~x"):
            r = c.get("/?" + bad)
            assert r.status_code == 400 and "BadQueryError" in r.text, bad


def test_the_list_filters_by_queue(store: Store) -> None:
    """On a store with queues, the form offers each queue and ``queue=`` keeps the threads
    with a live message in it."""
    from flowy.queues import Route
    from flowy.testing.suite._support import make_intent

    async def fill() -> bool:
        async with flowy.connect(store.url) as backend:
            for i, queue in enumerate(["llm", "llm", "default"]):
                thread = f"qq-{i}"
                snap = flowy.storage.Snapshot[Any](
                    thread_id=thread, state={}, execution_pointer="ask", updated_at=1e9 + i
                )
                await backend.checkpointer.save(0, snap)
                if backend.capabilities.queues:
                    intent = make_intent(thread, 1, route=Route(queue))
                    await backend.outbox.enqueue_intent(intent)
            return backend.capabilities.queues

    has_queues = asyncio.run(fill())
    with _client(store.url) as c:

        def listed(query: str) -> list[str]:
            found = c.get("/?" + query)
            assert found.status_code == 200, found.text
            body = found.text[found.text.index("id='threads'") :]
            return re.findall(r"<td><a href='/threads/([^']+)'>", body)

        front = c.get("/").text
        assert has_queues  # every store here keeps queues
        assert "<option value='llm'>llm</option>" in front
        assert listed("queue=llm") == ["qq-1", "qq-0"]
        assert listed("queue=default&q=qq-") == ["qq-2"]
        unserved = c.get("/?queue=unserved").text
        assert "no threads match" in unserved and "qq-" not in unserved
        assert "<option value='unserved' selected>" in unserved
        bad = c.get("/?queue=" + urllib.parse.quote("no spaces"))
        assert bad.status_code == 400 and "BadQueryError" in bad.text


def test_a_queue_filter_on_a_store_without_queues_is_a_bad_query() -> None:
    from flowy.cli._ui_fleet import BadQueryError, Filters, with_queue

    assert asyncio.run(with_queue(Filters(), None)) == Filters()
    with pytest.raises(BadQueryError, match="keeps no queues"):
        asyncio.run(with_queue(Filters(queue="llm"), None))


def test_the_list_pages_through_the_stores_recency_cursor(store: Store) -> None:
    """120 threads, several in each second: every page holds 50 (the last the rest),
    most recent second first, then id, each thread once; the next-page link carries the
    last row's SECOND~THREAD, and a thread saved meanwhile does not shift the pages."""
    base = float(int(time.time()) - 5000)

    async def save(thread_id: str, at: float, revision: int = 0) -> None:
        async with flowy.connect(store.url) as backend:
            snap = flowy.storage.Snapshot[Any](
                thread_id=thread_id, state={}, execution_pointer="ask", updated_at=at
            )
            await backend.checkpointer.save(revision, snap)

    async def fill() -> None:
        async with flowy.connect(store.url) as backend:
            for i in range(120):
                snap = flowy.storage.Snapshot[Any](
                    thread_id=f"pg-{i:03d}",
                    state={},
                    execution_pointer="ask",
                    updated_at=base + i // 4 + 0.5,
                )
                await backend.checkpointer.save(0, snap)

    asyncio.run(fill())
    want = sorted((f"pg-{i:03d}" for i in range(120)), key=lambda t: (int(t[3:]) // 4, t))[::-1]
    with _client(store.url) as c:
        seen: list[str] = []
        link = "/?q=pg-"
        shown: list[str] = []
        for page in range(3):
            text = c.get(link).text
            body = text[text.index("id='threads'") :]
            rows = re.findall(r"<td><a href='/threads/([^']+)'>", body)
            seen += rows
            shown += re.findall(r"id='shown'>([^<]*)<", text)
            found = re.search(r"href='([^']+)' id='next'", text)
            if page == 0:  # saved after the first page was read: not on the next ones
                asyncio.run(save("pg-000", time.time(), revision=1))
            if found is None:
                break
            link = html.unescape(found.group(1))
            last = rows[-1]
            assert f"before={int(base + int(last[3:]) // 4)}~{last}" in urllib.parse.unquote(link)
        # pg-000 was on the last page; saved again, it is above the cursor now.
        assert seen == [t for t in want if t != "pg-000"]
        assert shown == ["1–50 of 120", "52–101 of 120", "102–120 of 120"]
        assert c.get("/?q=pg-").text.count("/threads/pg-000'") == 1
        first = c.get("/?q=pg-").text
        assert re.findall(r"<td><a href='/threads/([^']+)'>", first)[0] == "pg-000"


def test_pages_name_the_store_without_its_password_and_the_flowy_version(db: Path) -> None:
    async def opened(scope: Scope, receive: Receive, send: Send) -> None:
        async with flowy.connect(f"sqlite:///{db}") as backend:
            app = build_app(
                backend,
                approval_graph(),
                token=TOKEN,
                host="127.0.0.1",
                port=PORT,
                store="postgresql://me:hunter2@db.example/flowy",
            )
            await app(scope, receive, send)

    with TestClient(opened, base_url=BASE) as c:
        c.cookies.set(COOKIE, TOKEN)
        page = c.get("/").text
    header = page[page.index("<header>") : page.index("</header>")]
    assert "postgresql://me:***@db.example/flowy" in header and "hunter2" not in page
    assert f"flowy {flowy.__version__}" in header


def test_pages_are_live_with_a_script_of_the_inspectors_own_and_a_refresh_without_it(
    client: TestClient,
) -> None:
    page = client.get("/threads/susp")
    assert "<script src='/live.js' defer></script>" in page.text
    assert "<noscript><meta http-equiv='refresh' content='10'></noscript>" in page.text
    assert "<div id='live'>" in page.text
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "connect-src 'self'" in policy
    assert "unsafe-inline" not in policy.split("script-src")[1].split(";")[0]
    client.cookies.clear()
    script = client.get("/live.js")  # the same for everyone: no token needed
    assert script.status_code == 200
    assert script.headers["content-type"].startswith("text/javascript")
    assert 'getElementById("live")' in script.text
    assert client.get("/live.js", headers={"host": "evil.example"}).status_code == 400
    assert client.get("/").status_code == 403


def test_a_dead_letter_shows_its_error_and_traceback(store: Store) -> None:
    trace = "RuntimeError: gateway down\nTraceback (most recent call last):\n  File 'pay.py'"

    async def fill() -> None:
        async with flowy.connect(store.url) as backend:
            runner = flowy.Runner(approval_graph(), backend, run_lease=("setup", 5.0))
            tb = await runner.start("tb", {})
            assert tb.resume_token is not None
            await runner.resume(tb.resume_token, state_overlay={"approved": True})
            for _ in range(100):
                letters = await backend.consumer.dead_letters(100)
                if any(d.thread_id == "tb" for d in letters):
                    break
                for message in await backend.consumer.claim(10, 30.0):
                    await backend.consumer.release(message, error=trace)

    asyncio.run(fill())
    with _client(store.url) as c:
        page = c.get("/dead-letters").text
    row = next(r for r in page.split("<tr>") if "/threads/tb'" in r)
    assert re.search(r"<details id='error-[^']+'><summary>RuntimeError: gateway down", row)
    assert "<pre class='traceback'>RuntimeError: gateway down\nTraceback" in row


def test_thread_page_shows_head_state_history_and_marked_graph(client: TestClient) -> None:
    r = client.get("/threads/susp")
    assert r.status_code == 200
    page = r.text
    assert "suspended" in page and "awaiting_approval" in page
    assert "&quot;planned&quot;: true" in page  # the state, pretty JSON
    timeline = page[page.index("id='timeline'") : page.index("<h2>Activity journal")]
    rows = timeline.split("<tr>")[2:]  # newest first, after the header
    assert re.findall(r"<tr><td class='num'>(\d+)</td>", timeline) == ["2", "1"]
    assert "<span class='status st-running'>running</span>" in rows[1]
    assert "(state unchanged)" in rows[0] and "<summary>initial state</summary>" in rows[1]
    # The effect is shown once, at the revision that emitted it.
    assert page.count("{&quot;kind&quot;: &quot;approval&quot;}") == 1
    assert "{&quot;kind&quot;: &quot;approval&quot;}" in rows[0]
    assert re.search(r"<g class='n current[^']*' data-node='ask'>", page)  # the graph, drawn
    assert re.search(r"<g class='n visited' data-node='plan'>", page)  # the path taken
    assert "<details id='head-json'>" in page and "&quot;thread_id&quot;: &quot;susp&quot;" in page
    assert approval_graph().version in page  # the graph version
    assert "name='overlay'" in page  # the resume (approval) form
    assert client.get("/threads/nope").status_code == 404


def test_effects_are_shown_once_at_the_revision_that_emitted_them() -> None:
    base = flowy.storage.Snapshot[Any](thread_id="t", state={}, execution_pointer="a")
    first = replace(base, revision=1, effects=[1])
    second = replace(base, revision=2, effects=[1, 2])
    third = replace(base, revision=3, effects=[1, 2])
    fourth = replace(base, revision=4, segment=1, effects=[3])
    assert list(emitted(None, first)) == [1]
    assert list(emitted(first, second)) == [2]
    assert list(emitted(second, third)) == []
    assert list(emitted(third, fourth)) == [3]  # a new segment starts its own list


def test_thread_page_shows_the_journal_and_timer_of_a_waiting_thread(store: Store) -> None:
    asyncio.run(_start_paying(store.url))
    with _client(store.url, _paying_graph()) as c:
        page = c.get("/threads/payer").text
    assert "<span class='status st-waiting' id='status'>waiting</span>" in page
    assert re.search(
        r"for signal &#x27;approval&#x27;, wakes <time title='[^']+'>in 59 min</time>", page
    )
    journal = page[page.index("id='journal'") : page.index("<h2>Timers")]
    assert "<td>charge</td>" in journal and "<td>succeeded</td>" in journal
    assert "{&quot;charged&quot;: 42}" in journal
    timers = page[page.index("<h2>Timers") : page.index("<h2>Pending signals")]
    assert re.search(r"<td><time>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d</time></td>", timers), timers
    assert re.search(r"<time title='[^']+'>in 59 min</time>", timers), timers
    assert re.search(r"<g class='n current[^']*' data-node='done'>", page)


def test_thread_page_shows_pending_signals_and_the_lineage_of_forks(store: Store) -> None:
    async def fill() -> None:
        async with flowy.connect(store.url) as backend:
            runner = flowy.Runner(_paying_graph(), backend, run_lease=("setup", 5.0))
            await runner.start("payer", {})
            await runner.signal("payer", "other", {"n": 1}, signal_id="s-1")
            await runner.fork("payer", at_revision=1, new_thread_id="child")
            await runner.fork("child", at_revision=1, new_thread_id="grandchild")

    asyncio.run(fill())
    with _client(store.url, _paying_graph()) as c:
        page = c.get("/threads/payer").text
        signals = page[page.index("id='signals'") :]
        assert "<td>other</td><td><code>{&quot;n&quot;: 1}</code></td>" in signals
        grand = c.get("/threads/grandchild").text
    lineage = grand[grand.index("id='lineage'") :]
    assert lineage.index("href='/threads/child'") < lineage.index("href='/threads/payer'")


def test_resume_action_approves_and_redirects_with_the_outcome(
    client: TestClient, store: Store
) -> None:
    csrf = _csrf(client.get("/threads/susp").text)
    head = _head(store, "susp")
    r = client.post(
        "/actions/resume",
        data={
            "thread": "susp",
            "revision": str(head.revision),
            "overlay": '{"approved": true}',
            "csrf": csrf,
        },
    )
    assert r.status_code == 303
    assert r.headers["location"].startswith("/threads/susp?msg=")
    page = client.get(r.headers["location"]).text
    assert "resumed susp: handoff" in page
    assert "approved: (absent) → true" in page  # the history's state diff
    assert _head(store, "susp").status is flowy.RunStatus.HANDOFF


async def _start_expense(url: str) -> None:
    async with flowy.connect(url) as backend:
        runner = flowy.Runner(expense_graph, backend)
        assert (await runner.start("exp", Expense("ann", 500, "laptop"))).resume_token


def test_resume_form_approves_the_first_app_expense(store: Store) -> None:
    asyncio.run(_start_expense(store.url))
    with _client(store.url, expense_graph) as c:
        csrf = _csrf(c.get("/threads/exp").text)
        form = {"thread": "exp", "revision": "2", "csrf": csrf}
        unknown = c.post("/actions/resume", data={**form, "overlay": '{"aproved": true}'})
        page = c.get(unknown.headers["location"]).text
        assert "resume failed: ValueError: the overlay names &#x27;aproved&#x27;" in page
        wrong = c.post("/actions/resume", data={**form, "overlay": '{"amount": "lots"}'})
        page = c.get(wrong.headers["location"]).text
        assert "the overlay does not fit Expense: state.amount: expected int" in page
        overlay = '{"approved": true, "approver": "cli"}'
        r = c.post("/actions/resume", data={**form, "overlay": overlay})
        page = c.get(r.headers["location"]).text
        assert "resumed exp: handoff (payment_queued)" in page

    async def head() -> Any:
        async with flowy.connect(store.url) as backend:
            return (await flowy.Runner(expense_graph, backend).head("exp"))[0].state

    assert asyncio.run(head()) == Expense(
        "ann", 500, "laptop", "ann asks for 500 for 'laptop'", approver="cli", approved=True
    )


def test_an_action_error_is_one_line_on_the_page(client: TestClient) -> None:
    csrf = _csrf(client.get("/threads/susp").text)
    bad = {"thread": "susp", "revision": "1", "overlay": "{not json", "csrf": csrf}
    r = client.post("/actions/resume", data=bad)
    assert r.status_code == 303 and "err=" in r.headers["location"]
    page = client.get(r.headers["location"]).text
    assert "resume failed: ValueError: the overlay is not valid JSON" in page
    assert "Traceback" not in page
    stale = {"thread": "susp", "revision": "1", "overlay": "{}", "csrf": csrf}
    page = client.get(client.post("/actions/resume", data=stale).headers["location"]).text
    assert "resume failed: ConcurrencyConflictError" in page


def test_cancel_and_terminate_actions_ask_for_a_confirmation(
    client: TestClient, store: Store
) -> None:
    page = client.get("/threads/susp").text
    assert "id='cancel-confirm' required" in page and "id='terminate-confirm' required" in page
    csrf = _csrf(page)
    unconfirmed = client.post("/actions/cancel", data={"thread": "susp", "csrf": csrf})
    assert unconfirmed.status_code == 303 and "err=" in unconfirmed.headers["location"]
    page = client.get(unconfirmed.headers["location"]).text
    assert "cancel failed: ValueError: tick the box to confirm the cancel" in page
    assert _head(store, "susp").status is flowy.RunStatus.SUSPENDED
    assert (
        client.post("/actions/cancel", data={"thread": "susp", "confirm": "yes"}).status_code == 403
    )
    form = {"thread": "susp", "confirm": "yes", "csrf": csrf}
    r = client.post("/actions/cancel", data={**form, "reason": HOSTILE})
    assert r.headers["location"].startswith("/threads/susp?msg=")
    page = client.get(r.headers["location"]).text
    assert "canceled susp at revision 3 (was suspended): canceled: &lt;script&gt;" in page
    assert HOSTILE not in page
    snap = _head(store, "susp")
    assert (snap.status, snap.reason) == (flowy.RunStatus.CANCELED, f"canceled: {HOSTILE}")
    assert "id='cancel-confirm'" not in page  # canceled already: only terminate is offered
    r = client.post("/actions/terminate", data=form)
    assert (
        "terminated susp at revision 4 (was canceled): terminated"
        in client.get(r.headers["location"]).text
    )
    assert _head(store, "susp").status is flowy.RunStatus.FAILED
    page = client.get("/threads/susp").text
    assert "id='terminate-confirm'" not in page and "id='cancel-confirm'" not in page
    refused = client.post("/actions/cancel", data=form)
    page = client.get(refused.headers["location"]).text
    assert "cancel failed: ThreadFinishedError: thread &#x27;susp&#x27; is failed" in page


def test_recover_fork_and_requeue_actions(client: TestClient, store: Store) -> None:
    page = client.get("/dead-letters").text
    assert "/threads/dead" in page and "/threads/orph" in page
    message = re.search(r"name='message' value='([^']+)'", page)
    assert message is not None
    csrf = _csrf(page)
    r = client.post(
        "/actions/recover", data={"thread": "orph", "back": "dead-letters", "csrf": csrf}
    )
    assert r.headers["location"].startswith("/dead-letters?msg=")
    assert "re-enqueued the hand-off of orph" in client.get(r.headers["location"]).text
    assert _head(store, "orph").handoff_status is flowy.HandoffStatus.ENQUEUED

    r = client.post(
        "/actions/fork",
        data={"thread": "susp", "revision": "1", "new_thread": "copy", "csrf": csrf},
    )
    assert r.headers["location"].startswith("/threads/copy?msg=")
    page = client.get(r.headers["location"]).text
    assert "forked susp@1 into copy" in page and "forked from" in page

    r = client.post("/actions/requeue", data={"message": message.group(1), "csrf": csrf})
    page = client.get(r.headers["location"]).text
    assert f"requeued dead letter {message.group(1)}" in page and "no dead letters" in page
    r = client.post("/actions/requeue", data={"message": "no-such-id", "csrf": csrf})
    assert "requeue failed: KeyError" in client.get(r.headers["location"]).text


def test_hostile_content_is_escaped(client: TestClient) -> None:
    for path in ("/", "/threads/%3Cscript%3Ealert(1)%3C%2Fscript%3E", "/dead-letters"):
        page = client.get(path).text
        assert "<script>" not in page
    page = client.get("/threads/%3Cscript%3Ealert(1)%3C%2Fscript%3E").text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script>" not in client.get("/?node=<script>").text
    msg = client.get("/?msg=<script>x</script>&err=<b>e</b>").text
    assert "<script>" not in msg and "&lt;b&gt;e&lt;/b&gt;" in msg


def test_actions_on_a_hostile_thread_stay_escaped(client: TestClient) -> None:
    csrf = _csrf(client.get("/dead-letters").text)
    evil = "<img src=x onerror=alert(2)>"
    r = client.post(
        "/actions/fork",
        data={"thread": HOSTILE, "revision": "1", "new_thread": evil, "csrf": csrf},
    )
    location = r.headers["location"]
    assert location.startswith("/threads/%3Cimg%20src%3Dx") and "<" not in location
    page = client.get(location).text
    assert "<img" not in page and "<script>" not in page
    assert "&lt;img src=x onerror=alert(2)&gt;" in page


def test_missing_starlette_is_one_line_and_exit_2(
    db: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "starlette", None)
    code = main(["ui", "--db", str(db), "--graph", "core_graphs:approval_graph"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and 'pip install "flowy-core[ui]"' in err


# ------------------------------------------------------------ hosts, cookies, failures


def test_the_cookie_is_named_after_the_port(db: Path) -> None:
    with _client(f"sqlite:///{db}", token=False) as c:
        r = c.get(f"/?token={TOKEN}")
        cookie = r.headers["set-cookie"]
        assert cookie.startswith(f"flowy_ui_token_{PORT}={TOKEN};"), cookie
        assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()
        # Another inspector's cookie (another port) opens nothing here.
        c.cookies.clear()
        c.cookies.set(cookie_name(PORT + 1), TOKEN)
        assert c.get("/").status_code == 403


@pytest.mark.parametrize(
    ("host", "status"),
    [
        (f"127.0.0.1:{PORT}", 200),
        (f"localhost:{PORT}", 200),
        (f"LOCALHOST:{PORT}", 200),
        (f"evil.example:{PORT}", 400),
        ("127.0.0.1:9999", 400),
        ("127.0.0.1", 400),
        (f"127.0.0.2:{PORT}", 400),
        ("", 400),
        ("[::1", 400),
    ],
)
def test_a_request_for_another_host_is_refused(db: Path, host: str, status: int) -> None:
    with _client(f"sqlite:///{db}") as c:
        assert c.get("/", headers={"host": host}).status_code == status
        csrf = _csrf(c.get("/threads/susp").text)
        data = {"thread": "susp", "revision": "2", "overlay": "{}", "csrf": csrf}
        posted = c.post("/actions/resume", data=data, headers={"host": host})
        assert posted.status_code == (303 if status == 200 else 400)


def test_an_inspector_on_every_interface_checks_only_the_port(db: Path) -> None:
    async def opened(scope: Scope, receive: Receive, send: Send) -> None:
        async with flowy.connect(f"sqlite:///{db}") as backend:
            app = build_app(backend, approval_graph(), token=TOKEN, host="0.0.0.0", port=PORT)
            await app(scope, receive, send)

    with TestClient(opened, base_url=BASE) as c:
        c.cookies.set(COOKIE, TOKEN)
        assert c.get("/", headers={"host": f"box.lan:{PORT}"}).status_code == 200
        assert c.get("/", headers={"host": "box.lan:80"}).status_code == 400


def test_a_page_that_fails_shows_one_line_and_logs_the_traceback_at_debug(
    db: Path, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    async def corrupt() -> None:
        async with flowy.connect(f"sqlite:///{db}") as backend:
            await corrupt_head(backend, "susp")

    asyncio.run(corrupt())
    with caplog.at_level("DEBUG", logger="flowy.cli.ui"), _client(f"sqlite:///{db}") as c:
        r = c.get("/threads/susp")
    assert r.status_code == 500
    assert "SnapshotEnvelopeInvalidError" in r.text and "Traceback" not in r.text
    assert "id='err'" in r.text
    [record] = [rec for rec in caplog.records if rec.name == "flowy.cli.ui"]
    assert record.levelname == "DEBUG" and record.exc_info is not None
    assert "Traceback" not in capfd.readouterr().err


def test_far_future_times_are_shown_without_failing() -> None:
    assert _when(253402300799.0).startswith("9999-12-31") or _when(253402300799.0).startswith(
        "10000"
    )
    for far in (1e30, float("inf"), float("nan"), -1e30):
        assert isinstance(_when(far), str)
        assert isinstance(_in(far), str)
    assert _in(90.0) == "in 1 min" and _in(30.0) == "in 30 s" and _in(7200.0) == "in 2 h"


BIDI = "\u202eevil\u202c"
CONTROL = "bell\x07esc\x1b[31mred"


def test_control_and_bidi_characters_are_shown_escaped(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'bidi.db'}"

    async def fill() -> None:
        async with flowy.connect(url) as backend:
            runner = flowy.Runner(approval_graph(), backend, run_lease=("setup", 5.0))
            await runner.start(BIDI, {"note": CONTROL, BIDI: 1})
            dead = await runner.start(CONTROL, {})
            assert dead.resume_token is not None
            await runner.resume(dead.resume_token, state_overlay={"approved": True})
            for _ in range(100):
                if await backend.consumer.dead_letters():
                    break
                for message in await backend.consumer.claim(10, 30.0):
                    await backend.consumer.release(message, error=f"failed {BIDI} {CONTROL}")

    asyncio.run(fill())
    with _client(url) as c:
        pages = [
            c.get("/"),
            c.get("/threads/" + urllib.parse.quote(BIDI, safe="")),
            c.get("/threads/" + urllib.parse.quote(CONTROL, safe="")),
            c.get("/dead-letters"),
            c.get("/threads/" + urllib.parse.quote("nope" + BIDI, safe="")),
            c.get("/?" + urllib.parse.urlencode({"node": BIDI, "err": BIDI, "msg": CONTROL})),
        ]
    assert [p.status_code for p in pages] == [200, 200, 200, 200, 404, 200]
    for page in pages:
        for raw in ("\u202e", "\u202c", "\x07", "\x1b"):
            assert raw not in page.text, (page.url, repr(raw))
    assert "\\u202eevil" in pages[0].text and "\\u202eevil" in pages[1].text
    assert "\\x1b[31mred" in pages[2].text or "\\u001b[31mred" in pages[2].text
    assert "\\u202eevil" in pages[3].text


def test_a_long_timeline_shows_the_latest_revisions_and_says_so(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'long.db'}"

    async def fill() -> None:
        async with flowy.connect(url) as backend:
            snap = flowy.storage.Snapshot[Any](
                thread_id="long", state={"n": 0}, execution_pointer="ask"
            )
            for n in range(205):
                await backend.checkpointer.save(n, replace(snap, state={"n": n}))

    asyncio.run(fill())
    with _client(url) as c:
        page = c.get("/threads/long").text
    timeline = page[page.index("id='timeline'") : page.index("<h2>Activity journal")]
    revisions = re.findall(r"<tr><td class='num'>(\d+)</td>", timeline)
    assert revisions == [str(n) for n in range(205, 5, -1)]
    assert "the latest 200 revisions" in timeline


def _outcome(client: TestClient, action: str, data: dict[str, Any]) -> str:
    """The outcome line of a POST to ``action``: its redirect's page, flash only."""
    r = client.post(f"/actions/{action}", data=data)
    assert r.status_code == 303, r.text
    page = client.get(r.headers["location"]).text
    found = re.search(r'<p class="(?:msg|err)" id="(?:msg|err)">([^<]*)</p>', page)
    assert found is not None, page[:500]
    return found.group(1)


@pytest.mark.parametrize(
    ("action", "data"),
    [
        ("signal", {"thread": "susp", "signal": "nudge", "payload": "1"}),
        ("fork", {"thread": "susp", "revision": "1", "new_thread": "copy"}),
        ("requeue-many", {"which": "all", "confirm": "yes"}),
    ],
)
def test_the_new_actions_need_post_the_token_and_the_csrf_value(
    store: Store, action: str, data: dict[str, str]
) -> None:
    with _client(store.url, token=False) as c:
        assert c.post(f"/actions/{action}", data=data).status_code == 403  # no token
        c.cookies.set(COOKIE, TOKEN)
        csrf = _csrf(c.get("/threads/susp").text)
        assert c.post(f"/actions/{action}", data=data).status_code == 403  # no CSRF
        assert c.post(f"/actions/{action}", data={**data, "csrf": "x"}).status_code == 403
        query = {**data, "csrf": csrf, "token": TOKEN}
        assert c.get(f"/actions/{action}", params=query).status_code == 405
        assert "nudge" not in c.get("/threads/susp").text  # nothing was sent,
        assert c.get("/threads/copy").status_code == 404  # forked,
        assert "no dead letters" not in c.get("/dead-letters").text  # or requeued


def test_a_signal_is_kept_or_wakes_a_waiting_thread_or_is_refused(store: Store) -> None:
    asyncio.run(_start_paying(store.url))
    with _client(store.url, _paying_graph()) as c:
        page = c.get("/threads/payer").text
        assert "id='signal-name' value='approval'" in page  # what it waits for
        csrf = _csrf(page)
        form = {"thread": "payer", "csrf": csrf}
        text = _outcome(c, "signal", {**form, "signal": "other", "payload": '{"n": 1}'})
        assert re.fullmatch(
            r"signal &#x27;other&#x27; #1 \(id \w+\) sent to payer; kept until the thread "
            r"waits for it",
            text,
        ), text
        text = _outcome(c, "signal", {**form, "signal": "approval"})
        assert text.endswith(
            "sent to payer; the thread waits for it at revision 1: a worker resumes it, "
            "and its new revision shows here"
        ), text
        page = c.get("/threads/payer").text
        signals = page[page.index("id='signals'") :]
        assert "<td>other</td>" in signals and "<td>approval</td>" in signals
        for data, error in (
            ({"signal": "x", "payload": "{nope"}, "ValueError: the payload is not valid JSON"),
            ({"signal": " "}, "ValueError: give the signal&#x27;s name"),
            ({"signal": "a\x00b"}, "ValueError: signal name must not contain NUL"),
        ):
            assert _outcome(c, "signal", {**form, **data}).startswith(f"signal failed: {error}")
        missing = _outcome(c, "signal", {**form, "thread": "nobody", "signal": "x"})
        assert missing.startswith("signal failed: ThreadNotFoundError")
    # A finished thread has no signal form, and a signal to it is refused.
    with _client(store.url) as c:
        csrf = _csrf(c.get("/threads/susp").text)
        _outcome(c, "terminate", {"thread": "susp", "confirm": "yes", "csrf": csrf})
        assert "id='signal-name'" not in c.get("/threads/susp").text
        refused = _outcome(c, "signal", {"thread": "susp", "signal": "x", "csrf": csrf})
        assert refused.startswith("signal failed: ThreadCompletedError: thread &#x27;susp")


def test_the_fork_form_offers_every_revision_and_the_timeline_chooses_one(
    client: TestClient, store: Store
) -> None:
    page = client.get("/threads/susp").text
    head = _head(store, "susp")
    revision = max(int(r) for r in re.findall(r"id='fork-at-(\d+)'", page))
    assert re.findall(r"id='fork-at-(\d+)'", page) == [str(n) for n in range(revision, 0, -1)]
    assert f"<option value='{revision}' selected>{revision} · {head.execution_pointer}" in page
    assert "href='?fork=1#fork'" in page
    chosen = client.get("/threads/susp?fork=1").text
    assert "<option value='1' selected>" in chosen
    assert f"<option value='{revision}' selected>" not in chosen
    assert f"<option value='{revision}' selected>" in client.get("/threads/susp?fork=x").text
    csrf = _csrf(page)
    form = {"thread": "susp", "revision": "1", "new_thread": "at-one", "csrf": csrf}
    r = client.post("/actions/fork", data=form)
    assert r.headers["location"].startswith("/threads/at-one?msg=")
    child = client.get(r.headers["location"]).text
    assert "forked susp@1 into at-one" in child
    assert "<a href='/threads/susp'>susp</a>@<span class='num'>1</span>" in child
    again = _outcome(client, "fork", form)
    assert again.startswith("fork failed: ConcurrencyConflictError"), again


async def _bury_another(url: str) -> list[str]:
    """Add a second dead letter (``dead2``'s hand-off); the dead letters' ids."""
    async with flowy.connect(url) as backend:
        runner = flowy.Runner(approval_graph(), backend, run_lease=("setup", 5.0))
        started = await runner.start("dead2", {})
        assert started.resume_token is not None
        await runner.resume(started.resume_token, state_overlay={"approved": True})
        for _ in range(backend.consumer.max_attempts):
            for message in await backend.consumer.claim(10, 30.0):
                await backend.consumer.release(message, error="down")
        return [d.message_id for d in await backend.consumer.dead_letters()]


def test_dead_letters_are_requeued_in_bulk_once_confirmed(client: TestClient, store: Store) -> None:
    first, second = asyncio.run(_bury_another(store.url))
    page = client.get("/dead-letters").text
    assert "id='requeue-confirm' required" in page and "Requeue all (2)" in page
    assert f"name='letter' value='{first}' form='requeue-many'" in page
    csrf = _csrf(page)
    for data, error in (
        ({"which": "all"}, "tick the box to confirm the requeue; nothing was done"),
        ({"which": "checked", "confirm": "yes"}, "check the dead letters to requeue"),
        ({"which": "some", "confirm": "yes"}, "requeue &#x27;all&#x27; or &#x27;checked&#x27;"),
    ):
        text = _outcome(client, "requeue-many", {**data, "csrf": csrf})
        assert text.startswith(f"requeue-many failed: ValueError: {error}"), text
    assert "Requeue all (2)" in client.get("/dead-letters").text  # nothing was done
    # Checked ones: each "letter" field is one; one that is no dead letter is named.
    body = urllib.parse.urlencode(
        [
            ("which", "checked"),
            ("confirm", "yes"),
            ("csrf", csrf),
            ("letter", first),
            ("letter", "no-such-letter"),
        ]
    )
    headers = {"content-type": "application/x-www-form-urlencoded"}
    r = client.post("/actions/requeue-many", content=body, headers=headers)
    text = re.search(r'id="msg">([^<]*)<', client.get(r.headers["location"]).text)
    assert text is not None
    assert text.group(1) == (
        f"requeued 1 of 2 dead letter(s) (id {first}); not requeued: id no-such-letter "
        "(no longer a dead letter)"
    )
    text = _outcome(client, "requeue-many", {"which": "all", "confirm": "yes", "csrf": csrf})
    assert text == f"requeued 1 of 1 dead letter(s) (id {second})"
    assert "no dead letters" in client.get("/dead-letters").text
    assert "id='requeue-many'" not in client.get("/dead-letters").text


def test_the_thread_stream_follows_the_store_s_watch(client: TestClient, store: Store) -> None:
    page = client.get("/threads/susp").text
    revision = _head(store, "susp")
    head = int(re.findall(r"id='revision'>(\d+)<", page)[0])
    assert f"data-events='/events/susp?after={head}'" in page
    assert revision.status is flowy.RunStatus.SUSPENDED
    csrf = _csrf(page)
    _outcome(client, "terminate", {"thread": "susp", "confirm": "yes", "csrf": csrf})
    # A finished thread's stream ends: every snapshot after the one asked for, then "end".
    stream = client.get("/events/susp?after=1")
    assert stream.status_code == 200
    assert stream.headers["content-type"].startswith("text/event-stream")
    ids = re.findall(r"^id: (\d+)$", stream.text, re.MULTILINE)
    assert ids == [str(n) for n in range(2, head + 2)]
    assert '"status": "failed"' in stream.text
    assert stream.text.endswith("event: end\ndata: {}\n\n")
    # A browser that saw the end reconnects with its last id: 204 stops it.
    seen = {"last-event-id": str(head + 1)}
    assert client.get("/events/susp", headers=seen).status_code == 204
    assert client.get("/events/susp?after=-1").status_code == 400
    assert client.get("/events/nobody?after=0").status_code == 404
    client.cookies.clear()
    assert client.get("/events/susp?after=1").status_code == 403


class _Unwatched:
    """A store object without ``watch`` (a ``Backend`` from before it had one)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        if name == "watch":
            raise AttributeError(name)
        return getattr(self._inner, name)


def test_a_store_without_watch_keeps_the_periodic_refresh(db: Path) -> None:
    async def page() -> tuple[bool, str, int]:
        async with flowy.connect(f"sqlite:///{db}") as backend:
            store: Any = _Unwatched(backend)
            app = build_app(store, approval_graph(), token=TOKEN, host="127.0.0.1", port=PORT)
            ui = app.state.inspector
            headers = {"cookie": f"{COOKIE}={TOKEN}", "host": f"127.0.0.1:{PORT}"}
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url=BASE) as http:
                text = (await http.get("/threads/susp", headers=headers)).text
                events = await http.get("/events/susp?after=1", headers=headers)
            return ui.watching, text, events.status_code

    watching, text, status = asyncio.run(page())
    assert not watching
    assert "data-events" not in text and "data-refresh='3'" in text
    assert status == 404


def test_a_bulk_requeue_names_the_letters_it_could_not_requeue_and_goes_on(
    store: Store,
) -> None:
    first, second = asyncio.run(_bury_another(store.url))
    faulty: list[FaultyBackend[Any]] = []

    def wrap(backend: Any) -> Any:
        faulty.append(FaultyBackend(backend))
        return faulty[0]

    with _client(store.url, wrap=wrap) as c:
        csrf = _csrf(c.get("/dead-letters").text)
        faulty[0].arm(Phase.RETRY_DEAD_LETTER)  # the store is down for the first
        text = _outcome(c, "requeue-many", {"which": "all", "confirm": "yes", "csrf": csrf})
        assert text.startswith(
            f"requeued 1 of 2 dead letter(s) (id {second}); not requeued: id {first} "
            "(StorageUnavailableError: "
        ), text
        page = c.get("/dead-letters").text
    assert f"name='letter' value='{first}'" in page and "Requeue all (1)" in page


async def _until(done: Callable[[], bool]) -> None:
    """Wait until ``done()`` (a minute at most: the caller's timeout then fails)."""
    for _ in range(6000):
        if done():
            return
        await asyncio.sleep(0.01)


def test_a_stream_carries_a_save_made_while_it_is_open_and_ends_when_the_inspector_stops(
    db: Path,
) -> None:
    async def follow() -> tuple[str, str]:
        async with flowy.connect(f"sqlite:///{db}") as backend:
            app = build_app(backend, approval_graph(), token=TOKEN, host="127.0.0.1", port=PORT)
            ui = app.state.inspector
            headers = {"cookie": f"{COOKIE}={TOKEN}", "host": f"127.0.0.1:{PORT}"}
            _, revision = await backend.checkpointer.load("susp")
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url=BASE) as http:

                async def terminate_once_followed() -> None:
                    await _until(lambda: ui.streams == 1)
                    await flowy.Runner(approval_graph(), backend).terminate("susp")

                # The stream ends by itself after the snapshot of the finished run.
                watched, _ = await asyncio.wait_for(
                    asyncio.gather(
                        http.get(f"/events/susp?after={revision}", headers=headers),
                        terminate_once_followed(),
                    ),
                    60,
                )
                # One that would go on ends when the inspector stops.
                await flowy.Runner(approval_graph(), backend).start("later", {})
                _, at = await backend.checkpointer.load("later")

                async def stop_once_followed() -> None:
                    await _until(lambda: ui.streams == 2)
                    await ui.stop_actions()

                stopped, _ = await asyncio.wait_for(
                    asyncio.gather(
                        http.get(f"/events/later?after={at}", headers=headers),
                        stop_once_followed(),
                    ),
                    60,
                )
        return watched.text, stopped.text

    watched, stopped = asyncio.run(follow())
    events = watched.split("\n\n")
    assert events[0] == "retry: 3000"
    assert events[1].startswith("id: 3\nevent: snapshot\ndata: {")
    assert '"status": "failed", "reason": "terminated"' in events[1]
    assert events[-2:] == ["event: end\ndata: {}", ""]
    assert stopped == "retry: 3000\n\n"
