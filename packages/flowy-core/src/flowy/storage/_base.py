"""The base of a checkpointer: everything but the atomic primitives.

A store subclasses :class:`BaseCheckpointer` and implements the ``_``-prefixed abstract
methods; the base owns argument checks, the record envelope, the translation of a
refused write into the right error (``_writes``), summaries, the codec and the checks of
what a store reports about its backlog (``oldest_heads``). The values of a write are in
``_writes``, the lease manager's base in ``_leases``. ``docs/adapters.md`` walks through
writing a store.
"""

from __future__ import annotations

import abc
import copy
import math
from collections.abc import Hashable, Iterable
from dataclasses import replace
from typing import Any, Generic

from .._errors import (
    LeaseLostError,
    LimitError,
    SnapshotEnvelopeInvalidError,
    SnapshotTooLargeError,
    StorageError,
    ThreadLeaseBusyError,
    ThreadNotFoundError,
)
from .._types import S
from ._checks import check_count, check_lease, check_owner, check_revision, check_seconds
from ._codecs import StateCodec
from ._durable import (
    ActivityRecord,
    Signal,
    Timer,
    check_key,
    decode_activity,
    decode_signal,
    encode_activity,
    encode_signal,
)
from ._leases import BaseLeaseManager, busy_error
from ._limits import MAX_TIMESTAMP, Limits, check_time
from ._model import (
    HandoffStatus,
    Lease,
    OutboxMessage,
    RunStatus,
    Snapshot,
    ThreadSummary,
    validate_thread_id,
)
from ._protocols import EnqueueCallback, LeaseManager
from ._recent import RecentCursor, check_cursor, scan_recent
from ._records import decode_snapshot, encode_snapshot
from ._writes import Busy, OutboxTransaction, Refused, Write, refusal_error, show_id

__all__ = ["BACKLOG_STATUSES", "BaseCheckpointer"]


BACKLOG_STATUSES: frozenset[RunStatus] = frozenset({RunStatus.SUSPENDED, RunStatus.WAITING})
"""The run statuses ``BaseCheckpointer.oldest_heads`` reads: runs parked until something
outside moves them on (an answer, a signal, a timer)."""

_SCAN_PAGE = 500
"""Heads per ``_list_heads`` call of the default ``_oldest_heads`` scan."""


def _text(column: object) -> str:
    """A stored column as text (bytes are UTF-8)."""
    return column.decode("utf-8", "replace") if isinstance(column, bytes) else str(column)


def _optional_time(name: str, column: object) -> float | None:
    """A stored time that may be absent: ``None`` or empty text for none."""
    if column is None or column in ("", b""):
        return None
    return check_time(name, float(_text(column)))


