"""The crash-safety checker (``flowy.testing.check`` and ``flowy check``): it finds a
double charge in an unsafe graph with a short schedule that replays, passes the safe
graph on memory and SQLite, fires every kind of fault, and reports each built-in
property, invariant and post-condition that breaks."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import check_graphs
import pytest
from check_graphs import (
    State,
    safe_shop,
    shop_scenario,
    unsafe_shop,
    waiting_graph,
    waiting_scenario,
)
from cli_support import TESTS_DIR, run_flowy

import flowy
from flowy import _segment
from flowy.memory import MemoryBackend, MemoryStore
from flowy.storage import HandoffIntent, OutboxMessage
from flowy.testing import Scenario, check
from flowy.testing.checking import Fault, FaultKind, parse_schedule


def test_finds_the_double_charge_with_a_short_schedule_that_replays() -> None:
    report = check(unsafe_shop(), shop_scenario, seeds=1000)
    assert not report.ok and report.failure is not None
    failure = report.failure
    assert report.seeds < 1000
    assert 1 <= len(failure.schedule) <= 3
    assert any("2 charges" in v for v in failure.violations), failure.violations
    text = str(report)
    assert "violated: post-condition charged_at_most_once failed: 2 charges" in text
    assert "rev 1   suspended at 'approve' (needs_approval)" in text
    # The printed schedule replays to the same failure, with the same faults.
    schedule = ",".join(str(f) for f in failure.schedule)
    again = check(unsafe_shop(), shop_scenario, replay=schedule, seed=failure.seed)
    assert again.failure is not None
    assert again.failure.schedule == failure.schedule
    assert again.failure.violations == failure.violations


def test_a_crash_between_the_charge_and_its_save_is_named_in_words() -> None:
    # The save after the charge is operation 6 of the fault-free run; crash before it.
    report = check(unsafe_shop(), shop_scenario, replay="crash-before@6")
    assert report.failure is not None
    (words,) = report.failure.words
    assert words == (
        "process 1 crashes after node 'charge' returned, before save #3 (handoff at "
        "'receipt') [crash-before@6]"
    )


def test_the_safe_graph_passes_and_every_store_fault_kind_fires() -> None:
    report = check(safe_shop(), shop_scenario, seeds=1500)
    assert report.ok, str(report)
    kinds = set(report.faults)
    assert {k.value for k in FaultKind} - kinds == {FaultKind.TIMER_FIRST.value}, kinds
    assert "passed 1500 seeds" in str(report)


def test_the_safe_graph_passes_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'check.db'}"
    report = check(safe_shop(), shop_scenario, seeds=200, store=url)
    assert report.ok, str(report)
    assert report.store == url
    bug = check(unsafe_shop(), shop_scenario, seeds=200, store=url)
    assert bug.failure is not None and f"store={url!r}" in bug.failure.replay


def test_a_check_on_a_store_url_removes_its_scratch_store_when_it_fails_or_is_cancelled(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'app.db'}"
    calls = 0

    def flaky_scenario() -> Scenario[Any]:
        nonlocal calls
        calls += 1
        if calls == 4:  # the probe, the clean run, seed 0, then this
            raise RuntimeError("the scenario's fixture broke")
        return shop_scenario()

    with pytest.raises(RuntimeError, match="fixture broke"):
        check(safe_shop(), flaky_scenario, seeds=5, store=url)
    assert list(tmp_path.iterdir()) == []  # no scratch file, and app.db never created

    def scratch_exists() -> bool:
        return any(tmp_path.iterdir())

    async def cancelled() -> None:
        task = asyncio.ensure_future(
            flowy.testing.acheck(safe_shop(), shop_scenario, seeds=10_000, store=url)
        )
        for _ in range(1000):  # until the scratch store exists
            if scratch_exists():
                break
            await asyncio.sleep(0.01)
        assert scratch_exists()
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancelled())
    assert list(tmp_path.iterdir()) == []


def test_the_checker_never_acks_a_message_it_did_not_create() -> None:
    """A store given as a factory is used as it is: a hand-off of a thread the check did
    not start is given back (never acked) and reported."""
    shared = MemoryStore()
    foreign = HandoffIntent(
        thread_id="refund-A1001",
        pending_snapshot_revision=1,
        committed_snapshot_revision=1,
        snapshot_revision=1,
        resume_token=flowy.ResumeToken("refund-A1001", 1),
        handoff_status=flowy.HandoffStatus.ENQUEUED,
        reason="send_receipt",
        execution_pointer="receipt",
        created_at=1.0,
    )
    asyncio.run(MemoryBackend(shared).outbox.enqueue_intent(foreign))
    report = check(safe_shop(), shop_scenario, seeds=1, store=lambda: MemoryBackend(shared))
    assert report.failure is not None
    assert any("did not create" in v for v in report.failure.violations), str(report)
    (message,) = shared.messages.values()  # still live: not acked, not dead-lettered
    assert message.thread_id == "refund-A1001" and not shared.dead


def test_drop_scratch_refuses_a_store_that_is_not_a_scratch_store(tmp_path: Path) -> None:
    async def main() -> None:
        async with flowy.connect(f"sqlite:///{tmp_path / 'app.db'}") as backend:
            assert isinstance(backend, flowy.storage.dialect.BaseBackend)
            with pytest.raises(RuntimeError, match="not a scratch store"):
                await backend.drop_scratch()
        assert (tmp_path / "app.db").exists()

    asyncio.run(main())


def test_flowy_check_refuses_a_store_that_cannot_be_namespaced() -> None:
    proc = run_flowy(
        "check",
        "noscratch_store:graph",
        "--scenario",
        "noscratch_store:scenario",
        "--backend",
        "noscratch://app:hunter2@db/shop",
    )
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stderr.count("\n") == 1 and "cannot be namespaced" in proc.stderr, proc.stderr
    assert "hunter2" not in proc.stderr + proc.stdout


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a child process is POSIX")
def test_ctrl_c_during_flowy_check_removes_its_scratch_store(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(TESTS_DIR), "PYTHONIOENCODING": "utf-8"}
    env.pop("FLOWY_BACKEND", None)
    store = f"sqlite:///{tmp_path / 'app.db'}"
    command = [sys.executable, "-m", "flowy.cli", "check", "check_graphs:safe_shop"]
    options = ["--scenario", "check_graphs:shop_scenario", "--seeds", "100000", "--backend", store]
    proc = subprocess.Popen(
        [*command, *options],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not any(tmp_path.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any(tmp_path.iterdir()), "the check never opened its scratch store"
        time.sleep(0.5)  # well into the runs
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, (out, err)
    assert err == "flowy check: error: interrupted\n"
    assert list(tmp_path.iterdir()) == []  # the scratch file is gone; app.db never existed


def test_timers_race_signals() -> None:
    report = check(waiting_graph(), waiting_scenario, seeds=300)
    assert report.ok, str(report)
    assert report.faults.get(FaultKind.TIMER_FIRST.value, 0) > 0


def test_runs_are_deterministic() -> None:
    first = check(unsafe_shop(), shop_scenario, seeds=1000, first_seed=5)
    second = check(unsafe_shop(), shop_scenario, seeds=1000, first_seed=5)
    assert first.failure is not None and second.failure is not None
    assert (first.failure.seed, first.failure.schedule, first.failure.history) == (
        second.failure.seed,
        second.failure.schedule,
        second.failure.history,
    )


def test_crashed_runs_leave_no_thread_marked_running() -> None:
    check(safe_shop(), shop_scenario, seeds=200)
    assert not _segment._running  # pyright: ignore[reportPrivateUsage]


def test_an_invariant_that_breaks_is_reported_with_its_revision() -> None:
    @flowy.invariant
    def never_charged(state: State) -> bool:
        return "receipt" not in state

    report = check(safe_shop(), shop_scenario, seeds=5, invariants=[never_charged])
    assert report.failure is not None
    assert report.failure.violations == (
        "invariant never_charged broke at revision 3: invariant never_charged does not hold",
    )
    assert report.failure.words == ("no fault",)  # the fault-free run already fails


def test_invariants_of_the_scenario_module_are_found(tmp_path: Path) -> None:
    (tmp_path / "shop_rules.py").write_text(
        "import flowy\n"
        "from check_graphs import shop_scenario\n\n"
        "@flowy.invariant\n"
        "def small_orders(state):\n"
        "    assert state['order'] == 'B-2', 'not the order we expected'\n\n"
        "def scenario():\n"
        "    return shop_scenario()\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        import shop_rules  # pyright: ignore[reportMissingImports]

        report = check(safe_shop(), shop_rules.scenario, seeds=1)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("shop_rules", None)
    assert report.failure is not None
    assert report.failure.violations == (
        "invariant small_orders broke at revision 1: not the order we expected",
    )


def test_exactly_once_counts_the_calls() -> None:
    def scenario() -> Scenario[State]:
        story = shop_scenario()
        return Scenario(
            state=story.state,
            bindings=story.bindings,
            approve=story.approve,
            exactly_once={"charge:A-1", "refund:A-1"},
        )

    report = check(safe_shop(), scenario, seeds=1)
    assert report.failure is not None
    assert report.failure.violations == (
        "activity 'refund:A-1' was called 0 times, not exactly once",
    )


async def _charge_x(state: State) -> Any:
    gateway = flowy.binding(check_graphs.GATEWAY)
    await flowy.activity(gateway.charge, "x", key="charge:x", idempotent=state.get("again", False))
    return {}, flowy.completed()


def _charge_graph() -> flowy.Graph[State, Any]:
    return (
        flowy.GraphBuilder(check_graphs.merge)
        .add_node("charge", _charge_x)
        .allow_no_outgoing_route("charge")
        .compile()
    )


def _charge_scenario(idempotent: bool) -> Scenario[State]:
    gateway = check_graphs.Gateway()
    return Scenario(
        state={"again": idempotent},
        bindings=flowy.bind(flowy.RunBindings(), check_graphs.GATEWAY, gateway),
    )


class _Forgetful(MemoryBackend[Any]):
    """A store whose journal forgets every activity: a node run again calls again."""

    def __init__(self) -> None:
        super().__init__()

        async def get_activity(thread_id: str, key: str) -> None:
            return None

        self.checkpointer.get_activity = get_activity  # type: ignore[method-assign]


def test_an_activity_called_twice_is_reported_unless_idempotent() -> None:
    report = check(_charge_graph(), lambda: _charge_scenario(True), seeds=300, store=_Forgetful)
    assert report.ok, str(report)  # idempotent: calling it again is allowed
    report = check(_charge_graph(), lambda: _charge_scenario(False), seeds=300, store=_Forgetful)
    assert report.failure is not None
    assert "activity 'charge:x' was called 2 times" in report.failure.violations
    # The real journal keeps the outcome: never called twice.
    assert check(_charge_graph(), lambda: _charge_scenario(False), seeds=300).ok


class _Deaf(MemoryBackend[Any]):
    """A store whose consumer never hands out a message: every hand-off is lost."""

    def __init__(self) -> None:
        super().__init__()

        async def claim(*args: Any, **kwargs: Any) -> list[OutboxMessage]:
            return []

        self.consumer.claim = claim  # type: ignore[method-assign]


def test_a_lost_hand_off_is_reported() -> None:
    report = check(safe_shop(), shop_scenario, seeds=1, store=_Deaf)
    assert report.failure is not None
    assert "a hand-off was lost: the thread ended enqueued" in report.failure.violations
    assert report.store == "_Deaf"


class _NoWakeUps(MemoryBackend[Any]):
    """A store whose outbox loses the wake-up message of every signal."""

    def __init__(self) -> None:
        super().__init__()

        async def enqueue_intent(intent: Any) -> None:
            return None

        self.outbox.enqueue_intent = enqueue_intent  # type: ignore[method-assign]


def test_a_signal_that_never_wakes_the_thread_is_reported() -> None:
    assert check(check_graphs.patient_graph(), waiting_scenario, seeds=100).ok
    report = check(check_graphs.patient_graph(), waiting_scenario, seeds=1, store=_NoWakeUps)
    assert report.failure is not None
    assert report.failure.violations == ("the thread never woke for the 'go' signal it was sent",)


def test_a_hand_off_resumed_twice_is_reported() -> None:
    from flowy.testing.checking import _verify  # pyright: ignore[reportPrivateUsage]

    done = flowy.RunResult(
        "t", {}, flowy.RunStatus.COMPLETED, "completed", "x", segment=2, revision=7
    )
    again = flowy.RunResult(
        "t", {}, flowy.RunStatus.COMPLETED, "completed", "x", segment=2, revision=9
    )
    snap: Any = type("Head", (), {"status": flowy.RunStatus.COMPLETED})()
    problems = asyncio.run(_verify.handoffs(snap, MemoryBackend[Any](), "t", [done, again]))
    assert problems == [
        "a hand-off was resumed twice: two runs of segment 2 saved their ends, at revisions 7 and 9"
    ]


def test_parse_schedule_and_its_errors() -> None:
    assert parse_schedule("redeliver@9, crash-before@2") == (
        Fault(2, FaultKind.CRASH_BEFORE),
        Fault(9, FaultKind.REDELIVER),
    )
    for bad in ("crash@2", "crash-before@0", "crash-before", "x" * 500):
        with pytest.raises(ValueError, match="bad fault"):
            parse_schedule(bad)


def test_check_refuses_a_running_loop_and_bad_arguments() -> None:
    async def inside() -> None:
        check(safe_shop(), shop_scenario, seeds=1)

    with pytest.raises(RuntimeError, match="await acheck"):
        asyncio.run(inside())
    with pytest.raises(ValueError, match="seeds >= 1"):
        check(safe_shop(), shop_scenario, seeds=0)
    with pytest.raises(TypeError, match=r"not a flowy\.testing\.Scenario"):
        check(safe_shop(), lambda: {"state": {}}, seeds=1)  # type: ignore[arg-type, return-value]
    with pytest.raises(ValueError, match="no module named"):
        check("nowhere_at_all:graph", shop_scenario, seeds=1)


def test_flowy_check_passes_fails_and_replays() -> None:
    ok = run_flowy(
        "check",
        "check_graphs:safe_shop",
        "--scenario",
        "check_graphs:shop_scenario",
        "--seeds",
        "200",
    )
    assert ok.returncode == 0, ok.stderr
    assert "flowy check check_graphs:safe_shop on memory://: passed 200 seeds" in ok.stdout
    bad = run_flowy("check", "check_graphs:unsafe_shop", "--scenario", "check_graphs:shop_scenario")
    assert bad.returncode == 1, bad.stderr
    replay = re.search(r"replay: (flowy check .*)$", bad.stdout, re.M)
    assert replay is not None, bad.stdout
    assert replay.group(1).startswith(
        "flowy check check_graphs:unsafe_shop --scenario check_graphs:shop_scenario --seed "
    )
    again = run_flowy(*replay.group(1).split()[1:])
    assert again.returncode == 1

    def told(out: str) -> list[str]:
        return [line for line in out.splitlines() if "violated:" in line or "[" in line]

    assert told(again.stdout) == told(bad.stdout) != []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["check_graphs:nope", "--scenario", "check_graphs:shop_scenario"],
            "has no attribute 'nope'",
        ),
        (
            ["check_graphs:safe_shop", "--scenario", "check_graphs:nope"],
            "--scenario 'check_graphs:nope'",
        ),
        (["check_graphs:safe_shop", "--scenario", "check_graphs:GATEWAY"], "must name a function"),
        (["check_graphs:safe_shop", "--scenario", "check_graphs:merge"], "--scenario"),
        (
            [
                "check_graphs:safe_shop",
                "--scenario",
                "check_graphs:shop_scenario",
                "--replay",
                "oops",
            ],
            "--replay: bad fault",
        ),
        (
            ["check_graphs:safe_shop", "--scenario", "check_graphs:shop_scenario", "--seeds", "0"],
            "--seeds",
        ),
        (["check_graphs:safe_shop"], "--scenario"),
    ],
)
def test_flowy_check_mistakes_are_one_line_and_exit_2(args: list[str], message: str) -> None:
    proc = run_flowy("check", *args)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
    assert proc.stderr.startswith("flowy check: error: ")


def test_the_demo_refund_agent_passes() -> None:
    proc = run_flowy(
        "check",
        "flowy.cli.demo:build_graph",
        "--scenario",
        "flowy.testing.demo:refund_scenario",
        "--seeds",
        "100",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "passed 100 seeds" in proc.stdout
