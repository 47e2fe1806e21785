"""In-memory reference backends: checkpointer, lease manager and outbox/consumer.

They implement every storage contract exactly (the conformance suite runs against them)
and store encoded records, so corruption and codec rules hold as in durable backends.
They live in one process and lose everything when it exits: for development and tests.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Generic

from ._checkpoint import (
    EnqueueCallback,
    HandoffIntent,
    HandoffStatus,
    Lease,
    LeaseManager,
    OutboxMessage,
    Snapshot,
    ThreadSummary,
    validate_thread_id,
)
from ._codecs import StateCodec
from ._errors import (
    ConcurrencyConflictError,
    LeaseLostError,
    ThreadLeaseBusyError,
    ThreadNotFoundError,
)
from ._records import decode_snapshot, encode_snapshot
from ._types import S

__all__ = ["MemoryCheckpointer", "MemoryLeaseManager", "MemoryOutbox"]

Clock = Callable[[], float]


class MemoryLeaseManager:
    """In-process lease manager. For development and tests only: leases live in this
    process's memory and protect nothing across processes."""

    def __init__(self, *, clock: Clock = time.time) -> None:
        self._clock = clock
        self._leases: dict[str, Lease] = {}
        self._tokens: dict[str, int] = {}

    def _live(self, thread_id: str) -> Lease | None:
        lease = self._leases.get(thread_id)
        if lease is not None and lease.expires_at > self._clock():
            return lease
        return None

    async def acquire(self, thread_id: str, owner: str, ttl: float) -> Lease:
        validate_thread_id(thread_id)
        if ttl <= 0:
            raise ValueError(f"lease ttl must be positive, got {ttl!r}")
        live = self._live(thread_id)
        if live is not None:
            raise ThreadLeaseBusyError(
                f"thread {thread_id!r} is leased by {live.owner!r} (token {live.token}) "
                f"for {live.expires_at - self._clock():.1f}s more"
            )
        token = self._tokens.get(thread_id, 0) + 1
        self._tokens[thread_id] = token
        lease = Lease(thread_id, owner, token, self._clock() + ttl)
        self._leases[thread_id] = lease
        return lease

    def _check_current(self, lease: Lease, action: str) -> None:
        live = self._live(lease.thread_id)
        if live is None or live.token != lease.token or live.owner != lease.owner:
            raise LeaseLostError(
                f"cannot {action} lease {lease.token} of {lease.owner!r} on thread "
                f"{lease.thread_id!r}: it expired or was taken over"
            )

    async def renew(self, lease: Lease, ttl: float) -> Lease:
        self._check_current(lease, "renew")
        renewed = replace(lease, expires_at=self._clock() + ttl)
        self._leases[lease.thread_id] = renewed
        return renewed

    async def release(self, lease: Lease) -> None:
        self._check_current(lease, "release")
        del self._leases[lease.thread_id]

    async def holder(self, thread_id: str) -> Lease | None:
        return self._live(thread_id)


@dataclass
class _Thread:
    head: int = 0
    history: dict[int, bytes] = field(default_factory=lambda: {})


