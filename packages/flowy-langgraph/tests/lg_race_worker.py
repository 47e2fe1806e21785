"""One writer of the two-writer race (``test_fencing.py``): runs a real LangGraph
``StateGraph`` invocation on a thread through ``FlowySaver``, in a process of its own.

``python lg_race_worker.py URL THREAD NAME DIR fenced|unfenced``: the graph's one node
appends NAME to the messages, but first marks itself ready in DIR and waits until the
other writer is ready too (or failed), so both invocations are in flight on the thread at
once. Prints ``ok`` (exit 0) or ``forked: <error>`` (exit 3).
"""

from __future__ import annotations

import asyncio
import operator
import sys
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph

from flowy_langgraph import FlowySaver, ThreadForkedError


class State(TypedDict):
    messages: Annotated[list[str], operator.add]


def build(name: str, folder: Path, other: str) -> Any:
    async def step(state: State) -> dict[str, list[str]]:
        (folder / f"ready-{name}").touch()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if (folder / f"ready-{other}").exists() or (folder / f"failed-{other}").exists():
                break
            await asyncio.sleep(0.02)
        return {"messages": [name]}

    builder = StateGraph(State)
    builder.add_node("step", step)
    builder.add_edge(START, "step")
    builder.add_edge("step", END)
    return builder


async def main(url: str, thread: str, name: str, folder: Path, fenced: bool) -> int:
    other = "b" if name == "a" else "a"
    async with FlowySaver.from_url(url, fenced=fenced) as saver:
        graph = build(name, folder, other).compile(checkpointer=saver)
        try:
            await graph.ainvoke({"messages": []}, {"configurable": {"thread_id": thread}})
        except ThreadForkedError as exc:
            (folder / f"failed-{name}").touch()
            print(f"forked: {exc}", flush=True)
            return 3
    print("ok", flush=True)
    return 0


if __name__ == "__main__":
    url, thread, name, folder, mode = sys.argv[1:6]
    sys.exit(asyncio.run(main(url, thread, name, Path(folder), mode == "fenced")))
