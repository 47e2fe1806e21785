"""The vocabulary of fault injection: what strikes (:class:`FaultKind`), where
(:class:`Phase`, :class:`Operation`), one :class:`Fault`, and the plans that decide
(:class:`FaultPlan`, :class:`RandomFaults`)."""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..._errors import StorageUnavailableError
from ...storage import HandoffStatus, Lease, RunStatus, Snapshot
from ...storage.dialect import SYSTEM_LEASE_PREFIX

__all__ = [
    "SAVES",
    "ArmedFaults",
    "Fault",
    "FaultKind",
    "FaultPlan",
    "Operation",
    "Phase",
    "RandomFaults",
    "SimulatedCrash",
    "phase_of",
    "save_phase",
]


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
    thread over; then this process goes on (played by the plan)."""
    REDELIVER = "redeliver"
    """The ack of a processed message is lost: the message is delivered again, late."""
    CONCURRENT = "concurrent"
    """Two processes resume the suspended thread with the same token at once (played
    by ``flowy.testing.check``)."""
    TIMER_FIRST = "timer-first"
    """The waiting thread's timer fires before the signal it waits for arrives (played
    by ``flowy.testing.check``)."""


class Phase(enum.StrEnum):
    """Where a fault strikes: the kind of operation, a write by what it writes."""

    SAVE_STEP = "save_step"
    SAVE_SUSPEND = "save_suspend"
    SAVE_PENDING = "save_pending"
    PATCH_ENQUEUED = "patch_enqueued"
    PATCH_ORPHANED = "patch_orphaned"
    SAVE_TERMINAL = "save_terminal"
    SAVE_CANCEL = "save_cancel"
    COMMIT = "commit"
    """A save that writes outbox messages with the snapshot (a transactional hand-off)."""
    ENQUEUE = "enqueue"
    PRUNE = "prune"
    LOAD = "load"
    """The read of a thread's head."""
    DELETE = "delete"
    JOURNAL = "journal"
    """The write of an activity's journal record."""
    SIGNAL = "signal"
    """The write of a signal into a thread's inbox."""
    ACQUIRE = "acquire"
    RENEW = "renew"
    RELEASE_LEASE = "release_lease"
    CLAIM = "claim"
    ACK = "ack"
    RELEASE = "release"
    """A consumer giving a message back (or dead-lettering it)."""
    RETRY_DEAD_LETTER = "retry_dead_letter"
    CONFIGURE = "configure"
    """The write of a queue's limits."""
    READ = "read"
    """Any other read (history, listings, timers, signals, journal, lease holder,
    dead letters, backlog)."""


SAVES: frozenset[Phase] = frozenset(
    {
        Phase.SAVE_STEP,
        Phase.SAVE_SUSPEND,
        Phase.SAVE_PENDING,
        Phase.PATCH_ENQUEUED,
        Phase.PATCH_ORPHANED,
        Phase.SAVE_TERMINAL,
        Phase.SAVE_CANCEL,
        Phase.COMMIT,
    }
)
"""The phases of a checkpointer's conditional write."""


def save_phase(status: RunStatus, handoff_status: HandoffStatus) -> Phase:
    if status is RunStatus.HANDOFF:
        return {
            HandoffStatus.PENDING: Phase.SAVE_PENDING,
            HandoffStatus.ENQUEUED: Phase.PATCH_ENQUEUED,
            HandoffStatus.ORPHANED: Phase.PATCH_ORPHANED,
        }.get(handoff_status, Phase.SAVE_SUSPEND)
    if status is RunStatus.SUSPENDED:
        return Phase.SAVE_SUSPEND
    if status is RunStatus.CANCELED:
        return Phase.SAVE_CANCEL
    if status in (RunStatus.COMPLETED, RunStatus.FAILED):
        return Phase.SAVE_TERMINAL
    return Phase.SAVE_STEP


