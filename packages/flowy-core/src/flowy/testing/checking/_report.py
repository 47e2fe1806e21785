"""What a check is given and what it reports: :class:`Scenario`, :class:`CheckReport`
with its :class:`Counterexample`, and fault schedules in text (:func:`parse_schedule`)."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic

from ..._types import S
from ...storage import Snapshot
from ..faults import Fault, FaultKind

__all__ = ["KINDS", "CheckReport", "Counterexample", "Scenario", "parse_schedule"]

_STORE_FAULTS = (
    FaultKind.CRASH_BEFORE,
    FaultKind.CRASH_AFTER,
    FaultKind.UNAVAILABLE,
    FaultKind.UNKNOWN,
)
KINDS: Mapping[str, tuple[FaultKind, ...]] = {
    "save": (*_STORE_FAULTS, FaultKind.TAKEOVER),
    "acking save": (*_STORE_FAULTS, FaultKind.TAKEOVER, FaultKind.REDELIVER),
    "journal": _STORE_FAULTS,
    "signal": _STORE_FAULTS,
    "enqueue": _STORE_FAULTS,
    "ack": (FaultKind.CRASH_BEFORE, FaultKind.REDELIVER),
    "acquire": (FaultKind.CRASH_AFTER, FaultKind.UNAVAILABLE),
    "resume": (FaultKind.CONCURRENT,),
    "wait": (FaultKind.TIMER_FIRST,),
}
"""The faults that may strike each kind of operation of a run."""


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
    return tuple(sorted(faults, key=lambda f: f.at or 0))


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
