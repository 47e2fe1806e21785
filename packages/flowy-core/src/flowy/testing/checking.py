"""Crash-safety checking of your own graph: ``flowy.testing.check(graph, scenario)``.

The checker plays every part around the graph: the application that starts the thread
and retries a call that failed, the human who approves a suspended run, the outside
world that sends signals, the clock, and the processes that run it: foreground callers
and ``flowy.Worker`` processes. Each run follows a deterministic random schedule of
faults, drawn from its seed:

- a process crashes before or right after a store operation (every save, activity
  journal record, outbox write, ack and lease): "crash after node 'refund' returned,
  before save #3" is a crash between a side effect and the save that records it;
- the store refuses an operation (transient unavailability), or performs it and loses
  the answer (unknown commit outcome);
- a run's lease expires mid-run and another process takes the thread over;
- a hand-off message's ack is lost and the message is delivered again, late;
- two processes resume one suspended thread with the same token at once;
- a waiting thread's timer fires before the signal it waits for.

A crashed process's lease and claimed messages are given up, as their expiry would, and
the next process carries on, until the thread is finished or waits for something no one
will send. Then the checker verifies:

- the thread ends in a terminal state, or suspended or waiting for a reply the scenario
  does not give;
- no hand-off is lost (a hand-off head, a dead letter) or resumed twice (a second
  delivery ran steps after the first one's end was saved);
- the history is one chain of consecutive revisions;
- every activity's function was called at most once (``idempotent=True`` ones may be
  called again), and exactly once for the keys in ``Scenario.exactly_once``; no effect
  was delivered more often than it was saved;
- your invariants (``@flowy.invariant``) over every saved state, and your scenario's
  post-conditions (``Scenario.expect``) over the final state and your fakes.

A failing run is shrunk to the fewest faults that still fail, and printed with its seed,
its schedule in words, the thread's history and a command that replays it. The memory
store is the default (a fresh one per run, on a simulated clock); ``store=URL`` runs the
same schedules on a real store, in a scratch store of its own next to the one ``URL``
names (``flowy.storage.dialect.open_scratch``), removed when the check ends. See
``docs/checking.md``.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import json
import logging
import random
import re
import selectors
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, NoReturn, cast

from .._activities import on_call
from .._errors import LeaseError, StorageError, StorageUnavailableError, ThreadNotFoundError
from .._graph import Graph
from .._invariants import is_invariant
from .._results import RunResult
from .._runner import Runner
from .._types import HandoffStatus, RunStatus, S
from .._worker import Worker
from ..memory import MemoryBackend, MemoryStore
from ..storage import (
    ActivityStatus,
    Backend,
    DurableCheckpointer,
    HandoffIntent,
    Lease,
    OutboxMessage,
    Snapshot,
    redact_url,
)
from ..storage.dialect import BaseBackend, open_scratch

__all__ = [
    "CheckReport",
    "acheck",
    "Counterexample",
    "Fault",
    "FaultKind",
    "Scenario",
    "check",
    "parse_schedule",
]

_LEASE_TTL = 30.0
_VISIBILITY = 60.0
_MAX_ACTIONS = 200
_EPOCH = 1_800_000_000.0


class FaultKind(enum.StrEnum):
    """What strikes at one point of a run."""

    CRASH_BEFORE = "crash-before"
    """The process dies before the operation."""
    CRASH_AFTER = "crash-after"
    """The operation lands; the process dies before it hears back."""
    UNAVAILABLE = "unavailable"
    """The store refuses the operation (it is down for a moment)."""
    UNKNOWN = "unknown"
    """The operation lands, but the caller gets an error: its outcome is unknown."""
    TAKEOVER = "takeover"
    """Before the operation, the run's lease expires and another process takes the
    thread over; then this process goes on."""
    REDELIVER = "redeliver"
    """The ack of a processed message is lost: the message is delivered again, late."""
    CONCURRENT = "concurrent"
    """Two processes resume the suspended thread with the same token at once."""
    TIMER_FIRST = "timer-first"
    """The waiting thread's timer fires before the signal it waits for arrives."""


_STORE_FAULTS = (
    FaultKind.CRASH_BEFORE,
    FaultKind.CRASH_AFTER,
    FaultKind.UNAVAILABLE,
    FaultKind.UNKNOWN,
)
_KINDS: dict[str, tuple[FaultKind, ...]] = {
    "save": (*_STORE_FAULTS, FaultKind.TAKEOVER),
    "journal": _STORE_FAULTS,
    "signal": _STORE_FAULTS,
    "enqueue": _STORE_FAULTS,
    "ack": (FaultKind.CRASH_BEFORE, FaultKind.REDELIVER),
    "acquire": (FaultKind.CRASH_AFTER, FaultKind.UNAVAILABLE),
    "resume": (FaultKind.CONCURRENT,),
    "wait": (FaultKind.TIMER_FIRST,),
}


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault of a schedule: ``kind`` at the run's operation number ``at``."""

    at: int
    """The operation it strikes (counted from 1 over the whole run)."""
    kind: FaultKind
    """What happens there."""

    def __str__(self) -> str:
        return f"{self.kind.value}@{self.at}"


def parse_schedule(text: str) -> tuple[Fault, ...]:
    """A schedule as printed by a report (``"crash-before@9,redeliver@14"``).

    Raises:
        ValueError: a part is not ``KIND@N`` with a known kind and a positive ``N``.
    """
    faults: list[Fault] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        found = re.fullmatch(r"([a-z-]+)@([0-9]{1,9})", part)
        kinds = ", ".join(k.value for k in FaultKind)
        if found is None or found.group(1) not in FaultKind.__members__.values():
            raise ValueError(f"bad fault {part[:60]!r}: give KIND@N, KIND one of {kinds}")
        at = int(found.group(2))
        if at < 1:
            raise ValueError(f"bad fault {part!r}: operations are counted from 1")
        faults.append(Fault(at, FaultKind(found.group(1))))
    return tuple(sorted(faults, key=lambda f: f.at))


