"""A randomised hand-off stress run: ``python -m flowy.testing.stress``.

Thousands of threads hand off to a pool of workers while faults strike at random at
every phase (save pending, patch enqueued, enqueue, patch orphaned, transactional
commit, step saves) — before or after the write lands — and workers "crash" between a
run's terminal save and the ack. A client retries what failed the way the docs say
(start again if nothing was saved, resume from the current token, force re-enqueue the
worst case), and the workers' recovery loop re-enqueues orphaned and stale hand-offs.

It prints one line::

    handoffs=… faults=… recovered=… lost=0 double_resumed=0

and exits non-zero if any thread was lost (never completed) or resumed twice (its side
effect ran more than once).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import logging
import random
import sys
from typing import Any

from .._context import run_metadata
from .._directives import Directive, completed, handoff
from .._errors import (
    ConcurrencyConflictError,
    HandoffEnqueueFailedError,
    StorageError,
    StorageUnavailableError,
    ThreadLeaseBusyError,
)
from .._graph import Graph, GraphBuilder
from .._results import ResumeDecisionKind
from .._runner import Runner
from .._worker import Worker
from ..memory import MemoryBackend, MemoryCheckpointer, MemoryConsumer, MemoryOutbox
from ..storage import (
    DeadLetter,
    HandoffIntent,
    Outbox,
    OutboxMessage,
    ResumeToken,
    RunStatus,
)
from .faults import Fault, FaultyCheckpointer, FaultyOutbox, Phase

__all__ = ["main", "run_stress"]

State = dict[str, Any]


_AMBIGUOUS_ONLY = frozenset({Phase.SAVE_STEP, Phase.SAVE_TERMINAL})


class _RandomFaults:
    """Stands in for a wrapper's armed faults: strikes at random."""

    def __init__(self, rng: random.Random, rate: float, phases: set[Phase]) -> None:
        self.rng = rng
        self.rate = rate
        self.phases = phases
        self.struck: list[Phase] = []
        self.enabled = True

    def take(self, phase: Phase) -> Fault | None:
        if not self.enabled or phase not in self.phases or self.rng.random() >= self.rate:
            return None
        self.struck.append(phase)
        # Step and terminal saves come after side effects: a save that never lands there
        # re-runs the node (at-least-once execution, which idempotency keys handle), so
        # they only get ambiguous faults; the hand-off phases get both kinds.
        after = phase in _AMBIGUOUS_ONLY or self.rng.random() < 0.5
        if after:
            return Fault(phase, after_write=True, error=lambda: StorageUnavailableError("lost"))
        return Fault(phase, error=lambda: StorageError(f"injected fault at {phase}"))


class _PlainOutbox:
    def __init__(self, inner: Outbox) -> None:
        self.inner = inner

    async def enqueue_intent(self, intent: HandoffIntent) -> None:
        await self.inner.enqueue_intent(intent)


class _CrashingConsumer:
    """A consumer whose ack sometimes never happens (the worker died after the run)."""

    def __init__(self, inner: MemoryConsumer, rng: random.Random, rate: float) -> None:
        self.inner = inner
        self.rng = rng
        self.rate = rate
        self.crashes = 0
        self.max_attempts = inner.max_attempts

    async def claim(
        self, limit: int, visibility_timeout: float, wait: float = 0.0
    ) -> list[OutboxMessage]:
        return await self.inner.claim(limit, visibility_timeout, wait)

    async def ack(self, message: OutboxMessage) -> None:
        if self.rng.random() < self.rate:
            self.crashes += 1
            return  # crashed before the ack: redelivered after the visibility timeout
        await self.inner.ack(message)

    async def release(
        self, message: OutboxMessage, *, error: str = "", delay: float = 0.0, dead: bool = False
    ) -> None:
        await self.inner.release(message, error=error, delay=delay, dead=dead)

    async def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        return await self.inner.dead_letters(limit)

    async def retry_dead_letter(self, message_id: str) -> None:
        await self.inner.retry_dead_letter(message_id)


def _graph(effects: collections.Counter[str]) -> Graph[State, Any]:
    async def work(state: State) -> tuple[State, Directive[Any]]:
        return {"worked": True}, handoff("background", resume_at="effect")

    async def effect(state: State) -> tuple[State, Directive[Any]]:
        effects[run_metadata().thread_id] += 1
        return {"effect": True}, completed()

    async def done(state: State) -> tuple[State, Directive[Any]]:
        return {"done": True}, completed()

    b: GraphBuilder[State, Any] = GraphBuilder(lambda s, u: {**s, **u})
    b.add_node("work", work).add_node("effect", effect).add_node("done", done)
    b.add_edge("work", "effect").add_edge("effect", "done").allow_no_outgoing_route("done")
    return b.compile()


