"""Conditional routing and a state-aware resume target.

check_cache routes to output (hit) or heavy_llm (miss); wait_user suspends for the user.
When the overlay that arrives instead of the user's answer makes the stored wait node
stale, a resume-target policy sends the run to the router.

    python examples/conditional_routing.py
"""

from __future__ import annotations

import asyncio
from typing import Any

import flowy

State = dict[str, Any]


def merge(state: State, update: State) -> State:
    return {**state, **update}


async def check_cache(state: State) -> tuple[State, flowy.Directive[flowy.NoEffect]]:
    return {"cache_hit": state["query"] in {"hello"}}, flowy.completed()


async def heavy_llm(state: State) -> tuple[State, flowy.Directive[flowy.NoEffect]]:
    return {"draft": f"long answer about {state['query']}"}, flowy.completed()


async def wait_user(state: State) -> tuple[State, flowy.Directive[flowy.NoEffect]]:
    if "user_reply" not in state:
        return {}, flowy.suspend("need_user_reply")
    return {"draft": f"{state['draft']} (+ {state['user_reply']})"}, flowy.completed()


async def router(state: State) -> tuple[State, flowy.Directive[flowy.NoEffect]]:
    return {"routed": True}, flowy.completed()


async def output(state: State) -> tuple[State, flowy.Directive[flowy.NoEffect]]:
    return {"answer": state.get("draft", "cached answer")}, flowy.completed()


def build_graph() -> flowy.Graph[State, flowy.NoEffect]:
    b = flowy.GraphBuilder[State, flowy.NoEffect](merge)
    for name, node in [
        ("check_cache", check_cache),
        ("heavy_llm", heavy_llm),
        ("wait_user", wait_user),
        ("router", router),
        ("output", output),
    ]:
        b.add_node(name, node)
    b.add_conditional_edge(
        "check_cache", lambda s: "output" if s["cache_hit"] else "heavy_llm", "output", "heavy_llm"
    )
    b.add_edge("heavy_llm", "wait_user")
    b.add_edge("wait_user", "router")
    b.add_edge("router", "output")
    b.allow_no_outgoing_route("output")
    return b.compile()


def policy(state: State, current: str) -> tuple[State, flowy.ResumePlan]:
    if current == "wait_user" and state.get("route_ready"):
        return state, flowy.resume_to("router")
    return state, flowy.resume_current()


async def main() -> None:
    runner = flowy.Runner(build_graph(), await flowy.connect("memory://"))
    hit = await runner.start("q-hit", {"query": "hello"})
    print("cache hit:", hit.status, hit.state["answer"])

    miss = await runner.start("q-miss", {"query": "tides"})
    print("cache miss:", miss.status, miss.reason, "at", miss.execution_pointer)
    assert miss.resume_token is not None
    done = await runner.resume(
        miss.resume_token, state_overlay={"route_ready": True}, resume_target_policy=policy
    )
    print("resumed via policy:", done.status, done.state["answer"], "routed:", done.state["routed"])


if __name__ == "__main__":
    asyncio.run(main())
