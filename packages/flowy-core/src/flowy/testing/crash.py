"""Crash checks of durable time and supersteps on a real store, with real processes
killed (SIGKILL).

Six checks, each against a store URL every process can open (so not ``memory://``,
which lives and dies with its process):

- :func:`check_activity_crash`: a worker process calls a payment gateway as an activity
  and is killed after the gateway charged, before the outcome is recorded. Another
  worker finds the outcome unknown, asks the ``reconcile`` hook, and never charges again.
- :func:`check_timer_race`: two worker processes fire the same due timers at once;
  each waiting thread is resumed once.
- :func:`check_signal_crash`: a worker process takes a signal and is killed before its
  step is saved; the signal is delivered again to the next worker, and the state and
  the outside world see it exactly once.
- :func:`check_fan_out_crash`: a worker process is killed in the middle of a superstep,
  after two of its branches finished; the next worker runs only the unfinished
  branches, and folds each branch once.
- :func:`check_cancel_running`: a worker process runs a long chain of steps and this
  process cancels the thread (``flowy.operations.cancel``); the worker stops within one
  step, lets go of its lease, and the thread's head is ``canceled``.
- :func:`check_queue_crash`: 4 worker processes serve one queue with a global limit of
  3 runs in flight and a partition limit of 1, while 500 hand-offs over 20 partitions
  run and workers are SIGKILLed at random (and replaced). Every hand-off completes
  exactly once, and the runs seen at work at once never exceed a limit.

Each returns a :class:`CrashReport`; ``python -m flowy.testing.crash --store URL`` runs
all six and prints one line each. The "outside world" is a file in a work folder: a
line per gateway call, written and flushed before the kill.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import signal
import sys
import tempfile
import time
import urllib.parse
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._activities import activity
from .._directives import Directive, completed, end, fan_out, handoff, sleep, wait_for
from .._graph import Graph, GraphBuilder
from .._runner import Runner
from .._types import RunStatus
from .._worker import Worker
from ..operations import cancel
from ..queues import DEFAULT_QUEUE, queues_of
from ..storage import Backend, DurableCheckpointer, HandoffStatus, connect

__all__ = [
    "CHECKS",
    "Check",
    "CrashReport",
    "check_activity_crash",
    "check_cancel_running",
    "check_fan_out_crash",
    "check_queue_crash",
    "check_signal_crash",
    "check_timer_race",
    "keeps_queues",
    "main",
]

State = dict[str, Any]
_KILL = "FLOWY_CRASH_KILL"
_CALLS = "FLOWY_CRASH_CALLS"
_LEASE_TTL = 1.0
_TIMER_LEASE_TTL = 30.0
"""The timer race kills no process, so nothing waits for its leases to run out: a lease
long enough that no loaded machine stalls a holder past it, as in production. (With 1 s,
a holder paused past its lease lets the other process run the node again, which is the
at-least-once a lost lease allows, not a double firing.)"""
_VISIBILITY = 2.0
_STOP = "stop"


@dataclass(frozen=True)
class CrashReport:
    """What one check saw: ``ok`` when every expectation held, ``detail`` says what."""

    check: str
    ok: bool
    detail: str

    def __str__(self) -> str:
        return f"{self.check}: {'ok' if self.ok else 'FAILED'} ({self.detail})"


def _merge(state: State, update: State) -> State:
    return {**state, **update}


def _calls(workdir: Path) -> list[str]:
    path = workdir / "calls.log"
    return path.read_text().splitlines() if path.exists() else []


def _record_call(line: str, *, sync: bool = True) -> None:
    """The outside world's record of a call, durable before anything else happens
    (``sync=False``: written to the kernel, which a SIGKILL cannot undo, not to disk)."""
    with open(os.environ[_CALLS], "a") as f:
        f.write(line + "\n")
        f.flush()
        if sync:
            os.fsync(f.fileno())


def _die_if(point: str) -> None:
    if os.environ.get(_KILL) == point:
        os.kill(os.getpid(), signal.SIGKILL)


# --- the graphs (imported by the parent and by the worker processes) --------------------


async def _charge(order: str, amount: int) -> dict[str, Any]:
    _record_call(f"charge {order} {amount}")
    _die_if("after_call")  # killed after the gateway charged, before the journal knows
    return {"charge": f"ch_{order}", "via": "call"}


def _find_charge(order: str, amount: int) -> dict[str, Any] | None:
    """The reconcile hook: look the charge up in the gateway's own records."""
    for line in Path(os.environ[_CALLS]).read_text().splitlines():
        if line == f"charge {order} {amount}":
            return {"charge": f"ch_{order}", "via": "reconcile"}
    return None


