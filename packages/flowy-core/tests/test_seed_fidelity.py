"""The specification's contracts that the runner once diverged from, each pinned:
one preflight for evaluate_resume and resume, the request_local_handoff matrix,
persisted retry counts, effects and retry counts in the snapshot, one terminal save
path for every cancellation, failure events to the observer, a recovery result on
failure, the run context inside the resume-target policy, a run lease without a lease
manager refused, and a bound on runaway graphs."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from core_graphs import PlainOutbox, State, approval_graph, handoff_graph, linear_graph, merge

import flowy
from flowy import errors, lifecycle, storage
from flowy.lifecycle import LifecycleEvent, LifecycleEventType
from flowy.memory import MemoryBackend, MemoryCheckpointer
from flowy.storage import as_backend
from flowy.testing.faults import FaultyCheckpointer, FaultyOutbox, Phase

pytestmark = pytest.mark.anyio


class Recorder:
    """A lifecycle observer that keeps what it got."""

    def __init__(self) -> None:
        self.events: list[LifecycleEvent] = []

    def on_event(self, event: LifecycleEvent) -> None:
        self.events.append(event)

    def of(self, type_: LifecycleEventType) -> list[LifecycleEvent]:
        assert lifecycle.flush_observers(5)
        return [e for e in self.events if e.type is type_]


# -- one preflight -----------------------------------------------------------------------


async def test_evaluate_resume_and_resume_agree_on_a_completed_thread() -> None:
    runner = flowy.Runner(linear_graph(2), as_backend(MemoryCheckpointer[State]()))
    done = await runner.start("t", {})
    token = flowy.ResumeToken("t", done.revision)
    decision = await runner.evaluate_resume(token)
    assert decision.kind is flowy.ResumeDecisionKind.COMPLETED and not decision.resumable
    with pytest.raises(flowy.ThreadCompletedError):
        await runner.resume(token)


async def test_evaluate_resume_and_resume_agree_on_a_pointer_the_graph_lost() -> None:
    cp: MemoryCheckpointer[State] = MemoryCheckpointer()
    first = await flowy.Runner(approval_graph(version="app"), as_backend(cp)).start("t", {})
    assert first.resume_token is not None and first.execution_pointer == "ask"
    # A deploy without an "ask" node under a new version fails closed...
    fingerprinted = flowy.Runner(linear_graph(3), as_backend(cp))
    decision = await fingerprinted.evaluate_resume(first.resume_token)
    assert decision.kind is flowy.ResumeDecisionKind.VERSION_MISMATCH
    with pytest.raises(flowy.errors.GraphVersionMismatchError):
        await fingerprinted.resume(first.resume_token)
    # ...and one that kept the version label lost the node: UNKNOWN_NODE, as before.
    renamed = linear_graph(3, version="app")
    runner = flowy.Runner(renamed, as_backend(cp))
    decision = await runner.evaluate_resume(first.resume_token)
    assert decision.kind is flowy.ResumeDecisionKind.UNKNOWN_NODE
    with pytest.raises(flowy.UnknownNodeError):
        await runner.resume(first.resume_token)
    # A policy may still choose where to go on.
    moved = await runner.resume(
        first.resume_token, resume_target_policy=lambda s, _p: (s, flowy.resume_to("n0"))
    )
    assert moved.status is flowy.RunStatus.COMPLETED


async def test_a_resumable_decision_always_resumes() -> None:
    cp: MemoryCheckpointer[State] = MemoryCheckpointer()
    runner = flowy.Runner(approval_graph(), as_backend(cp))
    first = await runner.start("t", {})
    assert first.resume_token is not None
    decision = await runner.evaluate_resume(first.resume_token)
    assert decision.resumable
    assert decision.resume_token is not None
    result = await runner.resume(decision.resume_token, state_overlay={"approved": True})
    assert result.status is flowy.RunStatus.HANDOFF


# -- request_local_handoff ------------------------------------------------------------------


class GatedCheckpointer(MemoryCheckpointer[State]):
    """Holds suspend saves until ``gate`` opens (so a request can arrive meanwhile)."""

    def __init__(self) -> None:
        super().__init__()
        self.saving = asyncio.Event()
        self.gate = asyncio.Event()

    async def save(
        self,
        expected_revision: int,
        snapshot: storage.Snapshot[State],
        *,
        lease: storage.Lease | None = None,
    ) -> int:
        if snapshot.status is flowy.RunStatus.SUSPENDED:
            self.saving.set()
            await self.gate.wait()
        return await super().save(expected_revision, snapshot, lease=lease)


async def test_request_local_handoff_is_refused_when_the_run_suspended_on_its_own() -> None:
    cp = GatedCheckpointer()
    handle = await flowy.Runner(approval_graph(), as_backend(cp)).stream("t", {})
    await asyncio.wait_for(cp.saving.wait(), 5)  # the run is saving its own suspension
    request = asyncio.ensure_future(handle.request_local_handoff())
    await asyncio.sleep(0)
    cp.gate.set()
    with pytest.raises(errors.NoActiveExecutionError, match="ended on its own"):
        await request
    assert (await handle.wait_result()).status is flowy.RunStatus.SUSPENDED


async def test_request_local_handoff_without_a_store_is_not_a_persisted_handoff() -> None:
    gate = asyncio.Event()
    entered = asyncio.Event()

    async def wait(s: State) -> tuple[State, flowy.Directive[Any]]:
        entered.set()
        await gate.wait()
        return s, flowy.completed()

    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    b.add_node("wait", wait).allow_no_outgoing_route("wait")
    handle = await flowy.Runner(b.compile()).stream("t", {})
    await asyncio.wait_for(entered.wait(), 5)
    with pytest.raises(errors.CheckpointSkippedError, match="no store"):
        await handle.request_local_handoff()


# -- what snapshots carry -----------------------------------------------------------------


def retrying_graph() -> flowy.Graph[State, Any]:
    """``check`` asks for another attempt (up to 3), then waits for a human each time."""

    async def check(s: State) -> tuple[State, flowy.Directive[Any]]:
        if s.get("waiting"):
            return {"waiting": False}, flowy.suspend("look_again")
        return {"waiting": True, "tries": s.get("tries", 0) + 1}, flowy.retry(3)

    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    b.add_node("check", check).allow_no_outgoing_route("check")
    return b.compile()


async def test_retry_counts_survive_suspend_and_resume() -> None:
    cp: MemoryCheckpointer[State] = MemoryCheckpointer()
    runner = flowy.Runner(retrying_graph(), as_backend(cp))
    result = await runner.start("t", {})
    resumes = 0
    while result.status is flowy.RunStatus.SUSPENDED and resumes < 10:
        snap, _ = await cp.load("t")
        assert snap.retry_counts == {"check": result.state["tries"]}
        assert result.resume_token is not None
        result = await runner.resume(result.resume_token)
        resumes += 1
    assert result.status is flowy.RunStatus.FAILED
    assert result.reason == flowy.Reason.RETRY_EXHAUSTED
    assert result.state["tries"] == 3  # allowed 3 attempts: it ran 3, not 5 or forever


async def test_a_node_that_completes_gets_its_retry_budget_back() -> None:
    """Retry attempts count per node until it completes; then they are forgotten, in
    memory and in the saved snapshot, so the node has its full budget next time."""
    calls: list[int] = []

    async def flaky(s: State) -> tuple[State, flowy.Directive[Any]]:
        calls.append(s.get("round", 0))
        if len(calls) % 3:  # fails twice, then succeeds
            return {}, flowy.retry(3)
        return {"round": s.get("round", 0) + 1}, flowy.completed()

    async def wait(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {}, flowy.suspend("again", resume_at="flaky")

    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    b.add_node("flaky", flaky).add_node("wait", wait).add_edge("flaky", "wait")
    b.allow_no_outgoing_route("wait")
    cp: MemoryCheckpointer[State] = MemoryCheckpointer()
    runner = flowy.Runner(b.compile(save_every_step=True), as_backend(cp))
    result = await runner.start("t", {})
    for _ in range(2):
        assert result.status is flowy.RunStatus.SUSPENDED, result.reason
        snap, _ = await cp.load("t")
        assert snap.retry_counts == {}
        assert result.resume_token is not None
        result = await runner.resume(result.resume_token)
    assert result.status is flowy.RunStatus.SUSPENDED and result.state["round"] == 3
    assert len(calls) == 9  # three rounds of two retries and a success, none exhausted


async def test_a_snapshot_carries_the_effects_of_its_segment() -> None:
    cp: MemoryCheckpointer[State] = MemoryCheckpointer()
    first = await flowy.Runner(approval_graph(), as_backend(cp)).start("t", {})
    snap, _ = await cp.load("t")
    assert list(snap.effects) == first.effects == [{"kind": "approval"}]
    history = await cp.get_history("t")
    assert list(history[-1].effects) == []  # the first step's save, before any effect


# -- cancellation ---------------------------------------------------------------------------


class PruneCounter(FaultyCheckpointer[State]):
    def __init__(self, inner: MemoryCheckpointer[State]) -> None:
        super().__init__(inner)
        self.prunes = 0

    async def prune(self, thread_id: str, retain: int) -> None:
        self.prunes += 1
        await super().prune(thread_id, retain)


def blocking_graph(entered: asyncio.Event, **kw: Any) -> flowy.Graph[State, Any]:
    async def first(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {"first": True}, flowy.completed()

    async def wait(s: State) -> tuple[State, flowy.Directive[Any]]:
        entered.set()
        await asyncio.Event().wait()
        return s, flowy.completed()

    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    b.add_node("first", first).add_node("wait", wait).add_edge("first", "wait")
    b.allow_no_outgoing_route("wait")
    return b.compile(**kw)


@pytest.mark.parametrize("how", ["task", "handle"])
async def test_every_cancellation_takes_the_request_stop_terminal_path(how: str) -> None:
    entered = asyncio.Event()
    recorder = Recorder()
    cp = PruneCounter(MemoryCheckpointer[State]())
    cp.arm(Phase.SAVE_CANCEL, error=lambda: flowy.StorageError("disk full"))
    graph = blocking_graph(
        entered, checkpoint_policy=flowy.CheckpointPolicy.SKIP_ON_SAVE_ERROR, retention_limit=5
    )
    runner = flowy.Runner(graph, as_backend(cp), observer=recorder)
    events: list[flowy.RunEvent[State, Any]] = []
    if how == "task":
        task = asyncio.ensure_future(runner.start("t", {}))
        await asyncio.wait_for(entered.wait(), 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    else:
        handle = await runner.stream("t", {})
        await asyncio.wait_for(entered.wait(), 5)
        handle.cancel()
        with pytest.raises(asyncio.CancelledError):
            await handle.wait_result()
        events = [event async for event in handle]
        assert [e.type for e in events[-2:]] == [
            flowy.EventType.CHECKPOINT_FAILED,
            flowy.EventType.CONTEXT_CANCELED,
        ]
        assert events[-1].reason == flowy.Reason.CONTEXT_CANCELED_CHECKPOINT_SKIPPED
    [skipped] = recorder.of(LifecycleEventType.CHECKPOINT_SKIPPED)
    assert skipped.reason == "context_canceled_checkpoint_skipped" and "disk full" in skipped.error

    # A cancel whose save works persists a resumable snapshot and prunes in the loop.
    entered.clear()
    cp2 = PruneCounter(MemoryCheckpointer[State]())
    runner2 = flowy.Runner(blocking_graph(entered, retention_limit=5), as_backend(cp2))
    task = asyncio.ensure_future(runner2.start("t", {}))
    await asyncio.wait_for(entered.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    snap, _ = await cp2.load("t")
    assert snap.status is flowy.RunStatus.CANCELED and snap.reason == "context_canceled"
    assert cp2.prunes == 1


# -- failures reach the observer -----------------------------------------------------------


async def test_handoff_failures_reach_the_observer_with_their_metric_labels() -> None:
    recorder = Recorder()
    mem: MemoryBackend[State] = MemoryBackend()
    outbox = FaultyOutbox(PlainOutbox(mem.outbox))
    outbox.arm(error=lambda: ConnectionError("queue down"))
    runner = flowy.Runner(
        handoff_graph(), as_backend(mem.checkpointer, outbox=outbox), observer=recorder
    )
    await runner.start("enqueue", {})
    [failed] = recorder.of(LifecycleEventType.HANDOFF_ENQUEUE_FAILED)
    assert failed.status == "enqueue_failed" and "ConnectionError: queue down" in failed.error

    cp = FaultyCheckpointer(MemoryCheckpointer[State]())
    cp.arm(Phase.PATCH_ENQUEUED, error=lambda: flowy.StorageError("db down"))
    await flowy.Runner(
        handoff_graph(), as_backend(cp, outbox=PlainOutbox(mem.outbox)), observer=recorder
    ).start("patch", {})
    [patch] = recorder.of(LifecycleEventType.HANDOFF_PATCH_FAILED)
    assert patch.status == "patch_enqueued_failed"

    cp = FaultyCheckpointer(MemoryCheckpointer[State]())
    cp.arm(Phase.SAVE_PENDING, error=lambda: flowy.StorageError("db down"))
    await flowy.Runner(
        handoff_graph(), as_backend(cp, outbox=PlainOutbox(mem.outbox)), observer=recorder
    ).start("save", {})
    saves = recorder.of(LifecycleEventType.HANDOFF_SAVE_FAILED)
    assert [e.status for e in saves] == ["save_failed"]

    skip = flowy.CheckpointPolicy.SKIP_ON_SAVE_ERROR
    mem2: MemoryBackend[State] = MemoryBackend()
    cp = FaultyCheckpointer(mem2.checkpointer)
    cp.arm(Phase.COMMIT, error=lambda: flowy.StorageError("tx aborted"))
    result = await flowy.Runner(
        handoff_graph(checkpoint_policy=skip, save_every_step=False),
        as_backend(cp, outbox=mem2.outbox),
        observer=recorder,
    ).start("commit", {})
    assert result.reason == flowy.Reason.HANDOFF_CHECKPOINT_SKIPPED
    assert [e.status for e in recorder.of(LifecycleEventType.HANDOFF_SAVE_FAILED)][-1] == (
        "commit_failed"
    )
    skipped = recorder.of(LifecycleEventType.CHECKPOINT_SKIPPED)
    assert skipped[-1].reason == "handoff_checkpoint_skipped"
    assert runner.metrics()["handoff_enqueued_total"]["enqueue_failed"] == 1


async def test_a_failed_recovery_returns_its_result_on_the_error() -> None:
    mem: MemoryBackend[State] = MemoryBackend()
    outbox = FaultyOutbox(PlainOutbox(mem.outbox))
    outbox.arm(times=2, error=lambda: ConnectionError("queue down"))
    runner = flowy.Runner(handoff_graph(), as_backend(mem.checkpointer, outbox=outbox))
    first = await runner.start("t", {})
    assert first.reason == flowy.Reason.HANDOFF_ORPHANED
    with pytest.raises(flowy.HandoffEnqueueFailedError) as info:
        await runner.recover_stale_handoff("t")
    result = info.value.result
    assert result is not None and result.error is info.value
    assert result.recovered_from is flowy.HandoffStatus.ORPHANED
    assert result.handoff_status is flowy.HandoffStatus.ORPHANED
    assert result.resume_token == info.value.resume_token


# -- the resume pipeline --------------------------------------------------------------------


async def test_the_run_context_exists_inside_the_resume_target_policy() -> None:
    key: flowy.BindingKey[str] = flowy.BindingKey("who")
    seen: list[tuple[str, int, str]] = []

    def policy(state: State, pointer: str) -> tuple[State, Any]:
        meta = flowy.run_metadata()
        seen.append((meta.thread_id, meta.segment, flowy.binding(key)))
        return state, flowy.resume_current()

    runner = flowy.Runner(approval_graph(), as_backend(MemoryCheckpointer[State]()))
    first = await runner.start("t", {})
    assert first.resume_token is not None
    bindings = flowy.bind(flowy.RunBindings(), key, "reviewer")
    await runner.resume(
        first.resume_token,
        state_overlay={"approved": True},
        bindings=bindings,
        resume_target_policy=policy,
    )
    assert seen == [("t", 1, "reviewer")]


async def test_a_run_lease_without_a_lease_manager_is_refused() -> None:
    runner = flowy.Runner(linear_graph(), as_backend(MemoryCheckpointer[State]()))
    with pytest.raises(ValueError, match="no lease manager"):
        await runner.start("t", {}, run_lease=("w", 30))
    with pytest.raises(ValueError, match="no lease manager"):
        flowy.Runner(linear_graph(), as_backend(MemoryCheckpointer[State]()), run_lease=("w", 30))
    assert await runner.checkpointer.list_threads() == []  # type: ignore[union-attr]


# -- runaway graphs -------------------------------------------------------------------------


def self_handing_off_graph(**kw: Any) -> flowy.Graph[State, Any]:
    async def spin(s: State) -> tuple[State, flowy.Directive[Any]]:
        return s, flowy.handoff("again")  # no resume_at, no state change: forever

    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    b.add_node("spin", spin).allow_no_outgoing_route("spin")
    return b.compile(**kw)


async def test_a_self_handing_off_node_is_bounded_and_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    recorder = Recorder()
    mem: MemoryBackend[State] = MemoryBackend()
    runner = flowy.Runner(self_handing_off_graph(max_total_steps=20), mem, observer=recorder)
    await runner.start("t", {"n": 1})
    worker = flowy.Worker(runner)
    with caplog.at_level(logging.WARNING, logger="flowy"):
        processed = await worker.run_until_idle(idle_wait=0.1)
    snap, _ = await mem.checkpointer.load("t")
    assert snap.status is flowy.RunStatus.FAILED
    assert snap.reason == flowy.Reason.MAX_TOTAL_STEPS_EXCEEDED
    assert snap.total_steps == 20 and processed == 20
    # Every segment that handed off (the start's and 19 resumed ones) made no progress:
    # warned and published; the 20th resume failed on the cap before running anything.
    assert len(recorder.of(LifecycleEventType.NO_PROGRESS)) == 20
    assert any("no progress" in r.getMessage() for r in caplog.records)
    assert recorder.of(LifecycleEventType.STEP_LIMIT_EXCEEDED)


def test_the_total_step_cap_has_a_documented_default() -> None:
    assert linear_graph().max_total_steps == 10_000
    with pytest.raises(flowy.GraphValidationError, match="max_total_steps"):
        linear_graph(max_total_steps=0)
    assert linear_graph(max_total_steps=None).max_total_steps is None
