"""Durable time in the engine, beyond what the conformance suite runs on every store:
the signal that arrives while a wait is being saved, a waiting stream's events, bad
directives and graphs, activities outside a run or with a result the journal cannot
keep, and a timer whose run keeps failing."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

import flowy
from flowy.errors import ActivityFailedError, GraphValidationError, NoRunContextError
from flowy.memory import MemoryBackend, MemoryCheckpointer
from flowy.storage import ActivityStatus, RunStatus, Signal
from flowy.storage.dialect import Write
from flowy.types import ActivityRetry

pytestmark = pytest.mark.anyio

State = dict[str, Any]


def merge(state: State, update: State) -> State:
    return {**state, **update}


def wait_graph() -> flowy.Graph[State, Any]:
    async def ask(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {}, flowy.wait_for("approval", resume_at="done")

    async def done(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {"done": True}, flowy.completed()

    builder: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    return (
        builder.add_node("ask", ask)
        .add_node("done", done)
        .add_edge("ask", "done")
        .allow_no_outgoing_route("done")
        .compile()
    )


class SignalDuringSave(MemoryCheckpointer[Any]):
    """Stores a signal for the thread in the same moment its waiting head is saved: the
    sender read the head before the wait existed, so it woke nobody."""

    async def _write(self, write: Write) -> Any:
        refused = await super()._write(write)
        if refused is None and write.summary.status is RunStatus.WAITING:
            signal = Signal(write.thread_id, "approval", {"ok": True}, "raced", sent_at=1.0)
            await self.append_signal(signal)
        return refused


async def test_a_signal_stored_while_the_wait_is_saved_is_taken_at_once() -> None:
    backend = MemoryBackend[State]()
    backend.checkpointer = SignalDuringSave(backend.store)
    runner = flowy.Runner(wait_graph(), backend)
    async with runner.stream("t", {}) as handle:
        events = [event async for event in handle]
    result = await handle.wait_result()
    assert result.status is RunStatus.COMPLETED
    assert result.state == {"ok": True, "done": True}
    assert flowy.EventType.WAITING not in [e.type for e in events]  # never before the end
    assert events[-1].type is flowy.EventType.COMPLETED
    head, _ = await runner.head("t")
    assert dict(head.signal_cursors) == {"approval": 1}


async def test_a_waiting_stream_ends_with_one_waiting_event() -> None:
    runner = flowy.Runner(wait_graph(), MemoryBackend[State]())
    async with runner.stream("t", {}) as handle:
        events = [event async for event in handle]
    assert events[-1].type is flowy.EventType.WAITING
    assert events[-1].resume_token == flowy.ResumeToken("t", 1)
    assert [e.type for e in events].count(flowy.EventType.WAITING) == 1


async def test_waiting_for_a_signal_needs_a_store_that_keeps_them() -> None:
    class Plain(MemoryCheckpointer[Any]):
        """A checkpointer of an older store, without inbox or journal."""

        async def _read_signals(self, thread_id: str, after: int, limit: int) -> Any:
            raise self._missing("_read_signals", "signals")

    backend = MemoryBackend[State]()
    backend.checkpointer = Plain(backend.store)
    with pytest.raises(NotImplementedError, match="keeps no signals"):
        await flowy.Runner(wait_graph(), backend).start("t", {})


def test_bad_waits_are_refused_when_built() -> None:
    with pytest.raises(ValueError, match="signal name"):
        flowy.wait_for("")
    with pytest.raises(ValueError, match="timeout"):
        flowy.wait_for("x", timeout=-1)
    with pytest.raises(ValueError, match="finite"):
        flowy.sleep(float("nan"))
    with pytest.raises(ValueError, match=">= 0"):
        flowy.sleep(-0.5)
    with pytest.raises(ValueError, match="finite"):
        flowy.sleep_until(float("inf"))


async def test_a_wait_naming_an_unknown_node_fails_the_run() -> None:
    async def ask(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {}, flowy.wait_for("approval", on_timeout="nowhere", timeout=5)

    builder: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    graph = builder.add_node("ask", ask).allow_no_outgoing_route("ask").compile()
    result = await flowy.Runner(graph, MemoryBackend[State]()).start("t", {})
    assert result.status is RunStatus.FAILED and result.reason == "wait_target_invalid"
    assert isinstance(result.error, flowy.UnknownNodeError)


def test_timeout_routes_and_signal_handlers_are_validated() -> None:
    async def node(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {}, flowy.completed()

    builder: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    builder.add_node("a", node).allow_no_outgoing_route("a")
    builder.add_timeout_route("a", "missing").add_timeout_route("a", "a")
    builder.on_signal("s", lambda s, p: s).on_signal("s", lambda s, p: s)
    with pytest.raises(GraphValidationError) as info:
        builder.compile()
    text = str(info.value)
    assert "timeout route from 'a' targets unknown node 'missing'" in text
    assert "2 timeout routes" in text and "two on_signal handlers" in text


async def test_a_timeout_route_counts_as_reachable_and_is_drawn() -> None:
    async def ask(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {}, flowy.wait_for("approval", timeout=0)

    async def escalate(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {"escalated": True}, flowy.end()

    builder: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    graph = (
        builder.add_node("ask", ask)
        .add_node("escalate", escalate)
        .allow_no_outgoing_route("ask", "escalate")
        .add_timeout_route("ask", "escalate")
        .compile()
    )
    assert "n_ask -- timeout --> n_escalate" in graph.to_mermaid()
    runner = flowy.Runner(graph, MemoryBackend[State]())
    await runner.start("t", {})
    assert await flowy.Worker(runner).fire_timers() == 1
    head, _ = await runner.head("t")
    assert head.state == {"escalated": True}


async def test_activity_outside_a_run_is_refused() -> None:
    async def fn() -> int:
        return 1

    with pytest.raises(NoRunContextError):
        await flowy.activity(fn)


async def test_a_result_the_journal_cannot_keep_fails_the_call_and_is_recorded() -> None:
    async def returns_an_object() -> object:
        return object()

    async def call(s: State) -> tuple[State, flowy.Directive[Any]]:
        try:
            await flowy.activity(returns_an_object, key="obj")
        except TypeError as exc:
            return {"error": str(exc)}, flowy.end()
        return {}, flowy.end()

    builder: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    graph = builder.add_node("call", call).allow_no_outgoing_route("call").compile()
    backend = MemoryBackend[State]()
    result = await flowy.Runner(graph, backend).start("t", {})
    assert "cannot keep: return a JSON value" in result.state["error"]
    record = await backend.checkpointer.get_activity("t", "obj")
    assert record is not None and record.status is ActivityStatus.FAILED


async def test_tuples_come_back_as_lists_the_first_time_too() -> None:
    async def pair() -> tuple[int, int]:
        return 1, 2

    async def call(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {"got": await flowy.activity(pair)}, flowy.end()

    builder: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    graph = builder.add_node("call", call).allow_no_outgoing_route("call").compile()
    result = await flowy.Runner(graph, MemoryBackend[State]()).start("t", {})
    assert result.state["got"] == [1, 2]


def test_activity_retry_is_validated() -> None:
    with pytest.raises(ValueError):
        ActivityRetry(attempts=0)
    with pytest.raises(ValueError):
        ActivityRetry(initial=10, maximum=1)
    with pytest.raises(ValueError):
        ActivityRetry(jitter=2)
    with pytest.raises(ValueError):
        ActivityRetry(deadline=0)
    assert ActivityRetry(initial=1, multiplier=2, maximum=5, jitter=0).delay(4) == 5


async def test_a_retry_past_its_deadline_fails_at_once() -> None:
    calls: list[int] = []

    async def down() -> None:
        calls.append(1)
        raise ConnectionError("down")

    async def call(s: State) -> tuple[State, flowy.Directive[Any]]:
        policy = ActivityRetry(attempts=5, initial=10, jitter=0, deadline=1)
        try:
            await flowy.activity(down, key="k", retry=policy)
        except ActivityFailedError as exc:
            return {"attempts": exc.attempts, "error": exc.error}, flowy.end()
        return {}, flowy.end()

    builder: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    graph = builder.add_node("call", call).allow_no_outgoing_route("call").compile()
    result = await flowy.Runner(graph, MemoryBackend[State]()).start("t", {})
    assert result.state == {"attempts": 1, "error": "ConnectionError: down"} and calls == [1]


async def test_a_timer_whose_run_keeps_failing_backs_off(caplog: pytest.LogCaptureFixture) -> None:
    async def nap(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {}, flowy.sleep(0, resume_at="boom")

    async def boom(s: State) -> tuple[State, flowy.Directive[Any]]:
        raise RuntimeError("the gateway is down")

    builder: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    graph = (
        builder.add_node("nap", nap)
        .add_node("boom", boom)
        .add_edge("nap", "boom")
        .allow_no_outgoing_route("boom")
        .compile()
    )
    runner = flowy.Runner(graph, MemoryBackend[State]())
    await runner.start("t", {})
    worker = flowy.Worker(runner, retry_delay=0.3, retry_jitter=0)
    with caplog.at_level(logging.ERROR, logger="flowy.worker"):
        assert await worker.fire_timers() == 0
        assert await worker.fire_timers() == 0  # backing off: not tried again yet
    failures = [r for r in caplog.records if "woken by its timer" in r.getMessage()]
    assert len(failures) == 1 and failures[0].exc_info is not None
    assert "the gateway is down" in str(failures[0].exc_info[1])
    head, _ = await runner.head("t")
    assert head.status is RunStatus.WAITING  # still due: nothing was lost
    await asyncio.sleep(0.35)
    with caplog.at_level(logging.ERROR, logger="flowy.worker"):
        await worker.fire_timers()
    assert len([r for r in caplog.records if "woken by its timer" in r.getMessage()]) == 2
