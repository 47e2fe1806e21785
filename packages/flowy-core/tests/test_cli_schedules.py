"""``flowy schedules list|create|pause|resume|delete`` on every store: memory in this
process (no other can see it), the others as a real ``flowy`` process; bad input is one
line on standard error and exit status 2."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from cli_support import assert_one_line_error
from stores_support import ALL_STORES, Store, environment, fresh_store
from stores_support import dynamodb_endpoint as dynamodb_endpoint  # a fixture

import flowy
from flowy.cli._main import main

GRAPH = "flowy.testing.suite._schedules:TICK_GRAPH"
NEW = ["create", "x", "--graph", GRAPH]
HOURLY = [*NEW, "--every", "1h"]


@pytest.fixture(params=ALL_STORES)
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    """A fresh store of each kind, set up (a SQLite file must exist for the command)."""
    with fresh_store(request, "sched") as made, environment(made):

        async def setup() -> None:
            async with await flowy.connect(made.url):
                pass

        asyncio.run(setup())
        yield made


def run(
    store: Store, capfd: pytest.CaptureFixture[str], *args: str
) -> subprocess.CompletedProcess[str]:
    """``flowy schedules ARGS --backend URL``: in this process for memory, else a process."""
    if store.name != "memory":
        return store.flowy("schedules", *args)
    capfd.readouterr()
    code = main(["schedules", *args, "--backend", store.url])
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(args, code, out, err)


def listed(store: Store, capfd: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    proc = run(store, capfd, "list", "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_create_list_pause_resume_delete(store: Store, capfd: pytest.CaptureFixture[str]) -> None:
    proc = run(store, capfd, "list")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "no schedules"
    proc = run(
        store,
        capfd,
        "create",
        "nightly",
        "--graph",
        GRAPH,
        "--cron",
        "0 2 * * *",
        "--tz",
        "Europe/Berlin",
        "--state",
        '{"queue": "inbox"}',
        "--catch-up",
        "all",
        "--catch-up-cap",
        "3",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("created schedule nightly: 0 2 * * * (Europe/Berlin), next tick")
    proc = run(store, capfd, "create", "hourly", "--graph", GRAPH, "--every", "1h", "--json")
    assert proc.returncode == 0, proc.stderr
    hourly = json.loads(proc.stdout)
    assert hourly["every"] == 3600 and hourly["next_thread"].startswith("hourly@")
    rows = listed(store, capfd)
    assert [r["name"] for r in rows] == ["hourly", "nightly"]
    nightly = rows[1]
    assert (nightly["cron"], nightly["tz"], nightly["state"]) == (
        "0 2 * * *",
        "Europe/Berlin",
        {"queue": "inbox"},
    )
    assert (nightly["catch_up"], nightly["catch_up_cap"], nightly["paused"]) == ("all", 3, False)
    table = run(store, capfd, "list").stdout.splitlines()
    assert table[0].split()[:3] == ["NAME", "GRAPH", "WHEN"]
    assert "all (cap 3)" in table[2] and "active" in table[2]

    proc = run(store, capfd, "pause", "nightly")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("paused schedule nightly:") and "paused" in proc.stdout
    assert [r["paused"] for r in listed(store, capfd)] == [False, True]
    proc = run(store, capfd, "resume", "nightly")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("resumed schedule nightly:")
    assert [r["paused"] for r in listed(store, capfd)] == [False, False]
    proc = run(store, capfd, "delete", "hourly")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("deleted schedule hourly")
    assert [r["name"] for r in listed(store, capfd)] == ["nightly"]


@pytest.mark.parametrize(
    ("args", "code", "needles"),
    [
        (NEW, 2, ["--cron EXPR or --every INTERVAL"]),
        ([*NEW, "--cron", "* * *"], 2, ["five fields"]),
        ([*NEW, "--cron", "0 0 L * *"], 2, ["not supported"]),
        ([*NEW, "--cron", "0 * * * *", "--tz", "Nowhere/X"], 2, ["unknown time zone"]),
        ([*NEW, "--every", "5 weeks"], 2, ["15m"]),
        ([*NEW, "--every", "0s"], 2, ["1 second to 366 days"]),
        (["create", "x", "--graph", "nope", "--every", "1h"], 2, ["package.module:attribute"]),
        (["create", "bad name", "--graph", GRAPH, "--every", "1h"], 2, ["schedule name"]),
        ([*HOURLY, "--state", "[1]"], 2, ["JSON object"]),
        ([*HOURLY, "--state", "{"], 2, ["--state is not valid JSON"]),
        ([*HOURLY, "--catch-up", "most"], 2, ["invalid choice"]),
        (["pause", "missing"], 1, ["no schedule named 'missing'", "schedules list"]),
        (["delete", "missing"], 1, ["no schedule named 'missing'"]),
        (["frobnicate"], 2, ["invalid choice"]),
    ],
)  # fmt: skip
def test_bad_input_is_one_line(
    store: Store,
    capfd: pytest.CaptureFixture[str],
    args: list[str],
    code: int,
    needles: list[str],
) -> None:
    proc = run(store, capfd, *args)
    assert_one_line_error(proc, code, *needles)
    assert listed(store, capfd) == []


def test_a_name_is_taken_once(store: Store, capfd: pytest.CaptureFixture[str]) -> None:
    assert run(store, capfd, "create", "once", "--graph", GRAPH, "--every", "90s").returncode == 0
    proc = run(store, capfd, "create", "once", "--graph", GRAPH, "--every", "1h")
    assert_one_line_error(proc, 1, "exists already")
    assert [r["every"] for r in listed(store, capfd)] == [90]