async def _hand_off(state: State) -> tuple[State, Directive[Any]]:
    return {}, handoff("to_worker", resume_at="pay")


async def _pay(state: State) -> tuple[State, Directive[Any]]:
    receipt = await activity(_charge, state["order"], 42, key="charge", reconcile=_find_charge)
    return {"receipt": receipt}, completed()


def payment_graph() -> Graph[State, Any]:
    """``start`` hands off; a worker runs ``pay``, which charges as an activity."""
    builder: GraphBuilder[State, Any] = GraphBuilder(_merge)
    return (
        builder.add_node("start", _hand_off)
        .add_node("pay", _pay)
        .add_edge("start", "pay")
        .allow_no_outgoing_route("pay")
        .compile()
    )


async def _nap(state: State) -> tuple[State, Directive[Any]]:
    return {}, sleep(0.0, resume_at="wake")


async def _wake(state: State) -> tuple[State, Directive[Any]]:
    _record_call(f"woke {state['id']} {os.getpid()}")
    await asyncio.sleep(0.02)
    return {"woke": True}, completed()


def timer_graph() -> Graph[State, Any]:
    """``nap`` sleeps 0 seconds; whoever fires the timer runs ``wake`` (logged)."""
    builder: GraphBuilder[State, Any] = GraphBuilder(_merge)
    return (
        builder.add_node("nap", _nap)
        .add_node("wake", _wake)
        .add_edge("nap", "wake")
        .allow_no_outgoing_route("wake")
        .compile()
    )


async def _await_approval(state: State) -> tuple[State, Directive[Any]]:
    return {}, wait_for("approval", resume_at="approved")


async def _notify(order: str) -> str:
    _record_call(f"notify {order}")
    return f"sent {order}"


async def _approved(state: State) -> tuple[State, Directive[Any]]:
    sent = await activity(_notify, state["order"], key="notify")
    _die_if("after_record")  # killed after the signal was taken, before the step's save
    return {"notified": sent}, completed()


def _count_approval(state: State, payload: Any) -> State:
    return {**state, "approvals": state.get("approvals", 0) + 1, "by": payload["by"]}


def approval_graph() -> Graph[State, Any]:
    """``wait`` waits for "approval"; ``approved`` notifies as an activity."""
    builder: GraphBuilder[State, Any] = GraphBuilder(_merge)
    return (
        builder.add_node("wait", _await_approval)
        .add_node("approved", _approved)
        .add_edge("wait", "approved")
        .allow_no_outgoing_route("approved")
        .on_signal("approval", _count_approval)
        .compile()
    )


async def _hand_off_grading(state: State) -> tuple[State, Directive[Any]]:
    return {}, handoff("to_worker", resume_at="split")


async def _split(state: State) -> tuple[State, Directive[Any]]:
    return {}, fan_out("grade", [{"draft": i} for i in range(4)], concurrency=1)


_graded: list[int] = []  # the branches this process finished


async def _grade(state: State) -> tuple[State, Directive[Any]]:
    draft = state["draft"]
    if len(_graded) == 2:
        _die_if("in_superstep")  # killed after two branches finished and were recorded
    _record_call(f"grade {state['id']} {draft}")
    _graded.append(draft)
    return {"grades": [draft]}, completed()


async def _collect(state: State) -> tuple[State, Directive[Any]]:
    return {}, end()


