"""Secondary public types: what annotations and advanced calls name.

The everyday names are in ``flowy`` itself; these are the rest, one import away.
"""

from __future__ import annotations

from ._activities import ActivityRetry as ActivityRetry
from ._context import RunMetadata as RunMetadata
from ._directives import DirectiveKind as DirectiveKind
from ._events import InterruptKind as InterruptKind
from ._events import StreamCollectResult as StreamCollectResult
from ._events import StreamStart as StreamStart
from ._graph import Node as Node
from ._graph import Reducer as Reducer
from ._graph import Router as Router
from ._graph import SignalHandler as SignalHandler
from ._plan import ResumePlan as ResumePlan
from ._plan import ResumeTargetPolicy as ResumeTargetPolicy
from ._preflight import StateMerge as StateMerge
from ._runner import DEFAULT_HANDOFF_STALE_AFTER as DEFAULT_HANDOFF_STALE_AFTER
from ._runner import DEFAULT_LEASE_TTL as DEFAULT_LEASE_TTL
from ._segment import InvariantValidator as InvariantValidator
from ._types import JSON as JSON
from ._worker import Failure as Failure
from ._worker import Outcome as Outcome
from ._worker import WorkerOptions as WorkerOptions
from ._worker import WorkerStats as WorkerStats

__all__ = [
    "DEFAULT_HANDOFF_STALE_AFTER",
    "DEFAULT_LEASE_TTL",
    "JSON",
    "ActivityRetry",
    "DirectiveKind",
    "Failure",
    "InterruptKind",
    "InvariantValidator",
    "Node",
    "Outcome",
    "Reducer",
    "ResumePlan",
    "ResumeTargetPolicy",
    "Router",
    "RunMetadata",
    "SignalHandler",
    "StateMerge",
    "StreamCollectResult",
    "StreamStart",
    "WorkerOptions",
    "WorkerStats",
]
