"""``flowy ui`` in a real browser: Selenium drives the system's headless Chromium against
the app served by uvicorn on a free port, over a SQLite store with a suspended approval
thread.

Chromium and its driver come from the system (``apt-get install chromium
chromium-driver``); nothing is downloaded here. Without them the tests skip, unless
``FLOWY_REQUIRE_BROWSER=1`` (CI), where their absence fails. ``FLOWY_UI_SCREENSHOT=PATH``
saves a screenshot of the thread page to PATH (``docs/images/ui-thread.png``).
"""

from __future__ import annotations

import asyncio
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

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("selenium")

import httpx
import uvicorn
from core_graphs import approval_graph
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.wait import WebDriverWait

import flowy
from flowy.cli._ui import build_app
from flowy.sqlite import SQLiteBackend

TOKEN = "browser-test-token"
CHROMIUM = os.environ.get("FLOWY_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("FLOWY_CHROMEDRIVER", "/usr/bin/chromedriver")


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


async def _populate(path: Path) -> None:
    async with SQLiteBackend[Any](path) as backend:
        await flowy.Runner(approval_graph(), backend, run_lease=("setup", 5.0)).start("susp", {})


async def _head(path: Path, thread: str) -> flowy.storage.Snapshot[Any]:
    async with SQLiteBackend[Any](path) as backend:
        snap, _ = await flowy.Runner(approval_graph(), backend).head(thread)
        return snap


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Served:
    url: str
    db: Path


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    """The app on a free port, in a thread of its own (its own event loop and backend)."""
    db = tmp_path / "flowy.db"
    asyncio.run(_populate(db))
    port = _free_port()
    config = uvicorn.Config(
        app="", host="127.0.0.1", port=port, log_level="warning", lifespan="off"
    )
    server = uvicorn.Server(config)

    async def serve() -> None:
        async with SQLiteBackend[Any](db) as backend:
            config.app = build_app(backend, approval_graph(), token=TOKEN)
            await server.serve()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield Served(f"http://127.0.0.1:{port}", db)
    finally:
        server.should_exit = True
        thread.join(10)


def test_threads_list_shows_the_thread(browser: webdriver.Chrome, served: Served) -> None:
    browser.get(f"{served.url}/?token={TOKEN}")
    assert "token" not in browser.current_url  # traded for a cookie
    link = browser.find_element(By.LINK_TEXT, "susp")
    row = link.find_element(By.XPATH, "./ancestor::tr").text
    assert "suspended" in row and "awaiting_approval" in row and "ask" in row
    assert browser.get_cookie("flowy_ui_token") is not None
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
    shot = os.environ.get("FLOWY_UI_SCREENSHOT")
    if shot:
        Path(shot).parent.mkdir(parents=True, exist_ok=True)
        assert browser.save_screenshot(shot), shot


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
    head = asyncio.run(_head(served.db, "susp"))
    assert head.status in (flowy.RunStatus.HANDOFF, flowy.RunStatus.COMPLETED)
    assert head.state["approved"] is True


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
    assert asyncio.run(_head(served.db, "susp")).status is flowy.RunStatus.SUSPENDED
