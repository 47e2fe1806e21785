"""OpenTelemetry traces and metrics for flowy (``pip install "flowy-core[otel]"``, which
adds ``opentelemetry-api`` only; bring your SDK and exporters).

``flowy.otel.instrument()`` makes every runner and worker of the process report:

**Spans** (tracer ``flowy``): ``flowy.segment`` for each start or resume (attributes
``flowy.thread_id``, ``flowy.kind`` start/resume, ``flowy.store``, and at the end
``flowy.status``, ``flowy.reason``, ``flowy.revision``, ``flowy.steps``), with children
``flowy.node`` (``flowy.node``, ``flowy.step``, ``flowy.directive``), ``flowy.save``
(``flowy.outcome``: ok, conflict, lease_lost, error), ``flowy.lease.acquire`` (acquired,
busy, error) and ``flowy.handoff`` (``flowy.status``). A hand-off carries the W3C trace
context of the segment that made it in its intent (``HandoffIntent.trace``), and the
worker's resume is a ``flowy.segment`` in that same trace.

**Metrics** (meter ``flowy``):

- ``flowy.runs`` (counter, ``flowy.status``): segments that ended, by status;
- ``flowy.steps`` (counter): steps run;
- ``flowy.save.duration`` (histogram, seconds, ``flowy.outcome``): every save;
- ``flowy.occ.conflicts`` (counter): saves refused by optimistic concurrency;
- ``flowy.leases.lost`` (counter): runs that lost their lease;
- ``flowy.handoffs`` (counter, ``flowy.status``): hand-offs by outcome;
- ``flowy.dead_letters`` (counter): messages a worker dead-lettered.

**Backlog gauges** (observable gauges, attribute ``flowy.store.url``: the store's URL
without its password), read from the store by :func:`sample`:

- ``flowy.outbox.depth``: messages pending delivery (claimed or not);
- ``flowy.outbox.oldest_age`` (s): how long ago the oldest of them was enqueued (0 with
  none);
- ``flowy.outbox.in_flight`` (stores with queues only): messages claimed and not yet
  acked or released;
- ``flowy.outbox.dead_letters``: dead letters held now (the counter above counts those
  a worker buried; this one also sees those requeued or buried elsewhere);
- ``flowy.threads.oldest_age`` (s, ``flowy.status`` ``suspended`` or ``waiting``): how
  long ago the oldest thread in that status was saved (0 with none).

On a store that keeps queues (``backend.capabilities.queues``) the three gauges above
are reported per queue, with the attribute ``flowy.queue`` (from
``backend.queues.list()``): ``depth`` counts the queue's messages pending and in flight,
``oldest_age`` the age of its oldest message not in flight. On other stores they are
one series per store, without ``flowy.queue``.

Gauge callbacks cannot wait on a store, so the values are those of the latest
``await flowy.otel.sample(backend)``; ages grow with the clock between samples. A
``flowy.Worker`` samples its runner's backend every ``sample_interval`` seconds (15 by
default) while instrumentation is in effect, and logs a failed sample.

Without ``instrument()`` nothing is reported and nothing of OpenTelemetry is imported:
core uses the standard library only.
"""

from __future__ import annotations

import asyncio
import importlib.util
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from . import _tracing
from ._version import __version__
from .queues import QueueStats, queues_of
from .storage import Backend, OutboxStats, RunStatus, redact_url
from .storage.dialect import BACKLOG_STATUSES, BaseCheckpointer, BaseConsumer

__all__ = ["instrument", "sample", "uninstrument"]


def instrument(*, tracer_provider: Any = None, meter_provider: Any = None) -> None:
    """Report flowy's spans and metrics to OpenTelemetry from now on.

    Args:
        tracer_provider: where spans go (default: the global tracer provider).
        meter_provider: where metrics go (default: the global meter provider).

    Raises:
        ImportError: ``opentelemetry-api`` is not installed (the ``otel`` extra).
    """
    if importlib.util.find_spec("opentelemetry") is None:
        raise ImportError('flowy.otel needs opentelemetry-api: pip install "flowy-core[otel]"')
    _tracing.install(_OpenTelemetry(tracer_provider, meter_provider))


