"""flowy: durable, controlled agentic state machines.

Declare a graph of async nodes over your own state ``S`` and effect ``E`` with
``GraphBuilder``, open a store with ``connect(url)``, run the graph with ``Runner``, and
resume it exactly where it stopped; ``Worker`` finishes handed-off runs in the
background and wakes runs that ``sleep`` or ``wait_for`` a signal. ``activity`` calls
the outside world once per thread, recorded in the store. ``@invariant`` declares a
property of the state that ``flowy.testing.check`` verifies under crashes and faults.

The rest of the public API lives in a few modules: ``flowy.errors`` (the whole exception
tree), ``flowy.types`` (secondary types), ``flowy.lifecycle`` (observers and counters),
``flowy.storage`` (the store protocols and values; ``flowy.storage.dialect`` for store
authors), ``flowy.memory`` and ``flowy.sqlite`` (the stores in core),
``flowy.stream_helpers`` (the stream helpers as free functions), ``flowy.live``
(progress from inside a node, ``Backend.watch``'s events), ``flowy.patterns``,
``flowy.otel`` (OpenTelemetry, with the ``otel`` extra) and ``flowy.testing``.
"""

from __future__ import annotations

import importlib as _importlib
import warnings as _warnings
from typing import Any as _Any

from . import errors as errors  # the public modules, one attribute away
from . import lifecycle as lifecycle
from . import live as live
from . import stream_helpers as stream_helpers
from . import types as types
from ._activities import activity as activity
from ._context import BindingKey as BindingKey
from ._context import RunBindings as RunBindings
from ._context import RunMetadataInput as RunMetadataInput
from ._context import bind as bind
from ._context import binding as binding
from ._context import budget_used as budget_used
from ._context import context_with_run_metadata as context_with_run_metadata
from ._context import run_metadata as run_metadata
from ._context import use_budget as use_budget
from ._directives import Directive as Directive
from ._directives import NoEffect as NoEffect
from ._directives import completed as completed
from ._directives import effect as effect
from ._directives import end as end
from ._directives import fail as fail
from ._directives import fan_out as fan_out
from ._directives import handoff as handoff
from ._directives import retry as retry
from ._directives import sleep as sleep
from ._directives import sleep_until as sleep_until
from ._directives import suspend as suspend
from ._directives import wait_for as wait_for
from ._errors import BackendURLError as BackendURLError
from ._errors import ConcurrencyConflictError as ConcurrencyConflictError
from ._errors import FlowyError as FlowyError
from ._errors import GraphValidationError as GraphValidationError
from ._errors import HandoffEnqueueFailedError as HandoffEnqueueFailedError
from ._errors import InvalidResumeTokenError as InvalidResumeTokenError
from ._errors import LeaseError as LeaseError
from ._errors import LeaseLostError as LeaseLostError
from ._errors import StorageError as StorageError
from ._errors import StorageUnavailableError as StorageUnavailableError
from ._errors import ThreadAlreadyRunningError as ThreadAlreadyRunningError
from ._errors import ThreadCompletedError as ThreadCompletedError
from ._errors import ThreadContentionError as ThreadContentionError
from ._errors import ThreadLeaseBusyError as ThreadLeaseBusyError
from ._errors import ThreadNotFoundError as ThreadNotFoundError
from ._errors import UnknownNodeError as UnknownNodeError
from ._events import EventType as EventType
from ._events import RunEvent as RunEvent
from ._events import StreamHandle as StreamHandle
from ._graph import CheckpointPolicy as CheckpointPolicy
from ._graph import Graph as Graph
from ._graph import GraphBuilder as GraphBuilder
from ._invariants import invariant as invariant
from ._moved import present_as_public as _present_as_public
from ._plan import resume_current as resume_current
from ._plan import resume_to as resume_to
from ._results import HandoffRecoveryResult as HandoffRecoveryResult
from ._results import Reason as Reason
from ._results import ResumeDecision as ResumeDecision
from ._results import ResumeDecisionKind as ResumeDecisionKind
from ._results import RunResult as RunResult
from ._runner import Runner as Runner
from ._types import HandoffStatus as HandoffStatus
from ._types import ResumeToken as ResumeToken
from ._types import RunStatus as RunStatus
from ._version import __version__ as __version__
from ._worker import Worker as Worker
from .storage import Backend as Backend
from .storage import connect as connect

__all__ = [
    "Backend",
    "BackendURLError",
    "BindingKey",
    "CheckpointPolicy",
    "ConcurrencyConflictError",
    "Directive",
    "EventType",
    "FlowyError",
    "Graph",
    "GraphBuilder",
    "GraphValidationError",
    "HandoffEnqueueFailedError",
    "HandoffRecoveryResult",
    "HandoffStatus",
    "InvalidResumeTokenError",
    "LeaseError",
    "LeaseLostError",
    "NoEffect",
    "Reason",
    "ResumeDecision",
    "ResumeDecisionKind",
    "ResumeToken",
    "RunBindings",
    "RunEvent",
    "RunMetadataInput",
    "RunResult",
    "RunStatus",
    "Runner",
    "StorageError",
    "StorageUnavailableError",
    "StreamHandle",
    "ThreadAlreadyRunningError",
    "ThreadCompletedError",
    "ThreadContentionError",
    "ThreadLeaseBusyError",
    "ThreadNotFoundError",
    "UnknownNodeError",
    "Worker",
    "activity",
    "bind",
    "binding",
    "budget_used",
    "completed",
    "connect",
    "context_with_run_metadata",
    "effect",
    "end",
    "fail",
    "fan_out",
    "handoff",
    "invariant",
    "resume_current",
    "resume_to",
    "retry",
    "run_metadata",
    "sleep",
    "sleep_until",
    "suspend",
    "use_budget",
    "wait_for",
]

