"""Runner-level contracts of supersteps on a real store: fan-out and parallel edges
fold their branches in branch order, save one checkpoint per superstep, count every
branch as a step, and run a finished branch once even when the superstep runs again.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..._context import use_budget
from ..._directives import Directive, completed, end, fail, fan_out, suspend
from ..._graph import Graph, GraphBuilder
from ..._runner import Runner
from ...storage import Backend, RunStatus
from ._support import Suite, history_revisions, new_thread_id

__all__ = ["FanOutSuite"]

State = dict[str, Any]


def _merge(state: State, update: State) -> State:
    """Lists append, everything else replaces (so a double fold shows)."""
    merged = dict(state)
    for key, value in update.items():
        merged[key] = [*state.get(key, []), *value] if isinstance(value, list) else value
    return merged


class _Graders:
    """Branch nodes that record their calls, how many ran at once, and can fail or
    suspend on cue."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.running = 0
        self.most = 0

    async def grade(self, s: State) -> tuple[State, Directive[Any]]:
        draft = s["draft"]
        self.calls.append(draft)
        self.running += 1
        self.most = max(self.most, self.running)
        # The later drafts finish first: folding must not follow completion order.
        await asyncio.sleep(0.05 / (1 + int(draft[1:])))
        self.running -= 1
        use_budget("grades")
        if draft in s.get("fail", []):
            return {}, fail("unreadable")
        if draft in s.get("hold", []) and not s.get("released"):
            return {}, suspend("needs_a_human")
        return {"grades": [f"{draft}=ok"]}, completed()

    def graph(self, *, concurrency: int | None = None) -> Graph[State, Any]:
        async def plan(s: State) -> tuple[State, Directive[Any]]:
            items = [{"draft": d} for d in s["drafts"]]
            return {"planned": [len(items)]}, fan_out("grade", items, concurrency=concurrency)

        async def pick(s: State) -> tuple[State, Directive[Any]]:
            return {"best": s["grades"][0]}, end()

        builder: GraphBuilder[State, Any] = GraphBuilder(_merge)
        return (
            builder.add_node("plan", plan)
            .add_node("grade", self.grade)
            .add_node("pick", pick)
            .add_edge("plan", "pick")
            .add_fan_out("plan", "grade", then="pick")
            .allow_no_outgoing_route("pick")
            .compile(budgets={"grades": 50})
        )


DRAFTS = ["d1", "d2", "d3", "d4", "d5"]


class FanOutSuite(Suite):
    """Supersteps: deterministic folds, bounded concurrency, one checkpoint, durable
    branches."""

    async def test_branches_fold_in_branch_order_with_one_checkpoint(
        self, flowy_backend: Backend[Any]
    ) -> None:
        graders = _Graders()
        runner = Runner(graders.graph(concurrency=2), flowy_backend)
        tid = new_thread_id("fanout")
        result = await runner.start(tid, {"drafts": DRAFTS})
        assert result.status is RunStatus.COMPLETED, result
        assert result.state["grades"] == [f"{d}=ok" for d in DRAFTS]  # never finish order
        assert sorted(graders.calls) == DRAFTS and graders.most == 2
        assert result.total_steps == 1 + len(DRAFTS) + 1  # every branch is a step
        assert result.budget_counts == {"grades": len(DRAFTS)}
        # plan + its superstep: one save; pick: one save (the end).
        assert await history_revisions(flowy_backend.checkpointer, tid) == [2, 1]

    async def test_a_parallel_edge_runs_its_branches_on_the_same_state(
        self, flowy_backend: Backend[Any]
    ) -> None:
        async def start(s: State) -> tuple[State, Directive[Any]]:
            return {"log": ["start"]}, completed()

        def branch(name: str) -> Any:
            async def node(s: State) -> tuple[State, Directive[Any]]:
                await asyncio.sleep(0.01 * (3 - len(s["log"])))
                return {"log": [f"{name} saw {len(s['log'])}"]}, completed()

            return node

        async def join(s: State) -> tuple[State, Directive[Any]]:
            return {"log": ["join"]}, end()

        builder: GraphBuilder[State, Any] = GraphBuilder(_merge)
        graph = (
            builder.add_node("start", start)
            .add_node("search", branch("search"))
            .add_node("lookup", branch("lookup"))
            .add_node("join", join)
            .add_parallel_edge("start", ["search", "lookup"], then="join")
            .allow_no_outgoing_route("join")
            .compile()
        )
        result = await Runner(graph, flowy_backend).start(new_thread_id("parallel"), {})
        assert result.state["log"] == ["start", "search saw 1", "lookup saw 1", "join"]

    async def test_a_failing_branch_fails_the_superstep(self, flowy_backend: Backend[Any]) -> None:
        graders = _Graders()
        runner = Runner(graders.graph(), flowy_backend)
        result = await runner.start(new_thread_id("fail"), {"drafts": DRAFTS, "fail": ["d3"]})
        assert result.status is RunStatus.FAILED
        assert result.reason == "branch_failed:grade:unreadable"

    async def test_a_suspended_branch_waits_for_the_others_and_reruns_alone(
        self, flowy_backend: Backend[Any]
    ) -> None:
        graders = _Graders()
        runner = Runner(graders.graph(), flowy_backend)
        tid = new_thread_id("hold")
        held = await runner.start(tid, {"drafts": DRAFTS, "hold": ["d2"]})
        assert held.status is RunStatus.SUSPENDED and held.reason == "needs_a_human"
        assert held.execution_pointer == "plan" and "grades" not in held.state
        assert sorted(graders.calls) == DRAFTS
        assert held.resume_token is not None
        done = await runner.resume(held.resume_token, state_overlay={"released": True})
        assert done.status is RunStatus.COMPLETED, done
        assert done.state["grades"] == [f"{d}=ok" for d in DRAFTS]  # each folded once
        assert sorted(graders.calls) == sorted([*DRAFTS, "d2"])  # only d2 ran again

    async def test_an_undeclared_fan_out_fails(self, flowy_backend: Backend[Any]) -> None:
        async def rogue(s: State) -> tuple[State, Directive[Any]]:
            return {}, fan_out("rogue", [1])

        builder: GraphBuilder[State, Any] = GraphBuilder(_merge)
        graph = builder.add_node("rogue", rogue).allow_no_outgoing_route("rogue").compile()
        result = await Runner(graph, flowy_backend).start(new_thread_id("rogue"), {})
        assert result.status is RunStatus.FAILED and result.reason == "fan_out_undeclared"
