"""Lifecycle observers and counters.

A runner's own observer is ``Runner(observer=...)`` and its counters
``runner.metrics()``; this module holds the process-wide ones every runner also feeds.
"""

from __future__ import annotations

from ._observer import HandoffMetricStatus as HandoffMetricStatus
from ._observer import LifecycleEvent as LifecycleEvent
from ._observer import LifecycleEventType as LifecycleEventType
from ._observer import LifecycleObserver as LifecycleObserver
from ._observer import flush_observers as flush_observers
from ._observer import metrics as metrics
from ._observer import reset_metrics as reset_metrics
from ._observer import set_lifecycle_observer as set_lifecycle_observer

__all__ = [
    "HandoffMetricStatus",
    "LifecycleEvent",
    "LifecycleEventType",
    "LifecycleObserver",
    "flush_observers",
    "metrics",
    "reset_metrics",
    "set_lifecycle_observer",
]
