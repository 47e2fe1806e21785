"""Run outcomes: ``RunResult``, reason constants, resume and recovery decisions."""

from __future__ import annotations

import enum
import warnings
from dataclasses import dataclass, field
from typing import Generic

from ._types import E, HandoffStatus, ResumeToken, RunStatus, S

__all__ = [
    "HandoffRecoveryResult",
    "Reason",
    "ResumeDecision",
    "ResumeDecisionKind",
    "RunResult",
]


class Reason(enum.StrEnum):
    """Reasons the core itself sets (a node's own reasons are plain strings)."""

    COMPLETED = "completed"
    """A terminal node completed."""
    END = "end"
    """A node returned ``end()``."""
    NODE_ERROR = "node_error"
    """A node raised; nothing is saved (the last checkpoint stays) and the
    exception is the result's ``error``."""
    REDUCER_ERROR = "reducer_error"
    """The reducer raised; nothing is saved."""
    ROUTER_ERROR = "router_error"
    """A router raised; nothing is saved."""
    ROUTER_TARGET_UNDECLARED = "router_target_undeclared"
    """A router returned a node not among its declared targets."""
    RETRY_EXHAUSTED = "retry_exhausted"
    """``retry()`` attempts were used up and the node has no retry route."""
    MAX_STEPS_EXCEEDED = "max_steps_exceeded"
    """The segment reached the graph's ``max_steps``."""
    MAX_TOTAL_STEPS_EXCEEDED = "max_total_steps_exceeded"
    """The thread reached the graph's ``max_total_steps`` (all segments)."""
    BUDGET_EXCEEDED = "budget_exceeded"
    """A budget went over its limit; the reason is ``budget_exceeded:<name>``."""
    INVARIANT_VIOLATION = "invariant_violation"
    """The invariant validator raised after a step."""
    LEASE_LOST = "lease_lost"
    """The run lease was lost; the run stopped without saving."""
    CANCELED = "canceled"
    """``flowy.operations.cancel`` (or ``Runner.cancel``) stopped the thread from outside;
    the reason is ``canceled`` or ``canceled: <the reason given>``. Resumable."""
    TERMINATED = "terminated"
    """``flowy.operations.terminate`` fenced the run's lease and failed the thread; the
    reason is ``terminated`` or ``terminated: <the reason given>``."""
    LOCAL_HANDOFF = "local_handoff"
    """``request_local_handoff()`` handed the run off."""
    CONTEXT_CANCELED = "context_canceled"
    """``request_stop()`` or a cancellation saved a resumable snapshot."""
    CONTEXT_CANCELED_SAVE_FAILED = "context_canceled_save_failed"
    """That stop/cancel save failed (status stays canceled)."""
    CONTEXT_CANCELED_CHECKPOINT_SKIPPED = "context_canceled_checkpoint_skipped"
    """That stop/cancel save failed and ``SKIP_ON_SAVE_ERROR`` skipped it."""
    CONTEXT_CANCELED_RETENTION_FAILED = "context_canceled_retention_failed"
    """Saved, but pruning the history (``retention_limit``) failed."""
    SUSPEND_SAVE_FAILED = "suspend_save_failed"
    """The suspend save failed; the run failed."""
    SUSPEND_CHECKPOINT_SKIPPED = "suspend_checkpoint_skipped"
    """The suspend save failed and ``SKIP_ON_SAVE_ERROR`` skipped it (no token)."""
    SUSPEND_RETENTION_FAILED = "suspend_retention_failed"
    """Suspended and saved, but pruning the history failed."""
    SUSPEND_RESUME_TARGET_INVALID = "suspend_resume_target_invalid"
    """``suspend(resume_at=...)`` named a node the graph does not have."""
    WAIT_SAVE_FAILED = "wait_save_failed"
    """The waiting save (``sleep``, ``wait_for``, an activity's retry) failed; the run
    failed."""
    WAIT_CHECKPOINT_SKIPPED = "wait_checkpoint_skipped"
    """The waiting save failed and ``SKIP_ON_SAVE_ERROR`` skipped it (no token)."""
    WAIT_RETENTION_FAILED = "wait_retention_failed"
    """Waiting and saved, but pruning the history failed."""
    WAIT_TARGET_INVALID = "wait_target_invalid"
    """A wait's ``resume_at`` or ``on_timeout`` named a node the graph does not have."""
    FAN_OUT_UNDECLARED = "fan_out_undeclared"
    """A node returned ``fan_out(node, ...)`` without declaring that fan-out."""
    BRANCH_FAILED = "branch_failed"
    """A branch of a superstep failed; the reason is ``branch_failed:<node>:<its reason>``."""
    BRANCH_DIRECTIVE_UNSUPPORTED = "branch_directive_unsupported"
    """A branch returned a directive a branch cannot (a wait or a nested fan-out)."""
    ACTIVITY_RETRY = "activity_retry"
    """An activity raised and waits for its next attempt (a durable timer)."""
    HANDOFF_SAVE_FAILED = "handoff_save_failed"
    """The hand-off save failed; the run failed."""
    HANDOFF_CHECKPOINT_SKIPPED = "handoff_checkpoint_skipped"
    """The hand-off save failed and ``SKIP_ON_SAVE_ERROR`` skipped it (no token)."""
    HANDOFF_RETENTION_FAILED = "handoff_retention_failed"
    """Handed off and saved, but pruning the history failed."""
    HANDOFF_RESUME_TARGET_INVALID = "handoff_resume_target_invalid"
    """``handoff(resume_at=...)`` named a node the graph does not have."""
    HANDOFF_ORPHANED = "handoff_orphaned"
    """The intent could not be enqueued; the snapshot is saved as orphaned and
    the result's ``error`` is a ``HandoffEnqueueFailedError``."""
    HANDOFF_QUEUE_UNSUPPORTED = "handoff_queue_unsupported"
    """A hand-off named a queue, partition or priority on a store that keeps no queues;
    the run failed at the hand-off's node (its state saved, resumable) with a
    ``TypeError`` naming the store and the queue."""
    STEP_SAVE_FAILED = "step_save_failed"
    """A checkpoint between steps failed; the run failed."""
    COMPLETED_SAVE_FAILED = "completed_save_failed"
    """The completed snapshot could not be saved; the run failed."""
    COMPLETED_CHECKPOINT_SKIPPED = "completed_checkpoint_skipped"
    """The completed save failed and ``SKIP_ON_SAVE_ERROR`` skipped it."""
    FAILED_SAVE_FAILED = "failed_save_failed"
    """The failed snapshot could not be saved."""
    FAILED_CHECKPOINT_SKIPPED = "failed_checkpoint_skipped"
    """The failed save failed and ``SKIP_ON_SAVE_ERROR`` skipped it."""


