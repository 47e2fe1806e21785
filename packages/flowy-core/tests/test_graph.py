"""GraphBuilder validation, routing and Mermaid output (``_graph.py``)."""

from __future__ import annotations

from typing import Any

import pytest
from core_graphs import State, merge

import flowy
from flowy import types as ftypes
from flowy.memory import MemoryCheckpointer
from flowy.storage import as_backend

pytestmark = pytest.mark.anyio


async def ok(s: State) -> tuple[State, flowy.Directive[Any]]:
    return s, flowy.completed()


def test_compile_lists_every_problem_at_once() -> None:
    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    b.add_node("a", ok).add_node("b", ok).add_node("orphan", ok).add_node("dead_end", ok)
    b.add_edge("a", "missing")
    b.add_conditional_edge("b", lambda s: "a", "a", "nowhere")
    b.add_edge("a", "dead_end")
    b.allow_no_outgoing_route("ghost")
    b.add_retry_route("b", "also_missing")
    with pytest.raises(flowy.GraphValidationError) as info:
        b.compile(max_steps=0)
    problems = "\n".join(info.value.problems)
    assert "targets unknown node 'missing'" in problems
    assert "targets unknown node 'nowhere'" in problems
    assert "'also_missing'" in problems
    assert "unknown node 'ghost'" in problems
    assert "node 'orphan' is unreachable" in problems
    assert "node 'dead_end' has no outgoing route" in problems
    assert "node 'a' has 2 outgoing routes" in problems
    assert "max_steps must be >= 1" in problems
    assert len(info.value.problems) >= 8


def test_sync_node_and_duplicate_names_rejected() -> None:
    def sync_node(s: State) -> tuple[State, flowy.Directive[Any]]:
        return s, flowy.completed()

    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder()
    b.add_node("a", sync_node)  # type: ignore[arg-type]
    b.add_node("a", ok)
    b.allow_no_outgoing_route("a")
    with pytest.raises(flowy.GraphValidationError) as info:
        b.compile()
    text = str(info.value)
    assert "must be an async function" in text
    assert "added twice" in text


def test_empty_graph_rejected() -> None:
    with pytest.raises(flowy.GraphValidationError, match="no nodes"):
        flowy.GraphBuilder[State, Any]().compile()


def test_graph_is_immutable_and_mermaid() -> None:
    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    b.add_node("check_cache", ok).add_node("heavy_llm", ok).add_node("output", ok)
    b.add_conditional_edge("check_cache", lambda s: "output", "output", "heavy_llm")
    b.add_edge("heavy_llm", "output").allow_no_outgoing_route("output")
    g = b.compile()
    with pytest.raises(TypeError):
        g.nodes["x"] = ok  # type: ignore[index]
    with pytest.raises(AttributeError):
        g.entry = "output"  # type: ignore[misc]
    mermaid = g.to_mermaid()
    assert mermaid.startswith("flowchart TD")
    assert "n_check_cache -.-> n_output" in mermaid
    assert "n_heavy_llm --> n_output" in mermaid
    assert "__start__ --> n_check_cache" in mermaid
    assert "n_output --> __end__" in mermaid
    with pytest.raises(flowy.UnknownNodeError, match="no node named 'nope'"):
        g.node("nope")


async def test_conditional_routing_follows_router() -> None:
    async def check(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {"path": ["check"]}, flowy.completed()

    async def heavy(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {"path": [*s["path"], "heavy"]}, flowy.completed()

    async def out(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {"path": [*s["path"], "out"]}, flowy.completed()

    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    b.add_node("check_cache", check).add_node("heavy_llm", heavy).add_node("output", out)
    b.add_conditional_edge(
        "check_cache", lambda s: "output" if s["hit"] else "heavy_llm", "output", "heavy_llm"
    )
    b.add_edge("heavy_llm", "output").allow_no_outgoing_route("output")
    runner = flowy.Runner(b.compile())
    hit = await runner.start("hit", {"hit": True})
    miss = await runner.start("miss", {"hit": False})
    assert hit.state["path"] == ["check", "out"]
    assert miss.state["path"] == ["check", "heavy", "out"]


async def test_router_returning_undeclared_target_fails_clearly() -> None:
    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    b.add_node("a", ok).add_node("b", ok).allow_no_outgoing_route("b")
    b.add_conditional_edge("a", lambda s: "c", "b")
    cp: MemoryCheckpointer[State] = MemoryCheckpointer()
    result = await flowy.Runner(b.compile(), as_backend(cp)).start("t", {})
    assert result.status is flowy.RunStatus.FAILED
    assert result.reason == flowy.Reason.ROUTER_TARGET_UNDECLARED
    assert isinstance(result.error, flowy.UnknownNodeError)
    assert "'c'" in str(result.error)
    snap, _ = await cp.load("t")
    assert snap.status is flowy.RunStatus.FAILED


async def test_async_router() -> None:
    async def route(s: State) -> str:
        return "b"

    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    b.add_node("a", ok).add_node("b", ok).allow_no_outgoing_route("b")
    b.add_conditional_edge("a", route, "b")
    result = await flowy.Runner(b.compile()).start("t", {})
    assert result.status is flowy.RunStatus.COMPLETED
    assert result.execution_pointer == "b"


async def test_retry_then_route_or_fail() -> None:
    calls: list[str] = []

    async def flaky(s: State) -> tuple[State, flowy.Directive[Any]]:
        calls.append("flaky")
        return {"tries": s.get("tries", 0) + 1}, flowy.retry(3)

    async def fallback(s: State) -> tuple[State, flowy.Directive[Any]]:
        calls.append("fallback")
        return s, flowy.completed()

    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    b.add_node("flaky", flaky).add_node("fallback", fallback)
    b.add_edge("flaky", "fallback").add_retry_route("flaky", "fallback")
    b.allow_no_outgoing_route("fallback")
    result = await flowy.Runner(b.compile()).start("t", {})
    assert calls == ["flaky", "flaky", "flaky", "fallback"]
    assert result.state["tries"] == 3
    assert result.status is flowy.RunStatus.COMPLETED

    b2: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    b2.add_node("flaky", flaky).allow_no_outgoing_route("flaky")
    result2 = await flowy.Runner(b2.compile()).start("t", {})
    assert result2.status is flowy.RunStatus.FAILED
    assert result2.reason == flowy.Reason.RETRY_EXHAUSTED


def test_directive_constructors_validate() -> None:
    with pytest.raises(ValueError):
        flowy.fail("")
    with pytest.raises(ValueError):
        flowy.retry(0)
    with pytest.raises(ValueError):
        flowy.suspend("")
    with pytest.raises(TypeError):
        flowy.NoEffect()
    d = flowy.effect(flowy.suspend("x", resume_at="n"), 5)
    assert d.kind is ftypes.DirectiveKind.EFFECT and d.payload == 5
    assert d.base is not None and d.base.resume_at == "n"
