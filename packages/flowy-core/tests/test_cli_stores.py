"""The ``flowy`` command on every store, the same way: each test fills a store through
``flowy.connect(url)`` and runs ``flowy … --backend URL`` as a real process on it.

The stores (all but memory, which another process cannot see) and how each test gets
one of its own are in ``stores_support.py``.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_support import (
    DEAD_ERROR,
    GRAPH,
    WAITING_GRAPH,
    Threads,
    assert_one_line_error,
    load,
    park_two,
    populate,
    run_flowy,
)
from stores_support import SHARED_STORES, Store, environment, fresh_store
from stores_support import dynamodb_endpoint as dynamodb_endpoint  # a fixture

import flowy

ROOT = Path(__file__).resolve().parents[3]  # the repository: examples/ is importable


@pytest.fixture(params=SHARED_STORES)
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    """A fresh, empty store of each kind, by URL."""
    with fresh_store(request, "cli") as made:
        yield made


@pytest.fixture
def threads(store: Store) -> Threads:
    """``store`` filled by ``cli_support.populate``."""
    with environment(store):
        return asyncio.run(populate(store.url))


def _head(store: Store, thread: str) -> tuple[flowy.storage.Snapshot[Any], int]:
    with environment(store):
        return asyncio.run(load(store.url, thread))


# ---------------------------------------------------------------------------- tests


def test_threads_marks_dead_lettered_threads(store: Store, threads: Threads) -> None:
    proc = store.flowy("threads")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == [
        "THREAD", "STATUS", "REASON", "POINTER", "REVISION", "HANDOFF", "DEAD", "UPDATED"
    ]  # fmt: skip
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert list(rows) == ["dl", "ho", "orph", "susp"]
    assert rows["dl"][6] == threads.dead_message_id
    assert [rows[t][6] for t in ("ho", "orph", "susp")] == ["-", "-", "-"]
    data = {row["thread_id"]: row for row in json.loads(store.flowy("threads", "--json").stdout)}
    assert data["dl"]["dead_letters"] == [threads.dead_message_id]
    assert data["ho"]["dead_letters"] == []
    assert data["susp"]["revision"] == threads.susp_revision


def test_threads_pages_with_after(store: Store, threads: Threads) -> None:
    first = store.flowy("threads", "--limit", "2")
    assert first.returncode == 0, first.stderr
    assert [line.split()[0] for line in first.stdout.splitlines()[1:3]] == ["dl", "ho"]
    assert first.stdout.splitlines()[-1] == (
        f"more threads follow: flowy threads --after ho --limit 2 {store.option}"
    )
    second = json.loads(store.flowy("threads", "--after", "ho", "--limit", "2", "--json").stdout)
    assert [row["thread_id"] for row in second] == ["orph", "susp"]
    last = store.flowy("threads", "--after", "susp")
    assert last.stdout.strip() == f"no threads in {store.url} after 'susp'"


def test_show_a_dead_lettered_thread(store: Store, threads: Threads) -> None:
    proc = store.flowy("show", "dl")
    assert proc.returncode == 0, proc.stderr
    fields = {
        line.split(None, 1)[0]: line.split(None, 1)[1]
        for line in proc.stdout.split("\nstate\n")[0].splitlines()
    }
    assert fields["hand-off"].startswith("enqueued since ")
    assert fields["hand-off"].endswith(" · its message is DEAD-LETTERED")
    assert fields["dead"] == (
        f"dead-lettered message {threads.dead_message_id} of revision {threads.dead_revision} "
        f"after {threads.max_attempts} deliveries: {DEAD_ERROR}"
    )
    assert "worker" not in fields["next"]
    assert fields["next"] == (
        "requeue its dead-lettered hand-off once the cause is fixed: flowy dead-letters "
        f"--retry {shlex.quote(threads.dead_message_id)} {store.option}"
    )
    data = json.loads(store.flowy("show", "dl", "--json").stdout)
    assert data["dead_letters"] == [
        {
            "message_id": threads.dead_message_id,
            "thread_id": "dl",
            "revision": threads.dead_revision,
            "attempts": threads.max_attempts,
            "reason": "to_worker",
            "pointer": "act",
            "error": DEAD_ERROR,
            "decodable": True,
        }
    ]
    ho = store.flowy("show", "ho")
    assert f"a worker resumes it: flowy worker --graph MODULE:ATTR {store.option}" in ho.stdout
    assert json.loads(store.flowy("show", "ho", "--json").stdout)["dead_letters"] == []


def test_history(store: Store, threads: Threads) -> None:
    proc = store.flowy("history", "ho", "--limit", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    revisions = [row["revision"] for row in json.loads(proc.stdout)]
    assert revisions == [threads.handoff_revision, threads.handoff_revision - 1]


def test_dead_letters_list_retry_and_work(store: Store, threads: Threads) -> None:
    listed = store.flowy("dead-letters")
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()[:2]
    assert header.split() == [
        "ID", "THREAD", "REVISION", "ATTEMPTS", "REASON", "POINTER", "ERROR"
    ]  # fmt: skip
    assert row.split() == [
        threads.dead_message_id, "dl", str(threads.dead_revision), str(threads.max_attempts),
        "to_worker", "act",
        *DEAD_ERROR.split(),
    ]  # fmt: skip
    retried = store.flowy("dead-letters", "--retry", threads.dead_message_id)
    assert retried.stdout == f"requeued dead letter {threads.dead_message_id}\n", retried.stderr
    assert json.loads(store.flowy("dead-letters", "--json").stdout) == []
    work = store.flowy("worker", "--graph", GRAPH, "--once", "--owner", "w", "--idle-wait", "0.3")
    assert work.returncode == 0, work.stdout + work.stderr
    assert f"the last delivery failed: {DEAD_ERROR}" not in work.stdout  # attempts were reset
    assert work.stdout.splitlines()[-1] == "w: 2 message(s) processed (resumed 2)"
    assert _head(store, "dl")[0].status is flowy.RunStatus.COMPLETED


def test_worker_once_fails_when_a_message_fails(store: Store, threads: Threads) -> None:
    proc = store.flowy(
        "worker", "--graph", "cli_support:failing_graph", "--once", "--owner", "w",
        "--idle-wait", "0.3", "--retry-delay", "0",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    assert out.count(f"⇣ ho@{threads.handoff_revision} delivery") == threads.max_attempts
    why = "run failed (node_error): RuntimeError: the payment service is down"
    assert f"the last delivery failed: {why}" in out
    assert f"↺ released for another delivery: {why}" in out
    assert (
        f"✗ dead-lettered after {threads.max_attempts} deliveries: run failed (node_error): "
    ) in out
    assert "1 dead-lettered" in out.splitlines()[-1]
    assert "Traceback" not in proc.stderr
    letters = json.loads(store.flowy("dead-letters", "--json").stdout)
    assert {row["thread_id"] for row in letters} == {"dl", "ho"}


def test_worker_once_succeeds_when_everything_went_through(store: Store, threads: Threads) -> None:
    proc = store.flowy("worker", "--graph", GRAPH, "--once", "--owner", "w", "--idle-wait", "0.3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert out.splitlines()[0] == f"w · claiming hand-offs from {store.url} · graph {GRAPH}"
    assert f"⇣ ho@{threads.handoff_revision} delivery 1 (to_worker at act)" in out
    assert "✓ completed (completed) · at done" in out
    assert "✓ acked: resumed" in out
    assert out.splitlines()[-1] == "w: 1 message(s) processed (resumed 1)"
    assert _head(store, "ho")[0].state["log"] == ["plan", "ask", "act", "done"]


def test_resume_by_printed_token_and_recover(store: Store, threads: Threads) -> None:
    token = f"susp@{threads.susp_revision}"
    proc = store.flowy("resume", token, "--graph", GRAPH, "--overlay", '{"approved": true}')
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"a worker resumes it: flowy worker --graph {GRAPH} {store.option}" in proc.stdout
    stale = store.flowy("resume", token, "--graph", GRAPH)
    assert stale.returncode == 1
    assert f"then resume susp@{threads.susp_revision + 2}" in stale.stderr
    recovered = json.loads(store.flowy("recover", "--graph", GRAPH, "--json").stdout)
    assert [(row["thread_id"], row["recovered"]) for row in recovered] == [("orph", True)]


async def _start_expense(url: str) -> int:
    """The first-app guide's large expense, waiting for a person: its revision."""
    from examples.approval_app.graph import Expense, graph

    async with flowy.connect(url) as backend:
        first = await flowy.Runner(graph, backend).start("exp", Expense("ann", 500, "laptop"))
        assert first.resume_token is not None
        return first.resume_token.snapshot_revision


