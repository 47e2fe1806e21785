"""The hand-off outbox FSM, the transactional path, recovery, observer and metrics."""

from __future__ import annotations

import threading
import time

import pytest
from core_graphs import PlainOutbox, State, handoff_graph

import flowy
from flowy import errors, lifecycle, storage, stream_helpers
from flowy import types as ftypes
from flowy.memory import MemoryBackend, MemoryCheckpointer
from flowy.storage import as_backend
from flowy.testing.faults import FaultyCheckpointer, FaultyOutbox, Phase

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def _fresh_metrics() -> None:
    lifecycle.reset_metrics()


def counts() -> dict[str, int]:
    return lifecycle.metrics()["handoff_enqueued_total"]


async def test_three_phase_success_intent_fields() -> None:
    mem: MemoryBackend[State] = MemoryBackend()
    cp = mem.checkpointer
    queue = mem.outbox
    runner = flowy.Runner(handoff_graph(), as_backend(cp, outbox=PlainOutbox(queue)))
    r = await runner.start("t", {})
    assert r.status is flowy.RunStatus.HANDOFF and r.reason == "background"
    assert r.handoff_status is flowy.HandoffStatus.ENQUEUED
    history = await cp.get_history("t")
    assert [(s.revision, s.handoff_status) for s in history][:2] == [
        (r.revision, flowy.HandoffStatus.ENQUEUED),
        (r.revision - 1, flowy.HandoffStatus.PENDING),
    ]
    assert history[1].handoff_pending_at is not None
    (msg,) = await mem.consumer.claim(10, 30)
    intent = msg.intent
    assert intent.pending_snapshot_revision == r.revision - 1
    assert intent.committed_snapshot_revision == r.revision == intent.snapshot_revision
    assert intent.resume_token == r.resume_token
    assert intent.handoff_status is flowy.HandoffStatus.ENQUEUED
    assert intent.execution_pointer == "finish" and intent.reason == "background"
    assert counts()["success"] == 1
    done = await runner.resume(intent.resume_token)
    assert done.status is flowy.RunStatus.COMPLETED and done.state["finished"] == 1


async def test_transactional_path_one_revision() -> None:
    mem: MemoryBackend[State] = MemoryBackend()
    cp = mem.checkpointer
    queue = mem.outbox
    r = await flowy.Runner(handoff_graph(), as_backend(cp, outbox=queue)).start("t", {})
    (msg,) = await mem.consumer.claim(10, 30)
    intent = msg.intent
    assert intent.pending_snapshot_revision == intent.committed_snapshot_revision == r.revision
    assert intent.resume_token == r.resume_token
    snap, _ = await cp.load("t")
    assert snap.handoff_status is flowy.HandoffStatus.ENQUEUED
    assert counts()["success"] == 1


async def test_transactional_commit_failure_writes_nothing() -> None:
    mem: MemoryBackend[State] = MemoryBackend()
    cp = FaultyCheckpointer(mem.checkpointer)
    cp.arm(Phase.COMMIT, error=lambda: flowy.StorageError("tx aborted"))
    queue = mem.outbox
    r = await flowy.Runner(
        handoff_graph(save_every_step=False), as_backend(cp, outbox=queue)
    ).start("t", {})
    assert r.status is flowy.RunStatus.FAILED and r.reason == flowy.Reason.HANDOFF_SAVE_FAILED
    assert mem.consumer.pending_count() == 0
    with pytest.raises(flowy.ThreadNotFoundError):
        await cp.load("t")
    assert counts()["commit_failed"] == 1


async def test_enqueue_failure_patches_orphaned() -> None:
    mem: MemoryBackend[State] = MemoryBackend()
    cp = mem.checkpointer
    outbox = FaultyOutbox(PlainOutbox(mem.outbox))
    outbox.arm(error=lambda: ConnectionError("queue down"))
    runner = flowy.Runner(handoff_graph(), as_backend(cp, outbox=outbox))
    r = await runner.start("t", {})
    assert r.status is flowy.RunStatus.HANDOFF
    assert r.reason == flowy.Reason.HANDOFF_ORPHANED
    assert isinstance(r.error, flowy.HandoffEnqueueFailedError)
    assert r.error.resume_token == r.resume_token
    snap, rev = await cp.load("t")
    assert snap.handoff_status is flowy.HandoffStatus.ORPHANED and rev == r.revision
    assert counts()["enqueue_failed"] == 1
    with pytest.raises(errors.HandoffOrphanedError):
        await runner.resume(r.resume_token)  # type: ignore[arg-type]
    decision = await runner.evaluate_resume(r.resume_token)  # type: ignore[arg-type]
    assert decision.kind is flowy.ResumeDecisionKind.HANDOFF_ORPHANED


