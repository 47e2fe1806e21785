"""The whole flowy exception tree.

Every error flowy raises derives from :class:`FlowyError`; foreign errors (driver
exceptions, codec errors) are translated at the boundary with ``raise ... from exc``.
The names follow the specification's ``ErrX`` sentinels one to one as ``XError``::

    FlowyError
    ├── BackendURLError                 connect(): a bad URL, unknown scheme or missing adapter
    ├── LimitError                      (also a ValueError) a value past a limit of what is stored
    ├── GraphValidationError            compile() found problems (all listed at once)
    ├── UnknownNodeError                a node name that is not in the graph
    ├── InvalidResumeTokenError         empty thread id, malformed token (also a ValueError)
    │   ├── InvalidThreadIdError        thread id empty, too long or not a str
    │   └── ThreadCompletedError        resume of a completed thread without a target policy
    ├── InvalidResumePlanError          a resume-target policy returned an empty/invalid plan
    ├── GraphVersionMismatchError       the thread was saved by another graph version, no migration
    ├── ThreadNotFoundError             no checkpoint for the thread
    ├── ThreadFinishedError             cancel or terminate of a thread that completed or failed
    ├── ThreadContentionError           someone else got to the thread first:
    │   ├── ConcurrencyConflictError    strict OCC: expected revision is not the stored one
    │   ├── ThreadAlreadyRunningError   the thread is running in this process
    │   └── ThreadLeaseBusyError        (also a LeaseError) another live lease holds it
    ├── NoActiveExecutionError          request_local_handoff() after the run ended
    ├── ScheduleError                   no schedule of that name, or one exists already
    ├── CheckpointSkippedError          SKIP_ON_SAVE_ERROR skipped a terminal save
    ├── MissingBindingError             binding(key) without a bound value
    ├── NoRunContextError               run_metadata()/use_budget() outside a run
    ├── LeaseError
    │   ├── LeaseRequiredError          a lease manager is configured but run_lease was not given
    │   ├── ThreadLeaseBusyError        another live lease holds the thread
    │   └── LeaseLostError              the lease expired or was taken over (fencing)
    ├── ActivityError                   flowy.activity() could not give a result:
    │   ├── ActivityOutcomeUnknownError it started before a crash and nothing says how it ended
    │   └── ActivityFailedError         it raised on its last allowed attempt
    ├── HandoffError
    │   ├── HandoffPendingError         a fresh pending hand-off (not stale yet)
    │   ├── HandoffOrphanedError        direct resume of an orphaned hand-off
    │   ├── HandoffAlreadyEnqueuedError recovery of an enqueued hand-off without force
    │   ├── HandoffNotRecoverableError  recovery of a thread with no hand-off
    │   ├── HandoffPatchFailedError     a hand-off status patch could not be saved
    │   └── HandoffEnqueueFailedError   the intent could not be enqueued (carries a retry token)
    └── StorageError                    a backend failed
        ├── StorageUnavailableError     connection lost / timeout: the outcome may be unknown
        ├── SnapshotEnvelopeInvalidError a stored record is corrupt or mismatched
        ├── SnapshotTooLargeError       the encoded snapshot exceeds the backend's limit
        ├── SchemaVersionError          the store's schema is newer/older than this code
        └── SQLiteFileError             a file that is not a flowy SQLite database
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._results import HandoffRecoveryResult
    from ._types import ResumeToken

__all__ = [
    "ActivityError",
    "ActivityFailedError",
    "ActivityOutcomeUnknownError",
    "BackendURLError",
    "CheckpointSkippedError",
    "ConcurrencyConflictError",
    "FlowyError",
    "GraphValidationError",
    "GraphVersionMismatchError",
    "HandoffAlreadyEnqueuedError",
    "HandoffEnqueueFailedError",
    "HandoffError",
    "HandoffNotRecoverableError",
    "HandoffOrphanedError",
    "HandoffPatchFailedError",
    "HandoffPendingError",
    "InvalidResumePlanError",
    "InvalidResumeTokenError",
    "InvalidThreadIdError",
    "LeaseError",
    "LeaseLostError",
    "LeaseRequiredError",
    "LimitError",
    "MissingBindingError",
    "NoActiveExecutionError",
    "NoRunContextError",
    "ScheduleError",
    "SchemaVersionError",
    "SnapshotEnvelopeInvalidError",
    "SQLiteFileError",
    "SnapshotTooLargeError",
    "StorageError",
    "StorageUnavailableError",
    "ThreadAlreadyRunningError",
    "ThreadCompletedError",
    "ThreadContentionError",
    "ThreadFinishedError",
    "ThreadLeaseBusyError",
    "ThreadNotFoundError",
    "UnknownNodeError",
]


class FlowyError(Exception):
    """Base class of every error raised by flowy."""


class BackendURLError(FlowyError, ValueError):
    """``flowy.connect(url)`` cannot open ``url``: it is malformed, names an unknown
    scheme or option, or needs an adapter package that is not installed (the message
    names the ``pip install`` to run). Passwords never appear in the message."""


class LimitError(FlowyError, ValueError):
    """A value to store is past one of the limits of what flowy keeps (nested too deeply,
    too large, a time out of range, a number JSON cannot carry, an inbox full): nothing
    was stored. The message names the field and the limit (``flowy.storage.Limits``)."""


class GraphValidationError(FlowyError):
    """``GraphBuilder.compile()`` found one or more problems; ``problems`` lists them all."""

    def __init__(self, problems: list[str]) -> None:
        self.problems: list[str] = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"the graph is invalid ({len(self.problems)} problem(s)):\n{lines}")


class UnknownNodeError(FlowyError):
    """A node name that the graph does not contain."""


class InvalidResumeTokenError(FlowyError, ValueError):
    """A resume token that cannot be used (empty thread id, wrong types, text that does
    not parse as ``thread@revision``)."""


class InvalidThreadIdError(InvalidResumeTokenError):
    """A thread id that is empty, too long, or not a string."""


class ThreadCompletedError(InvalidResumeTokenError):
    """The token names a completed snapshot: there is nothing left to run.

    Pass a ``resume_target_policy`` that returns ``resume_to(node)`` to run part of a
    finished thread again on purpose.
    """


class ThreadFinishedError(FlowyError):
    """``cancel`` or ``terminate`` of a thread that already completed or failed: there
    is no run left to stop, and its outcome stays as it is."""


class InvalidResumePlanError(FlowyError):
    """A resume-target policy returned an empty or invalid ``ResumePlan``."""


class GraphVersionMismatchError(FlowyError):
    """A thread saved by another version of the graph, and no declared migration brings
    it to this one (``GraphBuilder.add_migration``, ``rename_node``): nothing ran and
    nothing was written.

    Args:
        message: the error message.
        thread_id: the thread (kept as an attribute).
        stored: the version it was saved under.
        current: the version of the graph that refused it.
    """

    def __init__(self, message: str, *, thread_id: str, stored: str, current: str) -> None:
        super().__init__(message)
        self.thread_id = thread_id
        self.stored = stored
        self.current = current


class ThreadNotFoundError(FlowyError):
    """No checkpoint exists for the thread."""


class ThreadContentionError(FlowyError):
    """Someone else got to the thread first: a save from a stale revision
    (``ConcurrencyConflictError``), a run of it already in this process
    (``ThreadAlreadyRunningError``) or another worker's live lease
    (``ThreadLeaseBusyError``). Reload (``Runner.evaluate_resume``) and decide again."""


class ConcurrencyConflictError(ThreadContentionError):
    """Strict optimistic concurrency: the expected revision is not the stored one.

    Raised by ``Checkpointer.save`` when ``expected_revision`` differs from the stored
    revision, and by ``Runner.resume`` when the token's revision is stale or zero. Call
    ``Runner.evaluate_resume(token)`` to get the current core-issued token.

    Args:
        message: the error message.
        thread_id: the thread (kept as an attribute, like the revisions).
        expected: the revision the caller expected.
        actual: the revision stored (0: the thread has none).
    """

    def __init__(
        self, message: str, *, thread_id: str = "", expected: int = 0, actual: int = 0
    ) -> None:
        super().__init__(message)
        self.thread_id = thread_id
        self.expected = expected
        self.actual = actual


class ThreadAlreadyRunningError(ThreadContentionError):
    """A start or resume targets a thread that is already running in this process."""


class ScheduleError(FlowyError):
    """A schedule that does not exist was named, or one of that name exists already."""


class NoActiveExecutionError(FlowyError):
    """``request_local_handoff()`` was called after the run had terminated (or was stopped)."""


class CheckpointSkippedError(FlowyError):
    """``CheckpointPolicy.SKIP_ON_SAVE_ERROR`` skipped a terminal save: nothing was persisted."""


class MissingBindingError(FlowyError, LookupError):
    """``binding(key)`` was called but no value is bound for ``key`` in this run."""


class NoRunContextError(FlowyError, RuntimeError):
    """A run-context helper was called outside a run and outside ``context_with_run_metadata``."""


class LeaseError(FlowyError):
    """Base class of lease errors."""


class LeaseRequiredError(LeaseError):
    """A lease manager is configured, so start/resume/stream need ``run_lease=(owner, ttl)``."""


class ThreadLeaseBusyError(LeaseError, ThreadContentionError):
    """Another live lease holds the thread."""


class LeaseLostError(LeaseError):
    """The lease expired or was taken over; a fenced write was refused."""


class ActivityError(FlowyError):
    """``flowy.activity()`` could not give the call's result.

    Args:
        message: the error message.
        key: the call's key in the thread's journal (kept as an attribute).
        attempts: the attempts the call had (kept as an attribute).
    """

    def __init__(self, message: str, *, key: str, attempts: int) -> None:
        super().__init__(message)
        self.key = key
        self.attempts = attempts


class ActivityOutcomeUnknownError(ActivityError):
    """The activity was called before a crash and its outcome was never recorded: it
    may or may not have happened. flowy never calls it again on its own (unless it is
    declared ``idempotent``); give ``reconcile=`` to look the outcome up, or handle
    this in the node.

    Args:
        message: the error message.
        key: the call's key in the journal.
        attempts: the attempts started.
        started_at: when the first attempt began, in seconds since the epoch.
    """

    def __init__(self, message: str, *, key: str, attempts: int, started_at: float) -> None:
        super().__init__(message, key=key, attempts=attempts)
        self.started_at = started_at


class ActivityFailedError(ActivityError):
    """The activity raised on its last allowed attempt (or its retry deadline passed). A
    re-execution of the node raises it again without calling the activity.

    Args:
        message: the error message.
        key: the call's key in the journal.
        attempts: the attempts it had.
        error: ``"Type: message"`` of the last failure, as the journal keeps it.
    """

    def __init__(self, message: str, *, key: str, attempts: int, error: str) -> None:
        super().__init__(message, key=key, attempts=attempts)
        self.error = error


class HandoffError(FlowyError):
    """Base class of hand-off errors."""


class HandoffPendingError(HandoffError):
    """The hand-off is pending and not yet stale; recovery must wait (or it is in flight)."""


class HandoffOrphanedError(HandoffError):
    """The hand-off is orphaned; use ``Runner.recover_stale_handoff`` instead of resume."""


class HandoffAlreadyEnqueuedError(HandoffError):
    """The hand-off is already enqueued; pass ``force_reenqueue=True`` to enqueue again."""


class HandoffNotRecoverableError(HandoffError):
    """The thread has no recoverable hand-off (status none or unknown)."""


class HandoffPatchFailedError(HandoffError):
    """A hand-off status patch (enqueued/orphaned) could not be saved."""


class HandoffEnqueueFailedError(HandoffError):
    """The hand-off intent could not be enqueued after the snapshot was persisted.

    ``resume_token`` is the token to retry with (``Runner.recover_stale_handoff`` or a
    manual enqueue); the snapshot is safe in the checkpointer. ``orphaned`` tells whether
    the compensating patch saved the snapshot as orphaned (else it stays enqueued).
    Raised by ``Runner.recover_stale_handoff``, ``result`` is the recovery's result.
    When pruning the history failed as well, ``retention_error`` holds that error (the
    run's reason stays ``handoff_orphaned``).

    Args:
        message: the error message.
        resume_token: the token to retry with, or ``None``.
        orphaned: whether the snapshot was saved as orphaned.
    """

    def __init__(
        self, message: str, *, resume_token: ResumeToken | None = None, orphaned: bool = False
    ) -> None:
        super().__init__(message)
        self.resume_token = resume_token
        self.orphaned = orphaned
        self.result: HandoffRecoveryResult | None = None
        self.retention_error: BaseException | None = None


class StorageError(FlowyError):
    """A storage backend failed."""


class StorageUnavailableError(StorageError):
    """The backend could not be reached or the connection broke; the outcome may be unknown.

    The runner resolves an unknown save outcome by reloading the thread and checking the
    stored write id, so a write that landed is never reported as a conflict.
    """


class SnapshotEnvelopeInvalidError(StorageError):
    """A stored record is corrupt, of an unknown format, or does not match its address."""


class SnapshotTooLargeError(StorageError):
    """The encoded snapshot exceeds the backend's item size limit; nothing was written.

    Args:
        message: the error message.
        size: the encoded record's size, in bytes (kept as an attribute).
        limit: the backend's limit, in bytes (kept as an attribute).
    """

    def __init__(self, message: str, *, size: int = 0, limit: int = 0) -> None:
        super().__init__(message)
        self.size = size
        self.limit = limit


class SchemaVersionError(StorageError):
    """The store's schema version is not the one this code knows; upgrade it with ``setup()``."""


class SQLiteFileError(StorageError):
    """The file is not a flowy SQLite database, is damaged, or cannot be opened or
    written; ``path`` names it.

    Args:
        message: the error message.
        path: the database file (kept as an attribute).
    """

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message)
        self.path = path


def _present_as_public() -> None:
    """Tracebacks and reprs name every error by its public home, ``flowy.errors``."""
    for name in __all__:
        globals()[name].__module__ = "flowy.errors"


_present_as_public()
del _present_as_public
