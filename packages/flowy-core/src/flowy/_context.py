"""Run context: typed bindings, named budgets and run metadata, carried by contextvars.

Nodes read them with ``binding(key)``, ``use_budget(name)``, ``budget_used(name)`` and
``run_metadata()``. Bindings are ephemeral: they are never persisted in a snapshot.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Generic, cast

from ._errors import MissingBindingError, NoRunContextError
from ._types import JSON, T

__all__ = [
    "BindingKey",
    "RunBindings",
    "RunMetadata",
    "RunMetadataInput",
    "bind",
    "binding",
    "budget_used",
    "context_with_run_metadata",
    "run_metadata",
    "use_budget",
]


class BindingKey(Generic[T]):
    """A typed key for an ephemeral run binding (a DB pool, an HTTP client, …).

    Keys compare by identity: two keys with the same name are different keys. For two
    dependencies of one type, make two keys.

    Args:
        name: shown in the key's repr and in ``MissingBindingError`` messages.
    """

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name: str = name

    def __repr__(self) -> str:
        return f"BindingKey({self.name!r})"


class RunBindings:
    """A set of bound values, passed to ``Runner.start/resume(bindings=...)``."""

    __slots__ = ("_values",)

    def __init__(self) -> None:
        self._values: dict[BindingKey[Any], Any] = {}

    def get(self, key: BindingKey[T]) -> T:
        """The value bound to ``key``; ``MissingBindingError`` if none."""
        try:
            return cast(T, self._values[key])
        except KeyError:
            raise MissingBindingError(
                f"no value is bound for {key!r}; pass bindings=... with "
                f"flowy.bind(bindings, {key.name}, value) to start()/resume()"
            ) from None

    def __contains__(self, key: object) -> bool:
        return key in self._values


def bind(bindings: RunBindings, key: BindingKey[T], value: T) -> RunBindings:
    """Bind ``value`` to ``key`` in ``bindings`` and return ``bindings``."""
    bindings._values[key] = value  # pyright: ignore[reportPrivateUsage]
    return bindings


@dataclass(frozen=True, slots=True)
class RunMetadataInput:
    """Run metadata merged into a resumed run (``Runner.resume(run_metadata=...)``).

    Each entry of ``budget_counts`` replaces the persisted count of that budget (as the
    specification's ``WithRunMetadata``); ``metadata`` entries overwrite too.
    """

    budget_counts: Mapping[str, int] = field(default_factory=lambda: {})
    metadata: Mapping[str, JSON] = field(default_factory=lambda: {})


@dataclass(slots=True)
class RunMetadata:
    """What a node may know about the run it is in (``flowy.run_metadata()``)."""

    thread_id: str
    """The thread being run."""
    node: str = ""
    """The node running now."""
    segment: int = 0
    """The segment number: 0 for the start, one more for each resume."""
    step_count: int = 0
    """Steps completed in this segment."""
    total_steps: int = 0
    """Steps completed by the thread across all its segments."""
    budget_counts: dict[str, int] = field(default_factory=lambda: {})
    """Budget used so far (``use_budget``), kept across resumes."""
    budget_limits: Mapping[str, int] = field(default_factory=lambda: {})
    """The graph's budget limits."""
    metadata: dict[str, JSON] = field(default_factory=lambda: {})
    """The run's metadata (``Runner.start(metadata=...)``), saved with every snapshot."""
    bindings: RunBindings = field(default_factory=RunBindings)
    """The run's bindings (never saved)."""
    retry_counts: dict[str, int] = field(default_factory=lambda: {})
    """The ``retry()`` attempts each node has used."""


current_run: ContextVar[RunMetadata | None] = ContextVar("flowy_run", default=None)

current_progress: ContextVar[Callable[[Any], None] | None] = ContextVar(
    "flowy_progress", default=None
)
"""Where ``flowy.live.progress`` sends, in a running node (set by the execution)."""


def _require() -> RunMetadata:
    meta = current_run.get()
    if meta is None:
        raise NoRunContextError(
            "no flowy run is active here; call this from a node run by a Runner, or wrap "
            "the call in flowy.context_with_run_metadata(...)"
        )
    return meta


def run_metadata() -> RunMetadata:
    """The metadata of the run the calling node belongs to."""
    return _require()


def binding(key: BindingKey[T]) -> T:
    """The value bound to ``key`` for this run; ``MissingBindingError`` names the key."""
    return _require().bindings.get(key)


def use_budget(name: str, amount: int = 1) -> int:
    """Record ``amount`` of budget ``name`` as used; returns the new total.

    Limits (``compile(budgets=...)``) are checked after the step; exceeding one fails the
    run with reason ``budget_exceeded:<name>``. Counts persist across resumes.
    """
    if amount < 0:
        raise ValueError(f"use_budget amount must be >= 0, got {amount!r}")
    meta = _require()
    total = meta.budget_counts.get(name, 0) + amount
    meta.budget_counts[name] = total
    return total


def budget_used(name: str) -> int:
    """How much of budget ``name`` this thread has used (0 if none)."""
    return _require().budget_counts.get(name, 0)


@contextlib.contextmanager
def context_with_run_metadata(
    thread_id: str = "isolated",
    *,
    node: str = "",
    bindings: RunBindings | None = None,
    budget_counts: Mapping[str, int] | None = None,
    budget_limits: Mapping[str, int] | None = None,
    metadata: Mapping[str, JSON] | None = None,
) -> Generator[RunMetadata]:
    """Provide a run context so a node can be called outside a Runner (unit tests).

    ``with context_with_run_metadata(...) as meta:`` makes ``run_metadata()``,
    ``binding()``, ``use_budget()`` and ``budget_used()`` work inside the block.

    Args:
        thread_id: the thread id the context reports.
        node: the node name it reports.
        bindings: the values ``binding(key)`` returns (none by default).
        budget_counts: budget already used, by name.
        budget_limits: budget limits, by name (reported only: nothing enforces them here).
        metadata: the run metadata.
    """
    meta = RunMetadata(
        thread_id=thread_id,
        node=node,
        budget_counts=dict(budget_counts or {}),
        budget_limits=dict(budget_limits or {}),
        metadata=dict(metadata or {}),
        bindings=bindings if bindings is not None else RunBindings(),
    )
    token = current_run.set(meta)
    try:
        yield meta
    finally:
        current_run.reset(token)