@dataclass(frozen=True)
class Scenario(Generic[S]):
    """One thread's story: what it starts with, the fakes its nodes use, how the world
    answers it, and what must be true at the end. A scenario function returns a fresh
    one (fresh fakes) for every run."""

    state: S
    """The initial state."""
    thread_id: str = "checked"
    """The thread's id (on a real store the checker adds the run's number)."""
    bindings: Any = None
    """The ``RunBindings`` every start and resume gets (your fakes)."""
    metadata: Mapping[str, Any] | None = None
    """Run metadata of the start."""
    approve: Callable[[Snapshot[S]], Mapping[str, Any] | None] | None = None
    """The human: ``approve(head)`` returns the state overlay that resumes a suspended
    head (``None``: leave it suspended)."""
    signal: Callable[[Snapshot[S]], Any] | None = None
    """The outside world: ``signal(head)`` returns the payload of the signal a waiting
    head waits for (``head.waiting_for``), or ``None`` to send none."""
    expect: Sequence[Callable[[S], object]] = ()
    """Post-conditions, called with the final state once the thread settled: each
    returns ``False`` or raises ``AssertionError`` when it fails (check your fakes'
    call log here)."""
    invariants: Sequence[Callable[[S], object]] = ()
    """Invariants over every saved state, besides the ``@flowy.invariant`` functions
    of the scenario's module."""
    exactly_once: Collection[str] = ()
    """Activity keys whose function must have been called exactly once."""


@dataclass(frozen=True)
class Counterexample:
    """A failing run, shrunk: how to see it again and what went wrong."""

    seed: int
    """The seed whose schedule first failed."""
    schedule: tuple[Fault, ...]
    """The shrunk schedule (``replay=`` takes its text)."""
    words: tuple[str, ...]
    """The schedule in words, one line per fault."""
    violations: tuple[str, ...]
    """What failed."""
    history: tuple[str, ...]
    """The thread's saved history, oldest first, one line per snapshot."""
    replay: str
    """A command that replays the schedule."""
    found_with: int
    """Faults in the schedule before shrinking."""


@dataclass(frozen=True)
class CheckReport:
    """What :func:`check` found: ``ok`` when no run failed."""

    graph: str
    """The graph's name in the report."""
    store: str
    """The store checked on."""
    seeds: int
    """Seeds run (up to and including the failing one)."""
    runs: int
    """Runs in all, shrinking included."""
    faults: Mapping[str, int]
    """Faults injected over all seeds, by kind."""
    seconds: float
    """Wall time."""
    failure: Counterexample | None = None
    """The first failure, shrunk (``None``: every seed passed)."""
    scratch: str | None = None
    """On a store URL: the scratch store the runs used (its URL, password masked),
    removed when the check ended; ``None`` otherwise."""

    @property
    def ok(self) -> bool:
        """True when every run passed."""
        return self.failure is None

    def __str__(self) -> str:
        rate = self.runs / self.seconds * 60 if self.seconds else 0.0
        head = f"flowy check {self.graph} on {self.store}"
        scratch = [f"  ran in the scratch store {self.scratch} (removed)"] if self.scratch else []
        if self.failure is None:
            return "\n".join(
                [
                    f"{head}: passed {self.seeds} seeds ({self.seconds:.1f}s, {rate:,.0f} "
                    f"runs/min)",
                    f"  faults injected: {sum(self.faults.values())} ("
                    + ", ".join(f"{k} {n}" for k, n in sorted(self.faults.items()))
                    + ")",
                    *scratch,
                ]
            )
        f = self.failure
        noun = "fault" if len(f.schedule) == 1 else "faults"
        lines = [
            f"{head}: FAILED at seed {f.seed} (after {self.seeds} seeds, {self.runs} runs, "
            f"{self.seconds:.1f}s)",
            *(f"  violated: {v}" for v in f.violations),
            f"  schedule ({len(f.schedule)} {noun}, shrunk from {f.found_with}):",
            *(f"    {i}. {w}" for i, w in enumerate(f.words, 1)),
            "  history:",
            *(f"    {h}" for h in f.history),
            f"  replay: {f.replay}",
            *scratch,
        ]
        return "\n".join(lines)


class _Crash(BaseException):
    """The simulated death of a process (a ``BaseException``: nothing in it survives)."""


class _Clock:
    """The simulated clock of a run: it moves only when the checker lets time pass."""

    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, to: float) -> None:
        self.now = max(self.now, to)


def _node_words(snapshot: Snapshot[Any]) -> str:
    return f"{snapshot.status.value} at {snapshot.execution_pointer!r}"


class _Proxy:
    """A component of one process's view of the store: reads pass through, the
    operations that change the store go through the run's fault schedule."""

    def __init__(self, inner: Any, process: _Process, writes: Mapping[str, str]) -> None:
        self._inner = inner
        self._process = process
        self._writes = writes

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if self._process.dead and callable(value):
            return self._process.gone
        op = self._writes.get(name)
        if op is None:
            return value
        return self._process.run.operation(self._process, op, name, value)


class _CheckpointerProxy(_Proxy):
    @property
    def domain(self) -> object:
        # Each simulated process is a process of its own to the runner's in-process
        # guard, while its saves still fence the store's leases.
        return ("flowy-check", self._process.serial)

    def fences(self, leases: Any) -> bool:
        inner = leases._inner if isinstance(leases, _Proxy) else leases
        return bool(self._inner.fences(inner))

    def with_codec(self, codec: Any) -> _CheckpointerProxy:
        return _CheckpointerProxy(self._inner.with_codec(codec), self._process, self._writes)


_CHECKPOINTER_WRITES = {
    "save": "save",
    "save_with_outbox": "save",
    "put_activity": "journal",
    "append_signal": "signal",
}


