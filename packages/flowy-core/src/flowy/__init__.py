"""flowy: durable, controlled agentic state machines.

Declare a graph of async nodes over your own state ``S`` and effect ``E`` with
``GraphBuilder``, run it with ``Runner`` against a checkpointer, and resume it exactly
where it stopped. The storage-facing API (record envelope, codecs, protocols) is in
``flowy.checkpoint``; the conformance suite for backends in ``flowy.testing``.
"""

from __future__ import annotations

from ._checkpoint import Checkpointer as Checkpointer
from ._checkpoint import HandoffIntent as HandoffIntent
from ._checkpoint import HandoffOutbox as HandoffOutbox
from ._checkpoint import HandoffStatus as HandoffStatus
from ._checkpoint import Lease as Lease
from ._checkpoint import LeaseManager as LeaseManager
from ._checkpoint import OutboxConsumer as OutboxConsumer
from ._checkpoint import OutboxMessage as OutboxMessage
from ._checkpoint import ResumeToken as ResumeToken
from ._checkpoint import RunStatus as RunStatus
from ._checkpoint import Snapshot as Snapshot
from ._checkpoint import ThreadSummary as ThreadSummary
from ._checkpoint import TransactionalCheckpointer as TransactionalCheckpointer
from ._checkpoint import TransactionalHandoffOutbox as TransactionalHandoffOutbox
from ._codecs import JSONCodec as JSONCodec
from ._codecs import MsgspecCodec as MsgspecCodec
from ._context import BindingKey as BindingKey
from ._context import RunBindings as RunBindings
from ._context import RunMetadata as RunMetadata
from ._context import RunMetadataInput as RunMetadataInput
from ._context import bind as bind
from ._context import binding as binding
from ._context import budget_used as budget_used
from ._context import context_with_run_metadata as context_with_run_metadata
from ._context import run_metadata as run_metadata
from ._context import use_budget as use_budget
from ._directives import Directive as Directive
from ._directives import DirectiveKind as DirectiveKind
from ._directives import NoEffect as NoEffect
from ._directives import completed as completed
from ._directives import effect as effect
from ._directives import end as end
from ._directives import fail as fail
from ._directives import handoff as handoff
from ._directives import retry as retry
from ._directives import suspend as suspend
from ._errors import CheckpointSkippedError as CheckpointSkippedError
from ._errors import ConcurrencyConflictError as ConcurrencyConflictError
from ._errors import FlowyError as FlowyError
from ._errors import GraphValidationError as GraphValidationError
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
from ._errors import MissingBindingError as MissingBindingError
from ._errors import NoActiveExecutionError as NoActiveExecutionError
from ._errors import NoRunContextError as NoRunContextError
from ._errors import SchemaVersionError as SchemaVersionError
from ._errors import SnapshotEnvelopeInvalidError as SnapshotEnvelopeInvalidError
from ._errors import SnapshotTooLargeError as SnapshotTooLargeError
from ._errors import SQLiteFileError as SQLiteFileError
from ._errors import StorageError as StorageError
from ._errors import StorageUnavailableError as StorageUnavailableError
from ._errors import ThreadAlreadyRunningError as ThreadAlreadyRunningError
from ._errors import ThreadCompletedError as ThreadCompletedError
from ._errors import ThreadLeaseBusyError as ThreadLeaseBusyError
from ._errors import ThreadNotFoundError as ThreadNotFoundError
from ._errors import UnknownNodeError as UnknownNodeError
from ._events import EventType as EventType
from ._events import RunEvent as RunEvent
from ._events import StreamCollector as StreamCollector
from ._events import StreamCollectResult as StreamCollectResult
from ._events import StreamHandle as StreamHandle
from ._events import await_stream_collect as await_stream_collect
from ._events import await_stream_collect_with_snapshot as await_stream_collect_with_snapshot
from ._events import begin_stream_collect as begin_stream_collect
from ._events import collect_events_and_wait as collect_events_and_wait
from ._events import consume_events_and_wait as consume_events_and_wait
from ._graph import CheckpointPolicy as CheckpointPolicy
from ._graph import Graph as Graph
from ._graph import GraphBuilder as GraphBuilder
from ._graph import Node as Node
from ._guard import LeaseGuardCheckpointer as LeaseGuardCheckpointer
from ._memory import MemoryCheckpointer as MemoryCheckpointer
from ._memory import MemoryLeaseManager as MemoryLeaseManager
from ._memory import MemoryOutbox as MemoryOutbox
from ._observer import HandoffMetricStatus as HandoffMetricStatus
from ._observer import LifecycleEvent as LifecycleEvent
from ._observer import LifecycleEventType as LifecycleEventType
from ._observer import LifecycleObserver as LifecycleObserver
from ._observer import metrics as metrics
from ._observer import reset_metrics as reset_metrics
from ._observer import set_lifecycle_observer as set_lifecycle_observer
from ._plan import ResumePlan as ResumePlan
from ._plan import resume_current as resume_current
from ._plan import resume_to as resume_to
from ._results import HandoffRecoveryResult as HandoffRecoveryResult
from ._results import Reason as Reason
from ._results import ResumeDecision as ResumeDecision
from ._results import ResumeDecisionKind as ResumeDecisionKind
from ._results import RunResult as RunResult
from ._runner import DEFAULT_HANDOFF_STALE_AFTER as DEFAULT_HANDOFF_STALE_AFTER
from ._runner import Runner as Runner
from ._sqlite import SQLiteBackend as SQLiteBackend
from ._sqlite import SQLiteCheckpointer as SQLiteCheckpointer
from ._sqlite import SQLiteLeaseManager as SQLiteLeaseManager
from ._sqlite import SQLiteOutbox as SQLiteOutbox
from ._worker import Outcome as Outcome
from ._worker import Worker as Worker

