"""Type variables, aliases, the resume token and the status enums: the leaf every other
module may import.

It imports nothing of ours, so nothing can form an import cycle through it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TypeAlias, TypeVar

__all__ = ["JSON", "E", "HandoffStatus", "ResumeToken", "RunStatus", "S", "T"]

S = TypeVar("S")
"""The application's state type."""

E = TypeVar("E")
"""The application's effect type (``flowy.NoEffect`` when a graph has none)."""

T = TypeVar("T")

MAX_REVISION = 2**63 - 1
"""The largest revision a store keeps (a signed 64-bit integer)."""

JSON: TypeAlias = "dict[str, JSON] | list[JSON] | str | int | float | bool | None"
"""A JSON value: what run metadata and stored headers may contain."""


@dataclass(frozen=True, slots=True)
class ResumeToken:
    """Names one persisted snapshot: a resume succeeds only while it is still the head.

    ``str(token)`` is ``"thread@revision"``; :meth:`parse` reads that form back, so a
    token can travel through a URL, a form field or a log line.
    """

    thread_id: str
    """The thread the snapshot belongs to."""
    snapshot_revision: int
    """The revision of that snapshot (1 for a thread's first save)."""

    def __str__(self) -> str:
        return f"{self.thread_id}@{self.snapshot_revision}"

    @classmethod
    def parse(cls, text: str) -> ResumeToken:
        """Read a token printed as ``"thread@revision"``.

        The revision is the part after the last ``@`` (a thread id may itself contain
        ``@``). Raises ``ValueError`` if ``text`` has no ``@``, an empty thread id, or a
        revision that is not a decimal integer from 1 to 2**63 - 1. (Catching
        ``ValueError`` also catches ``InvalidResumeTokenError`` and
        ``InvalidThreadIdError``, which ``Runner.evaluate_resume`` raises.)
        """
        if not isinstance(text, str):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"ResumeToken.parse needs a str, got {type(text).__name__}")
        thread_id, sep, revision = text.rpartition("@")
        if not sep or not thread_id:
            raise ValueError(f"not a resume token (expected 'thread@revision'): {text!r:.200}")
        if not revision.isascii() or not revision.isdigit() or len(revision) > 19:
            raise ValueError(
                f"the revision of resume token {text!r:.200} must be a positive integer, "
                f"got {revision!r:.40}"
            )
        number = int(revision)
        if not 1 <= number <= MAX_REVISION:
            raise ValueError(
                f"the revision of resume token {text!r:.200} must be from 1 to {MAX_REVISION}"
            )
        return cls(thread_id, number)


class RunStatus(enum.StrEnum):
    """Where a run stands, as persisted in its snapshot."""

    RUNNING = "running"
    """Saved between steps (``save_every_step``): a crash resumes from the last step."""
    SUSPENDED = "suspended"
    """A node returned ``suspend()``: waiting for outside input; resume with the token."""
    WAITING = "waiting"
    """A node returned ``sleep()``, ``sleep_until()`` or ``wait_for()`` (or an activity
    waits for its next attempt): a worker resumes it when its wake-up time comes or its
    signal arrives."""
    HANDOFF = "handoff"
    """A node returned ``handoff()`` (or ``request_local_handoff()``): a worker resumes
    it; ``HandoffStatus`` tracks its outbox message."""
    COMPLETED = "completed"
    """Finished: a terminal node completed or a node returned ``end()``."""
    FAILED = "failed"
    """Failed: ``fail()``, exhausted retries, a step or budget limit, a violated
    invariant, … (the reason says which)."""
    CANCELED = "canceled"
    """Stopped by ``request_stop()`` or a cancellation; resumable from this point."""


class HandoffStatus(enum.StrEnum):
    """The hand-off outbox state of a snapshot."""

    NONE = "none"
    """No hand-off outbox message belongs to this snapshot."""
    PENDING = "pending"
    """Saved before its intent is enqueued (three-phase path); once older than the stale
    TTL, ``Runner.recover_stale_handoff`` may enqueue it."""
    ENQUEUED = "enqueued"
    """Its intent is in the outbox (or being put there): a worker will resume it."""
    ORPHANED = "orphaned"
    """Enqueueing its intent failed: recover it with ``Runner.recover_stale_handoff``."""
