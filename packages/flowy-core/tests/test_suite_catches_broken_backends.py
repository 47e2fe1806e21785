"""The conformance suite can fail: deliberately broken stores must fail the suite tests
that guard the broken contract (and those tests pass on the unbroken store).

Each broken store is the memory or SQLite store with one realistic bug in one primitive
(or one public method that skips the base): no OCC, a check-then-write race, corruption
read as "missing", truncated keys, history in the wrong order, a prune that drops the
head or touches other threads, tokens that restart after release or delete, re-entrant
leases, a ``holder()`` that extends the lease, a save that ignores its lease, a lease
released after it expired, owners compared case-insensitively, a ``delete_if_idle``
refusing for an expired lease, transactional saves that lose updates, a cancelled
transactional save that leaves its transaction open, an outbox without visibility
timeout, an ack that removes the thread's other messages, a re-enqueue that resets a
live message, a dead-letter retry that keeps the attempts, a non-atomic
``save_with_outbox``, a consumer that stalls on a poison message, argument checks that
drifted, timers listed before they are due or left behind by a head that moved on,
signal ids not deduplicated, signal numbers raced, an inbox that survives its thread, an
inbox without a limit, a journal that drops outcomes, listings without graph versions, a
backlog that loses the messages in flight, an index of parked threads that keeps those
that moved on, a fork that copies its parent's inbox, journal entries written behind the
call, wake-up times read back in the wrong unit, ``list_threads`` paging from ``after``
included, a dead letter revived with its old payload, signal ids kept past a delete, an
ack or a release that touches a dead letter, a save that reads the head before it writes,
a progress channel that drops events, a schedule claim that ignores its version, a
canceled head that keeps its timer, and a lease released or acquired in a second call (or
not released at all). The suite's test methods are called directly with
the broken backend; two more tests run the suite through pytest in a subprocess the way
a store's own tests do.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import copy
import importlib
import inspect
import os
import pkgutil
import sqlite3
import subprocess
import sys
import textwrap
import urllib.parse
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import pytest

from flowy import connect
from flowy.errors import SnapshotEnvelopeInvalidError, StorageError, ThreadNotFoundError
from flowy.memory import (
    MemoryBackend,
    MemoryCheckpointer,
    MemoryConsumer,
    MemoryLeaseManager,
    MemoryOutbox,
    MemoryScheduleStore,
    MemoryStore,
)
from flowy.memory import _named as memory_named  # pyright: ignore[reportPrivateUsage]
from flowy.sqlite import (
    SQLiteBackend,
    SQLiteCheckpointer,
    SQLiteConsumer,
    SQLiteLeaseManager,
    SQLiteOutbox,
)
from flowy.sqlite._db import immediate
from flowy.sqlite._store import (
    _SUMMARY_COLUMNS,  # pyright: ignore[reportPrivateUsage]
    _row_id,  # pyright: ignore[reportPrivateUsage]
)
from flowy.storage import (
    Capabilities,
    HandoffStatus,
    Lease,
    OutboxMessage,
    OutboxStats,
    OutboxTransaction,
    RunStatus,
    Snapshot,
    ThreadSummary,
    Timer,
)
from flowy.storage.dialect import (
    BACKLOG_STATUSES,
    BaseCheckpointer,
    Busy,
    EnqueueCallback,
    OutboxRow,
    RawMessage,
    Refused,
    StoreURL,
    Write,
    decode_intent,
    decode_snapshot,
    encode_snapshot,
    register_backend,
)

# The suite is imported as a module: a suite class bound to a name in a test module is
# collected and run there (that is how stores opt in), which is not wanted here.
from flowy.testing import corrupt_head, dump_store, suite
from flowy.testing.suite._support import skip_unless_capable

pytestmark = pytest.mark.anyio

SuiteTest = Callable[..., Awaitable[None]]


# --- broken memory parts ------------------------------------------------------------------


class LastWriteWinsCheckpointer(MemoryCheckpointer[Any]):
    """Ignores ``expected_revision``: every save lands on top of whatever is stored."""

    async def _write(self, write: Write) -> Refused | None:
        thread = self.store.threads.get(write.thread_id)
        head = thread.head if thread else 0
        return await super()._write(replace(write, expected_revision=head))


class RacyCheckpointer(MemoryCheckpointer[Any]):
    """Checks the revision, yields to the event loop, then writes: racers all win."""

    async def _write(self, write: Write) -> Refused | None:
        thread = self.store.threads.get(write.thread_id)
        actual = thread.head if thread else 0
        if actual != write.expected_revision:
            return Refused(actual, None)
        await asyncio.sleep(0)  # a network round trip between the check and the write
        thread = self.store.threads.get(write.thread_id)
        return await super()._write(replace(write, expected_revision=thread.head if thread else 0))


class CorruptIsMissingCheckpointer(MemoryCheckpointer[Any]):
    """Reports a corrupted head as a missing thread instead of an invalid envelope."""

    async def load(self, thread_id: str) -> tuple[Snapshot[Any], int]:
        try:
            return await super().load(thread_id)
        except SnapshotEnvelopeInvalidError as exc:
            raise ThreadNotFoundError(f"thread {thread_id!r} is unreadable") from exc


class TruncatingCheckpointer(MemoryCheckpointer[Any]):
    """Keys threads by the first 255 characters of their id (a column size limit)."""

    async def _write(self, write: Write) -> Refused | None:
        short = replace(write.summary, thread_id=write.thread_id[:255])
        return await super()._write(replace(write, summary=short))

    async def _read_head(self, thread_id: str) -> tuple[int, bytes] | None:
        return await super()._read_head(thread_id[:255])


class OldestFirstCheckpointer(MemoryCheckpointer[Any]):
    """Returns history oldest first."""

    async def _read_history(self, thread_id: str, limit: int) -> list[tuple[int, bytes]]:
        return list(reversed(await super()._read_history(thread_id, 10_000)))[:limit]


class PruneKeepsOldestCheckpointer(MemoryCheckpointer[Any]):
    """``prune`` keeps the oldest entries instead of the newest (the head goes)."""

    async def _prune(self, thread_id: str, keep: int) -> None:
        thread = self.store.threads.get(thread_id)
        if thread is not None:
            for revision in sorted(thread.history)[keep:]:
                del thread.history[revision]


class UnfencedCheckpointer(MemoryCheckpointer[Any]):
    """Never looks at the lease (claims to fence, though)."""

    async def _write(self, write: Write) -> Refused | None:
        live = self.store.live_lease(write.thread_id)
        return await super()._write(replace(write, lease=live))


class NonAtomicOutboxCheckpointer(MemoryCheckpointer[Any]):
    """``save_with_outbox`` commits the snapshot first, then runs the callback."""

    async def save_with_outbox(
        self,
        expected_revision: int,
        snapshot: Snapshot[Any],
        enqueue: EnqueueCallback,
        *,
        lease: Lease | None = None,
    ) -> int:
        revision = await self.save(expected_revision, snapshot, lease=lease)
        tx = OutboxTransaction(self.domain, snapshot.thread_id, revision)
        await enqueue(tx, revision)
        for row in tx.rows:
            self.store.append(row)
        return revision


class TokenResetLeases(MemoryLeaseManager):
    """Counts tokens per lease record without the clock floor, and release deletes the
    record: the next lease reuses token 1."""

    async def _acquire(self, thread_id: str, owner: str, ttl: float) -> Lease | Busy:
        live = self.store.live_lease(thread_id)
        if live is not None:
            return Busy(live)
        old = self.store.leases.get(thread_id)
        token = (old.fencing_token if old else 0) + 1
        lease = Lease(thread_id, owner, token, self.store.clock() + ttl)
        self.store.leases[thread_id] = lease
        return lease


class ReentrantLeases(MemoryLeaseManager):
    """Lets the current owner acquire its own live lease again."""

    async def _acquire(self, thread_id: str, owner: str, ttl: float) -> Lease | Busy:
        live = self.store.live_lease(thread_id)
        if live is not None and live.owner == owner:
            renewed = await self._renew(live, ttl)
            assert renewed is not None
            return renewed
        return await super()._acquire(thread_id, owner, ttl)


class SlidingHolderLeases(MemoryLeaseManager):
    """``holder()`` renews the lease it reports (a read that writes)."""

    async def _holder(self, thread_id: str) -> Lease | None:
        live = self.store.live_lease(thread_id)
        return None if live is None else await self._renew(live, 1.0)


class NoVisibilityConsumer(MemoryConsumer):
    """Ignores the visibility timeout: a claimed message is claimable again at once."""

    async def _claim_queue(
        self, queue: str, limit: int, visibility_timeout: float, held: int
    ) -> list[RawMessage]:
        return await super()._claim_queue(queue, limit, 1e-9, held)


class StickyAttemptsConsumer(MemoryConsumer):
    """``retry_dead_letter`` keeps the attempt count."""

    async def _retry_dead_letter(self, message_id: str) -> bool:
        entry = self.store.dead.get(message_id)
        attempts = entry.attempts if entry is not None else 0
        retried = await super()._retry_dead_letter(message_id)
        if retried:
            self.store.messages[message_id].attempts = attempts
        return retried


class StallingConsumer(MemoryConsumer):
    """Decodes claimed payloads without burying the poison ones: a bad row stops every
    claim and blocks the good messages behind it."""

    async def claim(
        self, limit: int, visibility_timeout: float, wait: float = 0.0
    ) -> list[OutboxMessage]:
        raws = await self._claim(limit, visibility_timeout)
        return [OutboxMessage(r.message_id, decode_intent(r.payload), r.attempts) for r in raws]


class NaNClaimConsumer(MemoryConsumer):
    """Skips the argument checks of ``claim`` (a NaN timeout hides messages forever)."""

    async def claim(
        self, limit: int, visibility_timeout: float, wait: float = 0.0
    ) -> list[OutboxMessage]:
        out: list[OutboxMessage] = []
        for raw in await self._claim(max(int(limit), 0), visibility_timeout):
            message = await self._accept(raw)  # pyright: ignore[reportPrivateUsage]
            if message is not None:
                out.append(message)
        return out


class ValueErrorRevisionCheckpointer(MemoryCheckpointer[Any]):
    """Its own revision check raises ``ValueError`` where every store raises ``TypeError``."""

    async def save(
        self, expected_revision: int, snapshot: Snapshot[Any], *, lease: Lease | None = None
    ) -> int:
        if not isinstance(expected_revision, int) or isinstance(expected_revision, bool):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f"bad expected_revision {expected_revision!r}")
        return await super().save(expected_revision, snapshot, lease=lease)


class InheritedInboxCheckpointer(MemoryCheckpointer[Any]):
    """Creates a fork with a copy of its parent's inbox (the thread copied whole)."""

    async def _write(self, write: Write) -> Refused | None:
        refused = await super()._write(write)
        if refused is None and write.expected_revision == 0:
            snap = decode_snapshot(write.record, self.codec, thread_id=write.thread_id)
            inbox = self.store.inboxes.get(snap.parent_thread_id)
            if snap.parent_thread_id and inbox is not None:
                self.store.inboxes[write.thread_id] = copy.deepcopy(inbox)
        return refused


