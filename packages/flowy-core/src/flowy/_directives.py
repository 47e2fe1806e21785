"""Directives: what a node tells the runtime to do after its state update.

Nodes never name their successor: ``completed()`` routes through the graph's edges.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Generic, final

from ._types import E

__all__ = [
    "Directive",
    "DirectiveKind",
    "NoEffect",
    "completed",
    "effect",
    "end",
    "fail",
    "handoff",
    "retry",
    "suspend",
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


def handoff(reason: str, *, resume_at: str | None = None) -> Directive[Any]:
    """Stop here and hand the run to a background worker through the outbox.

    Args:
        reason: why the run is handed off; the snapshot's and the result's reason. Not
            empty.
        resume_at: the node the worker resumes the run at (an unknown node fails the
            run with ``handoff_resume_target_invalid``), or ``None`` for this node again.

    Raises:
        ValueError: ``reason`` is empty.
    """
    if not reason:
        raise ValueError("handoff() needs a non-empty reason")
    return Directive(DirectiveKind.HANDOFF, reason=reason, resume_at=resume_at)


def retry(max_attempts: int) -> Directive[Any]:
    """Run this node again, up to ``max_attempts`` attempts in all; when they are used up
    the run follows the node's retry route, or fails with reason ``retry_exhausted``."""
    if max_attempts < 1:
        raise ValueError(f"retry() needs max_attempts >= 1, got {max_attempts!r}")
    return Directive(DirectiveKind.RETRY, max_attempts=max_attempts)


def effect(base: Directive[E], payload: E) -> Directive[E]:
    """Emit the typed effect ``payload`` (to events and the result), then apply ``base``."""
    return Directive(DirectiveKind.EFFECT, payload=payload, base=base)
