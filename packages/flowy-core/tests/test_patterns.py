"""The ready-made patterns with a scripted model: a supervisor routing to a node and a
sub-agent graph under a turn budget, and an evaluator-optimizer loop that stops on
acceptance or after its rounds."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest

import flowy
from flowy.memory import MemoryBackend
from flowy.patterns import FINISH, build_evaluator_optimizer, build_supervisor

pytestmark = pytest.mark.anyio


@dataclass
class Task:
    goal: str
    plan: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    turns: int = 0


def merge(state: Task, update: Task) -> Task:
    return update


class ScriptedSupervisor:
    """Decides from a script: research first, then write, then finish."""

    def __init__(self, script: list[str]) -> None:
        self.script = script

    async def __call__(self, state: Task) -> tuple[Task, flowy.Directive[Any]]:
        nxt = self.script[state.turns] if state.turns < len(self.script) else FINISH
        return replace(state, plan=[*state.plan, nxt], turns=state.turns + 1), flowy.completed()


def researcher() -> flowy.Graph[Task, Any]:
    async def search(s: Task) -> tuple[Task, flowy.Directive[Any]]:
        return replace(s, notes=[*s.notes, f"found sources on {s.goal}"]), flowy.completed()

    async def read(s: Task) -> tuple[Task, flowy.Directive[Any]]:
        return replace(s, notes=[*s.notes, "read 2 papers"]), flowy.completed()

    builder: flowy.GraphBuilder[Task, Any] = flowy.GraphBuilder(merge, state=Task)
    return (
        builder.add_node("search", search)
        .add_node("read", read)
        .add_edge("search", "read")
        .allow_no_outgoing_route("read")
        .compile()
    )


async def writer(s: Task) -> tuple[Task, flowy.Directive[Any]]:
    return replace(s, notes=[*s.notes, f"drafted: {s.goal}"]), flowy.completed()


def supervisor_graph(script: list[str], max_turns: int = 5) -> flowy.Graph[Task, Any]:
    return build_supervisor(
        ScriptedSupervisor(script),
        {"research": researcher(), "write": writer},
        lambda s: s.plan[-1],
        max_turns,
        reducer=merge,
    ).compile()


async def test_the_supervisor_routes_to_a_sub_agent_and_a_worker_then_finishes() -> None:
    runner = flowy.Runner(supervisor_graph(["research", "write"]), MemoryBackend[Task]())
    async with runner.stream("t", Task("durable agents")) as handle:
        nodes = [e.node async for e in handle if e.type is flowy.EventType.NODE_STARTED]
    result = await handle.wait_result()
    assert result.status is flowy.RunStatus.COMPLETED
    assert result.state.notes == [
        "found sources on durable agents",
        "read 2 papers",
        "drafted: durable agents",
    ]
    assert nodes == [
        "supervisor", "research/search", "research/read", "supervisor", "write", "supervisor",
        "finish",
    ]  # fmt: skip
    assert result.budget_counts == {"supervisor_turns": 3}


async def test_the_supervisor_is_bounded_by_its_turns() -> None:
    graph = supervisor_graph(["write"] * 10, max_turns=3)
    result = await flowy.Runner(graph, MemoryBackend[Task]()).start("t", Task("loop"))
    assert result.status is flowy.RunStatus.FAILED
    assert result.reason == "budget_exceeded:supervisor_turns"


def test_the_supervisor_refuses_bad_workers() -> None:
    with pytest.raises(ValueError, match="at least one worker"):
        build_supervisor(ScriptedSupervisor([]), {}, lambda s: FINISH, 3)
    with pytest.raises(ValueError, match="may not be named"):
        build_supervisor(ScriptedSupervisor([]), {"finish": writer}, lambda s: FINISH, 3)
    with pytest.raises(ValueError, match="max_turns"):
        build_supervisor(ScriptedSupervisor([]), {"write": writer}, lambda s: FINISH, 0)


@dataclass
class Essay:
    topic: str
    draft: str = ""
    score: int = 0
    feedback: str = ""
    drafts: int = 0


async def generate(s: Essay) -> tuple[Essay, flowy.Directive[Any]]:
    """A scripted writer: each revision addresses the feedback and scores higher."""
    text = f"{s.topic}, revision {s.drafts + 1}" + (f" ({s.feedback})" if s.feedback else "")
    return replace(s, draft=text, drafts=s.drafts + 1), flowy.completed()


async def evaluate(s: Essay) -> tuple[Essay, flowy.Directive[Any]]:
    """A scripted grader: 3 points per revision, with feedback below 8."""
    score = 3 * s.drafts
    feedback = "" if score >= 8 else "add an example"
    return replace(s, score=score, feedback=feedback), flowy.completed()


def essay_graph(max_rounds: int) -> flowy.Graph[Essay, Any]:
    return build_evaluator_optimizer(
        generate, evaluate, lambda s: s.score >= 8, max_rounds, reducer=lambda s, u: u
    ).compile()


async def test_the_optimizer_revises_until_the_evaluation_accepts() -> None:
    result = await flowy.Runner(essay_graph(5), MemoryBackend[Essay]()).start(
        "t", Essay("durable state")
    )
    assert result.status is flowy.RunStatus.COMPLETED
    assert (result.state.drafts, result.state.score) == (3, 9)
    assert result.state.draft == "durable state, revision 3 (add an example)"
    assert result.budget_counts == {"optimizer_rounds": 3}


async def test_the_optimizer_stops_after_its_rounds_with_the_last_draft() -> None:
    result = await flowy.Runner(essay_graph(2), MemoryBackend[Essay]()).start("t", Essay("budgets"))
    assert result.status is flowy.RunStatus.COMPLETED
    assert (result.state.drafts, result.state.score) == (2, 6)
    with pytest.raises(ValueError, match="max_rounds"):
        build_evaluator_optimizer(generate, evaluate, lambda s: True, 0)
