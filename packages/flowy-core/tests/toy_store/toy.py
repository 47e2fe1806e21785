"""A toy flowy store: plain dicts behind one ``asyncio.Lock``, written from ``docs/adapters.md``.

It is a worked example of the guide, not a store to use: it keeps everything in this
process and forgets it on exit. ``toy://NAME`` opens the store called NAME, shared by
every backend of this process that opens the same URL (peers); ``toy://`` opens a
private one. Options: ``max_attempts``.

Atomicity: every primitive runs inside ``ToyStore.atomic()``, which holds the store's
lock. Between what a primitive checks and what it writes it awaits
``ToyStore.round_trip()`` (``asyncio.sleep(0)``), as a real store awaits its database:
other tasks run there, and only the lock keeps them out of the store meanwhile. Without
it the conformance suite's races fail (two saves win on one revision, two acquires get
one thread).

Clock: leases and message visibility use this process's clock (``time.time``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Hashable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from flowy.errors import BackendURLError
from flowy.storage import HandoffStatus, Lease, OutboxStats, StateCodec, ThreadSummary, Timer
from flowy.storage.dialect import (
    BaseBackend,
    BaseCheckpointer,
    BaseConsumer,
    BaseLeaseManager,
    BaseOutbox,
    Busy,
    OutboxRow,
    RawMessage,
    Refused,
    StoreURL,
    Write,
)

S = TypeVar("S")


@dataclass
class ToyMessage:
    """One outbox message, live or dead-lettered."""

    message_id: str
    row: OutboxRow
    attempts: int = 0
    error: str = ""
    visible_at: float = 0.0
    dead: bool = False
    enqueued_at: float = field(default_factory=time.time)  # or when it came back from dead


@dataclass
class ToyStore:
    """The shared state of one store: what a database would hold."""

    heads: dict[str, ThreadSummary] = field(default_factory=lambda: {})
    history: dict[str, dict[int, bytes]] = field(default_factory=lambda: {})  # the head too
    tokens: dict[str, int] = field(default_factory=lambda: {})  # never reset
    leases: dict[str, Lease] = field(default_factory=lambda: {})  # may be expired
    messages: dict[str, ToyMessage] = field(default_factory=lambda: {})  # oldest first
    message_ids: dict[tuple[str, int], str] = field(default_factory=lambda: {})
    last_id: int = 0
    inboxes: dict[str, list[tuple[str, bytes]]] = field(default_factory=lambda: {})
    journals: dict[str, dict[str, bytes]] = field(default_factory=lambda: {})
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    @asynccontextmanager
    async def atomic(self) -> AsyncGenerator[float]:
        """Hold the lock for one primitive; yields the store's clock reading."""
        async with self.lock:
            yield time.time()

    @staticmethod
    async def round_trip() -> None:
        """Yield to the event loop, as awaiting a database would."""
        await asyncio.sleep(0)

    def live_lease(self, thread_id: str, now: float) -> Lease | None:
        lease = self.leases.get(thread_id)
        return lease if lease is not None and lease.expires_at > now else None

    def is_live(self, lease: Lease, now: float) -> bool:
        live = self.live_lease(lease.thread_id, now)
        return (
            live is not None
            and live.owner == lease.owner
            and live.fencing_token == lease.fencing_token
        )

    def append(self, row: OutboxRow) -> None:
        """Add ``row`` unless its (thread, committed revision) has a message already."""
        message_id = self.message_ids.get((row.thread_id, row.committed_revision))
        if message_id is None:
            self.last_id += 1
            message_id = str(self.last_id)
            self.message_ids[(row.thread_id, row.committed_revision)] = message_id
            self.messages[message_id] = ToyMessage(message_id, row)
        elif (message := self.messages[message_id]).dead:
            message.row, message.attempts, message.error = row, 0, ""
            message.visible_at, message.dead, message.enqueued_at = 0.0, False, time.time()
        else:
            return  # a live message is left exactly as it is
        # Wake every waiting consumer (asyncio wakes the waiters set() found, even if cleared).
        self.arrived.set()
        self.arrived.clear()

    def forget(self, message: ToyMessage) -> None:
        del self.messages[message.message_id]
        del self.message_ids[(message.row.thread_id, message.row.committed_revision)]


_STORES: dict[str, ToyStore] = {}
"""The named stores of this process (``toy://NAME``)."""


