"""Memory: a Worker's memory stays flat over many messages, and suspended threads cost
the process that ran them nothing.

(a) Worker: on the memory store, threads are started that hand off (``work`` →
``handoff`` → ``finish`` → ``end``, deleted on success) while a ``Worker`` (concurrency
16) resumes them; the backlog of unprocessed messages stays under 2,000. The process's
RSS (after a garbage collection) and its count of live objects are read at every 5% of
the messages; the budget compares the reading at 25% (allocator pools and caches warm)
with the one at the end: growth < 5% of RSS. Default: 200,000 messages or as many as
fit in 60 s; ``--full`` runs 1,000,000 with no time limit. A second, shorter run under
``tracemalloc`` reports the traced bytes at 25% and at the end (budget: growth < 5%, or
< 64 KiB for a heap too small for a percentage to mean anything), and the allocation
sites that grew most.

(b) Suspended threads: one Runner on a SQLite file (synchronous=NORMAL: durability is
not what is measured) starts threads that suspend at once. The baseline is the RSS
after 5,000 such threads (imports, caches and SQLite's page cache warm); after 100,000
more (default: as many as fit in 60 s; ``--full``: all of them) and a garbage
collection, the RSS is read again. Budget: the delta is < 5% of the baseline.

Each measurement runs in a fresh child process (``--child NAME``), so one does not
inherit another's heap.

    uv run --frozen --all-packages python bench/memory.py [--quick] [--full]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import subprocess
import sys
import tempfile
import time
import tracemalloc
from typing import Any

import _common as c

import flowy

BUDGET = 0.05
TRACE_FLOOR = 64 * 1024
"""Traced growth this small is noise (a few freelists and caches), whatever the %."""
BACKLOG = 2_000


def handoff_graph() -> flowy.Graph[dict[str, Any], Any]:
    async def work(state: dict[str, Any]) -> tuple[dict[str, Any], flowy.Directive[Any]]:
        return {"n": state["n"], "worked": True}, flowy.handoff("bench", resume_at="finish")

    async def finish(state: dict[str, Any]) -> tuple[dict[str, Any], flowy.Directive[Any]]:
        return {**state, "finished": True}, flowy.end()

    b = flowy.GraphBuilder[dict[str, Any], Any]()
    b.add_node("work", work).add_node("finish", finish).add_edge("work", "finish")
    b.allow_no_outgoing_route("finish")
    return b.compile(delete_on_success=True)


def suspend_graph() -> flowy.Graph[dict[str, Any], Any]:
    async def ask(state: dict[str, Any]) -> tuple[dict[str, Any], flowy.Directive[Any]]:
        return {**state, "asked": True}, flowy.suspend("awaiting_human", resume_at="ask")

    b = flowy.GraphBuilder[dict[str, Any], Any]()
    b.add_node("ask", ask).allow_no_outgoing_route("ask")
    return b.compile()


def reading(trace: bool) -> dict[str, float]:
    gc.collect()
    out = {"rss": float(c.rss_bytes()), "objects": float(len(gc.get_objects()))}
    if trace:
        out["traced"] = float(tracemalloc.get_traced_memory()[0])
    return out


async def worker_child(messages: int, seconds: float | None, trace: bool) -> dict[str, Any]:
    # The "thread busy" retries below are expected; their warnings would flood the output.
    logging.getLogger("flowy.worker").setLevel(logging.ERROR)
    if trace:
        tracemalloc.start(1)
    backend = await flowy.connect("memory://")
    runner = flowy.Runner(handoff_graph(), backend)
    processed = 0
    caught_up = asyncio.Event()

    def on_result(_: Any, result: flowy.RunResult[Any, Any]) -> None:
        nonlocal processed
        assert result.status is flowy.RunStatus.COMPLETED, result
        processed += 1
        caught_up.set()

    # A message can be claimed before the start that enqueued it has returned (same
    # runner, same process): the worker gives it back ("thread busy"); retry it soon.
    worker = flowy.Worker(
        runner,
        concurrency=16,
        poll_interval=0.05,
        on_result=on_result,
        retry_delay=0.002,
        retry_jitter=0.0,
    )
    running = asyncio.ensure_future(worker.run())
    marks: list[dict[str, float]] = []
    snapshots: dict[str, Any] = {}
    # A reading every 5% of the messages (at most every 2,500, so that a run cut short
    # by its time limit still has many).
    step = max(min(messages // 20, 2_500), 1)
    began = time.monotonic()
    started = 0
    while started < messages:
        if seconds is not None and time.monotonic() - began > seconds:
            break
        while started - processed >= BACKLOG:
            caught_up.clear()
            await caught_up.wait()
        result = await runner.start(f"t-{started:08d}", {"n": started})
        assert result.status is flowy.RunStatus.HANDOFF, result
        started += 1
        if started % step == 0:
            while processed < started:  # a reading counts finished messages only
                caught_up.clear()
                await caught_up.wait()
            marks.append({"messages": float(processed), **reading(trace)})
            if trace and started == step * 5:  # 25% of a run that is not cut short
                snapshots["quarter"] = tracemalloc.take_snapshot()
    while processed < started:
        caught_up.clear()
        await caught_up.wait()
    elapsed = time.monotonic() - began
    worker.stop()
    await running
    final = {"messages": float(processed), **reading(trace)}
    if not marks or marks[-1]["messages"] != final["messages"]:
        marks.append(final)
    top: list[str] = []
    if trace and "quarter" in snapshots:
        last = tracemalloc.take_snapshot()
        stats = last.compare_to(snapshots["quarter"], "lineno")
        top = [str(s) for s in stats[:8]]
    await backend.aclose()
    return {"marks": marks, "seconds": elapsed, "top": top, "stats": dict(worker.stats.outcomes)}


async def suspended_child(threads: int, warm: int, seconds: float | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        async with flowy.connect(f"sqlite:///{tmp}/threads.db?synchronous=NORMAL") as backend:
            runner = flowy.Runner(suspend_graph(), backend)

            async def start(first: int, count: int, deadline: float | None) -> int:
                done = 0
                for batch in range(first, first + count, 64):
                    if deadline is not None and time.monotonic() > deadline:
                        break
                    ids = range(batch, min(first + count, batch + 64))
                    results = await asyncio.gather(
                        *(runner.start(f"t-{i:08d}", {"n": i}) for i in ids)
                    )
                    assert all(r.status is flowy.RunStatus.SUSPENDED for r in results)
                    done += len(results)
                return done

            await start(0, warm, None)
            before = reading(False)
            began = time.monotonic()
            deadline = None if seconds is None else began + seconds
            done = await start(warm, threads, deadline)
            elapsed = time.monotonic() - began
            after = reading(False)
            listed = await backend.checkpointer.list_threads(limit=3)
            assert listed and listed[0].status is flowy.RunStatus.SUSPENDED
    return {"before": before, "after": after, "threads": done, "warm": warm, "seconds": elapsed}


def at_fraction(marks: list[dict[str, float]], fraction: float) -> dict[str, float]:
    """The reading taken nearest ``fraction`` of the messages processed in the end."""
    goal = fraction * marks[-1]["messages"]
    return min(marks, key=lambda m: abs(m["messages"] - goal))


def child(name: str, *extra: str) -> dict[str, Any]:
    """Run ``--child name`` in a fresh process and return what it printed (JSON)."""
    proc = subprocess.run(
        [sys.executable, __file__, "--child", name, *extra],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"child {name} exited {proc.returncode}: {proc.stderr[-600:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def worker_rows(args: argparse.Namespace) -> list[c.Row]:
    if args.quick:
        messages, seconds, trace_messages, trace_seconds = 600, None, 200, None
    elif args.full:
        messages, seconds, trace_messages, trace_seconds = 1_000_000, None, 100_000, None
    else:
        messages, seconds, trace_messages, trace_seconds = 200_000, 60.0, 6_000, None
    extra = ["--messages", str(messages)] + ([] if seconds is None else ["--seconds", str(seconds)])
    out = child("worker", *extra)
    marks = out["marks"]
    last = marks[-1]
    n = int(last["messages"])
    quarter = at_fraction(marks, 0.25)
    print(
        f"(a) Worker on the memory store: {n:,} hand-offs in {out['seconds']:.1f} s "
        f"({n / out['seconds']:,.0f}/s); outcomes {out['stats']}"
    )
    print("    messages      RSS        live objects")
    for m in [at_fraction(marks, k / 10) for k in range(1, 11)]:
        print(f"    {int(m['messages']):>9,}   {c.mib(m['rss']):>10}   {int(m['objects']):>10,}")
    growth = last["rss"] - quarter["rss"]
    per_message = growth / max(last["messages"] - quarter["messages"], 1)
    print(
        f"    growth from {int(quarter['messages']):,} (25%) to {n:,}: {c.mib(growth)} "
        f"({growth / quarter['rss']:+.1%}), {per_message:.2f} bytes/message; objects "
        f"{int(last['objects'] - quarter['objects']):+,}; at that rate 1,000,000 messages "
        f"add {c.mib(per_message * 1_000_000)}"
    )
    rows = [
        c.Row(
            "memory.worker_rss",
            "Worker RSS over a run of hand-offs (memory store): end vs 25%",
            f"{c.mib(last['rss'])} ({growth / quarter['rss']:+.1%}) after {n:,}",
            f"{c.mib(quarter['rss'])} at 25%",
            last["rss"] / quarter["rss"],
            f"< +{BUDGET:.0%}",
            "within" if growth < BUDGET * quarter["rss"] else "over",
            {
                "flowy": last["rss"],
                "baseline": quarter["rss"],
                "messages": float(n),
                "bytes_per_message": per_message,
                "objects_growth": last["objects"] - quarter["objects"],
                "per_second": n / out["seconds"],
            },
        )
    ]
    extra = ["--messages", str(trace_messages), "--trace"]
    traced = child(
        "worker", *extra + ([] if trace_seconds is None else ["--seconds", str(trace_seconds)])
    )
    tm = traced["marks"]
    t_quarter, t_last = at_fraction(tm, 0.25), tm[-1]
    t_growth = t_last["traced"] - t_quarter["traced"]
    tn = int(t_last["messages"])
    print(
        f"    under tracemalloc ({tn:,} hand-offs): traced {c.mib(t_quarter['traced'])} at "
        f"25%, {c.mib(t_last['traced'])} at the end ({t_growth / t_quarter['traced']:+.1%}); "
        "sites that grew most:"
    )
    for line in traced["top"]:
        print(f"      {line}")
    rows.append(
        c.Row(
            "memory.worker_traced",
            "Worker traced memory over hand-offs (tracemalloc): end vs 25%",
            f"{c.mib(t_last['traced'])} ({t_growth / t_quarter['traced']:+.1%}) after {tn:,}",
            f"{c.mib(t_quarter['traced'])} at 25%",
            t_last["traced"] / t_quarter["traced"],
            f"< +{BUDGET:.0%} or 64 KiB",
            "within" if t_growth < max(BUDGET * t_quarter["traced"], TRACE_FLOOR) else "over",
            {"flowy": t_last["traced"], "baseline": t_quarter["traced"], "messages": float(tn)},
        )
    )
    return rows


def suspended_rows(args: argparse.Namespace) -> list[c.Row]:
    if args.quick:
        threads, warm, seconds = 400, 200, None
    elif args.full:
        threads, warm, seconds = 100_000, 5_000, None
    else:
        threads, warm, seconds = 100_000, 5_000, 60.0
    extra = ["--threads", str(threads), "--warm", str(warm)]
    out = child("suspended", *extra + ([] if seconds is None else ["--seconds", str(seconds)]))
    before, after, n = out["before"], out["after"], out["threads"]
    delta = after["rss"] - before["rss"]
    print(
        f"(b) {n:,} threads suspended through one Runner on SQLite in {out['seconds']:.1f} s "
        f"(after {out['warm']:,} to warm up): RSS {c.mib(before['rss'])} -> "
        f"{c.mib(after['rss'])} ({c.mib(delta)}, {delta / before['rss']:+.1%}); live objects "
        f"{int(before['objects']):,} -> {int(after['objects']):,}"
    )
    return [
        c.Row(
            "memory.suspended",
            "RSS after suspending threads through one Runner (SQLite file)",
            f"{c.mib(after['rss'])} ({delta / before['rss']:+.1%}) after {n:,}",
            f"{c.mib(before['rss'])} before",
            after["rss"] / before["rss"],
            f"< +{BUDGET:.0%}",
            "within" if delta < BUDGET * before["rss"] else "over",
            {
                "flowy": after["rss"],
                "baseline": before["rss"],
                "threads": float(n),
                "objects_growth": after["objects"] - before["objects"],
            },
        )
    ]


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--child", choices=("worker", "suspended"), help=argparse.SUPPRESS)
    parser.add_argument("--messages", type=int, default=200_000, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=100_000, help=argparse.SUPPRESS)
    parser.add_argument("--warm", type=int, default=5_000, help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)


def main() -> None:
    args = c.arguments(__doc__ or "", _options)
    if args.child == "worker":
        out = asyncio.run(worker_child(args.messages, args.seconds, args.trace))
        print(json.dumps(out))
        return
    if args.child == "suspended":
        print(json.dumps(asyncio.run(suspended_child(args.threads, args.warm, args.seconds))))
        return
    rows: list[c.Row] = []
    for key, what, measure in (
        ("memory.worker_rss", "Worker RSS over many hand-offs", worker_rows),
        ("memory.suspended", "RSS after suspending many threads", suspended_rows),
    ):
        try:
            rows += measure(args)
        except Exception as exc:  # noqa: BLE001 - a failure must not hide the other figure
            print(f"{what}: failed: {exc!r}")
            rows.append(c.failed(key, what, exc))
    c.report(rows, args)


if __name__ == "__main__":
    main()
