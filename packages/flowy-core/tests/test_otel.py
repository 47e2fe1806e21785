"""OpenTelemetry (``flowy.otel``), with the SDK's in-memory exporters: the spans of a run,
the worker's resume in the trace of the request that handed off, the metrics by name
and value, the backlog gauges a sample (or a worker) reads from the store; and core that
imports nothing of OpenTelemetry until asked."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from core_graphs import QueuelessConsumer, State, approval_graph, merge
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import flowy
import flowy.otel
from flowy.memory import MemoryBackend, MemoryConsumer, MemoryStore
from flowy.queues import Route
from flowy.storage import (
    HandoffIntent,
    HandoffStatus,
    OutboxStats,
    ResumeToken,
    Snapshot,
    as_backend,
)
from flowy.storage import _base as storage_base
from flowy.storage.dialect import BaseCheckpointer, QueueCounts

pytestmark = pytest.mark.anyio


class Exported:
    """What the in-memory exporters hold."""

    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.reader = InMemoryMetricReader()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.tracer_provider = tracer_provider
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def named(self, name: str) -> list[Any]:
        return [s for s in self.spans.get_finished_spans() if s.name == name]

    def metrics(self) -> dict[str, list[tuple[dict[str, Any], Any]]]:
        data = self.reader.get_metrics_data()
        out: dict[str, list[tuple[dict[str, Any], Any]]] = {}
        if data is None:  # nothing recorded
            return out
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    out[metric.name] = [
                        (dict(p.attributes or {}), getattr(p, "value", getattr(p, "count", None)))
                        for p in metric.data.data_points
                    ]
        return out


@pytest.fixture
def exported() -> Iterator[Exported]:
    e = Exported()
    flowy.otel.instrument(tracer_provider=e.tracer_provider, meter_provider=e.meter_provider)
    try:
        yield e
    finally:
        flowy.otel.uninstrument()


async def test_a_run_and_its_hand_off_form_one_trace(exported: Exported) -> None:
    backend = MemoryBackend[State]()
    runner = flowy.Runner(approval_graph(), backend)
    first = await runner.start("t", {})
    assert first.resume_token is not None
    handed = await runner.resume(first.resume_token, state_overlay={"approved": True})
    assert handed.status is flowy.RunStatus.HANDOFF
    await flowy.Worker(runner).run_until_idle(0.1)
    segments = exported.named("flowy.segment")
    assert [s.attributes["flowy.kind"] for s in segments] == ["start", "resume", "resume"]
    assert [s.attributes["flowy.status"] for s in segments] == ["suspended", "handoff", "completed"]
    start, request, worker = segments
    assert request.attributes["flowy.thread_id"] == "t"
    assert request.attributes["flowy.store"] == "MemoryCheckpointer"
    # The worker's segment continues the trace of the request that handed off.
    assert worker.context.trace_id == request.context.trace_id
    assert worker.parent is not None and worker.parent.span_id == request.context.span_id
    assert start.context.trace_id != request.context.trace_id
    nodes = exported.named("flowy.node")
    assert [n.attributes["flowy.node"] for n in nodes] == [
        "plan",
        "ask",
        "ask",
        "act",
        "act",
        "done",
    ]
    assert all(n.parent is not None for n in nodes)
    saves = exported.named("flowy.save")
    assert saves and {s.attributes["flowy.outcome"] for s in saves} == {"ok"}
    assert [h.attributes["flowy.status"] for h in exported.named("flowy.handoff")] == ["success"]
    metrics = exported.metrics()
    runs = {p["flowy.status"]: v for p, v in metrics["flowy.runs"]}
    assert runs == {"suspended": 1, "handoff": 1, "completed": 1}
    assert sum(v for _, v in metrics["flowy.steps"]) == handed.total_steps + 2
    assert metrics["flowy.handoffs"] == [({"flowy.status": "success"}, 1)]
    assert [p for p, _ in metrics["flowy.save.duration"]] == [{"flowy.outcome": "ok"}]


async def test_conflicts_lost_leases_and_dead_letters_are_counted(exported: Exported) -> None:
    backend = MemoryBackend[State](max_attempts=1)
    runner = flowy.Runner(approval_graph(), backend)
    first = await runner.start("t", {})
    assert first.resume_token is not None
    await backend.checkpointer.save(first.revision, (await runner.head("t"))[0])  # moves on
    with pytest.raises(flowy.ConcurrencyConflictError):
        await runner.resume(first.resume_token)

    async def broken(s: State) -> tuple[State, flowy.Directive[Any]]:
        raise RuntimeError("down")

    async def hand(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {}, flowy.handoff("to_worker", resume_at="broken")

    builder: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    graph = (
        builder.add_node("hand", hand)
        .add_node("broken", broken)
        .add_edge("hand", "broken")
        .allow_no_outgoing_route("broken")
        .compile()
    )
    failing = flowy.Runner(graph, backend)
    await failing.start("d", {})
    await flowy.Worker(failing, retry_delay=0).run_until_idle(0.1)
    metrics = exported.metrics()
    assert metrics["flowy.dead_letters"] == [({}, 1)]
    failed = [s for s in exported.named("flowy.node") if s.attributes["flowy.node"] == "broken"]
    assert failed and failed[0].status.status_code.name == "ERROR"


async def test_a_conflicting_save_is_a_conflict(exported: Exported) -> None:
    class Moving(flowy.memory.MemoryCheckpointer[State]):
        async def save(self, expected: int, snapshot: Any, *, lease: Any = None) -> int:
            if snapshot.execution_pointer == "ask":
                await super().save(expected, snapshot, lease=lease)  # someone else got there
            return await super().save(expected, snapshot, lease=lease)

    runner = flowy.Runner(approval_graph(), as_backend(Moving()))
    result = await runner.start("c", {})
    assert result.status is flowy.RunStatus.FAILED
    assert exported.metrics()["flowy.occ.conflicts"] == [({}, 1)]
    assert "conflict" in {s.attributes["flowy.outcome"] for s in exported.named("flowy.save")}


GAUGES = (
    "flowy.outbox.depth",
    "flowy.outbox.oldest_age",
    "flowy.outbox.dead_letters",
    "flowy.threads.oldest_age",
)


def intent(thread_id: str) -> HandoffIntent:
    return HandoffIntent(
        thread_id=thread_id,
        pending_snapshot_revision=1,
        committed_snapshot_revision=1,
        snapshot_revision=1,
        resume_token=ResumeToken(thread_id, 1),
        handoff_status=HandoffStatus.ENQUEUED,
        reason="handoff",
        execution_pointer="act",
    )


async def park(backend: MemoryBackend[State], thread_id: str, status: str, age: float) -> None:
    """A thread saved ``age`` seconds ago in ``status``."""
    snap: Snapshot[State] = Snapshot(
        thread_id, {}, "ask", flowy.RunStatus(status), updated_at=time.time() - age
    )
    await backend.checkpointer.save(0, snap)


def gauges(exported: Exported) -> dict[str, dict[str, float]]:
    """Each backlog gauge's values by its ``flowy.status`` ("" without one)."""
    metrics = exported.metrics()
    return {
        name: {str(p.get("flowy.status", "")): v for p, v in metrics.get(name, [])}
        for name in GAUGES
    }


