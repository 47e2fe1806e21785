"""Runner-level contracts of durable time on a real store: sleeps and waits that a
``flowy.Worker`` wakes, signals delivered once and in order, and activities recorded in
the thread's journal (replayed, unknown, retried as a durable timer).

These run the real ``flowy.Runner`` and ``flowy.Worker`` over the store, with a peer
backend (a second connection, as a second process would have) where a race matters.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any, ClassVar

import pytest

from ..._activities import ActivityRetry, activity
from ..._directives import Directive, completed, end, sleep, sleep_until, wait_for
from ..._errors import (
    ActivityFailedError,
    ActivityOutcomeUnknownError,
    ThreadCompletedError,
    ThreadNotFoundError,
)
from ..._graph import Graph, GraphBuilder
from ..._runner import Runner
from ..._worker import Worker
from ...storage import ActivityRecord, ActivityStatus, Backend, DurableCheckpointer, RunStatus
from ._durable import require_durable
from ._support import Suite, new_thread_id, peer_of

__all__ = ["ActivitySuite", "WaitSuite"]

State = dict[str, Any]


def _merge(state: State, update: State) -> State:
    return {**state, **update}


def _worker(runner: Runner[State, Any], **kw: Any) -> Worker[State, Any]:
    return Worker(runner, lease_ttl=5.0, timer_interval=0.05, retry_delay=0.05, **kw)


def _wait_graph(log: list[str], *, timeout: float | None = None) -> Graph[State, Any]:
    """A graph: start, wait for "approval", decide (or, on the deadline, escalate)."""

    async def start(s: State) -> tuple[State, Directive[Any]]:
        log.append("start")
        return {}, wait_for("approval", timeout=timeout, resume_at="decide")

    async def decide(s: State) -> tuple[State, Directive[Any]]:
        log.append(f"decide:{s.get('answer')}")
        return {"decided": s.get("answer")}, end()

    async def escalate(s: State) -> tuple[State, Directive[Any]]:
        log.append("escalate")
        return {"escalated": True}, end()

    builder: GraphBuilder[State, Any] = GraphBuilder(_merge)
    return (
        builder.add_node("start", start)
        .add_node("decide", decide)
        .add_node("escalate", escalate)
        .add_edge("start", "decide")
        .add_timeout_route("start", "escalate")
        .allow_no_outgoing_route("decide", "escalate")
        .compile()
    )


class WaitSuite(Suite):
    """``sleep`` / ``wait_for`` save a waiting head; workers wake it once; signals are
    kept, delivered in order, once, and refused for unknown or finished threads."""

    requires: ClassVar[tuple[str, ...]] = ("durable_timers_signals", "handoff_outbox", "consumer")

    async def test_sleep_waits_then_a_worker_wakes_it(self, flowy_backend: Backend[Any]) -> None:
        ran: list[str] = []

        async def nap(s: State) -> tuple[State, Directive[Any]]:
            ran.append("nap")
            return {"slept": True}, sleep(0.4, resume_at="after")

        async def after(s: State) -> tuple[State, Directive[Any]]:
            ran.append("after")
            return {"woke": True}, completed()

        builder: GraphBuilder[State, Any] = GraphBuilder(_merge)
        graph = (
            builder.add_node("nap", nap)
            .add_node("after", after)
            .add_edge("nap", "after")
            .allow_no_outgoing_route("after")
            .compile()
        )
        runner = Runner(graph, flowy_backend)
        tid = new_thread_id("sleep")
        before = time.time()
        result = await runner.start(tid, {})
        assert result.status is RunStatus.WAITING and result.resume_token is not None
        head, _ = await runner.head(tid)
        assert head.wake_at is not None and before + 0.4 <= head.wake_at <= time.time() + 0.4
        durable = require_durable(flowy_backend)
        assert tid in [t.thread_id for t in await durable.timers(limit=10_000)]
        worker = _worker(runner)
        assert await worker.fire_timers() == 0  # not due yet
        assert ran == ["nap"]
        await asyncio.sleep(0.5)
        assert await worker.fire_timers() == 1
        head, _ = await runner.head(tid)
        assert head.status is RunStatus.COMPLETED and head.state == {"slept": True, "woke": True}
        assert ran == ["nap", "after"]
        assert tid not in [t.thread_id for t in await durable.timers(limit=10_000)]

    async def test_sleep_until_a_past_time_is_due_at_once(
        self, flowy_backend: Backend[Any]
    ) -> None:
        async def nap(s: State) -> tuple[State, Directive[Any]]:
            return {"n": s["n"] + 1}, sleep_until(1.0) if s["n"] == 0 else end()

        builder: GraphBuilder[State, Any] = GraphBuilder(_merge)
        graph = builder.add_node("nap", nap).allow_no_outgoing_route("nap").compile()
        runner = Runner(graph, flowy_backend)
        tid = new_thread_id("past")
        assert (await runner.start(tid, {"n": 0})).status is RunStatus.WAITING
        assert await _worker(runner).fire_timers() == 1
        head, _ = await runner.head(tid)
        assert head.status is RunStatus.COMPLETED and head.state == {"n": 2}

    async def test_two_workers_fire_a_timer_once(self, flowy_backend: Backend[Any]) -> None:
        runs: list[str] = []

        async def nap(s: State) -> tuple[State, Directive[Any]]:
            return {}, sleep(0.0, resume_at="work")

        async def work(s: State) -> tuple[State, Directive[Any]]:
            runs.append(s["id"])
            await asyncio.sleep(0.05)
            return {"done": True}, completed()

        builder: GraphBuilder[State, Any] = GraphBuilder(_merge)
        graph = (
            builder.add_node("nap", nap)
            .add_node("work", work)
            .add_edge("nap", "work")
            .allow_no_outgoing_route("work")
            .compile()
        )
        threads = [new_thread_id(f"race{i}") for i in range(6)]
        runner = Runner(graph, flowy_backend, run_lease=("a", 5.0))
        for tid in threads:
            await runner.start(tid, {"id": tid})
        async with peer_of(flowy_backend) as peer:
            other = Runner(graph, peer, run_lease=("b", 5.0))
            fired = await asyncio.gather(
                _worker(runner, owner="a").fire_timers(limit=10_000),
                _worker(other, owner="b").fire_timers(limit=10_000),
            )
        for tid in threads:
            head, _ = await runner.head(tid)
            assert head.status is RunStatus.COMPLETED
        assert sorted(runs) == sorted(threads)  # each woke exactly once
        assert sum(fired) >= len(threads)  # others' timers may be due in a shared store

    async def test_a_signal_wakes_the_wait_through_a_worker(
        self, flowy_backend: Backend[Any]
    ) -> None:
        log: list[str] = []
        runner = Runner(_wait_graph(log, timeout=60), flowy_backend)
        tid = new_thread_id("signal")
        result = await runner.start(tid, {})
        assert result.status is RunStatus.WAITING and result.reason == "waiting:approval"
        head, _ = await runner.head(tid)
        assert head.waiting_for == "approval" and head.on_timeout == "escalate"
        async with peer_of(flowy_backend) as peer:
            sender = Runner(_wait_graph([]), peer)
            stored = await sender.signal(tid, "approval", {"answer": "yes"}, signal_id="hook-1")
        assert stored.seq == 1
        await _worker(runner).run_until_idle(0.1)
        head, _ = await runner.head(tid)
        assert head.status is RunStatus.COMPLETED
        assert head.state == {"answer": "yes", "decided": "yes"}
        assert dict(head.signal_cursors) == {"approval": 1}
        assert log == ["start", "decide:yes"]

    async def test_a_repeated_signal_is_delivered_once(self, flowy_backend: Backend[Any]) -> None:
        counted: list[Any] = []

        def count(state: State, payload: Any) -> State:
            counted.append(payload)
            return {**state, "approvals": state.get("approvals", 0) + 1}

        async def wait(s: State) -> tuple[State, Directive[Any]]:
            return {}, wait_for("approval", resume_at="done")

        async def done(s: State) -> tuple[State, Directive[Any]]:
            return {}, completed()

        builder: GraphBuilder[State, Any] = GraphBuilder(_merge)
        graph = (
            builder.add_node("wait", wait)
            .add_node("done", done)
            .add_edge("wait", "done")
            .allow_no_outgoing_route("done")
            .on_signal("approval", count)
            .compile()
        )
        runner = Runner(graph, flowy_backend)
        tid = new_thread_id("once")
        await runner.start(tid, {})
        for _ in range(3):
            await runner.signal(tid, "approval", "ok", signal_id="same-event")
        await _worker(runner).run_until_idle(0.1)
        head, _ = await runner.head(tid)
        assert head.status is RunStatus.COMPLETED and head.state == {"approvals": 1}
        assert counted == ["ok"]
        assert len(await require_durable(flowy_backend).signals(tid)) == 1

    async def test_signals_sent_early_are_kept_in_order(self, flowy_backend: Backend[Any]) -> None:
        async def idle(s: State) -> tuple[State, Directive[Any]]:
            return {}, sleep(3600, resume_at="ask")

        async def ask(s: State) -> tuple[State, Directive[Any]]:
            if len(s["got"]) == 2:
                return {}, end()
            return {}, wait_for("answer", resume_at="ask")

        def take(state: State, payload: Any) -> State:
            return {**state, "got": [*state["got"], payload]}

        builder: GraphBuilder[State, Any] = GraphBuilder(_merge)
        graph = (
            builder.add_node("idle", idle)
            .add_node("ask", ask)
            .add_edge("idle", "ask")
            .add_edge("ask", "ask")
            .on_signal("answer", take)
            .compile(max_steps=10)
        )
        runner = Runner(graph, flowy_backend)
        tid = new_thread_id("order")
        parked = await runner.start(tid, {"got": []})  # asleep: not waiting for "answer"
        assert parked.status is RunStatus.WAITING and parked.resume_token is not None
        await runner.signal(tid, "other", "ignored")
        await runner.signal(tid, "answer", "first")
        await runner.signal(tid, "answer", "second")
        done = await runner.resume(parked.resume_token)  # an early wake, by token
        assert done.status is RunStatus.COMPLETED, done
        assert done.state == {"got": ["first", "second"]}
        head, _ = await runner.head(tid)
        assert dict(head.signal_cursors) == {"answer": 3}

    async def test_the_deadline_takes_the_timeout_route(self, flowy_backend: Backend[Any]) -> None:
        log: list[str] = []
        runner = Runner(_wait_graph(log, timeout=0.2), flowy_backend)
        tid = new_thread_id("timeout")
        await runner.start(tid, {})
        await asyncio.sleep(0.3)
        assert await _worker(runner).fire_timers() >= 1
        head, _ = await runner.head(tid)
        assert head.status is RunStatus.COMPLETED and head.state == {"escalated": True}
        assert log == ["start", "escalate"]
        with pytest.raises(ThreadCompletedError):
            await runner.signal(tid, "approval", {"answer": "late"})

    async def test_only_a_due_deadline_takes_the_timeout_route(
        self, flowy_backend: Backend[Any]
    ) -> None:
        """Before its deadline a wait is not fired, and a resume by token goes on at the
        resume node without a signal; after it, the same resume takes the timeout route."""
        log: list[str] = []
        runner = Runner(_wait_graph(log, timeout=60), flowy_backend)
        early = new_thread_id("early")
        waiting = await runner.start(early, {})
        assert waiting.status is RunStatus.WAITING and waiting.resume_token is not None
        await _worker(runner).fire_timers(limit=10_000)
        head, _ = await runner.head(early)
        assert head.status is RunStatus.WAITING and log == ["start"]
        done = await runner.resume(waiting.resume_token)
        assert done.status is RunStatus.COMPLETED, done
        assert done.state == {"decided": None}
        assert log == ["start", "decide:None"]

        late_log: list[str] = []
        late = new_thread_id("late")
        late_runner = Runner(_wait_graph(late_log, timeout=0.2), flowy_backend)
        parked = await late_runner.start(late, {})
        assert parked.resume_token is not None
        await asyncio.sleep(0.3)
        timed_out = await late_runner.resume(parked.resume_token)
        assert timed_out.status is RunStatus.COMPLETED and timed_out.state == {"escalated": True}
        assert late_log == ["start", "escalate"]

    async def test_a_signal_beats_a_due_deadline(self, flowy_backend: Backend[Any]) -> None:
        log: list[str] = []
        runner = Runner(_wait_graph(log, timeout=0.1), flowy_backend)
        tid = new_thread_id("beat")
        await runner.start(tid, {})
        await asyncio.sleep(0.2)
        await runner.signal(tid, "approval", {"answer": "in time"})
        await _worker(runner).run_until_idle(0.1)
        head, _ = await runner.head(tid)
        assert head.state["decided"] == "in time"
        assert log == ["start", "decide:in time"]

    async def test_signals_to_unknown_threads_are_refused(
        self, flowy_backend: Backend[Any]
    ) -> None:
        runner = Runner(_wait_graph([]), flowy_backend)
        tid = new_thread_id("nobody")
        with pytest.raises(ThreadNotFoundError):
            await runner.signal(tid, "approval", {})
        assert await require_durable(flowy_backend).signals(tid) == []
        with pytest.raises(ValueError):
            await runner.signal(tid, "", {})


class _Gateway:
    """A fake payment gateway that counts its calls and can fail or "crash"."""

    def __init__(self, failures: int = 0) -> None:
        self.calls: list[str] = []
        self.failures = failures

    async def charge(self, order: str, amount: int) -> dict[str, Any]:
        self.calls.append(order)
        if len(self.calls) <= self.failures:
            raise ConnectionError(f"gateway down (call {len(self.calls)})")
        return {"charge": f"ch_{order}", "amount": amount}


class _PeekingGateway(_Gateway):
    """A gateway that, when called, reads the call's journal entry from another backend."""

    def __init__(self, journal: DurableCheckpointer[Any], thread_id: str) -> None:
        super().__init__()
        self.journal = journal
        self.thread_id = thread_id
        self.seen: list[ActivityRecord | None] = []

    async def charge(self, order: str, amount: int) -> dict[str, Any]:
        self.seen.append(await self.journal.get_activity(self.thread_id, "charge"))
        return await super().charge(order, amount)


