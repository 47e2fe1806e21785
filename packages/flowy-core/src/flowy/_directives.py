"""Directives: what a node tells the runtime to do after its state update.

Nodes never name their successor: ``completed()`` routes through the graph's edges.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, final

from ._types import E
from .storage._model import DEFAULT_QUEUE, Route, validate_queue_name

__all__ = [
    "Directive",
    "DirectiveKind",
    "NoEffect",
    "completed",
    "effect",
    "end",
    "fail",
    "fan_out",
    "handoff",
    "retry",
    "sleep",
    "sleep_until",
    "suspend",
    "wait_for",
]


@final
class NoEffect:
    """The effect type of a graph that emits no effects: ``GraphBuilder[S, NoEffect]``."""

    def __init__(self) -> None:
        raise TypeError("NoEffect is a marker type; it has no instances")


class DirectiveKind(enum.StrEnum):
    """The kind of a directive."""

    COMPLETED = "completed"
    """``completed()``: follow the node's route."""
    END = "end"
    """``end()``: finish the run successfully now."""
    FAIL = "fail"
    """``fail(reason)``: fail the run."""
    SUSPEND = "suspend"
    """``suspend(reason)``: save a resumable snapshot and wait for outside input."""
    HANDOFF = "handoff"
    """``handoff(reason)``: save and hand the run to a background worker."""
    RETRY = "retry"
    """``retry(max_attempts)``: run the node again."""
    EFFECT = "effect"
    """``effect(base, payload)``: emit an effect, then apply ``base``."""
    FAN_OUT = "fan_out"
    """``fan_out(node, items)``: run ``node`` once per item, in parallel, and fold their
    updates (a superstep)."""
    WAIT = "wait"
    """``sleep``, ``sleep_until`` or ``wait_for``: save a waiting snapshot with its
    wake-up time; a worker resumes it when the time comes or the signal arrives."""


@dataclass(frozen=True)
class Directive(Generic[E]):
    """A node's instruction to the runtime. Build one with the functions of this module."""

    kind: DirectiveKind
    """What the runtime does."""
    reason: str = ""
    """The reason of ``FAIL``, ``SUSPEND`` and ``HANDOFF``, saved with the snapshot."""
    resume_at: str | None = None
    """The node a suspended or handed-off run resumes at (``None``: the same node)."""
    max_attempts: int = 0
    """The attempts ``RETRY`` allows the node in all."""
    payload: E | None = None
    """The effect an ``EFFECT`` emits."""
    base: Directive[E] | None = None
    """The directive an ``EFFECT`` applies after emitting ``payload``."""
    signal: str = ""
    """The signal a ``WAIT`` waits for (``""``: none, a sleep)."""
    delay: float | None = None
    """Seconds a ``WAIT`` lasts at most, from when it is saved (``None``: see ``until``)."""
    until: float | None = None
    """When a ``WAIT`` ends at the latest, in seconds since the epoch (``None``: no
    deadline, unless ``delay``)."""
    on_timeout: str | None = None
    """The node a ``WAIT`` resumes at when its deadline passes first (``None``: the
    node's timeout route, else ``resume_at``)."""
    items: tuple[Any, ...] = ()
    """The items of a ``FAN_OUT``: one branch of ``resume_at`` (the branch node) each."""
    concurrency: int | None = None
    """The most branches of a ``FAN_OUT`` running at once (``None``: all)."""
    queue: str | None = None
    """The queue a ``HANDOFF``'s message waits in (``None``: the node's default queue,
    else the graph's, else ``"default"``)."""
    partition_key: str = ""
    """The partition of the queue a ``HANDOFF``'s message is in (``""``: none)."""
    priority: int = 0
    """The priority of a ``HANDOFF``'s message in its queue, lower first."""

    def route(self, default_queue: str = DEFAULT_QUEUE) -> Route:
        """The route of a ``HANDOFF``'s message: its own queue, else ``default_queue``."""
        queue = self.queue if self.queue is not None else default_queue
        return Route(queue, self.partition_key, self.priority)


