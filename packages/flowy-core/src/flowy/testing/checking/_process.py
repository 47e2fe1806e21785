"""The simulated processes of a check and the operation log they share.

Each process sees the store through a :class:`~flowy.testing.faults.FaultyBackend`
of its own whose plan is the run's :class:`Operations`: it numbers every store
operation that a fault may strike (saves, journal records, signals, outbox writes,
acks and leases), describes it in words, strikes it where the schedule says, and
keeps track of the leases and messages each process holds.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, cast

from ..._graph import Graph
from ..._results import RunResult
from ..._runner import Runner
from ..._worker import Worker
from ...storage import ActivityStatus, Backend, HandoffIntent, Lease, OutboxMessage
from ...storage._durable import decode_activity, decode_signal
from ...storage.dialect import RawMessage, Write, decode_intent, decode_record
from ..faults import SAVES, Fault, FaultKind, FaultPlan, FaultyBackend, Operation, Phase
from ._report import KINDS

__all__ = ["LEASE_TTL", "VISIBILITY", "Clock", "Operations", "Process", "plain"]

LEASE_TTL = 30.0
VISIBILITY = 60.0

_OPS: Mapping[Phase, str] = {
    **{phase: "save" for phase in SAVES},
    Phase.JOURNAL: "journal",
    Phase.SIGNAL: "signal",
    Phase.ENQUEUE: "enqueue",
    Phase.ACK: "ack",
    Phase.ACQUIRE: "acquire",
}
"""The operations a fault of the schedule may strike, by phase."""


class Clock:
    """The simulated clock of a run: it moves only when the checker lets time pass."""

    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, to: float) -> None:
        self.now = max(self.now, to)


def node_words(status: object, pointer: str) -> str:
    """A head in words: ``"running at 'charge'"``."""
    return f"{getattr(status, 'value', status)} at {pointer!r}"


def plain(words: str) -> str:
    """What an operation does, without its ordinal (the same save in a shifted run)."""
    return re.sub(r" #[0-9]+", "", words)


class Operations:
    """The operations of one run, in order, and the faults its schedule strikes.

    ``faults`` strikes by operation number; ``by_words`` by what an operation does
    (shrinking aims the faults left at the same operations of a shifted run).
    ``takeover(process)`` plays a ``TAKEOVER``.
    """

    def __init__(
        self,
        faults: Mapping[int, FaultKind],
        by_words: Sequence[tuple[str, FaultKind]],
        takeover: Callable[[Process], Awaitable[None]],
    ) -> None:
        self.faults = faults
        self.by_words = list(by_words)
        self.takeover = takeover
        self.in_takeover = False
        self.ops = 0
        self.operations: list[tuple[str, str]] = []  # (kind, words) of every operation
        self.fired: list[tuple[Fault, str, str]] = []  # (fault, in words, the operation)
        self.saves = 0
        self.landed = 0
        self.last_pointer = ""
        self.messages: dict[str, OutboxMessage] = {}  # every message claimed, by id
        self.redelivered: list[OutboxMessage] = []

    async def strike(self, process: Process, op: Operation) -> Fault | None:
        """The fault for ``process``'s operation ``op`` (after playing a takeover)."""
        name = _OPS.get(op.phase)
        if name is None or op.system:
            return None
        self.ops += 1
        at = self.ops
        words = self._describe(name, op)
        acked = cast(Write, op.args[0]).ack if name == "save" else None
        # A save that acknowledges its message may also see it come back late.
        faults = "acking save" if acked is not None else name
        self.operations.append((faults, words))
        kind = self.planned(at, words)
        if kind is not None and (
            kind not in KINDS.get(faults, ()) or (kind is FaultKind.TAKEOVER and self.in_takeover)
        ):
            kind = None
        if kind is None:
            return None
        self.fired.append((Fault(at, kind), self.words(kind, words, process), words))
        if kind is FaultKind.TAKEOVER:
            await self.takeover(process)
            return None
        if kind is FaultKind.REDELIVER:
            message_id = acked if acked is not None else str(op.args[0])
            message = self.messages.get(message_id)
            process.claimed.pop(message_id, None)
            if message is not None:
                self.redelivered.append(message)
            if acked is not None:
                return None  # the save and its ack land; the message comes back anyway
        return Fault(at, kind)

    def done(self, process: Process, op: Operation, result: object) -> None:
        """Bookkeeping once ``op`` of ``process`` landed."""
        phase = op.phase
        if phase in SAVES:
            if result is not None:
                return  # refused (a ``Refused``): nothing was written
            self.landed += 1
            write = cast(Write, op.args[0])
            self.last_pointer = write.summary.execution_pointer
            if write.release:  # the save gave its lease up
                process.leases.pop(write.thread_id, None)
            if write.ack is not None:  # and acknowledged the message it ran for
                process.claimed.pop(write.ack, None)
        elif phase is Phase.ACQUIRE:
            if isinstance(result, tuple):  # ``_acquire_head``: the lease and the head
                result = cast(tuple[object, object], result)[0]
            if isinstance(result, Lease):
                process.leases[result.thread_id] = result
        elif phase is Phase.RELEASE_LEASE:
            process.leases.pop(cast(Lease, op.args[0]).thread_id, None)
        elif phase is Phase.CLAIM:
            for raw in cast(list[RawMessage], result):
                try:
                    intent = decode_intent(raw.payload)
                except ValueError:
                    continue  # buried as poison by the consumer
                message = OutboxMessage(raw.message_id, intent, raw.attempts, raw.error)
                process.claimed[raw.message_id] = self.messages[raw.message_id] = message
        elif phase in (Phase.ACK, Phase.RELEASE):
            process.claimed.pop(str(op.args[0]), None)

    def _describe(self, name: str, op: Operation) -> str:
        args = op.args
        if name == "save":
            self.saves += 1
            write = cast(Write, args[0])
            summary = write.summary
            where = f"save #{self.saves} ({node_words(summary.status, summary.execution_pointer)})"
            ran = self.last_pointer
            if ran and not decode_record(write.record).total_steps:
                ran = ""  # a save before any step ran
            return f"{where}, after node {ran!r} returned" if ran else where
        if name == "journal":
            record = decode_activity(args[2], key=args[1])
            verb = {
                ActivityStatus.STARTED: "before its call",
                ActivityStatus.SUCCEEDED: "its outcome after the call",
                ActivityStatus.FAILED: "its failure",
                ActivityStatus.RETRYING: "its failed attempt",
            }.get(record.status, record.status.value)
            return f"journal record of activity {record.key!r} ({verb})"
        if name == "signal":
            return f"signal {decode_signal(args[0], 1, args[2]).name!r} stored"
        if name == "enqueue":
            intent = decode_intent(args[0].payload)
            return f"hand-off message of revision {intent.snapshot_revision} enqueued"
        if name == "ack":
            message = self.messages.get(str(args[0]))
            if message is None:
                return "ack of a message"
            intent = message.intent
            return f"ack of the {intent.reason!r} message (revision {intent.snapshot_revision})"
        return "run lease acquired"

    def words(self, kind: FaultKind, words: str, process: Process) -> str:
        """Fault ``kind`` at the operation ``words`` of ``process``, in words."""
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
            if words.startswith("save"):
                return f"the {words} acknowledges its message, which is delivered again, late"
            return f"the {words} is lost: the message is delivered again, late"
        if kind is FaultKind.CONCURRENT:
            return f"two processes {words} at once"
        return f"{words}: the timer fires before the signal arrives"

    def planned(self, at: int, words: str) -> FaultKind | None:
        """The fault planned for operation ``at`` (by number, or by what it does)."""
        kind = self.faults.get(at)
        if kind is None and self.by_words:
            text = plain(words)
            for i, (want, planned) in enumerate(self.by_words):
                if want == text:
                    del self.by_words[i]
                    return planned
        return kind

    def decide(self, name: str, words: str, process: Process) -> FaultKind | None:
        """A fault for a choice of the world (not a store operation)."""
        self.ops += 1
        self.operations.append((name, words))
        kind = self.planned(self.ops, words)
        if kind is None or kind not in KINDS[name]:
            return None
        self.fired.append((Fault(self.ops, kind), self.words(kind, words, process), words))
        return kind


