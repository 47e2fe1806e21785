"""Engine overhead: a Runner step (no store, no I/O) vs a bare ``await node(state)`` loop
over the same node functions, in interleaved rounds of one process.

Budget (DESIGN §6): a Runner step within 4× the bare loop.

    uv run --frozen --all-packages python bench/engine.py [--quick]
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import _common as c

import flowy

BUDGET = 4.0
BARE_PASSES = 5


def build(steps: int) -> tuple[flowy.Graph[int, Any], Any]:
    async def count(state: int) -> tuple[int, flowy.Directive[Any]]:
        if state + 1 >= steps:
            return state + 1, flowy.end()
        return state + 1, flowy.completed()

    b = flowy.GraphBuilder[int, Any]()
    b.add_node("a", count).add_node("b", count).add_edge("a", "b").add_edge("b", "a")
    return b.compile(max_steps=steps + 1), count


async def measure(steps: int, rounds: int) -> dict[str, list[float]]:
    graph, count = build(steps)
    runner = flowy.Runner(graph)
    ids = itertools.count()

    async def bare(_: int) -> float:
        # Several passes per sample, so a sample lasts about as long as a Runner's: a
        # short sample would dodge the noise a longer one catches.
        started = time.perf_counter()
        for _ in range(BARE_PASSES):
            state = 0
            for _ in range(steps):
                state, _directive = await count(state)
        return (time.perf_counter() - started) / (steps * BARE_PASSES)

    async def engine(_: int) -> float:
        started = time.perf_counter()
        result = await runner.start(f"bench-{next(ids)}", 0)
        elapsed = time.perf_counter() - started
        assert result.state == steps, result
        return elapsed / steps

    return await c.interleave({"bare": bare, "engine": engine}, rounds, warmup=2)


def main() -> None:
    args = c.arguments(__doc__ or "")
    steps, rounds = (500, 5) if args.quick else (2_000, 31)
    samples = asyncio.run(measure(steps, rounds))
    bare, engine = c.median(samples["bare"]), c.median(samples["engine"])
    print(
        f"engine overhead (no store, {steps} steps x {rounds} rounds): bare loop "
        f"{bare * 1e6:.2f} µs/step, Runner {engine * 1e6:.2f} µs/step, "
        f"ratio {engine / bare:.1f}x (budget {BUDGET:g}x)"
    )
    row = c.at_most(
        "engine",
        "engine step, no store (vs bare `await node(state)` loop)",
        engine,
        bare,
        BUDGET,
        fmt=lambda s: f"{s * 1e6:.2f} µs",
    )
    c.report([row], args)


if __name__ == "__main__":
    main()
