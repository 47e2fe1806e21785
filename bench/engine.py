"""Engine overhead: a Runner step (no store, no I/O) vs a bare ``await node(state)`` loop
over the same node functions, in interleaved rounds of one process; and a superstep of
10 branches (``flowy.fan_out``) vs a bare ``asyncio.gather`` of the same 10 node calls
and the same fold.

Budget (DESIGN §6): a Runner step within 4× the bare loop, and at most 10 µs. The fan-out
row is shown for information; ``bench/peer_langgraph_send.py`` puts LangGraph's ``Send``
on the same work.

flowy's own CPU per durable step: the chain every durable benchmark runs (10 nodes, about
1 KiB of state, a save after every step, a fresh thread per run) on the memory store,
whose records are encoded as on any store, so the figure is everything flowy does around
a driver call: building the snapshot, encoding the record, checking it, the engine. The
process CPU time per step is compared with the same node calls in a bare loop. Budget:
at most 40 µs.

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
ENGINE_LIMIT = 10e-6
"""Seconds: a Runner step without a store, at most."""
DURABLE_CPU_LIMIT = 40e-6
"""Seconds of process CPU: a durable step on the memory store, at most."""
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


async def measure_durable_cpu(runs: int, rounds: int) -> dict[str, list[float]]:
    """Process CPU per step: the durable chain on the memory store, and the same node
    calls in a bare loop."""
    from flowy.memory import MemoryBackend

    graph = c.chain_graph()
    ids = itertools.count()

    async def no_write(_revision: int) -> None:
        return None

    async def bare(_: int) -> float:
        cpu = time.process_time()
        for _ in range(runs):
            await c.raw_chain(no_write)
        return (time.process_time() - cpu) / (runs * c.STEPS)

    async def durable(_: int) -> float:
        async with MemoryBackend[c.State]() as backend:
            runner = flowy.Runner(graph, backend)
            cpu = time.process_time()
            for _ in range(runs):
                result = await runner.start(f"cpu-{next(ids)}", c.initial_state())
                assert result.status is flowy.RunStatus.COMPLETED, result
            return (time.process_time() - cpu) / (runs * c.STEPS)

    return await c.interleave({"bare": bare, "durable": durable}, rounds, warmup=2)


BRANCHES = 10


async def grade(state: dict[str, Any]) -> tuple[dict[str, Any], flowy.Directive[Any]]:
    """The branch work: a little arithmetic on the item, the same in every variant."""
    return {"scores": [sum(ord(ch) for ch in state["item"]) % 97]}, flowy.completed()


def fan_out_graph() -> flowy.Graph[dict[str, Any], Any]:
    """``plan`` fans out ``grade`` over 10 items, then ``done`` ends the run."""

    def fold(state: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
        merged = dict(state)
        for key, value in update.items():
            merged[key] = [*state.get(key, []), *value] if isinstance(value, list) else value
        return merged

    async def plan(state: dict[str, Any]) -> tuple[dict[str, Any], flowy.Directive[Any]]:
        items = [{"item": f"draft-{i}"} for i in range(BRANCHES)]
        return {}, flowy.fan_out("grade", items)

    async def done(state: dict[str, Any]) -> tuple[dict[str, Any], flowy.Directive[Any]]:
        return {}, flowy.end()

    b: flowy.GraphBuilder[dict[str, Any], Any] = flowy.GraphBuilder(fold)
    b.add_node("plan", plan).add_node("grade", grade).add_node("done", done)
    b.add_edge("plan", "done").add_fan_out("plan", "grade", then="done")
    return b.allow_no_outgoing_route("done").compile()


async def measure_fan_out(rounds: int, per_sample: int) -> dict[str, list[float]]:
    runner = flowy.Runner(fan_out_graph())
    ids = itertools.count()

    async def bare(_: int) -> float:
        started = time.perf_counter()
        for _ in range(per_sample):
            outs = await asyncio.gather(*(grade({"item": f"draft-{i}"}) for i in range(BRANCHES)))
            scores = [s for update, _d in outs for s in update["scores"]]
            assert len(scores) == BRANCHES
        return (time.perf_counter() - started) / per_sample

    async def engine(_: int) -> float:
        started = time.perf_counter()
        for _ in range(per_sample):
            result = await runner.start(f"fan-{next(ids)}", {})
            assert len(result.state["scores"]) == BRANCHES, result
        return (time.perf_counter() - started) / per_sample

    return await c.interleave({"bare": bare, "engine": engine}, rounds, warmup=2)


def main() -> None:
    args = c.arguments(__doc__ or "")
    steps, rounds = (500, 5) if args.quick else (2_000, 31)
    fan = asyncio.run(measure_fan_out(5 if args.quick else 31, 20 if args.quick else 200))
    fan_bare, fan_engine = c.median(fan["bare"]), c.median(fan["engine"])
    print(
        f"fan-out of {BRANCHES} branches (no store): bare gather {fan_bare * 1e6:.1f} µs, "
        f"Runner (plan + superstep + end) {fan_engine * 1e6:.1f} µs, "
        f"ratio {fan_engine / fan_bare:.1f}x"
    )
    fan_row = c.info(
        "engine.fan_out",
        f"fan-out of {BRANCHES} branches, no store (vs bare `asyncio.gather` of them)",
        fan_engine,
        fan_bare,
    )
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
    alone = c.below(
        "engine.alone",
        "engine step, no store, in µs (vs bare `await node(state)` loop)",
        engine,
        bare,
        ENGINE_LIMIT,
        fmt=lambda s: f"{s * 1e6:.2f} µs",
    )
    cpu = asyncio.run(measure_durable_cpu(20 if args.quick else 200, 5 if args.quick else 21))
    cpu_bare, cpu_durable = c.median(cpu["bare"]), c.median(cpu["durable"])
    print(
        f"flowy's CPU per durable step (memory store, record encoded): "
        f"{cpu_durable * 1e6:.1f} µs/step, bare node calls {cpu_bare * 1e6:.2f} µs/step "
        f"(budget {DURABLE_CPU_LIMIT * 1e6:.0f} µs)"
    )
    cpu_row = c.below(
        "memory.durable_cpu",
        "flowy's process CPU per durable step, memory store (vs the bare node calls)",
        cpu_durable,
        cpu_bare,
        DURABLE_CPU_LIMIT,
        fmt=lambda s: f"{s * 1e6:.1f} µs",
    )
    c.report([row, alone, fan_row, cpu_row], args)


if __name__ == "__main__":
    main()
