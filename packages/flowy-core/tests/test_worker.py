"""flowy.Worker: at-least-once delivery without running a segment twice (``_worker.py``)."""

from __future__ import annotations

import asyncio
import logging
import time
import typing
from dataclasses import fields, replace
from typing import Any

import pytest
from core_graphs import PlainOutbox, State, linear_graph, merge

import flowy
from flowy import storage
from flowy import types as ftypes
from flowy.memory import MemoryBackend, MemoryConsumer
from flowy.storage import as_backend
from flowy.testing.faults import FaultyCheckpointer, FaultyOutbox, Phase

pytestmark = pytest.mark.anyio


def counted_graph(runs: list[str]) -> flowy.Graph[State, Any]:
    async def work(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {}, flowy.handoff("bg", resume_at="side_effect")

    async def side_effect(s: State) -> tuple[State, flowy.Directive[Any]]:
        runs.append(flowy.run_metadata().thread_id)
        return {"done": True}, flowy.completed()

    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    b.add_node("work", work).add_node("side_effect", side_effect)
    b.add_edge("work", "side_effect").allow_no_outgoing_route("side_effect")
    return b.compile()


def setup(runs: list[str]) -> tuple[flowy.Runner[State, Any], MemoryConsumer]:
    mem: MemoryBackend[State] = MemoryBackend()
    runner = flowy.Runner(
        counted_graph(runs), as_backend(mem.checkpointer, leases=mem.leases, outbox=mem.outbox)
    )
    return runner, mem.consumer


def failing_runner(mem: MemoryBackend[State], error: Exception) -> flowy.Runner[State, Any]:
    """A runner whose graph hands off to a node that raises ``error``."""

    async def work(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {}, flowy.handoff("bg", resume_at="broken")

    async def broken(s: State) -> tuple[State, flowy.Directive[Any]]:
        raise error

    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    b.add_node("work", work).add_node("broken", broken).add_edge("work", "broken")
    b.allow_no_outgoing_route("broken")
    return flowy.Runner(b.compile(), as_backend(mem.checkpointer, outbox=mem.outbox))


async def test_worker_resumes_handoffs_and_acks() -> None:
    runs: list[str] = []
    runner, queue = setup(runs)
    for i in range(5):
        await runner.start(f"t{i}", {}, run_lease=("fg", 5))
    worker = flowy.Worker(runner, queue, owner="w1", lease_ttl=5, concurrency=3)
    assert await worker.run_until_idle() == 5
    assert sorted(runs) == [f"t{i}" for i in range(5)]
    assert queue.pending_count() == 0
    assert worker.stats.outcomes["resumed"] == 5


async def test_redelivery_never_runs_a_segment_twice(caplog: pytest.LogCaptureFixture) -> None:
    runs: list[str] = []
    runner, queue = setup(runs)
    await runner.start("t", {}, run_lease=("fg", 5))
    (msg,) = await queue.claim(1, 0.01)  # a consumer claims and "crashes" before ack
    worker = flowy.Worker(runner, queue, owner="w1", lease_ttl=5)
    assert await worker.process(msg) is ftypes.Outcome.RESUMED
    # the same message is delivered again (crash after terminal save, before ack)
    again = storage.OutboxMessage(msg.message_id, msg.intent, msg.attempts + 1)
    caplog.set_level("INFO", logger="flowy.worker")
    assert await worker.process(again) is ftypes.Outcome.DUPLICATE
    assert runs == ["t"]
    assert "already resumed" in caplog.text


async def test_crash_before_ack_means_redelivery_and_one_run() -> None:
    runs: list[str] = []
    runner, queue = setup(runs)
    await runner.start("t", {}, run_lease=("fg", 5))
    crashed = await queue.claim(1, visibility_timeout=0.05)
    assert crashed  # claimed by a worker that died: no ack, no release
    await asyncio.sleep(0.06)
    worker = flowy.Worker(runner, queue, owner="w2", lease_ttl=5, visibility_timeout=0.05)
    assert await worker.run_until_idle() == 1
    assert runs == ["t"]
    assert queue.pending_count() == 0


async def test_two_workers_one_message_lease_decides() -> None:
    mem: MemoryBackend[State] = MemoryBackend()
    runs: list[str] = []
    gate = asyncio.Event()

    async def work(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {}, flowy.handoff("bg", resume_at="slow")

    async def slow(s: State) -> tuple[State, flowy.Directive[Any]]:
        runs.append("slow")
        await gate.wait()
        return s, flowy.completed()

    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    b.add_node("work", work).add_node("slow", slow).add_edge("work", "slow")
    b.allow_no_outgoing_route("slow")
    lm = mem.leases
    cp = mem.checkpointer
    queue = mem.outbox
    runner_a = flowy.Runner(b.compile(), as_backend(cp, leases=lm, outbox=queue))
    runner_b = flowy.Runner(b.compile(), as_backend(cp, leases=lm, outbox=queue))
    await runner_a.start("t", {}, run_lease=("fg", 5))
    (msg,) = await mem.consumer.claim(1, 30)
    wa = flowy.Worker(runner_a, mem.consumer, owner="a", lease_ttl=5)
    wb = flowy.Worker(runner_b, mem.consumer, owner="b", lease_ttl=5)
    task = asyncio.ensure_future(wa.process(msg))
    await asyncio.sleep(0.05)
    dup = storage.OutboxMessage(msg.message_id, msg.intent, 2)
    assert await wb.process(dup) in (ftypes.Outcome.RETRY,)
    gate.set()
    assert await task is ftypes.Outcome.RESUMED
    assert runs == ["slow"]


async def test_orphaned_message_goes_through_recovery() -> None:
    mem: MemoryBackend[State] = MemoryBackend()
    runs: list[str] = []
    lm = mem.leases
    cp = mem.checkpointer
    queue = mem.outbox
    outbox = FaultyOutbox(PlainOutbox(queue))
    outbox.arm(after_write=True, error=lambda: TimeoutError("ack lost"))  # lands, then errors
    runner = flowy.Runner(counted_graph(runs), as_backend(cp, leases=lm, outbox=outbox))
    r = await runner.start("t", {}, run_lease=("fg", 5))
    assert r.reason == flowy.Reason.HANDOFF_ORPHANED  # the orphan patch landed
    worker = flowy.Worker(runner, mem.consumer, owner="w", lease_ttl=5, stale_after=0)
    await worker.run_until_idle()
    assert runs == ["t"]
    assert worker.stats.outcomes["recovered"] == 1
    assert worker.stats.outcomes["resumed"] == 1


async def test_recovery_loop_leader_only() -> None:
    mem: MemoryBackend[State] = MemoryBackend()
    runs: list[str] = []
    lm = mem.leases
    cp = mem.checkpointer
    queue = mem.outbox
    outbox = FaultyOutbox(PlainOutbox(queue))
    outbox.arm(times=3, error=lambda: ConnectionError("down"))
    runner = flowy.Runner(counted_graph(runs), as_backend(cp, leases=lm, outbox=outbox))
    for i in range(3):
        r = await runner.start(f"t{i}", {}, run_lease=("fg", 5))
        assert r.reason == flowy.Reason.HANDOFF_ORPHANED
    w1 = flowy.Worker(runner, mem.consumer, owner="w1", recovery_interval=10)
    w2 = flowy.Worker(runner, mem.consumer, owner="w2", recovery_interval=10)
    assert await w1.recover_once() == 3
    assert await w2.recover_once() == 0  # not the leader
    await w1.run_until_idle()
    assert sorted(runs) == ["t0", "t1", "t2"]


async def test_graceful_shutdown_drains_in_flight() -> None:
    runs: list[str] = []
    runner, queue = setup(runs)
    for i in range(4):
        await runner.start(f"t{i}", {}, run_lease=("fg", 5))
    worker = flowy.Worker(runner, queue, owner="w", lease_ttl=5, concurrency=2, poll_interval=0.05)
    task = asyncio.ensure_future(worker.run())
    for _ in range(100):
        if len(runs) == 4:
            break
        await asyncio.sleep(0.01)
    worker.stop()
    await asyncio.wait_for(task, 5)
    assert sorted(runs) == [f"t{i}" for i in range(4)] and queue.pending_count() == 0


async def test_cancelling_run_while_recovery_winds_down_is_not_swallowed() -> None:
    runner, queue = setup([])
    worker = flowy.Worker(runner, queue, owner="w", poll_interval=0.01, recovery_interval=60)
    recovery_cancelled, let_go = asyncio.Event(), asyncio.Event()

    async def slow_to_stop(interval: float) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            recovery_cancelled.set()
            await let_go.wait()  # a recovery pass finishing its save
            raise

    worker._recovery.loop = slow_to_stop  # pyright: ignore[reportPrivateUsage]
    task = asyncio.ensure_future(worker.run())
    await asyncio.sleep(0.05)
    worker.stop()
    await asyncio.wait_for(recovery_cancelled.wait(), 5)
    task.cancel()  # run() is waiting for the recovery task: this cancel is ours, not its
    await asyncio.sleep(0.01)
    let_go.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)


async def test_node_error_is_logged_stored_retried_with_backoff_then_dead_lettered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    mem: MemoryBackend[State] = MemoryBackend(max_attempts=3)

    runner = failing_runner(mem, RuntimeError("always fails"))
    await runner.start("t", {})
    failures: list[ftypes.Failure] = []
    results: list[flowy.RunResult[Any, Any]] = []
    worker = flowy.Worker(
        runner,
        mem.consumer,
        owner="w",
        retry_delay=0.05,
        max_retry_delay=0.2,
        on_failure=failures.append,
        on_result=lambda _intent, result: results.append(result),
    )
    with caplog.at_level(logging.WARNING, logger="flowy.worker"):
        assert await worker.run_until_idle(idle_wait=0.5) == 3
    # Stored on the message, kept on the dead letter.
    [dead] = await mem.consumer.dead_letters()
    assert dead.attempts == 3
    assert dead.error == "run failed (node_error): RuntimeError: always fails"
    # Backoff: 0.05 then 0.1 (each up to 25 % more), then dead.
    assert [f.dead for f in failures] == [False, False, True]
    assert 0.05 <= failures[0].retry_in <= 0.0625 and 0.1 <= failures[1].retry_in <= 0.125
    assert all(isinstance(f.exception, RuntimeError) for f in failures)
    assert [r.reason for r in results] == ["node_error"] * 3
    assert worker.stats.outcomes["retry"] == 2 and worker.stats.outcomes["dead_lettered"] == 1
    # Logged with the traceback, thread id quoted.
    records = [r for r in caplog.records if r.name == "flowy.worker"]
    assert len(records) == 3 and all(r.exc_info is not None for r in records)
    assert "thread 't'" in records[0].getMessage() and records[-1].levelno == logging.ERROR


async def test_a_thread_id_cannot_forge_log_lines(caplog: pytest.LogCaptureFixture) -> None:
    mem: MemoryBackend[State] = MemoryBackend(max_attempts=1)

    runner = failing_runner(mem, RuntimeError("always fails"))
    forged = "t\nINFO flowy.worker: all good\x1b[2K\u202e"
    await runner.start(forged, {})
    worker = flowy.Worker(runner, mem.consumer, owner="w")
    with caplog.at_level(logging.DEBUG, logger="flowy"):
        assert await worker.run_until_idle(idle_wait=0.2) == 1
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("flowy")]
    assert any(repr(forged) in m for m in messages), messages
    for message in messages:
        assert "\n" not in message and "\x1b" not in message and "\u202e" not in message


async def test_default_backoff_waits_at_least_a_second_and_grows() -> None:
    mem: MemoryBackend[State] = MemoryBackend()
    runner = flowy.Runner(linear_graph(), mem)
    worker = flowy.Worker(runner)
    first, second, third = (worker.backoff(n) for n in (1, 2, 3))
    assert 1.0 <= first <= 1.25 and 2.0 <= second <= 2.5 and 4.0 <= third <= 5.0
    assert worker.backoff(50) == 300.0


async def test_a_released_message_is_not_redelivered_before_its_backoff() -> None:
    mem: MemoryBackend[State] = MemoryBackend(max_attempts=5)

    runner = failing_runner(mem, ValueError("bad input"))
    await runner.start("t", {})
    worker = flowy.Worker(runner, mem.consumer, owner="w")  # default backoff: >= 1 s
    (msg,) = await mem.consumer.claim(1, 30)
    assert await worker.process(msg) is ftypes.Outcome.RETRY
    assert await mem.consumer.claim(1, 30, wait=0.3) == []  # not within the backoff
    deadline = time.monotonic() + 5
    again: list[storage.OutboxMessage] = []
    while not again and time.monotonic() < deadline:
        again = await mem.consumer.claim(1, 30, wait=0.2)
    assert again and again[0].attempts == 2
    assert again[0].last_error == "run failed (node_error): ValueError: bad input"


async def test_worker_dying_mid_segment_after_a_saved_step_is_continued() -> None:
    mem: MemoryBackend[State] = MemoryBackend()
    ran: list[str] = []
    crash = {"armed": True}

    async def a(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {}, flowy.handoff("bg", resume_at="b")

    async def b(s: State) -> tuple[State, flowy.Directive[Any]]:
        ran.append("b")
        return {"b": True}, flowy.completed()  # a step save follows

    async def c(s: State) -> tuple[State, flowy.Directive[Any]]:
        if crash["armed"]:
            crash["armed"] = False
            raise asyncio.CancelledError  # the worker's task dies here
        ran.append("c")
        return {"c": True}, flowy.completed()

    builder: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    builder.add_node("a", a).add_node("b", b).add_node("c", c)
    builder.add_edge("a", "b").add_edge("b", "c").allow_no_outgoing_route("c")
    lm = mem.leases
    cp = mem.checkpointer
    queue = mem.outbox
    runner = flowy.Runner(builder.compile(), as_backend(cp, leases=lm, outbox=queue))
    await runner.start("t", {}, run_lease=("fg", 5))
    (msg,) = await mem.consumer.claim(1, visibility_timeout=0.05)
    worker = flowy.Worker(runner, mem.consumer, owner="w1", lease_ttl=5, visibility_timeout=0.05)
    with pytest.raises(asyncio.CancelledError):
        await worker.process(msg)  # died mid-segment: no ack
    head, _ = await cp.load("t")
    assert head.status in (flowy.RunStatus.RUNNING, flowy.RunStatus.CANCELED)
    await asyncio.sleep(0.06)
    w2 = flowy.Worker(runner, mem.consumer, owner="w2", lease_ttl=5, visibility_timeout=0.05)
    assert await w2.run_until_idle() == 1
    head, _ = await cp.load("t")
    assert head.status is flowy.RunStatus.COMPLETED
    assert ran == ["b", "c"]  # b ran once: the saved step was not repeated


async def test_a_run_that_loses_its_lease_after_a_saved_step_is_retried_not_acked() -> None:
    """The resumed run saves a step, then its end is refused (the lease was lost): the
    thread is still mid-run, so the message comes back and the next delivery finishes
    it from the saved step."""
    mem: MemoryBackend[State] = MemoryBackend()
    ran: list[str] = []

    async def a(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {}, flowy.handoff("bg", resume_at="b")

    async def b(s: State) -> tuple[State, flowy.Directive[Any]]:
        ran.append("b")
        return {"b": True}, flowy.completed()

    async def c(s: State) -> tuple[State, flowy.Directive[Any]]:
        ran.append("c")
        return {"c": True}, flowy.completed()

    builder: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    builder.add_node("a", a).add_node("b", b).add_node("c", c)
    builder.add_edge("a", "b").add_edge("b", "c").allow_no_outgoing_route("c")
    faulty = FaultyCheckpointer(mem.checkpointer)
    faulty.arm(Phase.SAVE_TERMINAL, error=lambda: flowy.LeaseLostError("lease taken over"))
    runner = flowy.Runner(
        builder.compile(), as_backend(faulty, leases=mem.leases, outbox=mem.outbox)
    )
    await flowy.Runner(builder.compile(), mem).start("t", {})
    # The refused run keeps its lease record until the TTL runs out (it believes the
    # lease gone): the next delivery waits that long (busy), then resumes.
    worker = flowy.Worker(runner, mem.consumer, owner="w", lease_ttl=0.3, retry_delay=0.0)
    assert await worker.run_until_idle(idle_wait=1.0) >= 2
    assert worker.stats.outcomes["retry"] >= 1
    assert worker.stats.outcomes["resumed"] == 1
    head, _ = await mem.checkpointer.load("t")
    assert head.status is flowy.RunStatus.COMPLETED
    assert ran == ["b", "c", "c"]  # b's saved step was not repeated
    assert mem.consumer.pending_count() == 0


async def test_a_node_failure_that_was_saved_is_acknowledged() -> None:
    mem: MemoryBackend[State] = MemoryBackend()

    async def a(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {}, flowy.handoff("bg", resume_at="b")

    async def b(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {"b": True}, flowy.completed()

    async def c(s: State) -> tuple[State, flowy.Directive[Any]]:
        return s, flowy.fail("refused_by_policy")

    builder: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    builder.add_node("a", a).add_node("b", b).add_node("c", c)
    builder.add_edge("a", "b").add_edge("b", "c").allow_no_outgoing_route("c")
    runner = flowy.Runner(builder.compile(), mem)
    await runner.start("t", {})
    worker = flowy.Worker(runner, owner="w", retry_delay=0.0)
    assert await worker.run_until_idle() == 1
    assert worker.stats.outcomes["resumed"] == 1
    assert (await mem.checkpointer.load("t"))[0].status is flowy.RunStatus.FAILED


async def test_a_second_delivery_of_a_running_thread_waits_for_the_first() -> None:
    """The visibility timeout runs out while this worker still runs the thread: the
    second delivery waits for the first run, then finds it done (no busy retries)."""
    mem: MemoryBackend[State] = MemoryBackend()
    gate = asyncio.Event()
    ran: list[str] = []

    async def a(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {}, flowy.handoff("bg", resume_at="slow")

    async def slow(s: State) -> tuple[State, flowy.Directive[Any]]:
        ran.append("slow")
        await gate.wait()
        return {"done": True}, flowy.completed()

    builder: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    builder.add_node("a", a).add_node("slow", slow).add_edge("a", "slow")
    builder.allow_no_outgoing_route("slow")
    runner = flowy.Runner(builder.compile(), mem)
    await runner.start("t", {})
    worker = flowy.Worker(
        runner, owner="w", concurrency=2, visibility_timeout=0.1, poll_interval=0.02
    )
    running = asyncio.ensure_future(worker.run())
    try:
        await asyncio.sleep(0.4)  # the message was claimed again meanwhile
        gate.set()
        for _ in range(100):
            if mem.consumer.pending_count() == 0:
                break
            await asyncio.sleep(0.02)
    finally:
        worker.stop()
        await running
    assert ran == ["slow"]
    assert worker.stats.outcomes["retry"] == 0
    assert worker.stats.outcomes["resumed"] == 1
    assert worker.stats.outcomes["duplicate"] >= 1
    assert mem.consumer.pending_count() == 0


async def test_a_thread_let_go_of_within_the_grace_period_resumes_at_once() -> None:
    """The run that handed off still holds the thread for a moment: the worker waits
    for it instead of giving the message back."""
    runs: list[str] = []
    runner, queue = setup(runs)
    await runner.start("t", {}, run_lease=("fg", 5))
    assert runner.lease_manager is not None
    held = await runner.lease_manager.acquire("t", "web", 5)

    async def let_go() -> None:
        await asyncio.sleep(0.2)
        assert runner.lease_manager is not None
        await runner.lease_manager.release(held)

    releasing = asyncio.ensure_future(let_go())
    worker = flowy.Worker(runner, queue, owner="w", lease_ttl=5, busy_grace=2.0)
    (msg,) = await queue.claim(1, 30)
    assert await worker.process(msg) is ftypes.Outcome.RESUMED
    await releasing
    assert runs == ["t"]
    assert worker.stats.outcomes["retry"] == 0


async def test_a_thread_still_held_comes_back_when_the_lease_would_run_out() -> None:
    """A dead worker's lease: the message is not retried within seconds (that would
    use up its deliveries) but once the lease would have expired."""
    runs: list[str] = []
    runner, queue = setup(runs)
    await runner.start("t", {}, run_lease=("fg", 5))
    assert runner.lease_manager is not None
    await runner.lease_manager.acquire("t", "dead-worker", 3.0)
    failures: list[ftypes.Failure] = []
    worker = flowy.Worker(
        runner, queue, owner="w", lease_ttl=5, busy_grace=0.1, on_failure=failures.append
    )
    (msg,) = await queue.claim(1, 30)
    assert await worker.process(msg) is ftypes.Outcome.RETRY
    assert runs == []
    assert 2.0 < failures[0].retry_in <= 3.0 + 0.1
    assert "thread busy" in failures[0].error


async def test_an_unavailable_store_is_one_warning_line_per_look(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # A closed SQLite store answers every call with StorageUnavailableError, as a store
    # that went away does.
    backend = await flowy.connect(f"sqlite:///{tmp_path / 'gone.db'}")
    worker = flowy.Worker(flowy.Runner(linear_graph(), backend))
    await backend.aclose()
    caplog.set_level(logging.DEBUG, logger="flowy.worker")
    assert await worker.run_until_idle(0.0) == 0
    records = [r for r in caplog.records if r.name == "flowy.worker"]
    warnings = [r for r in records if r.levelno >= logging.WARNING]
    assert {r.getMessage().split(": ")[1] for r in warnings} == {
        "claim failed",
        "listing due timers failed",
    }
    assert all(r.levelno == logging.WARNING and r.exc_info is None for r in warnings)
    assert len([r for r in records if r.levelno == logging.DEBUG and r.exc_info]) == 2


# --- WorkerOptions ------------------------------------------------------------------------


async def test_a_worker_runs_with_the_options_it_is_given_as_one_value() -> None:
    mem: MemoryBackend[State] = MemoryBackend()
    holders: list[str | None] = []

    async def work(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {}, flowy.handoff("bg", resume_at="side_effect")

    async def side_effect(s: State) -> tuple[State, flowy.Directive[Any]]:
        lease = await mem.leases.holder(flowy.run_metadata().thread_id)
        holders.append(None if lease is None else lease.owner)
        return {"done": True}, flowy.completed()

    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    b.add_node("work", work).add_node("side_effect", side_effect)
    b.add_edge("work", "side_effect").allow_no_outgoing_route("side_effect")
    runner = flowy.Runner(b.compile(), mem)
    for i in range(3):
        await runner.start(f"t{i}", {})
    results: list[str] = []
    options = ftypes.WorkerOptions(
        owner="w-opt",
        lease_ttl=5,
        timer_interval=None,
        on_result=lambda intent, result: results.append(intent.thread_id),
    )
    worker = flowy.Worker(runner, options=options)
    assert worker.options is options and worker.owner == "w-opt"
    assert await worker.run_until_idle() == 3
    assert holders == ["w-opt"] * 3
    assert sorted(results) == ["t0", "t1", "t2"]


async def test_keywords_build_the_options_alone_or_on_top_of_a_given_value() -> None:
    runner, queue = setup([])
    alone = flowy.Worker(runner, queue, lease_ttl=5, busy_grace=0.5)
    assert alone.options == ftypes.WorkerOptions(lease_ttl=5, busy_grace=0.5)
    base = ftypes.WorkerOptions(owner="w1", concurrency=2, retry_delay=0.1)
    varied = flowy.Worker(runner, queue, options=base, owner="w2")
    assert varied.options == replace(base, owner="w2") and varied.owner == "w2"
    assert base.owner == "w1"  # the given value is left as it was
    assert flowy.Worker(runner, queue).options == ftypes.WorkerOptions()


async def test_an_unknown_keyword_names_the_options_there_are() -> None:
    runner, queue = setup([])
    with pytest.raises(TypeError, match=r"'lease_tll'.*WorkerOptions: busy_grace, concurrency"):
        flowy.Worker(runner, queue, lease_tll=5)  # pyright: ignore[reportCallIssue]


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("owner", "", "non-empty owner"),
        ("concurrency", 0, "concurrency must be >= 1, got 0"),
        ("busy_grace", -1.0, "busy_grace must be >= 0 seconds, got -1.0"),
        ("busy_grace", float("nan"), "busy_grace must be >= 0 seconds, got nan"),
        ("retry_delay", 500.0, "0 <= retry_delay <= max_retry_delay"),
        ("retry_delay", -1.0, "0 <= retry_delay <= max_retry_delay"),
        ("retry_jitter", 1.5, "0 <= retry_jitter <= 1"),
    ],
)
async def test_options_out_of_range_are_refused_when_made(
    option: str, value: object, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        ftypes.WorkerOptions(**{option: value})  # pyright: ignore[reportArgumentType]
    runner, queue = setup([])
    with pytest.raises(ValueError, match=message):
        flowy.Worker(runner, queue, **{option: value})  # pyright: ignore[reportArgumentType]


def test_the_keywords_of_worker_are_the_fields_of_worker_options() -> None:
    from flowy._worker import WorkerKeywords

    keywords = typing.get_type_hints(WorkerKeywords)
    assert keywords == typing.get_type_hints(ftypes.WorkerOptions)
    assert list(keywords) == [f.name for f in fields(ftypes.WorkerOptions)]


async def test_reading_an_option_off_the_worker_still_works_with_a_deprecation_warning() -> None:
    runner, queue = setup([])
    worker = flowy.Worker(runner, queue, lease_ttl=5)
    with pytest.warns(DeprecationWarning, match=r"worker\.options\.lease_ttl"):
        assert worker.lease_ttl == 5  # pyright: ignore[reportAttributeAccessIssue]
    with pytest.warns(DeprecationWarning, match=r"worker\.options\.visibility_timeout"):
        assert worker.visibility_timeout == 20  # pyright: ignore[reportAttributeAccessIssue]
    with pytest.raises(AttributeError, match="no attribute 'lease_tll'"):
        _ = worker.lease_tll  # pyright: ignore[reportAttributeAccessIssue]