_COMPLETED: Directive[Any] = Directive(DirectiveKind.COMPLETED)
_END: Directive[Any] = Directive(DirectiveKind.END)


def completed() -> Directive[Any]:
    """Done with this node: continue along the graph's edge (or finish at a terminal node)."""
    return _COMPLETED


def end() -> Directive[Any]:
    """Finish the run successfully now (status completed, reason ``end``)."""
    return _END


def fail(reason: str) -> Directive[Any]:
    """Fail the run with ``reason`` (saved with status failed)."""
    if not reason:
        raise ValueError("fail() needs a non-empty reason")
    return Directive(DirectiveKind.FAIL, reason=reason)


def suspend(reason: str, *, resume_at: str | None = None) -> Directive[Any]:
    """Stop for outside input (a human); save a resumable snapshot.

    Args:
        reason: why the run waits; the snapshot's and the result's reason. Not empty.
        resume_at: the node the run resumes at (validated by the core before the save;
            an unknown node fails the run with ``suspend_resume_target_invalid``), or
            ``None`` for this node again.

    Raises:
        ValueError: ``reason`` is empty.
    """
    if not reason:
        raise ValueError("suspend() needs a non-empty reason")
    return Directive(DirectiveKind.SUSPEND, reason=reason, resume_at=resume_at)


def handoff(
    reason: str,
    *,
    resume_at: str | None = None,
    queue: str | None = None,
    partition_key: str | None = None,
    priority: int | None = None,
) -> Directive[Any]:
    """Stop here and hand the run to a background worker through the outbox.

    Args:
        reason: why the run is handed off; the snapshot's and the result's reason. Not
            empty.
        resume_at: the node the worker resumes the run at (an unknown node fails the
            run with ``handoff_resume_target_invalid``), or ``None`` for this node again.
        queue: the queue its message waits in until a worker serving that queue
            starts it (``None``: the node's queue, ``GraphBuilder.add_node(queue=...)``,
            else the graph's, ``compile(queue=...)``, else ``"default"``).
        partition_key: the partition of the queue it belongs to (a customer id, say),
            which the queue's partition limits count apart (``None``: none).
        priority: its order in the queue, lower first, first in first out within a
            priority (``None``: 0).

    Raises:
        ValueError: ``reason`` is empty, a queue name that is not 1 to 64 letters,
            digits, ``_ . : -``, a partition key over 256 bytes, or a priority out of
            ``0 .. 2**31 - 1``.
        TypeError: a queue, partition key or priority of the wrong type.
    """
    if not reason:
        raise ValueError("handoff() needs a non-empty reason")
    if queue is not None:
        validate_queue_name(queue)
    key = "" if partition_key is None else partition_key
    rank = 0 if priority is None else priority
    Route(DEFAULT_QUEUE, key, rank)  # checks the key and the priority now, not at the save
    return Directive(
        DirectiveKind.HANDOFF,
        reason=reason,
        resume_at=resume_at,
        queue=queue,
        partition_key=key,
        priority=rank,
    )


def retry(max_attempts: int) -> Directive[Any]:
    """Run this node again, up to ``max_attempts`` attempts in all; when they are used up
    the run follows the node's retry route, or fails with reason ``retry_exhausted``."""
    if max_attempts < 1:
        raise ValueError(f"retry() needs max_attempts >= 1, got {max_attempts!r}")
    return Directive(DirectiveKind.RETRY, max_attempts=max_attempts)


def effect(base: Directive[E], payload: E) -> Directive[E]:
    """Emit the typed effect ``payload`` (to events and the result), then apply ``base``."""
    return Directive(DirectiveKind.EFFECT, payload=payload, base=base)