class ToyCheckpointer(BaseCheckpointer[S]):
    def __init__(self, backend: ToyBackend[S], *, codec: StateCodec[S] | None = None) -> None:
        super().__init__(codec=codec)
        self.store = backend.store
        self.domain = backend.domain

    async def _write(self, write: Write) -> Refused | None:
        async with self.store.atomic() as now:
            head = self.store.heads.get(write.thread_id)
            actual = 0 if head is None else head.revision
            live = self.store.live_lease(write.thread_id, now)
            leased_ok = (
                live is None if write.lease is None else self.store.is_live(write.lease, now)
            )
            if actual != write.expected_revision or not leased_ok:
                return Refused(actual, live)
            await self.store.round_trip()
            self.store.heads[write.thread_id] = write.summary
            self.store.history.setdefault(write.thread_id, {})[write.revision] = write.record
            for row in write.outbox:
                self.store.append(row)
            return None

    async def _read_head(self, thread_id: str) -> tuple[int, bytes] | None:
        async with self.store.atomic():
            head = self.store.heads.get(thread_id)
            if head is None:
                return None
            return head.revision, self.store.history[thread_id][head.revision]

    async def _read_history(self, thread_id: str, limit: int) -> list[tuple[int, bytes]]:
        async with self.store.atomic():
            entries = self.store.history.get(thread_id, {})
            return sorted(entries.items(), reverse=True)[:limit]

    async def _prune(self, thread_id: str, keep: int) -> None:
        async with self.store.atomic():
            entries = self.store.history.get(thread_id, {})
            await self.store.round_trip()
            for revision in sorted(entries, reverse=True)[keep:]:
                del entries[revision]  # the head is the newest entry: always kept

    async def _delete(self, thread_id: str, *, if_idle: bool) -> Lease | None:
        async with self.store.atomic() as now:
            live = self.store.live_lease(thread_id, now)
            if if_idle and live is not None:
                return live
            await self.store.round_trip()
            self.store.heads.pop(thread_id, None)
            self.store.history.pop(thread_id, None)
            self.store.inboxes.pop(thread_id, None)
            self.store.journals.pop(thread_id, None)
            return None  # self.store.tokens keeps counting

    async def _list_heads(
        self, statuses: frozenset[HandoffStatus] | None, limit: int, after: str | None
    ) -> list[ThreadSummary]:
        async with self.store.atomic():
            # A real store reads an index ordered by thread id; a toy sorts its keys.
            out: list[ThreadSummary] = []
            for thread_id in sorted(self.store.heads):
                head = self.store.heads[thread_id]
                if after is not None and thread_id <= after:
                    continue
                if statuses is not None and head.handoff_status not in statuses:
                    continue
                out.append(head)
                if len(out) == limit:
                    break
            return out

    async def _timers(self, before: float, limit: int) -> list[Timer]:
        async with self.store.atomic():
            # A real store reads an index of wake-up times; a toy sorts the heads.
            due = sorted(
                (head.wake_at, thread_id)
                for thread_id, head in self.store.heads.items()
                if head.wake_at is not None and head.wake_at <= before
            )
            return [Timer(thread_id, at) for at, thread_id in due[:limit]]

    async def _append_signal(
        self, thread_id: str, signal_id: str, data: bytes, max_seq: int
    ) -> tuple[int, bool] | None:
        async with self.store.atomic():
            inbox = self.store.inboxes.setdefault(thread_id, [])
            for seq, (stored_id, _) in enumerate(inbox, start=1):
                if stored_id == signal_id:
                    return seq, False
            if len(inbox) >= max_seq:
                return None
            await self.store.round_trip()
            inbox.append((signal_id, data))
            return len(inbox), True

    async def _read_signals(
        self, thread_id: str, after: int, limit: int
    ) -> list[tuple[int, bytes]]:
        async with self.store.atomic():
            inbox = self.store.inboxes.get(thread_id, [])
            return [(after + 1 + i, data) for i, (_, data) in enumerate(inbox[after:][:limit])]

    async def _put_activity(self, thread_id: str, key: str, data: bytes) -> None:
        async with self.store.atomic():
            self.store.journals.setdefault(thread_id, {})[key] = data

    async def _get_activity(self, thread_id: str, key: str) -> bytes | None:
        async with self.store.atomic():
            return self.store.journals.get(thread_id, {}).get(key)

    async def _list_activities(self, thread_id: str) -> list[bytes]:
        async with self.store.atomic():
            return list(self.store.journals.get(thread_id, {}).values())


class ToyLeaseManager(BaseLeaseManager):
    def __init__(self, backend: ToyBackend[Any]) -> None:
        self.store = backend.store
        self.domain = backend.domain

    async def _acquire(self, thread_id: str, owner: str, ttl: float) -> Lease | Busy:
        async with self.store.atomic() as now:
            live = self.store.live_lease(thread_id, now)
            if live is not None:
                return Busy(live)
            await self.store.round_trip()
            token = self.store.tokens.get(thread_id, 0) + 1
            self.store.tokens[thread_id] = token
            lease = Lease(thread_id, owner, token, now + ttl)
            self.store.leases[thread_id] = lease
            return lease

    async def _renew(self, lease: Lease, ttl: float) -> Lease | None:
        async with self.store.atomic() as now:
            if not self.store.is_live(lease, now):
                return None
            await self.store.round_trip()
            renewed = Lease(lease.thread_id, lease.owner, lease.fencing_token, now + ttl)
            self.store.leases[lease.thread_id] = renewed
            return renewed

    async def _release(self, lease: Lease) -> bool:
        async with self.store.atomic() as now:
            if not self.store.is_live(lease, now):
                return False
            await self.store.round_trip()
            del self.store.leases[lease.thread_id]
            return True

    async def _holder(self, thread_id: str) -> Lease | None:
        async with self.store.atomic() as now:
            return self.store.live_lease(thread_id, now)


