"""Lifecycle observers and counters, per runner and process-wide.

Every ``Runner`` has a :class:`Telemetry`: its own observer (``Runner(observer=...)``)
and counters (``runner.metrics()``), forwarding each event and count to the process-wide
telemetry (``set_lifecycle_observer``, ``metrics()``). Events reach observers from one
background thread through a bounded queue, so an observer that raises or is slow never
breaks or stalls a run (when the queue is full, events are dropped and counted).
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

from . import _tracing
from ._types import JSON

__all__ = [
    "GLOBAL",
    "HandoffMetricStatus",
    "LifecycleEvent",
    "LifecycleEventType",
    "LifecycleObserver",
    "Telemetry",
    "flush_observers",
    "metrics",
    "reset_metrics",
    "set_lifecycle_observer",
]

logger = logging.getLogger("flowy")


class LifecycleEventType(enum.StrEnum):
    """Kinds of lifecycle events."""

    HANDOFF_ENQUEUED = "handoff_enqueued"
    """A hand-off's intent is in the outbox."""
    HANDOFF_ENQUEUE_FAILED = "handoff_enqueue_failed"
    """Enqueueing a hand-off's intent failed (the snapshot is patched orphaned)."""
    HANDOFF_PATCH_FAILED = "handoff_patch_failed"
    """Saving a hand-off status patch (enqueued or orphaned) failed."""
    HANDOFF_SAVE_FAILED = "handoff_save_failed"
    """The hand-off save (pending, or the transactional commit) failed."""
    HANDOFF_RECOVERED = "handoff_recovered"
    """``Runner.recover_stale_handoff`` enqueued a hand-off again."""
    HANDOFF_RECOVERY_FAILED = "handoff_recovery_failed"
    """``Runner.recover_stale_handoff`` could not enqueue it."""
    CHECKPOINT_SKIPPED = "checkpoint_skipped"
    """``SKIP_ON_SAVE_ERROR`` skipped a failed save and the run went on."""
    CHECKPOINT_FAILED = "checkpoint_failed"
    """A save failed: the run failed, or its stop/cancel snapshot was not saved."""
    RETENTION_FAILED = "retention_failed"
    """Pruning a thread's history (``retention_limit``) failed; the run is not failed."""
    RESUME_CONFLICT = "resume_conflict"
    """A resume's token was stale (``details["token_revision"]``)."""
    LEASE_LOST = "lease_lost"
    """A run lost its lease and stopped without saving."""
    NO_PROGRESS = "no_progress"
    """A segment handed off where it started, with the state it started with."""
    STEP_LIMIT_EXCEEDED = "step_limit_exceeded"
    """A thread reached the graph's ``max_total_steps``."""


class HandoffMetricStatus(enum.StrEnum):
    """Label values of ``handoff_enqueued_total{status}``."""

    SUCCESS = "success"
    """The intent was enqueued."""
    ENQUEUE_FAILED = "enqueue_failed"
    """Enqueueing the intent failed."""
    PATCH_ENQUEUED_FAILED = "patch_enqueued_failed"
    """Saving the pending snapshot as enqueued failed (it stays pending)."""
    PATCH_ORPHAN_FAILED = "patch_orphan_failed"
    """After an enqueue failure, saving the snapshot as orphaned failed too."""
    SAVE_FAILED = "save_failed"
    """Saving the pending snapshot failed."""
    COMMIT_FAILED = "commit_failed"
    """The transactional ``save_with_outbox`` did not commit."""


@dataclass(frozen=True, slots=True)
class LifecycleEvent:
    """One lifecycle event. ``status`` is the metric label it was counted under, if any."""

    type: LifecycleEventType
    """What happened."""
    thread_id: str
    """The thread it happened to."""
    revision: int = 0
    """The thread's revision it concerns (for a run, the last one it saved)."""
    reason: str = ""
    """Context, when there is one: the run's reason, the kind of save, or the node
    (``no_progress``, ``step_limit_exceeded``)."""
    status: str = ""
    error: str = ""
    """The error behind the event, as text (empty if none)."""
    at: float = field(default_factory=time.time)
    """When the event was created, in seconds since the epoch."""
    details: Mapping[str, JSON] = field(default_factory=lambda: {})
    """Extra facts of some events (``token_revision`` of ``resume_conflict``)."""