async def test_the_backlog_gauges_report_a_sample(exported: Exported) -> None:
    enqueued = time.time() - 30
    store = MemoryStore(clock=lambda: enqueued)  # messages are enqueued 30 s ago
    backend = MemoryBackend[State](store, max_attempts=1, url="memory://backlog")
    for thread_id in ("a", "b", "c"):
        await backend.outbox.enqueue_intent(intent(thread_id))
    [dead] = await backend.consumer.claim(1, 60)
    await backend.consumer.release(dead, error="boom")  # its only delivery: a dead letter
    await park(backend, "s-old", "suspended", 100)
    await park(backend, "s-new", "suspended", 10)
    await park(backend, "w", "waiting", 40)
    await park(backend, "r", "running", 500)  # not parked: not counted
    assert all(not values for values in gauges(exported).values())  # nothing sampled yet
    await flowy.otel.sample(backend)
    seen = gauges(exported)
    assert seen["flowy.outbox.depth"] == {"": 2}
    assert seen["flowy.outbox.dead_letters"] == {"": 1}
    assert seen["flowy.outbox.oldest_age"][""] == pytest.approx(30, abs=2)
    ages = seen["flowy.threads.oldest_age"]
    assert ages.keys() == {"suspended", "waiting"}
    assert ages["suspended"] == pytest.approx(100, abs=2)
    assert ages["waiting"] == pytest.approx(40, abs=2)
    points = exported.metrics()["flowy.outbox.depth"]  # the memory store keeps queues
    assert [p for p, _ in points] == [
        {"flowy.store.url": "memory://backlog", "flowy.queue": "default"}
    ]
    # The backlog drains: the next sample says so.
    for message in await backend.consumer.claim(10, 60):
        await backend.consumer.ack(message)
    await backend.checkpointer.delete("w")
    await flowy.otel.sample(backend)
    seen = gauges(exported)
    assert seen["flowy.outbox.depth"] == {"": 0}
    assert seen["flowy.outbox.oldest_age"] == {"": 0}
    assert seen["flowy.threads.oldest_age"]["waiting"] == 0
    assert seen["flowy.threads.oldest_age"]["suspended"] == pytest.approx(100, abs=2)


