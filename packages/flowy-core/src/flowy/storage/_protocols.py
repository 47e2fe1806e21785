"""The storage protocols: what the runner and the worker need from a store.

Each method's docstring states its contract; every sentence there is checked by the
conformance suite in :mod:`flowy.testing`. A store rarely implements these directly:
the bases in :mod:`flowy.storage.dialect` implement them over a few atomic
primitives.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Protocol, Self, runtime_checkable

from .._types import S
from ._capabilities import Capabilities
from ._codecs import StateCodec
from ._durable import ActivityRecord, Signal, Timer
from ._model import (
    DeadLetter,
    HandoffIntent,
    HandoffStatus,
    Lease,
    OutboxMessage,
    Snapshot,
    ThreadSummary,
)

__all__ = [
    "Backend",
    "Checkpointer",
    "DurableCheckpointer",
    "EnqueueCallback",
    "FencingCheckpointer",
    "LeaseManager",
    "Outbox",
    "OutboxConsumer",
    "TransactionalCheckpointer",
    "TransactionalOutbox",
]

EnqueueCallback = Callable[[object, int], Awaitable[None]]
"""``enqueue(tx, saved_revision)``: called by ``save_with_outbox`` inside its transaction."""


@runtime_checkable
class Checkpointer(Protocol[S]):
    """Strict-OCC snapshot storage for threads.

    Revisions of a thread are 1, 2, 3, … in save order; revision 0 means "no snapshot".
    """

    @property
    def codec(self) -> StateCodec[S] | None:
        """How states are encoded (``None``: plain JSON values)."""
        ...

    async def save(
        self, expected_revision: int, snapshot: Snapshot[S], *, lease: Lease | None = None
    ) -> int:
        """Store ``snapshot`` as the thread's new head if the head is at ``expected_revision``.

        ``expected_revision=0`` creates the thread. Returns the new revision, which is
        ``expected_revision + 1``. Any other stored revision raises
        ``ConcurrencyConflictError`` and writes nothing. Every save appends to the
        thread's history. Native stores also fence: with ``lease`` the save succeeds
        only while that lease (thread, owner and fencing token) is the thread's live
        lease, else ``LeaseLostError``; without ``lease`` it fails with
        ``ThreadLeaseBusyError`` while any live lease holds the thread. Lease and
        revision are checked atomically with the write. A revision that is not an
        ``int`` raises ``TypeError``, a negative one ``ValueError``, an empty execution
        pointer ``ValueError``. A broken connection raises ``StorageUnavailableError``.
        """
        ...

    async def load(self, thread_id: str) -> tuple[Snapshot[S], int]:
        """Return the head snapshot of ``thread_id`` and its revision;
        ``ThreadNotFoundError`` if none.

        A stored record that is corrupt or does not match its storage address raises
        ``SnapshotEnvelopeInvalidError``. O(1) in the history length.
        """
        ...

    async def get_history(self, thread_id: str, limit: int = 100) -> list[Snapshot[S]]:
        """Return up to ``limit`` stored snapshots of ``thread_id``, newest first (empty
        if none)."""
        ...

    async def prune(self, thread_id: str, retain: int) -> None:
        """Delete all but the newest ``retain`` history entries of ``thread_id`` only (the
        head always stays)."""
        ...

    async def delete(self, thread_id: str) -> None:
        """Delete the head and history of ``thread_id``. Deleting a missing thread is not an
        error. Fencing tokens of the thread never go back, deleted or not."""
        ...

    async def delete_if_idle(self, thread_id: str) -> None:
        """Like ``delete`` but raise ``ThreadLeaseBusyError`` while a live lease holds
        ``thread_id`` (an expired lease does not)."""
        ...

    async def list_threads(
        self,
        *,
        handoff_statuses: frozenset[HandoffStatus] | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> list[ThreadSummary]:
        """List up to ``limit`` thread heads ordered by thread id, optionally only those in
        ``handoff_statuses``; ``after`` continues a listing past that thread id."""
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
        """Save ``snapshot`` like ``save`` (``expected_revision`` and ``lease`` as there)
        and call ``enqueue`` as ``await enqueue(tx, new_revision)`` in the same
        transaction; if either fails nothing is committed. ``tx`` is the store's explicit
        transaction handle, passed to ``TransactionalOutbox.enqueue_intent_tx``.
        """
        ...


@runtime_checkable
class DurableCheckpointer(Checkpointer[S], Protocol[S]):
    """A checkpointer that also keeps what durable time needs, in the same store: the
    index of wake-up times, each thread's inbox of signals, and each thread's activity
    journal. A thread's delete removes its inbox and journal too, also of a thread that
    has no snapshot."""

    async def timers(self, *, before: float = ..., limit: int = 100) -> list[Timer]:
        """Up to ``limit`` heads with a wake-up time at or before ``before`` (default:
        all), soonest first (then by thread id), from an index: the wake-up time is
        saved with the head, in the same write."""
        ...

    async def append_signal(self, signal: Signal, *, taken: int = 0) -> Signal:
        """Store ``signal`` in its thread's inbox, numbered after the thread's earlier
        signals; a second signal with the same ``signal_id`` stores nothing and returns
        the first as stored. Numbers run 1, 2, 3, … per thread, never repeat while the
        thread exists, and number ``n + 1`` is never readable before ``n``. Past
        ``taken`` (the newest signal the thread took) the inbox holds at most
        ``limits.max_pending_signals``: another is a ``LimitError``, storing nothing."""
        ...

    async def signals(self, thread_id: str, *, after: int = 0, limit: int = 100) -> list[Signal]:
        """Up to ``limit`` signals of ``thread_id`` numbered above ``after``, in order."""
        ...

    async def put_activity(self, thread_id: str, record: ActivityRecord) -> None:
        """Store ``record`` as the journal entry ``record.key`` of ``thread_id``,
        replacing an earlier one."""
        ...

    async def get_activity(self, thread_id: str, key: str) -> ActivityRecord | None:
        """The journal entry ``key`` of ``thread_id``, or ``None``."""
        ...

    async def journal(self, thread_id: str) -> list[ActivityRecord]:
        """Every journal entry of ``thread_id``, oldest first."""
        ...


@runtime_checkable
class LeaseManager(Protocol):
    """Exclusive, expiring, fenced run leases on threads."""

    async def acquire(self, thread_id: str, owner: str, ttl: float) -> Lease:
        """Take ``thread_id`` for ``owner`` for ``ttl`` seconds.

        While a live lease exists every acquire fails with ``ThreadLeaseBusyError``, even
        by the same owner. An expired lease may be taken over. Each acquisition gets a
        fencing token greater than every earlier one for the thread, release and delete
        included. Owners compare exactly (case matters).
        """
        ...

    async def renew(self, lease: Lease, ttl: float) -> Lease:
        """Extend the live ``lease`` to now + ``ttl``; ``LeaseLostError`` if it is not
        current."""
        ...

    async def release(self, lease: Lease) -> None:
        """Give ``lease`` up; ``LeaseLostError`` if it expired or was taken over."""
        ...

    async def holder(self, thread_id: str) -> Lease | None:
        """The live lease on ``thread_id``, or ``None``. Never changes anything."""
        ...


@runtime_checkable
class Outbox(Protocol):
    """The outbox: where hand-off intents go for background workers (``backend.outbox``)."""

    async def enqueue_intent(self, intent: HandoffIntent) -> None:
        """Durably enqueue ``intent`` (at-least-once delivery to consumers). Enqueueing
        an intent already in the outbox keeps the one message as it is."""
        ...


@runtime_checkable
class TransactionalOutbox(Outbox, Protocol):
    """An outbox that can write inside a checkpointer's transaction."""

    async def enqueue_intent_tx(self, tx: object, intent: HandoffIntent) -> None:
        """Enqueue ``intent`` inside ``tx`` (the handle ``save_with_outbox`` passed)."""
        ...