@runtime_checkable
class LifecycleObserver(Protocol):
    """Receives lifecycle events (on a background thread)."""

    def on_event(self, event: LifecycleEvent) -> None:
        """Handle ``event``. Exceptions are logged and ignored."""
        ...


class _Dispatcher:
    """The one background thread that delivers events to observers."""

    def __init__(self) -> None:
        self.queue: queue.Queue[tuple[LifecycleObserver, LifecycleEvent]] = queue.Queue(
            maxsize=10_000
        )
        self.dropped = 0
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _run(self) -> None:
        while True:
            observer, event = self.queue.get()
            try:
                observer.on_event(event)
            except Exception:
                logger.exception("flowy lifecycle observer raised on %s", event.type)
            self.queue.task_done()

    def deliver(self, observer: LifecycleObserver, event: LifecycleEvent) -> bool:
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name="flowy-lifecycle-observer", daemon=True
                    )
                    self._thread.start()
        try:
            self.queue.put_nowait((observer, event))
        except queue.Full:
            self.dropped += 1
            return False
        return True

    def flush(self, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        while self.queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.005)
        return not self.queue.unfinished_tasks


_dispatcher = _Dispatcher()


class Telemetry:
    """An observer and counters; events and counts also go to ``parent``."""

    def __init__(
        self, observer: LifecycleObserver | None = None, parent: Telemetry | None = None
    ) -> None:
        self.observer = observer
        self.parent = parent
        self.handoffs: Counter[str] = Counter()
        self.events: Counter[str] = Counter()
        self.dropped: int = 0

    def publish(self, event: LifecycleEvent) -> None:
        """Count ``event`` and deliver it to the observers without blocking."""
        self.events[event.type.value] += 1
        if self.observer is not None and not _dispatcher.deliver(self.observer, event):
            self.dropped += 1
        if self.parent is not None:
            self.parent.publish(event)

    def count_handoff(self, status: HandoffMetricStatus) -> None:
        """Increment ``handoff_enqueued_total{status}``."""
        self.handoffs[status.value] += 1
        if self.parent is not None:
            self.parent.count_handoff(status)
        elif (tracing := _tracing.active()) is not None:  # once, at the process-wide root
            tracing.handoff("", status.value)

    def metrics(self) -> dict[str, dict[str, int]]:
        """``{"handoff_enqueued_total": {status: n}, "lifecycle_events_total": {type: n},
        "observer_events_dropped": {"total": n}}`` with every label present."""
        return {
            "handoff_enqueued_total": {
                s.value: self.handoffs[s.value] for s in HandoffMetricStatus
            },
            "lifecycle_events_total": {t.value: self.events[t.value] for t in LifecycleEventType},
            "observer_events_dropped": {"total": self.dropped},
        }

    def reset(self) -> None:
        """Zero every counter."""
        self.handoffs.clear()
        self.events.clear()
        self.dropped = 0


GLOBAL = Telemetry()
"""The process-wide telemetry every runner forwards to."""


def set_lifecycle_observer(observer: LifecycleObserver | None) -> None:
    """Install ``observer`` as the process-wide lifecycle observer (``None`` removes it)."""
    GLOBAL.observer = observer


def metrics() -> dict[str, dict[str, int]]:
    """The process-wide counters (every runner's together); see ``Telemetry.metrics``."""
    return GLOBAL.metrics()


def reset_metrics() -> None:
    """Zero the process-wide counters (for tests)."""
    GLOBAL.reset()


def flush_observers(timeout: float = 5.0) -> bool:
    """Wait up to ``timeout`` seconds until queued events were delivered (for tests);
    False on timeout."""
    return _dispatcher.flush(timeout)
