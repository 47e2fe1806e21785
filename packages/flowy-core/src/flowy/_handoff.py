"""Hand-offs: the transactional path (one ``save_with_outbox``) and the three-phase FSM
(save pending → patch enqueued → enqueue the intent; an enqueue failure patches the
snapshot orphaned), shared by runs (``Handoffs``) and recovery
(``three_phase_tail``).

Every failure is counted under its ``handoff_enqueued_total`` label and published to
the lifecycle observers with that label in ``LifecycleEvent.status``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Generic

from . import _tracing
from ._errors import (
    CheckpointSkippedError,
    ConcurrencyConflictError,
    HandoffEnqueueFailedError,
    HandoffPatchFailedError,
    LeaseLostError,
)
from ._events import EventType
from ._observer import HandoffMetricStatus, LifecycleEvent, LifecycleEventType, Telemetry
from ._results import HandoffRecoveryResult, Reason, ResumeDecision, RunResult
from ._segment import Segment
from ._types import E, ResumeToken, S
from .storage import (
    Checkpointer,
    HandoffIntent,
    HandoffStatus,
    Lease,
    Outbox,
    RunStatus,
    Snapshot,
    TransactionalCheckpointer,
    TransactionalOutbox,
)
from .storage._model import DEFAULT_ROUTE, Route
from .storage.dialect import confirm_save, confirmed_save, new_write_id

__all__ = ["Handoffs", "carrier", "queues_unsupported", "recover_handoff", "three_phase_tail"]

logger = logging.getLogger("flowy")


def queues_unsupported(backend: object, route: Route) -> TypeError:
    """The error of a hand-off bound for ``route`` on ``backend``, a store without
    queues (its message would wait in the default queue instead)."""
    return TypeError(
        f"a hand-off to queue {route.queue!r} (partition {route.partition_key!r}, priority "
        f"{route.priority}) needs a store that keeps queues; {type(backend).__name__} "
        "keeps none (capabilities.queues is false): hand off to the default queue, or use "
        "a store with queues"
    )


def carrier() -> dict[str, str]:
    """The trace context a hand-off carries to its worker (empty without a tracer)."""
    tracing = _tracing.active()
    return tracing.carrier() if tracing is not None else {}


def _failed(
    telemetry: Telemetry,
    status: HandoffMetricStatus,
    type_: LifecycleEventType,
    thread_id: str,
    revision: int,
    error: BaseException,
) -> None:
    telemetry.count_handoff(status)
    telemetry.publish(
        LifecycleEvent(
            type_,
            thread_id,
            revision=revision,
            status=status.value,
            error=f"{type(error).__name__}: {error}",
        )
    )


async def three_phase_tail(
    cp: Checkpointer[Any],
    outbox: Outbox,
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
        committed = await confirmed_save(cp, pending_revision, enqueued, lease=lease)
    except LeaseLostError:
        raise
    except Exception as exc:
        _failed(
            telemetry,
            HandoffMetricStatus.PATCH_ENQUEUED_FAILED,
            LifecycleEventType.HANDOFF_PATCH_FAILED,
            thread_id,
            pending_revision,
            exc,
        )
        raise HandoffPatchFailedError(
            f"hand-off of thread {thread_id!r:.200}: saving status enqueued failed ({exc}); "
            f"the snapshot stays pending at revision {pending_revision} and is recoverable "
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
        trace=carrier(),
        route=pending.route,
    )
    try:
        await outbox.enqueue_intent(intent)
    except Exception as enqueue_exc:
        _failed(
            telemetry,
            HandoffMetricStatus.ENQUEUE_FAILED,
            LifecycleEventType.HANDOFF_ENQUEUE_FAILED,
            thread_id,
            committed,
            enqueue_exc,
        )
        orphan = replace(
            enqueued,
            handoff_status=HandoffStatus.ORPHANED,
            write_id=new_write_id(),
            updated_at=clock(),
        )
        try:
            orphaned = await confirmed_save(cp, committed, orphan, lease=lease)
        except Exception as patch_exc:  # noqa: BLE001 - the runbook's worst case: reported on the error
            _failed(
                telemetry,
                HandoffMetricStatus.PATCH_ORPHAN_FAILED,
                LifecycleEventType.HANDOFF_PATCH_FAILED,
                thread_id,
                committed,
                patch_exc,
            )
            raise HandoffEnqueueFailedError(
                f"hand-off of thread {thread_id!r:.200}: enqueue failed ({enqueue_exc}) and "
                f"the orphaned patch failed too ({patch_exc}); the snapshot stays enqueued at "
                f"revision {committed} without an outbox message: recover it with "
                "recover_stale_handoff(force_reenqueue=True)",
                resume_token=token,
                orphaned=False,
            ) from enqueue_exc
        raise HandoffEnqueueFailedError(
            f"hand-off of thread {thread_id!r:.200}: enqueue failed ({enqueue_exc}); the "
            f"snapshot is saved as orphaned at revision {orphaned}: recover it with "
            "recover_stale_handoff or retry with the error's resume_token",
            resume_token=ResumeToken(thread_id, orphaned),
            orphaned=True,
        ) from enqueue_exc
    telemetry.count_handoff(HandoffMetricStatus.SUCCESS)
    telemetry.publish(
        LifecycleEvent(
            LifecycleEventType.HANDOFF_ENQUEUED,
            thread_id,
            revision=committed,
            status=HandoffMetricStatus.SUCCESS.value,
        )
    )
    return token


class Handoffs(Generic[S, E]):
    """The hand-off terminal path of the segment ``seg``."""

    def __init__(self, seg: Segment[S, E]) -> None:
        self.seg = seg

    def _no_progress(self) -> bool:
        """True when the segment hands off where it started with the state it started
        with: a graph that hands off to itself without doing anything."""
        seg = self.seg
        return (
            seg.meta.step_count > 0
            and seg.pointer == seg.start_pointer
            and seg.state == seg.start_state
        )

    async def handoff(self, reason: str, route: Route | None = None) -> RunResult[S, E]:
        """Persist a hand-off at the segment's pointer (transactional or three-phase),
        its message bound for ``route`` (``None``: the graph's default queue).

        A route other than the default one on a store that keeps no queues fails the
        run with ``handoff_queue_unsupported`` (its state saved at the hand-off's node,
        resumable), since its message would land in the default queue."""
        seg = self.seg
        if route is None:
            route = Route(seg.graph.default_queue)
        if self._no_progress():
            self._warn_no_progress()
        cp = seg.cp
        outbox = seg.services.outbox
        store = seg.services.store
        if cp is None or store is None:
            result = seg.result(RunStatus.HANDOFF, reason)
            seg.emit(EventType.HANDOFF, reason=reason, execution_pointer=seg.pointer)
            return result
        if outbox is not None and route != DEFAULT_ROUTE and not store.capabilities.queues:
            return await seg.fail(
                Reason.HANDOFF_QUEUE_UNSUPPORTED, queues_unsupported(store.backend, route)
            )
        error: BaseException | None = None
        handoff_status = HandoffStatus.NONE
        if outbox is None:
            error = await seg.save_or_stop(
                seg.snapshot(RunStatus.HANDOFF, reason, route=route), "handoff"
            )
        elif store.transactional is not None:
            error = await self._handoff_tx(*store.transactional, reason, route)
            handoff_status = HandoffStatus.ENQUEUED
        else:
            reason, handoff_status, error = await self._handoff_three_phase(
                cp, outbox, reason, route
            )
        persisted = not isinstance(error, CheckpointSkippedError)
        if persisted:
            reason, retention_error = await seg.retention(reason, "handoff")
            if retention_error is not None:
                if isinstance(error, HandoffEnqueueFailedError):
                    # Still catchable as what it is, and still saying handoff_orphaned
                    # when the snapshot was patched orphaned; the prune failure rides
                    # along on the error.
                    error.retention_error = retention_error
                    error.add_note(f"also, pruning the history failed: {retention_error!r}")
                    if error.orphaned:
                        reason = Reason.HANDOFF_ORPHANED
                else:
                    error = retention_error
        else:
            reason = Reason.HANDOFF_CHECKPOINT_SKIPPED
            handoff_status = HandoffStatus.NONE
        result = seg.result(
            RunStatus.HANDOFF, reason, token=persisted, error=error, handoff_status=handoff_status
        )
        seg.emit(
            EventType.HANDOFF,
            reason=reason,
            execution_pointer=seg.pointer,
            resume_token=result.resume_token,
        )
        return result

    async def _handoff_three_phase(
        self, cp: Checkpointer[S], outbox: Outbox, reason: str, route: Route
    ) -> tuple[str, HandoffStatus, BaseException | None]:
        seg = self.seg
        snap = seg.snapshot(
            RunStatus.HANDOFF, reason, HandoffStatus.PENDING, seg.clock(), route=route
        )
        try:
            await seg.save(snap)
        except LeaseLostError as exc:
            raise await seg.stopped_outside(exc) or seg.lease_lost(exc) from exc
        except Exception as exc:  # any store failure: the checkpoint policy decides
            if isinstance(exc, ConcurrencyConflictError):
                stop = await seg.stopped_outside(exc)
                if stop is not None:
                    raise stop from exc
            seg.count(HandoffMetricStatus.SAVE_FAILED, LifecycleEventType.HANDOFF_SAVE_FAILED, exc)
            if not seg.skip_saves:
                seg.save_failed("handoff", exc)
            return reason, HandoffStatus.NONE, seg.skipped("handoff", exc)
        try:
            token = await three_phase_tail(
                cp,
                outbox,
                snap.at_revision(seg.revision),
                seg.revision,
                seg.lease,
                seg.clock,
                seg.telemetry,
            )
        except LeaseLostError as exc:
            raise seg.lease_lost(exc) from exc
        except HandoffPatchFailedError as exc:
            return reason, HandoffStatus.PENDING, exc
        except HandoffEnqueueFailedError as exc:
            if exc.resume_token is not None:
                seg.revision = exc.resume_token.snapshot_revision
            if exc.orphaned:
                return Reason.HANDOFF_ORPHANED, HandoffStatus.ORPHANED, exc
            return reason, HandoffStatus.ENQUEUED, exc
        seg.revision = token.snapshot_revision
        return reason, HandoffStatus.ENQUEUED, None

    async def _handoff_tx(
        self,
        cp: TransactionalCheckpointer[S],
        outbox: TransactionalOutbox,
        reason: str,
        route: Route,
    ) -> BaseException | None:
        seg = self.seg
        snap = seg.snapshot(
            RunStatus.HANDOFF, reason, HandoffStatus.ENQUEUED, seg.clock(), route=route
        )
        thread_id = seg.thread_id
        clock = seg.clock

        async def enqueue(tx: object, revision: int) -> None:
            await outbox.enqueue_intent_tx(
                tx,
                HandoffIntent(
                    thread_id=thread_id,
                    pending_snapshot_revision=revision,
                    committed_snapshot_revision=revision,
                    snapshot_revision=revision,
                    resume_token=ResumeToken(thread_id, revision),
                    handoff_status=HandoffStatus.ENQUEUED,
                    reason=reason,
                    execution_pointer=snap.execution_pointer,
                    created_at=clock(),
                    trace=carrier(),
                    route=snap.route,
                ),
            )

        try:
            if seg.progress_sent:
                await seg.flush_progress()
            seg.revision = await cp.save_with_outbox(seg.revision, snap, enqueue, lease=seg.lease)
        except LeaseLostError as exc:
            raise await seg.stopped_outside(exc) or seg.lease_lost(exc) from exc
        except Exception as exc:  # any commit failure: resolve the outcome, then the policy
            if isinstance(exc, ConcurrencyConflictError):
                stop = await seg.stopped_outside(exc)
                if stop is not None:
                    raise stop from exc
            try:
                landed = await confirm_save(cp, seg.revision, snap)
            except Exception:  # noqa: BLE001 - still unknown: treated as not landed
                landed = None
            if landed is None:
                seg.count(
                    HandoffMetricStatus.COMMIT_FAILED, LifecycleEventType.HANDOFF_SAVE_FAILED, exc
                )
                if not seg.skip_saves:
                    seg.save_failed("handoff", exc)
                return seg.skipped("handoff", exc)
            seg.revision = landed
        seg.telemetry.count_handoff(HandoffMetricStatus.SUCCESS)
        seg.publish(LifecycleEventType.HANDOFF_ENQUEUED, status=HandoffMetricStatus.SUCCESS.value)
        return None

    def _warn_no_progress(self) -> None:
        seg = self.seg
        logger.warning(
            "flowy: thread %r hands off at %r with the state it started the segment with: "
            "no progress (a node that hands off to itself?)",
            seg.thread_id,
            seg.pointer,
        )
        seg.publish(LifecycleEventType.NO_PROGRESS, reason=seg.pointer)


async def recover_handoff(
    cp: Checkpointer[Any],
    outbox: Outbox,
    snap: Snapshot[Any],
    revision: int,
    decision: ResumeDecision,
    clock: Callable[[], float],
    telemetry: Telemetry,
) -> HandoffRecoveryResult:
    """Re-enqueue the hand-off of ``snap`` (head revision ``revision``, already judged
    recoverable by ``decision``) by the three-phase path, and report it to ``telemetry``."""
    pending = replace(snap, handoff_pending_at=snap.handoff_pending_at or clock())
    try:
        token = await three_phase_tail(cp, outbox, pending, revision, None, clock, telemetry)
    except HandoffEnqueueFailedError as exc:
        telemetry.publish(
            LifecycleEvent(
                LifecycleEventType.HANDOFF_RECOVERY_FAILED,
                snap.thread_id,
                revision=revision,
                error=str(exc),
            )
        )
        failed_at = exc.resume_token
        exc.result = HandoffRecoveryResult(
            decision=decision,
            resume_token=failed_at,
            snapshot_revision=failed_at.snapshot_revision if failed_at else revision,
            handoff_status=HandoffStatus.ORPHANED if exc.orphaned else HandoffStatus.ENQUEUED,
            recovered_from=snap.handoff_status,
            forced=snap.handoff_status is HandoffStatus.ENQUEUED,
            error=exc,
        )
        raise
    telemetry.publish(
        LifecycleEvent(
            LifecycleEventType.HANDOFF_RECOVERED, snap.thread_id, revision=token.snapshot_revision
        )
    )
    return HandoffRecoveryResult(
        decision=decision,
        resume_token=token,
        snapshot_revision=token.snapshot_revision,
        handoff_status=HandoffStatus.ENQUEUED,
        recovered_from=snap.handoff_status,
        forced=snap.handoff_status is HandoffStatus.ENQUEUED,
    )
