"""Resume plans: what a resume-target policy returns."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeAlias

from ._types import S

__all__ = ["ResumePlan", "ResumeTargetPolicy", "resume_current", "resume_to"]


@dataclass(frozen=True, slots=True)
class ResumePlan:
    """Where a resumed run starts: its persisted pointer (``resume_current()``) or a
    named node (``resume_to(node)``). ``ResumePlan()`` is empty and rejected with
    ``InvalidResumePlanError``."""

    current: bool = False
    """Resume at the snapshot's execution pointer."""
    target: str | None = None
    """Resume at this node instead (validated against the graph)."""

    @property
    def empty(self) -> bool:
        """True if the plan names no start point."""
        return not self.current and not self.target


def resume_current() -> ResumePlan:
    """Resume at the snapshot's execution pointer."""
    return ResumePlan(current=True)


def resume_to(node: str) -> ResumePlan:
    """Resume at ``node`` (validated against the graph before execution)."""
    return ResumePlan(target=node)


ResumeTargetPolicy: TypeAlias = Callable[
    [S, str], "tuple[S, ResumePlan] | Awaitable[tuple[S, ResumePlan]]"
]
"""``policy(state, current_pointer) -> (state, ResumePlan)``, sync or async."""