def uninstrument() -> None:
    """Stop reporting to OpenTelemetry."""
    _tracing.install(None)


async def sample(backend: Backend[Any]) -> None:
    """Read the backlog of ``backend`` (outbox depth and oldest message, dead letters,
    the oldest suspended and waiting threads) for the backlog gauges to report until the
    next sample. Does nothing unless :func:`instrument` is in effect.

    A ``flowy.Worker`` calls it every ``sample_interval`` seconds; call it yourself in a
    process without a worker.

    Args:
        backend: the store to read (its consumer's ``stats()`` and its checkpointer's
            ``oldest_heads()``).

    Raises:
        TypeError: the store is not built on ``flowy.storage``'s bases (it cannot report
            its backlog).
        StorageError: the store could not be read (what was read is kept).
    """
    tracing = _tracing.active()
    if tracing is not None:
        await tracing.sample(backend)


class _Span:
    def __init__(
        self, span: Any, token: object = None, on_end: Any = None, attribute: str = "flowy.status"
    ) -> None:
        self.span, self.token, self.on_end, self.attribute = span, token, on_end, attribute

    def end(
        self,
        status: str = "",
        reason: str = "",
        revision: int = 0,
        error: BaseException | None = None,
        steps: int = 0,
    ) -> None:
        from opentelemetry import context
        from opentelemetry.trace import Status, StatusCode

        span = self.span
        if status:
            span.set_attribute(self.attribute, status)
        if reason:
            span.set_attribute("flowy.reason", reason)
        if revision:
            span.set_attribute("flowy.revision", revision)
        if self.on_end is not None:
            span.set_attribute("flowy.steps", steps)
            self.on_end(status, steps)
        if error is not None:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"[:200]))
        span.end()
        if self.token is not None:
            context.detach(self.token)  # pyright: ignore[reportArgumentType]


@dataclass
class _Backlog:
    """The latest sample of one store (``None``: not read yet)."""

    outbox: OutboxStats | None = None
    oldest_heads: dict[RunStatus, float] | None = None
    queues: list[QueueStats] | None = None
    """Each queue's backlog (``None``: the store keeps no queues, or not read yet)."""


async def _read_backlog(
    backend: object,
) -> tuple[
    OutboxStats | BaseException,
    dict[RunStatus, float] | BaseException,
    list[QueueStats] | BaseException | None,
]:
    """The consumer's ``stats()``, the checkpointer's ``oldest_heads()`` and, on a store
    that keeps queues, ``backend.queues.list()``, read at once; each is what the read
    returned (``None``: no queues) or raised."""
    consumer = getattr(backend, "consumer", None)
    checkpointer = getattr(backend, "checkpointer", None)
    capabilities = getattr(backend, "capabilities", None)

    async def stats() -> OutboxStats:
        if not isinstance(consumer, BaseConsumer):
            raise TypeError(
                f"cannot read the outbox backlog of {type(consumer).__name__}: it is not a "
                "flowy.storage.dialect.BaseConsumer"
            )
        return await consumer.stats()

    async def heads() -> dict[RunStatus, float]:
        if not isinstance(checkpointer, BaseCheckpointer):
            raise TypeError(
                f"cannot read the oldest threads of {type(checkpointer).__name__}: it is not "
                "a flowy.storage.dialect.BaseCheckpointer"
            )
        return await checkpointer.oldest_heads()

    async def queues() -> list[QueueStats] | None:
        if not getattr(capabilities, "queues", False):
            return None
        return await queues_of(backend).list()

    return await asyncio.gather(stats(), heads(), queues(), return_exceptions=True)


