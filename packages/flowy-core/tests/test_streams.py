"""Streams, stream helpers, request_stop / request_local_handoff, cancellation
(``_events.py`` and the runner's interrupt paths)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from core_graphs import PlainOutbox, State, approval_graph, linear_graph, merge

import flowy
from flowy import errors, stream_helpers
from flowy.memory import MemoryBackend, MemoryCheckpointer
from flowy.storage import as_backend
from flowy.testing.faults import FaultyCheckpointer, FaultyOutbox, Phase

pytestmark = pytest.mark.anyio


class Gate:
    """Holds the ``wait`` node of ``blocking_graph`` until ``set()``; ``entered`` tells
    when a run reached it."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()
        self.entered = asyncio.Event()

    def set(self) -> None:
        self.opened.set()


def blocking_graph(gate: Gate, **kw: Any) -> flowy.Graph[State, Any]:
    async def first(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {"first": True}, flowy.completed()

    async def wait(s: State) -> tuple[State, flowy.Directive[Any]]:
        gate.entered.set()
        await gate.opened.wait()
        return {"waited": True}, flowy.completed()

    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    b.add_node("first", first).add_node("wait", wait).add_edge("first", "wait")
    b.allow_no_outgoing_route("wait")
    return b.compile(**kw)


async def until_started(gate: Gate) -> None:
    """Wait until a run entered the gate's ``wait`` node (then expect the next one)."""
    await asyncio.wait_for(gate.entered.wait(), 5)
    gate.entered.clear()


@pytest.mark.parametrize("graph_name", ["approval", "linear", "failing"])
async def test_terminal_event_reason_equals_result_reason(graph_name: str) -> None:
    if graph_name == "approval":
        graph = approval_graph()
    elif graph_name == "linear":
        graph = linear_graph(3)
    else:
        graph = linear_graph(5, max_steps=2)
    handle = await flowy.Runner(graph, as_backend(MemoryCheckpointer())).stream("t", {})
    events, result = await stream_helpers.collect_events_and_wait(handle)
    terminal = [e for e in events if e.terminal]
    assert len(terminal) == 1 and events[-1] is terminal[0]
    assert terminal[0].reason == result.reason
    assert terminal[0].execution_pointer == result.execution_pointer
    assert [e.type for e in events[:2]] == [
        flowy.EventType.NODE_STARTED,
        flowy.EventType.NODE_COMPLETED,
    ]


async def test_effect_events_carry_typed_effects() -> None:
    handle = await flowy.Runner(approval_graph(), as_backend(MemoryCheckpointer())).stream("t", {})
    events, result = await stream_helpers.collect_events_and_wait(handle)
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
    gate = Gate()
    cp: MemoryCheckpointer[State] = MemoryCheckpointer()
    runner = flowy.Runner(blocking_graph(gate), as_backend(cp))
    handle = await runner.stream("t", {})
    seen: list[flowy.RunEvent[State, Any]] = []

    def callback(ev: flowy.RunEvent[State, Any]) -> bool:
        seen.append(ev)
        return not (ev.type is flowy.EventType.NODE_STARTED and ev.node == "wait")

    result = await asyncio.wait_for(stream_helpers.consume_events_and_wait(handle, callback), 5)
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
    gate = Gate()
    cp: MemoryCheckpointer[State] = MemoryCheckpointer()
    handle = await flowy.Runner(blocking_graph(gate), as_backend(cp)).stream("t", {})
    collector = stream_helpers.begin_stream_collect(handle)
    await until_started(gate)
    handle.request_stop()
    out = await asyncio.wait_for(
        stream_helpers.await_stream_collect_with_snapshot(handle, collector, cp, "t"), 5
    )
    assert out.outcome.reason == flowy.Reason.CONTEXT_CANCELED
    assert out.snapshot is not None and out.snapshot.revision == out.outcome.revision
    handle.request_stop()  # idempotent after the end
    with pytest.raises(errors.NoActiveExecutionError):
        await handle.request_local_handoff()


async def test_request_stop_with_skip_policy_returns_checkpoint_skipped() -> None:
    gate = Gate()
    cp = FaultyCheckpointer(MemoryCheckpointer[State]())
    cp.arm(Phase.SAVE_CANCEL, times=10, error=lambda: flowy.StorageError("down"))
    graph = blocking_graph(gate, checkpoint_policy=flowy.CheckpointPolicy.SKIP_ON_SAVE_ERROR)
    handle = await flowy.Runner(graph, as_backend(cp)).stream("t", {})
    await until_started(gate)
    handle.request_stop()
    with pytest.raises(errors.CheckpointSkippedError):
        await handle.wait()
    result = await handle.wait_result()
    assert result.reason == flowy.Reason.CONTEXT_CANCELED_CHECKPOINT_SKIPPED


async def test_cancel_save_failure_hard_fail_reason() -> None:
    gate = Gate()
    cp = FaultyCheckpointer(MemoryCheckpointer[State]())
    cp.arm(Phase.SAVE_CANCEL, error=lambda: flowy.StorageError("down"))
    handle = await flowy.Runner(blocking_graph(gate), as_backend(cp)).stream("t", {})
    collector = stream_helpers.begin_stream_collect(handle)
    await until_started(gate)
    handle.request_stop()
    out = await stream_helpers.await_stream_collect(handle, collector)
    assert out.outcome.reason == flowy.Reason.CONTEXT_CANCELED_SAVE_FAILED
    assert out.outcome.status is flowy.RunStatus.CANCELED
    assert isinstance(out.outcome.error, flowy.StorageError)
    assert out.events == [] or not out.events[-1].terminal  # request_stop closed the sink


async def test_cancel_save_failure_event_is_context_canceled_not_failed() -> None:
    gate = Gate()
    cp = FaultyCheckpointer(MemoryCheckpointer[State]())
    cp.arm(Phase.SAVE_CANCEL, error=lambda: flowy.StorageError("down"))
    handle = await flowy.Runner(blocking_graph(gate), as_backend(cp)).stream("t", {})
    await until_started(gate)
    handle.cancel()
    with pytest.raises(asyncio.CancelledError):
        await handle.wait_result()
    events = [event async for event in handle]
    assert events[-1].type is flowy.EventType.CONTEXT_CANCELED
    assert events[-1].reason == flowy.Reason.CONTEXT_CANCELED_SAVE_FAILED


async def test_external_task_cancellation_saves_then_reraises() -> None:
    gate = Gate()
    cp: MemoryCheckpointer[State] = MemoryCheckpointer()
    runner = flowy.Runner(blocking_graph(gate), as_backend(cp))
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
    # the thread is no longer registered as running: a start meets the stored thread,
    # not a run of this process
    decision = await runner.evaluate_resume(flowy.ResumeToken("t", done.revision))
    assert decision.kind is flowy.ResumeDecisionKind.COMPLETED
    with pytest.raises(flowy.ConcurrencyConflictError):
        await runner.start("t", {})


async def test_request_local_handoff_matrix() -> None:
    gate = Gate()
    # 1. persisted hand-off → returns None; result is a hand-off at the current node
    mem: MemoryBackend[State] = MemoryBackend()
    runner = flowy.Runner(blocking_graph(gate), as_backend(mem.checkpointer, outbox=mem.outbox))
    handle = await runner.stream("t", {})
    collector = stream_helpers.begin_stream_collect(handle)
    await until_started(gate)
    await handle.request_local_handoff()
    out = await stream_helpers.await_stream_collect(handle, collector)
    assert out.outcome.status is flowy.RunStatus.HANDOFF
    assert out.outcome.reason == flowy.Reason.LOCAL_HANDOFF
    assert out.outcome.execution_pointer == "wait"
    assert out.events[-1].type is flowy.EventType.HANDOFF
    claimed = await mem.consumer.claim(10, 30)
    assert [m.intent.resume_token for m in claimed] == [out.outcome.resume_token]

    # 2. skip policy → CheckpointSkippedError
    mem2: MemoryBackend[State] = MemoryBackend()
    cp2 = FaultyCheckpointer(mem2.checkpointer)
    cp2.arm(Phase.COMMIT, times=10, error=lambda: flowy.StorageError("down"))
    graph = blocking_graph(gate, checkpoint_policy=flowy.CheckpointPolicy.SKIP_ON_SAVE_ERROR)
    h2 = await flowy.Runner(graph, as_backend(cp2, outbox=mem2.outbox)).stream("t", {})
    await until_started(gate)
    with pytest.raises(errors.CheckpointSkippedError):
        await h2.request_local_handoff()
    with pytest.raises(errors.CheckpointSkippedError):
        await h2.wait()  # the stream mirrors the same error

    # 2b. the default policy and a failing save → that save error, not "ended on its own"
    for phase in (Phase.COMMIT, Phase.SAVE_PENDING):
        mem2b: MemoryBackend[State] = MemoryBackend()
        cp2b = FaultyCheckpointer(mem2b.checkpointer)
        cp2b.arm(phase, times=10, error=lambda: flowy.StorageError("disk full"))
        outbox2b = mem2b.outbox if phase is Phase.COMMIT else PlainOutbox(mem2b.outbox)
        h2b = await flowy.Runner(blocking_graph(gate), as_backend(cp2b, outbox=outbox2b)).stream(
            "t", {}
        )
        await until_started(gate)
        with pytest.raises(flowy.StorageError, match="disk full"):
            await h2b.request_local_handoff()
        failed = await h2b.wait_result()
        assert failed.reason == flowy.Reason.HANDOFF_SAVE_FAILED
        assert cp2b.struck == [phase]

    # 3. enqueue failure after persist → HandoffEnqueueFailedError with a retry token
    mem3: MemoryBackend[State] = MemoryBackend()
    failing = FaultyOutbox(PlainOutbox(mem3.outbox))
    failing.arm(error=lambda: ConnectionError("queue down"))
    cp3 = mem3.checkpointer
    h3 = await flowy.Runner(blocking_graph(gate), as_backend(cp3, outbox=failing)).stream("t", {})
    await until_started(gate)
    with pytest.raises(flowy.HandoffEnqueueFailedError) as info:
        await h3.request_local_handoff()
    assert info.value.resume_token is not None
    snap, rev = await cp3.load("t")
    assert rev == info.value.resume_token.snapshot_revision
    assert snap.handoff_status is flowy.HandoffStatus.ORPHANED

    # 4. after request_stop → NoActiveExecutionError
    h4 = await flowy.Runner(blocking_graph(gate := Gate())).stream("t4", {})
    await until_started(gate)
    h4.request_stop()
    with pytest.raises(errors.NoActiveExecutionError):
        await h4.request_local_handoff()
    await h4.wait_result()


async def test_a_cancel_that_comes_with_request_stop_still_cancels_the_run() -> None:
    """``request_stop()`` and ``cancel()`` in the same instant: the stop's own
    cancellation is absorbed, the caller's is not. The run saves where it was and ends
    cancelled, as ``cancel()`` promises (a checker or CLI cancelled by Ctrl-C stops)."""
    gate = Gate()
    cp: MemoryCheckpointer[State] = MemoryCheckpointer()
    handle = await flowy.Runner(blocking_graph(gate), as_backend(cp)).stream("t", {})
    await until_started(gate)
    handle.request_stop()
    handle.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(handle.wait_result(), 5)
    head = await cp.load("t")
    assert head is not None
    snapshot, _ = head
    assert snapshot.reason == flowy.Reason.CONTEXT_CANCELED
    assert snapshot.execution_pointer == "wait"