def phase_of(snapshot: Snapshot[Any], transactional: bool = False) -> Phase:
    """The phase a save of ``snapshot`` belongs to (``COMMIT`` if ``transactional``)."""
    if transactional:
        return Phase.COMMIT
    return save_phase(snapshot.status, snapshot.handoff_status)


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault: ``kind`` at operation number ``at`` (a schedule's fault, printed
    ``"kind@at"``), or at the next ``times`` operations of ``phase`` (an armed one).

    ``error`` makes the exception ``UNAVAILABLE`` and ``UNKNOWN`` raise (default: a
    ``StorageUnavailableError`` saying what was injected).
    """

    at: int | None = None
    """The operation it strikes, counted from 1 by the plan (``None``: by phase)."""
    kind: FaultKind = FaultKind.UNAVAILABLE
    """What happens there."""
    phase: Phase | None = None
    """The phase it strikes (``None``: the one of the operation ``at``)."""
    times: int = 1
    """How many operations of ``phase`` it strikes."""
    error: Callable[[], BaseException] | None = field(default=None, compare=False)
    """The exception raised for ``UNAVAILABLE`` / ``UNKNOWN``."""

    def __str__(self) -> str:
        where = self.at if self.at is not None else self.phase
        return f"{self.kind.value}@{where}"

    def raise_error(self) -> BaseException:
        """The exception this fault raises to the caller."""
        if self.error is not None:
            return self.error()
        if self.kind is FaultKind.UNKNOWN:
            return StorageUnavailableError(
                "injected fault: the connection dropped; the outcome is unknown"
            )
        return StorageUnavailableError("injected fault: the store is unavailable")


class SimulatedCrash(BaseException):
    """The simulated death of a process (a ``BaseException``, like ``SystemExit``: it is
    not an error to handle, and nothing in the process survives it)."""


@dataclass(frozen=True, slots=True)
class Operation:
    """One primitive call of a store through a :class:`FaultyBackend`."""

    phase: Phase
    """What kind of operation it is."""
    primitive: str
    """The primitive's name (``"_write"``, ``"_acquire"``, …)."""
    args: tuple[Any, ...]
    """Its positional arguments (a ``Write``, a thread id, a ``Lease``, a message id…)."""
    kwargs: Mapping[str, Any] = field(default_factory=lambda: {})
    """Its keyword arguments."""

    @property
    def system(self) -> bool:
        """True for flowy's own leases (the recovery leader's, …), not a thread's."""
        return (
            self.phase in (Phase.ACQUIRE, Phase.RENEW, Phase.RELEASE_LEASE)
            and bool(self.args)
            and _lease_key(self.args[0]).startswith(SYSTEM_LEASE_PREFIX)
        )


def _lease_key(arg: object) -> str:
    return arg.thread_id if isinstance(arg, Lease) else str(arg)


class FaultPlan:
    """Decides the faults of a :class:`FaultyBackend` (this base strikes none)."""

    async def decide(self, operation: Operation) -> Fault | None:
        """The fault to strike ``operation`` with, or ``None``."""
        return None

    def landed(self, operation: Operation, result: object) -> None:
        """Called once ``operation`` was performed, with what it returned."""


class ArmedFaults(FaultPlan):
    """The faults armed by phase, and those that struck, in order."""

    def __init__(self) -> None:
        self.armed: list[Fault] = []
        self.left: list[int] = []  # strikes left, by the index of the fault in ``armed``
        self.struck: list[Phase] = []

    def arm(self, fault: Fault) -> None:
        if fault.phase is None or fault.times < 1:
            raise ValueError(f"an armed fault needs a phase and times >= 1, got {fault!r}")
        self.armed.append(fault)
        self.left.append(fault.times)

    def take(self, phase: Phase) -> Fault | None:
        """Use up one strike of the first fault armed for ``phase``; None if there is none."""
        for i, fault in enumerate(self.armed):
            if fault.phase is phase and self.left[i] > 0:
                self.left[i] -= 1
                self.struck.append(phase)
                return fault
        return None

    async def decide(self, operation: Operation) -> Fault | None:
        return self.take(operation.phase)


class RandomFaults(FaultPlan):
    """Strikes at random: each operation of a phase in ``kinds`` with probability
    ``rate``, with one of that phase's kinds. ``error(kind, phase)`` makes the
    exception a struck operation raises (default: the fault's). ``enabled = False``
    stops it (let the system drain)."""

    def __init__(
        self,
        rng: random.Random,
        rate: float,
        kinds: Mapping[Phase, Sequence[FaultKind]],
        *,
        error: Callable[[FaultKind, Phase], BaseException] | None = None,
    ) -> None:
        self.rng: random.Random = rng
        self.rate: float = rate
        self.kinds: dict[Phase, Sequence[FaultKind]] = dict(kinds)
        self.error: Callable[[FaultKind, Phase], BaseException] | None = error
        self.enabled: bool = True
        self.struck: list[Fault] = []

    async def decide(self, operation: Operation) -> Fault | None:
        """A fault of one of the phase's kinds, with probability ``rate``."""
        kinds = self.kinds.get(operation.phase)
        if not self.enabled or not kinds or self.rng.random() >= self.rate:
            return None
        kind = kinds[0] if len(kinds) == 1 else self.rng.choice(kinds)
        phase, make = operation.phase, self.error
        error = None if make is None else (lambda: make(kind, phase))
        fault = Fault(kind=kind, phase=phase, error=error)
        self.struck.append(fault)
        return fault