def _append(state: State, update: State) -> State:
    return {
        **state,
        **{k: [*state.get(k, []), *v] if k == "grades" else v for k, v in update.items()},
    }


def grading_graph() -> Graph[State, Any]:
    """``start`` hands off; a worker runs ``split``: four ``grade`` branches, one at a
    time, folded into ``grades``."""
    builder: GraphBuilder[State, Any] = GraphBuilder(_append)
    return (
        builder.add_node("start", _hand_off_grading)
        .add_node("split", _split)
        .add_node("grade", _grade)
        .add_node("collect", _collect)
        .add_edge("start", "split")
        .add_edge("split", "collect")
        .add_fan_out("split", "grade", then="collect")
        .allow_no_outgoing_route("collect")
        .compile()
    )


_CHAIN = 400
"""Steps of the long chain: far more than run before the cancel."""


async def _hand_off_chain(state: State) -> tuple[State, Directive[Any]]:
    return {}, handoff("to_worker", resume_at="step")


async def _step(state: State) -> tuple[State, Directive[Any]]:
    done = state.get("steps", 0)
    _record_call(f"step {state['id']} {done}")
    await asyncio.sleep(0.02)
    return {"steps": done + 1}, completed() if done + 1 < _CHAIN else end()


def _route_step(state: State) -> str:
    return "step" if state.get("steps", 0) < _CHAIN else "last"


async def _last(state: State) -> tuple[State, Directive[Any]]:
    return {"finished": True}, end()


def chain_graph() -> Graph[State, Any]:
    """``start`` hands off; a worker runs ``step`` again and again (saving each), a long
    chain nobody waits out."""
    builder: GraphBuilder[State, Any] = GraphBuilder(_merge)
    return (
        builder.add_node("start", _hand_off_chain)
        .add_node("step", _step)
        .add_node("last", _last)
        .add_edge("start", "step")
        .add_conditional_edge("step", _route_step, "step", "last")
        .allow_no_outgoing_route("last")
        .compile(max_steps=_CHAIN + 10)
    )


async def _route(state: State) -> tuple[State, Directive[Any]]:
    route = {"queue": state["queue"], "partition_key": state["partition"]}
    return {}, handoff("limited", resume_at="work", **route)


async def _work(state: State) -> tuple[State, Directive[Any]]:
    """Logs when it begins and ends (by the wall clock shared by every process)."""
    line = f"{state['id']} {state['partition']} {os.getpid()}"
    _record_call(f"begin {line} {time.time():.6f}", sync=False)
    await asyncio.sleep(random.uniform(0.02, 0.06))
    _record_call(f"end {line} {time.time():.6f}", sync=False)
    return {"done": state.get("done", 0) + 1}, end()


def limited_graph() -> Graph[State, Any]:
    """``start`` hands off to the queue and partition its state names; a worker runs
    ``work`` (its begin and end logged)."""
    builder: GraphBuilder[State, Any] = GraphBuilder(_merge)
    return (
        builder.add_node("start", _route)
        .add_node("work", _work)
        .add_edge("start", "work")
        .allow_no_outgoing_route("work")
        .compile()
    )


_GRAPHS = {
    "chain": chain_graph,
    "payment": payment_graph,
    "timer": timer_graph,
    "approval": approval_graph,
    "grading": grading_graph,
    "limited": limited_graph,
}


# --- processes ----------------------------------------------------------------------------


async def _worker_main(url: str, graph: str, workdir: str, mode: str, queue: str) -> None:
    os.environ[_CALLS] = str(Path(workdir) / "calls.log")
    ttl = _TIMER_LEASE_TTL if mode == "timers" else _LEASE_TTL
    async with await connect(url) as backend:
        runner = Runner(_GRAPHS[graph](), backend, run_lease=(f"p{os.getpid()}", ttl))
        worker = Worker(
            runner,
            owner=f"p{os.getpid()}",
            lease_ttl=ttl,
            visibility_timeout=_VISIBILITY,
            timer_interval=0.01,
            retry_delay=0.1,
            queues=(queue,),
        )
        if mode == "timers":
            while await worker.fire_timers(limit=1000):
                pass
        elif mode == "serve":  # until the parent writes its stop file
            serving = asyncio.ensure_future(worker.run())
            while not (Path(workdir) / _STOP).exists():
                if (await asyncio.wait({serving}, timeout=0.05))[0]:
                    break
            worker.stop()
            await serving
        else:
            await worker.run_until_idle(idle_wait=1.0 if graph == "chain" else 5.0)


