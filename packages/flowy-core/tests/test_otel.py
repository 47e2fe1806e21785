"""OpenTelemetry (``flowy.otel``), with the SDK's in-memory exporters: the spans of a run,
the worker's resume in the trace of the request that handed off, the metrics by name
and value; and core that imports nothing of OpenTelemetry until asked."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from core_graphs import State, approval_graph, merge
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import flowy
import flowy.otel
from flowy.memory import MemoryBackend

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
        assert data is not None
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

    runner = flowy.Runner(approval_graph(), Moving())
    result = await runner.start("c", {})
    assert result.status is flowy.RunStatus.FAILED
    assert exported.metrics()["flowy.occ.conflicts"] == [({}, 1)]
    assert "conflict" in {s.attributes["flowy.outcome"] for s in exported.named("flowy.save")}


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
