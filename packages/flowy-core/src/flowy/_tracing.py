"""The seam between runs and an optional tracer: ``flowy.otel.instrument()`` installs one
here; without it every hook is skipped at the cost of one ``None`` check.

The engine reports a segment (start or resume) with its nodes, saves, the lease it takes
and loses, hand-offs by status and dead letters; a hand-off carries the trace context of
the segment that made it, and the worker's resume continues that trace. A worker also
asks the tracer, every ``sample_interval`` seconds, to read its store's backlog (the
outbox, the dead letters, the oldest parked threads) for gauges.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from typing import Protocol

__all__ = ["Span", "Tracing", "active", "incoming", "install"]


class Span(Protocol):
    """An open span the engine ends."""

    def end(
        self,
        status: str = "",
        reason: str = "",
        revision: int = 0,
        error: BaseException | None = None,
        steps: int = 0,
    ) -> None:
        """End it with the outcome it covered."""
        ...


class Tracing(Protocol):
    """What a tracer does with the engine's reports."""

    def segment(self, thread_id: str, kind: str, store: str) -> Span:
        """A start or resume of ``thread_id`` began (its span becomes the current one)."""
        ...

    def node(self, thread_id: str, node: str, step: int) -> Span:
        """A node is about to run."""
        ...

    def save(self, thread_id: str, store: str, seconds: float, outcome: str) -> None:
        """A save ended: ``ok``, ``conflict``, ``lease_lost`` or ``error``."""
        ...

    def lease(self, thread_id: str, seconds: float, outcome: str) -> None:
        """A run lease was asked for: ``acquired``, ``busy`` or ``error``."""
        ...

    def lease_lost(self, thread_id: str) -> None:
        """A run lost its lease."""
        ...

    def handoff(self, thread_id: str, status: str) -> None:
        """A hand-off ended with ``status`` (``HandoffMetricStatus``)."""
        ...

    def dead_letter(self, thread_id: str) -> None:
        """A worker dead-lettered a message."""
        ...

    def carrier(self) -> dict[str, str]:
        """The current trace context, to carry in a hand-off's intent."""
        ...

    async def sample(self, backend: object) -> None:
        """Read the backlog of ``backend`` (a ``flowy.Backend``) and keep it for the
        gauges; a failed read raises (the worker logs it)."""
        ...


_tracing: Tracing | None = None

incoming: ContextVar[Mapping[str, str] | None] = ContextVar("flowy_incoming_trace", default=None)
"""The trace context a worker received with a hand-off: the resumed segment joins it."""


def active() -> Tracing | None:
    """The installed tracer, or ``None``."""
    return _tracing


def install(tracing: Tracing | None) -> None:
    """Install ``tracing`` (``None``: remove it)."""
    global _tracing
    _tracing = tracing
