"""Ready-made agentic graph shapes."""

from __future__ import annotations

from collections.abc import Callable

from ._context import use_budget
from ._directives import completed
from ._graph import GraphBuilder, Node, Reducer
from ._types import E, S

__all__ = ["build_react"]


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
