"""Subgraphs in the engine, beyond the suite: a stop requested while a child node runs
saves the run inside the subgraph (the resume goes on there), and budgets and step
limits count the child's steps."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import flowy
from flowy.memory import MemoryBackend

pytestmark = pytest.mark.anyio

State = dict[str, Any]


def merge(state: State, update: State) -> State:
    return {**state, **update}


def child_graph(
    calls: list[str], gate: asyncio.Event, started: asyncio.Event | None = None
) -> flowy.Graph[State, Any]:
    async def first(s: State) -> tuple[State, flowy.Directive[Any]]:
        calls.append("first")
        flowy.use_budget("work")
        return {"first": True}, flowy.completed()

    async def slow(s: State) -> tuple[State, flowy.Directive[Any]]:
        calls.append("slow")
        flowy.use_budget("work")
        if started is not None:
            started.set()
        await gate.wait()
        return {"slow": True}, flowy.completed()

    builder: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    return (
        builder.add_node("first", first)
        .add_node("slow", slow)
        .add_edge("first", "slow")
        .allow_no_outgoing_route("slow")
        .compile()
    )


def parent_graph(child: flowy.Graph[State, Any], **compile_kw: Any) -> flowy.Graph[State, Any]:
    async def done(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {"done": True}, flowy.end()

    builder: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    return (
        builder.add_subgraph("inner", child)
        .add_node("done", done)
        .add_edge("inner", "done")
        .allow_no_outgoing_route("done")
        .compile(**compile_kw)
    )


async def test_a_stop_inside_a_subgraph_saves_there_and_the_resume_goes_on() -> None:
    calls: list[str] = []
    gate, started = asyncio.Event(), asyncio.Event()
    graph = parent_graph(child_graph(calls, gate, started))
    runner = flowy.Runner(graph, MemoryBackend[State]())
    handle = await runner.stream("t", {})
    await started.wait()
    handle.request_stop()
    stopped = await handle.wait_result()
    assert stopped.status is flowy.RunStatus.CANCELED, stopped
    head, token = await runner.head("t")
    assert head.execution_pointer == "inner" and head.nested["pointer"] == "slow"
    assert head.nested["state"] == {"first": True}
    gate.set()
    done = await runner.resume(token)
    assert done.status is flowy.RunStatus.COMPLETED and done.state["slow"] and done.state["done"]
    assert calls == ["first", "slow", "slow"]  # first never ran again


async def test_a_budget_is_counted_inside_a_subgraph() -> None:
    calls: list[str] = []
    gate = asyncio.Event()
    gate.set()
    graph = parent_graph(child_graph(calls, gate), budgets={"work": 1})
    result = await flowy.Runner(graph, MemoryBackend[State]()).start("t", {})
    assert result.status is flowy.RunStatus.FAILED
    assert result.reason == "budget_exceeded:work" and calls == ["first", "slow"]


async def test_step_limits_count_the_childs_steps() -> None:
    gate = asyncio.Event()
    gate.set()
    graph = parent_graph(child_graph([], gate), max_steps=2)
    result = await flowy.Runner(graph, MemoryBackend[State]()).start("t", {})
    assert result.status is flowy.RunStatus.FAILED and result.reason == "max_steps_exceeded"


async def test_a_router_that_raises_inside_fails_the_run_like_any_router() -> None:
    async def step(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {}, flowy.completed()

    def broken_router(s: State) -> str:
        raise RuntimeError("router down")

    builder: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    child = (
        builder.add_node("a", step)
        .add_node("b", step)
        .add_conditional_edge("a", broken_router, "b")
        .allow_no_outgoing_route("b")
        .compile()
    )
    result = await flowy.Runner(parent_graph(child), MemoryBackend[State]()).start("t", {})
    assert result.status is flowy.RunStatus.FAILED and result.reason == "router_error"
    assert isinstance(result.error, RuntimeError)
