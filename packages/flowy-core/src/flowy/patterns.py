"""Ready-made agentic graph shapes: a ReAct loop, a supervisor over workers (nodes or
sub-agents), and an evaluator-optimizer loop. Each returns a ``GraphBuilder`` so you can
add nodes, routes or budgets before ``compile()``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

from ._context import budget_used, use_budget
from ._directives import completed
from ._graph import Graph, GraphBuilder, Node, Reducer
from ._types import E, S

__all__ = ["FINISH", "build_evaluator_optimizer", "build_react", "build_supervisor"]

FINISH = "finish"
"""What a supervisor's ``choose`` returns when the work is done."""


def build_react(
    reason_node: Node[S, E],
    action_node: Node[S, E],
    has_pending: Callable[[S], bool],
    max_iterations: int,
    *,
    reducer: Reducer[S] | None = None,
    reason_name: str = "reason",
    action_name: str = "act",
    finish_name: str = "finish",
) -> GraphBuilder[S, E]:
    """A ReAct loop: ``reason`` → (``act`` → ``reason``)* → ``finish``.

    After ``reason``, the run goes to ``act`` while ``has_pending(state)`` (a tool call is
    waiting) and to ``finish`` otherwise. ``max_iterations`` bounds the reason/act
    iterations through the named budget ``"react_iterations"`` (exceeding it fails the
    run with ``budget_exceeded:react_iterations``). Returns the builder so callers can
    add nodes or budgets before ``compile()``.
    """
    if max_iterations < 1:
        raise ValueError(f"max_iterations must be >= 1, got {max_iterations!r}")

    async def reason(state: S) -> tuple[S, object]:
        use_budget("react_iterations")
        return await reason_node(state)

    async def finish(state: S) -> tuple[S, object]:
        return state, completed()

    def route(state: S) -> str:
        return action_name if has_pending(state) else finish_name

    builder: GraphBuilder[S, E] = GraphBuilder(reducer)
    builder.add_node(reason_name, reason)  # pyright: ignore[reportArgumentType]
    builder.add_node(action_name, action_node)
    builder.add_node(finish_name, finish)  # pyright: ignore[reportArgumentType]
    builder.add_conditional_edge(reason_name, route, action_name, finish_name)
    builder.add_edge(action_name, reason_name)
    builder.allow_no_outgoing_route(finish_name)
    builder.add_budget("react_iterations", max_iterations)
    return builder


def build_supervisor(
    supervisor: Node[S, E],
    workers: Mapping[str, Node[S, E] | Graph[Any, Any]],
    choose: Callable[[S], str],
    max_turns: int,
    *,
    reducer: Reducer[S] | None = None,
    supervisor_name: str = "supervisor",
    finish_name: str = FINISH,
) -> GraphBuilder[S, E]:
    """A supervisor that routes to workers: ``supervisor`` → one worker → ``supervisor``
    → … → ``finish``.

    After each supervisor step, ``choose(state)`` names the worker to run next, or
    returns ``FINISH``. A worker is a node, or a compiled graph run as a sub-agent
    (``GraphBuilder.add_subgraph``: it gets the state as it is and its final state is
    folded back with the reducer). ``max_turns`` bounds the supervisor's turns through
    the named budget ``"supervisor_turns"`` (more fails the run with
    ``budget_exceeded:supervisor_turns``).

    Raises:
        ValueError: no workers, a worker named like the supervisor or ``finish``, or
            ``max_turns`` below 1.
    """
    if max_turns < 1:
        raise ValueError(f"max_turns must be >= 1, got {max_turns!r}")
    if not workers:
        raise ValueError("build_supervisor needs at least one worker")
    clash = {supervisor_name, finish_name} & set(workers)
    if clash:
        raise ValueError(f"workers may not be named {sorted(clash)}")

    async def supervise(state: S) -> tuple[S, object]:
        use_budget("supervisor_turns")
        return await supervisor(state)

    async def finish(state: S) -> tuple[S, object]:
        return state, completed()

    def route(state: S) -> str:
        chosen = choose(state)
        return finish_name if chosen == FINISH else chosen

    builder: GraphBuilder[S, E] = GraphBuilder(reducer)
    builder.add_node(supervisor_name, supervise)  # pyright: ignore[reportArgumentType]
    for name, worker in workers.items():
        if isinstance(worker, Graph):
            builder.add_subgraph(name, cast("Graph[Any, Any]", worker))
        else:
            builder.add_node(name, worker)
        builder.add_edge(name, supervisor_name)
    builder.add_node(finish_name, finish)  # pyright: ignore[reportArgumentType]
    builder.add_conditional_edge(supervisor_name, route, *workers, finish_name)
    builder.allow_no_outgoing_route(finish_name)
    builder.add_budget("supervisor_turns", max_turns)
    return builder


def build_evaluator_optimizer(
    generate: Node[S, E],
    evaluate: Node[S, E],
    accept: Callable[[S], bool],
    max_rounds: int,
    *,
    reducer: Reducer[S] | None = None,
    generate_name: str = "generate",
    evaluate_name: str = "evaluate",
    finish_name: str = "finish",
) -> GraphBuilder[S, E]:
    """Generate, grade, revise: ``generate`` → ``evaluate`` → (``generate`` →
    ``evaluate``)* → ``finish``.

    After each evaluation the run finishes if ``accept(state)``, or once ``max_rounds``
    generations were made (counted in the named budget ``"optimizer_rounds"``, kept
    across resumes), with the last draft in the state; otherwise ``generate`` runs again
    and revises, reading the evaluation from the state.

    Raises:
        ValueError: ``max_rounds`` below 1.
    """
    if max_rounds < 1:
        raise ValueError(f"max_rounds must be >= 1, got {max_rounds!r}")

    async def generate_round(state: S) -> tuple[S, object]:
        use_budget("optimizer_rounds")
        return await generate(state)

    async def finish(state: S) -> tuple[S, object]:
        return state, completed()

    def route(state: S) -> str:
        if accept(state) or budget_used("optimizer_rounds") >= max_rounds:
            return finish_name
        return generate_name

    builder: GraphBuilder[S, E] = GraphBuilder(reducer)
    builder.add_node(generate_name, generate_round)  # pyright: ignore[reportArgumentType]
    builder.add_node(evaluate_name, evaluate)
    builder.add_node(finish_name, finish)  # pyright: ignore[reportArgumentType]
    builder.add_edge(generate_name, evaluate_name)
    builder.add_conditional_edge(evaluate_name, route, generate_name, finish_name)
    builder.allow_no_outgoing_route(finish_name)
    builder.add_budget("optimizer_rounds", max_rounds)
    return builder
