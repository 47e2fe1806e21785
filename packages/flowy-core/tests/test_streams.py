"""Streams, stream helpers, request_stop / request_local_handoff, cancellation
(``_events.py`` and the runner's interrupt paths)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from core_graphs import PlainOutbox, State, approval_graph, linear_graph, merge

import flowy
from flowy.testing.faults import FaultyCheckpointer, FaultyOutbox, Phase

pytestmark = pytest.mark.anyio


def blocking_graph(gate: asyncio.Event, **kw: Any) -> flowy.Graph[State, Any]:
    async def first(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {"first": True}, flowy.completed()

    async def wait(s: State) -> tuple[State, flowy.Directive[Any]]:
        await gate.wait()
        return {"waited": True}, flowy.completed()

    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    b.add_node("first", first).add_node("wait", wait).add_edge("first", "wait")
    b.allow_no_outgoing_route("wait")
    return b.compile(**kw)


async def until_started(handle: flowy.StreamHandle[State, Any], node: str) -> None:
    for _ in range(200):
        ex = handle._execution  # pyright: ignore[reportPrivateUsage]
        if ex is not None and ex.in_node and ex.pointer == node:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"node {node!r} never started")


@pytest.mark.parametrize("graph_name", ["approval", "linear", "failing"])
async def test_terminal_event_reason_equals_result_reason(graph_name: str) -> None:
    if graph_name == "approval":
        graph = approval_graph()
    elif graph_name == "linear":
        graph = linear_graph(3)
    else:
        graph = linear_graph(5, max_steps=2)
    handle = await flowy.Runner(graph, flowy.MemoryCheckpointer()).stream("t", {})
    events, result = await flowy.collect_events_and_wait(handle)
    terminal = [e for e in events if e.terminal]
    assert len(terminal) == 1 and events[-1] is terminal[0]
    assert terminal[0].reason == result.reason
    assert terminal[0].execution_pointer == result.execution_pointer
    assert [e.type for e in events[:2]] == [
        flowy.EventType.NODE_STARTED,
        flowy.EventType.NODE_COMPLETED,
    ]


async def test_effect_events_carry_typed_effects() -> None:
    handle = await flowy.Runner(approval_graph(), flowy.MemoryCheckpointer()).stream("t", {})
    events, result = await flowy.collect_events_and_wait(handle)
    effects = [e for e in events if e.type is flowy.EventType.EFFECT]
    assert [e.effect for e in effects] == [{"kind": "approval"}] == result.effects
    assert all(e.has_effect for e in effects)


async def test_absent_consumer_never_blocks_and_buffer_is_bounded() -> None:
    handle = await flowy.Runner(linear_graph(50, max_steps=100)).stream("t", {}, max_buffer=8)
    result = await asyncio.wait_for(handle.wait_result(), 5)
    assert result.status is flowy.RunStatus.COMPLETED
    events = [e async for e in handle]
    assert len(events) == 8 and events[-1].terminal
    assert handle.dropped_events == 101 - 8


async def test_slow_consumer_does_not_slow_the_run() -> None:
    handle = await flowy.Runner(linear_graph(20, max_steps=100)).stream("t", {})
    first = await handle.__anext__()
    await asyncio.sleep(0.05)  # the run finishes while the consumer dawdles
    assert handle.done
    rest = [e async for e in handle]
    assert first.type is flowy.EventType.NODE_STARTED and rest[-1].terminal


async def test_consume_events_and_wait_early_stop_saves_resumable_snapshot() -> None:
    gate = asyncio.Event()
    cp: flowy.MemoryCheckpointer[State] = flowy.MemoryCheckpointer()
    runner = flowy.Runner(blocking_graph(gate), cp)
    handle = await runner.stream("t", {})
    seen: list[flowy.RunEvent[State, Any]] = []

    def callback(ev: flowy.RunEvent[State, Any]) -> bool:
        seen.append(ev)
        return not (ev.type is flowy.EventType.NODE_STARTED and ev.node == "wait")

    result = await asyncio.wait_for(flowy.consume_events_and_wait(handle, callback), 5)
    assert result.status is flowy.RunStatus.CANCELED
    assert result.reason == flowy.Reason.CONTEXT_CANCELED
    assert result.execution_pointer == "wait" and result.resume_token is not None
    await handle.wait()  # persisted cancel: no error
    snap, rev = await cp.load("t")
    assert snap.status is flowy.RunStatus.CANCELED and rev == result.revision
    gate.set()
    resumed = await runner.resume(result.resume_token)
    assert resumed.status is flowy.RunStatus.COMPLETED and resumed.state["waited"]


async def test_begin_stream_collect_with_request_stop_and_snapshot() -> None:
    gate = asyncio.Event()
    cp: flowy.MemoryCheckpointer[State] = flowy.MemoryCheckpointer()
    handle = await flowy.Runner(blocking_graph(gate), cp).stream("t", {})
    collector = flowy.begin_stream_collect(handle)
    await until_started(handle, "wait")
    handle.request_stop()
    out = await asyncio.wait_for(
        flowy.await_stream_collect_with_snapshot(handle, collector, cp, "t"), 5
    )
    assert out.outcome.reason == flowy.Reason.CONTEXT_CANCELED
    assert out.snapshot is not None and out.snapshot.revision == out.outcome.revision
    handle.request_stop()  # idempotent after the end
    with pytest.raises(flowy.NoActiveExecutionError):
        await handle.request_local_handoff()


async def test_request_stop_with_skip_policy_returns_checkpoint_skipped() -> None:
    gate = asyncio.Event()
    cp = FaultyCheckpointer(flowy.MemoryCheckpointer[State]())
    cp.arm(Phase.SAVE_CANCEL, times=10, error=lambda: flowy.StorageError("down"))
    graph = blocking_graph(gate, checkpoint_policy=flowy.CheckpointPolicy.SKIP_ON_SAVE_ERROR)
    handle = await flowy.Runner(graph, cp).stream("t", {})
    await until_started(handle, "wait")
    handle.request_stop()
    with pytest.raises(flowy.CheckpointSkippedError):
        await handle.wait()
    result = await handle.wait_result()
    assert result.reason == flowy.Reason.CONTEXT_CANCELED_CHECKPOINT_SKIPPED


async def test_cancel_save_failure_hard_fail_reason() -> None:
    gate = asyncio.Event()
    cp = FaultyCheckpointer(flowy.MemoryCheckpointer[State]())
    cp.arm(Phase.SAVE_CANCEL, error=lambda: flowy.StorageError("down"))
    handle = await flowy.Runner(blocking_graph(gate), cp).stream("t", {})
    collector = flowy.begin_stream_collect(handle)
    await until_started(handle, "wait")
    handle.request_stop()
    out = await flowy.await_stream_collect(handle, collector)
    assert out.outcome.reason == flowy.Reason.CONTEXT_CANCELED_SAVE_FAILED
    assert out.outcome.status is flowy.RunStatus.CANCELED
    assert isinstance(out.outcome.error, flowy.StorageError)
    assert out.events == [] or not out.events[-1].terminal  # request_stop closed the sink


async def test_cancel_save_failure_event_is_context_canceled_not_failed() -> None:
    gate = asyncio.Event()
    cp = FaultyCheckpointer(flowy.MemoryCheckpointer[State]())
    cp.arm(Phase.SAVE_CANCEL, error=lambda: flowy.StorageError("down"))
    handle = await flowy.Runner(blocking_graph(gate), cp).stream("t", {})
    collector = flowy.begin_stream_collect(handle)
    await until_started(handle, "wait")
    handle.cancel()
    with pytest.raises(asyncio.CancelledError):
        await handle.wait_result()
    assert collector.task is not None
    await collector.task
    assert collector.events[-1].type is flowy.EventType.CONTEXT_CANCELED
    assert collector.events[-1].reason == flowy.Reason.CONTEXT_CANCELED_SAVE_FAILED


async def test_external_task_cancellation_saves_then_reraises() -> None:
    gate = asyncio.Event()
    cp: flowy.MemoryCheckpointer[State] = flowy.MemoryCheckpointer()
    runner = flowy.Runner(blocking_graph(gate), cp)
    task = asyncio.ensure_future(runner.start("t", {}))
    for _ in range(100):
        await asyncio.sleep(0.005)
        try:
            snap, _ = await cp.load("t")
            if snap.execution_pointer == "wait":
                break
        except flowy.ThreadNotFoundError:
            continue
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    snap, rev = await cp.load("t")
    assert snap.status is flowy.RunStatus.CANCELED and snap.execution_pointer == "wait"
    gate.set()
    done = await runner.resume(flowy.ResumeToken("t", rev))
    assert done.status is flowy.RunStatus.COMPLETED
    # the thread is no longer registered as running
    assert (await runner.evaluate_resume(flowy.ResumeToken("t", done.revision))).resumable


async def test_request_local_handoff_matrix() -> None:
    gate = asyncio.Event()
    # 1. persisted hand-off → returns None; result is a hand-off at the current node
    cp: flowy.MemoryCheckpointer[State] = flowy.MemoryCheckpointer()
    outbox = flowy.MemoryOutbox()
    runner = flowy.Runner(blocking_graph(gate), cp, handoff_outbox=outbox)
    handle = await runner.stream("t", {})
    collector = flowy.begin_stream_collect(handle)
    await until_started(handle, "wait")
    await handle.request_local_handoff()
    out = await flowy.await_stream_collect(handle, collector)
    assert out.outcome.status is flowy.RunStatus.HANDOFF
    assert out.outcome.reason == flowy.Reason.LOCAL_HANDOFF
    assert out.outcome.execution_pointer == "wait"
    assert out.events[-1].type is flowy.EventType.HANDOFF
    claimed = await outbox.claim(10, 30)
    assert [m.intent.resume_token for m in claimed] == [out.outcome.resume_token]

    # 2. skip policy → CheckpointSkippedError
    cp2 = FaultyCheckpointer(flowy.MemoryCheckpointer[State]())
    cp2.arm(Phase.COMMIT, times=10, error=lambda: flowy.StorageError("down"))
    graph = blocking_graph(gate, checkpoint_policy=flowy.CheckpointPolicy.SKIP_ON_SAVE_ERROR)
    h2 = await flowy.Runner(graph, cp2, handoff_outbox=flowy.MemoryOutbox()).stream("t", {})
    await until_started(h2, "wait")
    with pytest.raises(flowy.CheckpointSkippedError):
        await h2.request_local_handoff()
    with pytest.raises(flowy.CheckpointSkippedError):
        await h2.wait()  # the stream mirrors the same error

    # 3. enqueue failure after persist → HandoffEnqueueFailedError with a retry token
    failing = FaultyOutbox(PlainOutbox(flowy.MemoryOutbox()))
    failing.arm(error=lambda: ConnectionError("queue down"))
    cp3: flowy.MemoryCheckpointer[State] = flowy.MemoryCheckpointer()
    h3 = await flowy.Runner(blocking_graph(gate), cp3, handoff_outbox=failing).stream("t", {})
    await until_started(h3, "wait")
    with pytest.raises(flowy.HandoffEnqueueFailedError) as info:
        await h3.request_local_handoff()
    assert info.value.resume_token is not None
    snap, rev = await cp3.load("t")
    assert rev == info.value.resume_token.snapshot_revision
    assert snap.handoff_status is flowy.HandoffStatus.ORPHANED

    # 4. after request_stop → NoActiveExecutionError
    h4 = await flowy.Runner(blocking_graph(gate := asyncio.Event())).stream("t4", {})
    await until_started(h4, "wait")
    h4.request_stop()
    with pytest.raises(flowy.NoActiveExecutionError):
        await h4.request_local_handoff()
    await h4.wait_result()
