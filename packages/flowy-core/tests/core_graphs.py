"""Small graphs shared by the core tests."""

from __future__ import annotations

import itertools
from typing import Any

import flowy
from flowy import storage
from flowy.memory import MemoryConsumer, MemoryOutbox
from flowy.storage.dialect import BaseConsumer

State = dict[str, Any]


def merge(state: State, update: State) -> State:
    return {**state, **update}


def approval_graph(**compile_kw: Any) -> flowy.Graph[State, dict[str, Any]]:
    """plan → ask (suspends until approved) → act (hands off once) → done."""

    async def plan(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {"planned": True, "log": [*s.get("log", []), "plan"]}, flowy.completed()

    async def ask(s: State) -> tuple[State, flowy.Directive[Any]]:
        if s.get("approved"):
            return {"log": [*s["log"], "ask"]}, flowy.completed()
        return {}, flowy.effect(flowy.suspend("awaiting_approval"), {"kind": "approval"})

    async def act(s: State) -> tuple[State, flowy.Directive[Any]]:
        if not s.get("in_background"):
            return {"in_background": True}, flowy.handoff("to_worker")
        return {"acted": True, "log": [*s["log"], "act"]}, flowy.completed()

    async def done(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {"log": [*s["log"], "done"]}, flowy.completed()

    b: flowy.GraphBuilder[State, dict[str, Any]] = flowy.GraphBuilder(merge)
    b.add_node("plan", plan).add_node("ask", ask).add_node("act", act).add_node("done", done)
    b.add_edge("plan", "ask").add_edge("ask", "act").add_edge("act", "done")
    b.allow_no_outgoing_route("done")
    return b.compile(**compile_kw)


def linear_graph(n: int = 3, **compile_kw: Any) -> flowy.Graph[State, Any]:
    """n nodes that each count a step, the last one terminal."""
    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    names = [f"n{i}" for i in range(n)]
    for name in names:

        async def node(s: State, _name: str = name) -> tuple[State, flowy.Directive[Any]]:
            return {"visited": [*s.get("visited", []), _name]}, flowy.completed()

        b.add_node(name, node)
    for a, c in itertools.pairwise(names):
        b.add_edge(a, c)
    b.allow_no_outgoing_route(names[-1])
    return b.compile(**compile_kw)


class PlainOutbox:
    """A non-transactional outbox over a MemoryOutbox (forces the three-phase hand-off)."""

    def __init__(self, inner: MemoryOutbox) -> None:
        self.inner = inner

    async def enqueue_intent(self, intent: storage.HandoffIntent) -> None:
        await self.inner.enqueue_intent(intent)


def handoff_graph(**compile_kw: Any) -> flowy.Graph[State, Any]:
    """work (hands off to 'finish') → finish."""

    async def work(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {"worked": True}, flowy.handoff("background", resume_at="finish")

    async def finish(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {"finished": s.get("finished", 0) + 1}, flowy.completed()

    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    b.add_node("work", work).add_node("finish", finish).add_edge("work", "finish")
    b.allow_no_outgoing_route("finish")
    return b.compile(**compile_kw)


class QueuelessConsumer(MemoryConsumer):
    """A consumer written before queues (the five queue primitives left to the base)."""

    async def _claim(self, limit: int, visibility_timeout: float) -> Any:
        return await MemoryConsumer._claim_queue(self, "default", limit, visibility_timeout, 0)

    _claim_queue = BaseConsumer._claim_queue
    _set_limits = BaseConsumer._set_limits
    _read_limits = BaseConsumer._read_limits
    _queue_counts = BaseConsumer._queue_counts
    _queue_messages = BaseConsumer._queue_messages