def by_queue(exported: Exported, name: str) -> dict[str, float]:
    return {p["flowy.queue"]: v for p, v in exported.metrics().get(name, [])}


async def test_a_store_with_queues_reports_each_queue(exported: Exported) -> None:
    enqueued = time.time() - 30
    store = MemoryStore(clock=lambda: enqueued)
    backend = MemoryBackend[State](store, url="memory://queues")
    for thread_id, queue in (("a", "llm"), ("b", "llm"), ("c", "llm"), ("d", "default")):
        await backend.outbox.enqueue_intent(replace(intent(thread_id), route=Route(queue)))
    [claimed] = await backend.consumer.claim(1, 60, queue="llm")
    await flowy.otel.sample(backend)
    assert by_queue(exported, "flowy.outbox.depth") == {"llm": 3, "default": 1}
    assert by_queue(exported, "flowy.outbox.in_flight") == {"llm": 1, "default": 0}
    ages = by_queue(exported, "flowy.outbox.oldest_age")
    assert ages["llm"] == pytest.approx(30, abs=2) and ages["default"] == pytest.approx(30, abs=2)
    # Dead letters have no queue: one series per store.
    assert exported.metrics()["flowy.outbox.dead_letters"] == [
        ({"flowy.store.url": "memory://queues"}, 0)
    ]
    await backend.consumer.ack(claimed)
    await flowy.otel.sample(backend)
    assert by_queue(exported, "flowy.outbox.in_flight") == {"llm": 0, "default": 0}
    assert by_queue(exported, "flowy.outbox.depth") == {"llm": 2, "default": 1}


async def test_a_store_without_queues_has_one_series_and_no_in_flight(
    exported: Exported,
) -> None:
    mem = MemoryBackend[State](url="memory://plain")
    consumer = QueuelessConsumer(mem.store)
    backend = as_backend(mem.checkpointer, outbox=mem.outbox, consumer=consumer, url="plain://")
    assert not backend.capabilities.queues
    await mem.outbox.enqueue_intent(intent("a"))
    await flowy.otel.sample(backend)
    assert exported.metrics()["flowy.outbox.depth"] == [({"flowy.store.url": "plain://"}, 1)]
    assert "flowy.outbox.in_flight" not in exported.metrics()


async def test_each_store_is_its_own_series(exported: Exported) -> None:
    one = MemoryBackend[State](url="memory://one")
    two = MemoryBackend[State](url="memory://ops:secret@two")
    await one.outbox.enqueue_intent(intent("a"))
    await flowy.otel.sample(one)
    await flowy.otel.sample(two)
    depth = {p["flowy.store.url"]: v for p, v in exported.metrics()["flowy.outbox.depth"]}
    assert depth == {"memory://one": 1, "memory://ops:***@two": 0}  # never a password


async def test_sampling_without_instrumentation_does_nothing() -> None:
    exported = Exported()
    backend = MemoryBackend[State]()
    await backend.outbox.enqueue_intent(intent("a"))
    await flowy.otel.sample(backend)  # not instrumented: no read, no error
    assert not exported.metrics()


async def test_gauges_stop_with_uninstrument() -> None:
    exported = Exported()
    flowy.otel.instrument(meter_provider=exported.meter_provider)
    try:
        await flowy.otel.sample(MemoryBackend[State]())
        assert gauges(exported)["flowy.outbox.depth"] == {"": 0}
    finally:
        flowy.otel.uninstrument()
    assert all(not values for values in gauges(exported).values())


class DownConsumer(MemoryConsumer):
    """A consumer whose backlog cannot be read."""

    async def _stats(self) -> OutboxStats:
        raise flowy.errors.StorageUnavailableError("the outbox is down")

    async def _queue_counts(self) -> dict[str, QueueCounts]:
        raise flowy.errors.StorageUnavailableError("the outbox is down")


async def test_a_failed_read_keeps_what_was_read(exported: Exported) -> None:
    backend = MemoryBackend[State]()
    backend.consumer = DownConsumer(backend.store)
    await park(backend, "s", "suspended", 20)
    with pytest.raises(flowy.errors.StorageUnavailableError):
        await flowy.otel.sample(backend)
    seen = gauges(exported)
    assert seen["flowy.threads.oldest_age"]["suspended"] == pytest.approx(20, abs=2)
    assert seen["flowy.outbox.depth"] == {}


