"""Stop a streaming run from the consumer and resume it later from its checkpoint.

python examples/stream_request_stop.py
"""

from __future__ import annotations

import asyncio
from typing import Any

import flowy

State = dict[str, Any]


def merge(state: State, update: State) -> State:
    return {**state, **update}


async def chunk(state: State) -> tuple[State, flowy.Directive[flowy.NoEffect]]:
    await asyncio.sleep(0.01)  # node I/O respects cancellation
    done = state.get("done", 0) + 1
    return {"done": done}, (flowy.completed() if done < 10 else flowy.end())


def build_graph() -> flowy.Graph[State, flowy.NoEffect]:
    b = flowy.GraphBuilder[State, flowy.NoEffect](merge)
    b.add_node("chunk", chunk).add_edge("chunk", "chunk")
    return b.compile(max_steps=100)


async def main() -> None:
    runner = flowy.Runner(build_graph(), await flowy.connect("memory://"))
    handle = await runner.stream("job-1", {})

    def keep_going(event: flowy.RunEvent[State, flowy.NoEffect]) -> bool:
        # stop after the third chunk completed
        return not (event.type is flowy.EventType.NODE_COMPLETED and event.step == 3)

    stopped = await flowy.consume_events_and_wait(handle, keep_going)
    print("stopped:", stopped.status, stopped.reason, "after", stopped.state["done"], "chunks")
    assert stopped.resume_token is not None
    finished = await runner.resume(stopped.resume_token)
    print("resumed:", finished.status, finished.reason, "chunks done:", finished.state["done"])


if __name__ == "__main__":
    asyncio.run(main())