@dataclass
class RunResult(Generic[S, E]):
    """The authoritative outcome of one run segment (start or resume).

    ``resume_token`` is set only after a persisted suspend, hand-off or cancel snapshot;
    ``revision`` is the last revision this run persisted (0 if none). ``error`` is set
    when the outcome carries an error, e.g. ``HandoffEnqueueFailedError``, a retention
    failure, a node exception or ``CheckpointSkippedError``; ``raise_for_error()`` raises
    it.
    """

    thread_id: str
    """The thread that ran."""
    state: S
    """The state when the segment ended."""
    status: RunStatus
    """Where the run stands."""
    reason: str
    """Why it stopped: a :class:`Reason` value or a node's own reason."""
    execution_pointer: str
    """The node the run stopped at (where a resume continues)."""
    resume_token: ResumeToken | None = None
    """The token of the persisted suspend, hand-off or cancel snapshot, else ``None``."""
    effects: list[E] = field(default_factory=lambda: [])
    """The effects emitted in this segment, in order."""
    step_count: int = 0
    """Steps run in this segment."""
    total_steps: int = 0
    """Steps run by the thread across all its segments."""
    segment: int = 0
    """The segment number: 0 for the start, one more for each resume."""
    budget_counts: dict[str, int] = field(default_factory=lambda: {})
    """Budget use of the thread (``use_budget``), kept across resumes."""
    handoff_status: HandoffStatus = HandoffStatus.NONE
    """The hand-off status of the last snapshot (``NONE`` unless handed off)."""
    error: BaseException | None = None
    """The error the outcome carries, if any (``raise_for_error()`` raises it)."""
    revision: int = 0
    """The last revision this run persisted (0 if none)."""

    def raise_for_error(self) -> RunResult[S, E]:
        """Raise ``error`` if set; return ``self`` otherwise."""
        if self.error is not None:
            raise self.error
        return self