class _ProcessBackend:
    """What one simulated process sees of the store."""

    def __init__(self, base: Backend[Any], process: _Process) -> None:
        self.url = base.url
        self.checkpointer = _CheckpointerProxy(base.checkpointer, process, _CHECKPOINTER_WRITES)
        self.leases = _Proxy(base.leases, process, {"acquire": "acquire", "release": "release"})
        self.outbox = _Proxy(base.outbox, process, {"enqueue_intent": "enqueue"})
        self.consumer = _Proxy(
            base.consumer, process, {"claim": "claim", "ack": "ack", "release": "release"}
        )


_SERIALS = itertools.count(1)


class _Process:
    """One simulated process: its runner and worker, what it holds, and whether it died."""

    def __init__(self, run: _Run[Any], number: int) -> None:
        self.run = run
        self.number = number
        self.serial = next(_SERIALS)
        self.dead = False
        self.leases: dict[str, Lease] = {}
        self.claimed: dict[str, OutboxMessage] = {}
        backend = _ProcessBackend(run.base, self)
        self.runner: Runner[Any, Any] = Runner(
            run.graph,
            cast(Backend[Any], backend),
            run_lease=(f"process-{number}", _LEASE_TTL),
            clock=run.clock,
            handoff_stale_after=0.0,
        )
        options = run.resume_options()
        self.worker: Worker[Any, Any] = Worker(
            self.runner,
            cast(Any, backend.consumer),
            owner=f"process-{number}",
            lease_ttl=_LEASE_TTL,
            concurrency=1,
            visibility_timeout=_VISIBILITY,
            retry_delay=0.0,
            retry_jitter=0.0,
            busy_grace=0.0,
            stale_after=0.0,
            resume_options=lambda intent: options,
            on_result=run.on_result,
        )

    async def gone(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise _Crash(f"process {self.number} is dead")

    def die(self) -> NoReturn:
        self.dead = True
        raise _Crash(f"process {self.number} crashed")


@dataclass
class _Outcome:
    violations: list[str]
    fired: list[tuple[Fault, str, str]]
    history: list[str]
    operations: list[tuple[str, str]]


class _Run(Generic[S]):
    """One run of a scenario under one schedule."""

    def __init__(
        self,
        graph: Graph[S, Any],
        scenario: Scenario[S],
        base: Backend[S],
        clock: _Clock,
        thread_id: str,
        faults: Mapping[int, FaultKind],
        invariants: Sequence[Callable[[Any], object]],
        by_words: Sequence[tuple[str, FaultKind]] = (),
        created: Collection[str] = (),
    ) -> None:
        self.by_words = list(by_words)
        self.created = created  # the threads of this check (their messages are its own)
        self.graph = graph
        self.scenario = scenario
        self.base = base
        self.clock = clock
        self.thread_id = thread_id
        self.faults = faults
        self.invariants = invariants
        self.ops = 0
        self.operations: list[tuple[str, str]] = []  # (kind, words) of every operation
        self.fired: list[tuple[Fault, str, str]] = []  # (fault, in words, the operation)
        self.saves = 0
        self.landed = 0
        self.last_pointer = ""
        self.processes: list[_Process] = []
        self.current = self._spawn()
        self.in_takeover = False
        self.redelivered: list[OutboxMessage] = []
        self.results: list[RunResult[S, Any]] = []  # every result a caller or worker got
        self.calls: Counter[str] = Counter()
        self.idempotent: set[str] = set()
        self.problems: list[str] = []
        self.sent: set[str] = set()
        self.timer_first: set[int] = set()
        self.unsaved_end: RunResult[S, Any] | None = None  # a start that failed unsaved

    # ---------------------------------------------------------------- processes
    def _spawn(self) -> _Process:
        process = _Process(self, len(self.processes) + 1)
        self.processes.append(process)
        return process

    async def resume(
        self, process: _Process, token: Any, overlay: Mapping[str, Any] | None = None
    ) -> RunResult[S, Any]:
        return await process.runner.resume(
            token, state_overlay=overlay, bindings=self.scenario.bindings
        )

    def resume_options(self) -> dict[str, Any]:
        bindings = self.scenario.bindings
        return {} if bindings is None else {"bindings": bindings}

    def on_result(self, intent: HandoffIntent, result: RunResult[S, Any]) -> None:
        self.results.append(result)

    def on_call(self, thread_id: str, key: str, idempotent: bool) -> None:
        if thread_id == self.thread_id:
            self.calls[key] += 1
            if idempotent:
                self.idempotent.add(key)

    async def expire(self) -> None:
        """Give up what no live action holds: the leases and claimed messages of every
        process (dead ones' by expiry; between actions nothing is in flight)."""
        for process in self.processes:
            for lease in list(process.leases.values()):
                try:
                    holder = await self.base.leases.holder(lease.thread_id)
                    if holder is not None and holder.fencing_token == lease.fencing_token:
                        await self.base.leases.release(lease)
                except Exception as exc:  # noqa: BLE001 - a real store may refuse; noted
                    self.problems.append(f"checker could not expire a lease: {exc!r:.200}")
            process.leases.clear()
            for message in list(process.claimed.values()):
                try:
                    await self.base.consumer.release(message, error="its process crashed")
                except Exception:  # noqa: BLE001 - acked or released already
                    pass
            process.claimed.clear()
        for message in self.redelivered:
            try:
                await self.base.consumer.release(message, error="its ack was lost")
            except Exception:  # noqa: BLE001 - it went already
                pass
        self.redelivered.clear()

    # ---------------------------------------------------------------- operations
    def _describe(self, op: str, name: str, args: tuple[Any, ...]) -> str:
        if op == "save":
            self.saves += 1
            snapshot = cast(Snapshot[Any], args[1])
            where = f"save #{self.saves} ({_node_words(snapshot)})"
            ran = self.last_pointer if snapshot.total_steps else ""
            return f"{where}, after node {ran!r} returned" if ran else where
        if op == "journal":
            record = args[1]
            verb = {
                ActivityStatus.STARTED: "before its call",
                ActivityStatus.SUCCEEDED: "its outcome after the call",
                ActivityStatus.FAILED: "its failure",
                ActivityStatus.RETRYING: "its failed attempt",
            }.get(record.status, record.status.value)
            return f"journal record of activity {record.key!r} ({verb})"
        if op == "signal":
            return f"signal {args[0].name!r} stored"
        if op == "enqueue":
            return f"hand-off message of revision {args[0].snapshot_revision} enqueued"
        if op == "ack":
            intent = cast(OutboxMessage, args[0]).intent
            return f"ack of the {intent.reason!r} message (revision {intent.snapshot_revision})"
        if op == "acquire":
            return "run lease acquired"
        return f"{name}"

    def operation(
        self, process: _Process, op: str, name: str, call: Callable[..., Awaitable[Any]]
    ) -> Callable[..., Awaitable[Any]]:
        async def operate(*args: Any, **kwargs: Any) -> Any:
            if op in ("claim", "release"):
                return await self._bookkeep(process, op, call, args, kwargs)
            if op == "acquire" and str(args[0]).startswith("\x1f"):
                return await call(*args, **kwargs)
            self.ops += 1
            at = self.ops
            words = self._describe(op, name, args)
            self.operations.append((op, words))
            kind = self._planned(at, words)
            if kind is not None and (
                kind not in _KINDS.get(op, ()) or (kind is FaultKind.TAKEOVER and self.in_takeover)
            ):
                kind = None
            if kind is not None:
                self.fired.append((Fault(at, kind), self._words(kind, words, process), words))
            if kind is FaultKind.CRASH_BEFORE:
                process.die()
            if kind is FaultKind.UNAVAILABLE:
                raise StorageUnavailableError("injected fault: the store is unavailable")
            if kind is FaultKind.TAKEOVER:
                await self.takeover(process)
            if kind is FaultKind.REDELIVER:
                message = cast(OutboxMessage, args[0])
                process.claimed.pop(message.message_id, None)
                self.redelivered.append(message)
                return None
            result = await call(*args, **kwargs)
            self._landed(process, op, args, result)
            if kind is FaultKind.CRASH_AFTER:
                process.die()
            if kind is FaultKind.UNKNOWN:
                raise StorageUnavailableError(
                    "injected fault: the connection dropped; the outcome is unknown"
                )
            return result

        return operate

    async def _bookkeep(
        self,
        process: _Process,
        op: str,
        call: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        result = await call(*args, **kwargs)
        if op == "claim":
            for message in cast(list[OutboxMessage], result):
                process.claimed[message.message_id] = message
        elif args and isinstance(args[0], Lease):
            process.leases.pop(args[0].thread_id, None)
        elif args and isinstance(args[0], OutboxMessage):
            process.claimed.pop(args[0].message_id, None)
        return result

    def _landed(self, process: _Process, op: str, args: tuple[Any, ...], result: Any) -> None:
        if op == "save":
            self.landed += 1
            self.last_pointer = cast(Snapshot[Any], args[1]).execution_pointer
        elif op == "acquire" and isinstance(result, Lease):
            process.leases[result.thread_id] = result
        elif op == "ack":
            process.claimed.pop(cast(OutboxMessage, args[0]).message_id, None)

    def _words(self, kind: FaultKind, words: str, process: _Process) -> str:
        who = f"process {process.number}"
        if kind is FaultKind.CRASH_BEFORE:
            if "after node" in words:
                at, _, node = words.partition(", after node ")
                node = node.removesuffix(" returned")
                return f"{who} crashes after node {node} returned, before {at}"
            return f"{who} crashes before the {words}"
        if kind is FaultKind.CRASH_AFTER:
            return f"{who} crashes right after the {words}"
        if kind is FaultKind.UNAVAILABLE:
            return f"the store is unavailable for the {words}"
        if kind is FaultKind.UNKNOWN:
            return f"the {words} lands, but its outcome is lost on the way back"
        if kind is FaultKind.TAKEOVER:
            return (
                f"{who}'s lease expires before the {words}; another process takes the thread over"
            )
        if kind is FaultKind.REDELIVER:
            return f"the {words} is lost: the message is delivered again, late"
        if kind is FaultKind.CONCURRENT:
            return f"two processes {words} at once"
        return f"{words}: the timer fires before the signal arrives"

    def _planned(self, at: int, words: str) -> FaultKind | None:
        """The fault planned for operation ``at`` (by number, or by what it does)."""
        kind = self.faults.get(at)
        if kind is None and self.by_words:
            plain = _plain(words)
            for i, (want, planned) in enumerate(self.by_words):
                if want == plain:
                    del self.by_words[i]
                    return planned
        return kind

    def _decide(self, op: str, words: str) -> FaultKind | None:
        """A fault for a choice of the world (not a store operation)."""
        self.ops += 1
        self.operations.append((op, words))
        kind = self._planned(self.ops, words)
        if kind is None or kind not in _KINDS[op]:
            return None
        self.fired.append((Fault(self.ops, kind), self._words(kind, words, self.current), words))
        return kind

    async def takeover(self, process: _Process) -> None:
        """``process``'s lease and messages run out; a new process acts once."""
        self.in_takeover = True
        try:
            await self.expire()
            self.current = self._spawn()
            await self.act_once()
        finally:
            self.in_takeover = False

    # ---------------------------------------------------------------- the world
    async def head(self) -> tuple[Snapshot[S], Any] | None:
        try:
            snap, revision = await self.base.checkpointer.load(self.thread_id)
        except ThreadNotFoundError:
            return None
        return snap, revision

    async def attempt(self, action: Callable[[_Process], Awaitable[Any]]) -> None:
        """One call by the current process; a crash replaces the process."""
        process = self.current
        try:
            result = await action(process)
        except _Crash:
            if self.current is process:
                self.current = self._spawn()
            return
        except Exception:  # noqa: BLE001 - the application sees an error and goes on
            return
        if isinstance(result, RunResult):
            self.results.append(cast(RunResult[S, Any], result))

    async def act_once(self) -> bool:
        """Take the next step of the story; False when there is nothing left to do."""
        scenario, tid = self.scenario, self.thread_id
        found = await self.head()
        if found is None:
            if self.landed:
                self.problems.append("the thread disappeared after it was saved")
                return False
            if self.unsaved_end is not None:
                return False  # the start answered: its first step failed, nothing saved

            async def start(p: _Process) -> Any:
                result = await p.runner.start(
                    tid,
                    scenario.state,
                    bindings=scenario.bindings,
                    metadata=dict(scenario.metadata) if scenario.metadata else None,
                )
                unsure = isinstance(result.error, StorageError | LeaseError)
                if result.status is RunStatus.FAILED and not result.revision and not unsure:
                    self.unsaved_end = result  # its first node failed: the caller is told
                return result

            await self.attempt(start)
            return True
        head, _ = found
        claimed = await self.current.worker.consumer.claim(1, _VISIBILITY, 0.0)
        if claimed:
            message = claimed[0]
            if message.intent.thread_id != tid:
                self.current.claimed.pop(message.message_id, None)
                if message.intent.thread_id in self.created:  # left over from an earlier run
                    await self.base.consumer.ack(message)
                    return True
                # Not this check's: give it back untouched by an ack, and stop.
                await self.base.consumer.release(message, error="not a message of flowy check")
                self.problems.append(
                    f"the store holds a hand-off of thread {message.intent.thread_id!r:.200} "
                    "that this check did not create; it was left alone (run the check on a "
                    "store of its own)"
                )
                return False
            await self.attempt(lambda p: p.worker.process(message))
            return True
        token = (await self.current.runner.head(tid))[1]
        status = head.status
        if status is RunStatus.RUNNING:  # a call that failed or crashed: the app retries
            await self.attempt(lambda p: self.resume(p, token))
            return True
        if status is RunStatus.HANDOFF:
            force = head.handoff_status is HandoffStatus.ENQUEUED
            await self.attempt(
                lambda p: p.runner.recover_stale_handoff(
                    tid, stale_after=0.0, force_reenqueue=force
                )
            )
            return True
        if status is RunStatus.SUSPENDED and scenario.approve is not None:
            overlay = scenario.approve(head)
            if overlay is None:
                return False
            words = f"resume the suspended thread (revision {head.revision}) with one token"
            concurrent = self._decide("resume", words) is FaultKind.CONCURRENT
            if concurrent:
                other = self._spawn()
                first = self.current

                async def one(p: _Process) -> None:
                    saved = self.current
                    self.current = p
                    try:
                        await self.attempt(lambda q: self.resume(q, token, overlay))
                    finally:
                        if self.current is p:
                            self.current = saved

                await asyncio.gather(one(first), one(other))
                if first.dead or other.dead:
                    self.current = self._spawn()
            else:
                await self.attempt(lambda p: self.resume(p, token, overlay))
            return True
        if status is RunStatus.WAITING:
            return await self._wait(head)
        return False

    async def _wait(self, head: Snapshot[S]) -> bool:
        scenario, tid = self.scenario, self.thread_id
        payload = None
        if head.waiting_for and scenario.signal is not None:
            payload = scenario.signal(head)
        signal_id = f"{head.waiting_for}@{head.revision}"
        can_signal = payload is not None and signal_id not in self.sent
        if can_signal and head.wake_at is not None and head.revision not in self.timer_first:
            words = f"the wait for {head.waiting_for!r} at revision {head.revision}"
            if self._decide("wait", words) is FaultKind.TIMER_FIRST:
                self.timer_first.add(head.revision)
                can_signal = False
        if can_signal:

            async def send(p: _Process) -> Any:
                stored = await p.runner.signal(tid, head.waiting_for, payload, signal_id=signal_id)
                self.sent.add(signal_id)
                return stored

            await self.attempt(send)
            return True
        if head.wake_at is not None:
            self.clock.advance(head.wake_at)
            await self.attempt(lambda p: p.worker.fire_timers())
            return True
        return False

    async def play(self) -> None:
        token = on_call.set(self.on_call)
        quiet = logging.getLogger("flowy")
        level = quiet.level
        quiet.setLevel(logging.CRITICAL + 1)  # injected faults are not news
        try:
            idle = 0
            for _ in range(_MAX_ACTIONS):
                _raise_if_cancelled()
                await self.expire()
                if await self.act_once():
                    idle = 0
                    continue
                idle += 1
                if idle > 1:
                    return
                # Let time pass: late messages come back, leases and timers run out.
                self.clock.advance(self.clock.now + 10 * _VISIBILITY)
            self.problems.append(f"the thread did not settle in {_MAX_ACTIONS} actions")
        finally:
            quiet.setLevel(level)
            on_call.reset(token)

    # ---------------------------------------------------------------- properties
    async def verify(self) -> _Outcome:
        problems = list(self.problems)
        history: list[Snapshot[S]] = []
        found = await self.head()
        if found is None:
            if self.unsaved_end is None:
                problems.append("the thread was never saved")
            elif not problems:
                problems += self._expectations(self.unsaved_end.state)
        else:
            history = sorted(
                await self.base.checkpointer.get_history(self.thread_id, limit=100_000),
                key=lambda s: s.revision,
            )
            problems += self._ending(found[0])
            problems += self._chain(history, found[1])
            problems += await self._handoffs(found[0])
            problems += await self._activities(found[0])
            problems += self._effects(history)
            problems += self._invariants(history)
            if not problems:
                problems += self._expectations(found[0].state)
        lines = [
            f"rev {s.revision:<3} {s.status.value:<9} at {s.execution_pointer!r}"
            + (f" ({s.reason})" if s.reason else "")
            for s in history
        ]
        return _Outcome(problems, self.fired, lines, self.operations)

    def _ending(self, head: Snapshot[S]) -> list[str]:
        status = head.status
        if status in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELED):
            return []
        if status is RunStatus.SUSPENDED and (
            self.scenario.approve is None or self.scenario.approve(head) is None
        ):
            return []
        if status is RunStatus.WAITING and f"{head.waiting_for}@{head.revision}" in self.sent:
            return [f"the thread never woke for the {head.waiting_for!r} signal it was sent"]
        if status is RunStatus.WAITING and head.wake_at is None:
            return []
        return [f"the thread ended {_node_words(head)} ({head.reason or 'no reason'})"]

    def _chain(self, history: list[Snapshot[S]], revision: int) -> list[str]:
        revisions = [s.revision for s in history]
        if not revisions:
            return ["the thread has no history"]
        if revisions != list(range(revisions[0], revisions[0] + len(revisions))):
            return [f"the history is not one chain: revisions {revisions}"]
        if revisions[-1] != revision:
            return [f"the history ends at revision {revisions[-1]}, the head is {revision}"]
        return []

    async def _handoffs(self, head: Snapshot[S]) -> list[str]:
        problems: list[str] = []
        if head.status is RunStatus.HANDOFF:
            problems.append(f"a hand-off was lost: the thread ended {head.handoff_status.value}")
        for dead in await self.base.consumer.dead_letters(limit=1000):
            if dead.intent is not None and dead.intent.thread_id == self.thread_id:
                problems.append(f"a hand-off was dead-lettered: {dead.error[:200]}")
        ended: dict[int, int] = {}  # segment -> the revision its saved end is at
        for result in self.results:
            if not _saved_end(result):
                continue
            if result.segment in ended and ended[result.segment] != result.revision:
                problems.append(
                    f"a hand-off was resumed twice: two runs of segment {result.segment} "
                    f"saved their ends, at revisions {ended[result.segment]} and "
                    f"{result.revision}"
                )
            ended.setdefault(result.segment, result.revision)
        return problems

    async def _activities(self, head: Snapshot[S]) -> list[str]:
        problems: list[str] = []
        for key, n in sorted(self.calls.items()):
            if n > 1 and key not in self.idempotent:
                problems.append(f"activity {key!r} was called {n} times")
        for key in sorted(self.scenario.exactly_once):
            if self.calls[key] != 1 and head.status is RunStatus.COMPLETED:
                problems.append(
                    f"activity {key!r} was called {self.calls[key]} times, not exactly once"
                )
        cp = self.base.checkpointer
        if isinstance(cp, DurableCheckpointer) and head.status is RunStatus.COMPLETED:
            durable = cast(DurableCheckpointer[Any], cp)
            for record in await durable.journal(self.thread_id):
                if record.status in (ActivityStatus.STARTED, ActivityStatus.RETRYING):
                    problems.append(
                        f"activity {record.key!r} is still {record.status.value} in the "
                        "journal of a completed thread"
                    )
        return problems

    def _effects(self, history: list[Snapshot[S]]) -> list[str]:
        saved: Counter[str] = Counter()
        last: dict[int, Snapshot[S]] = {}
        for snap in history:
            last[snap.segment] = snap
        for snap in last.values():
            saved.update(_key(e) for e in snap.effects)
        delivered: Counter[str] = Counter()
        for result in self.results:
            if _saved_end(result):
                delivered.update(_key(e) for e in result.effects)
        return [
            f"effect {e[:200]} was delivered {n} times, saved {saved[e]}"
            for e, n in sorted(delivered.items())
            if n > saved[e]
        ]

    def _invariants(self, history: list[Snapshot[S]]) -> list[str]:
        for snap in history:
            for check in self.invariants:
                problem = _holds(check, snap.state)
                if problem is not None:
                    name = getattr(check, "name", None) or getattr(check, "__name__", "invariant")
                    return [f"invariant {name} broke at revision {snap.revision}: {problem}"]
        return []

    def _expectations(self, state: S) -> list[str]:
        problems: list[str] = []
        for expect in self.scenario.expect:
            problem = _holds(expect, state)
            if problem is not None:
                problems.append(
                    f"post-condition {getattr(expect, '__name__', 'expect')} failed: {problem}"
                )
        return problems


def _plain(words: str) -> str:
    """What an operation does, without its ordinal (the same save in a shifted run)."""
    return re.sub(r" #[0-9]+", "", words)


def _saved_end(result: RunResult[Any, Any]) -> bool:
    return result.status is RunStatus.COMPLETED or result.resume_token is not None


def _key(effect: object) -> str:
    try:
        return json.dumps(effect, sort_keys=True, default=repr)
    except (TypeError, ValueError):
        return repr(effect)


def _holds(check: Callable[[Any], object], state: Any) -> str | None:
    """None if ``check(state)`` holds, else why not."""
    try:
        verdict = check(state)
    except AssertionError as exc:
        return str(exc) or "assertion failed"
    except Exception as exc:  # noqa: BLE001 - a check that raises has failed
        return f"{type(exc).__name__}: {exc}"
    return "returned False" if verdict is False else None


# -------------------------------------------------------------------- the search


def _invariants_of(scenario: Callable[..., Any], extra: Sequence[Any]) -> list[Any]:
    module = sys.modules.get(getattr(scenario, "__module__", "") or "")
    found = [v for v in vars(module).values() if is_invariant(v)] if module else []
    return found + [v for v in extra if v not in found]


def _schedule(
    rng: random.Random, operations: list[tuple[str, str]], most: int
) -> dict[int, FaultKind]:
    """A random schedule over the operations of the fault-free run."""
    points = [i for i, (op, _) in enumerate(operations, 1) if op in _KINDS]
    if not points:
        return {}
    n = min(rng.randint(1, most), len(points))
    return {at: rng.choice(_KINDS[operations[at - 1][0]]) for at in sorted(rng.sample(points, n))}


class _Checker(Generic[S]):
    def __init__(
        self,
        graph: Graph[S, Any],
        scenario: Callable[[], Scenario[S]],
        store: str | Callable[[], Backend[Any]] | None,
        invariants: Sequence[Callable[[Any], object]],
    ) -> None:
        self.graph = graph
        self.scenario = scenario
        self.store = store
        self.invariants = invariants
        self.runs = 0
        self.backend: BaseBackend[Any] | None = None
        self.created: set[str] = set()

    async def run(
        self,
        seed: int,
        faults: Mapping[int, FaultKind],
        by_words: Sequence[tuple[str, FaultKind]] = (),
    ) -> _Outcome:
        self.runs += 1
        random.seed(seed)
        made = cast(object, self.scenario())
        if not isinstance(made, Scenario):
            raise TypeError(
                f"the scenario function returned a {type(made).__name__}, not a "
                "flowy.testing.Scenario"
            )
        story = cast(Scenario[S], made)
        fresh: Backend[Any] | None = None
        if self.store is None:
            clock = _Clock(_EPOCH)
            base: Backend[Any] = MemoryBackend(MemoryStore(clock=clock))
            thread_id = story.thread_id
        elif callable(self.store):
            clock = _Clock(time.time())
            base = fresh = self.store()
            thread_id = story.thread_id
        else:
            clock = _Clock(time.time())
            if self.backend is None:
                # Never the store the URL names: a namespace of this check's own.
                self.backend = await open_scratch(self.store)
            base = cast(Backend[Any], self.backend)  # every store is both
            thread_id = f"{story.thread_id}-{uuid.uuid4().hex[:12]}"  # a fresh thread
        self.created.add(thread_id)
        run = _Run(
            self.graph,
            story,
            base,
            clock,
            thread_id,
            faults,
            self.invariants,
            by_words,
            self.created,
        )
        try:
            await run.play()
            return await run.verify()
        finally:
            if fresh is not None:
                await fresh.aclose()

    @property
    def scratch(self) -> str | None:
        """The scratch store's URL, password masked (``None`` before one was opened)."""
        return None if self.backend is None else redact_url(self.backend.url)

    async def aclose(self) -> None:
        """Remove the scratch store (everything the check wrote) and close it."""
        if self.backend is not None:
            await self.backend.drop_scratch()

    async def shrink(self, seed: int, outcome: _Outcome) -> _Outcome:
        """The fewest faults of ``outcome``'s schedule that still fail."""
        best = outcome
        changed = True
        while changed and len(best.fired) > 1:
            changed = False
            for i in range(len(best.fired)):
                fewer = [f for j, f in enumerate(best.fired) if j != i]
                tried = await self.run(seed, {f.at: f.kind for f, _, _ in fewer})
                if not tried.violations:  # the others, aimed at the same operations
                    tried = await self.run(seed, {}, [(_plain(o), f.kind) for f, _, o in fewer])
                if tried.violations and len(tried.fired) < len(best.fired):
                    best, changed = tried, True
                    break
        return best


def _replay_line(
    graph_spec: str | None,
    scenario: Callable[..., Any],
    store: str | None,
    schedule: str,
    seed: int,
) -> str:
    spec = f"{getattr(scenario, '__module__', '?')}:{getattr(scenario, '__qualname__', '?')}"
    if graph_spec is None:
        where = f"store={redact_url(store)!r}, " if store else ""
        return (
            f"flowy.testing.check(graph, {spec.split(':')[-1]}, {where}seed={seed}, "
            f"replay={schedule!r})"
        )
    store_option = f" --backend {redact_url(store)}" if store else ""
    return (
        f"flowy check {graph_spec} --scenario {spec}{store_option} --seed {seed} "
        f"--replay {schedule}"
    )


async def acheck(
    graph: Graph[S, Any] | str,
    scenario: Callable[[], Scenario[S]],
    *,
    seeds: int = 1000,
    store: str | Callable[[], Backend[Any]] | None = None,
    max_faults: int = 3,
    invariants: Sequence[Callable[[S], object]] = (),
    replay: str | Sequence[Fault] | None = None,
    seed: int = 0,
    first_seed: int = 0,
) -> CheckReport:
    """:func:`check`, awaited inside a running event loop (same arguments).

    Args:
        graph: as in :func:`check`.
        scenario: as in :func:`check`.
        seeds: as in :func:`check`.
        store: as in :func:`check`.
        max_faults: as in :func:`check`.
        invariants: as in :func:`check`.
        replay: as in :func:`check`.
        seed: as in :func:`check`.
        first_seed: as in :func:`check`.

    Returns:
        The report.
    """
    graph_spec: str | None = None
    if isinstance(graph, str):
        from ..cli._options import CliError, load_graph

        try:
            graph_spec, graph = graph, load_graph(graph)
        except CliError as exc:
            raise ValueError(str(exc).replace("--graph ", "graph ", 1)) from None
    if seeds < 1 or max_faults < 1:
        raise ValueError(f"need seeds >= 1 and max_faults >= 1, got {seeds!r}, {max_faults!r}")
    name = graph_spec or getattr(graph, "name", None) or "graph"
    probe = scenario()
    checks = _invariants_of(scenario, [*invariants, *getattr(probe, "invariants", ())])
    checker = _Checker(graph, scenario, store, checks)
    started = time.perf_counter()
    where = (
        "memory://"
        if store is None
        else redact_url(store)
        if isinstance(store, str)
        else getattr(store, "__name__", "a store")
    )
    injected: Counter[str] = Counter()

    def report(seeds_run: int, failure: Counterexample | None = None) -> CheckReport:
        elapsed = time.perf_counter() - started
        return CheckReport(
            name, where, seeds_run, checker.runs, injected, elapsed, failure, checker.scratch
        )

    try:
        if replay is not None:
            faults = parse_schedule(replay) if isinstance(replay, str) else tuple(replay)
            outcome = await checker.run(seed, {f.at: f.kind for f in faults})
            injected.update(f.kind.value for f, _, _ in outcome.fired)
            failure = _failure(outcome, seed, len(outcome.fired), graph_spec, scenario, store)
            return report(1, failure)
        clean = await checker.run(first_seed, {})
        if clean.violations:
            failure = _failure(clean, first_seed, 0, graph_spec, scenario, store)
            return report(0, failure)
        for n in range(first_seed, first_seed + seeds):
            _raise_if_cancelled()
            rng = random.Random(n)
            outcome = await checker.run(n, _schedule(rng, clean.operations, max_faults))
            injected.update(f.kind.value for f, _, _ in outcome.fired)
            if outcome.violations:
                found_with = len(outcome.fired)
                shrunk = await checker.shrink(n, outcome)
                failure = _failure(shrunk, n, found_with, graph_spec, scenario, store)
                return report(n - first_seed + 1, failure)
        return report(seeds)
    finally:
        await checker.aclose()


def _raise_if_cancelled() -> None:
    """Stop if this task was cancelled: the runs played here take their process's
    cancellation as a crash or a stop of that run (and go on), so a check cancelled from
    outside (Ctrl-C) looks at it between the steps it plays."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def _failure(
    outcome: _Outcome,
    seed: int,
    found_with: int,
    graph_spec: str | None,
    scenario: Callable[..., Any],
    store: object,
) -> Counterexample | None:
    if not outcome.violations:
        return None
    schedule = tuple(f for f, _, _ in outcome.fired)
    text = ",".join(str(f) for f in schedule) or "none"
    return Counterexample(
        seed=seed,
        schedule=schedule,
        words=tuple(f"{w} [{f}]" for f, w, _ in outcome.fired) or ("no fault",),
        violations=tuple(outcome.violations),
        history=tuple(outcome.history),
        replay=_replay_line(
            graph_spec, scenario, store if isinstance(store, str) else None, text, seed
        ),
        found_with=max(found_with, len(schedule)),
    )


def check(
    graph: Graph[S, Any] | str,
    scenario: Callable[[], Scenario[S]],
    *,
    seeds: int = 1000,
    store: str | Callable[[], Backend[Any]] | None = None,
    max_faults: int = 3,
    invariants: Sequence[Callable[[S], object]] = (),
    replay: str | Sequence[Fault] | None = None,
    seed: int = 0,
    first_seed: int = 0,
) -> CheckReport:
    """Run ``graph`` through ``scenario`` under ``seeds`` random fault schedules (see
    the module's documentation); :func:`acheck` is the same inside an event loop.

    The first run has no faults (it must pass, and its operations are what the
    schedules strike); then seed ``n`` draws between 1 and ``max_faults`` faults. The
    first failing seed is shrunk to its fewest faults and reported: ``print(report)``.

    Args:
        graph: the graph, or ``"module:attribute"`` naming it (or a function returning
            it); with a name, the report's replay command is a ``flowy check`` line.
        scenario: a function returning a fresh :class:`Scenario` for each run.
        seeds: how many schedules to try.
        store: a store URL: the runs write only in a scratch store of their own next
            to the one it names (a schema, key namespace, table or file), removed when
            the check ends, also on failure; a store that cannot be namespaced raises
            ``BackendURLError`` before anything is written. Or a function returning a
            fresh ``Backend`` for each run (default: a fresh memory store per run, on
            the simulated clock).
        max_faults: the most faults in one schedule.
        invariants: invariants over every saved state, besides those of the scenario's
            module and ``Scenario.invariants``.
        replay: run only this schedule (a report's schedule text, or faults).
        seed: the seed of a replayed run.
        first_seed: the first seed of the search (seeds ``first_seed`` to
            ``first_seed + seeds - 1`` are tried).

    Returns:
        The report: ``report.ok``, and the shrunk counterexample if a run failed.

    Raises:
        RuntimeError: called inside a running event loop (``await acheck(...)`` there).
        BackendURLError: ``store`` is a URL of a store that cannot be namespaced.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError("flowy.testing.check runs its own event loop: await acheck() here")
    checking = acheck(
        graph,
        scenario,
        seeds=seeds,
        store=store,
        max_faults=max_faults,
        invariants=invariants,
        replay=replay,
        seed=seed,
        first_seed=first_seed,
    )
    # On a store in this process, waits (a save's retry backoff, a worker's pause) take
    # no real time: the loop's clock jumps to the next timer when nothing else can run.
    virtual = not isinstance(store, str)
    with asyncio.Runner(loop_factory=_jumping_loop if virtual else None) as runner:
        return runner.run(checking)


class _JumpingSelector(selectors.DefaultSelector):
    """A selector that, instead of sleeping until the next timer, moves the loop's clock
    there (it still blocks for real when no timer is due: threads, sockets)."""

    skipped = 0.0

    def select(self, timeout: float | None = None) -> list[tuple[Any, int]]:
        ready = super().select(0)
        if ready or timeout is None or timeout <= 0:
            return ready or (super().select(timeout) if timeout else ready)
        self.skipped += timeout
        return []


class _JumpingLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self.jumps = _JumpingSelector()
        super().__init__(self.jumps)

    def time(self) -> float:
        return super().time() + self.jumps.skipped


def _jumping_loop() -> asyncio.AbstractEventLoop:
    return _JumpingLoop()
