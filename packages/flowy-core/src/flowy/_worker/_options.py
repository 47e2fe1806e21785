"""What a worker is told and what it tells back: ``WorkerOptions``, the hooks it calls,
the outcome of a message, its counters.

Nothing here does I/O; every part of the worker reads the one frozen ``WorkerOptions``
value it was built with.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict, cast

from .._errors import SnapshotEnvelopeInvalidError, UnknownNodeError
from .._results import RunResult
from ..storage import HandoffIntent, OutboxMessage
from ..storage._model import DEFAULT_QUEUE, validate_queue_name

__all__ = [
    "PERMANENT_ERRORS",
    "RECOVERY_LEADER",
    "Failure",
    "FailureHook",
    "Outcome",
    "ResultHook",
    "ResumeOptions",
    "WorkerKeywords",
    "WorkerOptions",
    "WorkerStats",
]

RECOVERY_LEADER = "recovery-leader"
"""The system lease the recovery loop's leader election uses (a namespace no thread id
can reach: ``BaseLeaseManager.acquire_system``)."""

PERMANENT_ERRORS: tuple[type[Exception], ...] = (SnapshotEnvelopeInvalidError, UnknownNodeError)
"""Failures no later delivery can cure: the thread's stored record does not decode, or
it resumes at a node this graph does not have. A message that fails with one is
dead-lettered at once, with the reason. (A ``GraphVersionMismatchError`` is not one of
them: a worker of the thread's own version can run it, so a rolling deploy gives the
message back for that worker to take.)"""


class Outcome(enum.StrEnum):
    """What the worker did with one message."""

    RESUMED = "resumed"
    """The run was resumed and its terminal save happened; the message was acked."""
    DUPLICATE = "duplicate"
    """The segment had already run (stale token); acked without running anything."""
    RECOVERED = "recovered"
    """The hand-off was pending/orphaned and was re-enqueued; acked."""
    GONE = "gone"
    """The thread no longer exists; acked."""
    CANCELED = "canceled"
    """The thread was canceled or terminated from outside (``flowy.operations``); acked
    without running anything."""
    RETRY = "retry"
    """Released for another delivery after a backoff (lease busy, transient error, node
    error)."""
    DEAD_LETTERED = "dead_lettered"
    """Failed on its last allowed delivery, or with an error no delivery can cure
    (:data:`PERMANENT_ERRORS`): moved to the dead letters."""


@dataclass(frozen=True, slots=True)
class WorkerStats:
    """Counters of a worker since it was created."""

    outcomes: Mapping[str, int]
    """How many messages ended with each :class:`Outcome` (by its value)."""
    recovered: int
    """Hand-offs re-enqueued by recovery (scans and pending/orphaned messages)."""
    timers_fired: int = 0
    """Waiting runs this worker resumed because their wake-up time came."""


@dataclass(frozen=True, slots=True)
class Failure:
    """What ``on_failure`` gets: a message the worker could not finish.

    ``error`` is ``"Type: message"`` (what is stored on the message and shown by
    ``flowy dead-letters``); ``exception`` the exception itself when there was one;
    ``dead`` tells whether the message went to the dead letters (else it is retried
    after ``retry_in`` seconds).
    """

    message: OutboxMessage
    """The delivery that failed."""
    error: str
    exception: BaseException | None
    dead: bool
    retry_in: float


ResumeOptions = Callable[[HandoffIntent], Mapping[str, Any]]
ResultHook = Callable[[HandoffIntent, RunResult[Any, Any]], Any]
FailureHook = Callable[[Failure], Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerOptions:
    """How a ``flowy.Worker`` claims, resumes, retries, recovers and fires timers.

    One frozen value, checked when it is made: build it once and give it to every
    worker of a process (``Worker(runner, options=options)``); ``dataclasses.replace``
    makes a variant (another ``owner``, say).

    Raises:
        ValueError: an empty ``owner``, ``concurrency`` below 1, a negative
            ``busy_grace``, a ``schedule_interval`` that is not positive, retry delays
            or jitter out of range, or ``queues`` empty, repeating a name or naming a
            bad one.
        TypeError: ``queues`` is not a tuple or list of str.
    """

    owner: str | None = None
    """This worker's name in leases (``None``: ``host-pid``, unique per process)."""
    lease_ttl: float = 30.0
    """Seconds of the run lease each resumed run holds (renewed every third of it)."""
    concurrency: int = 4
    """The most runs in flight at once, across every queue it serves."""
    queues: tuple[str, ...] = (DEFAULT_QUEUE,)
    """The queues whose messages it claims, each in turn so none starves the others
    (a list is taken as a tuple). The messages of a queue no worker serves wait, and
    are kept. A store without queues has the default queue only."""
    visibility_timeout: float | None = None
    """Seconds a claimed message stays hidden from other consumers (``None``:
    4 × ``lease_ttl``)."""
    poll_interval: float = 1.0
    """Seconds each claim of ``Worker.run()`` waits for a message to arrive."""
    resume_options: ResumeOptions | None = None
    """``resume_options(intent)`` returns extra keyword arguments for ``Runner.resume``
    (bindings, overlay, …)."""
    recovery_interval: float | None = None
    """Seconds between scans that run ``recover_stale_handoff`` over pending and
    orphaned threads, only while this worker holds the leader lease (``None``: no
    scans)."""
    stale_after: float | None = None
    """Seconds after which a pending hand-off counts as stale in recovery (``None``: the
    runner's ``handoff_stale_after``)."""
    reenqueue_enqueued_after: float | None = None
    """Seconds (``None``: never) after which a scan also force-re-enqueues hand-offs
    that are still *enqueued*: the runbook's worst case (enqueue and orphan patch both
    failed) leaves such rows without a message. A duplicate message this may create is
    harmless: ``evaluate_resume`` drops it."""
    on_result: ResultHook | None = None
    """``on_result(intent, result)`` is called with the result of every run the worker
    resumes. An exception it raises is logged and ignored."""
    on_failure: FailureHook | None = None
    """``on_failure(failure)`` is called with a :class:`Failure` for every message the
    worker gives back or dead-letters. An exception it raises is logged and ignored."""
    retry_delay: float = 1.0
    """Seconds before the next delivery after a message's first failure; each further
    failure doubles it."""
    max_retry_delay: float = 300.0
    """The longest delay before a redelivery, in seconds."""
    retry_jitter: float = 0.25
    """The fraction of the delay (0 to 1) added at random, so failed messages do not
    come back all at once."""
    busy_grace: float = 1.0
    """Seconds a resume is tried again while another run holds the thread, before the
    message is given back."""
    timer_interval: float | None = 1.0
    """Seconds between looks at the store's due timers (``None``: the worker fires no
    timers). A timer whose resume fails is tried again after the same backoff as a
    message."""
    schedule_interval: float | None = 5.0
    """Seconds between looks at the store's durable schedules (``None``: the worker
    fires none; a store without schedules has none to fire). Each due tick is claimed
    by one worker of all that look, which starts its thread. Keep it well under a
    minute: ``catch_up="skip"`` drops a tick first seen more than 60 seconds late."""
    sample_interval: float | None = 15.0
    """Seconds between reads of the store's backlog (outbox depth, dead letters, the
    oldest suspended and waiting threads) for ``flowy.otel``'s gauges, made only while
    its instrumentation is in effect and the runner is built on a ``Backend`` (``None``:
    never). A failed read is logged."""

    def __post_init__(self) -> None:
        if self.owner is not None and not self.owner:
            raise ValueError("Worker needs a non-empty owner name")
        queues: Any = self.queues
        if isinstance(queues, list):
            queues = tuple(cast(list[object], queues))
            object.__setattr__(self, "queues", queues)
        if not isinstance(queues, tuple):
            raise TypeError(
                f"queues must be a tuple of queue names, got {type(queues).__name__} {queues!r:.80}"
            )
        names = cast(tuple[object, ...], queues)
        if not names:
            raise ValueError("queues must name at least one queue, e.g. ('default',)")
        for name in names:
            validate_queue_name(name)
        if len(set(names)) != len(names):
            raise ValueError(f"queues names a queue twice: {names!r:.200}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency!r}")
        if self.schedule_interval is not None and not self.schedule_interval > 0:
            raise ValueError(
                f"schedule_interval must be > 0 seconds or None, got {self.schedule_interval!r}"
            )
        if not self.busy_grace >= 0:
            raise ValueError(f"busy_grace must be >= 0 seconds, got {self.busy_grace!r}")
        delay, most, jitter = self.retry_delay, self.max_retry_delay, self.retry_jitter
        if not 0 <= delay <= most or not 0 <= jitter <= 1:
            raise ValueError(
                "need 0 <= retry_delay <= max_retry_delay and 0 <= retry_jitter <= 1, got "
                f"{delay!r}, {most!r}, {jitter!r}"
            )

    def backoff(self, attempts: int) -> float:
        """Seconds before the next delivery of a message that failed ``attempts`` times."""
        base = min(self.max_retry_delay, self.retry_delay * 2 ** max(attempts - 1, 0))
        return min(self.max_retry_delay, base * (1 + self.retry_jitter * random.random()))


class WorkerKeywords(TypedDict, total=False):
    """The fields of :class:`WorkerOptions` as keyword arguments of ``Worker(...)``."""

    owner: str | None
    lease_ttl: float
    concurrency: int
    queues: tuple[str, ...]
    visibility_timeout: float | None
    poll_interval: float
    resume_options: ResumeOptions | None
    recovery_interval: float | None
    stale_after: float | None
    reenqueue_enqueued_after: float | None
    on_result: ResultHook | None
    on_failure: FailureHook | None
    retry_delay: float
    max_retry_delay: float
    retry_jitter: float
    busy_grace: float
    timer_interval: float | None
    schedule_interval: float | None
    sample_interval: float | None
