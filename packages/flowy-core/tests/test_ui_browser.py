"""``flowy ui`` in a real browser: Selenium drives the system's headless Chromium against
the app served by uvicorn on a free port, on every store (``stores_support.py``), each
filled by ``cli_support.populate`` (a suspended approval thread, a hand-off, an orphaned
hand-off, and a dead letter).

Chromium and its driver come from the system (``apt-get install chromium
chromium-driver``); nothing is downloaded here. Without them the tests skip, unless
``FLOWY_REQUIRE_BROWSER=1`` (CI), where their absence fails.

Every page is saved as a screenshot 1280 px and 390 px wide, as tall as it is, under
``.artifacts/ui-screenshots/STORE/`` (``FLOWY_UI_SCREENSHOTS=DIR`` puts them under DIR
instead): ``threads``, ``thread``, ``thread-advanced``, ``thread-watched``,
``thread-signal``, ``thread-signal-refused``, ``thread-fork-chosen``, ``thread-forked``,
``dead-letters``, ``dead-letters-checked``, ``dead-letters-requeued`` and
``threads-page-2``, each ``-1280.png`` and ``-390.png``, and the first three in dark
mode too (``thread-dark-1280.png``, ...). ``docs/images`` holds the
SQLite ones at 1280 px (``thread-advanced`` as ``ui-thread.png``, which the README
shows too).
"""

from __future__ import annotations

import asyncio
import base64
import os
import re
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cli_support import require_ui_extra

require_ui_extra("starlette", "uvicorn", "selenium")

import httpx
import uvicorn
from cli_support import DEAD_ERROR, GRAPH, Threads, populate, run_flowy
from core_graphs import approval_graph
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.select import Select
from selenium.webdriver.support.wait import WebDriverWait
from stores_support import ALL_STORES, Store, environment, fresh_store
from stores_support import dynamodb_endpoint as dynamodb_endpoint  # a fixture

import flowy
from flowy.cli._ui import build_app
from flowy.cli._ui_pages import Inspector

TOKEN = "browser-test-token"
CHROMIUM = os.environ.get("FLOWY_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("FLOWY_CHROMEDRIVER", "/usr/bin/chromedriver")
ROOT = Path(__file__).resolve().parents[3]
SHOTS = Path(os.environ.get("FLOWY_UI_SCREENSHOTS") or ROOT / ".artifacts" / "ui-screenshots")
WIDTHS = (1280, 390)
LIVE = 1.0  # seconds between live refreshes in the test of them
QUIET = 600.0  # and in the others, whose elements a refresh would replace under them
WAIT = 30  # seconds a page may take to show what a test waits for, on a loaded machine


def _missing_browser() -> str | None:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            found = shutil.which(Path(path).name)
            return f"{path} is not installed ({found or 'not on PATH either'}): " + (
                "apt-get install chromium chromium-driver"
            )
    return None


def _chromium() -> webdriver.Chrome:
    missing = _missing_browser()
    if missing is not None:
        if os.environ.get("FLOWY_REQUIRE_BROWSER") == "1":
            pytest.fail(f"FLOWY_REQUIRE_BROWSER=1 but {missing}")
        pytest.skip(missing)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,1000",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    return driver


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    driver = _chromium()
    try:
        yield driver
    finally:
        driver.quit()


async def _head(url: str, thread: str) -> flowy.storage.Snapshot[Any]:
    async with flowy.connect(url) as backend:
        snap, _ = await flowy.Runner(approval_graph(), backend).head(thread)
        return snap


def _screenshot(browser: webdriver.Chrome, store: str, name: str) -> None:
    """Save the page as it is, as tall as it is, 1280 and 390 px wide, as
    ``SHOTS/STORE/NAME-WIDTH.png``."""
    for width in WIDTHS:
        screen = {"width": width, "height": 800, "deviceScaleFactor": 1, "mobile": width < 500}
        browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", screen)
        try:
            height = browser.execute_script(
                "return Math.max(document.documentElement.scrollHeight, 200)"
            )
            clip = {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}
            shot = browser.execute_cdp_cmd(
                "Page.captureScreenshot",
                {"format": "png", "captureBeyondViewport": True, "clip": clip},
            )
        finally:
            browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
        path = SHOTS / store / f"{name}-{width}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Served:
    """The app, served over a store filled by ``populate``."""

    url: str  # where the app answers
    store: Store  # the store
    threads: Threads  # what populate made
    inspector: Inspector  # the app's pages and actions

    def open(self, browser: webdriver.Chrome, path: str) -> None:
        joiner = "&" if "?" in path else "?"
        browser.get(f"{self.url}{path}{joiner}token={TOKEN}")


@pytest.fixture(params=ALL_STORES)
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    """The app on a free port, in a thread of its own (its own event loop and backend),
    over each store."""
    with fresh_store(request, "uib") as store, environment(store):
        threads = asyncio.run(populate(store.url))
        port = _free_port()
        config = uvicorn.Config(
            app="", host="127.0.0.1", port=port, log_level="warning", lifespan="off"
        )
        server = uvicorn.Server(config)
        inspectors: list[Inspector] = []
        loops: list[asyncio.AbstractEventLoop] = []

        async def serve() -> None:
            async with flowy.connect(store.url) as backend:
                config.app = app = build_app(
                    backend,
                    approval_graph(),
                    token=TOKEN,
                    host="127.0.0.1",
                    port=port,
                    store=store.url,
                    refresh=LIVE if "live_update" in request.node.name else QUIET,
                )
                inspectors.append(app.state.inspector)
                loops.append(asyncio.get_running_loop())
                await server.serve()

        thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.05)
        try:
            yield Served(f"http://127.0.0.1:{port}", store, threads, inspectors[0])
        finally:
            # As flowy ui does on Ctrl-C: end the event streams, then stop serving.
            stopped = asyncio.run_coroutine_threadsafe(inspectors[0].stop_actions(), loops[0])
            stopped.result(10)
            server.should_exit = True
            thread.join(10)