class ScannedCheckpointer(flowy.memory.MemoryCheckpointer[State]):
    """A store without an index of parked heads: the base scans ``_list_heads``."""

    async def _oldest_heads(self, statuses: frozenset[flowy.RunStatus]) -> dict[Any, float]:
        return await BaseCheckpointer._oldest_heads(self, statuses)  # pyright: ignore[reportPrivateUsage]


async def test_a_store_without_an_index_is_scanned_page_by_page(
    exported: Exported, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(storage_base, "_SCAN_PAGE", 2)
    backend = MemoryBackend[State]()
    backend.checkpointer = ScannedCheckpointer(backend.store)
    for name, status, age in (
        ("a", "completed", 900),
        ("b", "suspended", 30),
        ("c", "waiting", 70),
        ("d", "running", 500),
        ("e", "suspended", 80),  # on the third page
    ):
        await park(backend, name, status, age)
    await flowy.otel.sample(backend)
    ages = gauges(exported)["flowy.threads.oldest_age"]
    assert ages["suspended"] == pytest.approx(80, abs=2)
    assert ages["waiting"] == pytest.approx(70, abs=2)


async def wait_for_gauge(exported: Exported, name: str, status: str = "") -> float:
    for _ in range(200):
        values = gauges(exported)[name]
        if status in values:
            return values[status]
        await asyncio.sleep(0.02)
    raise AssertionError(f"{name} was never reported")


async def test_the_worker_samples_its_store(exported: Exported) -> None:
    backend = MemoryBackend[State]()
    runner = flowy.Runner(approval_graph(), backend)
    assert (await runner.start("t", {})).status is flowy.RunStatus.SUSPENDED
    worker = flowy.Worker(runner, sample_interval=0.05, poll_interval=0.05)
    running = asyncio.ensure_future(worker.run())
    try:
        assert await wait_for_gauge(exported, "flowy.threads.oldest_age", "suspended") >= 0
        assert gauges(exported)["flowy.outbox.depth"] == {"": 0}
        assert gauges(exported)["flowy.threads.oldest_age"]["waiting"] == 0
        # A later sample sees a thread that started waiting since.
        await park(backend, "w", "waiting", 40)
        for _ in range(200):
            if gauges(exported)["flowy.threads.oldest_age"]["waiting"]:
                break
            await asyncio.sleep(0.02)
        assert gauges(exported)["flowy.threads.oldest_age"]["waiting"] == pytest.approx(40, abs=2)
    finally:
        worker.stop()
        await running


async def test_a_worker_logs_a_failed_sample_and_goes_on(
    exported: Exported, caplog: pytest.LogCaptureFixture
) -> None:
    backend = MemoryBackend[State]()
    backend.consumer = DownConsumer(backend.store)
    runner = flowy.Runner(approval_graph(), backend)
    first = await runner.start("t", {})
    assert first.resume_token is not None
    worker = flowy.Worker(runner, backend.consumer, sample_interval=0.05, poll_interval=0.05)
    with caplog.at_level(logging.ERROR, logger="flowy.worker"):
        running = asyncio.ensure_future(worker.run())
        try:
            await wait_for_gauge(exported, "flowy.threads.oldest_age", "suspended")
            failed: list[logging.LogRecord] = []
            for _ in range(200):
                failed = [r for r in caplog.records if "reading the backlog failed" in r.message]
                if len(failed) >= 2:  # it keeps sampling
                    break
                await asyncio.sleep(0.02)
            assert len(failed) >= 2
            assert failed[0].exc_info is not None  # with its traceback
            # The worker still does its work.
            handed = await runner.resume(first.resume_token, state_overlay={"approved": True})
            assert handed.status is flowy.RunStatus.HANDOFF
            for _ in range(200):
                if (await runner.head("t"))[0].status is flowy.RunStatus.COMPLETED:
                    break
                await asyncio.sleep(0.02)
            assert (await runner.head("t"))[0].status is flowy.RunStatus.COMPLETED
        finally:
            worker.stop()
            await running


def test_core_imports_nothing_of_opentelemetry() -> None:
    code = (
        "import sys, flowy, flowy.cli, flowy.testing;"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


async def test_without_instrument_nothing_is_reported() -> None:
    exported = Exported()  # providers exist, but flowy was not told about them
    await flowy.Runner(approval_graph(), MemoryBackend[State]()).start("t", {})
    assert exported.spans.get_finished_spans() == ()