def _pay_graph(gateway: _Gateway, **options: Any) -> Graph[State, Any]:
    async def pay(s: State) -> tuple[State, Directive[Any]]:
        try:
            receipt = await activity(gateway.charge, s["order"], 42, **options)
        except (ActivityOutcomeUnknownError, ActivityFailedError) as exc:
            return {"error": type(exc).__name__}, end()
        if s.get("crash_after_charge"):
            raise RuntimeError("crashed after the charge, before the save")
        return {"receipt": receipt}, completed()

    builder: GraphBuilder[State, Any] = GraphBuilder(_merge)
    # The same version as the seeding graph's: threads move between the two.
    return builder.add_node("pay", pay).allow_no_outgoing_route("pay").compile(version="payments")


class ActivitySuite(Suite):
    """``flowy.activity`` records each call in the store: replayed after a re-run, never
    called again when its outcome is unknown, retried as a durable timer."""

    requires: ClassVar[tuple[str, ...]] = ("journal", "durable_timers_signals")

    async def test_a_rerun_node_gets_the_recorded_result(self, flowy_backend: Backend[Any]) -> None:
        gateway = _Gateway()
        runner = Runner(_pay_graph(gateway, key="charge"), flowy_backend)
        tid = new_thread_id("replay")
        seed = Runner(_seed_graph(), flowy_backend)
        token = (await seed.start(tid, {"order": "o-1", "crash_after_charge": True})).resume_token
        assert token is not None
        first = await runner.resume(token)
        assert first.status is RunStatus.FAILED and gateway.calls == ["o-1"]  # nothing saved
        journal = await require_durable(flowy_backend, "journal").journal(tid)
        assert [(r.key, r.status, r.attempts) for r in journal] == [
            ("charge", ActivityStatus.SUCCEEDED, 1)
        ]
        again = await runner.resume(token, state_overlay={"crash_after_charge": False})
        assert again.status is RunStatus.COMPLETED
        assert again.state["receipt"] == {"charge": "ch_o-1", "amount": 42}
        assert gateway.calls == ["o-1"]  # not called again

    async def test_an_unknown_outcome_is_never_called_again(
        self, flowy_backend: Backend[Any]
    ) -> None:
        gateway = _Gateway()
        tid = await _started_but_unrecorded(flowy_backend, "unknown")
        runner = Runner(_pay_graph(gateway, key="charge"), flowy_backend)
        result = await runner.resume((await runner.head(tid))[1])
        assert result.state["error"] == "ActivityOutcomeUnknownError"
        assert gateway.calls == []

    async def test_reconcile_learns_the_outcome(self, flowy_backend: Backend[Any]) -> None:
        gateway = _Gateway()
        looked_up: list[str] = []

        async def find(order: str, amount: int) -> dict[str, Any]:
            looked_up.append(order)
            return {"charge": f"found_{order}", "amount": amount}

        tid = await _started_but_unrecorded(flowy_backend, "reconcile")
        runner = Runner(_pay_graph(gateway, key="charge", reconcile=find), flowy_backend)
        result = await runner.resume((await runner.head(tid))[1])
        assert result.state["receipt"] == {"charge": "found_o-1", "amount": 42}
        assert gateway.calls == [] and looked_up == ["o-1"]
        record = await require_durable(flowy_backend, "journal").get_activity(tid, "charge")
        assert record is not None and record.status is ActivityStatus.SUCCEEDED

    async def test_reconcile_that_finds_nothing_calls_again(
        self, flowy_backend: Backend[Any]
    ) -> None:
        gateway = _Gateway()
        tid = await _started_but_unrecorded(flowy_backend, "notfound")
        runner = Runner(
            _pay_graph(gateway, key="charge", reconcile=_nothing_found),
            flowy_backend,
        )
        result = await runner.resume((await runner.head(tid))[1])
        assert result.state["receipt"]["charge"] == "ch_o-1"
        assert gateway.calls == ["o-1"]
        record = await require_durable(flowy_backend, "journal").get_activity(tid, "charge")
        assert record is not None and record.attempts == 2

    async def test_an_idempotent_activity_is_called_again(
        self, flowy_backend: Backend[Any]
    ) -> None:
        gateway = _Gateway()
        tid = await _started_but_unrecorded(flowy_backend, "idem")
        runner = Runner(_pay_graph(gateway, key="charge", idempotent=True), flowy_backend)
        result = await runner.resume((await runner.head(tid))[1])
        assert result.state["receipt"]["charge"] == "ch_o-1" and gateway.calls == ["o-1"]

    async def test_a_failed_attempt_waits_as_a_durable_timer(
        self, flowy_backend: Backend[Any]
    ) -> None:
        gateway = _Gateway(failures=2)
        policy = ActivityRetry(attempts=3, initial=0.2, jitter=0.0)
        runner = Runner(_pay_graph(gateway, key="charge", retry=policy), flowy_backend)
        tid = new_thread_id("retry")
        first = await runner.start(tid, {"order": "o-1"})
        assert first.status is RunStatus.WAITING and first.reason == "activity_retry"
        head, _ = await runner.head(tid)
        assert head.execution_pointer == "pay" and head.wake_at is not None
        record = await require_durable(flowy_backend, "journal").get_activity(tid, "charge")
        assert record is not None and record.status is ActivityStatus.RETRYING
        assert record.retry_at == head.wake_at and "gateway down" in record.error
        worker = _worker(runner)
        for _ in range(40):
            await asyncio.sleep(0.05)
            await worker.fire_timers()
            head, _ = await runner.head(tid)
            if head.status is RunStatus.COMPLETED:
                break
        assert head.status is RunStatus.COMPLETED, head
        assert gateway.calls == ["o-1"] * 3
        record = await require_durable(flowy_backend, "journal").get_activity(tid, "charge")
        assert record is not None and (record.status, record.attempts) == (
            ActivityStatus.SUCCEEDED,
            3,
        )

    async def test_no_attempt_starts_after_the_retry_deadline(
        self, flowy_backend: Backend[Any]
    ) -> None:
        gateway = _Gateway(failures=5)
        policy = ActivityRetry(attempts=5, initial=0.2, jitter=0.0, deadline=0.5)
        runner = Runner(_pay_graph(gateway, key="charge", retry=policy), flowy_backend)
        tid = new_thread_id("deadline")
        first = await runner.start(tid, {"order": "o-1"})
        assert first.status is RunStatus.WAITING and first.reason == "activity_retry"
        await asyncio.sleep(1.0)  # no worker looks until well past the deadline
        worker = _worker(runner)
        await worker.fire_timers()
        head, _ = await runner.head(tid)
        for _ in range(40):
            if head.status is not RunStatus.WAITING:
                break
            await asyncio.sleep(0.05)
            await worker.fire_timers()
            head, _ = await runner.head(tid)
        assert head.status is RunStatus.COMPLETED and head.state["error"] == "ActivityFailedError"
        assert gateway.calls == ["o-1"]  # attempt 2 never started
        record = await require_durable(flowy_backend, "journal").get_activity(tid, "charge")
        assert record is not None
        assert (record.status, record.attempts) == (ActivityStatus.FAILED, 1)
        assert record.error == "ConnectionError: gateway down (call 1)"

    async def test_the_last_failure_is_recorded_and_replayed(
        self, flowy_backend: Backend[Any]
    ) -> None:
        gateway = _Gateway(failures=5)
        runner = Runner(_pay_graph(gateway, key="charge"), flowy_backend)
        tid = new_thread_id("failed")
        result = await runner.start(tid, {"order": "o-1"})
        assert result.state["error"] == "ActivityFailedError" and gateway.calls == ["o-1"]
        record = await require_durable(flowy_backend, "journal").get_activity(tid, "charge")
        assert record is not None and record.status is ActivityStatus.FAILED
        assert record.error == "ConnectionError: gateway down (call 1)"

    async def test_the_started_entry_is_durable_before_the_call(
        self, flowy_backend: Backend[Any]
    ) -> None:
        """When the call runs, its ``STARTED`` entry is in the store for every process to
        see: a crash during the call leaves an outcome known to be unknown."""
        tid = new_thread_id("started")
        async with peer_of(flowy_backend) as peer:
            gateway = _PeekingGateway(require_durable(peer, "journal"), tid)
            result = await Runner(_pay_graph(gateway, key="charge"), flowy_backend).start(
                tid, {"order": "o-1"}
            )
            assert result.status is RunStatus.COMPLETED, result
            [seen] = gateway.seen
            assert seen is not None, "the activity was called before its entry was stored"
            assert (seen.key, seen.status, seen.attempts) == ("charge", ActivityStatus.STARTED, 1)
            record = await require_durable(peer, "journal").get_activity(tid, "charge")
            assert record is not None and record.status is ActivityStatus.SUCCEEDED

    async def test_default_keys_are_stable_per_step(self, flowy_backend: Backend[Any]) -> None:
        calls: list[int] = []

        async def double(n: int) -> int:
            calls.append(n)
            return n * 2

        async def step(s: State) -> tuple[State, Directive[Any]]:
            a = await activity(double, s["n"])
            b = await activity(double, s["n"] + 1)
            return {"n": b, "seen": [*s["seen"], a]}, end() if len(s["seen"]) == 1 else completed()

        builder: GraphBuilder[State, Any] = GraphBuilder(_merge)
        graph = builder.add_node("step", step).add_edge("step", "step").compile()
        runner = Runner(graph, flowy_backend)
        tid = new_thread_id("keys")
        result = await runner.start(tid, {"n": 1, "seen": []})
        assert result.status is RunStatus.COMPLETED and result.state["seen"] == [2, 8]
        journal = await require_durable(flowy_backend, "journal").journal(tid)
        double_name = double.__qualname__
        assert sorted(r.key for r in journal) == sorted(
            [f"{step}:step:{double_name}#{n}" for step in (1, 2) for n in (1, 2)]
        )
        assert calls == [1, 2, 4, 5]