def _rows(browser: webdriver.Chrome, table: str) -> list[list[str]]:
    return [
        [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
        for tr in browser.find_elements(By.CSS_SELECTOR, f"#{table} tbody tr")
    ]


def test_the_fleet_page_counts_lists_and_names_the_store(
    browser: webdriver.Chrome, served: Served
) -> None:
    served.open(browser, "/")
    assert "token" not in browser.current_url  # traded for a cookie
    port = served.url.rsplit(":", 1)[1]
    assert browser.get_cookie(f"flowy_ui_token_{port}") is not None
    header = browser.find_element(By.TAG_NAME, "header").text
    assert flowy.storage.redact_url(served.store.url) in header
    assert f"flowy {flowy.__version__}" in header
    # Most recently saved first, to the second, then by id (descending).
    rows = _rows(browser, "threads")
    assert sorted((r[0], r[1], r[3]) for r in rows) == [
        ("dl", "handoff", "act"),
        ("ho", "handoff", "act"),
        ("orph", "handoff", "act"),
        ("susp", "suspended", "ask"),
    ]
    saved = [
        tr.find_elements(By.TAG_NAME, "td")[6].find_element(By.TAG_NAME, "time")
        for tr in browser.find_elements(By.CSS_SELECTOR, "#threads tbody tr")
    ]
    order = [(t.get_attribute("title") or "", r[0]) for t, r in zip(saved, rows, strict=True)]
    assert order == sorted(order, reverse=True)
    assert all(r[6].endswith("ago") or r[6] == "just now" for r in rows)
    updated = browser.find_element(By.CSS_SELECTOR, "#threads tbody tr time")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", updated.get_attribute("title") or "")
    statuses = browser.find_element(By.ID, "by-status").text
    assert "4\nall threads" in statuses and "3\nhandoff" in statuses
    assert "1\nsuspended" in statuses
    assert "1\ndead letters" in browser.find_element(By.ID, "backlog").text
    _screenshot(browser, served.store.name, "threads")
    _readable_narrow_and_dark(browser, served.store.name, "threads")
    # A count is a link to the list of those threads.
    browser.find_element(By.XPATH, "//div[@id='by-status']//a[contains(., 'suspended')]").click()
    WebDriverWait(browser, WAIT).until(expected_conditions.url_contains("status=suspended"))
    assert [r[0] for r in _rows(browser, "threads")] == ["susp"]
    browser.find_element(By.XPATH, "//div[@id='by-node']//a[contains(., 'act')]").click()
    WebDriverWait(browser, WAIT).until(expected_conditions.url_contains("node=act"))
    assert sorted(r[0] for r in _rows(browser, "threads")) == ["dl", "ho", "orph"]
    browser.find_element(By.LINK_TEXT, "orph").click()
    WebDriverWait(browser, WAIT).until(expected_conditions.url_contains("/threads/orph"))
    assert browser.find_element(By.ID, "status").text == "handoff"


def test_the_thread_page_tells_the_story(browser: webdriver.Chrome, served: Served) -> None:
    served.open(browser, "/threads/susp")
    assert browser.find_element(By.ID, "status").text == "suspended"
    current = browser.find_elements(By.CSS_SELECTOR, "#graph g.current")
    assert [g.get_attribute("data-node") for g in current] == ["ask"]
    visited = browser.find_elements(By.CSS_SELECTOR, "#graph g.visited")
    assert {g.get_attribute("data-node") for g in visited} == {"plan", "ask"}
    assert '"planned": true' in browser.find_element(By.ID, "state").text
    timeline = _rows(browser, "timeline")
    assert [r[0] for r in timeline] == [str(n) for n in range(served.threads.susp_revision, 0, -1)]
    assert timeline[0][3:6] == ["ask", "suspended", "awaiting_approval"]
    # The effect appears once, at the revision that emitted it.
    effects = [r[0] for r in timeline if r[6]]
    assert effects == [str(served.threads.susp_revision)]
    _screenshot(browser, served.store.name, "thread")
    # State changes are folded until opened.
    diff = browser.find_element(By.CSS_SELECTOR, "#timeline details")
    assert not diff.find_element(By.XPATH, "./*[not(self::summary)]").is_displayed()
    diff.find_element(By.TAG_NAME, "summary").click()
    assert diff.find_element(By.XPATH, "./*[not(self::summary)]").is_displayed()
    head = browser.find_element(By.ID, "head-json")
    assert not head.find_element(By.TAG_NAME, "pre").is_displayed()
    head.find_element(By.TAG_NAME, "summary").click()
    assert '"thread_id": "susp"' in head.find_element(By.TAG_NAME, "pre").text
    assert approval_graph().version in browser.find_element(By.ID, "graph-version").text
    assert "no pending timers" in browser.find_element(By.ID, "live").text
    _readable_narrow_and_dark(browser, served.store.name, "thread")


def _readable_narrow_and_dark(browser: webdriver.Chrome, store: str, name: str) -> None:
    """At 390 px the page does not scroll sideways (wide tables and the graph scroll in
    their own box); with the system in dark mode the page is dark, saved as
    ``NAME-dark-WIDTH.png``."""
    narrow = {"width": 390, "height": 800, "deviceScaleFactor": 1, "mobile": True}
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", narrow)
    try:
        wide = browser.execute_script("return document.documentElement.scrollWidth")
        assert wide <= 390, f"the page is {wide} px wide at 390 px"
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    background = "return getComputedStyle(document.body).backgroundColor"
    light = browser.execute_script(background)
    dark = {"features": [{"name": "prefers-color-scheme", "value": "dark"}]}
    browser.execute_cdp_cmd("Emulation.setEmulatedMedia", dark)
    try:
        shade = browser.execute_script(background)
        assert shade != light
        red, green, blue = (int(c) for c in re.findall(r"\d+", shade)[:3])
        assert red + green + blue < 150, shade
        _screenshot(browser, store, f"{name}-dark")
    finally:
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})