__version__ = "0.1.0"

__all__ = [
    "BindingKey",
    "CheckpointPolicy",
    "CheckpointSkippedError",
    "Checkpointer",
    "ConcurrencyConflictError",
    "DEFAULT_HANDOFF_STALE_AFTER",
    "Directive",
    "DirectiveKind",
    "EventType",
    "FlowyError",
    "Graph",
    "GraphBuilder",
    "GraphValidationError",
    "HandoffAlreadyEnqueuedError",
    "HandoffEnqueueFailedError",
    "HandoffError",
    "HandoffIntent",
    "HandoffMetricStatus",
    "HandoffNotRecoverableError",
    "HandoffOrphanedError",
    "HandoffOutbox",
    "HandoffPatchFailedError",
    "HandoffPendingError",
    "HandoffRecoveryResult",
    "HandoffStatus",
    "InvalidResumePlanError",
    "InvalidResumeTokenError",
    "InvalidThreadIdError",
    "JSONCodec",
    "Lease",
    "LeaseError",
    "LeaseGuardCheckpointer",
    "LeaseLostError",
    "LeaseManager",
    "LeaseRequiredError",
    "LifecycleEvent",
    "LifecycleEventType",
    "LifecycleObserver",
    "MemoryCheckpointer",
    "MemoryLeaseManager",
    "MemoryOutbox",
    "MissingBindingError",
    "MsgspecCodec",
    "NoActiveExecutionError",
    "NoEffect",
    "NoRunContextError",
    "Node",
    "OutboxConsumer",
    "OutboxMessage",
    "Outcome",
    "Reason",
    "ResumeDecision",
    "ResumeDecisionKind",
    "ResumePlan",
    "ResumeToken",
    "RunBindings",
    "RunEvent",
    "RunMetadata",
    "RunMetadataInput",
    "RunResult",
    "RunStatus",
    "Runner",
    "SQLiteBackend",
    "SQLiteCheckpointer",
    "SQLiteFileError",
    "SQLiteLeaseManager",
    "SQLiteOutbox",
    "SchemaVersionError",
    "Snapshot",
    "SnapshotEnvelopeInvalidError",
    "SnapshotTooLargeError",
    "StorageError",
    "StorageUnavailableError",
    "StreamCollectResult",
    "StreamCollector",
    "StreamHandle",
    "ThreadAlreadyRunningError",
    "ThreadCompletedError",
    "ThreadLeaseBusyError",
    "ThreadNotFoundError",
    "ThreadSummary",
    "TransactionalCheckpointer",
    "TransactionalHandoffOutbox",
    "UnknownNodeError",
    "Worker",
    "await_stream_collect",
    "await_stream_collect_with_snapshot",
    "begin_stream_collect",
    "bind",
    "binding",
    "budget_used",
    "collect_events_and_wait",
    "completed",
    "consume_events_and_wait",
    "context_with_run_metadata",
    "effect",
    "end",
    "fail",
    "handoff",
    "metrics",
    "reset_metrics",
    "resume_current",
    "resume_to",
    "retry",
    "run_metadata",
    "set_lifecycle_observer",
    "suspend",
    "use_budget",
]


def _present_as_flowy() -> None:
    """Make tracebacks and reprs say ``flowy.X`` instead of ``flowy._module.X``."""
    for name in __all__:
        obj = globals()[name]
        if getattr(obj, "__module__", "").startswith("flowy._"):
            try:
                obj.__module__ = "flowy"
            except (AttributeError, TypeError):
                pass


_present_as_flowy()