async def test_worst_case_orphan_patch_fails_snapshot_stays_enqueued() -> None:
    mem: MemoryBackend[State] = MemoryBackend()
    cp = FaultyCheckpointer(mem.checkpointer)
    cp.arm(Phase.PATCH_ORPHANED, error=lambda: flowy.StorageError("db down"))
    queue = mem.outbox
    outbox = FaultyOutbox(PlainOutbox(queue))
    outbox.arm(error=lambda: ConnectionError("queue down"))
    runner = flowy.Runner(handoff_graph(), as_backend(cp, outbox=outbox))
    r = await runner.start("t", {})
    assert r.reason == "background"  # the directive's reason is kept
    assert isinstance(r.error, flowy.HandoffEnqueueFailedError) and not r.error.orphaned
    snap, rev = await cp.load("t")
    assert snap.handoff_status is flowy.HandoffStatus.ENQUEUED and rev == r.revision
    assert counts()["patch_orphan_failed"] == 1 and counts()["enqueue_failed"] == 1
    # runbook: false-enqueued rows need force_reenqueue
    with pytest.raises(errors.HandoffAlreadyEnqueuedError):
        await runner.recover_stale_handoff("t")
    fixed = flowy.Runner(handoff_graph(), as_backend(cp, outbox=queue))
    rec = await fixed.recover_stale_handoff("t", force_reenqueue=True)
    assert rec.error is None and rec.handoff_status is flowy.HandoffStatus.ENQUEUED
    assert rec.recovered_from is flowy.HandoffStatus.ENQUEUED and rec.forced
    (msg,) = await mem.consumer.claim(10, 30)
    assert msg.intent.resume_token == rec.resume_token


async def test_patch_enqueued_failure_leaves_pending_recoverable_after_ttl() -> None:
    mem: MemoryBackend[State] = MemoryBackend()
    now = [1000.0]
    cp = FaultyCheckpointer(mem.checkpointer)
    cp.arm(Phase.PATCH_ENQUEUED, error=lambda: flowy.StorageError("db down"))
    queue = mem.outbox
    runner = flowy.Runner(
        handoff_graph(), as_backend(cp, outbox=PlainOutbox(queue)), clock=lambda: now[0]
    )
    r = await runner.start("t", {})
    assert isinstance(r.error, errors.HandoffPatchFailedError)
    assert r.handoff_status is flowy.HandoffStatus.PENDING
    assert counts()["patch_enqueued_failed"] == 1
    assert mem.consumer.pending_count() == 0
    with pytest.raises(errors.HandoffPendingError):
        await runner.resume(r.resume_token)  # type: ignore[arg-type]
    with pytest.raises(errors.HandoffPendingError):
        await runner.recover_stale_handoff("t")  # fresh: may still be in flight
    now[0] += ftypes.DEFAULT_HANDOFF_STALE_AFTER + 1
    rec = await runner.recover_stale_handoff("t")
    assert rec.decision.kind is flowy.ResumeDecisionKind.HANDOFF_PENDING
    assert rec.recovered_from is flowy.HandoffStatus.PENDING and not rec.forced
    assert rec.handoff_status is flowy.HandoffStatus.ENQUEUED and rec.error is None
    (msg,) = await mem.consumer.claim(10, 30)
    assert msg.intent.pending_snapshot_revision == r.revision
    done = await runner.resume(msg.intent.resume_token)
    assert done.status is flowy.RunStatus.COMPLETED


