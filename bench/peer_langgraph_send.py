"""Peer comparison (optional): a fan-out of 10 branches with LangGraph's ``Send``
against ``flowy.fan_out`` on the same work, no store, in interleaved rounds of one
process.

Both graphs: ``plan`` sends the same 10 items to ``grade`` (the node of
``bench/engine.py``'s fan-out row), whose updates are folded into a ``scores`` list,
then the run ends. LangGraph runs its compiled ``StateGraph`` with ``ainvoke`` and no
checkpointer; flowy a ``Runner`` without a store. Medians per run.

It runs only where ``langgraph`` is importable, which flowy's environment does not
install (it is no dependency of the project). To include it:

    python -m venv /tmp/peer
    /tmp/peer/bin/pip install -e packages/flowy-core langgraph
    /tmp/peer/bin/python bench/peer_langgraph_send.py
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import importlib.util
import itertools
import operator
import time
from typing import Annotated, Any, TypedDict

import _common as c
from engine import BRANCHES, fan_out_graph, grade

import flowy

ID = "peer.langgraph_send"
WHAT = f"peer: fan-out of {BRANCHES} branches, flowy vs LangGraph `Send` (no store)"
HOW = (
    "peer comparison skipped: langgraph is not importable here; to include it, run "
    "bench/peer_langgraph_send.py from a venv that has it (see its docstring)"
)


class GradeState(TypedDict, total=False):
    """LangGraph's state: the branch's item, and the scores every branch adds to."""

    item: str
    scores: Annotated[list[int], operator.add]


def langgraph_graph() -> Any:
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import Send

    async def plan(state: GradeState) -> dict[str, Any]:
        return {}

    def send(state: GradeState) -> list[Any]:
        return [Send("grade", {"item": f"draft-{i}"}) for i in range(BRANCHES)]

    async def grade_node(state: GradeState) -> dict[str, Any]:
        update, _directive = await grade({"item": state["item"]})
        return update

    builder: Any = StateGraph(GradeState)
    builder.add_node("plan", plan)
    builder.add_node("grade", grade_node)
    builder.add_edge(START, "plan")
    builder.add_conditional_edges("plan", send, ["grade"])
    builder.add_edge("grade", END)
    return builder.compile()


async def measure(args: argparse.Namespace) -> list[c.Row]:
    peer = langgraph_graph()
    runner = flowy.Runner(fan_out_graph())
    ids = itertools.count()
    per_sample = 20 if args.quick else 200

    async def with_langgraph(_: int) -> float:
        started = time.perf_counter()
        for _ in range(per_sample):
            out = await peer.ainvoke({"scores": []})
            assert len(out["scores"]) == BRANCHES, out
        return (time.perf_counter() - started) / per_sample

    async def with_flowy(_: int) -> float:
        started = time.perf_counter()
        for _ in range(per_sample):
            result = await runner.start(f"fan-{next(ids)}", {})
            assert len(result.state["scores"]) == BRANCHES, result
        return (time.perf_counter() - started) / per_sample

    rounds = 5 if args.quick else 31
    samples = await c.interleave({"langgraph": with_langgraph, "flowy": with_flowy}, rounds)
    m = {k: c.median(v) for k, v in samples.items()}
    version = importlib.metadata.version("langgraph")
    print(
        f"fan-out of {BRANCHES} branches: flowy {c.us(m['flowy'])}, LangGraph {version} Send "
        f"{c.us(m['langgraph'])}, ratio flowy/LangGraph {m['flowy'] / m['langgraph']:.2f}x"
    )
    return [
        c.Row(
            ID,
            f"{WHAT} (langgraph {version})",
            c.us(m["flowy"]),
            f"LangGraph {c.us(m['langgraph'])}",
            m["flowy"] / m["langgraph"],
            "—",
            "info",
            {"flowy": m["flowy"], "baseline": m["langgraph"]},
        )
    ]


async def main(args: argparse.Namespace) -> list[c.Row]:
    if importlib.util.find_spec("langgraph") is None:
        print(HOW)
        return [c.skipped(ID, WHAT, "langgraph not installed")]
    return await measure(args)


if __name__ == "__main__":
    arguments = c.arguments(__doc__ or "")
    c.report(asyncio.run(main(arguments)), arguments)
