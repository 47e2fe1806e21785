"""Runner-level contracts of subgraphs on a real store: a compiled graph used as a node
runs to its end and folds back; a suspend, hand-off or wait inside pauses the whole run
at a nested pointer saved with the snapshot, and the resume continues inside.
"""

from __future__ import annotations

from typing import Any

from ..._directives import Directive, completed, end, handoff, suspend, wait_for
from ..._events import EventType
from ..._graph import Graph, GraphBuilder
from ..._runner import Runner
from ..._worker import Worker
from ...storage import Backend, RunStatus
from ._support import Suite, new_thread_id, require_capability

__all__ = ["SubgraphSuite"]

State = dict[str, Any]


def _merge(state: State, update: State) -> State:
    return {**state, **update}


def _research(calls: list[str], *, pause: str = "") -> Graph[State, Any]:
    """Search → check (pauses as ``pause`` says, once) → summarize."""

    async def search(s: State) -> tuple[State, Directive[Any]]:
        calls.append("search")
        return {"hits": [f"{s['q']}-1", f"{s['q']}-2"]}, completed()

    async def check(s: State) -> tuple[State, Directive[Any]]:
        calls.append("check")
        if pause == "suspend" and not s.get("resumed"):
            return {"resumed": True}, suspend("needs_a_look")
        if pause == "handoff" and not s.get("resumed"):
            return {"resumed": True}, handoff("to_worker")
        if pause == "wait" and not s.get("ok"):
            return {}, wait_for("source_ok", timeout=3600)
        return {}, completed()

    async def summarize(s: State) -> tuple[State, Directive[Any]]:
        calls.append("summarize")
        return {"summary": "+".join(s["hits"])}, completed()

    builder: GraphBuilder[State, Any] = GraphBuilder(_merge)
    return (
        builder.add_node("search", search)
        .add_node("check", check)
        .add_node("summarize", summarize)
        .add_edge("search", "check")
        .add_edge("check", "summarize")
        .allow_no_outgoing_route("summarize")
        .on_signal("source_ok", lambda s, p: {**s, "ok": p})
        .compile()
    )


def _agent(child: Graph[State, Any]) -> Graph[State, Any]:
    async def ask(s: State) -> tuple[State, Directive[Any]]:
        return {"q": s["topic"]}, completed()

    async def answer(s: State) -> tuple[State, Directive[Any]]:
        return {"answer": s["research"]}, end()

    builder: GraphBuilder[State, Any] = GraphBuilder(_merge)
    return (
        builder.add_node("ask", ask)
        .add_subgraph(
            "research",
            child,
            enter=lambda s: {"q": s["q"]},
            leave=lambda s, c: {"research": c["summary"]},
        )
        .add_node("answer", answer)
        .add_edge("ask", "research")
        .add_edge("research", "answer")
        .allow_no_outgoing_route("answer")
        .compile()
    )


class SubgraphSuite(Suite):
    """Subgraphs: run inside, pause inside at a nested pointer, resume inside."""

    async def test_a_subgraph_runs_and_folds_back_with_paths_on_its_events(
        self, flowy_backend: Backend[Any]
    ) -> None:
        calls: list[str] = []
        runner = Runner(_agent(_research(calls)), flowy_backend)
        async with runner.stream(new_thread_id("sub"), {"topic": "flowy"}) as handle:
            nodes = [e.node async for e in handle if e.type is EventType.NODE_STARTED]
        result = await handle.wait_result()
        assert result.status is RunStatus.COMPLETED
        assert result.state["answer"] == "flowy-1+flowy-2" and "hits" not in result.state
        assert nodes == ["ask", "research/search", "research/check", "research/summarize", "answer"]
        assert result.total_steps == 5

    async def test_a_suspend_inside_pauses_the_run_and_the_resume_continues_inside(
        self, flowy_backend: Backend[Any]
    ) -> None:
        calls: list[str] = []
        runner = Runner(_agent(_research(calls, pause="suspend")), flowy_backend)
        tid = new_thread_id("subsusp")
        paused = await runner.start(tid, {"topic": "q"})
        assert paused.status is RunStatus.SUSPENDED and paused.execution_pointer == "research"
        head, _ = await runner.head(tid)
        assert head.nested["node"] == "research" and head.nested["pointer"] == "check"
        assert head.nested["state"] == {"q": "q", "hits": ["q-1", "q-2"], "resumed": True}
        assert paused.resume_token is not None
        done = await runner.resume(paused.resume_token)
        assert done.status is RunStatus.COMPLETED and done.state["answer"] == "q-1+q-2"
        assert calls == ["search", "check", "check", "summarize"]  # never search again
        assert (await runner.head(tid))[0].nested == {}

    async def test_a_hand_off_inside_is_continued_by_a_worker(
        self, flowy_backend: Backend[Any]
    ) -> None:
        calls: list[str] = []
        runner = Runner(_agent(_research(calls, pause="handoff")), flowy_backend)
        tid = new_thread_id("subhand")
        handed = await runner.start(tid, {"topic": "h"})
        assert handed.status is RunStatus.HANDOFF and handed.execution_pointer == "research"
        await Worker(runner).run_until_idle(0.2)
        head, _ = await runner.head(tid)
        assert head.status is RunStatus.COMPLETED and head.state["answer"] == "h-1+h-2"
        assert calls.count("search") == 1

    async def test_a_signal_reaches_a_wait_inside(self, flowy_backend: Backend[Any]) -> None:
        require_capability(flowy_backend, "durable_timers_signals")
        calls: list[str] = []
        runner = Runner(_agent(_research(calls, pause="wait")), flowy_backend)
        tid = new_thread_id("subwait")
        waiting = await runner.start(tid, {"topic": "w"})
        assert waiting.status is RunStatus.WAITING
        head, _ = await runner.head(tid)
        assert head.waiting_for == "source_ok" and head.nested["pointer"] == "check"
        await runner.signal(tid, "source_ok", True)
        await Worker(runner).run_until_idle(0.2)
        head, _ = await runner.head(tid)
        assert head.status is RunStatus.COMPLETED and head.state["answer"] == "w-1+w-2"
        assert "ok" not in head.state  # the payload went to the subgraph's state