# Names flowy 0.1 exported here, and where they live now. Importing one still works
# (with a DeprecationWarning) until 0.3.
_MOVED = {
    "Checkpointer": "flowy.storage",
    "HandoffIntent": "flowy.storage",
    "HandoffOutbox": "flowy.storage",
    "Lease": "flowy.storage",
    "LeaseManager": "flowy.storage",
    "OutboxConsumer": "flowy.storage",
    "OutboxMessage": "flowy.storage",
    "Snapshot": "flowy.storage",
    "ThreadSummary": "flowy.storage",
    "TransactionalCheckpointer": "flowy.storage",
    "TransactionalHandoffOutbox": "flowy.storage",
    "JSONCodec": "flowy.storage",
    "MsgspecCodec": "flowy.storage",
    "LeaseGuardCheckpointer": "flowy.storage",
    "MemoryCheckpointer": "flowy.memory",
    "MemoryLeaseManager": "flowy.memory",
    "MemoryOutbox": "flowy.memory",
    "SQLiteBackend": "flowy.sqlite",
    "SQLiteCheckpointer": "flowy.sqlite",
    "SQLiteLeaseManager": "flowy.sqlite",
    "SQLiteOutbox": "flowy.sqlite",
    "CheckpointSkippedError": "flowy.errors",
    "HandoffAlreadyEnqueuedError": "flowy.errors",
    "HandoffNotRecoverableError": "flowy.errors",
    "HandoffOrphanedError": "flowy.errors",
    "HandoffPatchFailedError": "flowy.errors",
    "HandoffPendingError": "flowy.errors",
    "InvalidResumePlanError": "flowy.errors",
    "InvalidThreadIdError": "flowy.errors",
    "LeaseRequiredError": "flowy.errors",
    "MissingBindingError": "flowy.errors",
    "NoActiveExecutionError": "flowy.errors",
    "NoRunContextError": "flowy.errors",
    "SchemaVersionError": "flowy.errors",
    "SnapshotEnvelopeInvalidError": "flowy.errors",
    "SnapshotTooLargeError": "flowy.errors",
    "SQLiteFileError": "flowy.errors",
    "DirectiveKind": "flowy.types",
    "Node": "flowy.types",
    "ResumePlan": "flowy.types",
    "RunMetadata": "flowy.types",
    "Outcome": "flowy.types",
    "StreamCollectResult": "flowy.types",
    "HandoffMetricStatus": "flowy.lifecycle",
    "LifecycleEvent": "flowy.lifecycle",
    "LifecycleEventType": "flowy.lifecycle",
    "LifecycleObserver": "flowy.lifecycle",
    "metrics": "flowy.lifecycle",
    "reset_metrics": "flowy.lifecycle",
    "set_lifecycle_observer": "flowy.lifecycle",
    "DEFAULT_HANDOFF_STALE_AFTER": "flowy.types",
    "StreamCollector": "flowy.stream_helpers",
    "await_stream_collect": "flowy.stream_helpers",
    "await_stream_collect_with_snapshot": "flowy.stream_helpers",
    "begin_stream_collect": "flowy.stream_helpers",
    "collect_events_and_wait": "flowy.stream_helpers",
    "consume_events_and_wait": "flowy.stream_helpers",
}

# Names moved out of here after 0.2 (``flowy.__all__`` stays at 60 names or fewer).
# Importing one still works (with a DeprecationWarning) until 0.4.
_MOVED_AFTER_0_2 = {
    "HandoffError": "flowy.errors",
}


# Names of _MOVED that were renamed in their new home since.
_RENAMED_SINCE = {
    "HandoffOutbox": "Outbox",
    "TransactionalHandoffOutbox": "TransactionalOutbox",
}


def __getattr__(name: str) -> _Any:
    """Resolve a name flowy exported here before, with a DeprecationWarning."""
    module, until = _MOVED.get(name), "0.3"
    if module is None:
        module, until = _MOVED_AFTER_0_2.get(name), "0.4"
    if module is None:
        raise AttributeError(f"module 'flowy' has no attribute {name!r}")
    new = _RENAMED_SINCE.get(name, name)
    _warnings.warn(
        f"flowy.{name} moved to {module}.{new}; the old name goes away in flowy {until}",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(_importlib.import_module(module), new)


# Tracebacks and reprs say flowy.X instead of flowy._module.X.
_present_as_public("flowy", globals(), __all__, "flowy._")
