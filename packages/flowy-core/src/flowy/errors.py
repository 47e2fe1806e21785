"""The whole flowy exception tree (the errors applications catch most are also
importable from ``flowy`` itself: the same classes)."""

from __future__ import annotations

import warnings as _warnings
from typing import Any as _Any

from . import _errors  # pyright: ignore[reportPrivateUsage] - the public face of it
from ._errors import ActivityError as ActivityError
from ._errors import ActivityFailedError as ActivityFailedError
from ._errors import ActivityOutcomeUnknownError as ActivityOutcomeUnknownError
from ._errors import BackendURLError as BackendURLError
from ._errors import CheckpointSkippedError as CheckpointSkippedError
from ._errors import ConcurrencyConflictError as ConcurrencyConflictError
from ._errors import FlowyError as FlowyError
from ._errors import GraphValidationError as GraphValidationError
from ._errors import GraphVersionMismatchError as GraphVersionMismatchError
from ._errors import HandoffAlreadyEnqueuedError as HandoffAlreadyEnqueuedError
from ._errors import HandoffEnqueueFailedError as HandoffEnqueueFailedError
from ._errors import HandoffError as HandoffError
from ._errors import HandoffNotRecoverableError as HandoffNotRecoverableError
from ._errors import HandoffOrphanedError as HandoffOrphanedError
from ._errors import HandoffPatchFailedError as HandoffPatchFailedError
from ._errors import HandoffPendingError as HandoffPendingError
from ._errors import InvalidResumePlanError as InvalidResumePlanError
from ._errors import InvalidResumeTokenError as InvalidResumeTokenError
from ._errors import InvalidThreadIdError as InvalidThreadIdError
from ._errors import LeaseError as LeaseError
from ._errors import LeaseLostError as LeaseLostError
from ._errors import LeaseRequiredError as LeaseRequiredError
from ._errors import LimitError as LimitError
from ._errors import MissingBindingError as MissingBindingError
from ._errors import NoActiveExecutionError as NoActiveExecutionError
from ._errors import NoRunContextError as NoRunContextError
from ._errors import ScheduleError as ScheduleError
from ._errors import SchemaVersionError as SchemaVersionError
from ._errors import SnapshotEnvelopeInvalidError as SnapshotEnvelopeInvalidError
from ._errors import SnapshotTooLargeError as SnapshotTooLargeError
from ._errors import SQLiteFileError as SQLiteFileError
from ._errors import StorageError as StorageError
from ._errors import StorageUnavailableError as StorageUnavailableError
from ._errors import ThreadAlreadyRunningError as ThreadAlreadyRunningError
from ._errors import ThreadCompletedError as ThreadCompletedError
from ._errors import ThreadContentionError as ThreadContentionError
from ._errors import ThreadFinishedError as ThreadFinishedError
from ._errors import ThreadLeaseBusyError as ThreadLeaseBusyError
from ._errors import ThreadNotFoundError as ThreadNotFoundError
from ._errors import UnknownNodeError as UnknownNodeError

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
    "SQLiteFileError",
    "ScheduleError",
    "SchemaVersionError",
    "SnapshotEnvelopeInvalidError",
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

__doc__ = _errors.__doc__

# Names renamed after 0.2 (errors end in ``Error``): the old name still resolves, with a
# DeprecationWarning, until 0.4.
_RENAMED = {"ActivityOutcomeUnknown": "ActivityOutcomeUnknownError"}


def __getattr__(name: str) -> _Any:
    """Resolve an error's old name, with a DeprecationWarning."""
    new = _RENAMED.get(name)
    if new is None:
        raise AttributeError(f"module 'flowy.errors' has no attribute {name!r}")
    _warnings.warn(
        f"flowy.errors.{name} is renamed flowy.errors.{new}; the old name goes away in flowy 0.4",
        DeprecationWarning,
        stacklevel=2,
    )
    return globals()[new]
