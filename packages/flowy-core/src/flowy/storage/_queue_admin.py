"""``backend.queues``: configure each queue's limits at run time and read its backlog,
over the queue primitives of the store's consumer (``BaseConsumer._claim_queue`` and
the four others; see ``docs/adapters.md``).
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

from ._intents import decode_intent
from ._model import DEFAULT_QUEUE, HandoffIntent, validate_queue_name
from ._outbox import BaseConsumer
from ._queues import (
    DEFAULT_RATE_PERIOD,
    NO_LIMITS,
    QueueCounts,
    QueueLimits,
    QueueMessage,
    QueueStats,
)

__all__ = ["Queues", "queues_of"]


class Queues:
    """The queues of one store (``backend.queues``): their limits, changed at run time
    and read by the next claim of every worker, and their backlog.

    Args:
        consumer: the store's consumer, which implements the queue primitives.
    """

    def __init__(self, consumer: BaseConsumer) -> None:
        self._consumer = consumer

    async def configure(self, name: str, **changes: int | float | None) -> QueueLimits:
        """Change some limits of queue ``name`` (the others stay as they are) and return
        its limits now; a limit given as ``None`` is lifted.

        ``configure("llm", global_concurrency=20, rate_limit=60, rate_period=60)``.

        Raises:
            TypeError, ValueError: an unknown limit, or a value out of range (nothing
                is changed).
        """
        validate_queue_name(name)
        known = {f.name for f in fields(QueueLimits)}
        unknown = set(changes) - known
        if unknown:
            raise TypeError(
                f"unknown queue limit {sorted(unknown)[0]!r}; "
                f"the limits are {', '.join(sorted(known))}"
            )
        current = (await self._consumer._read_limits()).get(name, NO_LIMITS)  # pyright: ignore[reportPrivateUsage]
        values: dict[str, Any] = dict(changes)
        if values.get("rate_period", 0) is None:
            values["rate_period"] = DEFAULT_RATE_PERIOD
        limits = replace(current, **values)
        await self._consumer._set_limits(name, limits)  # pyright: ignore[reportPrivateUsage]
        return limits

    async def reset(self, name: str) -> None:
        """Lift every limit of queue ``name`` (its messages stay where they are)."""
        validate_queue_name(name)
        await self._consumer._set_limits(name, None)  # pyright: ignore[reportPrivateUsage]

    async def limits(self, name: str) -> QueueLimits:
        """The limits of queue ``name`` (no limits when it configured none)."""
        validate_queue_name(name)
        return (await self._consumer._read_limits()).get(name, NO_LIMITS)  # pyright: ignore[reportPrivateUsage]

    async def list(self) -> list[QueueStats]:
        """Every queue that has limits or live messages, by name, with its limits and
        backlog (the default queue always)."""
        configured = await self._consumer._read_limits()  # pyright: ignore[reportPrivateUsage]
        counts = await self._consumer._queue_counts()  # pyright: ignore[reportPrivateUsage]
        names = sorted({DEFAULT_QUEUE, *configured, *counts})
        empty = QueueCounts(0, 0, None, 0)
        out: list[QueueStats] = []
        for name in names:
            c = counts.get(name, empty)
            out.append(
                QueueStats(
                    name,
                    configured.get(name, NO_LIMITS),
                    c.in_flight,
                    c.pending,
                    c.oldest_pending_at,
                    c.started,
                )
            )
        return out

    async def messages(self, name: str, limit: int = 100) -> list[QueueMessage]:
        """Up to ``limit`` live messages of queue ``name``, in the order a claim takes
        them (priority, then age), in flight or not."""
        validate_queue_name(name)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f"limit must be an int >= 0, got {limit!r:.80}")
        if limit == 0:
            return []
        out: list[QueueMessage] = []
        for raw in await self._consumer._queue_messages(name, limit):  # pyright: ignore[reportPrivateUsage]
            try:
                intent: HandoffIntent | None = decode_intent(raw.payload)
            except ValueError:
                intent = None
            out.append(QueueMessage(raw.message_id, intent, raw.attempts, raw.error))
        return out

    def __repr__(self) -> str:
        return f"Queues({self._consumer!r})"


def queues_of(backend: object) -> Queues:
    """The queues of ``backend`` (``backend.queues``); ``TypeError`` if its store keeps
    none (``backend.capabilities.queues`` is false)."""
    capabilities: Any = getattr(backend, "capabilities", None)
    consumer: Any = getattr(backend, "consumer", None)
    # A store has queues when its consumer, built on BaseConsumer, implements them.
    if consumer is None or not getattr(capabilities, "queues", False):
        raise TypeError(
            f"{type(backend).__name__} keeps no queues (its store's consumer does not "
            "implement the queue primitives); every hand-off goes to the default queue"
        )
    return Queues(consumer)