class WriteBehindJournalCheckpointer(MemoryCheckpointer[Any]):
    """Buffers journal entries in the process and stores each with the next journal write
    or save: this process reads its own entries, others see a call only after it ran."""

    def __init__(self, store: MemoryStore | None = None) -> None:
        super().__init__(store)
        self.buffered: list[tuple[str, str, bytes]] = []

    def _flush(self) -> None:
        for thread_id, key, data in self.buffered:
            self.store.journals.setdefault(thread_id, {})[key] = data
        self.buffered.clear()

    async def _put_activity(self, thread_id: str, key: str, data: bytes) -> None:
        self._flush()
        self.buffered.append((thread_id, key, data))

    async def _get_activity(self, thread_id: str, key: str) -> bytes | None:
        self._flush()
        return await super()._get_activity(thread_id, key)

    async def _list_activities(self, thread_id: str) -> list[bytes]:
        self._flush()
        return await super()._list_activities(thread_id)

    async def _write(self, write: Write) -> Refused | None:
        self._flush()
        return await super()._write(write)


class MillisecondWakeCheckpointer(MemoryCheckpointer[Any]):
    """Reads a head's wake-up time back in thousands of what was written (seconds
    written, milliseconds read): every wait looks overdue."""

    async def _read_head(self, thread_id: str) -> tuple[int, bytes] | None:
        return self._misread(thread_id, await super()._read_head(thread_id))

    async def _acquire_head(
        self, thread_id: str, owner: str, ttl: float
    ) -> tuple[Lease | Busy, tuple[int, bytes] | None]:
        got, head = await super()._acquire_head(thread_id, owner, ttl)
        return got, self._misread(thread_id, head)

    def _misread(self, thread_id: str, head: tuple[int, bytes] | None) -> tuple[int, bytes] | None:
        if head is None:
            return None
        revision, record = head
        snap = decode_snapshot(record, self.codec, thread_id=thread_id, revision=revision)
        if snap.wake_at is None:
            return head
        return revision, encode_snapshot(replace(snap, wake_at=snap.wake_at / 1000), revision)


class InclusiveAfterCheckpointer(MemoryCheckpointer[Any]):
    """Pages from ``after`` included (``>=`` where ``>`` was meant)."""

    async def _list_heads(self, statuses: Any, limit: int, after: str | None) -> Any:
        ids = self.store.thread_ids
        if after is None or after not in self.store.threads:
            return await super()._list_heads(statuses, limit, after)
        before = ids[bisect.bisect_left(ids, after) - 1] if ids[0] != after else None
        return await super()._list_heads(statuses, limit, before)


class StalePayloadOutbox(MemoryOutbox):
    """Revives a dead letter written again with the payload it died with."""

    async def _append(self, row: OutboxRow) -> None:
        for message_id, entry in list(self.store.dead.items()):
            if (entry.thread_id, entry.committed_revision) == (
                row.thread_id,
                row.committed_revision,
            ):
                self.store.revive(message_id)
                return
        await super()._append(row)


class NewIdReviveOutbox(MemoryOutbox):
    """Revives a dead letter written again as a new message, under a new id."""

    async def _append(self, row: OutboxRow) -> None:
        for message_id, entry in list(self.store.dead.items()):
            if (entry.thread_id, entry.committed_revision) == (
                row.thread_id,
                row.committed_revision,
            ):
                del self.store.dead[message_id]
        await super()._append(row)


class KeptSignalIdsCheckpointer(MemoryCheckpointer[Any]):
    """Deletes a thread's signals but keeps its index of signal ids."""

    async def _delete(self, thread_id: str, *, if_idle: bool) -> Lease | None:
        inbox = self.store.inboxes.get(thread_id)
        holder = await super()._delete(thread_id, if_idle=if_idle)
        if holder is None and inbox is not None:
            inbox.signals.clear()
            self.store.inboxes[thread_id] = inbox
        return holder


# --- broken SQLite parts ------------------------------------------------------------------


class LostUpdateSQLiteCheckpointer(SQLiteCheckpointer[Any]):
    """Transactional saves check the revision in one transaction and write in the next:
    under contention every racer passes the check and the later writes overwrite.

    A racer that passed the check waits (up to 5 s) until a second racer of the same
    thread has passed it too, so the lost update happens however the racers are
    scheduled on a busy machine."""

    passed: ClassVar[dict[str, tuple[int, asyncio.Event]]] = {}

    async def _write(self, write: Write) -> Refused | None:
        if not write.outbox:
            return await super()._write(write)

        def check(conn: sqlite3.Connection) -> int:
            row = conn.execute(
                "SELECT revision FROM flowy_threads WHERE thread_id = ?", (write.thread_id,)
            ).fetchone()
            return int(row[0]) if row else 0

        actual = await self.database.run(check, "check the revision")
        if actual != write.expected_revision:
            return Refused(actual, None)
        passed = type(self).passed
        count, second = passed.get(write.thread_id, (0, asyncio.Event()))
        passed[write.thread_id] = (count + 1, second)
        if count + 1 >= 2:
            second.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(second.wait(), 5.0)
        return await self.database.run(
            lambda conn: immediate(conn, lambda: self._body_unchecked(conn, write)), "write"
        )

    def _body_unchecked(self, conn: sqlite3.Connection, write: Write) -> None:
        row = conn.execute(
            "SELECT revision FROM flowy_threads WHERE thread_id = ?", (write.thread_id,)
        ).fetchone()
        current = int(row[0]) if row else 0
        self._body(conn, replace(write, expected_revision=current))


class OpenTransactionSQLiteCheckpointer(SQLiteCheckpointer[Any]):
    """Opens its transaction before the enqueue callback and leaves it open when the
    caller is cancelled: the file stays locked."""

    async def save_with_outbox(
        self,
        expected_revision: int,
        snapshot: Snapshot[Any],
        enqueue: EnqueueCallback,
        *,
        lease: Lease | None = None,
    ) -> int:
        write = self._prepare(expected_revision, snapshot, lease)  # pyright: ignore[reportPrivateUsage]
        await self.database.run(lambda conn: conn.execute("BEGIN IMMEDIATE"), "begin")
        tx = OutboxTransaction(self.domain, write.thread_id, write.revision)
        await enqueue(tx, write.revision)  # a cancellation here never rolls back
        refused = await self.database.run(
            lambda conn: self._body(conn, replace(write, outbox=tuple(tx.rows))), "write"
        )
        await self.database.run(lambda conn: conn.execute("COMMIT"), "commit")
        if refused is not None:
            raise RuntimeError(f"refused: {refused}")
        return write.revision


class PruneEverywhereSQLiteCheckpointer(SQLiteCheckpointer[Any]):
    """``prune`` forgets its ``WHERE thread_id = ?``: every thread loses old revisions."""

    async def _prune(self, thread_id: str, keep: int) -> None:
        def body(conn: sqlite3.Connection) -> None:
            conn.execute(
                "DELETE FROM flowy_history WHERE revision <= ("
                "SELECT revision FROM flowy_history WHERE thread_id = ? "
                "ORDER BY revision DESC LIMIT 1 OFFSET ?)",
                (thread_id, keep),
            )

        await self.database.run(lambda conn: immediate(conn, lambda: body(conn)), "prune")


