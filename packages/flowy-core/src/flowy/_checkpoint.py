"""Storage contracts: snapshots, resume tokens, leases, hand-off intents and the
protocols every backend implements (checkpointer, lease manager, outbox, consumer).

Each protocol method's docstring states its contract; every sentence there is checked by
the conformance suite in :mod:`flowy.testing`.
"""

from __future__ import annotations

import enum
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Generic, Protocol, cast, runtime_checkable

from ._errors import InvalidThreadIdError
from ._types import JSON, S

__all__ = [
    "MAX_THREAD_ID_BYTES",
    "Checkpointer",
    "EnqueueCallback",
    "FencingCheckpointer",
    "HandoffIntent",
    "HandoffOutbox",
    "HandoffStatus",
    "Lease",
    "LeaseManager",
    "OutboxConsumer",
    "OutboxMessage",
    "ResumeToken",
    "RunStatus",
    "Snapshot",
    "ThreadSummary",
    "TransactionalCheckpointer",
    "TransactionalHandoffOutbox",
    "decode_intent",
    "encode_intent",
    "new_write_id",
    "validate_thread_id",
]

MAX_THREAD_ID_BYTES = 16 * 1024
"""The longest thread id accepted, in UTF-8 bytes."""


def validate_thread_id(thread_id: object) -> str:
    """Return ``thread_id`` if it is a usable thread id, else raise ``InvalidThreadIdError``.

    A thread id is a non-empty ``str`` of at most ``MAX_THREAD_ID_BYTES`` UTF-8 bytes with
    no NUL character. Any other content (``{``, ``:``, newlines, non-ASCII) is allowed and
    stored exactly.
    """
    if not isinstance(thread_id, str):
        raise InvalidThreadIdError(
            f"thread id must be a str, got {type(thread_id).__name__} {thread_id!r}"
        )
    if not thread_id:
        raise InvalidThreadIdError("thread id must not be empty")
    if "\x00" in thread_id:
        raise InvalidThreadIdError(f"thread id must not contain NUL characters: {thread_id!r}")
    try:
        size = len(thread_id.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidThreadIdError(
            f"thread id is not valid Unicode text (lone surrogate?): {thread_id!r}"
        ) from exc
    if size > MAX_THREAD_ID_BYTES:
        raise InvalidThreadIdError(
            f"thread id is {size} bytes long; the limit is {MAX_THREAD_ID_BYTES} bytes"
        )
    return thread_id


def new_write_id() -> str:
    """A fresh random id stamped on every saved snapshot (resolves ambiguous saves)."""
    return uuid.uuid4().hex


class RunStatus(enum.StrEnum):
    """Where a run stands, as persisted in its snapshot."""

    RUNNING = "running"
    SUSPENDED = "suspended"
    HANDOFF = "handoff"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELED = "canceled"


class HandoffStatus(enum.StrEnum):
    """The hand-off outbox state of a snapshot."""

    NONE = "none"
    PENDING = "pending"
    ENQUEUED = "enqueued"
    ORPHANED = "orphaned"


@dataclass(frozen=True, slots=True)
class ResumeToken:
    """Names one persisted snapshot: resume succeeds only if it is still the head."""

    thread_id: str
    snapshot_revision: int

    def __str__(self) -> str:
        return f"{self.thread_id}@{self.snapshot_revision}"


@dataclass(frozen=True)
class Snapshot(Generic[S]):
    """One persisted point of a run.

    ``revision`` is the revision the snapshot is stored at (0 before the first save; a
    checkpointer's ``load`` fills it in). ``budget_counts`` survive segment resets;
    ``step_count`` counts the steps of the current segment only.
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

    ``token`` is the fencing token: it grows on every acquisition of the thread and never
    goes back, even after release. ``expires_at`` is in seconds since the epoch by the
    store's clock.
    """

    thread_id: str
    owner: str
    token: int
    expires_at: float


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

    @property
    def intent_id(self) -> str:
        """A stable id: one intent per thread and committed revision."""
        return f"{self.committed_snapshot_revision}:{self.thread_id}"


def encode_intent(intent: HandoffIntent) -> bytes:
    """Encode an intent as JSON bytes (the outbox wire format of every backend)."""
    return json.dumps(
        {
            "v": 1,
            "thread_id": intent.thread_id,
            "pending": intent.pending_snapshot_revision,
            "committed": intent.committed_snapshot_revision,
            "revision": intent.snapshot_revision,
            "token_revision": intent.resume_token.snapshot_revision,
            "handoff_status": intent.handoff_status.value,
            "reason": intent.reason,
            "pointer": intent.execution_pointer,
            "created_at": intent.created_at or time.time(),
        },
        separators=(",", ":"),
        ensure_ascii=False,
    ).encode("utf-8")


def decode_intent(data: bytes | str) -> HandoffIntent:
    """Decode bytes made by :func:`encode_intent`; raise ``ValueError`` if malformed."""
    try:
        loaded: object = json.loads(data)
        if not isinstance(loaded, dict):
            raise ValueError("unknown intent format")
        raw = cast(dict[str, Any], loaded)
        if raw.get("v") != 1:
            raise ValueError("unknown intent format")
        thread_id = raw["thread_id"]
        if not isinstance(thread_id, str):
            raise ValueError("thread_id is not a string")
        return HandoffIntent(
            thread_id=thread_id,
            pending_snapshot_revision=int(raw["pending"]),
            committed_snapshot_revision=int(raw["committed"]),
            snapshot_revision=int(raw["revision"]),
            resume_token=ResumeToken(thread_id, int(raw["token_revision"])),
            handoff_status=HandoffStatus(raw["handoff_status"]),
            reason=str(raw["reason"]),
            execution_pointer=str(raw["pointer"]),
            created_at=float(raw["created_at"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed hand-off intent: {exc}") from exc


@dataclass(frozen=True, slots=True)
class OutboxMessage:
    """One claimed outbox delivery. ``attempts`` counts deliveries including this one."""

    message_id: str
    intent: HandoffIntent
    attempts: int


EnqueueCallback = Callable[[object, int], Awaitable[None]]
"""``enqueue(tx, saved_revision)``: called by ``save_with_outbox`` inside its transaction."""


@runtime_checkable
class Checkpointer(Protocol[S]):
    """Strict-OCC snapshot storage for threads.

    Revisions of a thread are 1, 2, 3, … in save order; revision 0 means "no snapshot".
    """

    async def save(
        self, expected_revision: int, snapshot: Snapshot[S], *, lease: Lease | None = None
    ) -> int:
        """Store ``snapshot`` as the thread's new head if the head is at ``expected_revision``.

        ``expected_revision=0`` creates the thread. Returns the new revision, which is
        ``expected_revision + 1``. Any other stored revision raises
        ``ConcurrencyConflictError`` and writes nothing. Every save appends to the
        thread's history. Native backends also fence: with ``lease`` the save succeeds
        only while that lease (owner and token) is the thread's live lease, else
        ``LeaseLostError``; without ``lease`` it fails with ``ThreadLeaseBusyError`` while
        any live lease holds the thread. Lease and revision are checked atomically with
        the write. A broken connection raises ``StorageUnavailableError``.
        """
        ...

    async def load(self, thread_id: str) -> tuple[Snapshot[S], int]:
        """Return the head snapshot and its revision; ``ThreadNotFoundError`` if none.

        A stored record that is corrupt or does not match its storage address raises
        ``SnapshotEnvelopeInvalidError``. O(1) in the history length.
        """
        ...

    async def get_history(self, thread_id: str, limit: int = 100) -> list[Snapshot[S]]:
        """Return up to ``limit`` stored snapshots, newest first (empty if none)."""
        ...

    async def prune(self, thread_id: str, retain: int) -> None:
        """Delete all but the newest ``retain`` history entries (the head always stays)."""
        ...

    async def delete(self, thread_id: str) -> None:
        """Delete the thread's head and history. Deleting a missing thread is not an error."""
        ...

    async def delete_if_idle(self, thread_id: str) -> None:
        """Like ``delete`` but raise ``ThreadLeaseBusyError`` while a live lease holds it."""
        ...

    async def list_threads(
        self,
        *,
        handoff_statuses: frozenset[HandoffStatus] | None = None,
        limit: int = 100,
    ) -> list[ThreadSummary]:
        """List thread heads (optionally only those in ``handoff_statuses``), any order."""
        ...


@runtime_checkable
class TransactionalCheckpointer(Checkpointer[S], Protocol[S]):
    """A checkpointer that can commit a snapshot and outbox rows in one transaction."""

    async def save_with_outbox(
        self,
        expected_revision: int,
        snapshot: Snapshot[S],
        enqueue: EnqueueCallback,
        *,
        lease: Lease | None = None,
    ) -> int:
        """Save like ``save`` and call ``await enqueue(tx, new_revision)`` in the same
        transaction; if either fails nothing is committed. ``tx`` is the backend's explicit
        transaction handle, passed to ``TransactionalHandoffOutbox.enqueue_intent_tx``.
        """
        ...


@runtime_checkable
class LeaseManager(Protocol):
    """Exclusive, expiring, fenced run leases on threads."""

    async def acquire(self, thread_id: str, owner: str, ttl: float) -> Lease:
        """Take the thread for ``ttl`` seconds.

        While a live lease exists every acquire fails with ``ThreadLeaseBusyError``, even
        by the same owner. An expired lease may be taken over. Each acquisition gets a
        fencing token greater than every earlier one for the thread, release included.
        """
        ...

    async def renew(self, lease: Lease, ttl: float) -> Lease:
        """Extend a live lease to now + ``ttl``; ``LeaseLostError`` if it is not current."""
        ...

    async def release(self, lease: Lease) -> None:
        """Give the lease up; ``LeaseLostError`` if it expired or was taken over."""
        ...

    async def holder(self, thread_id: str) -> Lease | None:
        """The live lease on the thread, or ``None``. Never changes anything."""
        ...


@runtime_checkable
class HandoffOutbox(Protocol):
    """Where hand-off intents go for background workers."""

    async def enqueue_intent(self, intent: HandoffIntent) -> None:
        """Durably enqueue ``intent`` (at-least-once delivery to consumers)."""
        ...


@runtime_checkable
class TransactionalHandoffOutbox(HandoffOutbox, Protocol):
    """An outbox that can write inside a checkpointer's transaction."""

    async def enqueue_intent_tx(self, tx: object, intent: HandoffIntent) -> None:
        """Enqueue ``intent`` inside ``tx`` (the handle ``save_with_outbox`` passed)."""
        ...


@runtime_checkable
class OutboxConsumer(Protocol):
    """The consuming side of an outbox, used by ``flowy.Worker``."""

    async def claim(
        self, limit: int, visibility_timeout: float, wait: float = 0.0
    ) -> list[OutboxMessage]:
        """Claim up to ``limit`` messages, hidden from other consumers for
        ``visibility_timeout`` seconds; wait up to ``wait`` seconds for one to arrive.
        A claim not acked in time is delivered again with ``attempts`` increased.
        """
        ...

    async def ack(self, message: OutboxMessage) -> None:
        """Remove a delivered message for good."""
        ...

    async def release(self, message: OutboxMessage, *, error: str = "") -> None:
        """Give a claimed message back for another delivery; after the consumer's
        ``max_attempts`` deliveries it moves to the dead letters instead."""
        ...

    async def dead_letters(self, limit: int = 100) -> list[OutboxMessage]:
        """List dead-lettered messages."""
        ...

    async def retry_dead_letter(self, message_id: str) -> None:
        """Move a dead-lettered message back to the outbox with its attempts reset."""
        ...


@runtime_checkable
class FencingCheckpointer(Checkpointer[S], Protocol[S]):
    """A native checkpointer that checks the leases of a lease manager inside ``save``."""

    def fences(self, leases: LeaseManager) -> bool:
        """True if ``save`` checks the leases of ``leases`` atomically with the write
        (same coordination domain). The runner wraps other pairs in a lease guard."""
        ...