async def run_stress(
    handoffs: int = 2000,
    *,
    seed: int = 1,
    fault_rate: float = 0.15,
    crash_rate: float = 0.05,
    workers: int = 4,
    transactional_share: float = 0.5,
) -> dict[str, int]:
    """Run the stress scenario; returns the summary counters."""
    rng = random.Random(seed)
    effects: collections.Counter[str] = collections.Counter()
    graph = _graph(effects)
    backend: MemoryBackend[State] = MemoryBackend(max_attempts=1000)
    leases = backend.leases
    store: MemoryCheckpointer[State] = backend.checkpointer
    queue: MemoryOutbox = backend.outbox
    faulty_cp = FaultyCheckpointer(store)
    cp_faults = _RandomFaults(
        rng,
        fault_rate,
        {
            Phase.SAVE_PENDING,
            Phase.PATCH_ENQUEUED,
            Phase.PATCH_ORPHANED,
            Phase.COMMIT,
            Phase.SAVE_STEP,
            Phase.SAVE_TERMINAL,
        },
    )
    faulty_cp.faults = cp_faults  # type: ignore[assignment]
    tx_outbox = FaultyOutbox(queue)
    plain_outbox = FaultyOutbox(_PlainOutbox(queue))
    ob_faults = _RandomFaults(rng, fault_rate, {Phase.ENQUEUE})
    tx_outbox.faults = ob_faults  # type: ignore[assignment]
    plain_outbox.faults = ob_faults  # type: ignore[assignment]
    runner_tx = Runner(graph, faulty_cp, lease_manager=leases, handoff_outbox=tx_outbox)
    runner_3p = Runner(graph, faulty_cp, lease_manager=leases, handoff_outbox=plain_outbox)
    consumer = _CrashingConsumer(backend.consumer, rng, crash_rate)
    clean = Runner(graph, store, lease_manager=leases, handoff_outbox=queue)
    pool = [
        Worker(
            clean if i else runner_3p,
            consumer,
            owner=f"stress-worker-{i}",
            lease_ttl=30,
            visibility_timeout=0.05,
            stale_after=0,
            reenqueue_enqueued_after=0.5,
        )
        for i in range(workers)
    ]
    threads = [f"stress-{seed}-{i}" for i in range(handoffs)]
    for thread_id in threads:
        runner = runner_tx if rng.random() < transactional_share else runner_3p
        result = await runner.start(thread_id, {}, run_lease=("client", 30))
        error = result.error
        if isinstance(error, HandoffEnqueueFailedError) and not error.orphaned:
            await clean.recover_stale_handoff(thread_id, force_reenqueue=True)
    recovered = 0
    for _round in range(200):
        await asyncio.gather(*(w.run_until_idle(idle_wait=0.06) for w in pool))
        recovered += await pool[0].recover_once(limit=handoffs)
        pending = [t for t in threads if not await _completed(store, t)]
        if not pending:
            break
        if _round >= 3:
            cp_faults.enabled = ob_faults.enabled = False  # let the system drain
        for thread_id in pending:
            await _client_retry(clean, store, thread_id)
    lost = 0
    for thread_id in threads:
        lost += not await _completed(store, thread_id)
    double = sum(1 for t in threads if effects[t] > 1)
    return {
        "handoffs": handoffs,
        "faults": len(cp_faults.struck) + len(ob_faults.struck) + consumer.crashes,
        "recovered": recovered + sum(w.stats.recovered for w in pool),
        "lost": lost,
        "double_resumed": double,
    }


async def _completed(store: MemoryCheckpointer[State], thread_id: str) -> bool:
    try:
        snap, _ = await store.load(thread_id)
    except Exception:  # noqa: BLE001 - any failure to load counts as not completed
        return False
    return snap.status is RunStatus.COMPLETED


async def _client_retry(
    runner: Runner[State, Any], store: MemoryCheckpointer[State], tid: str
) -> None:
    """What a client does with a run that did not get through: per the docs."""
    decision = await runner.evaluate_resume(ResumeToken(tid, 1))
    try:
        if decision.kind is ResumeDecisionKind.NOT_FOUND:
            await runner.start(tid, {}, run_lease=("client", 30))
        elif decision.status in (RunStatus.RUNNING, RunStatus.FAILED, RunStatus.CANCELED):
            assert decision.resume_token is not None
            await runner.resume(decision.resume_token, run_lease=("client", 30))
        elif decision.kind in (
            ResumeDecisionKind.HANDOFF_ORPHANED,
            ResumeDecisionKind.HANDOFF_PENDING,
        ):
            await runner.recover_stale_handoff(tid, stale_after=0)
    except (ConcurrencyConflictError, ThreadLeaseBusyError):
        pass
    _ = store


def main(argv: list[str] | None = None) -> int:
    """Run the stress test from the command line; returns the process exit status."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--handoffs", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--fault-rate", type=float, default=0.15)
    parser.add_argument("--crash-rate", type=float, default=0.05)
    args = parser.parse_args(argv)
    logging.getLogger("flowy").setLevel(logging.ERROR)  # injected faults are expected
    summary = asyncio.run(
        run_stress(
            args.handoffs, seed=args.seed, fault_rate=args.fault_rate, crash_rate=args.crash_rate
        )
    )
    print(" ".join(f"{k}={v}" for k, v in summary.items()))
    return 0 if summary["lost"] == 0 and summary["double_resumed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
