"""``flowy cancel`` and ``flowy terminate`` on every store: one thread by id, many by
filters (dry run, pages, a limit, a re-run after an interruption); the bulk forms of
``flowy resume`` and ``flowy dead-letters --requeue``; and bad input as one line with
exit status 2.

SQLite, PostgreSQL, Redis and DynamoDB run the command as a real process; the memory
store, which another process cannot see, runs it in this process.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_support import (
    GRAPH,
    TESTS_DIR,
    Threads,
    assert_one_line_error,
    load,
    populate,
    run_flowy,
)
from core_graphs import approval_graph
from stores_support import ALL_STORES, Store, environment, fresh_store
from stores_support import dynamodb_endpoint as dynamodb_endpoint  # a fixture

import flowy
from flowy.cli._main import main


@pytest.fixture(params=ALL_STORES)
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    """A fresh, empty store of each kind, by URL."""
    with fresh_store(request, "cancel") as made:
        yield made


@pytest.fixture
def threads(store: Store) -> Threads:
    """``store`` filled by ``cli_support.populate``: ``susp`` (suspended at ``ask``),
    ``ho`` and ``dl`` (handed off), ``orph`` (an orphaned hand-off)."""
    with environment(store):
        return asyncio.run(populate(store.url))


class Proc:
    """What a run of the command printed and returned."""

    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def flowy_on(store: Store, capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    """``flowy ARGS --backend URL``: a process, or in this process for memory://."""
    if store.name != "memory":
        return store.flowy(*args)
    capsys.readouterr()
    code = main([*args, "--backend", store.url, "--color", "never"])
    captured = capsys.readouterr()
    return Proc(code, captured.out, captured.err)


def head(store: Store, thread: str) -> tuple[flowy.storage.Snapshot[Any], int]:
    with environment(store):
        return asyncio.run(load(store.url, thread))


def test_cancel_one_thread(
    store: Store, threads: Threads, capsys: pytest.CaptureFixture[str]
) -> None:
    proc = flowy_on(store, capsys, "cancel", "susp", "--reason", "the customer asked")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (
        f"canceled thread susp at revision {threads.susp_revision + 1} (was suspended): "
        "canceled: the customer asked"
    )
    snap, revision = head(store, "susp")
    assert (snap.status, snap.reason, revision) == (
        flowy.RunStatus.CANCELED,
        "canceled: the customer asked",
        threads.susp_revision + 1,
    )
    again = flowy_on(store, capsys, "cancel", "susp", "--json")
    assert again.returncode == 0, again.stderr
    data = json.loads(again.stdout)
    assert (data["changed"], data["revision"], data["status"]) == (
        False,
        threads.susp_revision + 1,
        "canceled",
    )


def test_terminate_one_thread(
    store: Store, threads: Threads, capsys: pytest.CaptureFixture[str]
) -> None:
    proc = flowy_on(store, capsys, "terminate", "ho", "--reason", "looping")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("terminated thread ho at revision"), proc.stdout
    snap, _ = head(store, "ho")
    assert (snap.status, snap.reason) == (flowy.RunStatus.FAILED, "terminated: looping")
    refused = flowy_on(store, capsys, "cancel", "ho")
    assert_one_line_error(refused, 1, "is failed", "no run to cancel")


def test_bulk_cancel_dry_run_then_pages_then_rerun(
    store: Store, threads: Threads, capsys: pytest.CaptureFixture[str]
) -> None:
    dry = flowy_on(store, capsys, "cancel", "--status", "handoff", "--node", "act", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.splitlines()
    assert [line.split()[2] for line in lines[:-1]] == ["dl", "ho", "orph"]
    assert lines[-1] == "dry run: would cancel 3 thread(s); nothing was changed"
    assert "page 1: 4 threads read" in dry.stderr
    assert head(store, "ho")[0].status is flowy.RunStatus.HANDOFF
    # Interrupted after one thread (--limit stands for the interruption), then run again.
    first = flowy_on(
        store, capsys, "cancel", "--status", "handoff", "--limit", "1", "--page-size", "2"
    )
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines()[-1] == "canceled 1 thread(s)"
    rest = flowy_on(store, capsys, "cancel", "--status", "handoff", "--page-size", "2")
    assert rest.returncode == 0, rest.stderr
    assert rest.stdout.splitlines()[-1] == "canceled 2 thread(s)"
    assert "page 2: 4 threads read" in rest.stderr
    done = flowy_on(store, capsys, "cancel", "--older-than", "0s", "--json")
    assert done.returncode == 0, done.stderr
    assert [row["thread_id"] for row in json.loads(done.stdout)] == ["susp"]
    for thread in ("dl", "ho", "orph", "susp"):
        snap, _ = head(store, thread)
        assert (snap.status, snap.reason) == (flowy.RunStatus.CANCELED, "canceled"), thread
    nothing = flowy_on(store, capsys, "cancel", "--older-than", "0s")
    assert nothing.stdout.splitlines()[-1] == "canceled 0 thread(s)"


def test_what_the_store_refuses_is_one_line(
    store: Store, threads: Threads, capsys: pytest.CaptureFixture[str]
) -> None:
    for args, code, needles in [
        (["cancel", "nobody"], 1, ["no thread 'nobody'"]),
        (["terminate", "nobody"], 1, ["no thread 'nobody'"]),
        (["cancel", "susp", "--reason", "x" * 600], 2, ["at most 500"]),
    ]:
        assert_one_line_error(flowy_on(store, capsys, *args), code, *needles)
    assert head(store, "susp")[0].status is flowy.RunStatus.SUSPENDED


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["cancel"], ["give the THREAD to cancel"]),
        (["cancel", "susp", "--status", "waiting"], ["not both"]),
        (["cancel", "--older-than", "7x"], ["--older-than", "7x"]),
        (["cancel", "--older-than", "-1d"], ["--older-than"]),
        (["cancel", "--status", "done"], ["--status", "invalid choice"]),
        (["cancel", "--dry-run"], ["--dry-run"]),
        (["cancel", "--limit", "0", "--status", "waiting"], ["--limit"]),
        (["cancel", "--stauts", "waiting"], ["--stauts"]),
        (["terminate"], ["THREAD"]),
        (["terminate", "susp", "--status", "waiting"], ["--status"]),
        (["resume", "--graph", GRAPH], ["give the THREAD[@N] to resume"]),
        (["resume", "susp", "--graph", GRAPH, "--node", "ask"], ["not both"]),
        (["resume", "--graph", GRAPH, "--status", "waiting"], ["--status", "invalid choice"]),
        (["resume", "--graph", GRAPH, "--node", "ask", "--at", "act"], ["--at"]),
        (["dead-letters", "--node", "act"], ["go with --requeue"]),
        (["dead-letters", "--requeue", "--retry", "1"], ["not both"]),
        (["dead-letters", "--requeue", "--older-than", "soon"], ["--older-than"]),
    ],
)
def test_typos_are_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], args: list[str], needles: list[str]
) -> None:
    """Usage errors, found before any store is opened (the memory store stands for all)."""
    proc = flowy_on(Store("memory", "memory://flowy-typos"), capsys, *args)
    assert_one_line_error(proc, 2, *needles)


