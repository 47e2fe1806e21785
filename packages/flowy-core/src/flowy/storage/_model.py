"""The values stores keep and exchange: snapshots, thread summaries, leases, hand-off
intents and outbox messages, with the validation of thread ids every store shares."""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Generic

from .._errors import InvalidThreadIdError
from .._types import JSON, HandoffStatus, ResumeToken, RunStatus, S

__all__ = [
    "MAX_THREAD_ID_BYTES",
    "SYSTEM_LEASE_PREFIX",
    "DeadLetter",
    "HandoffIntent",
    "HandoffStatus",
    "Lease",
    "OutboxMessage",
    "RunStatus",
    "Snapshot",
    "ThreadSummary",
    "new_write_id",
    "next_fencing_token",
    "validate_thread_id",
]

MAX_THREAD_ID_BYTES = 16 * 1024
"""The longest thread id accepted, in UTF-8 bytes."""

SYSTEM_LEASE_PREFIX = "\x1f"
"""Leases of flowy's own (the recovery leader's) are named with this first character,
which no thread id may start with, so no thread can collide with them."""


def validate_thread_id(thread_id: object) -> str:
    """Return ``thread_id`` if it is a usable thread id, else raise ``InvalidThreadIdError``.

    A thread id is a non-empty ``str`` of at most ``MAX_THREAD_ID_BYTES`` UTF-8 bytes with
    no NUL character, not starting with U+001F (reserved for flowy's own leases). Any
    other content (``{``, ``:``, newlines, non-ASCII) is allowed and stored exactly.
    """
    if not isinstance(thread_id, str):
        raise InvalidThreadIdError(
            f"thread id must be a str, got {type(thread_id).__name__} {thread_id!r:.200}"
        )
    if not thread_id:
        raise InvalidThreadIdError("thread id must not be empty")
    if thread_id.startswith(SYSTEM_LEASE_PREFIX):
        raise InvalidThreadIdError(
            f"thread id must not start with U+001F (reserved for flowy's own leases): "
            f"{thread_id!r:.200}"
        )
    if "\x00" in thread_id:
        raise InvalidThreadIdError(f"thread id must not contain NUL characters: {thread_id!r:.200}")
    try:
        size = len(thread_id.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidThreadIdError(
            f"thread id is not valid Unicode text (lone surrogate?): {thread_id!r:.200}"
        ) from exc
    if size > MAX_THREAD_ID_BYTES:
        raise InvalidThreadIdError(
            f"thread id is {size} bytes long; the limit is {MAX_THREAD_ID_BYTES} bytes"
        )
    return thread_id


def next_fencing_token(previous: int | None, now: float) -> int:
    """The fencing token of a new lease: above the thread's previous token (if its lease
    record still exists) and at least the store's clock in microseconds.

    The clock floor is what lets a store delete the lease record of a released, expired
    or deleted thread without tokens ever going back: a later lease is taken later, so
    its floor is above every token issued before (as long as the store's clock does not
    step back by more than the time a lease record is kept after it expired).
    """
    return max((previous or 0) + 1, int(now * 1_000_000))


def new_write_id() -> str:
    """A fresh random id stamped on every saved snapshot (resolves ambiguous saves)."""
    return uuid.uuid4().hex


@dataclass(frozen=True)
class Snapshot(Generic[S]):
    """One persisted point of a run.

    ``revision`` is the revision the snapshot is stored at (0 before the first save; a
    checkpointer's ``load`` fills it in). ``budget_counts`` survive segment resets;
    ``step_count`` counts the steps of the current segment only, ``total_steps`` those
    of every segment. ``effects`` are the effects the segment emitted up to this point
    and ``retry_counts`` the attempts each node has used (both as JSON values).
    """

    thread_id: str
    state: S
    execution_pointer: str
    status: RunStatus = RunStatus.RUNNING
    reason: str = ""
    revision: int = 0
    step_count: int = 0
    segment: int = 0
    total_steps: int = 0
    budget_counts: Mapping[str, int] = field(default_factory=lambda: {})
    metadata: Mapping[str, JSON] = field(default_factory=lambda: {})
    handoff_status: HandoffStatus = HandoffStatus.NONE
    handoff_pending_at: float | None = None
    updated_at: float = 0.0
    write_id: str = ""
    effects: Sequence[JSON] = ()
    retry_counts: Mapping[str, int] = field(default_factory=lambda: {})

    def at_revision(self, revision: int) -> Snapshot[S]:
        """A copy of this snapshot stored at ``revision``."""
        return replace(self, revision=revision)

    @property
    def resume_token(self) -> ResumeToken:
        """The token that resumes from this snapshot."""
        return ResumeToken(self.thread_id, self.revision)


@dataclass(frozen=True, slots=True)
class ThreadSummary:
    """One row of ``Checkpointer.list_threads``: the head of a thread without its state."""

    thread_id: str
    revision: int
    execution_pointer: str
    status: RunStatus
    reason: str
    handoff_status: HandoffStatus
    handoff_pending_at: float | None
    updated_at: float


@dataclass(frozen=True, slots=True)
class Lease:
    """A run lease on one thread.

    ``fencing_token`` grows on every acquisition of the thread and never goes back, even
    after release or delete. ``expires_at`` is in seconds since the epoch by the
    store's clock.
    """

    thread_id: str
    owner: str
    fencing_token: int
    expires_at: float

    @property
    def token(self) -> int:
        """Deprecated alias of :attr:`fencing_token` (removed in 0.3)."""
        warnings.warn("Lease.token is deprecated; use Lease.fencing_token", DeprecationWarning, 2)
        return self.fencing_token


@dataclass(frozen=True, slots=True)
class HandoffIntent:
    """The canonical message a hand-off puts in the outbox.

    ``pending_snapshot_revision`` is the revision saved with status pending (equal to the
    committed one on the transactional path); ``committed_snapshot_revision`` is the
    revision saved with status enqueued; ``snapshot_revision`` is the revision of
    ``resume_token``, the one a consumer resumes. Consumers never do revision arithmetic.
    """

    thread_id: str
    pending_snapshot_revision: int
    committed_snapshot_revision: int
    snapshot_revision: int
    resume_token: ResumeToken
    handoff_status: HandoffStatus
    reason: str
    execution_pointer: str
    created_at: float = 0.0
    trace: Mapping[str, str] = field(default_factory=lambda: {})

    @property
    def intent_id(self) -> str:
        """A stable id: one intent per thread and committed revision."""
        return f"{self.committed_snapshot_revision}:{self.thread_id}"


@dataclass(frozen=True, slots=True)
class OutboxMessage:
    """One claimed outbox delivery.

    ``attempts`` counts deliveries including this one; ``last_error`` is what the
    previous delivery's ``release`` recorded (empty on the first).
    """

    message_id: str
    intent: HandoffIntent
    attempts: int
    last_error: str = ""


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message the consumer gave up on.

    ``intent`` is ``None`` when the stored payload does not decode (a poison message);
    ``payload`` keeps its bytes for inspection and ``error`` says why it was buried.
    """

    message_id: str
    intent: HandoffIntent | None
    attempts: int
    error: str
    payload: bytes = b""

    @property
    def thread_id(self) -> str:
        """The intent's thread id, or ``""`` for an undecodable payload."""
        return self.intent.thread_id if self.intent is not None else ""
