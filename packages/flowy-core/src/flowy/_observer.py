"""Lifecycle observer and hand-off metrics.

``set_lifecycle_observer`` installs one process-wide observer that receives hand-off,
recovery and soft-checkpoint events. Events are delivered from a background thread
through a bounded queue, so an observer that raises or is slow never breaks or stalls a
run (when the queue is full, events are dropped and counted).
"""

from __future__ import annotations

import enum
import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from ._types import JSON

__all__ = [
    "HandoffMetricStatus",
    "LifecycleEvent",
    "LifecycleEventType",
    "LifecycleObserver",
    "metrics",
    "reset_metrics",
    "set_lifecycle_observer",
]

logger = logging.getLogger("flowy")


class LifecycleEventType(enum.StrEnum):
    """Kinds of lifecycle events."""

    HANDOFF_ENQUEUED = "handoff_enqueued"
    HANDOFF_ENQUEUE_FAILED = "handoff_enqueue_failed"
    HANDOFF_RECOVERED = "handoff_recovered"
    HANDOFF_RECOVERY_FAILED = "handoff_recovery_failed"
    CHECKPOINT_SKIPPED = "checkpoint_skipped"
    RETENTION_FAILED = "retention_failed"
    RESUME_CONFLICT = "resume_conflict"


class HandoffMetricStatus(enum.StrEnum):
    """Label values of ``handoff_enqueued_total{status}``."""

    SUCCESS = "success"
    ENQUEUE_FAILED = "enqueue_failed"
    PATCH_ENQUEUED_FAILED = "patch_enqueued_failed"
    PATCH_ORPHAN_FAILED = "patch_orphan_failed"
    SAVE_FAILED = "save_failed"
    COMMIT_FAILED = "commit_failed"


@dataclass(frozen=True, slots=True)
class LifecycleEvent:
    """One lifecycle event."""

    type: LifecycleEventType
    thread_id: str
    revision: int = 0
    reason: str = ""
    status: str = ""
    error: str = ""
    at: float = field(default_factory=time.time)
    details: Mapping[str, JSON] = field(default_factory=lambda: {})


@runtime_checkable
class LifecycleObserver(Protocol):
    """Receives lifecycle events (on a background thread)."""

    def on_event(self, event: LifecycleEvent) -> None:
        """Handle one event. Exceptions are logged and ignored."""
        ...


class _Dispatcher:
    def __init__(self) -> None:
        self.observer: LifecycleObserver | None = None
        self.queue: queue.Queue[LifecycleEvent] = queue.Queue(maxsize=10_000)
        self.dropped = 0
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _run(self) -> None:
        while True:
            event = self.queue.get()
            obs = self.observer
            if obs is not None:
                try:
                    obs.on_event(event)
                except Exception:
                    logger.exception("flowy lifecycle observer raised on %s", event.type)
            self.queue.task_done()

    def publish(self, event: LifecycleEvent) -> None:
        if self.observer is None:
            return
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name="flowy-lifecycle-observer", daemon=True
                    )
                    self._thread.start()
        try:
            self.queue.put_nowait(event)
        except queue.Full:
            self.dropped += 1

    def flush(self, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        while self.queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.005)
        return not self.queue.unfinished_tasks


_dispatcher = _Dispatcher()
_handoff_counts: Counter[str] = Counter()


def set_lifecycle_observer(observer: LifecycleObserver | None) -> None:
    """Install (or with ``None`` remove) the process-wide lifecycle observer."""
    _dispatcher.observer = observer


def publish(event: LifecycleEvent) -> None:
    """Deliver ``event`` to the observer without blocking the caller."""
    _dispatcher.publish(event)


def flush_observer(timeout: float = 5.0) -> bool:
    """Wait until queued events were delivered (for tests); False on timeout."""
    return _dispatcher.flush(timeout)


def count_handoff(status: HandoffMetricStatus) -> None:
    """Increment ``handoff_enqueued_total{status}``."""
    _handoff_counts[status.value] += 1


def metrics() -> dict[str, dict[str, int]]:
    """A snapshot of flowy's counters: ``{"handoff_enqueued_total": {status: n}}`` with
    every status present, plus ``observer_events_dropped``."""
    return {
        "handoff_enqueued_total": {s.value: _handoff_counts[s.value] for s in HandoffMetricStatus},
        "observer_events_dropped": {"total": _dispatcher.dropped},
    }


def reset_metrics() -> None:
    """Zero every counter (for tests)."""
    _handoff_counts.clear()
    _dispatcher.dropped = 0
