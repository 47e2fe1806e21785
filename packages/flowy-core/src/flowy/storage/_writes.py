"""What a store's atomic write is made of: the write the checkpointer base hands a store
(:class:`Write`), the outbox rows it carries (:class:`OutboxRow`, gathered through an
:class:`OutboxTransaction`), what a store answers when it refuses (:class:`Refused`,
:class:`Busy`), and the error a refusal means (the same type and message on every store).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

from .._errors import (
    ConcurrencyConflictError,
    FlowyError,
    LeaseLostError,
    ThreadLeaseBusyError,
)
from ._intents import encode_intent
from ._model import DEFAULT_ROUTE, HandoffIntent, Lease, Route, ThreadSummary

__all__ = [
    "Busy",
    "OutboxRow",
    "OutboxTransaction",
    "Refused",
    "Write",
    "refusal_error",
    "show_id",
]


def show_id(thread_id: str, limit: int = 80) -> str:
    """``thread_id`` for error messages: quoted, and shortened past ``limit`` characters."""
    if len(thread_id) <= limit:
        return repr(thread_id)
    return f"{thread_id[:limit]!r}… ({len(thread_id)} characters)"


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """One outbox message to write: unique per (``thread_id``, ``committed_revision``)."""

    thread_id: str
    """The thread handed off."""
    committed_revision: int
    """The revision its hand-off committed (the intent's ``committed_snapshot_revision``)."""
    payload: bytes
    """The encoded intent (``encode_intent``)."""
    route: Route = DEFAULT_ROUTE
    """The intent's queue, partition and priority (also inside ``payload``), for a store
    that keeps queues to index."""

    @classmethod
    def of(cls, intent: HandoffIntent) -> OutboxRow:
        """The row of ``intent`` (its payload is ``encode_intent(intent)``)."""
        return cls(
            intent.thread_id,
            intent.committed_snapshot_revision,
            encode_intent(intent),
            intent.route,
        )


@dataclass(frozen=True, slots=True)
class Write:
    """One conditional write, as the base hands it to ``BaseCheckpointer._write``.

    Write ``record`` as revision ``expected_revision + 1`` of ``summary.thread_id`` —
    head and history — together with every row of ``outbox`` (one per thread and
    committed revision), in ONE atomic operation,
    and only if (a) the thread's head is at ``expected_revision`` (0: the thread does not
    exist) and (b) with ``lease``, that lease (owner and fencing token) is the thread's
    live lease; without, no live lease holds the thread. ``summary`` carries the head's
    columns (for listing without decoding records). ``native`` holds the application's
    own actions (checked by ``BaseCheckpointer._native_action``), written in the same
    atomic operation. With ``release`` (only given to ``BaseCheckpointer._write_release``,
    always with a ``lease``), the same atomic operation also gives that lease up once
    written; a refused write leaves it held. With ``ack`` (only given to
    ``BaseCheckpointer._write_ack``, always with ``release``), the same atomic operation
    also acknowledges the outbox message of that id, as ``BaseConsumer._ack`` does (a
    message already gone is no refusal).
    """

    expected_revision: int
    record: bytes
    summary: ThreadSummary
    lease: Lease | None
    outbox: tuple[OutboxRow, ...] = ()
    native: tuple[object, ...] = ()
    release: bool = False
    ack: str | None = None

    @property
    def thread_id(self) -> str:
        """The thread written."""
        return self.summary.thread_id

    @property
    def revision(self) -> int:
        """The revision the write creates."""
        return self.expected_revision + 1


@dataclass(frozen=True, slots=True)
class Refused:
    """Why a conditional write wrote nothing: what the store saw when it refused.

    ``actual_revision`` is the head's revision (0 if the thread does not exist);
    ``holder`` the thread's live lease, if any.
    """

    actual_revision: int
    holder: Lease | None = None


@dataclass(frozen=True, slots=True)
class Busy:
    """What ``BaseLeaseManager._acquire`` returns when a live lease holds the thread."""

    holder: Lease
    """That live lease."""


@dataclass(eq=False)
class OutboxTransaction:
    """The transaction handle ``save_with_outbox`` passes to its enqueue callback.

    ``enqueue_intent_tx(tx, intent)`` of an outbox of the same store adds a row to it,
    and the checkpointer's ``add_action(tx, action)`` an action of the application in
    the store's own terms (where the store takes them); the checkpointer writes both in
    the same atomic operation as the snapshot, at ``revision``. The handle is usable
    only inside the callback.
    """

    domain: Hashable
    """The store's coordination domain; only its outboxes may add rows."""
    thread_id: str
    """The thread being saved."""
    revision: int
    """The revision the save creates."""
    rows: list[OutboxRow] = field(default_factory=lambda: [])
    """The rows added so far."""
    native: list[object] = field(default_factory=lambda: [])
    """The application's actions added so far (``add_native``)."""
    open: bool = True
    """False once the enqueue callback returned: nothing more can be added."""

    def add(self, domain: Hashable, row: OutboxRow) -> None:
        """Add ``row`` from an outbox of ``domain``; a row of a (thread, committed
        revision) added already is ignored, as the outbox keeps a live message as it is.

        Raises ``ValueError`` if ``domain`` is not this transaction's store, and
        ``RuntimeError`` once the callback has returned.
        """
        self._check(domain)
        key = (row.thread_id, row.committed_revision)
        if all((r.thread_id, r.committed_revision) != key for r in self.rows):
            self.rows.append(row)

    def add_native(self, domain: Hashable, action: object) -> None:
        """Add ``action``, an action of the application checked by a checkpointer of
        ``domain`` (the native hook: ``BaseCheckpointer.add_action``); raises as
        :meth:`add`."""
        self._check(domain)
        self.native.append(action)

    def _check(self, domain: Hashable) -> None:
        if not self.open:
            raise RuntimeError(
                "the save_with_outbox transaction is over; add to it through its handle "
                "only inside the enqueue callback, before it returns"
            )
        if domain != self.domain:
            raise ValueError(
                "the outbox and the checkpointer are not in one store, so their writes "
                "cannot commit together; use the .outbox and .checkpointer of one Backend"
            )


def refusal_error(write: Write, refused: Refused, *, final: bool) -> FlowyError | None:
    """The error ``refused`` explains, checking the lease first as stores fence first."""
    thread = show_id(write.thread_id)
    holder = refused.holder
    lease = write.lease
    if lease is not None:
        if (
            holder is None
            or holder.owner != lease.owner
            or holder.fencing_token != lease.fencing_token
        ):
            now = (
                f"held by {holder.owner!r} (fencing token {holder.fencing_token})"
                if holder is not None
                else "free"
            )
            return LeaseLostError(
                f"save refused: lease {lease.fencing_token} of {lease.owner!r} on thread "
                f"{thread} is no longer live (fenced; the thread is {now}); stop this "
                "run, it lost the thread"
            )
    elif holder is not None:
        return ThreadLeaseBusyError(
            f"thread {thread} is leased by {holder.owner!r} (fencing token "
            f"{holder.fencing_token}); save with its lease, or wait for it to end"
        )
    if refused.actual_revision != write.expected_revision or final:
        return ConcurrencyConflictError(
            f"thread {thread} is at revision {refused.actual_revision}, not "
            f"{write.expected_revision}; reload it and decide again",
            thread_id=write.thread_id,
            expected=write.expected_revision,
            actual=refused.actual_revision,
        )
    return None
