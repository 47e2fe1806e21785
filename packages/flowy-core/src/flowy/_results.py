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
    END = "end"
    NODE_ERROR = "node_error"
    REDUCER_ERROR = "reducer_error"
    ROUTER_ERROR = "router_error"
    ROUTER_TARGET_UNDECLARED = "router_target_undeclared"
    RETRY_EXHAUSTED = "retry_exhausted"
    MAX_STEPS_EXCEEDED = "max_steps_exceeded"
    MAX_TOTAL_STEPS_EXCEEDED = "max_total_steps_exceeded"
    BUDGET_EXCEEDED = "budget_exceeded"
    INVARIANT_VIOLATION = "invariant_violation"
    LEASE_LOST = "lease_lost"
    LOCAL_HANDOFF = "local_handoff"
    CONTEXT_CANCELED = "context_canceled"
    CONTEXT_CANCELED_SAVE_FAILED = "context_canceled_save_failed"
    CONTEXT_CANCELED_CHECKPOINT_SKIPPED = "context_canceled_checkpoint_skipped"
    CONTEXT_CANCELED_RETENTION_FAILED = "context_canceled_retention_failed"
    SUSPEND_SAVE_FAILED = "suspend_save_failed"
    SUSPEND_CHECKPOINT_SKIPPED = "suspend_checkpoint_skipped"
    SUSPEND_RETENTION_FAILED = "suspend_retention_failed"
    SUSPEND_RESUME_TARGET_INVALID = "suspend_resume_target_invalid"
    HANDOFF_SAVE_FAILED = "handoff_save_failed"
    HANDOFF_CHECKPOINT_SKIPPED = "handoff_checkpoint_skipped"
    HANDOFF_RETENTION_FAILED = "handoff_retention_failed"
    HANDOFF_RESUME_TARGET_INVALID = "handoff_resume_target_invalid"
    HANDOFF_ORPHANED = "handoff_orphaned"
    STEP_SAVE_FAILED = "step_save_failed"
    COMPLETED_SAVE_FAILED = "completed_save_failed"
    COMPLETED_CHECKPOINT_SKIPPED = "completed_checkpoint_skipped"
    FAILED_SAVE_FAILED = "failed_save_failed"
    FAILED_CHECKPOINT_SKIPPED = "failed_checkpoint_skipped"


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
    state: S
    status: RunStatus
    reason: str
    execution_pointer: str
    resume_token: ResumeToken | None = None
    effects: list[E] = field(default_factory=lambda: [])
    step_count: int = 0
    total_steps: int = 0
    segment: int = 0
    budget_counts: dict[str, int] = field(default_factory=lambda: {})
    handoff_status: HandoffStatus = HandoffStatus.NONE
    error: BaseException | None = None
    revision: int = 0

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
    UNKNOWN_NODE = "unknown_node"
    """The head's execution pointer names no node of this graph (a deploy renamed or
    removed it): a resume-target policy must choose where to continue."""
    NOT_FOUND = "not_found"
    """The thread has no snapshot."""


@dataclass(frozen=True, slots=True)
class ResumeDecision:
    """A typed preflight decision with the current core-issued ``resume_token``."""

    kind: ResumeDecisionKind
    thread_id: str
    resume_token: ResumeToken | None
    requested: ResumeToken | None
    status: RunStatus | None = None
    handoff_status: HandoffStatus = HandoffStatus.NONE
    execution_pointer: str = ""
    handoff_pending_at: float | None = None

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
    resume_token: ResumeToken | None
    snapshot_revision: int
    handoff_status: HandoffStatus
    recovered_from: HandoffStatus
    forced: bool = False
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