def _worker_command(url: str, graph: str, workdir: Path, mode: str, queue: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "flowy.testing.crash",
        "--worker",
        graph,
        "--store",
        url,
        "--workdir",
        str(workdir),
        "--mode",
        mode,
        "--queue",
        queue,
    ]


async def _spawn(url: str, graph: str, workdir: Path, mode: str, kill: str = "") -> int:
    """Run a worker process to its end (or its SIGKILL); its exit code."""
    env = {**os.environ, _KILL: kill, _CALLS: str(workdir / "calls.log")}
    proc = await asyncio.create_subprocess_exec(
        *_worker_command(url, graph, workdir, mode, DEFAULT_QUEUE),
        env=env,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 120)
    code = proc.returncode
    if code not in (0, -signal.SIGKILL):
        raise RuntimeError(f"worker process failed ({code}): {err.decode()[-2000:]}")
    return code


async def _finish(runner: Runner[State, Any], thread_id: str, seconds: float = 60.0) -> None:
    """Run workers in this process until ``thread_id`` completes (the killed process's
    lease and message visibility run out first)."""
    worker = Worker(
        runner,
        owner=f"p{os.getpid()}-survivor",
        lease_ttl=_LEASE_TTL,
        visibility_timeout=_VISIBILITY,
        timer_interval=0.05,
        retry_delay=0.1,
        busy_grace=_LEASE_TTL * 2,
    )
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await worker.run_until_idle(idle_wait=0.5)
        head, _ = await runner.head(thread_id)
        if head.status is RunStatus.COMPLETED:
            return
    raise TimeoutError(f"thread {thread_id!r} did not complete in {seconds:.0f}s")


# --- the checks ---------------------------------------------------------------------------


async def check_activity_crash(url: str, workdir: Path) -> CrashReport:
    """Killed between an activity's call and its record: unknown → reconcile, one call."""
    os.environ[_CALLS] = str(workdir / "calls.log")
    thread = f"crash-activity-{uuid.uuid4().hex[:10]}"
    async with await connect(url) as backend:
        runner = Runner(payment_graph(), backend, run_lease=("parent", _LEASE_TTL))
        await runner.start(thread, {"order": thread})
        code = await _spawn(url, "payment", workdir, "messages", kill="after_call")
        journal_after_kill = await _journal(backend, thread)
        await _finish(runner, thread)
        head, _ = await runner.head(thread)
        journal = await _journal(backend, thread)
    calls = [c for c in _calls(workdir) if c.startswith(f"charge {thread}")]
    ok = (
        code == -signal.SIGKILL
        and journal_after_kill == [("charge", "started", 1)]
        and len(calls) == 1
        and head.state.get("receipt") == {"charge": f"ch_{thread}", "via": "reconcile"}
        and journal == [("charge", "succeeded", 1)]
    )
    return CrashReport(
        "activity",
        ok,
        f"killed={code == -signal.SIGKILL} journal after kill={journal_after_kill} "
        f"gateway calls={len(calls)} receipt={head.state.get('receipt')} journal={journal}",
    )