async def test_save_pending_failure() -> None:
    mem: MemoryBackend[State] = MemoryBackend()
    cp = FaultyCheckpointer(mem.checkpointer)
    cp.arm(Phase.SAVE_PENDING, error=lambda: flowy.StorageError("db down"))
    r = await flowy.Runner(handoff_graph(), as_backend(cp, outbox=PlainOutbox(mem.outbox))).start(
        "t", {}
    )
    assert r.status is flowy.RunStatus.FAILED and r.reason == flowy.Reason.HANDOFF_SAVE_FAILED
    assert counts()["save_failed"] == 1


async def test_recovery_error_matrix() -> None:
    mem: MemoryBackend[State] = MemoryBackend()
    cp = mem.checkpointer
    queue = mem.outbox
    runner = flowy.Runner(handoff_graph(), as_backend(cp, outbox=PlainOutbox(queue)))
    # none → not recoverable
    await cp.save(0, storage.Snapshot("plain", {}, "work", flowy.RunStatus.SUSPENDED))
    with pytest.raises(errors.HandoffNotRecoverableError):
        await runner.recover_stale_handoff("plain")
    # enqueued → already enqueued
    await runner.start("t", {})
    with pytest.raises(errors.HandoffAlreadyEnqueuedError):
        await runner.evaluate_handoff_recovery("t")
    # an empty pending-at is stale at once
    await cp.save(
        0,
        storage.Snapshot(
            "p",
            {},
            "finish",
            flowy.RunStatus.HANDOFF,
            handoff_status=flowy.HandoffStatus.PENDING,
            handoff_pending_at=None,
        ),
    )
    decision = await runner.evaluate_handoff_recovery("p")
    assert decision.kind is flowy.ResumeDecisionKind.HANDOFF_PENDING
    rec = await runner.recover_stale_handoff("p")
    assert rec.snapshot_revision == 2 and rec.resume_token == flowy.ResumeToken("p", 2)
    # fresh pending → pending error; with stale_after=0 → recovered
    await cp.save(
        0,
        storage.Snapshot(
            "fresh",
            {},
            "finish",
            flowy.RunStatus.HANDOFF,
            handoff_status=flowy.HandoffStatus.PENDING,
            handoff_pending_at=time.time(),
        ),
    )
    with pytest.raises(errors.HandoffPendingError):
        await runner.recover_stale_handoff("fresh")
    fresh = await runner.recover_stale_handoff("fresh", stale_after=0)
    assert fresh.recovered_from is flowy.HandoffStatus.PENDING
    assert fresh.handoff_status is flowy.HandoffStatus.ENQUEUED
    with pytest.raises(flowy.ThreadNotFoundError):
        await runner.recover_stale_handoff("missing")


async def test_recovery_enqueue_failure_patches_orphaned_again() -> None:
    mem: MemoryBackend[State] = MemoryBackend()
    cp = mem.checkpointer
    outbox = FaultyOutbox(PlainOutbox(mem.outbox))
    outbox.arm(times=2, error=lambda: ConnectionError("queue down"))
    runner = flowy.Runner(handoff_graph(), as_backend(cp, outbox=outbox))
    r = await runner.start("t", {})
    assert r.reason == flowy.Reason.HANDOFF_ORPHANED
    with pytest.raises(flowy.HandoffEnqueueFailedError) as info:
        await runner.recover_stale_handoff("t")
    assert info.value.orphaned
    snap, rev = await cp.load("t")
    assert snap.handoff_status is flowy.HandoffStatus.ORPHANED
    assert info.value.resume_token == flowy.ResumeToken("t", rev)
    again = await runner.recover_stale_handoff("t")
    assert again.recovered_from is flowy.HandoffStatus.ORPHANED
    assert again.handoff_status is flowy.HandoffStatus.ENQUEUED


class SlowRaisingObserver:
    def __init__(self) -> None:
        self.events: list[lifecycle.LifecycleEvent] = []
        self.thread = ""

    def on_event(self, event: lifecycle.LifecycleEvent) -> None:
        self.thread = threading.current_thread().name
        self.events.append(event)
        time.sleep(0.2)
        raise RuntimeError("observer bug")