class BaseCheckpointer(abc.ABC, Generic[S]):
    """A strict-OCC, fencing, transactional checkpointer over five primitives.

    Subclasses set ``domain`` (equal for every component of one store, so the runner
    knows this checkpointer fences that store's leases) and may set
    ``max_record_bytes``. ``codec`` encodes states (JSON when ``None``; the runner gives
    a typed graph's state type); ``limits`` are the limits of what it stores
    (``Limits()`` when ``None``).
    """

    domain: Hashable = None
    max_record_bytes: int | None = None
    limits: Limits = Limits()

    def __init__(self, *, codec: StateCodec[S] | None = None, limits: Limits | None = None) -> None:
        self.codec: StateCodec[S] | None = codec
        if limits is not None:
            if not isinstance(limits, Limits):  # pyright: ignore[reportUnnecessaryIsInstance]
                raise TypeError(f"limits must be a flowy.storage.Limits, got {limits!r:.80}")
            self.limits = limits

    # -- the primitives a store implements ---------------------------------------------
    @abc.abstractmethod
    async def _write(self, write: Write) -> Refused | None:
        """Perform ``write`` atomically (see :class:`Write`); ``None`` once written.

        When the revision or lease condition fails, write nothing and return what was
        seen (:class:`Refused`), from the same atomic operation where the store can.
        A lost connection raises ``StorageUnavailableError`` (outcome unknown).
        """

    @abc.abstractmethod
    async def _read_head(self, thread_id: str) -> tuple[int, bytes] | None:
        """The head's revision and record bytes, or ``None``; one read, O(1) in history."""

    @abc.abstractmethod
    async def _read_history(self, thread_id: str, limit: int) -> list[tuple[int, bytes]]:
        """Up to ``limit`` (> 0) history entries ``(revision, record)``, newest first."""

    @abc.abstractmethod
    async def _prune(self, thread_id: str, keep: int) -> None:
        """Delete this thread's history entries but the newest ``keep`` (>= 1) and the head."""

    @abc.abstractmethod
    async def _delete(self, thread_id: str, *, if_idle: bool) -> Lease | None:
        """Delete the thread's head and history, its inbox of signals (their numbering
        starts again) and its activity journal, never its fencing token counter.

        With ``if_idle``, atomically refuse while a live lease holds the thread: write
        nothing and return that lease. Return ``None`` once deleted (or absent).
        """

    @abc.abstractmethod
    async def _list_heads(
        self, statuses: frozenset[HandoffStatus] | None, limit: int, after: str | None
    ) -> list[ThreadSummary]:
        """Up to ``limit`` (> 0) heads ordered by thread id, past ``after`` if given,
        only those whose hand-off status is in ``statuses`` if given (non-empty). Build
        each with :meth:`summary`; read columns, not records."""

    # -- fewer round trips (optional) ------------------------------------------------------
    # A store that can do these in one round trip implements them; without, the engine
    # composes them of the primitives above and the lease manager's (one more each).
    async def _write_release(self, write: Write) -> Refused | None:
        """Perform ``write`` as :meth:`_write` does and, in the same atomic operation,
        give its lease (``write.lease``, never ``None`` here; ``write.release`` is set)
        up, keeping the thread's fencing token counter. A refused write writes nothing
        and leaves the lease as it is. The engine uses it for the save that ends a
        leased segment, instead of a save and a separate release."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot release a lease in its save (_write_release); "
            "release it through the lease manager"
        )

    async def _write_ack(self, write: Write) -> Refused | None:
        """Perform ``write`` as :meth:`_write_release` does and, in the same atomic
        operation, acknowledge the outbox message ``write.ack`` of this store as
        ``BaseConsumer._ack`` does (a message already gone is fine); a refused write
        acknowledges nothing. The engine uses it for the save that ends a segment a
        ``Worker`` resumed for that message, instead of a save and a separate ack."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot acknowledge a message in its save (_write_ack); "
            "acknowledge it through the consumer"
        )

    async def _acquire_head(
        self, thread_id: str, owner: str, ttl: float
    ) -> tuple[Lease | Busy, tuple[int, bytes] | None]:
        """Take the thread's lease as ``BaseLeaseManager._acquire`` of this store does
        (same fencing tokens, same :class:`Busy`) and read its head as :meth:`_read_head`
        does, in one round trip; the head is read after the lease is taken, so no save
        of another owner can land between them, and a save that committed before the
        lease was taken (the last save of the holder before, which may have released
        the lease in the same write) is the head read. The engine uses it to start or
        resume a leased segment, instead of an acquisition and a separate read."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot take a lease and read the head in one round "
            "trip (_acquire_head); acquire through the lease manager, then load"
        )

    # -- timers, signals and the activity journal (durable time) -------------------------
    # Every store of flowy-core and its adapters implements these; a store written for
    # flowy 0.2.0 that does not still runs graphs that never sleep, wait or call
    # activities, and says what is missing when one does.
    async def _timers(self, before: float, limit: int) -> list[Timer]:
        """Up to ``limit`` (> 0) heads whose ``summary.wake_at`` is set and <= ``before``
        (0 <= ``before`` <= ``MAX_TIMESTAMP``, the range of every stored time),
        ordered by wake-up time, then thread id: read from an index of wake-up times
        (the head's ``wake_at`` column, written by ``_write`` in the same atomic write),
        never a scan of every thread."""
        raise self._missing("_timers", "timers")

    async def _append_signal(
        self, thread_id: str, signal_id: str, data: bytes, max_seq: int
    ) -> tuple[int, bool] | None:
        """Atomically add ``data`` to the thread's inbox as its next signal, unless one
        with ``signal_id`` is there already, or the next number would be above
        ``max_seq`` (the inbox is full).

        Signals of a thread are numbered 1, 2, 3, … in the order they are stored; a
        number is never reused while the thread exists, and signal ``n + 1`` is never
        readable before signal ``n``. Returns ``(seq, True)`` once added, the existing
        signal's ``(seq, False)`` (even when full), or ``None`` when full; the last two
        write nothing.
        """
        raise self._missing("_append_signal", "signals")

    async def _read_signals(
        self, thread_id: str, after: int, limit: int
    ) -> list[tuple[int, bytes]]:
        """Up to ``limit`` (> 0) signals ``(seq, data)`` of the thread numbered above
        ``after``, in order."""
        raise self._missing("_read_signals", "signals")

    async def _put_activity(self, thread_id: str, key: str, data: bytes) -> None:
        """Store ``data`` as the thread's journal entry ``key`` (replacing it)."""
        raise self._missing("_put_activity", "activity journal")

    async def _get_activity(self, thread_id: str, key: str) -> bytes | None:
        """The thread's journal entry ``key``, or ``None``."""
        raise self._missing("_get_activity", "activity journal")

    async def _list_activities(self, thread_id: str) -> list[bytes]:
        """Every journal entry of the thread, in any order."""
        raise self._missing("_list_activities", "activity journal")

    async def _oldest_heads(self, statuses: frozenset[RunStatus]) -> dict[RunStatus, float]:
        """For each status of ``statuses`` (a non-empty subset of
        :data:`BACKLOG_STATUSES`) that some head has, the smallest ``updated_at`` of the
        heads in it; a status no head has is left out.

        Stores answer from an index of the heads in those statuses where they have one
        (one query grouped by status). This default scans every head through
        :meth:`_list_heads`, page by page: O(threads) per call.
        """
        oldest: dict[RunStatus, float] = {}
        after: str | None = None
        while True:
            page = await self._list_heads(None, _SCAN_PAGE, after)
            for head in page:
                if head.status in statuses and head.updated_at < oldest.get(head.status, math.inf):
                    oldest[head.status] = head.updated_at
            if len(page) < _SCAN_PAGE:
                return oldest
            after = page[-1].thread_id

    async def _recent_heads(self, limit: int, before: RecentCursor | None) -> list[ThreadSummary]:
        """Up to ``limit`` (> 0) heads in recency order: by ``(second, thread_id)``
        descending, where ``second`` is ``floor(updated_at)`` and thread ids compare in
        code point order, only those below ``before`` if given. Build each with
        :meth:`summary`.

        Stores answer from an index of each head's second, written by ``_write`` in the
        same atomic write only when the save's second differs from the one stored
        (``Capabilities.recent_index``). This default reads every head through
        :meth:`_list_heads` and sorts them: O(threads) per call.
        """
        return await scan_recent(
            lambda limit, after: self._list_heads(None, limit, after), limit, before
        )

    def _native_action(self, action: object) -> object:
        """``action`` as :meth:`_write` will find it in ``Write.native``, once checked
        (``ValueError`` for one the store cannot write). A store whose atomic write can
        carry the application's own actions implements it; by default it takes none."""
        raise NotImplementedError(
            f"{type(self).__name__} takes no actions of the application into its saves; "
            "write them in a transaction of your own"
        )

    def _missing(self, primitive: str, what: str) -> NotImplementedError:
        return NotImplementedError(
            f"{type(self).__name__} keeps no {what}: its store does not implement "
            f"{primitive} (docs/adapters.md), so graphs on it cannot sleep, wait for "
            "signals or call activities"
        )

    async def _diagnose(self, write: Write) -> Refused:
        """A fresh look at the thread when a refusal explained nothing (its report was
        not read atomically with the condition, and a racing save committed meanwhile).
        The default re-reads the head and reports a conflict at its revision."""
        head = await self._read_head(write.thread_id)
        return Refused(0 if head is None else head[0], write.lease)

    # -- shared helpers ------------------------------------------------------------------
    @staticmethod
    def summary(
        thread_id: str,
        revision: object,
        execution_pointer: object,
        status: object,
        reason: object,
        handoff_status: object,
        handoff_pending_at: object,
        updated_at: object,
        wake_at: object = None,
        graph_version: object = "",
    ) -> ThreadSummary:
        """A :class:`ThreadSummary` from raw stored columns (values, their text, or their
        UTF-8 bytes); an unknown status or a time outside 0 .. ``MAX_TIMESTAMP`` raises
        ``SnapshotEnvelopeInvalidError``.

        Args:
            thread_id: the thread.
            revision: the head revision (an integer, or its text).
            execution_pointer: the head's execution pointer.
            status: a ``RunStatus`` value.
            reason: the head's reason.
            handoff_status: a ``HandoffStatus`` value.
            handoff_pending_at: seconds since the epoch (a number or its text), or
                ``None`` (or empty text).
            updated_at: seconds since the epoch (a number or its text).
            wake_at: the head's wake-up time (a number or its text), or ``None`` (or
                empty text).
            graph_version: the version of the graph that saved the head (``None`` or
                ``""``: none).
        """
        try:
            return ThreadSummary(
                thread_id=thread_id,
                revision=int(_text(revision)),
                execution_pointer=_text(execution_pointer),
                status=RunStatus(_text(status)),
                reason=_text(reason),
                handoff_status=HandoffStatus(_text(handoff_status)),
                handoff_pending_at=_optional_time("handoff_pending_at", handoff_pending_at),
                updated_at=check_time("updated_at", float(_text(updated_at))),
                wake_at=_optional_time("wake_at", wake_at),
                graph_version=_text(graph_version or ""),
            )
        except ValueError as exc:  # LimitError too: a time out of the stored range
            raise SnapshotEnvelopeInvalidError(
                f"the head columns of thread {show_id(thread_id)} are invalid: {exc}"
            ) from exc

    def fences(self, leases: LeaseManager) -> bool:
        """True if ``leases`` is the lease manager of the same store (``domain``): saves
        check its leases atomically with the write."""
        return (
            self.domain is not None
            and isinstance(leases, BaseLeaseManager)
            and leases.domain == self.domain
        )

    def with_codec(self, codec: StateCodec[Any]) -> BaseCheckpointer[Any]:
        """A view of this checkpointer (same store, same connections) using ``codec``."""
        view = copy.copy(self)
        view.codec = codec
        return view

    def _prepare(self, expected_revision: int, snapshot: Snapshot[S], lease: Lease | None) -> Write:
        if not isinstance(snapshot, Snapshot):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"expected a flowy.storage.Snapshot, got {type(snapshot).__name__}")
        thread_id = validate_thread_id(snapshot.thread_id)
        check_revision(expected_revision)
        pointer = snapshot.execution_pointer
        if not isinstance(pointer, str) or not pointer:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(
                f"the snapshot of thread {show_id(thread_id)} has an empty execution "
                "pointer; a stored head must name the node to resume at"
            )
        if lease is not None:
            check_lease(lease, thread_id=thread_id)
            if lease.thread_id != thread_id:
                raise LeaseLostError(
                    f"save refused: the lease given is for thread {show_id(lease.thread_id)}"
                    f", not {show_id(thread_id)}"
                )
        revision = expected_revision + 1
        # The envelope checks the times and the statuses (enum members) as it encodes.
        record = encode_snapshot(snapshot, revision, self.codec)
        limit = self.max_record_bytes
        if limit is not None and len(record) > limit:
            raise SnapshotTooLargeError(
                f"the record of thread {show_id(thread_id)} is {len(record)} bytes; "
                f"{type(self).__name__} stores at most {limit}. Keep large data outside "
                "the state (store a reference)",
                size=len(record),
                limit=limit,
            )
        summary = ThreadSummary(
            thread_id=thread_id,
            revision=revision,
            execution_pointer=pointer,
            status=snapshot.status,
            reason=snapshot.reason,
            handoff_status=snapshot.handoff_status,
            handoff_pending_at=snapshot.handoff_pending_at,
            updated_at=snapshot.updated_at,
            wake_at=snapshot.wake_at,
            graph_version=snapshot.graph_version,
        )
        return Write(expected_revision, record, summary, lease)

    async def _commit(self, write: Write) -> int:
        if write.ack is not None:
            refused = await self._write_ack(write)
        elif write.release:
            refused = await self._write_release(write)
        else:
            refused = await self._write(write)
        if refused is None:
            return write.revision
        error = refusal_error(write, refused, final=False)
        if error is None:
            error = refusal_error(write, await self._diagnose(write), final=True)
        assert error is not None
        raise error

    # -- the protocol ----------------------------------------------------------------------
    async def save(
        self, expected_revision: int, snapshot: Snapshot[S], *, lease: Lease | None = None
    ) -> int:
        """Store ``snapshot`` at ``expected_revision + 1`` if the head is at
        ``expected_revision``, fenced by ``lease`` (``Checkpointer.save``)."""
        return await self._commit(self._prepare(expected_revision, snapshot, lease))

    async def save_and_release(
        self,
        expected_revision: int,
        snapshot: Snapshot[S],
        *,
        lease: Lease,
        ack: OutboxMessage | None = None,
    ) -> int:
        """Store ``snapshot`` if the head is at ``expected_revision``, fenced by
        ``lease``, in an atomic write that also gives ``lease`` up (``_write_release``;
        ``Capabilities.release_on_save`` says the store can) and, with ``ack``,
        acknowledges that claimed message of this store's outbox (``_write_ack``;
        ``Capabilities.ack_on_save``). A refused save leaves the lease held and the
        message claimed. The engine's last save of a leased segment."""
        write = self._prepare(expected_revision, snapshot, lease)
        return await self._commit(
            replace(write, release=True, ack=None if ack is None else ack.message_id)
        )

    async def save_with_outbox(
        self,
        expected_revision: int,
        snapshot: Snapshot[S],
        enqueue: EnqueueCallback,
        *,
        lease: Lease | None = None,
    ) -> int:
        """Save ``snapshot`` like :meth:`save` (``expected_revision`` and ``lease`` as
        there) and commit what ``enqueue`` added through ``tx`` (an
        :class:`OutboxTransaction`) when called as ``await enqueue(tx, new_revision)``,
        in the same atomic write; if either fails, nothing is written."""
        write = self._prepare(expected_revision, snapshot, lease)
        tx = OutboxTransaction(self.domain, write.thread_id, write.revision)
        try:
            await enqueue(tx, write.revision)
        finally:
            tx.open = False
        rows, native = tuple(tx.rows), tuple(tx.native)
        return await self._commit(
            Write(write.expected_revision, write.record, write.summary, lease, rows, native)
        )

    def add_action(self, tx: object, action: object) -> None:
        """In the enqueue callback of :meth:`save_with_outbox`, add an action of the
        application, in the store's own terms, to the save's atomic write: it commits
        with the snapshot and the hand-off, or nothing does.

        Raises:
            RuntimeError: ``tx`` is not the handle the callback was given, or the
                callback has returned.
            ValueError: ``tx`` belongs to another store, or the store cannot write
                ``action``.
            NotImplementedError: this store takes no actions of the application
                (PostgreSQL joins the application's transaction through ``bind``).
        """
        if not isinstance(tx, OutboxTransaction):
            raise RuntimeError(
                "add_action works only inside the enqueue callback of save_with_outbox, "
                f"with the handle it is given (got {type(tx).__name__})"
            )
        tx.add_native(self.domain, self._native_action(action))

    async def load(self, thread_id: str) -> tuple[Snapshot[S], int]:
        """The head snapshot of ``thread_id`` and its revision; ``ThreadNotFoundError`` if
        none."""
        validate_thread_id(thread_id)
        head = await self._read_head(thread_id)
        if head is None:
            raise ThreadNotFoundError(f"no checkpoint for thread {show_id(thread_id)}")
        revision, record = head
        snapshot: Snapshot[S] = decode_snapshot(
            record, self.codec, thread_id=thread_id, revision=revision
        )
        return snapshot, revision

    async def acquire_and_load(
        self, thread_id: str, owner: str, ttl: float
    ) -> tuple[Lease, tuple[Snapshot[S], int] | None]:
        """Take ``thread_id`` for ``owner`` for ``ttl`` seconds (``LeaseManager.acquire``
        of this store) and load its head (:meth:`load`; ``None`` when there is none) in
        one round trip (``_acquire_head``; ``Capabilities.acquire_with_load`` says the
        store can). ``ThreadLeaseBusyError`` when a live lease holds the thread."""
        validate_thread_id(thread_id)
        check_owner(owner)
        seconds = check_seconds(ttl, "lease ttl")
        got, head = await self._acquire_head(thread_id, owner, seconds)
        if isinstance(got, Busy):
            raise busy_error(thread_id, got.holder)
        if head is None:
            return got, None
        revision, record = head
        snapshot: Snapshot[S] = decode_snapshot(
            record, self.codec, thread_id=thread_id, revision=revision
        )
        return got, (snapshot, revision)

    async def get_history(self, thread_id: str, limit: int = 100) -> list[Snapshot[S]]:
        """Up to ``limit`` stored snapshots of ``thread_id``, newest first."""
        validate_thread_id(thread_id)
        if check_count(limit, "limit") == 0:
            return []
        return [
            decode_snapshot(record, self.codec, thread_id=thread_id, revision=revision)
            for revision, record in await self._read_history(thread_id, limit)
        ]

    async def prune(self, thread_id: str, retain: int) -> None:
        """Keep only the newest ``retain`` history entries of ``thread_id`` (at least the
        head)."""
        validate_thread_id(thread_id)
        await self._prune(thread_id, max(check_count(retain, "retain"), 1))

    async def delete(self, thread_id: str) -> None:
        """Delete the head and history of ``thread_id`` (a missing thread is fine)."""
        validate_thread_id(thread_id)
        await self._delete(thread_id, if_idle=False)

    async def delete_if_idle(self, thread_id: str) -> None:
        """Delete ``thread_id`` unless a live lease holds it (``ThreadLeaseBusyError``)."""
        validate_thread_id(thread_id)
        holder = await self._delete(thread_id, if_idle=True)
        if holder is not None:
            raise ThreadLeaseBusyError(
                f"thread {show_id(thread_id)} is leased by {holder.owner!r} (fencing token "
                f"{holder.fencing_token}); not deleting it while its run may be alive"
            )

    async def list_threads(
        self,
        *,
        handoff_statuses: frozenset[HandoffStatus] | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> list[ThreadSummary]:
        """Up to ``limit`` thread heads ordered by thread id, past ``after`` if given, only
        those in ``handoff_statuses`` if given (``Checkpointer.list_threads``)."""
        if check_count(limit, "limit") == 0:
            return []
        statuses: frozenset[HandoffStatus] | None = None
        if handoff_statuses is not None:
            statuses = frozenset(HandoffStatus(s) for s in handoff_statuses)
            if not statuses:
                return []
        if after is not None:
            validate_thread_id(after)
        return await self._list_heads(statuses, limit, after)

    async def recent_threads(
        self, *, limit: int = 100, before: RecentCursor | None = None
    ) -> list[ThreadSummary]:
        """Up to ``limit`` thread heads, most recently saved first, to the second: by
        save second (``floor(updated_at)``) descending, then by thread id descending
        (code point order).

        Args:
            limit: the most heads returned (0: none).
            before: the cursor of the page before: the ``(second, thread_id)`` of its
                last row (``flowy.storage.recent_key``); only heads below it
                are returned, so paging returns each thread once while none is saved.

        Raises:
            TypeError: ``limit`` is not an int, or ``before`` not ``(int, str)``.
            ValueError: ``limit`` is negative, or the second of ``before`` outside the
                stored range of times.
            InvalidThreadIdError: the thread id of ``before`` is not a usable one.
        """
        if check_count(limit, "limit") == 0:
            check_cursor(before)
            return []
        return await self._recent_heads(limit, check_cursor(before))

    async def timers(self, *, before: float = math.inf, limit: int = 100) -> list[Timer]:
        """Up to ``limit`` waiting heads due at or before ``before`` (default: every
        timer), soonest first."""
        if check_count(limit, "limit") == 0:
            return []
        if isinstance(before, bool) or not isinstance(before, int | float) or math.isnan(before):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"before must be seconds since the epoch, got {before!r:.80}")
        if before < 0:
            return []  # every stored wake-up time is within 0 .. MAX_TIMESTAMP
        return await self._timers(min(max(0.0, float(before)), MAX_TIMESTAMP), limit)

    async def oldest_heads(
        self, statuses: Iterable[RunStatus] | None = None
    ) -> dict[RunStatus, float]:
        """When the oldest head in each of ``statuses`` was saved (its ``updated_at``, in
        seconds since the epoch): how long the longest-parked run has waited. A status
        no thread is in is left out of the answer.

        Args:
            statuses: some of ``RunStatus.SUSPENDED`` and ``RunStatus.WAITING``, the
                statuses stores index for this read (``None``: both,
                :data:`BACKLOG_STATUSES`).

        Raises:
            TypeError: one status instead of an iterable of them.
            ValueError: a status other than suspended or waiting.
            StorageError: the store answered for a status not asked for, or with a time
                that is not a finite number.
        """
        if isinstance(statuses, str):
            raise TypeError(
                f"statuses must be an iterable of run statuses, got the single status "
                f"{statuses!r}; pass [{statuses!r}]"
            )
        wanted = BACKLOG_STATUSES if statuses is None else frozenset(map(RunStatus, statuses))
        if not wanted <= BACKLOG_STATUSES:
            other = ", ".join(repr(s.value) for s in sorted(wanted - BACKLOG_STATUSES))
            raise ValueError(
                f"oldest_heads reads suspended and waiting heads only (the statuses stores "
                f"index for it), got {other}; ask for RunStatus.SUSPENDED or RunStatus.WAITING"
            )
        if not wanted:
            return {}
        oldest = await self._oldest_heads(wanted)
        for status, at in oldest.items():
            if status not in wanted or not math.isfinite(at):
                raise StorageError(
                    f"{type(self).__name__}._oldest_heads answered {status!r}: {at!r} when "
                    f"asked for {sorted(s.value for s in wanted)}"
                )
        return {status: oldest[status] for status in sorted(oldest)}

    async def append_signal(self, signal: Signal, *, taken: int = 0) -> Signal:
        """Store ``signal`` in its thread's inbox, once per ``signal_id``: the signal as
        stored (with its ``seq``), the first one's when the id was sent before.

        ``taken`` is the number of the newest signal the thread has taken (its highest
        signal cursor): past it, the inbox holds at most ``limits.max_pending_signals``
        signals, and another one is a :class:`flowy.errors.LimitError` (nothing stored).
        """
        thread_id = validate_thread_id(signal.thread_id)
        check_key(signal.name, "signal name")
        check_key(signal.signal_id, "signal id")
        check_revision(taken, "taken")
        limits = self.limits
        data = encode_signal(signal, limits.max_signal_bytes)
        max_seq = taken + limits.max_pending_signals
        appended = await self._append_signal(thread_id, signal.signal_id, data, max_seq)
        if appended is None:
            raise LimitError(
                f"the inbox of thread {show_id(thread_id)} is full: it holds "
                f"{limits.max_pending_signals} signals the thread has not taken "
                f"(Limits.max_pending_signals); signal {signal.name!r:.80} was not stored"
            )
        seq, added = appended
        if added:
            return Signal(
                thread_id, signal.name, signal.payload, signal.signal_id, seq, signal.sent_at
            )
        stored = await self._read_signals(thread_id, seq - 1, 1)
        if not stored or stored[0][0] != seq:
            raise SnapshotEnvelopeInvalidError(
                f"signal {seq} of thread {show_id(thread_id)} is missing from its inbox"
            )
        return decode_signal(thread_id, seq, stored[0][1])

    async def signals(self, thread_id: str, *, after: int = 0, limit: int = 100) -> list[Signal]:
        """Up to ``limit`` signals of ``thread_id`` numbered above ``after``, in order."""
        validate_thread_id(thread_id)
        check_revision(after, "after")
        if check_count(limit, "limit") == 0:
            return []
        return [
            decode_signal(thread_id, seq, data)
            for seq, data in await self._read_signals(thread_id, after, limit)
        ]

    async def put_activity(self, thread_id: str, record: ActivityRecord) -> None:
        """Store ``record`` as the journal entry of ``thread_id`` under ``record.key``."""
        validate_thread_id(thread_id)
        check_key(record.key, "activity key")
        data = encode_activity(record, self.limits.max_activity_bytes)
        await self._put_activity(thread_id, record.key, data)

    async def get_activity(self, thread_id: str, key: str) -> ActivityRecord | None:
        """The journal entry ``key`` of ``thread_id``, or ``None``."""
        validate_thread_id(thread_id)
        check_key(key, "activity key")
        data = await self._get_activity(thread_id, key)
        return None if data is None else decode_activity(data, key=key)

    async def journal(self, thread_id: str) -> list[ActivityRecord]:
        """Every journal entry of ``thread_id``, oldest first."""
        validate_thread_id(thread_id)
        records = [decode_activity(data) for data in await self._list_activities(thread_id)]
        return sorted(records, key=lambda r: (r.started_at, r.key))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(codec={self.codec!r})"