def test_the_approval_form_resumes_the_run(browser: webdriver.Chrome, served: Served) -> None:
    served.open(browser, "/threads/susp")
    overlay = browser.find_element(By.ID, "overlay")
    overlay.clear()
    overlay.send_keys('{"approved": true}')
    overlay.find_element(By.XPATH, "./ancestor::form//button").click()
    # The POST answers 303 back to the thread page, with the outcome on one line.
    message = WebDriverWait(browser, WAIT).until(
        expected_conditions.presence_of_element_located((By.ID, "msg"))
    )
    assert "resumed susp: handoff" in message.text
    assert browser.find_element(By.ID, "status").text == "handoff"
    assert '"approved": true' in browser.find_element(By.ID, "state").text
    head = asyncio.run(_head(served.store.url, "susp"))
    assert head.status in (flowy.RunStatus.HANDOFF, flowy.RunStatus.COMPLETED)
    assert head.state["approved"] is True


def test_a_fork_from_the_thread_page_links_back_to_its_parent(
    browser: webdriver.Chrome, served: Served
) -> None:
    served.open(browser, "/threads/susp")
    revision = Select(browser.find_element(By.ID, "fork-revision"))
    assert revision.first_selected_option.get_attribute("value") == str(
        served.threads.susp_revision
    )  # the head, unless the timeline chose another
    revision.select_by_value("1")
    browser.find_element(By.NAME, "new_thread").send_keys("susp-copy")
    browser.find_element(By.XPATH, "//button[text()='Fork']").click()
    message = WebDriverWait(browser, WAIT).until(
        expected_conditions.presence_of_element_located((By.ID, "msg"))
    )
    assert message.text.startswith("forked susp@1 into susp-copy")
    assert browser.current_url.split("?")[0].endswith("/threads/susp-copy")
    lineage = browser.find_element(By.ID, "lineage")
    assert lineage.text == "susp@1"
    lineage.find_element(By.LINK_TEXT, "susp").click()
    WebDriverWait(browser, WAIT).until(expected_conditions.url_contains("/threads/susp"))
    assert browser.find_element(By.ID, "status").text == "suspended"


