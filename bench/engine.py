"""Engine overhead: a Runner step (no checkpoint) vs a bare ``await node(state)`` loop
over the same node functions, measured in the same process. Prints medians and the
ratio (budget: within 10x)."""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import flowy

STEPS = 2_000
ROUNDS = 15


async def count(state: int) -> tuple[int, flowy.Directive[Any]]:
    if state + 1 >= STEPS:
        return state + 1, flowy.end()
    return state + 1, flowy.completed()


def build() -> flowy.Graph[int, Any]:
    b = flowy.GraphBuilder[int, Any]()
    b.add_node("a", count).add_node("b", count).add_edge("a", "b").add_edge("b", "a")
    return b.compile(max_steps=STEPS + 1)


async def bare_loop() -> float:
    state = 0
    started = time.perf_counter()
    for _ in range(STEPS):
        state, _directive = await count(state)
    return (time.perf_counter() - started) / STEPS


async def runner_loop(runner: flowy.Runner[int, Any], i: int) -> float:
    started = time.perf_counter()
    result = await runner.start(f"bench-{i}", 0)
    elapsed = time.perf_counter() - started
    assert result.state == STEPS, result
    return elapsed / STEPS


async def measure() -> dict[str, float]:
    runner = flowy.Runner(build())
    bare: list[float] = []
    engine: list[float] = []
    for i in range(ROUNDS):  # interleaved so machine noise hits both alike
        bare.append(await bare_loop())
        engine.append(await runner_loop(runner, i))
    b, e = statistics.median(bare), statistics.median(engine)
    return {"bare_us": b * 1e6, "engine_us": e * 1e6, "ratio": e / b}


def main() -> None:
    r = asyncio.run(measure())
    print(
        f"engine overhead (in memory, no checkpoint, {STEPS} steps x {ROUNDS} rounds): "
        f"bare loop {r['bare_us']:.2f} us/step, Runner {r['engine_us']:.2f} us/step, "
        f"ratio {r['ratio']:.1f}x (budget 10x)"
    )


if __name__ == "__main__":
    main()
