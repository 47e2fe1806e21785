"""Phases two and three of the hand-off FSM, shared by runs and recovery: patch the
pending snapshot to enqueued, enqueue the intent, and on failure patch it orphaned."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ._errors import HandoffEnqueueFailedError, HandoffPatchFailedError, LeaseLostError
from ._observer import HandoffMetricStatus, LifecycleEvent, LifecycleEventType, Telemetry
from ._types import ResumeToken
from .storage import (
    Checkpointer,
    HandoffIntent,
    HandoffOutbox,
    HandoffStatus,
    Lease,
    RunStatus,
    Snapshot,
    durable_save,
    new_write_id,
)

__all__ = ["three_phase_tail"]


async def three_phase_tail(
    cp: Checkpointer[Any],
    outbox: HandoffOutbox,
    pending: Snapshot[Any],
    pending_revision: int,
    lease: Lease | None,
    clock: Callable[[], float],
    telemetry: Telemetry,
) -> ResumeToken:
    """Phases 2 and 3 of the hand-off FSM from a saved pending snapshot: patch enqueued,
    enqueue the intent; on enqueue failure patch orphaned. Returns the committed token."""
    thread_id = pending.thread_id
    enqueued = replace(
        pending,
        status=RunStatus.HANDOFF,
        handoff_status=HandoffStatus.ENQUEUED,
        write_id=new_write_id(),
        updated_at=clock(),
    )
    try:
        committed = await durable_save(cp, pending_revision, enqueued, lease=lease)
    except LeaseLostError:
        raise
    except Exception as exc:
        telemetry.count_handoff(HandoffMetricStatus.PATCH_ENQUEUED_FAILED)
        raise HandoffPatchFailedError(
            f"hand-off of thread {thread_id!r}: saving status enqueued failed ({exc}); the "
            f"snapshot stays pending at revision {pending_revision} and is recoverable "
            "after the stale TTL"
        ) from exc
    token = ResumeToken(thread_id, committed)
    intent = HandoffIntent(
        thread_id=thread_id,
        pending_snapshot_revision=pending_revision,
        committed_snapshot_revision=committed,
        snapshot_revision=committed,
        resume_token=token,
        handoff_status=HandoffStatus.ENQUEUED,
        reason=pending.reason,
        execution_pointer=pending.execution_pointer,
        created_at=clock(),
    )
    try:
        await outbox.enqueue_intent(intent)
    except Exception as enqueue_exc:
        telemetry.count_handoff(HandoffMetricStatus.ENQUEUE_FAILED)
        orphan = replace(
            enqueued,
            handoff_status=HandoffStatus.ORPHANED,
            write_id=new_write_id(),
            updated_at=clock(),
        )
        try:
            orphaned = await durable_save(cp, committed, orphan, lease=lease)
        except Exception as patch_exc:
            telemetry.count_handoff(HandoffMetricStatus.PATCH_ORPHAN_FAILED)
            err = HandoffEnqueueFailedError(
                f"hand-off of thread {thread_id!r}: enqueue failed ({enqueue_exc}) and the "
                f"orphaned patch failed too ({patch_exc}); the snapshot stays enqueued at "
                f"revision {committed} without an outbox message: recover it with "
                "recover_stale_handoff(force_reenqueue=True)",
                resume_token=token,
                orphaned=False,
            )
            raise err from enqueue_exc
        err = HandoffEnqueueFailedError(
            f"hand-off of thread {thread_id!r}: enqueue failed ({enqueue_exc}); the snapshot "
            f"is saved as orphaned at revision {orphaned}: recover it with "
            "recover_stale_handoff or retry with the error's resume_token",
            resume_token=ResumeToken(thread_id, orphaned),
            orphaned=True,
        )
        raise err from enqueue_exc
    telemetry.count_handoff(HandoffMetricStatus.SUCCESS)
    telemetry.publish(
        LifecycleEvent(LifecycleEventType.HANDOFF_ENQUEUED, thread_id, revision=committed)
    )
    return token