def test_bulk_resume_and_requeue(
    store: Store, threads: Threads, capsys: pytest.CaptureFixture[str]
) -> None:
    graph = ["--graph", GRAPH]
    assert flowy_on(store, capsys, "cancel", "susp").returncode == 0
    dry = flowy_on(store, capsys, "resume", *graph, "--status", "canceled", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines() == [
        dry.stdout.splitlines()[0],
        "dry run: would resume 1 thread(s); nothing was changed",
    ]
    assert dry.stdout.startswith(f"would resume susp@{threads.susp_revision + 1} (canceled at ask")
    resumed = flowy_on(store, capsys, "resume", *graph, "--node", "ask")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.splitlines()[-1] == "resumed 1 thread(s), 0 failed or not resumed"
    assert "page 1: 4 threads read" in resumed.stderr
    assert head(store, "susp")[0].status is flowy.RunStatus.SUSPENDED
    again = flowy_on(store, capsys, "resume", *graph, "--older-than", "0s")
    assert again.stdout.splitlines()[-1] == "resumed 0 thread(s), 0 failed or not resumed"

    letters = ["dead-letters", "--requeue"]
    dry = flowy_on(store, capsys, *letters, "--error", "declined", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines() == [
        f"would requeue {threads.dead_message_id} (dl)",
        "dry run: would requeue 1 dead letter(s); nothing was changed",
    ]
    none = flowy_on(store, capsys, *letters, "--node", "elsewhere")
    assert none.stdout.splitlines() == ["requeued 0 dead letter(s)"]
    done = flowy_on(store, capsys, *letters, "--node", "act", "--older-than", "0s")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "requeued 1 dead letter(s)"
    assert "1 of 1 dead letters read" in done.stderr
    rerun = flowy_on(store, capsys, *letters)
    assert rerun.stdout.splitlines() == ["requeued 0 dead letter(s)"]


async def _suspend_many(url: str, count: int) -> None:
    async with flowy.connect(url) as backend:
        runner = flowy.Runner(approval_graph(), backend)
        for i in range(count):
            await runner.start(f"t{i:04d}", {})


PAGES = ("--page-size", "5", "--db")


def test_an_interrupted_bulk_cancel_leaves_each_thread_whole_and_a_rerun_finishes(
    tmp_path: Path,
) -> None:
    db = tmp_path / "flowy.db"
    asyncio.run(_suspend_many(f"sqlite:///{db}", 300))
    with subprocess.Popen(
        [sys.executable, "-m", "flowy.cli", "cancel", "--status", "suspended", *PAGES, str(db)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(TESTS_DIR), "PYTHONUNBUFFERED": "1"},
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        first = proc.stdout.readline()
        assert first.startswith("canceled thread t0000"), first
        proc.send_signal(signal.SIGINT)
        # Read on through the same buffered reader (communicate() would skip what it
        # holds); standard error is a few lines, far from filling its pipe meanwhile.
        rest = proc.stdout.read()
        err = proc.stderr.read()
        proc.wait(60)
    printed = [first, *rest.splitlines()]
    done = sum(line.startswith("canceled thread ") for line in printed)
    assert proc.returncode in (0, 130), err  # 0: it had finished before the signal
    if proc.returncode == 130:
        assert err.splitlines()[-1] == "flowy cancel: error: interrupted"

    async def statuses() -> list[flowy.RunStatus]:
        async with flowy.connect(f"sqlite:///{db}") as backend:
            heads = await backend.checkpointer.list_threads(limit=1000)
            return [h.status for h in heads]

    now = asyncio.run(statuses())
    assert set(now) <= {flowy.RunStatus.CANCELED, flowy.RunStatus.SUSPENDED}
    # Each printed cancel happened; the one in flight at the signal may have landed.
    canceled = now.count(flowy.RunStatus.CANCELED)
    assert done <= canceled <= done + 1, (done, canceled)
    rerun = run_flowy("cancel", "--status", "suspended", "--db", str(db))
    assert rerun.returncode == 0, rerun.stderr
    assert rerun.stdout.splitlines()[-1] == f"canceled {300 - canceled} thread(s)"
    assert set(asyncio.run(statuses())) == {flowy.RunStatus.CANCELED}