class ResumeDecisionKind(enum.StrEnum):
    """What a preflight found (``Runner.evaluate_resume``)."""

    RESUMABLE = "resumable"
    """The token names the head snapshot: resume with it."""
    STALE_TOKEN = "stale_token"
    """The head has moved past the token; ``resume_token`` is the current core-issued one."""
    HANDOFF_PENDING = "handoff_pending"
    """The head is a pending hand-off: use the recovery path."""
    HANDOFF_ORPHANED = "handoff_orphaned"
    """The head is an orphaned hand-off: use the recovery path."""
    COMPLETED = "completed"
    """The thread completed: nothing is left to run (a resume-target policy may run part
    of it again on purpose)."""
    VERSION_MISMATCH = "version_mismatch"
    """The head was saved by another graph version and no declared migration covers it:
    a resume raises ``GraphVersionMismatchError``."""
    UNKNOWN_NODE = "unknown_node"
    """The head's execution pointer names no node of this graph (a deploy renamed or
    removed it): a resume-target policy must choose where to continue."""
    NOT_FOUND = "not_found"
    """The thread has no snapshot."""


@dataclass(frozen=True, slots=True)
class ResumeDecision:
    """A typed preflight decision with the current core-issued ``resume_token``."""

    kind: ResumeDecisionKind
    """What the preflight found."""
    thread_id: str
    """The thread evaluated."""
    resume_token: ResumeToken | None
    """The token of the thread's current head (``None`` if the thread has none)."""
    requested: ResumeToken | None
    """The token evaluated (``None`` for a hand-off recovery decision)."""
    status: RunStatus | None = None
    """The head's run status (``None`` if the thread has no snapshot)."""
    handoff_status: HandoffStatus = HandoffStatus.NONE
    """The head's hand-off status."""
    execution_pointer: str = ""
    """The node the head resumes at (``""`` if the thread has no snapshot)."""
    handoff_pending_at: float | None = None
    """When the head's hand-off was saved as pending (seconds since the epoch), if it was."""
    reason: str = ""
    """The head's reason (``""`` if the thread has no snapshot)."""

    @property
    def resumable(self) -> bool:
        """True if ``Runner.resume(requested)`` would pass preflight."""
        return self.kind is ResumeDecisionKind.RESUMABLE

    @property
    def token(self) -> ResumeToken | None:
        """Deprecated alias of :attr:`resume_token` (removed in 0.3)."""
        warnings.warn(
            "ResumeDecision.token is deprecated; use ResumeDecision.resume_token",
            DeprecationWarning,
            2,
        )
        return self.resume_token


@dataclass(frozen=True, slots=True)
class HandoffRecoveryResult:
    """What ``Runner.recover_stale_handoff`` did.

    ``recovered_from`` is the hand-off status the thread had (orphaned, pending, or
    enqueued when ``forced``); ``handoff_status`` the status it has now, at
    ``snapshot_revision``; ``resume_token`` names that snapshot. ``error`` is set when
    the recovery failed after persisting something (see ``HandoffEnqueueFailedError``).
    """

    decision: ResumeDecision
    """The recovery decision (as ``Runner.evaluate_handoff_recovery`` makes it)."""
    resume_token: ResumeToken | None
    snapshot_revision: int
    handoff_status: HandoffStatus
    recovered_from: HandoffStatus
    forced: bool = False
    """True when an enqueued hand-off was re-enqueued (``force_reenqueue``)."""
    error: BaseException | None = None

    @property
    def recovered(self) -> bool:
        """Deprecated (removed in 0.3): true when the hand-off is enqueued again."""
        warnings.warn(
            "HandoffRecoveryResult.recovered is deprecated; check handoff_status or error",
            DeprecationWarning,
            2,
        )
        return self.error is None