def _seconds(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number of seconds, got {value!r:.80}")
    return float(value)


def sleep(seconds: float, *, resume_at: str | None = None, reason: str = "sleep") -> Directive[Any]:
    """Wait ``seconds`` (durably: the wake-up time is saved with the snapshot), then go
    on at ``resume_at``; a ``flowy.Worker`` resumes the thread when the time comes.

    Args:
        seconds: how long to wait, >= 0, counted from the save (the runner's clock).
        resume_at: the node the run continues at, or ``None`` for this node again.
        reason: the waiting snapshot's reason.

    Raises:
        ValueError: ``seconds`` is negative or not finite, or ``reason`` is empty.
    """
    delay = _seconds(seconds, "sleep()")
    if delay < 0:
        raise ValueError(f"sleep() needs seconds >= 0, got {seconds!r}")
    if not reason:
        raise ValueError("sleep() needs a non-empty reason")
    return Directive(DirectiveKind.WAIT, reason=reason, resume_at=resume_at, delay=delay)


def sleep_until(
    timestamp: float, *, resume_at: str | None = None, reason: str = "sleep"
) -> Directive[Any]:
    """Wait until ``timestamp`` (seconds since the epoch), durably, then go on at
    ``resume_at`` (``None``: this node again). A past time wakes at once.

    Args:
        timestamp: when to wake, in seconds since the epoch (finite).
        resume_at: the node the run continues at, or ``None`` for this node again.
        reason: the waiting snapshot's reason.
    """
    until = _seconds(timestamp, "sleep_until()")
    if not reason:
        raise ValueError("sleep_until() needs a non-empty reason")
    return Directive(DirectiveKind.WAIT, reason=reason, resume_at=resume_at, until=until)


def wait_for(
    signal: str,
    *,
    timeout: float | None = None,
    resume_at: str | None = None,
    on_timeout: str | None = None,
    reason: str = "",
) -> Directive[Any]:
    """Wait, durably, until the signal ``signal`` arrives (``Runner.signal``) or
    ``timeout`` seconds pass.

    On the signal the run resumes at ``resume_at`` with the signal's payload merged
    into the state (by the graph's ``on_signal`` handler for that name, else like a
    ``state_overlay``); a signal sent before the wait is delivered by it at once. On the
    deadline it resumes at ``on_timeout``, else at the node's timeout route
    (``GraphBuilder.add_timeout_route``), else at ``resume_at``, with the state as it
    was.

    Args:
        signal: the signal's name.
        timeout: seconds to wait at most (``None``: no deadline).
        resume_at: the node the run continues at (``None``: this node again).
        on_timeout: the node the run continues at when the deadline passes first.
        reason: the waiting snapshot's reason (default ``waiting:<signal>``).

    Raises:
        ValueError: an empty signal name, or a negative or non-finite timeout.
    """
    if not isinstance(signal, str) or not signal:  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ValueError("wait_for() needs a non-empty signal name")
    delay = None if timeout is None else _seconds(timeout, "wait_for(timeout=...)")
    if delay is not None and delay < 0:
        raise ValueError(f"wait_for() needs timeout >= 0, got {timeout!r}")
    return Directive(
        DirectiveKind.WAIT,
        reason=reason or f"waiting:{signal}",
        resume_at=resume_at,
        signal=signal,
        delay=delay,
        on_timeout=on_timeout,
    )


def fan_out(node: str, items: Sequence[Any], *, concurrency: int | None = None) -> Directive[Any]:
    """Run ``node`` once per item of ``items``, in parallel: a superstep.

    Each branch gets the current state with its item merged in (like a
    ``state_overlay``: the fields of a mapping into a dataclass or TypedDict state, else
    the graph's reducer); the branches' updates are folded into the state with the
    reducer in the order of ``items`` (never in the order they finish), then the run
    continues at the join the graph declared (``GraphBuilder.add_fan_out``). The node
    that returns this must have declared ``node`` as its fan-out.

    Args:
        node: the branch node.
        items: one branch per item (none: the superstep does nothing).
        concurrency: the most branches running at once (``None``: all).

    Raises:
        ValueError: an empty node name, or a concurrency below 1.
    """
    if not isinstance(node, str) or not node:  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ValueError("fan_out() needs the name of the branch node")
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"fan_out() needs concurrency >= 1 or None, got {concurrency!r}")
    return Directive(
        DirectiveKind.FAN_OUT, resume_at=node, items=tuple(items), concurrency=concurrency
    )