def _nothing_found(order: str, amount: int) -> None:
    """A reconcile hook whose lookup finds no charge."""
    return None


def _seed_graph() -> Graph[State, Any]:
    """A graph whose only node suspends at ``pay``: it saves a thread to resume from."""

    async def seed(s: State) -> tuple[State, Directive[Any]]:
        from ..._directives import suspend

        return {}, suspend("seeded", resume_at="pay")

    async def pay(s: State) -> tuple[State, Directive[Any]]:
        return {}, end()

    builder: GraphBuilder[State, Any] = GraphBuilder(_merge)
    return (
        builder.add_node("seed", seed)
        .add_node("pay", pay)
        .add_edge("seed", "pay")
        .allow_no_outgoing_route("pay")
        .compile(version="payments")
    )


async def _started_but_unrecorded(backend: Backend[Any], label: str) -> str:
    """A thread suspended before ``pay`` whose journal says its charge started and never
    finished: what a process killed between the call and its record leaves behind."""
    tid = new_thread_id(label)
    await Runner(_seed_graph(), backend).start(tid, {"order": "o-1"})
    record = ActivityRecord(
        key="charge",
        status=ActivityStatus.STARTED,
        name="charge",
        attempts=1,
        started_at=time.time(),
        updated_at=time.time(),
    )
    await require_durable(backend, "journal").put_activity(tid, replace(record))
    return tid
