"""One run of a scenario under one fault schedule: the world around the thread.

The run plays the application, the human, the outside world and the clock, one action
at a time, through the current simulated process; a process that crashes is replaced,
and what it held is given up as its expiry would. Then it verifies the thread
(``_verify``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, cast

from ..._activities import on_call
from ..._errors import LeaseError, StorageError, ThreadNotFoundError
from ..._graph import Graph
from ..._results import RunResult
from ..._types import HandoffStatus, RunStatus, S
from ...storage import Backend, HandoffIntent, Snapshot
from ..faults import Fault, FaultKind, SimulatedCrash
from . import _verify
from ._process import VISIBILITY, Clock, Operations, Process
from ._report import Scenario

__all__ = ["MAX_ACTIONS", "Outcome", "Run", "raise_if_cancelled"]

MAX_ACTIONS = 200


@dataclass
class Outcome:
    """What a run found: its violations, the faults that fired, the history in words
    and every operation (kind, words)."""

    violations: list[str]
    fired: list[tuple[Fault, str, str]]
    history: list[str]
    operations: list[tuple[str, str]]


def raise_if_cancelled() -> None:
    """Stop if this task was cancelled: the runs played here take their process's
    cancellation as a crash or a stop of that run (and go on), so a check cancelled from
    outside (Ctrl-C) looks at it between the steps it plays."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


class Run(Generic[S]):
    """One run of a scenario under one schedule."""

    def __init__(
        self,
        graph: Graph[S, Any],
        scenario: Scenario[S],
        base: Backend[S],
        clock: Clock,
        thread_id: str,
        faults: Mapping[int, FaultKind],
        invariants: Sequence[Callable[[Any], object]],
        by_words: Sequence[tuple[str, FaultKind]] = (),
        created: Collection[str] = (),
    ) -> None:
        self.created = created  # the threads of this check (their messages are its own)
        self.graph = graph
        self.scenario = scenario
        self.base = base
        self.clock = clock
        self.thread_id = thread_id
        self.invariants = invariants
        self.log = Operations(faults, by_words, self.takeover)
        self.processes: list[Process] = []
        self.current = self._spawn()
        self.results: list[RunResult[S, Any]] = []  # every result a caller or worker got
        self.calls: Counter[str] = Counter()
        self.idempotent: set[str] = set()
        self.problems: list[str] = []
        self.sent: set[str] = set()
        self.timer_first: set[int] = set()
        self.unsaved_end: RunResult[S, Any] | None = None  # a start that failed unsaved

    # ---------------------------------------------------------------- processes
    def _spawn(self) -> Process:
        bindings = self.scenario.bindings
        process = Process(
            len(self.processes) + 1,
            self.base,
            self.log,
            self.graph,
            self.clock,
            {} if bindings is None else {"bindings": bindings},
            self.on_result,
        )
        self.processes.append(process)
        return process

    async def resume(
        self, process: Process, token: Any, overlay: Mapping[str, Any] | None = None
    ) -> RunResult[S, Any]:
        return await process.runner.resume(
            token, state_overlay=overlay, bindings=self.scenario.bindings
        )

    def on_result(self, intent: HandoffIntent, result: RunResult[Any, Any]) -> None:
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
        for message in self.log.redelivered:
            try:
                await self.base.consumer.release(message, error="its ack was lost")
            except Exception:  # noqa: BLE001 - it went already
                pass
        self.log.redelivered.clear()

    async def takeover(self, process: Process) -> None:
        """``process``'s lease and messages run out; a new process acts once."""
        self.log.in_takeover = True
        try:
            await self.expire()
            self.current = self._spawn()
            await self.act_once()
        finally:
            self.log.in_takeover = False

    # ---------------------------------------------------------------- the world
    async def head(self) -> tuple[Snapshot[S], Any] | None:
        try:
            snap, revision = await self.base.checkpointer.load(self.thread_id)
        except ThreadNotFoundError:
            return None
        return snap, revision

    async def attempt(self, action: Callable[[Process], Awaitable[Any]]) -> None:
        """One call by the current process; a crash replaces the process."""
        process = self.current
        try:
            result = await action(process)
        except SimulatedCrash:
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
            if self.log.landed:
                self.problems.append("the thread disappeared after it was saved")
                return False
            if self.unsaved_end is not None:
                return False  # the start answered: its first step failed, nothing saved

            async def start(p: Process) -> Any:
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
        claimed = await self.current.worker.consumer.claim(1, VISIBILITY, 0.0)
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
            await self._approve(head, token, overlay)
            return True
        if status is RunStatus.WAITING:
            return await self._wait(head)
        return False

    async def _approve(self, head: Snapshot[S], token: Any, overlay: Mapping[str, Any]) -> None:
        words = f"resume the suspended thread (revision {head.revision}) with one token"
        if self.log.decide("resume", words, self.current) is not FaultKind.CONCURRENT:
            await self.attempt(lambda p: self.resume(p, token, overlay))
            return
        other = self._spawn()
        first = self.current

        async def one(p: Process) -> None:
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

    async def _wait(self, head: Snapshot[S]) -> bool:
        scenario, tid = self.scenario, self.thread_id
        payload = None
        if head.waiting_for and scenario.signal is not None:
            payload = scenario.signal(head)
        signal_id = f"{head.waiting_for}@{head.revision}"
        can_signal = payload is not None and signal_id not in self.sent
        if can_signal and head.wake_at is not None and head.revision not in self.timer_first:
            words = f"the wait for {head.waiting_for!r} at revision {head.revision}"
            if self.log.decide("wait", words, self.current) is FaultKind.TIMER_FIRST:
                self.timer_first.add(head.revision)
                can_signal = False
        if can_signal:

            async def send(p: Process) -> Any:
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
            for _ in range(MAX_ACTIONS):
                raise_if_cancelled()
                await self.expire()
                if await self.act_once():
                    idle = 0
                    continue
                idle += 1
                if idle > 1:
                    return
                # Let time pass: late messages come back, leases and timers run out.
                self.clock.advance(self.clock.now + 10 * VISIBILITY)
            self.problems.append(f"the thread did not settle in {MAX_ACTIONS} actions")
        finally:
            quiet.setLevel(level)
            on_call.reset(token)

    # ---------------------------------------------------------------- properties
    async def verify(self) -> Outcome:
        problems = list(self.problems)
        history: list[Snapshot[S]] = []
        found = await self.head()
        if found is None:
            if self.unsaved_end is None:
                problems.append("the thread was never saved")
            elif not problems:
                problems += _verify.expectations(self.scenario, self.unsaved_end.state)
        else:
            head, revision = found
            history = sorted(
                await self.base.checkpointer.get_history(self.thread_id, limit=100_000),
                key=lambda s: s.revision,
            )
            problems += _verify.ending(head, self.scenario, self.sent)
            problems += _verify.chain(history, revision)
            problems += await _verify.handoffs(head, self.base, self.thread_id, self.results)
            problems += await _verify.activities(
                head,
                self.base,
                self.thread_id,
                self.calls,
                self.idempotent,
                self.scenario.exactly_once,
            )
            problems += _verify.effects(history, self.results)
            problems += _verify.invariants(history, self.invariants)
            if not problems:
                problems += _verify.expectations(self.scenario, head.state)
        lines = [
            f"rev {s.revision:<3} {s.status.value:<9} at {s.execution_pointer!r}"
            + (f" ({s.reason})" if s.reason else "")
            for s in history
        ]
        return Outcome(problems, self.log.fired, lines, self.log.operations)