class ToyOutbox(BaseOutbox):
    def __init__(self, backend: ToyBackend[Any]) -> None:
        self.store = backend.store
        self.domain = backend.domain

    async def _append(self, row: OutboxRow) -> None:
        async with self.store.atomic():
            await self.store.round_trip()
            self.store.append(row)


class ToyConsumer(BaseConsumer):
    def __init__(self, backend: ToyBackend[Any], *, max_attempts: int) -> None:
        super().__init__(max_attempts=max_attempts)
        self.store = backend.store
        self.domain = backend.domain

    async def _claim(self, limit: int, visibility_timeout: float) -> list[RawMessage]:
        async with self.store.atomic() as now:
            messages = self.store.messages.values()
            visible = [m for m in messages if not m.dead and m.visible_at <= now][:limit]
            await self.store.round_trip()
            for message in visible:
                message.attempts += 1
                message.visible_at = now + visibility_timeout
            return [RawMessage(m.message_id, m.row.payload, m.attempts, m.error) for m in visible]

    async def _ack(self, message_id: str) -> None:
        async with self.store.atomic():
            message = self.store.messages.get(message_id)
            if message is not None and not message.dead:
                await self.store.round_trip()
                self.store.forget(message)

    async def _release(self, message_id: str, *, error: str, delay: float, dead: bool) -> None:
        async with self.store.atomic() as now:
            message = self.store.messages.get(message_id)
            if message is None or message.dead:
                return
            await self.store.round_trip()
            message.error = error
            message.visible_at = now + delay
            message.dead = dead

    async def _dead_letters(self, limit: int) -> list[RawMessage]:
        async with self.store.atomic():
            dead = [m for m in self.store.messages.values() if m.dead][:limit]
            return [RawMessage(m.message_id, m.row.payload, m.attempts, m.error) for m in dead]

    async def _retry_dead_letter(self, message_id: str) -> bool:
        async with self.store.atomic() as now:
            message = self.store.messages.get(message_id)
            if message is None or not message.dead:
                return False
            await self.store.round_trip()
            message.attempts, message.error, message.visible_at = 0, "", 0.0
            message.dead, message.enqueued_at = False, now
            return True

    async def _stats(self) -> OutboxStats:
        # _oldest_heads is left to the base: a scan through _list_heads.
        async with self.store.atomic():
            live = [m for m in self.store.messages.values() if not m.dead]
            dead = len(self.store.messages) - len(live)
            return OutboxStats(len(live), min((m.enqueued_at for m in live), default=None), dead)

    async def _wait(self, seconds: float) -> None:
        # Wake up on an append; still look again every poll interval, since a hidden
        # message becomes visible without any append.
        try:
            await asyncio.wait_for(self.store.arrived.wait(), min(seconds, self.poll_interval))
        except TimeoutError:
            pass


class ToyBackend(BaseBackend[S]):
    def __init__(
        self,
        url: str,
        name: str,
        *,
        codec: StateCodec[S] | None = None,
        max_attempts: int = 5,
    ) -> None:
        self.url = url
        self.store = _STORES.setdefault(name, ToyStore()) if name else ToyStore()
        self.domain: Hashable = ("toy", name) if name else ("toy", id(self.store))
        self.checkpointer = ToyCheckpointer(self, codec=codec)
        self.leases = ToyLeaseManager(self)
        self.outbox = ToyOutbox(self)
        self.consumer = ToyConsumer(self, max_attempts=max_attempts)

    async def _open(self) -> None:
        pass  # nothing to connect to, no schema to create

    async def _setup(self) -> int:
        return 1

    async def _close(self) -> None:
        pass  # a named store outlives its backends, like a database


OPTIONS = {"max_attempts": "deliveries before a hand-off is dead-lettered (default 5)"}


async def open_backend(url: StoreURL, *, codec: StateCodec[Any] | None) -> ToyBackend[Any]:
    """The opener of ``toy://NAME``
    (``flowy.storage.dialect.register_backend("toy", open_backend)``)."""
    url.check_options(OPTIONS)
    if url.path not in ("", "/"):
        raise BackendURLError(f"{url.redacted!r}: a toy store is named toy://NAME, no path")
    return ToyBackend(url.raw, url.netloc, codec=codec, max_attempts=url.count("max_attempts", 5))
