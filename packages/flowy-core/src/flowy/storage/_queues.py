"""The values of queues: the limits a store keeps for each queue of hand-off messages,
what it counts for one, and what ``backend.queues`` reports.

A hand-off's message waits in the queue its :class:`~flowy.storage.Route` names. The
store's consumer claims from one queue at a time (``BaseConsumer.claim(queue=...)``),
within that queue's limits, counted by the store in the claim's own atomic operation so
no race between workers exceeds them: how many of its messages are in flight across the
fleet and per worker process, per partition, and how many start per period.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from ._model import HandoffIntent

__all__ = [
    "DEFAULT_RATE_PERIOD",
    "MAX_RATE_PERIOD",
    "NO_LIMITS",
    "QueueCounts",
    "QueueLimits",
    "QueueMessage",
    "QueueStats",
]

DEFAULT_RATE_PERIOD = 60.0
"""Seconds: the window of a queue's rate limits unless it sets ``rate_period``."""

MAX_RATE_PERIOD = 7 * 24 * 3600.0
"""Seconds: the longest rate period accepted (a week)."""

_COUNTS = (
    "global_concurrency",
    "worker_concurrency",
    "partition_concurrency",
    "rate_limit",
    "partition_rate_limit",
)


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """The limits of one queue, kept by the store and read by every claim.

    Each count is ``None`` for no limit, or a number >= 0 (0 stops the queue's starts:
    its messages wait, and are kept). A message is *in flight* from its claim until it
    is acked or released, or until its claim's visibility timeout runs out (so a
    crashed worker's slots come back then); a *start* is a claim.
    """

    global_concurrency: int | None = None
    """The most messages of the queue in flight across every worker."""
    worker_concurrency: int | None = None
    """The most messages of the queue in flight in one worker (one consumer)."""
    partition_concurrency: int | None = None
    """The most messages of one partition (``Route.partition_key``) in flight; messages
    without a partition key are not counted against it."""
    rate_limit: int | None = None
    """The most starts of the queue's messages in any ``rate_period`` seconds."""
    partition_rate_limit: int | None = None
    """The most starts of one partition's messages in any ``rate_period`` seconds."""
    rate_period: float = DEFAULT_RATE_PERIOD
    """Seconds: the window of both rate limits."""

    def __post_init__(self) -> None:
        for name in _COUNTS:
            value: object = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int or None, got {value!r:.80}")
            if value < 0 or value > 2**31 - 1:
                raise ValueError(f"{name} must be within 0 .. {2**31 - 1}, got {value}")
        period: object = self.rate_period
        if isinstance(period, bool) or not isinstance(period, int | float):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"rate_period must be a number of seconds, got {period!r:.80}")
        if not (math.isfinite(period) and 0.001 <= period <= MAX_RATE_PERIOD):
            raise ValueError(
                f"rate_period must be within 0.001 .. {MAX_RATE_PERIOD:.0f} seconds, "
                f"got {period!r:.80}"
            )
        object.__setattr__(self, "rate_period", float(period))

    def partition_full(self, in_flight: int, started: int) -> bool:
        """Whether a partition with ``in_flight`` messages in flight and ``started``
        starts in the rate window may start no more (a claim skips its messages)."""
        return (
            self.partition_concurrency is not None and in_flight >= self.partition_concurrency
        ) or (self.partition_rate_limit is not None and started >= self.partition_rate_limit)

    @property
    def rate_limited(self) -> bool:
        """True if either rate limit is set (the store then records each start)."""
        return self.rate_limit is not None or self.partition_rate_limit is not None

    def to_json(self) -> dict[str, Any]:
        """The limits as a JSON object (every field; ``None`` for no limit)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data: object) -> QueueLimits:
        """The limits :meth:`to_json` wrote as ``data`` (``ValueError`` or ``TypeError``
        for anything else: stored bytes are checked like input)."""
        if not isinstance(data, Mapping):
            raise ValueError(f"queue limits must be a JSON object, got {data!r:.80}")
        raw: Mapping[str, Any] = data  # pyright: ignore[reportUnknownVariableType]
        unknown = set(raw) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"queue limits have unknown fields {sorted(unknown)!r:.80}")
        return cls(**raw)


NO_LIMITS = QueueLimits()
"""The limits of a queue that configured none."""


@dataclass(frozen=True, slots=True)
class QueueCounts:
    """What a store counts for one queue (``BaseConsumer._queue_counts``)."""

    in_flight: int
    """Messages claimed and neither acked, released nor past their visibility timeout."""
    pending: int
    """Live messages not in flight (visible now, or released with a delay)."""
    oldest_pending_at: float | None
    """When the oldest pending message was enqueued, by the store's clock (``None``
    exactly when ``pending`` is 0)."""
    started: int
    """Starts within the last ``rate_period`` seconds, counted while a rate limit is set
    (0 without one: the store records no starts then)."""


@dataclass(frozen=True, slots=True)
class QueueStats:
    """One queue as ``backend.queues.list()`` reports it."""

    queue: str
    """The queue's name."""
    limits: QueueLimits
    """Its stored limits (no limits when it configured none)."""
    in_flight: int
    """Its messages claimed and not yet acked, released or past their visibility."""
    pending: int
    """Its live messages not in flight (waiting to start, or released with a delay)."""
    oldest_pending_at: float | None
    """When the oldest pending message was enqueued, in seconds since the epoch by the
    store's clock (``None``: none pending)."""
    started: int
    """Starts in the current rate window (0 when the queue has no rate limit)."""


@dataclass(frozen=True, slots=True)
class QueueMessage:
    """A live message of a queue, as ``backend.queues.messages`` lists it."""

    message_id: str
    intent: HandoffIntent | None
    """``None`` when its payload does not decode (the consumer buries it when claimed)."""
    attempts: int
    error: str