class CountingSQLiteLeases(SQLiteLeaseManager):
    """Counts tokens on the lease record without the clock floor; since release and
    delete remove the record, the next lease starts again at token 1."""

    async def _acquire(self, thread_id: str, owner: str, ttl: float) -> Lease | Busy:
        def body(conn: sqlite3.Connection) -> Lease | Busy:
            now = self.database.clock()
            row = conn.execute(
                "SELECT owner, token, expires_at FROM flowy_leases WHERE thread_id = ?",
                (thread_id,),
            ).fetchone()
            if row is not None and row[0] is not None and float(row[2]) > now:
                return Busy(Lease(thread_id, str(row[0]), int(row[1]), float(row[2])))
            lease = Lease(thread_id, owner, (int(row[1]) if row else 0) + 1, now + ttl)
            conn.execute(
                "INSERT OR REPLACE INTO flowy_leases (thread_id, owner, token, expires_at) "
                "VALUES (?, ?, ?, ?)",
                (thread_id, owner, lease.fencing_token, lease.expires_at),
            )
            return lease

        return await self.database.run(lambda conn: immediate(conn, lambda: body(conn)), "acq")


class StubbornDeleteSQLiteCheckpointer(SQLiteCheckpointer[Any]):
    """``delete_if_idle`` refuses whenever a lease row has an owner, expired or not."""

    async def _delete(self, thread_id: str, *, if_idle: bool) -> Lease | None:
        if if_idle:
            row = await self.database.run(
                lambda conn: conn.execute(
                    "SELECT owner, token, expires_at FROM flowy_leases WHERE thread_id = ?",
                    (thread_id,),
                ).fetchone(),
                "read the lease",
            )
            if row is not None and row[0] is not None:
                return Lease(thread_id, str(row[0]), int(row[1]), float(row[2]))
        return await super()._delete(thread_id, if_idle=if_idle)


class ExpiredReleaseSQLiteLeases(SQLiteLeaseManager):
    """``release`` checks owner and token but not the expiry."""

    async def _release(self, lease: Lease) -> bool:
        def body(conn: sqlite3.Connection) -> bool:
            row = conn.execute(
                "SELECT owner, token FROM flowy_leases WHERE thread_id = ?", (lease.thread_id,)
            ).fetchone()
            if row is None or (row[0], row[1]) != (lease.owner, lease.fencing_token):
                return False
            conn.execute(
                "UPDATE flowy_leases SET owner = NULL, expires_at = 0 WHERE thread_id = ?",
                (lease.thread_id,),
            )
            return True

        return await self.database.run(lambda conn: immediate(conn, lambda: body(conn)), "release")


class CaseInsensitiveSQLiteLeases(SQLiteLeaseManager):
    """Compares owners case-insensitively when renewing and releasing."""

    async def _renew(self, lease: Lease, ttl: float) -> Lease | None:
        live = await self._holder(lease.thread_id)
        if live is None or live.owner.lower() != lease.owner.lower():
            return None
        return await super()._renew(replace(lease, owner=live.owner), ttl)

    async def _release(self, lease: Lease) -> bool:
        live = await self._holder(lease.thread_id)
        if live is None or live.owner.lower() != lease.owner.lower():
            return False
        return await super()._release(replace(lease, owner=live.owner))


class AckByThreadSQLiteConsumer(SQLiteConsumer):
    """``ack`` deletes every message of the acked message's thread."""

    async def _ack(self, message_id: str) -> None:
        await self.database.run(
            lambda conn: immediate(
                conn,
                lambda: conn.execute(
                    "DELETE FROM flowy_outbox WHERE thread_id = "
                    "(SELECT thread_id FROM flowy_outbox WHERE id = ?)",
                    (int(message_id),),
                ),
            ),
            "ack",
        )


class LenientIdSQLiteConsumer(SQLiteConsumer):
    """Message ids are read with ``int()``: ``" 7"``/``"07"`` name message 7, and an id
    past 64 bits reaches SQLite (OverflowError)."""

    async def _ack(self, message_id: str) -> None:
        await self.database.run(
            lambda conn: immediate(
                conn,
                lambda: conn.execute("DELETE FROM flowy_outbox WHERE id = ?", (int(message_id),)),
            ),
            "ack",
        )


class DeadAckSQLiteConsumer(SQLiteConsumer):
    """``ack`` deletes the row of that id, dead or not."""

    async def _ack(self, message_id: str) -> None:
        row_id = _row_id(message_id)
        await self.database.run(
            lambda conn: immediate(
                conn, lambda: conn.execute("DELETE FROM flowy_outbox WHERE id = ?", (row_id,))
            ),
            "ack",
        )


class DeadReleaseSQLiteConsumer(SQLiteConsumer):
    """``release`` updates the row of that id, dead or not: a late release revives a
    dead letter."""

    async def _release(self, message_id: str, *, error: str, delay: float, dead: bool) -> None:
        now = self.database.clock()
        await self.database.run(
            lambda conn: immediate(
                conn,
                lambda: conn.execute(
                    "UPDATE flowy_outbox SET dead = ?, error = ?, visible_at = ? WHERE id = ?",
                    (int(dead), error, now + delay, _row_id(message_id)),
                ),
            ),
            "release",
        )


class HiddenInFlightSQLiteConsumer(SQLiteConsumer):
    """Counts a message as in flight while it is hidden: one released with a delay
    keeps its queue's slot until it is visible again."""

    async def _release(self, message_id: str, *, error: str, delay: float, dead: bool) -> None:
        await super()._release(message_id, error=error, delay=delay, dead=dead)
        await self.database.run(
            lambda conn: immediate(
                conn,
                lambda: conn.execute(
                    "UPDATE flowy_outbox SET claimed_until = visible_at WHERE id = ? AND dead = 0",
                    (_row_id(message_id),),
                ),
            ),
            "release",
        )


class ResettingSQLiteOutbox(SQLiteOutbox):
    """Enqueueing an intent again resets its live message (attempts and visibility)."""

    async def _append(self, row: Any) -> None:
        await self.database.run(
            lambda conn: immediate(
                conn,
                lambda: conn.execute(
                    "INSERT INTO flowy_outbox (thread_id, committed_revision, payload, "
                    "created_at) VALUES (?, ?, ?, 0) ON CONFLICT (thread_id, "
                    "committed_revision) DO UPDATE SET attempts = 0, visible_at = 0, dead = 0",
                    (row.thread_id, row.committed_revision, row.payload),
                ),
            ),
            "append",
        )


class AllTimersCheckpointer(MemoryCheckpointer[Any]):
    """Lists every timer as due, whatever its wake-up time."""

    async def _timers(self, before: float, limit: int) -> list[Timer]:
        return await super()._timers(float("inf"), limit)


class StaleTimerCheckpointer(MemoryCheckpointer[Any]):
    """Indexes a new wake-up time but never takes the old one out."""

    async def _write(self, write: Write) -> Refused | None:
        thread = self.store.threads.get(write.thread_id)
        old = thread.summary.wake_at if thread is not None and thread.summary else None
        refused = await super()._write(write)
        if refused is None and old is not None and old != write.summary.wake_at:
            self.store.set_timer(write.thread_id, None, old)  # put the old one back
        return refused


class RunningClearsTimerCheckpointer(MemoryCheckpointer[Any]):
    """Takes a wake-up time out of the index only when the next head is running (a
    woken run): a head that stops waiting any other way keeps the old timer."""

    async def _write(self, write: Write) -> Refused | None:
        thread = self.store.threads.get(write.thread_id)
        old = thread.summary.wake_at if thread is not None and thread.summary else None
        refused = await super()._write(write)
        summary = write.summary
        if (
            refused is None
            and old is not None
            and summary.wake_at is None
            and summary.status is not RunStatus.RUNNING
        ):
            self.store.set_timer(write.thread_id, None, old)  # left in the index
        return refused


class RepeatedSignalCheckpointer(MemoryCheckpointer[Any]):
    """Stores a signal again when its id comes again."""

    async def _append_signal(
        self, thread_id: str, signal_id: str, data: bytes, max_seq: int
    ) -> tuple[int, bool] | None:
        return await super()._append_signal(
            thread_id, f"{signal_id}-{uuid.uuid4().hex}", data, max_seq
        )


class UnboundedInboxCheckpointer(MemoryCheckpointer[Any]):
    """Ignores the inbox limit: every signal is stored."""

    async def _append_signal(
        self, thread_id: str, signal_id: str, data: bytes, max_seq: int
    ) -> tuple[int, bool] | None:
        return await super()._append_signal(thread_id, signal_id, data, 2**62)


class KeptInboxCheckpointer(MemoryCheckpointer[Any]):
    """Deletes a thread but keeps its inbox."""

    async def _delete(self, thread_id: str, *, if_idle: bool) -> Lease | None:
        inbox = self.store.inboxes.get(thread_id)
        holder = await super()._delete(thread_id, if_idle=if_idle)
        if inbox is not None:
            self.store.inboxes[thread_id] = inbox
        return holder


class VersionlessListingCheckpointer(MemoryCheckpointer[Any]):
    """Lists heads without the graph version that saved them."""

    async def _list_heads(self, statuses: Any, limit: int, after: str | None) -> Any:
        return [
            replace(s, graph_version="") for s in await super()._list_heads(statuses, limit, after)
        ]


class VisibleOnlyStatsConsumer(MemoryConsumer):
    """Counts the backlog from the claimable messages: those in flight drop out of it."""

    async def _stats(self) -> OutboxStats:
        now = self.store.clock()
        visible = [m for m in self.store.messages.values() if m.visible_at <= now]
        oldest = min((m.enqueued_at for m in visible), default=None)
        return OutboxStats(len(visible), oldest, len(self.store.dead))