def _approve_elsewhere(served: Served) -> None:
    """Approve ``susp`` from another process (a thread of this one for a memory store,
    which lives in this process only), as an operator's terminal would."""
    revision = served.threads.susp_revision
    if served.store.name == "memory":

        async def approve() -> None:
            async with flowy.connect(served.store.url) as backend:
                await flowy.Runner(approval_graph(), backend).resume(
                    flowy.storage.ResumeToken("susp", revision), state_overlay={"approved": True}
                )

        threading.Thread(target=asyncio.run, args=(approve(),)).start()
        return
    proc = run_flowy(
        "resume",
        f"susp@{revision}",
        "--backend",
        served.store.url,
        "--graph",
        GRAPH,
        "--overlay",
        '{"approved": true}',
        env=served.store.env,
    )
    assert proc.returncode == 0, proc.stderr


def test_a_live_update_appears_with_javascript_off_by_a_plain_refresh(
    browser: webdriver.Chrome, served: Served
) -> None:
    browser.execute_cdp_cmd("Emulation.setScriptExecutionDisabled", {"value": True})
    try:
        served.open(browser, "/threads/susp")
        assert browser.find_element(By.ID, "status").text == "suspended"
        _approve_elsewhere(served)
        WebDriverWait(browser, WAIT).until(
            expected_conditions.text_to_be_present_in_element((By.ID, "status"), "handoff")
        )
        # No script ran (it would have written "updated" there): the page reloaded.
        assert browser.find_element(By.ID, "updated").text.startswith("live: every")
    finally:
        browser.execute_cdp_cmd("Emulation.setScriptExecutionDisabled", {"value": False})


def test_a_live_update_appears_while_another_process_advances_the_thread(
    browser: webdriver.Chrome, served: Served
) -> None:
    served.open(browser, "/threads/susp")
    assert browser.find_element(By.ID, "status").text == "suspended"
    browser.execute_script("window.notReloaded = true")
    _approve_elsewhere(served)
    WebDriverWait(browser, WAIT).until(
        expected_conditions.text_to_be_present_in_element((By.ID, "status"), "handoff")
    )
    assert browser.execute_script("return window.notReloaded") is True  # in place
    assert "updated" in browser.find_element(By.ID, "updated").text
    current = browser.find_elements(By.CSS_SELECTOR, "#graph g.current")
    assert [g.get_attribute("data-node") for g in current] == ["act"]
    _screenshot(browser, served.store.name, "thread-advanced")