def _age_of_oldest(stats: OutboxStats | QueueStats, now: float) -> float:
    oldest = stats.oldest_pending_at
    return 0.0 if oldest is None else max(now - oldest, 0.0)


class _OpenTelemetry:
    """The ``_tracing.Tracing`` that reports to OpenTelemetry."""

    def __init__(self, tracer_provider: Any, meter_provider: Any) -> None:
        from opentelemetry import metrics, trace

        tracers = tracer_provider or trace.get_tracer_provider()
        meters = meter_provider or metrics.get_meter_provider()
        self.tracer = tracers.get_tracer("flowy", __version__)
        meter = meters.get_meter("flowy", __version__)
        self.runs = meter.create_counter("flowy.runs", description="run segments that ended")
        self.steps = meter.create_counter("flowy.steps", unit="{step}", description="steps run")
        self.save_duration = meter.create_histogram(
            "flowy.save.duration", unit="s", description="how long a save took"
        )
        self.conflicts = meter.create_counter(
            "flowy.occ.conflicts", description="saves refused by optimistic concurrency"
        )
        self.leases_lost = meter.create_counter(
            "flowy.leases.lost", description="runs that lost their lease"
        )
        self.handoffs = meter.create_counter("flowy.handoffs", description="hand-offs by outcome")
        self.dead_letters = meter.create_counter(
            "flowy.dead_letters", description="messages a worker dead-lettered"
        )
        self.backlogs: dict[str, _Backlog] = {}  # by the store's redacted URL
        meter.create_observable_gauge(
            "flowy.outbox.depth",
            callbacks=[
                self._outbox_gauge(
                    lambda stats, now: stats.pending, lambda q, now: q.pending + q.in_flight
                )
            ],
            unit="{message}",
            description="outbox messages pending delivery",
        )
        meter.create_observable_gauge(
            "flowy.outbox.oldest_age",
            callbacks=[self._outbox_gauge(_age_of_oldest, _age_of_oldest)],
            unit="s",
            description="how long ago the oldest pending outbox message was enqueued",
        )
        meter.create_observable_gauge(
            "flowy.outbox.in_flight",
            callbacks=[self._outbox_gauge(None, lambda q, now: q.in_flight)],
            unit="{message}",
            description="outbox messages claimed and not yet acked or released, per queue",
        )
        meter.create_observable_gauge(
            "flowy.outbox.dead_letters",
            callbacks=[self._outbox_gauge_store(lambda stats, now: stats.dead_letters)],
            unit="{message}",
            description="dead letters held",
        )
        meter.create_observable_gauge(
            "flowy.threads.oldest_age",
            callbacks=[self._observe_thread_age],
            unit="s",
            description="how long ago the oldest suspended or waiting thread was saved",
        )

    async def sample(self, backend: object) -> None:
        url = redact_url(str(getattr(backend, "url", "")))
        outbox, heads, queues = await _read_backlog(backend)
        backlog = self.backlogs.setdefault(url, _Backlog())
        if isinstance(outbox, OutboxStats):
            backlog.outbox = outbox
        if isinstance(heads, dict):
            backlog.oldest_heads = heads
        if not isinstance(queues, BaseException):
            backlog.queues = queues
        for result in (outbox, heads, queues):
            if isinstance(result, BaseException):
                raise result

    def _samples(self) -> Iterator[tuple[dict[str, Any], _Backlog]]:
        if _tracing.active() is not self:  # uninstrumented (or replaced): report nothing
            return
        for url, backlog in list(self.backlogs.items()):
            yield {"flowy.store.url": url}, backlog

    def _outbox_gauge(
        self,
        value: Callable[[OutboxStats, float], float] | None,
        per_queue: Callable[[QueueStats, float], float],
    ) -> Callable[[Any], Iterator[Any]]:
        """A gauge callback reporting ``per_queue(stats, now)`` of each queue of a store
        that keeps queues, else ``value(stats, now)`` of the store's outbox (``None``:
        nothing for such a store)."""

        def observe(options: Any) -> Iterator[Any]:
            from opentelemetry.metrics import Observation

            now = time.time()
            for attributes, backlog in self._samples():
                if backlog.queues is not None:
                    for queue in backlog.queues:
                        yield Observation(
                            per_queue(queue, now), {**attributes, "flowy.queue": queue.queue}
                        )
                elif backlog.outbox is not None and value is not None:
                    yield Observation(value(backlog.outbox, now), attributes)

        return observe

    def _outbox_gauge_store(
        self, value: Callable[[OutboxStats, float], float]
    ) -> Callable[[Any], Iterator[Any]]:
        """A gauge callback reporting ``value(stats, now)`` of each store's outbox."""

        def observe(options: Any) -> Iterator[Any]:
            from opentelemetry.metrics import Observation

            now = time.time()
            for attributes, backlog in self._samples():
                if backlog.outbox is not None:
                    yield Observation(value(backlog.outbox, now), attributes)

        return observe

    def _observe_thread_age(self, options: Any) -> Iterator[Any]:
        from opentelemetry.metrics import Observation

        now = time.time()
        for attributes, backlog in self._samples():
            if backlog.oldest_heads is None:
                continue
            for status in sorted(BACKLOG_STATUSES):
                at = backlog.oldest_heads.get(status)
                age = 0.0 if at is None else max(now - at, 0.0)
                yield Observation(age, {**attributes, "flowy.status": status.value})

    def segment(self, thread_id: str, kind: str, store: str) -> _Span:
        from opentelemetry import context, propagate, trace

        carried = _tracing.incoming.get()
        parent = propagate.extract(dict(carried)) if carried else None
        span = self.tracer.start_span(
            "flowy.segment",
            context=parent,
            attributes={"flowy.thread_id": thread_id, "flowy.kind": kind, "flowy.store": store},
        )
        token = context.attach(trace.set_span_in_context(span))

        def ended(status: str, steps: int) -> None:
            self.runs.add(1, {"flowy.status": status or "unknown"})
            if steps:
                self.steps.add(steps)

        return _Span(span, token, ended)

    def node(self, thread_id: str, node: str, step: int) -> _Span:
        span = self.tracer.start_span(
            "flowy.node",
            attributes={"flowy.thread_id": thread_id, "flowy.node": node, "flowy.step": step},
        )
        return _Span(span, attribute="flowy.directive")

    def _instant(self, name: str, seconds: float, attributes: dict[str, Any]) -> None:
        end = time.time_ns()
        span = self.tracer.start_span(
            name, start_time=end - int(seconds * 1e9), attributes=attributes
        )
        span.end(end_time=end)

    def save(self, thread_id: str, store: str, seconds: float, outcome: str) -> None:
        attributes = {"flowy.thread_id": thread_id, "flowy.store": store, "flowy.outcome": outcome}
        self._instant("flowy.save", seconds, attributes)
        self.save_duration.record(seconds, {"flowy.outcome": outcome})
        if outcome == "conflict":
            self.conflicts.add(1)

    def lease(self, thread_id: str, seconds: float, outcome: str) -> None:
        self._instant(
            "flowy.lease.acquire", seconds, {"flowy.thread_id": thread_id, "flowy.outcome": outcome}
        )

    def lease_lost(self, thread_id: str) -> None:
        self.leases_lost.add(1)

    def handoff(self, thread_id: str, status: str) -> None:
        self._instant("flowy.handoff", 0.0, {"flowy.status": status})
        self.handoffs.add(1, {"flowy.status": status})

    def dead_letter(self, thread_id: str) -> None:
        self.dead_letters.add(1)

    def carrier(self) -> dict[str, str]:
        from opentelemetry import propagate

        carried: dict[str, str] = {}
        propagate.inject(carried)
        return carried