class StaleParkedIndexCheckpointer(MemoryCheckpointer[Any]):
    """Indexes each thread's parked saves, but never takes a thread out when it moves on
    (or is deleted)."""

    def __init__(self, store: MemoryStore | None = None) -> None:
        super().__init__(store)
        self.parked: dict[str, tuple[RunStatus, float]] = {}

    async def _write(self, write: Write) -> Refused | None:
        refused = await super()._write(write)
        head = write.summary
        if refused is None and head.status in BACKLOG_STATUSES:
            self.parked[head.thread_id] = (head.status, head.updated_at)
        return refused

    async def _oldest_heads(self, statuses: frozenset[RunStatus]) -> dict[RunStatus, float]:
        oldest: dict[RunStatus, float] = {}
        for status, at in self.parked.values():
            if status in statuses:
                oldest[status] = min(at, oldest.get(status, at))
        return oldest


class FirstWriteJournalSQLiteCheckpointer(SQLiteCheckpointer[Any]):
    """Keeps the first journal entry of a key: later outcomes are dropped."""

    async def _put_activity(self, thread_id: str, key: str, data: bytes) -> None:
        await self.database.run(
            lambda conn: immediate(
                conn,
                lambda: conn.execute(
                    "INSERT OR IGNORE INTO flowy_journal (thread_id, key, data) VALUES (?, ?, ?)",
                    (thread_id, key, data),
                ),
            ),
            "record",
        )


class RacySignalSQLiteCheckpointer(SQLiteCheckpointer[Any]):
    """Numbers a signal from a read made before its write, in another transaction."""

    async def _append_signal(
        self, thread_id: str, signal_id: str, data: bytes, max_seq: int
    ) -> tuple[int, bool] | None:
        last = await self.database.run(
            lambda conn: conn.execute(
                "SELECT coalesce(max(seq), 0) FROM flowy_signals WHERE thread_id = ?",
                (thread_id,),
            ).fetchone()[0],
            "read",
        )
        await asyncio.sleep(0.01)
        await self.database.run(
            lambda conn: immediate(
                conn,
                lambda: conn.execute(
                    "INSERT OR REPLACE INTO flowy_signals (thread_id, seq, signal_id, data) "
                    "VALUES (?, ?, ?, ?)",
                    (thread_id, int(last) + 1, signal_id, data),
                ),
            ),
            "append",
        )
        return int(last) + 1, True


class HeadFromHistoryCheckpointer(MemoryCheckpointer[Any]):
    """Reads a thread's whole history to find its head (the newest entry)."""

    async def _read_head(self, thread_id: str) -> tuple[int, bytes] | None:
        history = await self._read_history(thread_id, 1_000_000)
        return history[0] if history else None


class ReadBeforeWriteCheckpointer(MemoryCheckpointer[Any]):
    """Reads the head before every conditional write (one more round trip per save)."""

    async def _write(self, write: Write) -> Refused | None:
        head = await self._read_head(write.thread_id)
        actual = head[0] if head is not None else 0
        if actual != write.expected_revision:
            return Refused(actual, self.store.live_lease(write.thread_id))
        return await super()._write(write)


class ReleaseAfterWriteCheckpointer(MemoryCheckpointer[Any]):
    """Releases the lease of a segment's last save in a second call after the write
    (one more round trip than it declares)."""

    async def _write_release(self, write: Write) -> Refused | None:
        refused = await self._write(replace(write, release=False))
        if refused is None:
            await self._read_head(write.thread_id)  # stands for the separate release
            self.store.leases.pop(write.thread_id, None)
        return refused


class LoadAfterAcquireCheckpointer(MemoryCheckpointer[Any]):
    """Takes the lease, then reads the head in a second call (one more round trip than
    it declares)."""

    async def _acquire_head(
        self, thread_id: str, owner: str, ttl: float
    ) -> tuple[Lease | Busy, tuple[int, bytes] | None]:
        got = self.store.take_lease(thread_id, owner, ttl)
        return got, await self._read_head(thread_id)


class HeadBeforeLeaseCheckpointer(MemoryCheckpointer[Any]):
    """Reads the head as the call begins and takes the lease at its end, as a statement
    reading its snapshot would: a save that lands in between is not the head it gives."""

    async def _acquire_head(
        self, thread_id: str, owner: str, ttl: float
    ) -> tuple[Lease | Busy, tuple[int, bytes] | None]:
        head = await self._read_head(thread_id)
        await asyncio.sleep(0)  # the round trip: another owner's last save may land
        return self.store.take_lease(thread_id, owner, ttl), head


class KeepsLeaseOnReleaseCheckpointer(MemoryCheckpointer[Any]):
    """Says its last save releases the lease, and writes without releasing it."""

    async def _write_release(self, write: Write) -> Refused | None:
        return await self._write(replace(write, release=False))


class KeepsMessageOnAckSQLiteCheckpointer(SQLiteCheckpointer[Any]):
    """Says its last save acknowledges the message, and writes without removing it."""

    async def _write_ack(self, write: Write) -> Refused | None:
        return await self._write_release(replace(write, ack=None))