def test_the_list_pages_through_250_threads_and_search_finds_one(
    browser: webdriver.Chrome, served: Served
) -> None:
    async def fill() -> None:
        async with flowy.connect(served.store.url) as backend:
            base = time.time() - 10_000
            for i in range(250):
                snap: flowy.storage.Snapshot[Any] = flowy.storage.Snapshot(
                    thread_id=f"bulk-{i:03d}",
                    state={"n": i},
                    execution_pointer="ask",
                    status=flowy.RunStatus.SUSPENDED,
                    reason="awaiting_approval",
                    updated_at=base + i,
                )
                await backend.checkpointer.save(0, snap)

    asyncio.run(fill())
    served.open(browser, "/?q=bulk-")
    seen: list[str] = []
    pages = 0
    while True:
        pages += 1
        seen += [r[0] for r in _rows(browser, "threads")]
        if pages == 2:
            _screenshot(browser, served.store.name, "threads-page-2")
        links = browser.find_elements(By.ID, "next")
        if not links:
            break
        links[0].click()
        WebDriverWait(browser, WAIT).until(expected_conditions.staleness_of(links[0]))
    assert pages == 5
    assert seen == [f"bulk-{i:03d}" for i in range(249, -1, -1)]  # newest first, each once
    assert browser.find_element(By.ID, "shown").text == "201–250 of 250"
    # Search by id prefix, from the form.
    served.open(browser, "/")
    box = browser.find_element(By.ID, "f-q")
    box.send_keys("bulk-12")
    box.submit()
    WebDriverWait(browser, WAIT).until(expected_conditions.url_contains("q=bulk-12"))
    found = [r[0] for r in _rows(browser, "threads")]
    assert found == [f"bulk-{i}" for i in range(129, 119, -1)]


def test_dead_letters_page_requeues_and_recovers(browser: webdriver.Chrome, served: Served) -> None:
    served.open(browser, "/dead-letters")
    message = served.threads.dead_message_id
    letter = browser.find_element(By.XPATH, f"//td[text()='{message}']/ancestor::tr").text
    assert letter.startswith(f"{message} dl {served.threads.dead_revision}")
    assert DEAD_ERROR in letter and "Requeue" in letter
    orphan = browser.find_element(By.LINK_TEXT, "orph").find_element(By.XPATH, "./ancestor::tr")
    assert orphan.text.startswith("orph orphaned act") and "Recover" in orphan.text
    _screenshot(browser, served.store.name, "dead-letters")
    _readable_narrow_and_dark(browser, served.store.name, "dead-letters")

    browser.find_element(By.XPATH, "//button[text()='Requeue']").click()
    done = WebDriverWait(browser, WAIT).until(
        expected_conditions.presence_of_element_located((By.ID, "msg"))
    )
    assert done.text == f"requeued dead letter {message}"
    assert "no dead letters" in browser.page_source
    browser.find_element(By.XPATH, "//button[text()='Recover']").click()
    done = WebDriverWait(browser, WAIT).until(
        expected_conditions.text_to_be_present_in_element((By.ID, "msg"), "orph")
    )
    assert "re-enqueued the hand-off of orph" in browser.find_element(By.ID, "msg").text
    assert "no stuck hand-offs" in browser.page_source
    head = asyncio.run(_head(served.store.url, "orph"))
    assert head.handoff_status is flowy.HandoffStatus.ENQUEUED


def test_cancel_needs_the_box_ticked(browser: webdriver.Chrome, served: Served) -> None:
    browser.get(f"{served.url}/threads/susp?token={TOKEN}")
    button = browser.find_element(By.XPATH, "//button[text()='Cancel']")
    button.click()  # the box is not ticked: the browser does not send the form
    assert browser.find_elements(By.ID, "msg") == []
    assert asyncio.run(_head(served.store.url, "susp")).status is flowy.RunStatus.SUSPENDED
    browser.find_element(By.ID, "cancel-reason").send_keys("customer asked")
    browser.find_element(By.ID, "cancel-confirm").click()
    browser.find_element(By.XPATH, "//button[text()='Cancel']").click()
    message = WebDriverWait(browser, 10).until(
        expected_conditions.presence_of_element_located((By.ID, "msg"))
    )
    assert message.text.startswith("canceled susp at revision")
    assert message.text.endswith("(was suspended): canceled: customer asked")
    assert browser.find_element(By.ID, "status").text == "canceled"
    assert browser.find_elements(By.ID, "cancel-confirm") == []
    head = asyncio.run(_head(served.store.url, "susp"))
    assert (head.status, head.reason) == (flowy.RunStatus.CANCELED, "canceled: customer asked")


