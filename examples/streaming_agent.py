"""A streaming agent with typed effects: events as they happen, the result as truth.

python examples/streaming_agent.py
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import flowy

State = dict[str, Any]


@dataclass(frozen=True)
class ToolCall:
    tool: str
    argument: str


def merge(state: State, update: State) -> State:
    return {**state, **update}


async def reason(state: State) -> tuple[State, flowy.Directive[ToolCall]]:
    pending = [q for q in state["questions"] if q not in state.get("answers", {})]
    if not pending:
        return {}, flowy.completed()
    call = ToolCall("search", pending[0])
    return {"next": pending[0]}, flowy.effect(flowy.completed(), call)


async def act(state: State) -> tuple[State, flowy.Directive[ToolCall]]:
    answers = dict(state.get("answers", {}))
    answers[state["next"]] = f"result for {state['next']}"
    return {"answers": answers}, flowy.completed()


async def finish(state: State) -> tuple[State, flowy.Directive[ToolCall]]:
    return {"summary": "; ".join(state["answers"].values())}, flowy.completed()


def build_graph() -> flowy.Graph[State, ToolCall]:
    b = flowy.GraphBuilder[State, ToolCall](merge)
    b.add_node("reason", reason).add_node("act", act).add_node("finish", finish)
    b.add_conditional_edge(
        "reason",
        lambda s: "act" if len(s.get("answers", {})) < len(s["questions"]) else "finish",
        "act",
        "finish",
    )
    b.add_edge("act", "reason")
    b.allow_no_outgoing_route("finish")
    return b.compile()


async def main() -> None:
    runner = flowy.Runner(build_graph(), await flowy.connect("memory://"))
    handle = await runner.stream("agent-1", {"questions": ["tides", "moon"]})
    async for event in handle:
        if event.type is flowy.EventType.EFFECT and event.effect is not None:
            print(f"step {event.step}: effect {event.effect.tool}({event.effect.argument!r})")
        elif event.terminal:
            print(f"terminal event: {event.type} reason={event.reason}")
    result = await handle.wait_result()
    print("result:", result.status, result.reason, len(result.effects), "effects")
    print("summary:", result.state["summary"])


if __name__ == "__main__":
    asyncio.run(main())