async def check_timer_race(url: str, workdir: Path, threads: int = 20) -> CrashReport:
    """Two worker processes fire the same due timers: every thread resumes once."""
    os.environ[_CALLS] = str(workdir / "calls.log")
    ids = [f"crash-timer-{uuid.uuid4().hex[:10]}-{i}" for i in range(threads)]
    async with await connect(url) as backend:
        runner = Runner(timer_graph(), backend, run_lease=("parent", _LEASE_TTL))
        for thread in ids:
            await runner.start(thread, {"id": thread})
        await asyncio.gather(*(_spawn(url, "timer", workdir, "timers") for _ in range(2)))
        completed_ = 0
        for thread in ids:
            head, _ = await runner.head(thread)
            completed_ += head.status is RunStatus.COMPLETED
    woke = [c.split() for c in _calls(workdir) if c.startswith("woke crash-timer-")]
    per_thread = {t: sum(1 for w in woke if w[1] == t) for t in ids}
    processes = {w[2] for w in woke if w[1] in per_thread}
    twice = sum(n > 1 for n in per_thread.values())
    never = sum(n == 0 for n in per_thread.values())
    ok = completed_ == threads and twice == never == 0
    return CrashReport(
        "timer race",
        ok,
        f"threads={threads} completed={completed_} resumed twice={twice} never={never} "
        f"processes that fired={len(processes)}",
    )


async def check_signal_crash(url: str, workdir: Path) -> CrashReport:
    """Killed after taking a signal, before saving: delivered again, applied once."""
    os.environ[_CALLS] = str(workdir / "calls.log")
    thread = f"crash-signal-{uuid.uuid4().hex[:10]}"
    async with await connect(url) as backend:
        runner = Runner(approval_graph(), backend, run_lease=("parent", _LEASE_TTL))
        await runner.start(thread, {"order": thread})
        await runner.signal(thread, "approval", {"by": "reviewer"}, signal_id="review-1")
        code = await _spawn(url, "approval", workdir, "messages", kill="after_record")
        waiting, _ = await runner.head(thread)
        await _finish(runner, thread)
        head, _ = await runner.head(thread)
        durable = backend.checkpointer
        assert isinstance(durable, DurableCheckpointer)
        inbox = await durable.signals(thread)
    calls = [c for c in _calls(workdir) if c == f"notify {thread}"]
    ok = (
        code == -signal.SIGKILL
        and waiting.status is RunStatus.WAITING
        and head.state.get("approvals") == 1
        and dict(head.signal_cursors) == {"approval": 1}
        and len(inbox) == 1
        and len(calls) == 1
    )
    return CrashReport(
        "signal",
        ok,
        f"killed={code == -signal.SIGKILL} head after kill={waiting.status.value} "
        f"approvals={head.state.get('approvals')} cursors={dict(head.signal_cursors)} "
        f"signals stored={len(inbox)} notifications={len(calls)}",
    )


async def check_fan_out_crash(url: str, workdir: Path) -> CrashReport:
    """Killed mid-superstep: the finished branches are not run again, each folds once."""
    os.environ[_CALLS] = str(workdir / "calls.log")
    thread = f"crash-fanout-{uuid.uuid4().hex[:10]}"
    async with await connect(url) as backend:
        runner = Runner(grading_graph(), backend, run_lease=("parent", _LEASE_TTL))
        await runner.start(thread, {"id": thread})
        code = await _spawn(url, "grading", workdir, "messages", kill="in_superstep")
        before = [c for c in _calls(workdir) if c.startswith(f"grade {thread} ")]
        await _finish(runner, thread)
        head, _ = await runner.head(thread)
    calls = [c.split()[-1] for c in _calls(workdir) if c.startswith(f"grade {thread} ")]
    ok = (
        code == -signal.SIGKILL
        and len(before) == 2
        and sorted(calls) == ["0", "1", "2", "3"]
        and head.state.get("grades") == [0, 1, 2, 3]
    )
    return CrashReport(
        "fan-out",
        ok,
        f"killed={code == -signal.SIGKILL} branches finished before the kill={len(before)} "
        f"branch runs in all={len(calls)} grades={head.state.get('grades')}",
    )


