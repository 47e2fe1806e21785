"""A hand-off stress run on a real store, with worker processes killed mid-segment:
``python -m flowy.testing.stress_stores --store URL``.

The main process starts ``--handoffs`` threads. Each hands off twice
(``work → hand-off → relay → hand-off → effect → done``), so workers run both the
transactional and the three-phase hand-off paths. ``--workers`` worker processes resume
them with random faults at every phase — a save, a patch, an enqueue or a commit that
fails before the write, or after it landed (an unknown outcome) — and the main process
SIGKILLs a random worker ``--kills`` times mid-flight and starts a replacement. The
workers' recovery loop re-enqueues orphaned, stale and lost hand-offs.

``effect`` increments a counter in the state, so a thread whose effect was committed
twice (a hand-off resumed twice) shows it. At the end every thread must be completed
with the counter at 1 and its history one unbroken chain. It prints one line::

    store=sqlite handoffs=… faults=… kills=… recovered=… lost=0 double_resumed=0

and exits non-zero if anything was lost or resumed twice.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .._directives import Directive, completed, handoff
from .._graph import Graph, GraphBuilder
from .._runner import Runner
from .._types import RunStatus
from .._worker import Worker
from ..storage import Backend, connect, redact_url
from ..storage.dialect import StoreURL
from .faults import FaultyBackend
from .stress import hand_off_faults

__all__ = ["graph", "main", "run"]

State = dict[str, Any]


def _merge(state: State, update: State) -> State:
    return {**state, **update}


async def _work(state: State) -> tuple[State, Directive[Any]]:
    return {"worked": True}, handoff("to_worker", resume_at="relay")


async def _relay(state: State) -> tuple[State, Directive[Any]]:
    if state.get("relayed"):
        return {}, completed()
    return {"relayed": True}, handoff("relay_again", resume_at="effect")


async def _effect(state: State) -> tuple[State, Directive[Any]]:
    return {"effects": state.get("effects", 0) + 1}, completed()


async def _done(state: State) -> tuple[State, Directive[Any]]:
    return {"done": True}, completed()


def graph() -> Graph[State, Any]:
    """The stress graph: two hand-offs, then a committed effect."""
    b: GraphBuilder[State, Any] = GraphBuilder(_merge)
    b.add_node("work", _work).add_node("relay", _relay)
    b.add_node("effect", _effect).add_node("done", _done)
    b.add_edge("work", "relay").add_edge("relay", "effect").add_edge("effect", "done")
    b.allow_no_outgoing_route("done")
    return b.compile(max_total_steps=100)


async def _worker(url: str, seed: int, fault_rate: float, stats: Path, pace: float) -> None:
    """One worker process: resume hand-offs with faults until SIGTERM (or SIGKILL)."""
    rng = random.Random(seed)
    backend = await connect(url)
    faults = hand_off_faults(rng, fault_rate)
    # Both hand-off paths: transactional on odd seeds, three-phase on even ones.
    runner = Runner(graph(), FaultyBackend(backend, faults, three_phase=not seed % 2))
    worker: Worker[State, Any] | None = None

    def report(*_: Any) -> None:
        recovered = worker.stats.recovered if worker is not None else 0
        stats.write_text(json.dumps({"faults": len(faults.struck), "recovered": recovered}))

    worker = Worker(
        runner,
        backend.consumer,
        owner=f"stress-{os.getpid()}",
        lease_ttl=2.0 * pace,
        concurrency=4,
        visibility_timeout=3.0 * pace,
        poll_interval=0.2 * pace,
        recovery_interval=1.0 * pace,
        stale_after=2.0 * pace,
        reenqueue_enqueued_after=8.0 * pace,
        retry_delay=0.05,
        max_retry_delay=0.5,
        on_result=report,
        on_failure=report,
    )
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, worker.stop)
    print("ready", flush=True)
    try:
        await worker.run()
    finally:
        report()
        await backend.aclose()


async def _spawn(
    url: str, seed: int, fault_rate: float, stats: Path, pace: float
) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "flowy.testing.stress_stores",
        "--worker",
        "--store",
        url,
        "--seed",
        str(seed),
        "--fault-rate",
        str(fault_rate),
        "--pace",
        str(pace),
        "--stats",
        str(stats),
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 60)
    if line.strip() != b"ready":
        raise RuntimeError(f"a stress worker did not start: {line!r}")
    return proc


def _worker_counts(folder: Path) -> tuple[int, int]:
    """Faults struck and hand-offs recovered, summed over the workers' stats files."""
    faults = recovered = 0
    for stats in folder.glob("worker-*.json"):
        with contextlib.suppress(ValueError, OSError, KeyError):
            counts = json.loads(stats.read_text())
            faults += int(counts["faults"])
            recovered += int(counts["recovered"])
    return faults, recovered


