"""Real LangGraph graphs on FlowySaver give what they give on LangGraph's own
``InMemorySaver``: a subgraph that interrupts, a resume with ``Command``, a new input,
``update_state``; fenced or not. Time travel (a run from an older checkpoint) works
unfenced and is refused fenced."""

from __future__ import annotations

import contextlib
import operator
from collections.abc import AsyncIterator
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from lg_support import STORES

from flowy_langgraph import FlowySaver, ThreadForkedError

pytestmark = pytest.mark.anyio


class State(TypedDict):
    messages: Annotated[list[str], operator.add]


def build() -> Any:
    async def inner(state: State) -> dict[str, list[str]]:
        return {"messages": ["inner"]}

    async def ask(state: State) -> dict[str, list[str]]:
        answer = interrupt("question?")
        return {"messages": [f"answer {answer}"]}

    async def outer(state: State) -> dict[str, list[str]]:
        return {"messages": ["outer"]}

    sub = StateGraph(State)
    sub.add_node("inner", inner)
    sub.add_node("ask", ask)
    sub.add_edge(START, "inner")
    sub.add_edge("inner", "ask")
    sub.add_edge("ask", END)
    main = StateGraph(State)
    main.add_node("outer", outer)
    main.add_node("sub", sub.compile())
    main.add_edge(START, "outer")
    main.add_edge("outer", "sub")
    main.add_edge("sub", END)
    return main


async def story(saver: BaseCheckpointSaver[Any]) -> list[Any]:
    graph = build().compile(checkpointer=saver)
    thread: Any = {"configurable": {"thread_id": "story"}}
    seen: list[Any] = []
    for step in ({"messages": ["hi"]}, Command(resume="42"), {"messages": ["again"]}):
        result = await graph.ainvoke(step, thread)
        seen.append((result["messages"], [i.value for i in result.get("__interrupt__", [])]))
    state = await graph.aget_state(thread, subgraphs=True)
    seen.append((state.next, [t.name for t in state.tasks]))
    await graph.aupdate_state(thread, {"messages": ["edited"]})
    seen.append((await graph.aget_state(thread)).values["messages"])
    seen.append(len([t async for t in saver.alist(None)]))
    return seen


@contextlib.asynccontextmanager
async def stock() -> AsyncIterator[BaseCheckpointSaver[Any]]:
    yield InMemorySaver()


@pytest.mark.parametrize("store_url", STORES, indirect=True)
@pytest.mark.parametrize("fenced", [False, True], ids=["unfenced", "fenced"])
async def test_a_graph_runs_as_on_langgraphs_own_saver(store_url: str, fenced: bool) -> None:
    async with stock() as saver:
        expected = await story(saver)
    async with FlowySaver.from_url(store_url, fenced=fenced) as saver:
        assert await story(saver) == expected


@pytest.mark.parametrize("store_url", ["memory", "sqlite"], indirect=True)
async def test_time_travel_is_refused_fenced_only(store_url: str) -> None:
    thread: Any = {"configurable": {"thread_id": "travel"}}
    async with FlowySaver.from_url(store_url) as saver:
        graph = build().compile(checkpointer=saver)
        await graph.ainvoke({"messages": ["hi"]}, thread)
        await graph.ainvoke(Command(resume="1"), thread)
        history = [s async for s in graph.aget_state_history(thread)]
        older = history[-2].config  # the input checkpoint of the first run
        replay = await graph.ainvoke(None, older)
        assert replay["messages"][:2] == ["hi", "outer"]
    async with FlowySaver.from_url(store_url, fenced=True) as saver:
        graph = build().compile(checkpointer=saver)
        with pytest.raises(ThreadForkedError, match="moved on since this run read it"):
            await graph.ainvoke(None, older)