class AcksBeforeWriteSQLiteCheckpointer(SQLiteCheckpointer[Any]):
    """Acknowledges the message in a transaction of its own before the write: a refused
    save has already removed it."""

    async def _write_ack(self, write: Write) -> Refused | None:
        acked = write.ack

        def ack(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM flowy_outbox WHERE id = ?", (int(str(acked)),))

        await self.database.run(lambda conn: immediate(conn, lambda: ack(conn)), "ack first")
        return await self._write_release(replace(write, ack=None))


class AcksEveryMessageSQLiteCheckpointer(SQLiteCheckpointer[Any]):
    """Removes every message of the outbox with the acking save, not just its own."""

    async def _write_ack(self, write: Write) -> Refused | None:
        refused = await self._write_release(replace(write, ack=None))
        if refused is None:
            await self.database.run(
                lambda conn: immediate(conn, lambda: conn.execute("DELETE FROM flowy_outbox")),
                "ack everything",
            )
        return refused


class ScannedTimersCheckpointer(MemoryCheckpointer[Any]):
    """Finds due timers by paging through every head, without an index of wake-ups."""

    async def _timers(self, before: float, limit: int) -> list[Timer]:
        due: list[Timer] = []
        after: str | None = None
        while page := await self._list_heads(None, 20, after):
            due += [
                Timer(h.thread_id, h.wake_at)
                for h in page
                if h.wake_at is not None and h.wake_at <= before
            ]
            after = page[-1].thread_id
        return sorted(due, key=lambda t: (t.wake_at, t.thread_id))[:limit]


class GreedyClaimConsumer(MemoryConsumer):
    """Claims every visible message and gives back those past the limit."""

    async def _claim_queue(
        self, queue: str, limit: int, visibility_timeout: float, held: int
    ) -> list[RawMessage]:
        taken = await super()._claim_queue(queue, 1_000_000, visibility_timeout, held)
        for raw in taken[limit:]:
            await self._release(raw.message_id, error=raw.error, delay=0.0, dead=False)
        return taken[:limit]


class ScanningListSQLiteCheckpointer(SQLiteCheckpointer[Any]):
    """Reads every head and pages and filters them in Python."""

    async def _list_heads(
        self, statuses: frozenset[HandoffStatus] | None, limit: int, after: str | None
    ) -> list[ThreadSummary]:
        rows: list[tuple[Any, ...]] = await self.database.run(
            lambda conn: conn.execute(
                f"SELECT {_SUMMARY_COLUMNS} FROM flowy_threads ORDER BY thread_id"
            ).fetchall(),
            "list threads",
        )
        heads = [self.summary(str(row[0]), *row[1:]) for row in rows]
        return [
            h
            for h in heads
            if (after is None or h.thread_id > after)
            and (statuses is None or h.handoff_status in statuses)
        ][:limit]


class StaleRecencySQLiteCheckpointer(SQLiteCheckpointer[Any]):
    """Writes a head's save second at its first save only: later saves never move it in
    the recency index."""

    def _body(self, conn: sqlite3.Connection, write: Write) -> Refused | None:
        row = conn.execute(
            "SELECT recent_second FROM flowy_threads WHERE thread_id = ?", (write.thread_id,)
        ).fetchone()
        refused = super()._body(conn, write)
        if refused is None and row is not None:
            conn.execute(
                "UPDATE flowy_threads SET recent_second = ? WHERE thread_id = ?",
                (row[0], write.thread_id),
            )
        return refused


class AscendingIdsRecencySQLiteCheckpointer(SQLiteCheckpointer[Any]):
    """Lists the threads of one second in ascending id order (and pages as if not)."""

    async def _recent_heads(
        self, limit: int, before: tuple[int, str] | None
    ) -> list[ThreadSummary]:
        sql = f"SELECT {_SUMMARY_COLUMNS} FROM flowy_threads"
        params: list[object] = []
        if before is not None:
            sql += " WHERE (recent_second, thread_id) < (?, ?)"
            params += before
        sql += " ORDER BY recent_second DESC, thread_id LIMIT ?"
        rows: list[tuple[Any, ...]] = await self.database.run(
            lambda conn: conn.execute(sql, [*params, limit]).fetchall(), "list recent threads"
        )
        return [self.summary(str(row[0]), *row[1:]) for row in rows]


_BASE: Any = BaseCheckpointer


class TimerlessCheckpointer(MemoryCheckpointer[Any]):
    """Keeps no timers or signals: those primitives are the base's defaults."""

    _timers = _BASE._timers
    _append_signal = _BASE._append_signal
    _read_signals = _BASE._read_signals


class ClaimsTimersBackend(MemoryBackend[Any]):
    """Says it keeps timers and signals (``capabilities``) while its checkpointer keeps
    none: a store whose declared capabilities are false."""

    @property
    def capabilities(self) -> Capabilities:
        return replace(super().capabilities, durable_timers_signals=True)


class ConflatingChannelBackend(MemoryBackend[Any]):
    """A progress channel that sends only the newest of the events queued together (a
    "latest value" channel): watchers miss progress."""

    async def _publish(self, thread_id: str, messages: Sequence[bytes]) -> None:
        await super()._publish(thread_id, messages[-1:])


class UncountedQueueConsumer(MemoryConsumer):
    """Claims from a queue as if it had no global or worker concurrency limit."""

    async def _claim_queue(
        self, queue: str, limit: int, visibility_timeout: float, held: int
    ) -> list[RawMessage]:
        limits = self.store.queue_limits.pop(queue, None)
        try:
            if limits is not None:
                self.store.queue_limits[queue] = replace(
                    limits, global_concurrency=None, worker_concurrency=None
                )
            return await super()._claim_queue(queue, limit, visibility_timeout, held)
        finally:
            if limits is not None:
                self.store.queue_limits[queue] = limits


class BlockedByPartitionConsumer(MemoryConsumer):
    """Stops its claim at the first message of a full partition: the messages behind
    it wait, whatever their partition."""

    async def _claim_queue(
        self, queue: str, limit: int, visibility_timeout: float, held: int
    ) -> list[RawMessage]:
        now = self.store.clock()
        mine = sorted(
            (
                m
                for m in self.store.messages.values()
                if m.route.queue == queue and m.visible_at <= now
            ),
            key=lambda m: (m.route.priority, m.seq),
        )
        taken = await super()._claim_queue(queue, limit, visibility_timeout, held)
        ids = {raw.message_id for raw in taken}
        prefix: list[RawMessage] = []
        for entry in mine:  # give back what lies past the first message skipped
            if entry.message_id not in ids:
                break
            prefix.append(next(raw for raw in taken if raw.message_id == entry.message_id))
        for raw in taken:
            if raw not in prefix:
                await self._release(raw.message_id, error="", delay=0.0, dead=False)
                self.store.messages[raw.message_id].attempts -= 1
        return prefix


class FifoOnlyQueueConsumer(MemoryConsumer):
    """Ignores priorities: a queue's messages go first in, first out."""

    async def _claim_queue(
        self, queue: str, limit: int, visibility_timeout: float, held: int
    ) -> list[RawMessage]:
        saved = {m.message_id: m.route for m in self.store.messages.values()}
        for m in self.store.messages.values():
            m.route = replace(m.route, priority=0)
        try:
            return await super()._claim_queue(queue, limit, visibility_timeout, held)
        finally:
            for m in self.store.messages.values():
                m.route = saved[m.message_id]


class BlindReplaceSchedules(MemoryScheduleStore):
    """Replaces a schedule whatever its version: two workers that read it at once both
    claim its tick."""

    async def _replace(self, name: str, version: int, data: bytes) -> bool:
        found = self.store.schedules.get(name)
        if found is None:
            return False
        self.store.schedules[name] = (found[0] + 1, data)
        return True


# --- stores -------------------------------------------------------------------------------


async def memory_with(**parts: type[Any]) -> MemoryBackend[Any]:
    """A named memory store (peers reach it by URL) with some parts replaced (``backend``:
    a ``MemoryBackend`` subclass to build it as)."""
    name = f"broken-{uuid.uuid4().hex}"
    url = f"memory://{name}?max_attempts=3"
    backend: MemoryBackend[Any]
    if "backend" in parts:
        backend = parts["backend"](memory_named.setdefault(name, MemoryStore()), url=url)
    else:
        opened = await connect(url)
        assert isinstance(opened, MemoryBackend)
        backend = opened
    store: MemoryStore = backend.store
    if "checkpointer" in parts:
        backend.checkpointer = parts["checkpointer"](store)
    if "leases" in parts:
        backend.leases = parts["leases"](store)
    if "outbox" in parts:
        backend.outbox = parts["outbox"](store)
    if "consumer" in parts:
        backend.consumer = parts["consumer"](store, max_attempts=3)
    if "schedules" in parts:
        backend.schedules = parts["schedules"](store)
    return backend


def sqlite_with(path: Path, **parts: type[Any]) -> SQLiteBackend[Any]:
    """A SQLite store on ``path`` with some parts replaced; peers open the same file."""
    backend: SQLiteBackend[Any] = SQLiteBackend(path, max_attempts=3, busy_timeout=0.5)
    backend.url = f"sqlite:///{path}?max_attempts=3&busy_timeout=0.5"
    db = backend.database
    if "checkpointer" in parts:
        backend.checkpointer = parts["checkpointer"](db)
    if "leases" in parts:
        backend.leases = parts["leases"](db)
    if "outbox" in parts:
        backend.outbox = parts["outbox"](db)
    if "consumer" in parts:
        backend.consumer = parts["consumer"](db, max_attempts=3)
    return backend


@dataclass(frozen=True)
class Case:
    """One broken store and the suite tests that must catch it."""

    bug: str
    store: str  # "memory" or "sqlite"
    parts: dict[str, type[Any]]
    tests: tuple[tuple[type[Any], str], ...]


S = suite
CASES = [
    Case(
        "no optimistic concurrency (last write wins)",
        "memory",
        {"checkpointer": LastWriteWinsCheckpointer},
        (
            (S.CheckpointerSuite, "test_create_over_existing_conflicts"),
            (S.CheckpointerSuite, "test_stale_update_conflicts"),
            (S.CheckpointerSuite, "test_update_of_missing_thread_conflicts"),
            (S.CheckpointerSuite, "test_failed_saves_leave_the_record_unchanged"),
            (S.ConcurrencySuite, "test_racing_updates_have_one_winner"),
        ),
    ),
    Case(
        "check-then-write race",
        "memory",
        {"checkpointer": RacyCheckpointer},
        (
            (S.ConcurrencySuite, "test_racing_updates_have_one_winner"),
            (S.ConcurrencySuite, "test_racing_creates_have_one_winner"),
            (S.ConcurrencySuite, "test_racing_updates_across_peers"),
        ),
    ),
    Case(
        "corrupted record read as a missing thread",
        "memory",
        {"checkpointer": CorruptIsMissingCheckpointer},
        ((S.CorruptionSuite, "test_load_of_corrupt_record_raises"),),
    ),
    Case(
        "thread ids truncated to 255 characters",
        "memory",
        {"checkpointer": TruncatingCheckpointer},
        (
            (S.ThreadIdSuite, "test_special_ids_round_trip"),
            (S.ThreadIdSuite, "test_special_ids_are_isolated"),
        ),
    ),
    Case(
        "history oldest first",
        "memory",
        {"checkpointer": OldestFirstCheckpointer},
        (
            (S.HistorySuite, "test_history_is_newest_first"),
            (S.HistorySuite, "test_history_limit"),
        ),
    ),
    Case(
        "prune keeps the oldest entries (the head goes)",
        "memory",
        {"checkpointer": PruneKeepsOldestCheckpointer},
        (
            (S.HistorySuite, "test_prune_zero_keeps_the_head"),
            (S.HistorySuite, "test_prune_keeps_the_newest"),
        ),
    ),
    Case(
        "fencing token restarts after release",
        "memory",
        {"leases": TokenResetLeases},
        (
            (S.LeaseSuite, "test_tokens_increase_across_release"),
            (S.LeaseSuite, "test_release_frees_the_thread"),
        ),
    ),
    Case(
        "re-entrant lease for the same owner",
        "memory",
        {"leases": ReentrantLeases},
        ((S.LeaseSuite, "test_same_owner_is_refused"),),
    ),
    Case(
        "holder() extends the lease",
        "memory",
        {"leases": SlidingHolderLeases},
        ((S.LeaseSuite, "test_holder_is_read_only"),),
    ),
    Case(
        "save ignores the lease (no fencing)",
        "memory",
        {"checkpointer": UnfencedCheckpointer},
        (
            (S.FencingSuite, "test_save_with_a_taken_over_lease_is_lost"),
            (S.FencingSuite, "test_save_without_lease_while_leased_is_busy"),
        ),
    ),
    Case(
        "outbox without visibility timeout",
        "memory",
        {"consumer": NoVisibilityConsumer},
        (
            (S.OutboxSuite, "test_claimed_message_is_hidden"),
            (S.ConcurrencySuite, "test_racing_claims_deliver_once"),
        ),
    ),
    Case(
        "dead-letter retry keeps the attempts",
        "memory",
        {"consumer": StickyAttemptsConsumer},
        ((S.OutboxSuite, "test_retry_dead_letter_resets_attempts"),),
    ),
    Case(
        "save_with_outbox commits the snapshot before the callback",
        "memory",
        {"checkpointer": NonAtomicOutboxCheckpointer},
        ((S.TransactionalOutboxSuite, "test_failing_callback_commits_nothing"),),
    ),
    Case(
        "a poison payload stalls every claim",
        "memory",
        {"consumer": StallingConsumer},
        ((S.OutboxSuite, "test_poison_payload_is_dead_lettered_and_the_rest_delivered"),),
    ),
    Case(
        "claim accepts a NaN visibility timeout",
        "memory",
        {"consumer": NaNClaimConsumer},
        ((S.ArgumentSuite, "test_bad_claim_and_release_arguments"),),
    ),
    Case(
        "a bad revision raises ValueError instead of TypeError",
        "memory",
        {"checkpointer": ValueErrorRevisionCheckpointer},
        ((S.ArgumentSuite, "test_bad_revisions"),),
    ),
    Case(
        "transactional saves lose updates under contention",
        "sqlite",
        {"checkpointer": LostUpdateSQLiteCheckpointer},
        ((S.ConcurrencySuite, "test_racing_transactional_saves_have_one_winner_and_one_message"),),
    ),
    Case(
        "a cancelled transactional save leaves its transaction open",
        "sqlite",
        {"checkpointer": OpenTransactionSQLiteCheckpointer},
        ((S.TransactionalOutboxSuite, "test_cancelled_save_commits_nothing_and_frees_the_store"),),
    ),
    Case(
        "an expired lease can still be released",
        "sqlite",
        {"leases": ExpiredReleaseSQLiteLeases},
        ((S.LeaseSuite, "test_release_of_an_expired_lease_is_lost"),),
    ),
    Case(
        "lease owners compared case-insensitively",
        "sqlite",
        {"leases": CaseInsensitiveSQLiteLeases},
        ((S.LeaseSuite, "test_owners_compare_exactly"),),
    ),
    Case(
        "fencing tokens counted on the lease record: release and delete reset them",
        "sqlite",
        {"leases": CountingSQLiteLeases},
        (
            (S.LeaseSuite, "test_tokens_increase_across_delete"),
            (S.LeaseSuite, "test_tokens_increase_across_release"),
        ),
    ),
    Case(
        "delete_if_idle refuses after the lease expired",
        "sqlite",
        {"checkpointer": StubbornDeleteSQLiteCheckpointer},
        ((S.FencingSuite, "test_delete_if_idle_after_the_lease_expired"),),
    ),
    Case(
        "an ack removes the other messages of the thread",
        "sqlite",
        {"consumer": AckByThreadSQLiteConsumer},
        ((S.OutboxSuite, "test_ack_removes_only_that_message"),),
    ),
    Case(
        "forged message ids ack real messages",
        "sqlite",
        {"consumer": LenientIdSQLiteConsumer},
        ((S.OutboxSuite, "test_unknown_message_ids_are_left_alone"),),
    ),
    Case(
        "a re-enqueue resets the live message",
        "sqlite",
        {"outbox": ResettingSQLiteOutbox},
        ((S.OutboxSuite, "test_enqueue_again_leaves_a_live_message_as_it_is"),),
    ),
    Case(
        "timers listed before they are due",
        "memory",
        {"checkpointer": AllTimersCheckpointer},
        ((S.TimerSuite, "test_only_due_timers_are_listed"),),
    ),
    Case(
        "a head that moves on stays in the timer index",
        "memory",
        {"checkpointer": StaleTimerCheckpointer},
        ((S.TimerSuite, "test_a_head_that_moves_on_leaves_the_index"),),
    ),
    Case(
        "signal ids not deduplicated",
        "memory",
        {"checkpointer": RepeatedSignalCheckpointer},
        (
            (S.SignalSuite, "test_a_repeated_signal_id_is_stored_once"),
            (S.WaitSuite, "test_a_repeated_signal_is_delivered_once"),
        ),
    ),
    Case(
        "a deleted thread keeps its inbox",
        "memory",
        {"checkpointer": KeptInboxCheckpointer},
        ((S.SignalSuite, "test_delete_empties_the_inbox"),),
    ),
    Case(
        "listings without the heads' graph versions",
        "memory",
        {"checkpointer": VersionlessListingCheckpointer},
        (
            (S.LineageSuite, "test_listings_report_the_heads_graph_version"),
            (S.VersionSuite, "test_snapshots_name_the_graph_version"),
        ),
    ),
    Case(
        "the backlog leaves out the messages in flight",
        "memory",
        {"consumer": VisibleOnlyStatsConsumer},
        (
            (S.BacklogSuite, "test_pending_counts_live_messages_claimed_or_not"),
            (S.BacklogSuite, "test_oldest_pending_is_the_first_enqueued_and_not_acked"),
        ),
    ),
    Case(
        "threads that moved on stay in the index of parked threads",
        "memory",
        {"checkpointer": StaleParkedIndexCheckpointer},
        ((S.BacklogSuite, "test_oldest_heads_follow_threads_that_move_on_or_go"),),
    ),
    Case(
        "the journal keeps an activity's first entry (outcomes are lost)",
        "sqlite",
        {"checkpointer": FirstWriteJournalSQLiteCheckpointer},
        (
            (S.JournalSuite, "test_put_get_and_replace"),
            (S.ActivitySuite, "test_a_rerun_node_gets_the_recorded_result"),
        ),
    ),
    Case(
        "signal numbers read before the write (racing senders share one)",
        "sqlite",
        {"checkpointer": RacySignalSQLiteCheckpointer},
        ((S.SignalSuite, "test_racing_senders_get_distinct_numbers"),),
    ),
    Case(
        "a fork gets a copy of its parent's inbox",
        "memory",
        {"checkpointer": InheritedInboxCheckpointer},
        ((S.ForkSuite, "test_a_fork_starts_with_an_inbox_of_its_own"),),
    ),
    Case(
        "journal entries written behind (a started call is stored after it ran)",
        "memory",
        {"checkpointer": WriteBehindJournalCheckpointer},
        ((S.ActivitySuite, "test_the_started_entry_is_durable_before_the_call"),),
    ),
    Case(
        "wake-up times read back in milliseconds (every wait overdue)",
        "memory",
        {"checkpointer": MillisecondWakeCheckpointer},
        (
            (S.WaitSuite, "test_only_a_due_deadline_takes_the_timeout_route"),
            (S.TimerSuite, "test_wake_at_round_trips_with_the_head"),
        ),
    ),
    Case(
        "list_threads pages from after included",
        "memory",
        {"checkpointer": InclusiveAfterCheckpointer},
        ((S.HistorySuite, "test_list_threads_after_excludes_that_thread"),),
    ),
    Case(
        "a dead letter written again comes back with its old payload",
        "memory",
        {"outbox": StalePayloadOutbox},
        ((S.OutboxSuite, "test_enqueue_again_revives_only_a_dead_letter"),),
    ),
    Case(
        "a dead letter written again comes back under a new message id",
        "memory",
        {"outbox": NewIdReviveOutbox},
        ((S.OutboxSuite, "test_enqueue_again_revives_only_a_dead_letter"),),
    ),
    Case(
        "a deleted thread keeps its signal ids",
        "memory",
        {"checkpointer": KeptSignalIdsCheckpointer},
        ((S.SignalSuite, "test_delete_resets_the_signal_ids"),),
    ),
    Case(
        "an ack deletes a dead letter of the same id",
        "sqlite",
        {"consumer": DeadAckSQLiteConsumer},
        ((S.OutboxSuite, "test_an_ack_never_removes_a_dead_letter"),),
    ),
    Case(
        "a late release revives a dead letter",
        "sqlite",
        {"consumer": DeadReleaseSQLiteConsumer},
        ((S.OutboxSuite, "test_a_release_of_a_dead_letter_changes_nothing"),),
    ),
    Case(
        "the inbox limit is ignored (a thread's inbox grows without end)",
        "memory",
        {"checkpointer": UnboundedInboxCheckpointer},
        ((S.LimitsSuite, "test_pending_signals"),),
    ),
    Case(
        "a prune touches other threads",
        "sqlite",
        {"checkpointer": PruneEverywhereSQLiteCheckpointer},
        ((S.HistorySuite, "test_prune_touches_only_its_thread"),),
    ),
    Case(
        "a head read through the whole history",
        "memory",
        {"checkpointer": HeadFromHistoryCheckpointer},
        ((S.CostSuite, "test_load_reads_the_same_for_a_long_history"),),
    ),
    Case(
        "due timers found by paging through every head",
        "memory",
        {"checkpointer": ScannedTimersCheckpointer},
        ((S.CostSuite, "test_due_timers_read_the_same_for_many_waiting_threads"),),
    ),
    Case(
        "a claim that takes the whole backlog and gives back the rest",
        "memory",
        {"consumer": GreedyClaimConsumer},
        ((S.CostSuite, "test_claim_reads_the_same_for_a_long_backlog"),),
    ),
    Case(
        "claims to keep timers and signals (its capabilities) but keeps none",
        "memory",
        {"backend": ClaimsTimersBackend, "checkpointer": TimerlessCheckpointer},
        (
            (S.TimerSuite, "test_due_timers_soonest_first"),
            (S.SignalSuite, "test_signals_are_numbered_in_order"),
            (S.WaitSuite, "test_sleep_waits_then_a_worker_wakes_it"),
        ),
    ),
    Case(
        "a progress channel that keeps only the newest of the events sent together",
        "memory",
        {"backend": ConflatingChannelBackend},
        (
            (S.WatchSuite, "test_progress_of_a_run_in_this_process"),
            (S.WatchSuite, "test_progress_reaches_a_watcher_on_another_connection"),
        ),
    ),
    Case(
        "a canceled head keeps the timer of the wait it replaced",
        "memory",
        {"checkpointer": RunningClearsTimerCheckpointer},
        ((S.CancelSuite, "test_cancel_a_waiting_thread_drops_its_timer_and_keeps_its_signals"),),
    ),
    Case(
        "list_threads reads every head and filters in Python",
        "sqlite",
        {"checkpointer": ScanningListSQLiteCheckpointer},
        ((S.CostSuite, "test_list_threads_page_reads_the_same_for_many_threads"),),
    ),
    Case(
        "a schedule's claim ignores its version (two workers claim one tick)",
        "memory",
        {"schedules": BlindReplaceSchedules},
        ((S.ScheduleSuite, "test_a_stale_claim_is_refused"),),
    ),
    Case(
        "a queue's claim counts no global or worker concurrency",
        "memory",
        {"consumer": UncountedQueueConsumer},
        (
            (S.QueueSuite, "test_a_claim_that_runs_out_gives_its_slot_back"),
            (S.QueueSuite, "test_worker_concurrency_counts_what_the_caller_holds"),
            (S.QueueSuite, "test_a_limit_changed_live_takes_effect_on_the_next_claim"),
            (S.QueueSuite, "test_ack_and_release_give_slots_back_and_a_delay_holds_none"),
        ),
    ),
    Case(
        "a full partition blocks the messages behind it",
        "memory",
        {"consumer": BlockedByPartitionConsumer},
        ((S.QueueSuite, "test_a_full_partition_does_not_block_the_others"),),
    ),
    Case(
        "a message released with a delay holds its queue's slot",
        "sqlite",
        {"consumer": HiddenInFlightSQLiteConsumer},
        ((S.QueueSuite, "test_ack_and_release_give_slots_back_and_a_delay_holds_none"),),
    ),
    Case(
        "a queue ignores priorities",
        "memory",
        {"consumer": FifoOnlyQueueConsumer},
        ((S.QueueSuite, "test_lower_priority_numbers_go_first_then_fifo"),),
    ),
    Case(
        "a save that reads the head before its conditional write",
        "memory",
        {"checkpointer": ReadBeforeWriteCheckpointer},
        (
            (S.RoundTripSuite, "test_a_save_is_its_declared_round_trips_fenced_or_not"),
            (
                S.RoundTripSuite,
                "test_a_leased_start_of_n_steps_is_n_saves_and_the_segments_round_trips",
            ),
            (
                S.RoundTripSuite,
                "test_a_hand_off_a_worker_continues_is_its_saves_and_the_hand_offs_round_trips",
            ),
        ),
    ),
    Case(
        "the save that ends a leased segment releases the lease in a second call",
        "memory",
        {"checkpointer": ReleaseAfterWriteCheckpointer},
        (
            (
                S.RoundTripSuite,
                "test_a_leased_start_of_n_steps_is_n_saves_and_the_segments_round_trips",
            ),
            (S.RoundTripSuite, "test_a_leased_resume_is_its_saves_and_the_segments_round_trips"),
        ),
    ),
    Case(
        "a leased segment takes its lease and reads the head in two calls",
        "memory",
        {"checkpointer": LoadAfterAcquireCheckpointer},
        (
            (
                S.RoundTripSuite,
                "test_a_leased_start_of_n_steps_is_n_saves_and_the_segments_round_trips",
            ),
            (S.AcquireAndLoadSuite, "test_a_leased_segment_starts_with_one_call"),
        ),
    ),
    Case(
        "taking the lease and reading the head misses a save that lands in between",
        "memory",
        {"checkpointer": HeadBeforeLeaseCheckpointer},
        (
            (
                S.AcquireAndLoadSuite,
                "test_racing_takers_read_the_save_of_the_lease_before_theirs",
            ),
        ),
    ),
    Case(
        "the save that ends a leased segment keeps the lease it says it releases",
        "memory",
        {"checkpointer": KeepsLeaseOnReleaseCheckpointer},
        (
            (S.ReleasingSaveSuite, "test_a_releasing_save_writes_and_gives_the_lease_up"),
            (S.ReleasingSaveSuite, "test_a_leased_segment_releases_in_its_last_save"),
            (
                S.RoundTripSuite,
                "test_a_leased_start_of_n_steps_is_n_saves_and_the_segments_round_trips",
            ),
        ),
    ),
    Case(
        "the save that ends a resumed run keeps the message it says it acknowledges",
        "sqlite",
        {"checkpointer": KeepsMessageOnAckSQLiteCheckpointer},
        (
            (S.AckingSaveSuite, "test_an_acking_save_writes_releases_and_removes_the_message"),
            (S.AckingSaveSuite, "test_a_worker_acknowledges_in_the_last_save_of_the_run"),
        ),
    ),
    Case(
        "an acking save removes its message before it knows the save is written",
        "sqlite",
        {"checkpointer": AcksBeforeWriteSQLiteCheckpointer},
        ((S.AckingSaveSuite, "test_a_refused_acking_save_keeps_the_message"),),
    ),
    Case(
        "an acking save removes every message of the outbox",
        "sqlite",
        {"checkpointer": AcksEveryMessageSQLiteCheckpointer},
        ((S.AckingSaveSuite, "test_an_acking_save_leaves_the_other_messages"),),
    ),
    Case(
        "the recency index is written at a thread's first save only",
        "sqlite",
        {"checkpointer": StaleRecencySQLiteCheckpointer},
        ((S.RecentThreadsSuite, "test_a_save_in_a_new_second_moves_the_thread"),),
    ),
    Case(
        "recent threads of one second in ascending id order",
        "sqlite",
        {"checkpointer": AscendingIdsRecencySQLiteCheckpointer},
        (
            (S.RecentThreadsSuite, "test_orders_by_second_then_thread_id"),
            (S.RecentThreadsSuite, "test_thread_ids_compare_by_code_point"),
            (S.RecentThreadsSuite, "test_pages_return_each_thread_once"),
        ),
    ),
]


async def _open(case_store: str, parts: dict[str, type[Any]], tmp_path: Path) -> Any:
    if case_store == "memory":
        return await memory_with(**parts)
    return await sqlite_with(tmp_path / f"{uuid.uuid4().hex}.db", **parts).open()


async def _outcome(cls: type[Any], name: str, backend: Any) -> BaseException | None:
    """Run one suite test; the exception it failed with, or ``None`` if it passed."""
    test: SuiteTest = getattr(cls(), name)
    kwargs: dict[str, Any] = {"flowy_backend": backend}
    if "flowy_corrupt" in inspect.signature(test).parameters:
        kwargs["flowy_corrupt"] = corrupt_head
    try:
        skip_unless_capable(cls, backend)  # what the suite's autouse fixture does
        await asyncio.wait_for(test(**kwargs), 60)
    except pytest.skip.Exception as exc:
        pytest.fail(f"the suite test skipped instead of running: {exc}")
    except (Exception, pytest.fail.Exception) as exc:  # noqa: BLE001 - any failure of a suite test is the outcome
        return exc
    return None


@pytest.mark.parametrize(
    ("case", "cls", "name"),
    [
        pytest.param(case, cls, name, id=f"{case.bug}-{cls.__name__}.{name}")
        for case in CASES
        for cls, name in case.tests
    ],
)
async def test_broken_store_fails_the_suite(
    case: Case, cls: type[Any], name: str, tmp_path: Path
) -> None:
    backend = await _open(case.store, case.parts, tmp_path)
    try:
        error = await _outcome(cls, name, backend)
    finally:
        await backend.aclose()
    assert error is not None, f"{cls.__name__}.{name} passed against a store with: {case.bug}"


@pytest.mark.parametrize(
    ("store", "cls", "name"),
    sorted({(case.store, cls, name) for case in CASES for cls, name in case.tests}, key=repr),
    ids=lambda v: v.__name__ if isinstance(v, type) else str(v),
)
async def test_same_tests_pass_on_the_unbroken_store(
    store: str, cls: type[Any], name: str, tmp_path: Path
) -> None:
    """Control: the tests above fail because of the bug, not on their own."""
    backend = await _open(store, {}, tmp_path)
    try:
        error = await _outcome(cls, name, backend)
    finally:
        await backend.aclose()
    assert error is None, f"{cls.__name__}.{name} fails on the {store} store: {error!r}"


async def test_racy_store_passes_sequential_tests() -> None:
    """Only the concurrency tests can see a check-then-write race."""
    backend = await memory_with(checkpointer=RacyCheckpointer)
    for name in ("test_stale_update_conflicts", "test_create_over_existing_conflicts"):
        assert await _outcome(S.CheckpointerSuite, name, backend) is None


def test_the_broken_store_count() -> None:
    """How many broken stores the suite catches (quoted in the docs)."""
    assert len(CASES) == 67
    assert len({case.bug for case in CASES}) == len(CASES)


_CONFTEST = """
import uuid

import pytest

from flowy import connect
from flowy.memory import MemoryCheckpointer


class LastWriteWins(MemoryCheckpointer):
    async def _write(self, write):
        thread = self.store.threads.get(write.thread_id)
        head = thread.head if thread else 0
        from dataclasses import replace
        return await super()._write(replace(write, expected_revision=head))


@pytest.fixture
def flowy_url():
    return f"memory://adapter-{uuid.uuid4().hex}"


@pytest.fixture
async def flowy_backend(flowy_url):
    backend = await connect(flowy_url)
    backend.checkpointer = LastWriteWins(backend.store)
    yield backend
    await backend.aclose()
"""

_TEST_MODULE = """
from flowy.testing import suite
from flowy.testing.suite import *  # noqa: F403


class HistorySuite(suite.HistorySuite):
    async def test_history_limit_zero_is_empty(self, flowy_backend):
        assert type(flowy_backend.checkpointer).__name__ == "LastWriteWins"
"""


def test_suite_runs_through_pytest_like_a_store(tmp_path: Path) -> None:
    """A store's opt-in (``import *``, one fixture, one override) through real pytest:
    a broken store fails, a missing corruption hook skips with its reason, and the
    subclass replaces the one test without running the original."""
    (tmp_path / "pytest.ini").write_text("[pytest]\nfilterwarnings = error\n")
    (tmp_path / "conftest.py").write_text(textwrap.dedent(_CONFTEST))
    (tmp_path / "test_store.py").write_text(textwrap.dedent(_TEST_MODULE))
    report = tmp_path / "report.xml"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "flowy.testing.plugin",
            "-p",
            "no:cacheprovider",
            "-q",
            "-rs",
            f"--junitxml={report}",
            "test_store.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        # A store's own run, where a missing hook skips (CI's "every backend required"
        # mode turns skips into failures: not what this store's authors would run).
        env={k: v for k, v in os.environ.items() if k != "FLOWY_REQUIRE_BACKENDS"},
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    outcomes: dict[str, str] = {}
    messages: dict[str, str] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        key = f"{case.get('classname', '').rsplit('.', 1)[-1]}.{case.get('name', '')}"
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = child.tag
                messages[key] = child.get("message", "")
        outcomes[key] = outcome
    param = "[asyncio]"
    for name in (
        "test_create_over_existing_conflicts",
        "test_stale_update_conflicts",
        "test_update_of_missing_thread_conflicts",
    ):
        assert outcomes[f"CheckpointerSuite.{name}{param}"] == "failure", name
    assert outcomes[f"CheckpointerSuite.test_load_round_trips_every_field{param}"] == "passed"
    assert outcomes[f"LeaseSuite.test_acquire_returns_a_live_lease{param}"] == "passed"
    skipped = f"CorruptionSuite.test_load_of_corrupt_record_raises{param}"
    assert outcomes[skipped] == "skipped"
    assert "no flowy_corrupt fixture" in messages[skipped]
    overridden = f"HistorySuite.test_history_limit_zero_is_empty{param}"
    assert outcomes[overridden] == "passed"
    assert sum(1 for key in outcomes if key.startswith("HistorySuite.")) == len(
        [n for n in dir(suite.HistorySuite) if n.startswith("test_")]
    )


class SelfScratchBackend(MemoryBackend[Any]):
    """A store whose scratch store is itself: the bug a tool that writes test data must
    never have."""

    def scratch_url(self, name: str) -> str | None:
        return self.url

    async def _drop_scratch(self) -> None:
        return None


async def _open_self_scratch(url: StoreURL, *, codec: Any) -> SelfScratchBackend:
    store = memory_named.setdefault(url.netloc, MemoryStore())
    return SelfScratchBackend(store, codec=codec, max_attempts=3, url=url.raw)


register_backend("selfscratch", _open_self_scratch)


async def _dump_self_scratch(url: str) -> object:
    return await dump_store("memory://" + urllib.parse.urlsplit(url).netloc)


@pytest.mark.parametrize("broken", [True, False], ids=["scratch-is-itself", "control"])
async def test_a_store_whose_scratch_store_is_itself_fails_the_scratch_suite(
    broken: bool,
) -> None:
    name = f"scratch-{uuid.uuid4().hex}"
    url = f"selfscratch://{name}" if broken else f"memory://{name}?max_attempts=3"
    backend = await connect(url)
    try:
        test = S.ScratchSuite().test_a_check_leaves_the_store_it_ran_on_as_it_was
        try:
            await test(flowy_url=url, flowy_backend=backend, flowy_dump=_dump_self_scratch)
        except (Exception, pytest.fail.Exception) as exc:  # noqa: BLE001 - the outcome
            error: BaseException | None = exc
        else:
            error = None
    finally:
        await backend.aclose()
    assert (error is not None) is broken, error


class SetUpOnceBackend(MemoryBackend[Any]):
    """A store whose setup() is not idempotent: the second call fails."""

    async def _setup(self) -> int:
        if self.store in _set_up:
            raise StorageError("the store is set up already")
        _set_up.append(self.store)
        return 1

    def scratch_url(self, name: str) -> str | None:
        return f"setuponce://{name}"


_set_up: list[MemoryStore] = []


async def _open_set_up_once(url: StoreURL, *, codec: Any) -> SetUpOnceBackend:
    store = memory_named.setdefault(url.netloc, MemoryStore())
    return SetUpOnceBackend(store, codec=codec, max_attempts=3, url=url.raw)


register_backend("setuponce", _open_set_up_once)


@pytest.mark.parametrize("broken", [True, False], ids=["setup-once", "control"])
async def test_a_store_whose_setup_is_not_idempotent_fails_the_setup_suite(
    broken: bool,
) -> None:
    name = f"setup-{uuid.uuid4().hex}"
    url = f"setuponce://{name}" if broken else f"memory://{name}?max_attempts=3"
    test = S.SetupSuite().test_setup_twice_on_a_fresh_store_then_it_works
    try:
        await test(flowy_url=url)
    except StorageError as exc:
        error: StorageError | None = exc
    else:
        error = None
    assert (error is not None) is broken, error
    assert error is None or "set up already" in str(error)


def test_every_suite_class_is_exported() -> None:
    """``flowy.testing.suite`` re-exports every suite class of every suite module, so
    ``import *`` runs all of them."""
    from flowy.testing.suite._support import Suite

    defined: set[str] = set()
    for info in pkgutil.iter_modules(suite.__path__):
        module = importlib.import_module(f"{suite.__name__}.{info.name}")
        defined |= {
            name
            for name, value in vars(module).items()
            if isinstance(value, type)
            and issubclass(value, Suite)
            and value is not Suite
            and value.__module__ == module.__name__
        }
    assert sorted(defined) == sorted(suite.__all__)
    assert all(getattr(suite, name).__test__ is True for name in suite.__all__)


async def test_a_store_without_a_capability_skips_what_tests_it() -> None:
    """A class whose capability the store lacks is skipped with the reason (and a test
    of a class that tests more, on its own); the rest runs."""
    backend = await memory_with(checkpointer=TimerlessCheckpointer)
    try:
        assert backend.capabilities.missing() == ("durable_timers_signals",)
        for cls in (S.TimerSuite, S.SignalSuite, S.WaitSuite):
            with pytest.raises(pytest.skip.Exception, match=r"durable_timers_signals.*does not"):
                skip_unless_capable(cls, backend)
        skip_unless_capable(S.JournalSuite, backend)  # journal kept: not skipped
        with pytest.raises(pytest.skip.Exception, match="durable_timers_signals"):
            await S.LimitsSuite().test_signal_payload(flowy_backend=backend)
        assert await _outcome(S.JournalSuite, "test_put_get_and_replace", backend) is None
    finally:
        await backend.aclose()


_TIMERLESS_CONFTEST = """
import uuid

import pytest

from flowy import connect
from flowy.memory import MemoryCheckpointer
from flowy.storage.dialect import BaseCheckpointer


class Timerless(MemoryCheckpointer):
    _timers = BaseCheckpointer._timers
    _append_signal = BaseCheckpointer._append_signal
    _read_signals = BaseCheckpointer._read_signals


@pytest.fixture
def flowy_url():
    return f"memory://timerless-{uuid.uuid4().hex}"


@pytest.fixture
async def flowy_backend(flowy_url):
    backend = await connect(flowy_url)
    backend.checkpointer = Timerless(backend.store)
    yield backend
    await backend.aclose()
"""


def test_suite_skips_the_classes_of_a_missing_capability_through_pytest(tmp_path: Path) -> None:
    """Through real pytest (the suite's autouse fixture): every test of a class that
    tests a capability the store lacks is skipped with the reason; other classes run."""
    (tmp_path / "pytest.ini").write_text("[pytest]\nfilterwarnings = error\n")
    (tmp_path / "conftest.py").write_text(textwrap.dedent(_TIMERLESS_CONFTEST))
    (tmp_path / "test_store.py").write_text("from flowy.testing.suite import *  # noqa: F403\n")
    report = tmp_path / "report.xml"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "flowy.testing.plugin",
            "-p",
            "no:cacheprovider",
            "-q",
            f"--junitxml={report}",
            "-k",
            "TimerSuite or JournalSuite",
            "test_store.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    outcomes: dict[str, tuple[str, str]] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        key = f"{case.get('classname', '').rsplit('.', 1)[-1]}.{case.get('name', '')}"
        skipped = [child for child in case if child.tag == "skipped"]
        outcomes[key] = ("skipped", skipped[0].get("message", "")) if skipped else ("passed", "")
    timer_tests = [n for n in dir(suite.TimerSuite) if n.startswith("test_")]
    journal_tests = [n for n in dir(suite.JournalSuite) if n.startswith("test_")]
    for name in timer_tests:
        outcome, message = outcomes[f"TimerSuite.{name}[asyncio]"]
        assert outcome == "skipped", name
        assert "TimerSuite tests durable_timers_signals" in message, message
    for name in journal_tests:
        assert outcomes[f"JournalSuite.{name}[asyncio]"] == ("passed", ""), name