async def test_observer_that_raises_or_is_slow_never_stalls_a_run() -> None:
    mem: MemoryBackend[State] = MemoryBackend()
    from flowy.lifecycle import flush_observers

    obs = SlowRaisingObserver()
    lifecycle.set_lifecycle_observer(obs)
    try:
        outbox = FaultyOutbox(PlainOutbox(mem.outbox))
        outbox.arm(error=lambda: ConnectionError("down"))
        runner = flowy.Runner(handoff_graph(), as_backend(mem.checkpointer, outbox=outbox))
        started = time.monotonic()
        for i in range(3):
            await runner.start(f"t{i}", {})
        assert time.monotonic() - started < 0.3  # three runs did not wait for 0.2 s each
        assert flush_observers(5)
        kinds = {e.type for e in obs.events}
        assert lifecycle.LifecycleEventType.HANDOFF_ENQUEUED in kinds
        assert obs.thread == "flowy-lifecycle-observer"
    finally:
        lifecycle.set_lifecycle_observer(None)


def test_metrics_view_lists_every_status() -> None:
    assert set(counts()) == {
        "success",
        "enqueue_failed",
        "patch_enqueued_failed",
        "patch_orphan_failed",
        "save_failed",
        "commit_failed",
    }


async def test_handoff_without_outbox_returns_token_for_caller() -> None:
    runner = flowy.Runner(handoff_graph(), as_backend(MemoryCheckpointer[State]()))
    r = await runner.start("t", {})
    assert r.status is flowy.RunStatus.HANDOFF and r.resume_token is not None
    assert r.handoff_status is flowy.HandoffStatus.NONE
    done = await runner.resume(r.resume_token)
    assert done.state["finished"] == 1


def test_intent_wire_format_round_trip() -> None:
    intent = storage.HandoffIntent(
        thread_id="t:{x}\n",
        pending_snapshot_revision=3,
        committed_snapshot_revision=4,
        snapshot_revision=4,
        resume_token=flowy.ResumeToken("t:{x}\n", 4),
        handoff_status=flowy.HandoffStatus.ENQUEUED,
        reason="r",
        execution_pointer="n",
        created_at=12.5,
    )
    from flowy.storage.dialect import decode_intent, encode_intent

    assert decode_intent(encode_intent(intent)) == intent
    with pytest.raises(ValueError, match="malformed"):
        decode_intent(b'{"v": 1}')


async def test_enqueue_failure_and_retention_failure_are_both_reported() -> None:
    mem: MemoryBackend[State] = MemoryBackend()
    cp = FaultyCheckpointer(mem.checkpointer)
    cp.arm(Phase.PRUNE)
    outbox = FaultyOutbox(PlainOutbox(mem.outbox))
    outbox.arm(error=lambda: ConnectionError("queue down"))
    handle = await flowy.Runner(
        handoff_graph(retention_limit=1), as_backend(cp, outbox=outbox)
    ).stream("t", {})
    events, r = await stream_helpers.collect_events_and_wait(handle)
    assert r.status is flowy.RunStatus.HANDOFF
    # The orphaned hand-off is what needs acting on: its reason is kept, and the error is
    # still catchable as what it is, carrying the prune failure along.
    assert r.reason == flowy.Reason.HANDOFF_ORPHANED
    with pytest.raises(flowy.HandoffEnqueueFailedError) as info:
        r.raise_for_error()
    assert info.value.orphaned
    assert isinstance(info.value.retention_error, flowy.StorageUnavailableError)
    assert any("pruning the history failed" in note for note in info.value.__notes__)
    assert events[-1].type is flowy.EventType.HANDOFF and events[-1].reason == r.reason
    snap, _ = await cp.load("t")
    assert snap.handoff_status is flowy.HandoffStatus.ORPHANED


async def test_handoff_save_failure_is_a_failed_event_with_the_same_reason() -> None:
    mem: MemoryBackend[State] = MemoryBackend()
    cp = FaultyCheckpointer(mem.checkpointer)
    cp.arm(Phase.SAVE_PENDING, error=lambda: flowy.StorageError("db down"))
    handle = await flowy.Runner(
        handoff_graph(), as_backend(cp, outbox=PlainOutbox(mem.outbox))
    ).stream("t", {})
    events, r = await stream_helpers.collect_events_and_wait(handle)
    assert r.reason == flowy.Reason.HANDOFF_SAVE_FAILED
    assert events[-1].type is flowy.EventType.FAILED
    assert events[-1].reason == r.reason