def test_an_action_needs_post_the_token_and_the_csrf_value(served: Served) -> None:
    data = {"thread": "susp", "revision": str(served.threads.susp_revision)}
    data["overlay"] = '{"approved": true}'
    with httpx.Client(base_url=served.url, follow_redirects=False) as http:
        assert http.get("/").status_code == 403
        assert http.get("/threads/susp").status_code == 403
        assert http.post("/actions/resume", data=data).status_code == 403  # no token
        assert http.get(f"/?token={TOKEN}").status_code == 303  # sets the cookie
        page = http.get("/threads/susp")
        assert page.status_code == 200
        found = re.search(r"name='csrf' value='([^']+)'", page.text)
        assert found is not None
        csrf = found.group(1)
        assert http.post("/actions/resume", data=data).status_code == 403  # no CSRF
        forged = {**data, "csrf": "forged"}
        assert http.post("/actions/resume", data=forged).status_code == 403
        # A GET with everything in the query string is not an action.
        query = {**data, "csrf": csrf, "token": TOKEN}
        assert http.get("/actions/resume", params=query).status_code == 405
        assert asyncio.run(_head(served.store.url, "susp")).status is flowy.RunStatus.SUSPENDED
        # With the cookie's token, a POST and the CSRF value, it acts.
        done = http.post("/actions/resume", data={**data, "csrf": csrf})
        assert done.status_code == 303 and "resumed+susp" in done.headers["location"]
    assert asyncio.run(_head(served.store.url, "susp")).state["approved"] is True


def _flash(browser: webdriver.Chrome, ident: str) -> str:
    """The text of the page's outcome line (``msg``) or error line (``err``), once the
    action's answer has loaded."""
    found = WebDriverWait(browser, WAIT).until(
        expected_conditions.presence_of_element_located((By.ID, ident))
    )
    return str(found.text)


def test_a_signal_is_sent_from_the_thread_page_or_refused_with_its_error(
    browser: webdriver.Chrome, served: Served
) -> None:
    served.open(browser, "/threads/susp")
    assert "no pending signals" in browser.find_element(By.ID, "live").text
    name = browser.find_element(By.ID, "signal-name")
    assert name.get_attribute("value") == ""  # susp waits for no signal
    name.send_keys("nudge")
    browser.find_element(By.ID, "signal-payload").send_keys('{"note": "from the inspector"}')
    browser.find_element(By.XPATH, "//button[text()='Send signal']").click()
    text = _flash(browser, "msg")
    assert text.startswith("signal 'nudge' #1 (id ")
    assert text.endswith("sent to susp; kept until the thread waits for it")
    assert browser.current_url.split("?")[0].endswith("/threads/susp")
    pending = _rows(browser, "signals")
    assert [(r[0], r[1], r[2]) for r in pending] == [
        ("1", "nudge", '{"note": "from the inspector"}')
    ]
    _screenshot(browser, served.store.name, "thread-signal")
    # A payload that is not JSON is refused, with why, and nothing is sent.
    browser.find_element(By.ID, "signal-name").send_keys("nudge")
    browser.find_element(By.ID, "signal-payload").send_keys("{not json")
    browser.find_element(By.XPATH, "//button[text()='Send signal']").click()
    error = _flash(browser, "err")
    assert error.startswith("signal failed: ValueError: the payload is not valid JSON")
    assert len(_rows(browser, "signals")) == 1
    _screenshot(browser, served.store.name, "thread-signal-refused")