async def check_cancel_running(url: str, workdir: Path) -> CrashReport:
    """A worker process runs a long chain; cancelled from here, it stops within a step."""
    os.environ[_CALLS] = str(workdir / "calls.log")
    thread = f"crash-cancel-{uuid.uuid4().hex[:10]}"

    def steps() -> int:
        return sum(1 for c in _calls(workdir) if c.startswith(f"step {thread} "))

    async with await connect(url) as backend:
        runner = Runner(chain_graph(), backend, run_lease=("parent", _LEASE_TTL))
        await runner.start(thread, {"id": thread})
        worker = asyncio.ensure_future(_spawn(url, "chain", workdir, "messages"))
        for _ in range(6000):  # up to a minute for the worker to start the chain
            if steps() >= 5 or worker.done():
                break
            await asyncio.sleep(0.01)
        outcome = await cancel(backend, thread, reason="operator")
        at_cancel = steps()
        code = await worker
        after = steps()
        head, token = await runner.head(thread)
        revision = token.snapshot_revision
        holder = await backend.leases.holder(thread)
    ran_on = after - at_cancel
    ok = (
        code == 0
        and outcome.changed
        and outcome.previous_status is RunStatus.RUNNING
        and 5 <= at_cancel < _CHAIN
        and ran_on <= 1
        and head.status is RunStatus.CANCELED
        and head.reason == "canceled: operator"
        and revision == outcome.revision
        and holder is None
    )
    return CrashReport(
        "cancel",
        ok,
        f"worker exit={code} steps before the cancel={at_cancel} steps started after it="
        f"{ran_on} head={head.status.value} ({head.reason}) at revision {revision}, the "
        f"cancel's {outcome.revision} fenced {outcome.fenced.owner if outcome.fenced else None}"
        f" lease left={holder is not None}",
    )


_QUEUE_WORKERS = 4
_GLOBAL_LIMIT = 3
_PARTITION_LIMIT = 1


_QUEUE_ATTEMPTS = 50
"""Deliveries before a dead letter in the queue check: each kill of a worker at work
costs its runs a delivery, and so does each claim that finds its thread still leased."""


def _with_query(url: str, **options: object) -> str:
    """``url`` with ``options`` set in its query (every flowy store takes
    ``max_attempts`` there)."""
    base, _, query = url.partition("?")
    values = dict(urllib.parse.parse_qsl(query, keep_blank_values=True))
    values.update({k: str(v) for k, v in options.items()})
    return f"{base}?{urllib.parse.urlencode(values)}"


async def keeps_queues(url: str) -> bool:
    """Whether the store at ``url`` keeps queues (:func:`check_queue_crash` needs them)."""
    async with await connect(url) as backend:
        return backend.capabilities.queues