class _Plan(FaultPlan):
    """One process's side of the run's :class:`Operations`."""

    def __init__(self, log: Operations, process: Process) -> None:
        self.log = log
        self.process = process

    async def decide(self, operation: Operation) -> Fault | None:
        return await self.log.strike(self.process, operation)

    def landed(self, operation: Operation, result: object) -> None:
        self.log.done(self.process, operation, result)


_SERIALS = itertools.count(1)


class Process:
    """One simulated process: its view of the store, its runner and worker, and what
    it holds (leases, claimed messages)."""

    def __init__(
        self,
        number: int,
        base: Backend[Any],
        log: Operations,
        graph: Graph[Any, Any],
        clock: Clock,
        options: Mapping[str, Any],
        on_result: Callable[[HandoffIntent, RunResult[Any, Any]], None],
    ) -> None:
        self.number = number
        self.serial = next(_SERIALS)
        self.leases: dict[str, Lease] = {}
        self.claimed: dict[str, OutboxMessage] = {}
        # Each simulated process is a process of its own to the runner's in-process
        # guard (its own domain), while its saves still fence the store's leases.
        self.backend: FaultyBackend[Any] = FaultyBackend(
            base, _Plan(log, self), domain=("flowy-check", self.serial)
        )
        self.runner: Runner[Any, Any] = Runner(
            graph,
            self.backend,
            run_lease=(f"process-{number}", LEASE_TTL),
            clock=clock,
            handoff_stale_after=0.0,
        )
        self.worker: Worker[Any, Any] = Worker(
            self.runner,
            self.backend.consumer,
            owner=f"process-{number}",
            lease_ttl=LEASE_TTL,
            concurrency=1,
            visibility_timeout=VISIBILITY,
            retry_delay=0.0,
            retry_jitter=0.0,
            busy_grace=0.0,
            stale_after=0.0,
            resume_options=lambda intent: dict(options),
            on_result=on_result,
        )

    @property
    def dead(self) -> bool:
        """True once the process crashed."""
        return self.backend.dead