def test_a_fork_at_a_revision_chosen_in_the_timeline(
    browser: webdriver.Chrome, served: Served
) -> None:
    served.open(browser, "/threads/susp")
    assert browser.find_element(By.ID, "fork-at-1").text == "fork here"
    browser.find_element(By.ID, "fork-at-1").click()
    WebDriverWait(browser, WAIT).until(expected_conditions.url_contains("fork=1"))
    chosen = Select(browser.find_element(By.ID, "fork-revision")).first_selected_option
    assert chosen.get_attribute("value") == "1"
    assert chosen.text == "1 · ask"
    _screenshot(browser, served.store.name, "thread-fork-chosen")
    browser.find_element(By.ID, "fork-new").send_keys("susp-at-1")
    browser.find_element(By.XPATH, "//button[text()='Fork']").click()
    text = _flash(browser, "msg")
    assert text.startswith("forked susp@1 into susp-at-1")
    assert browser.current_url.split("?")[0].endswith("/threads/susp-at-1")
    assert browser.find_element(By.ID, "lineage").text == "susp@1"
    assert browser.find_element(By.ID, "status").text == "suspended"
    _screenshot(browser, served.store.name, "thread-forked")
    child = asyncio.run(_head(served.store.url, "susp-at-1"))
    assert (child.parent_thread_id, child.parent_revision) == ("susp", 1)
    browser.find_element(By.ID, "lineage").find_element(By.LINK_TEXT, "susp").click()
    WebDriverWait(browser, WAIT).until(expected_conditions.url_contains("/threads/susp"))
    assert browser.find_element(By.ID, "revision").text == str(served.threads.susp_revision)


async def _bury(url: str) -> list[str]:
    """Fail every delivery of the pending hand-offs (``ho``'s) until they are dead
    letters; the dead letters' ids."""
    async with flowy.connect(url) as backend:
        consumer = backend.consumer
        for _ in range(consumer.max_attempts):
            for message in await consumer.claim(10, 30):
                await consumer.release(message, error="the card service is down")
        return [d.message_id for d in await consumer.dead_letters()]


async def _requeue(url: str, message_id: str) -> None:
    async with flowy.connect(url) as backend:
        await backend.consumer.retry_dead_letter(message_id)


def test_checked_dead_letters_are_requeued_once_confirmed(
    browser: webdriver.Chrome, served: Served
) -> None:
    letters = asyncio.run(_bury(served.store.url))
    dl = served.threads.dead_message_id
    (ho,) = set(letters) - {dl}
    served.open(browser, "/dead-letters")
    assert len(_rows(browser, "letters")) == 2
    for box in browser.find_elements(By.CSS_SELECTOR, "#letters input[name='letter']"):
        box.click()
    _screenshot(browser, served.store.name, "dead-letters-checked")
    browser.find_element(By.ID, "requeue-checked").click()  # not confirmed: not sent
    assert browser.find_elements(By.ID, "msg") == []
    assert len(asyncio.run(_bury(served.store.url))) == 2
    asyncio.run(_requeue(served.store.url, ho))  # someone else requeues one meanwhile
    browser.find_element(By.ID, "requeue-confirm").click()
    browser.find_element(By.ID, "requeue-checked").click()
    text = _flash(browser, "msg")
    assert text == (
        f"requeued 1 of 2 dead letter(s) (id {dl}); not requeued: id {ho} (no longer a dead letter)"
    )
    assert "no dead letters" in browser.find_element(By.ID, "live").text
    assert browser.find_elements(By.ID, "requeue-all") == []
    _screenshot(browser, served.store.name, "dead-letters-requeued")


def test_every_dead_letter_is_requeued_at_once(browser: webdriver.Chrome, served: Served) -> None:
    letters = asyncio.run(_bury(served.store.url))
    assert len(letters) == 2
    served.open(browser, "/dead-letters")
    assert browser.find_element(By.ID, "requeue-all").text == "Requeue all (2)"
    browser.find_element(By.ID, "requeue-confirm").click()
    browser.find_element(By.ID, "requeue-all").click()
    text = _flash(browser, "msg")
    assert text.startswith("requeued 2 of 2 dead letter(s) (ids ")
    assert sorted(text.split("(ids ", 1)[1].rstrip(")").split(", ")) == sorted(letters)
    assert asyncio.run(_dead_letters(served.store.url)) == []


async def _dead_letters(url: str) -> list[str]:
    async with flowy.connect(url) as backend:
        return [d.message_id for d in await backend.consumer.dead_letters()]