async def check_queue_crash(
    url: str,
    workdir: Path,
    handoffs: int = 500,
    partitions: int = 20,
    kills: int = 6,
    limited: bool = True,
    seconds: float = 600.0,
) -> CrashReport:
    """Queue limits hold while worker processes die.

    4 processes serve one queue (a global limit of 3 in flight, 1 per partition);
    ``handoffs`` runs over ``partitions`` partitions hand off to it; ``kills`` times a
    random worker (one at work when one is) is SIGKILLed and replaced. Every hand-off
    completes once, and the runs seen at work at once (from the begin and end each logs,
    a killed one's end being its kill) never exceed a limit.

    The store is opened with ``max_attempts`` set to 50 in its URL's query, so that the
    deliveries the kills cost never dead-letter a message.

    The hand-offs start while the workers run; the check gives up after ``seconds``.
    ``limited=False`` configures no limits: the check must then fail, which shows that
    it can see runs at work beyond them."""
    os.environ[_CALLS] = str(workdir / "calls.log")
    url = _with_query(url, max_attempts=_QUEUE_ATTEMPTS)
    tag = uuid.uuid4().hex[:10]
    queue = f"crash-{tag}"
    ids = [f"crash-queue-{tag}-{i}" for i in range(handoffs)]
    rng = random.Random(tag)
    killed: dict[str, float] = {}  # pid -> when it was seen dead
    procs: list[asyncio.subprocess.Process] = []

    async def spawn() -> None:
        procs.append(
            await asyncio.create_subprocess_exec(
                *_worker_command(url, "limited", workdir, "serve", queue),
                env={**os.environ, _CALLS: str(workdir / "calls.log")},
                stderr=asyncio.subprocess.DEVNULL,
            )
        )

    async with await connect(url) as backend:
        if limited:
            await queues_of(backend).configure(
                queue, global_concurrency=_GLOBAL_LIMIT, partition_concurrency=_PARTITION_LIMIT
            )
        # The parent's lease outlasts a start on a slow store (moto serves DynamoDB).
        runner = Runner(limited_graph(), backend, run_lease=("parent", _TIMER_LEASE_TTL))
        starting = asyncio.Semaphore(8)

        async def start(i: int, thread: str) -> None:
            async with starting:
                state = {"id": thread, "queue": queue, "partition": f"part-{i % partitions}"}
                result = (await runner.start(thread, state)).raise_for_error()
                if result.handoff_status is not HandoffStatus.ENQUEUED:
                    raise RuntimeError(f"the start of {thread} did not hand off: {result!r:.300}")

        for _ in range(_QUEUE_WORKERS):
            await spawn()
        # The hand-offs arrive while the workers run (and die).
        starts = asyncio.ensure_future(asyncio.gather(*(start(i, t) for i, t in enumerate(ids))))
        deadline = time.monotonic() + seconds
        finished = False
        try:
            while time.monotonic() < deadline:
                await asyncio.sleep(rng.uniform(0.3, 1.2))
                if starts.done():
                    starts.result()  # a start that failed fails the check
                    stats = [q for q in await queues_of(backend).list() if q.queue == queue]
                    if all(q.pending == q.in_flight == 0 for q in stats):  # none: not listed
                        finished = True
                        break
                if len(killed) < kills:  # a worker at work if one is soon, so slots are held
                    chosen: list[int] = []
                    for _ in range(50):
                        busy = _at_work(_calls(workdir))
                        chosen = [i for i, proc in enumerate(procs) if str(proc.pid) in busy]
                        if chosen:
                            break
                        await asyncio.sleep(0.01)
                    victim = procs.pop(rng.choice(chosen or range(len(procs))))
                    victim.send_signal(signal.SIGKILL)
                    await victim.wait()
                    killed[str(victim.pid)] = time.time()
                    await spawn()
        finally:
            if not starts.done():
                starts.cancel()
                await asyncio.wait([starts])
            (workdir / _STOP).touch()
            for proc in procs:
                try:
                    await asyncio.wait_for(proc.wait(), 30)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
        exits = [proc.returncode for proc in procs]

        async def head(thread: str) -> tuple[Any, Any]:
            async with starting:
                return await runner.head(thread)

        heads = await asyncio.gather(*(head(t) for t in ids))
        mine = set(ids)
        dead = [
            d
            for d in await backend.consumer.dead_letters(1000)
            if d.intent is not None and d.intent.thread_id in mine
        ]
    done = [head.state.get("done", 0) for head, _ in heads]
    unfinished = Counter(
        f"{head.status.value}/{head.handoff_status.value}"
        for head, _ in heads
        if head.status is not RunStatus.COMPLETED
    )
    lost = sum(unfinished.values())
    double = sum(n > 1 for n in done)
    most, most_per_partition, interrupted = _most_at_work(_calls(workdir), killed, ids)
    store = url.split(":", 1)[0]
    ok = (
        finished
        and lost == double == 0
        and all(code == 0 for code in exits)
        and (len(killed) > 0 or kills == 0)
        and most <= _GLOBAL_LIMIT
        and most_per_partition <= _PARTITION_LIMIT
    )
    return CrashReport(
        "queue limits",
        ok,
        f"store={store} handoffs={handoffs} max_in_flight={most} "
        f"max_per_partition={most_per_partition} lost={lost} double={double} "
        f"(limits {_GLOBAL_LIMIT} and {_PARTITION_LIMIT}; workers killed={len(killed)}, "
        f"runs killed at work={interrupted}, exits of the last {len(exits)}={exits}"
        + ("" if finished else f"; not finished in {seconds:g} s")
        + (f"; unfinished heads {dict(unfinished)}, dead letters {len(dead)}" if lost else "")
        + (f": {dead[0].error[:300]!r}" if dead else "")
        + ")",
    )


