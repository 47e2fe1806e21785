"""``flowy ui`` in a real browser: Selenium drives the system's headless Chromium against
the app served by uvicorn on a free port, over a SQLite store opened by URL and filled
by ``cli_support.populate`` (a suspended approval thread, a hand-off, an orphaned
hand-off, and a dead letter).

Chromium and its driver come from the system (``apt-get install chromium
chromium-driver``); nothing is downloaded here. Without them the tests skip, unless
``FLOWY_REQUIRE_BROWSER=1`` (CI), where their absence fails. ``FLOWY_UI_SCREENSHOTS=DIR``
saves screenshots of the pages the tests check into DIR: ``ui-threads.png``,
``ui-thread.png`` and ``ui-dead-letters.png`` (docs/operations.md shows those of
``docs/images``)::

    FLOWY_UI_SCREENSHOTS=docs/images pytest packages/flowy-core/tests/test_ui_browser.py
"""

from __future__ import annotations

import asyncio
import base64
import os
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
from cli_support import DEAD_ERROR, Threads, populate
from core_graphs import approval_graph
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.wait import WebDriverWait

import flowy
from flowy.cli._ui import build_app

TOKEN = "browser-test-token"
CHROMIUM = os.environ.get("FLOWY_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("FLOWY_CHROMEDRIVER", "/usr/bin/chromedriver")
SHOT_WIDTH = 900


def _missing_browser() -> str | None:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            found = shutil.which(Path(path).name)
            return f"{path} is not installed ({found or 'not on PATH either'}): " + (
                "apt-get install chromium chromium-driver"
            )
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
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
        "--window-size=1280,1600",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


async def _head(url: str, thread: str) -> flowy.storage.Snapshot[Any]:
    async with flowy.connect(url) as backend:
        snap, _ = await flowy.Runner(approval_graph(), backend).head(thread)
        return snap


def _screenshot(browser: webdriver.Chrome, name: str) -> None:
    """Save the whole page, as tall as it is, as ``name`` in ``FLOWY_UI_SCREENSHOTS``
    (when that is set). The page is laid out ``SHOT_WIDTH`` px wide for it, so that the
    picture still reads when a documentation page shows it scaled down."""
    folder = os.environ.get("FLOWY_UI_SCREENSHOTS")
    if not folder:
        return
    screen = {"width": SHOT_WIDTH, "height": 600, "deviceScaleFactor": 1, "mobile": False}
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", screen)
    try:
        # The capture lays the page out as tall as it is: no scroll bar, the full width.
        height = browser.find_element(By.TAG_NAME, "html").rect["height"]
        clip = {"x": 0, "y": 0, "width": SHOT_WIDTH, "height": height, "scale": 1}
        shot = browser.execute_cdp_cmd(
            "Page.captureScreenshot",
            {"format": "png", "captureBeyondViewport": True, "clip": clip},
        )
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    path = Path(folder) / name
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
    store: str  # the store's URL
    threads: Threads  # what populate made


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    """The app on a free port, in a thread of its own (its own event loop and backend)."""
    store = f"sqlite:///{tmp_path / 'flowy.db'}"
    threads = asyncio.run(populate(store))
    port = _free_port()
    config = uvicorn.Config(
        app="", host="127.0.0.1", port=port, log_level="warning", lifespan="off"
    )
    server = uvicorn.Server(config)

    async def serve() -> None:
        async with flowy.connect(store) as backend:
            config.app = build_app(
                backend, approval_graph(), token=TOKEN, host="127.0.0.1", port=port
            )
            await server.serve()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield Served(f"http://127.0.0.1:{port}", store, threads)
    finally:
        server.should_exit = True
        thread.join(10)


def test_threads_list_shows_the_threads(browser: webdriver.Chrome, served: Served) -> None:
    browser.get(f"{served.url}/?token={TOKEN}")
    assert "token" not in browser.current_url  # traded for a cookie
    rows = [
        [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
        for tr in browser.find_elements(By.CSS_SELECTOR, "tbody tr")
    ]
    assert [(r[0], r[1], r[3]) for r in rows] == [
        ("dl", "handoff", "act"),
        ("ho", "handoff", "act"),
        ("orph", "handoff", "act"),
        ("susp", "suspended", "ask"),
    ]
    link = browser.find_element(By.LINK_TEXT, "susp")
    row = link.find_element(By.XPATH, "./ancestor::tr").text
    assert "suspended" in row and "awaiting_approval" in row and "ask" in row
    port = served.url.rsplit(":", 1)[1]
    assert browser.get_cookie(f"flowy_ui_token_{port}") is not None
    _screenshot(browser, "ui-threads.png")
    link.click()
    WebDriverWait(browser, 10).until(expected_conditions.url_contains("/threads/susp"))
    assert browser.find_element(By.ID, "status").text == "suspended"


def test_thread_page_shows_state_and_history(browser: webdriver.Chrome, served: Served) -> None:
    browser.get(f"{served.url}/threads/susp?token={TOKEN}")
    assert browser.find_element(By.ID, "status").text == "suspended"
    assert '"planned": true' in browser.find_element(By.ID, "state").text
    history = browser.find_element(By.ID, "history").text
    assert "awaiting_approval" in history and "running" in history
    assert "class n_ask current" in browser.find_element(By.ID, "graph").text
    _screenshot(browser, "ui-thread.png")


def test_the_approval_form_resumes_the_run(browser: webdriver.Chrome, served: Served) -> None:
    browser.get(f"{served.url}/threads/susp?token={TOKEN}")
    overlay = browser.find_element(By.ID, "overlay")
    overlay.clear()
    overlay.send_keys('{"approved": true}')
    overlay.find_element(By.XPATH, "./ancestor::form//button").click()
    # The POST answers 303 back to the thread page, with the outcome on one line.
    message = WebDriverWait(browser, 10).until(
        expected_conditions.presence_of_element_located((By.ID, "msg"))
    )
    assert "resumed susp: handoff" in message.text
    assert browser.find_element(By.ID, "status").text == "handoff"
    assert '"approved": true' in browser.find_element(By.ID, "state").text
    head = asyncio.run(_head(served.store, "susp"))
    assert head.status in (flowy.RunStatus.HANDOFF, flowy.RunStatus.COMPLETED)
    assert head.state["approved"] is True


def test_dead_letters_page_requeues_and_recovers(browser: webdriver.Chrome, served: Served) -> None:
    browser.get(f"{served.url}/dead-letters?token={TOKEN}")
    message = served.threads.dead_message_id
    letter = browser.find_element(By.XPATH, f"//td[text()='{message}']/ancestor::tr").text
    assert letter.startswith(f"{message} dl {served.threads.dead_revision}")
    assert DEAD_ERROR in letter and "Requeue" in letter
    orphan = browser.find_element(By.LINK_TEXT, "orph").find_element(By.XPATH, "./ancestor::tr")
    assert orphan.text.startswith("orph orphaned act") and "Recover" in orphan.text
    _screenshot(browser, "ui-dead-letters.png")

    browser.find_element(By.XPATH, "//button[text()='Requeue']").click()
    done = WebDriverWait(browser, 10).until(
        expected_conditions.presence_of_element_located((By.ID, "msg"))
    )
    assert done.text == f"requeued dead letter {message}"
    assert "no dead letters" in browser.page_source
    browser.find_element(By.XPATH, "//button[text()='Recover']").click()
    done = WebDriverWait(browser, 10).until(
        expected_conditions.text_to_be_present_in_element((By.ID, "msg"), "orph")
    )
    assert "re-enqueued the hand-off of orph" in browser.find_element(By.ID, "msg").text
    assert "no stuck hand-offs" in browser.page_source
    head = asyncio.run(_head(served.store, "orph"))
    assert head.handoff_status is flowy.HandoffStatus.ENQUEUED


def test_cancel_needs_the_box_ticked(browser: webdriver.Chrome, served: Served) -> None:
    browser.get(f"{served.url}/threads/susp?token={TOKEN}")
    button = browser.find_element(By.XPATH, "//button[text()='Cancel']")
    button.click()  # the box is not ticked: the browser does not send the form
    assert browser.find_elements(By.ID, "msg") == []
    assert asyncio.run(_head(served.store, "susp")).status is flowy.RunStatus.SUSPENDED
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
    head = asyncio.run(_head(served.store, "susp"))
    assert (head.status, head.reason) == (flowy.RunStatus.CANCELED, "canceled: customer asked")


def test_a_post_without_csrf_or_token_is_refused(served: Served) -> None:
    with httpx.Client(base_url=served.url, follow_redirects=False) as http:
        assert http.get("/").status_code == 403
        assert http.get("/threads/susp").status_code == 403
        data = {"thread": "susp", "revision": "2", "overlay": '{"approved": true}'}
        assert http.post("/actions/resume", data=data).status_code == 403
        assert http.get(f"/?token={TOKEN}").status_code == 303  # sets the cookie
        assert http.get("/").status_code == 200
        assert http.post("/actions/resume", data=data).status_code == 403
        forged = {**data, "csrf": "forged"}
        assert http.post("/actions/resume", data=forged).status_code == 403
    assert asyncio.run(_head(served.store, "susp")).status is flowy.RunStatus.SUSPENDED