def test_a_save_reaches_the_page_through_the_stores_watch(
    browser: webdriver.Chrome, served: Served
) -> None:
    # The page refreshes itself every QUIET seconds (10 min): within WAIT, only the
    # stream of the store's watch can bring the update.
    assert served.inspector.watching
    served.open(browser, "/threads/susp")
    assert browser.find_element(By.TAG_NAME, "body").get_attribute("data-events") == (
        f"/events/susp?after={served.threads.susp_revision}"
    )
    WebDriverWait(browser, WAIT).until(
        lambda b: b.find_element(By.TAG_NAME, "body").get_attribute("data-watching") == "yes"
    )
    assert served.inspector.streams == 1
    browser.execute_script("window.notReloaded = true")
    _approve_elsewhere(served)
    WebDriverWait(browser, WAIT).until(
        expected_conditions.text_to_be_present_in_element((By.ID, "status"), "handoff")
    )
    assert browser.execute_script("return window.notReloaded") is True  # in place
    saves = browser.find_element(By.TAG_NAME, "body").get_attribute("data-saves")
    assert saves is not None and int(saves) >= 1  # the stream said a revision was saved
    assert "save(s) heard" in browser.find_element(By.ID, "updated").text
    assert served.inspector.streams == 1  # one stream, still open
    _screenshot(browser, served.store.name, "thread-watched")


def test_no_periodic_live_update_while_the_stream_is_open(
    browser: webdriver.Chrome, served: Served
) -> None:
    # "live_update" in the name: pages refresh every LIVE second, but a thread page whose
    # stream is open fetches nothing until the stream tells of a save.
    served.open(browser, "/threads/susp")
    WebDriverWait(browser, WAIT).until(
        lambda b: b.find_element(By.TAG_NAME, "body").get_attribute("data-watching") == "yes"
    )
    browser.execute_script(
        "window.fetches = 0; var f = window.fetch;"
        "window.fetch = function () { window.fetches += 1; return f.apply(this, arguments); };"
    )
    time.sleep(4 * LIVE)
    assert browser.execute_script("return window.fetches") == 0
    _approve_elsewhere(served)
    WebDriverWait(browser, WAIT).until(
        expected_conditions.text_to_be_present_in_element((By.ID, "status"), "handoff")
    )
    assert browser.execute_script("return window.fetches") >= 1
    # The fleet page has no stream: it refreshes every LIVE second.
    served.open(browser, "/")
    browser.execute_script(
        "window.fetches = 0; var f = window.fetch;"
        "window.fetch = function () { window.fetches += 1; return f.apply(this, arguments); };"
    )
    WebDriverWait(browser, WAIT).until(lambda b: b.execute_script("return window.fetches") >= 2)


def test_the_new_actions_need_post_the_token_and_the_csrf_value(served: Served) -> None:
    actions = {
        "signal": {"thread": "susp", "signal": "nudge", "payload": "1"},
        "fork": {"thread": "susp", "revision": "1", "new_thread": "copy"},
        "requeue-many": {"which": "all", "confirm": "yes"},
    }
    with httpx.Client(base_url=served.url, follow_redirects=False) as http:
        for name, data in actions.items():
            assert http.post(f"/actions/{name}", data=data).status_code == 403  # no token
        assert http.get(f"/?token={TOKEN}").status_code == 303  # sets the cookie
        found = re.search(r"name='csrf' value='([^']+)'", http.get("/threads/susp").text)
        assert found is not None
        for name, data in actions.items():
            assert http.post(f"/actions/{name}", data=data).status_code == 403  # no CSRF
            forged = {**data, "csrf": "forged"}
            assert http.post(f"/actions/{name}", data=forged).status_code == 403
            query = {**data, "csrf": found.group(1), "token": TOKEN}
            assert http.get(f"/actions/{name}", params=query).status_code == 405
    assert asyncio.run(_dead_letters(served.store.url)) == [served.threads.dead_message_id]
    assert "copy" not in asyncio.run(_thread_ids(served.store.url))
    pending = asyncio.run(_pending_signals(served.store.url, "susp"))
    assert pending == []


async def _thread_ids(url: str) -> list[str]:
    async with flowy.connect(url) as backend:
        return [s.thread_id for s in await backend.checkpointer.list_threads(limit=100)]


async def _pending_signals(url: str, thread: str) -> list[str]:
    async with flowy.connect(url) as backend:
        cp: Any = backend.checkpointer
        return [s.name for s in await cp.signals(thread)]