def _at_work(lines: list[str]) -> set[str]:
    """The processes (pids) that logged a begin without its end."""
    open_: set[tuple[str, str]] = set()
    for line in lines:
        fields = line.split()
        if len(fields) == 5 and fields[0] == "begin":
            open_.add((fields[1], fields[3]))
        elif len(fields) == 5 and fields[0] == "end":
            open_.discard((fields[1], fields[3]))
    return {pid for _, pid in open_}


def _most_at_work(
    lines: list[str], killed: dict[str, float], ids: list[str]
) -> tuple[int, int, int]:
    """The most runs at work at once, in all and in one partition, and the runs killed at
    work. A run is at work from
    its logged begin to its logged end, or to its process's kill; at equal times an end
    comes first (the next claim follows the ack, which follows the end)."""
    wanted = set(ids)
    begun: dict[tuple[str, str], tuple[str, float]] = {}  # (thread, pid) -> (partition, t)
    spans: list[tuple[str, float, float]] = []
    for line in lines:
        fields = line.split()
        if len(fields) != 5 or fields[0] not in ("begin", "end") or fields[1] not in wanted:
            continue
        what, thread, partition, pid, at = fields
        if what == "begin":
            begun[thread, pid] = (partition, float(at))
        elif (thread, pid) in begun:
            partition, start = begun.pop((thread, pid))
            spans.append((partition, start, float(at)))
    for (_, pid), (partition, start) in begun.items():  # never ended: killed at work
        spans.append((partition, start, killed.get(pid, math.inf)))
    interrupted = len(begun)

    def most(chosen: list[tuple[str, float, float]]) -> int:
        events = sorted([(s, 1) for _, s, _ in chosen] + [(e, -1) for _, _, e in chosen])
        at_work = peak = 0
        for _, step in events:
            at_work += step
            peak = max(peak, at_work)
        return peak

    partitions = {partition for partition, _, _ in spans}
    per_partition = [most([x for x in spans if x[0] == p]) for p in partitions]
    return most(spans), max(per_partition, default=0), interrupted


async def _journal(backend: Backend[Any], thread: str) -> list[tuple[str, str, int]]:
    cp = backend.checkpointer
    assert isinstance(cp, DurableCheckpointer)
    return [(r.key, r.status.value, r.attempts) for r in await cp.journal(thread)]


Check = Callable[[str, Path], Awaitable[CrashReport]]
"""``check(url, workdir)``: one crash check on the store at ``url``."""

CHECKS: tuple[Check, ...] = (
    check_activity_crash,
    check_timer_race,
    check_signal_crash,
    check_fan_out_crash,
    check_cancel_running,
    check_queue_crash,
)
"""Every crash check, in the order ``main`` runs them."""


async def run_all(url: str) -> list[CrashReport]:
    """The checks on ``url``, each in a fresh work folder."""
    reports: list[CrashReport] = []
    for check in CHECKS:
        with tempfile.TemporaryDirectory(prefix="flowy-crash-") as folder:
            reports.append(await check(url, Path(folder)))
    return reports


def main(argv: list[str] | None = None) -> int:
    """``python -m flowy.testing.crash --store URL``: run the checks, one line each."""
    parser = argparse.ArgumentParser(prog="python -m flowy.testing.crash")
    parser.add_argument("--store", required=True, help="a store URL every process can open")
    parser.add_argument("--worker", choices=sorted(_GRAPHS), help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=("messages", "timers", "serve"), help=argparse.SUPPRESS)
    parser.add_argument("--queue", default=DEFAULT_QUEUE, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        asyncio.run(_worker_main(args.store, args.worker, args.workdir, args.mode, args.queue))
        return 0
    reports = asyncio.run(run_all(args.store))
    for report in reports:
        print(report)
    return 0 if all(r.ok for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