def test_resume_overlay_approves_the_first_app_expense(store: Store) -> None:
    with environment(store):
        revision = asyncio.run(_start_expense(store.url))
    app = ("--graph", "examples.approval_app.graph:graph")
    token = f"exp@{revision}"
    unknown = store.flowy("resume", token, *app, "--overlay", '{"aproved": true}', cwd=ROOT)
    assert_one_line_error(unknown, 2, "--overlay", "'aproved', not fields of Expense")
    wrong = store.flowy("resume", token, *app, "--overlay", '{"amount": "lots"}', cwd=ROOT)
    assert_one_line_error(wrong, 2, "--overlay", "does not fit Expense", "state.amount")
    fork = ("fork", "exp", "--revision", str(revision), "--new-thread", "exp-2", *app)
    unfit = store.flowy(*fork, "--overlay", '{"approved": 1}', cwd=ROOT)
    assert_one_line_error(unfit, 2, "--overlay", "state.approved: expected bool")
    overlay = '{"approved": true, "approver": "cli"}'
    forked = store.flowy(*fork, "--overlay", overlay, "--json", cwd=ROOT)
    assert forked.returncode == 0, forked.stderr
    proc = store.flowy("resume", token, *app, "--overlay", overlay, "--json", cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert (result["status"], result["reason"]) == ("handoff", "payment_queued")
    assert result["state"] == {
        "who": "ann",
        "amount": 500,
        "reason": "laptop",
        "summary": "ann asks for 500 for 'laptop'",
        "approver": "cli",
        "approved": True,
        "payment_id": "",
    }


def test_timers_signal_and_a_worker_that_wakes_both(store: Store) -> None:
    with environment(store):
        asyncio.run(park_two(store.url))
    listed = json.loads(store.flowy("timers", "--json").stdout)
    assert [(t["thread_id"], t["due"]) for t in listed] == [("sleepy", True), ("waiter", False)]
    table = store.flowy("timers", "--due")
    assert table.returncode == 0, table.stderr
    assert [line.split()[0] for line in table.stdout.splitlines()[1:]] == ["sleepy"]
    sent = store.flowy("signal", "waiter", "approval", "--json", '{"by": "dana"}', "--id", "ev-1")
    assert sent.returncode == 0, sent.stderr
    assert sent.stdout.strip() == (
        "signal 'approval' #1 (id ev-1) stored for thread waiter; the thread waits for it: a "
        "worker resumes it"
    )
    again = store.flowy("signal", "waiter", "approval", "--json", '{"by": "eve"}', "--id", "ev-1")
    assert "#1 (id ev-1)" in again.stdout  # the same signal: nothing new stored
    assert_one_line_error(store.flowy("signal", "waiter", "approval", "--json", "{bad"), 2, "JSON")
    assert_one_line_error(store.flowy("signal", "nobody", "approval"), 1, "nobody")
    shown = json.loads(store.flowy("show", "waiter", "--json").stdout)
    assert shown["status"] == "waiting" and shown["waiting_for"] == "approval"
    assert [s["signal_id"] for s in shown["pending_signals"]] == ["ev-1"]
    worked = store.flowy("worker", "--graph", WAITING_GRAPH, "--once", "--idle-wait", "0.5")
    assert worked.returncode == 0, worked.stderr
    for thread in ("sleepy", "waiter"):
        head, _ = _head(store, thread)
        assert head.status is flowy.RunStatus.COMPLETED, (thread, head)
        assert head.state["receipt"] == {"charged": 42}
    head, _ = _head(store, "waiter")
    assert head.state["by"] == "dana"
    shown = json.loads(store.flowy("show", "waiter", "--json").stdout)
    assert [(j["key"], j["status"], j["result"]) for j in shown["journal"]] == [
        ("charge", "succeeded", {"charged": 42})
    ]
    assert shown["pending_signals"] == []
    assert "charge" in store.flowy("show", "waiter").stdout.split("journal")[-1]
    assert json.loads(store.flowy("timers", "--json").stdout) == []
    assert_one_line_error(store.flowy("signal", "waiter", "approval"), 1, "finished")


def test_fork_history_diff_and_threads_by_version(store: Store, threads: Threads) -> None:
    from core_graphs import approval_graph

    version = approval_graph().version
    forked = store.flowy(
        "fork", "susp", "--revision", "1", "--new-thread", "susp-fork", "--graph", GRAPH,
        "--overlay", '{"approved": true}', "--json",
    )  # fmt: skip
    assert forked.returncode == 0, forked.stderr
    made = json.loads(forked.stdout)
    assert (made["resume_token"], made["parent_thread_id"], made["parent_revision"]) == (
        "susp-fork@1",
        "susp",
        1,
    )
    shown = json.loads(store.flowy("show", "susp-fork", "--json").stdout)
    assert (shown["status"], shown["reason"], shown["graph_version"]) == (
        "suspended",
        "forked",
        version,
    )
    assert (shown["parent_thread_id"], shown["parent_revision"]) == ("susp", 1)
    head, revision = _head(store, "susp")
    assert revision == threads.susp_revision and head.parent_thread_id == ""  # untouched
    assert_one_line_error(
        store.flowy(
            "fork", "susp", "--revision", "1", "--new-thread", "susp-fork", "--graph", GRAPH
        ),
        1,
        "already exists",
    )
    resumed = store.flowy("resume", "susp-fork@1", "--graph", GRAPH)
    assert resumed.returncode == 0, resumed.stderr
    assert _head(store, "susp-fork")[0].status is flowy.RunStatus.HANDOFF
    on_version = json.loads(store.flowy("threads", "--version", version, "--json").stdout)
    assert "susp-fork" in [row["thread_id"] for row in on_version]
    assert all(row["graph_version"] == version for row in on_version)
    assert store.flowy("threads", "--version", "nope").stdout.startswith(
        "no threads saved by graph version 'nope'"
    )
    diff = json.loads(store.flowy("history", "susp", "--diff", "--json").stdout)
    assert [row["revision"] for row in diff] == list(range(2, threads.susp_revision + 1))
    assert store.flowy("history", "susp", "--diff").returncode == 0


# ------------------------------------------------------------------------- secrets

PLANTED = "pl4nted-Secret-9x"
"""A password in the store URL (PostgreSQL here trusts local connections, so any
password connects); no command may print it."""


@pytest.fixture(params=["postgres"])
def store_with_password(request: pytest.FixtureRequest) -> Iterator[Store]:
    with fresh_store(request, "secret") as made:
        parts = urllib.parse.urlsplit(made.url)
        netloc = f"{parts.username or 'postgres'}:{PLANTED}@{parts.hostname}:{parts.port or 5432}"
        yield Store(made.name, urllib.parse.urlunsplit(parts._replace(netloc=netloc)), made.env)


def test_no_command_prints_the_store_password(store_with_password: Store) -> None:
    store = store_with_password
    with environment(store):
        asyncio.run(populate(store.url))
    unreachable = store.url.replace(":5432/", ":1/")
    runs = [
        store.flowy("threads"),
        store.flowy("threads", "--json"),
        store.flowy("show", "dl"),
        store.flowy("show", "ho", "--json"),
        store.flowy("history", "ho"),
        store.flowy("dead-letters"),
        store.flowy("timers"),
        store.flowy("recover", "--thread", "orph"),
        store.flowy("worker", "--graph", GRAPH, "--once"),
        store.flowy("show", "nope"),
        run_flowy("threads", "--backend", unreachable, timeout=120),
        run_flowy("threads", "--backend", store.url + "&bogus=1"),
        run_flowy("threads", "--backend", store.url.replace(":5432/", ":99999/")),
        run_flowy("threads", env={"FLOWY_BACKEND": store.url + "&pool_size=0"}),
    ]
    assert runs[0].returncode == 0, runs[0].stderr
    assert "dl" in runs[0].stdout
    assert [run.returncode for run in runs[-5:]] == [1, 1, 2, 2, 2]
    checked = store.flowy(
        *("check", "check_graphs:unsafe_shop", "--scenario", "check_graphs:shop_scenario"),
        *("--seeds", "50"),
        timeout=300,
    )
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert "on postgresql://postgres:***@" in checked.stdout
    assert (
        "replay: flowy check" in checked.stdout
        and "--backend postgresql://postgres:***@" in checked.stdout
    )
    runs.append(checked)
    for run in runs:
        assert PLANTED not in run.stdout + run.stderr, (run.args, run.stdout, run.stderr)
        assert urllib.parse.quote(PLANTED) not in run.stdout + run.stderr