async def _completed(backend: Backend[Any], threads: list[str]) -> int:
    done = 0
    after: str | None = None
    while True:
        page = await backend.checkpointer.list_threads(limit=1000, after=after)
        if not page:
            return done
        done += sum(1 for t in page if t.status is RunStatus.COMPLETED)
        after = page[-1].thread_id


async def run(
    url: str,
    handoffs: int = 10_000,
    *,
    workers: int = 4,
    kills: int = 5,
    fault_rate: float = 0.1,
    pace: float = 1.0,
    seed: int = 1,
    deadline_seconds: float = 900.0,
) -> dict[str, int | str]:
    """Run the stress scenario on the (empty, isolated) store at ``url``."""
    rng = random.Random(seed)
    scheme = StoreURL.parse(url).scheme if "://" in url else "sqlite"
    backend = await connect(url)
    runner = Runner(graph(), backend)
    prefix = f"stress-{seed}-"
    threads = [f"{prefix}{i:06d}" for i in range(handoffs)]
    for start in range(0, handoffs, 64):
        await asyncio.gather(*(runner.start(t, {}) for t in threads[start : start + 64]))
    tmp = Path(tempfile.mkdtemp(prefix="flowy-stress-"))
    procs: list[tuple[asyncio.subprocess.Process, Path]] = []
    spawned = 0

    async def spawn() -> None:
        nonlocal spawned
        stats = tmp / f"worker-{spawned}.json"
        procs.append((await _spawn(url, seed * 1000 + spawned, fault_rate, stats, pace), stats))
        spawned += 1

    for _ in range(workers):
        await spawn()
    killed = 0
    deadline = time.monotonic() + deadline_seconds
    started = time.monotonic()
    try:
        while time.monotonic() < deadline:
            await asyncio.sleep(pace)
            done = await _completed(backend, threads)
            if done >= handoffs:
                break
            progress = done / handoffs
            # Kill at evenly spread points of the run, mid-flight.
            if killed < kills and progress >= (killed + 1) / (kills + 1) * 0.9:
                victim, _stats = procs.pop(rng.randrange(len(procs)))
                victim.send_signal(signal.SIGKILL)
                await victim.wait()
                killed += 1
                await spawn()
    finally:
        for proc, _stats in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        for proc, _stats in procs:
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                await proc.wait()
    lost = double = 0
    for thread_id in threads:
        snap, revision = await backend.checkpointer.load(thread_id)
        if snap.status is not RunStatus.COMPLETED:
            lost += 1
            continue
        history = [s.revision for s in await backend.checkpointer.get_history(thread_id, 1000)]
        chain_ok = history == list(range(revision, revision - len(history), -1))
        if snap.state.get("effects") != 1 or not chain_ok:
            double += 1
    faults, recovered = _worker_counts(tmp)
    await backend.aclose()
    return {
        "store": scheme,
        "handoffs": handoffs,
        "faults": faults,
        "kills": killed,
        "recovered": recovered,
        "lost": lost,
        "double_resumed": double,
        "seconds": round(time.monotonic() - started),
    }


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the process exit status."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--store", required=True, help="the URL of an empty, isolated store")
    parser.add_argument("--handoffs", type=int, default=10_000, help="threads to run")
    parser.add_argument("--workers", type=int, default=4, help="worker processes at a time")
    parser.add_argument("--kills", type=int, default=5, help="workers SIGKILLed mid-flight")
    parser.add_argument("--fault-rate", type=float, default=0.1, help="chance of a fault")
    parser.add_argument(
        "--pace", type=float, default=1.0, help="scales the workers' timings (slow stores)"
    )
    parser.add_argument("--seed", type=int, default=1, help="random seed")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds before giving up")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--stats", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.getLogger("flowy").setLevel(logging.CRITICAL)  # injected faults are expected
    if args.worker:
        asyncio.run(_worker(args.store, args.seed, args.fault_rate, args.stats, args.pace))
        return 0
    summary = asyncio.run(
        run(
            args.store,
            args.handoffs,
            workers=args.workers,
            kills=args.kills,
            fault_rate=args.fault_rate,
            pace=args.pace,
            seed=args.seed,
            deadline_seconds=args.timeout,
        )
    )
    print(" ".join(f"{k}={v}" for k, v in summary.items()))
    print(f"# {redact_url(args.store)}", file=sys.stderr)
    return 0 if summary["lost"] == 0 and summary["double_resumed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