class MemoryCheckpointer(Generic[S]):
    """In-memory strict-OCC checkpointer.

    Given ``leases`` it is a native (fencing) checkpointer for that lease manager: lease
    and revision are checked in the same step as the write. Without, the runner wraps it
    in a lease guard when a lease manager is configured.
    """

    def __init__(
        self, *, leases: MemoryLeaseManager | None = None, codec: StateCodec[S] | None = None
    ) -> None:
        self._threads: dict[str, _Thread] = {}
        self._leases = leases
        self.codec = codec

    def fences(self, leases: LeaseManager) -> bool:
        return self._leases is not None and leases is self._leases

    def _fence(self, thread_id: str, lease: Lease | None) -> None:
        if self._leases is None:
            return
        live = self._leases._live(thread_id)  # pyright: ignore[reportPrivateUsage]
        if lease is None:
            if live is not None:
                raise ThreadLeaseBusyError(
                    f"thread {thread_id!r} is leased by {live.owner!r}; save with its lease"
                )
        elif live is None or live.token != lease.token or live.owner != lease.owner:
            raise LeaseLostError(
                f"save refused: lease {lease.token} of {lease.owner!r} on thread "
                f"{thread_id!r} is no longer live (fenced)"
            )

    def _commit(self, expected_revision: int, snapshot: Snapshot[S], lease: Lease | None) -> int:
        thread_id = validate_thread_id(snapshot.thread_id)
        self._fence(thread_id, lease)
        thread = self._threads.get(thread_id)
        actual = thread.head if thread is not None else 0
        if actual != expected_revision:
            raise ConcurrencyConflictError(
                f"thread {thread_id!r} is at revision {actual}, not {expected_revision}",
                thread_id=thread_id,
                expected=expected_revision,
                actual=actual,
            )
        revision = expected_revision + 1
        data = encode_snapshot(snapshot, revision, self.codec)
        if thread is None:
            thread = self._threads[thread_id] = _Thread()
        thread.history[revision] = data
        thread.head = revision
        return revision

    async def save(
        self, expected_revision: int, snapshot: Snapshot[S], *, lease: Lease | None = None
    ) -> int:
        return self._commit(expected_revision, snapshot, lease)

    async def save_with_outbox(
        self,
        expected_revision: int,
        snapshot: Snapshot[S],
        enqueue: EnqueueCallback,
        *,
        lease: Lease | None = None,
    ) -> int:
        tx = _MemoryTx()
        # Validate first so a conflict writes neither the snapshot nor the intent.
        thread = self._threads.get(validate_thread_id(snapshot.thread_id))
        self._fence(snapshot.thread_id, lease)
        actual = thread.head if thread is not None else 0
        if actual != expected_revision:
            raise ConcurrencyConflictError(
                f"thread {snapshot.thread_id!r} is at revision {actual}, not {expected_revision}",
                thread_id=snapshot.thread_id,
                expected=expected_revision,
                actual=actual,
            )
        await enqueue(tx, expected_revision + 1)
        revision = self._commit(expected_revision, snapshot, lease)
        for outbox, intent in tx.pending:
            outbox._append(intent)  # pyright: ignore[reportPrivateUsage]
        return revision

    def _record(self, thread_id: str, revision: int) -> bytes:
        return self._threads[thread_id].history[revision]

    async def load(self, thread_id: str) -> tuple[Snapshot[S], int]:
        validate_thread_id(thread_id)
        thread = self._threads.get(thread_id)
        if thread is None or thread.head == 0:
            raise ThreadNotFoundError(f"no checkpoint for thread {thread_id!r}")
        snap = decode_snapshot(
            thread.history[thread.head], self.codec, thread_id=thread_id, revision=thread.head
        )
        return snap, thread.head

    async def get_history(self, thread_id: str, limit: int = 100) -> list[Snapshot[S]]:
        validate_thread_id(thread_id)
        thread = self._threads.get(thread_id)
        if thread is None:
            return []
        revisions = sorted(thread.history, reverse=True)[: max(limit, 0)]
        return [
            decode_snapshot(thread.history[r], self.codec, thread_id=thread_id, revision=r)
            for r in revisions
        ]

    async def prune(self, thread_id: str, retain: int) -> None:
        validate_thread_id(thread_id)
        thread = self._threads.get(thread_id)
        if thread is None:
            return
        keep = set(sorted(thread.history, reverse=True)[: max(retain, 1)]) | {thread.head}
        for r in list(thread.history):
            if r not in keep:
                del thread.history[r]

    async def delete(self, thread_id: str) -> None:
        validate_thread_id(thread_id)
        self._threads.pop(thread_id, None)

    async def delete_if_idle(self, thread_id: str) -> None:
        validate_thread_id(thread_id)
        if self._leases is not None:
            live = self._leases._live(thread_id)  # pyright: ignore[reportPrivateUsage]
            if live is not None:
                raise ThreadLeaseBusyError(
                    f"thread {thread_id!r} is leased by {live.owner!r}; not deleting"
                )
        self._threads.pop(thread_id, None)

    async def list_threads(
        self,
        *,
        handoff_statuses: frozenset[HandoffStatus] | None = None,
        limit: int = 100,
    ) -> list[ThreadSummary]:
        out: list[ThreadSummary] = []
        for thread_id, thread in list(self._threads.items()):
            if len(out) >= limit:
                break
            if thread.head == 0:
                continue
            snap = decode_snapshot(thread.history[thread.head], self.codec, thread_id=thread_id)
            if handoff_statuses is not None and snap.handoff_status not in handoff_statuses:
                continue
            out.append(
                ThreadSummary(
                    thread_id=thread_id,
                    revision=thread.head,
                    execution_pointer=snap.execution_pointer,
                    status=snap.status,
                    reason=snap.reason,
                    handoff_status=snap.handoff_status,
                    handoff_pending_at=snap.handoff_pending_at,
                    updated_at=snap.updated_at,
                )
            )
        return out

    def corrupt(self, thread_id: str) -> None:
        """Flip one byte of the thread's head record (for corruption tests)."""
        thread = self._threads[thread_id]
        data = bytearray(thread.history[thread.head])
        data[len(data) // 2] ^= 0xFF
        thread.history[thread.head] = bytes(data)


class _MemoryTx:
    """The transaction handle ``MemoryCheckpointer.save_with_outbox`` passes to enqueue."""

    def __init__(self) -> None:
        self.pending: list[tuple[MemoryOutbox, HandoffIntent]] = []


@dataclass
class _Entry:
    message_id: str
    intent: HandoffIntent
    attempts: int = 0
    visible_at: float = 0.0
    error: str = ""


class MemoryOutbox:
    """In-memory hand-off outbox and consumer (transactional with ``MemoryCheckpointer``).

    For development and tests. ``max_attempts`` deliveries without an ack move a message
    to the dead letters.
    """

    def __init__(self, *, max_attempts: int = 5, clock: Clock = time.time) -> None:
        self.max_attempts = max_attempts
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self._dead: dict[str, _Entry] = {}
        self._ids = itertools.count(1)
        self._wakeup = asyncio.Event()
        self.fail_enqueue: Exception | None = None

    def _append(self, intent: HandoffIntent) -> None:
        # One message per (thread, committed revision): enqueueing it again is a no-op,
        # or brings a dead-lettered copy back.
        for entry in self._entries.values():
            if entry.intent.intent_id == intent.intent_id:
                return
        for message_id, entry in list(self._dead.items()):
            if entry.intent.intent_id == intent.intent_id:
                entry.attempts = 0
                entry.visible_at = 0.0
                self._entries[message_id] = self._dead.pop(message_id)
                self._wakeup.set()
                return
        message_id = str(next(self._ids))
        self._entries[message_id] = _Entry(message_id, intent)
        self._wakeup.set()

    async def enqueue_intent(self, intent: HandoffIntent) -> None:
        if self.fail_enqueue is not None:
            raise self.fail_enqueue
        self._append(intent)

    async def enqueue_intent_tx(self, tx: object, intent: HandoffIntent) -> None:
        if not isinstance(tx, _MemoryTx):
            raise TypeError(
                f"MemoryOutbox.enqueue_intent_tx needs the handle of "
                f"MemoryCheckpointer.save_with_outbox, got {type(tx).__name__}"
            )
        if self.fail_enqueue is not None:
            raise self.fail_enqueue
        tx.pending.append((self, intent))

    def _claim_now(self, limit: int, visibility_timeout: float) -> list[OutboxMessage]:
        now = self._clock()
        out: list[OutboxMessage] = []
        for entry in list(self._entries.values()):
            if len(out) >= limit:
                break
            if entry.visible_at > now:
                continue
            if entry.attempts >= self.max_attempts:
                self._dead[entry.message_id] = self._entries.pop(entry.message_id)
                continue
            entry.attempts += 1
            entry.visible_at = now + visibility_timeout
            out.append(OutboxMessage(entry.message_id, entry.intent, entry.attempts))
        return out

    async def claim(
        self, limit: int, visibility_timeout: float, wait: float = 0.0
    ) -> list[OutboxMessage]:
        deadline = time.monotonic() + wait
        while True:
            self._wakeup.clear()
            got = self._claim_now(limit, visibility_timeout)
            remaining = deadline - time.monotonic()
            if got or remaining <= 0:
                return got
            try:
                await asyncio.wait_for(self._wakeup.wait(), timeout=min(remaining, 0.05))
            except TimeoutError:
                pass

    async def ack(self, message: OutboxMessage) -> None:
        self._entries.pop(message.message_id, None)

    async def release(self, message: OutboxMessage, *, error: str = "") -> None:
        entry = self._entries.get(message.message_id)
        if entry is None:
            return
        entry.error = error
        if entry.attempts >= self.max_attempts:
            self._dead[entry.message_id] = self._entries.pop(entry.message_id)
        else:
            entry.visible_at = 0.0
            self._wakeup.set()

    async def dead_letters(self, limit: int = 100) -> list[OutboxMessage]:
        return [OutboxMessage(e.message_id, e.intent, e.attempts) for e in self._dead.values()][
            :limit
        ]

    async def retry_dead_letter(self, message_id: str) -> None:
        entry = self._dead.pop(message_id, None)
        if entry is None:
            raise KeyError(f"no dead letter with id {message_id!r}")
        entry.attempts = 0
        entry.visible_at = 0.0
        self._entries[message_id] = entry
        self._wakeup.set()

    def pending_count(self) -> int:
        """Messages not yet acked (claimed or not), dead letters excluded."""
        return len(self._entries)