@runtime_checkable
class OutboxConsumer(Protocol):
    """The consuming side of an outbox, used by ``flowy.Worker``."""

    @property
    def max_attempts(self) -> int:
        """Deliveries without an ack before a message is dead-lettered."""
        ...

    async def claim(
        self, limit: int, visibility_timeout: float, wait: float = 0.0
    ) -> list[OutboxMessage]:
        """Claim up to ``limit`` messages, hidden from other consumers for
        ``visibility_timeout`` seconds; wait up to ``wait`` seconds for one to arrive.
        A claim not acked in time is delivered again with ``attempts`` increased. A
        message whose payload does not decode is dead-lettered, never delivered, and
        never stops the others."""
        ...

    async def ack(self, message: OutboxMessage) -> None:
        """Remove the delivered ``message`` for good (and no other)."""
        ...

    async def release(
        self, message: OutboxMessage, *, error: str = "", delay: float = 0.0, dead: bool = False
    ) -> None:
        """Give the claimed ``message`` back for another delivery after ``delay`` seconds,
        recording ``error``; after ``max_attempts`` deliveries, or at once with ``dead``
        (a failure no delivery can cure), it moves to the dead letters instead."""
        ...

    async def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """List up to ``limit`` dead-lettered messages, undecodable ones included."""
        ...

    async def retry_dead_letter(self, message_id: str) -> None:
        """Move the dead-lettered message ``message_id`` back to the outbox with its
        attempts reset; ``KeyError`` if there is no dead letter with that id."""
        ...


@runtime_checkable
class FencingCheckpointer(Checkpointer[S], Protocol[S]):
    """A native checkpointer that checks the leases of a lease manager inside ``save``."""

    def fences(self, leases: LeaseManager) -> bool:
        """True if ``save`` checks the leases of ``leases`` atomically with the write
        (same coordination domain). The runner wraps other pairs in a lease guard."""
        ...


@runtime_checkable
class Backend(Protocol[S]):
    """One store: checkpointer, leases, outbox and consumer in one coordination domain.

    Open one with ``flowy.connect(url)``.
    """

    @property
    def url(self) -> str:
        """The URL the store was opened with (reprs and messages mask its password)."""
        ...

    @property
    def checkpointer(self) -> Checkpointer[S]:
        """Snapshots: strict optimistic concurrency, fenced by ``leases``."""
        ...

    @property
    def leases(self) -> LeaseManager:
        """Run leases with fencing tokens."""
        ...

    @property
    def outbox(self) -> Outbox:
        """Where hand-offs go (transactionally with ``checkpointer``)."""
        ...

    @property
    def consumer(self) -> OutboxConsumer:
        """What ``flowy.Worker`` claims hand-offs from."""
        ...

    @property
    def capabilities(self) -> Capabilities:
        """What the store can do, derived from the primitives it implements; the engine
        reads it once, when a runner is built, and the conformance suite skips exactly
        the classes of the capabilities it lacks."""
        ...

    async def setup(self) -> int:
        """Create or upgrade what the store needs; return its schema version.
        Idempotent."""
        ...

    async def aclose(self) -> None:
        """Release the store's connections (only those it opened). Idempotent."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...
