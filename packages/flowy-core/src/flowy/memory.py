"""The in-memory store: the reference implementation of every storage contract.

``flowy.connect("memory://")`` opens a new, private store; ``memory://NAME`` opens the
store called ``NAME`` in this process (created on first use), so several runners and
workers of one process can share it. Records are stored encoded, so envelope and codec
rules hold exactly as in durable stores. Everything lives in this process's memory and
is gone when it exits: for development and tests.
"""

from __future__ import annotations

import bisect
import itertools
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Generic

from ._types import S
from .storage import HandoffStatus, Lease, OutboxStats, RunStatus, StateCodec, ThreadSummary, Timer
from .storage._model import DEFAULT_QUEUE, DEFAULT_ROUTE, Route
from .storage._queues import NO_LIMITS, QueueLimits
from .storage._recent import RecentCursor, recent_second
from .storage._watch import HUB, Inbox
from .storage.dialect import (
    BaseBackend,
    BaseCheckpointer,
    BaseConsumer,
    BaseLeaseManager,
    BaseOutbox,
    BaseScheduleStore,
    Busy,
    OutboxRow,
    QueueCounts,
    RawMessage,
    Refused,
    RoundTrips,
    StoreURL,
    Wakeups,
    Write,
    next_fencing_token,
)

__all__ = [
    "MemoryBackend",
    "MemoryCheckpointer",
    "MemoryConsumer",
    "MemoryLeaseManager",
    "MemoryOutbox",
    "MemoryScheduleStore",
    "MemoryStore",
]

Clock = Callable[[], float]


@dataclass
class _Thread:
    head: int = 0
    summary: ThreadSummary | None = None
    history: dict[int, bytes] = field(default_factory=lambda: {})


@dataclass
class _Inbox:
    signals: list[bytes] = field(default_factory=lambda: [])  # signal n is signals[n - 1]
    ids: dict[str, int] = field(default_factory=lambda: {})


@dataclass
class _Message:
    message_id: str
    thread_id: str
    committed_revision: int
    payload: bytes
    attempts: int = 0
    visible_at: float = 0.0
    error: str = ""
    enqueued_at: float = 0.0
    route: Route = DEFAULT_ROUTE
    seq: int = 0  # the claim order within a priority: enqueue order
    claimed_until: float = 0.0  # in flight until then (0: not in flight)

    def in_flight(self, now: float) -> bool:
        return self.claimed_until > now


class MemoryStore:
    """The data of one in-memory store, shared by its components.

    Args:
        clock: the time source of leases and outbox visibility, in seconds since the
            epoch.
    """

    def __init__(self, *, clock: Clock = time.time) -> None:
        self.clock = clock
        self.threads: dict[str, _Thread] = {}
        self.thread_ids: list[str] = []  # the keys of ``threads``, sorted: pages by id
        self.leases: dict[str, Lease] = {}
        self.timers: list[tuple[float, str]] = []  # (wake_at, thread id), sorted
        self.recent: list[tuple[int, str]] = []  # (save second, thread id), sorted
        self.inboxes: dict[str, _Inbox] = {}
        self.journals: dict[str, dict[str, bytes]] = {}
        self.messages: dict[str, _Message] = {}
        self.dead: dict[str, _Message] = {}
        self.schedules: dict[str, tuple[int, bytes]] = {}  # name -> (version, record)
        self.queue_limits: dict[str, QueueLimits] = {}
        self.starts: dict[str, list[tuple[float, str]]] = {}  # queue -> [(at, partition)]
        self.ids: itertools.count[int] = itertools.count(1)
        self.wakeups: Wakeups = Wakeups()
        """The consumers of this store waiting in ``claim(wait=...)``."""

    def set_timer(self, thread_id: str, old: float | None, new: float | None) -> None:
        """Move ``thread_id`` in the timer index from ``old`` to ``new`` (``None``: out)."""
        if old == new:
            return
        if old is not None:
            del self.timers[bisect.bisect_left(self.timers, (old, thread_id))]
        if new is not None:
            bisect.insort(self.timers, (new, thread_id))

    def set_recent(self, thread_id: str, old: float | None, new: float | None) -> None:
        """Move ``thread_id`` in the recency index from the second of ``old`` to that of
        ``new`` (``None``: out); nothing when both are in the same second."""
        before = None if old is None else recent_second(old)
        after = None if new is None else recent_second(new)
        if before == after:
            return
        if before is not None:
            del self.recent[bisect.bisect_left(self.recent, (before, thread_id))]
        if after is not None:
            bisect.insort(self.recent, (after, thread_id))

    def live_lease(self, thread_id: str) -> Lease | None:
        """The lease on ``thread_id`` if it has not expired."""
        lease = self.leases.get(thread_id)
        if lease is not None and lease.expires_at > self.clock():
            return lease
        return None

    def take_lease(self, thread_id: str, owner: str, ttl: float) -> Lease | Busy:
        """Take ``thread_id`` for ``owner`` for ``ttl`` seconds unless a live lease holds
        it (then ``Busy``)."""
        live = self.live_lease(thread_id)
        if live is not None:
            return Busy(live)
        expired = self.leases.get(thread_id)
        now = self.clock()
        token = next_fencing_token(expired.fencing_token if expired else None, now)
        lease = self.leases[thread_id] = Lease(thread_id, owner, token, now + ttl)
        return lease

    def notify(self) -> None:
        """Wake waiting consumers (of every event loop using this store)."""
        self.wakeups.notify()

    def append(self, row: OutboxRow) -> None:
        """Add the outbox ``row`` unless its (thread, revision) is there; revive a dead
        copy with the row's payload."""
        for entry in self.messages.values():
            if (
                entry.thread_id == row.thread_id
                and entry.committed_revision == row.committed_revision
            ):
                return
        for message_id, entry in list(self.dead.items()):
            if (
                entry.thread_id == row.thread_id
                and entry.committed_revision == row.committed_revision
            ):
                entry.payload = row.payload
                self.revive(message_id)
                return
        seq = next(self.ids)
        message_id = str(seq)
        self.messages[message_id] = _Message(
            message_id,
            row.thread_id,
            row.committed_revision,
            row.payload,
            enqueued_at=self.clock(),
            route=row.route,
            seq=seq,
        )
        self.notify()

    def revive(self, message_id: str) -> bool:
        """Bring the dead letter ``message_id`` back as a fresh message (attempts and
        error reset, enqueued now); ``False`` if there is no such dead letter."""
        entry = self.dead.pop(message_id, None)
        if entry is None:
            return False
        entry.attempts, entry.visible_at, entry.error = 0, 0.0, ""
        entry.enqueued_at, entry.claimed_until = self.clock(), 0.0  # its place stays
        self.messages[message_id] = entry
        self.notify()
        return True


class MemoryCheckpointer(BaseCheckpointer[S]):
    """The checkpointer of a :class:`MemoryStore` (native fencing, transactional).

    Components built without a store each get a private one; give them one store (or
    use :class:`MemoryBackend`) to fence and commit hand-offs together.

    Args:
        store: the store's data (a new, private :class:`MemoryStore` by default).
        codec: the state codec (JSON by default; a runner gives a typed graph's type).
    """

    def __init__(
        self, store: MemoryStore | None = None, *, codec: StateCodec[S] | None = None
    ) -> None:
        super().__init__(codec=codec)
        self.store: MemoryStore = store if store is not None else MemoryStore()
        self.domain: Hashable = self.store

    async def _write(self, write: Write) -> Refused | None:
        return self._apply(write)

    def _apply(self, write: Write) -> Refused | None:
        store = self.store
        thread = store.threads.get(write.thread_id)
        actual = thread.head if thread is not None else 0
        holder = store.live_lease(write.thread_id)
        lease = write.lease
        fenced = (
            holder is None
            if lease is None
            else holder is not None
            and holder.owner == lease.owner
            and holder.fencing_token == lease.fencing_token
        )
        if actual != write.expected_revision or not fenced:
            return Refused(actual, holder)
        if thread is None:
            thread = store.threads[write.thread_id] = _Thread()
            bisect.insort(store.thread_ids, write.thread_id)
        old = thread.summary
        store.set_timer(write.thread_id, old and old.wake_at, write.summary.wake_at)
        store.set_recent(write.thread_id, old and old.updated_at, write.summary.updated_at)
        thread.history[write.revision] = write.record
        thread.head = write.revision
        thread.summary = write.summary
        for row in write.outbox:
            store.append(row)
        if write.release:  # fenced above: the live lease is this write's
            del store.leases[write.thread_id]
        return None

    async def _write_release(self, write: Write) -> Refused | None:
        return self._apply(write)

    async def _write_ack(self, write: Write) -> Refused | None:
        refused = self._apply(write)
        if refused is None and write.ack is not None:
            self.store.messages.pop(write.ack, None)
        return refused

    async def _acquire_head(
        self, thread_id: str, owner: str, ttl: float
    ) -> tuple[Lease | Busy, tuple[int, bytes] | None]:
        got = self.store.take_lease(thread_id, owner, ttl)
        return got, self._head(thread_id)

    async def _read_head(self, thread_id: str) -> tuple[int, bytes] | None:
        return self._head(thread_id)

    def _head(self, thread_id: str) -> tuple[int, bytes] | None:
        thread = self.store.threads.get(thread_id)
        if thread is None or thread.head == 0:
            return None
        return thread.head, thread.history[thread.head]

    async def _read_history(self, thread_id: str, limit: int) -> list[tuple[int, bytes]]:
        thread = self.store.threads.get(thread_id)
        if thread is None:
            return []
        return [(r, thread.history[r]) for r in sorted(thread.history, reverse=True)[:limit]]

    async def _prune(self, thread_id: str, keep: int) -> None:
        thread = self.store.threads.get(thread_id)
        if thread is None:
            return
        kept = set(sorted(thread.history, reverse=True)[:keep]) | {thread.head}
        for revision in [r for r in thread.history if r not in kept]:
            del thread.history[revision]

    async def _delete(self, thread_id: str, *, if_idle: bool) -> Lease | None:
        holder = self.store.live_lease(thread_id)
        if if_idle and holder is not None:
            return holder
        thread = self.store.threads.pop(thread_id, None)
        if thread is not None:
            ids = self.store.thread_ids
            del ids[bisect.bisect_left(ids, thread_id)]
            if thread.summary is not None:
                self.store.set_timer(thread_id, thread.summary.wake_at, None)
                self.store.set_recent(thread_id, thread.summary.updated_at, None)
        self.store.inboxes.pop(thread_id, None)
        self.store.journals.pop(thread_id, None)
        if holder is None:
            self.store.leases.pop(thread_id, None)  # tokens go on from the clock
        return None

    async def _list_heads(
        self, statuses: frozenset[HandoffStatus] | None, limit: int, after: str | None
    ) -> list[ThreadSummary]:
        out: list[ThreadSummary] = []
        ids = self.store.thread_ids
        start = 0 if after is None else bisect.bisect_right(ids, after)
        for index in range(start, len(ids)):
            thread_id = ids[index]
            summary = self.store.threads[thread_id].summary
            if summary is None or (statuses is not None and summary.handoff_status not in statuses):
                continue
            out.append(summary)
            if len(out) >= limit:
                break
        return out

    async def _recent_heads(self, limit: int, before: RecentCursor | None) -> list[ThreadSummary]:
        recent = self.store.recent
        end = len(recent) if before is None else bisect.bisect_left(recent, before)
        out: list[ThreadSummary] = []
        for index in range(end - 1, max(end - limit, 0) - 1, -1):
            summary = self.store.threads[recent[index][1]].summary
            assert summary is not None
            out.append(summary)
        return out

    async def _oldest_heads(self, statuses: frozenset[RunStatus]) -> dict[RunStatus, float]:
        # A scan of the heads (the store is in this process's memory).
        oldest: dict[RunStatus, float] = {}
        for thread in self.store.threads.values():
            head = thread.summary
            if head is not None and head.status in statuses:
                oldest[head.status] = min(head.updated_at, oldest.get(head.status, head.updated_at))
        return oldest

    async def _timers(self, before: float, limit: int) -> list[Timer]:
        timers = self.store.timers
        end = bisect.bisect_right(timers, (before, "\U0010ffff" * 2))
        return [Timer(thread_id, at) for at, thread_id in timers[: min(end, limit)]]

    async def _append_signal(
        self, thread_id: str, signal_id: str, data: bytes, max_seq: int
    ) -> tuple[int, bool] | None:
        inbox = self.store.inboxes.setdefault(thread_id, _Inbox())
        seq = inbox.ids.get(signal_id)
        if seq is not None:
            return seq, False
        if len(inbox.signals) >= max_seq:
            return None
        inbox.signals.append(data)
        seq = inbox.ids[signal_id] = len(inbox.signals)
        return seq, True

    async def _read_signals(
        self, thread_id: str, after: int, limit: int
    ) -> list[tuple[int, bytes]]:
        inbox = self.store.inboxes.get(thread_id)
        if inbox is None:
            return []
        return [(after + 1 + i, d) for i, d in enumerate(inbox.signals[after : after + limit])]

    async def _put_activity(self, thread_id: str, key: str, data: bytes) -> None:
        self.store.journals.setdefault(thread_id, {})[key] = data

    async def _get_activity(self, thread_id: str, key: str) -> bytes | None:
        return self.store.journals.get(thread_id, {}).get(key)

    async def _list_activities(self, thread_id: str) -> list[bytes]:
        return list(self.store.journals.get(thread_id, {}).values())


class MemoryLeaseManager(BaseLeaseManager):
    """The lease manager of a :class:`MemoryStore` (leases protect nothing across
    processes: for development and tests).

    Args:
        store: the store's data (a new, private :class:`MemoryStore` by default).
    """

    def __init__(self, store: MemoryStore | None = None) -> None:
        self.store: MemoryStore = store if store is not None else MemoryStore()
        self.domain: Hashable = self.store

    async def _acquire(self, thread_id: str, owner: str, ttl: float) -> Lease | Busy:
        return self.store.take_lease(thread_id, owner, ttl)

    def _current(self, lease: Lease) -> bool:
        live = self.store.live_lease(lease.thread_id)
        return (
            live is not None
            and live.owner == lease.owner
            and live.fencing_token == lease.fencing_token
        )

    async def _renew(self, lease: Lease, ttl: float) -> Lease | None:
        if not self._current(lease):
            return None
        renewed = self.store.leases[lease.thread_id] = replace(
            self.store.leases[lease.thread_id], expires_at=self.store.clock() + ttl
        )
        return renewed

    async def _release(self, lease: Lease) -> bool:
        if not self._current(lease):
            return False
        del self.store.leases[lease.thread_id]
        return True

    async def _holder(self, thread_id: str) -> Lease | None:
        return self.store.live_lease(thread_id)


class MemoryOutbox(BaseOutbox):
    """The outbox of a :class:`MemoryStore`.

    Args:
        store: the store's data (a new, private :class:`MemoryStore` by default).
    """

    def __init__(self, store: MemoryStore | None = None) -> None:
        self.store: MemoryStore = store if store is not None else MemoryStore()
        self.domain: Hashable = self.store

    async def _append(self, row: OutboxRow) -> None:
        self.store.append(row)


class MemoryConsumer(BaseConsumer):
    """The outbox consumer of a :class:`MemoryStore`.

    Args:
        store: the store's data (a new, private :class:`MemoryStore` by default).
        max_attempts: deliveries of a message without an ack before it is
            dead-lettered.
    """

    def __init__(self, store: MemoryStore | None = None, *, max_attempts: int = 5) -> None:
        super().__init__(max_attempts=max_attempts)
        self.store: MemoryStore = store if store is not None else MemoryStore()
        self.domain: Hashable = self.store

    async def _claim(self, limit: int, visibility_timeout: float) -> list[RawMessage]:
        return await self._claim_queue(DEFAULT_QUEUE, limit, visibility_timeout, 0)

    async def _claim_queue(
        self, queue: str, limit: int, visibility_timeout: float, held: int
    ) -> list[RawMessage]:
        store = self.store
        now = store.clock()
        limits = store.queue_limits.get(queue, NO_LIMITS)
        mine = [m for m in store.messages.values() if m.route.queue == queue]
        flying: Counter[str] = Counter(m.route.partition_key for m in mine if m.in_flight(now))
        starts = self._starts(queue, limits, now)
        started: Counter[str] = Counter(partition for _, partition in starts)
        room = limit
        if limits.worker_concurrency is not None:
            room = min(room, limits.worker_concurrency - held)
        if limits.global_concurrency is not None:
            room = min(room, limits.global_concurrency - flying.total())
        if limits.rate_limit is not None:
            room = min(room, limits.rate_limit - len(starts))
        out: list[RawMessage] = []
        visible = sorted(
            (m for m in mine if m.visible_at <= now), key=lambda m: (m.route.priority, m.seq)
        )
        for entry in visible:
            if len(out) >= room:
                break
            key = entry.route.partition_key
            if key and limits.partition_full(flying[key], started[key]):
                continue
            flying[key] += 1
            started[key] += 1
            entry.attempts += 1
            entry.visible_at = entry.claimed_until = now + visibility_timeout
            if limits.rate_limited:
                starts.append((now, key))
            out.append(RawMessage(entry.message_id, entry.payload, entry.attempts, entry.error))
        return out

    def _starts(self, queue: str, limits: QueueLimits, now: float) -> list[tuple[float, str]]:
        """The queue's recorded starts within its rate window (older ones dropped)."""
        kept = [s for s in self.store.starts.get(queue, ()) if s[0] > now - limits.rate_period]
        if kept or limits.rate_limited:
            self.store.starts[queue] = kept
        else:
            self.store.starts.pop(queue, None)
        return kept

    async def _set_limits(self, queue: str, limits: QueueLimits | None) -> None:
        if limits is None:
            self.store.queue_limits.pop(queue, None)
        else:
            self.store.queue_limits[queue] = limits
        self.store.notify()  # a raised limit lets waiting claims take more

    async def _read_limits(self) -> dict[str, QueueLimits]:
        return dict(self.store.queue_limits)

    async def _queue_counts(self) -> dict[str, QueueCounts]:
        store = self.store
        now = store.clock()
        out: dict[str, QueueCounts] = {}
        names = {m.route.queue for m in store.messages.values()} | set(store.starts)
        for name in names:
            mine = [m for m in store.messages.values() if m.route.queue == name]
            waiting = [m.enqueued_at for m in mine if not m.in_flight(now)]
            limits = store.queue_limits.get(name, NO_LIMITS)
            started = len(self._starts(name, limits, now)) if limits.rate_limited else 0
            out[name] = QueueCounts(
                len(mine) - len(waiting), len(waiting), min(waiting, default=None), started
            )
        return out

    async def _queue_messages(self, queue: str, limit: int) -> list[RawMessage]:
        mine = sorted(
            (m for m in self.store.messages.values() if m.route.queue == queue),
            key=lambda m: (m.route.priority, m.seq),
        )
        return [RawMessage(m.message_id, m.payload, m.attempts, m.error) for m in mine[:limit]]

    async def _ack(self, message_id: str) -> None:
        self.store.messages.pop(message_id, None)

    async def _release(self, message_id: str, *, error: str, delay: float, dead: bool) -> None:
        entry = self.store.messages.get(message_id)
        if entry is None:
            return
        entry.error = error
        entry.claimed_until = 0.0
        if dead:
            self.store.dead[message_id] = self.store.messages.pop(message_id)
        else:
            entry.visible_at = self.store.clock() + delay
        self.store.notify()  # a slot of its queue is free again

    async def _dead_letters(self, limit: int) -> list[RawMessage]:
        return [
            RawMessage(e.message_id, e.payload, e.attempts, e.error)
            for e in list(self.store.dead.values())[:limit]
        ]

    async def _retry_dead_letter(self, message_id: str) -> bool:
        return self.store.revive(message_id)

    async def _stats(self) -> OutboxStats:
        messages = self.store.messages.values()
        oldest = min((m.enqueued_at for m in messages), default=None)
        return OutboxStats(len(messages), oldest, len(self.store.dead))

    async def _wait(self, seconds: float) -> None:
        await self.store.wakeups.wait(min(seconds, 1.0))

    def pending_count(self) -> int:
        """Messages not yet acked (claimed or not), dead letters excluded."""
        return len(self.store.messages)


class MemoryScheduleStore(BaseScheduleStore):
    """The schedules of a :class:`MemoryStore`.

    Args:
        store: the store's data (a new, private :class:`MemoryStore` by default).
    """

    def __init__(self, store: MemoryStore | None = None) -> None:
        self.store: MemoryStore = store if store is not None else MemoryStore()
        self.domain: Hashable = self.store

    def clock(self) -> float:
        """The store's clock (what ``create`` and ``resume`` read)."""
        return self.store.clock()

    async def _insert(self, name: str, data: bytes) -> bool:
        if name in self.store.schedules:
            return False
        self.store.schedules[name] = (1, data)
        return True

    async def _read(self, name: str) -> tuple[int, bytes] | None:
        return self.store.schedules.get(name)

    async def _read_all(self) -> list[tuple[str, int, bytes]]:
        return [(name, v, data) for name, (v, data) in self.store.schedules.items()]

    async def _replace(self, name: str, version: int, data: bytes) -> bool:
        found = self.store.schedules.get(name)
        if found is None or found[0] != version:
            return False
        self.store.schedules[name] = (version + 1, data)
        return True

    async def _delete(self, name: str) -> bool:
        return self.store.schedules.pop(name, None) is not None


class MemoryBackend(BaseBackend[S], Generic[S]):
    """An in-memory store: ``flowy.connect("memory://")``, or built directly.

    A leased segment takes its lease and reads the head in one call
    (``_acquire_head``); its last save releases the lease (``_write_release``).

    Args:
        store: the data to use (a new :class:`MemoryStore` by default).
        codec: the state codec (JSON by default; a runner gives a typed graph's type).
        max_attempts: deliveries of a hand-off message before it is dead-lettered.
        url: the URL the backend reports (``flowy.connect`` passes the one it opened).
    """

    round_trips: ClassVar[RoundTrips] = RoundTrips(segment=1, handoff=2)

    def __init__(
        self,
        store: MemoryStore | None = None,
        *,
        codec: StateCodec[S] | None = None,
        max_attempts: int = 5,
        url: str = "memory://",
    ) -> None:
        self.store: MemoryStore = store if store is not None else MemoryStore()
        self.url: str = url
        self.checkpointer: MemoryCheckpointer[S] = MemoryCheckpointer(self.store, codec=codec)
        self.leases: MemoryLeaseManager = MemoryLeaseManager(self.store)
        self.outbox: MemoryOutbox = MemoryOutbox(self.store)
        self.consumer: MemoryConsumer = MemoryConsumer(self.store, max_attempts=max_attempts)
        self.schedules: MemoryScheduleStore = MemoryScheduleStore(self.store)

    async def _open(self) -> None:
        return None

    async def _setup(self) -> int:
        return 1

    async def _close(self) -> None:
        return None

    async def _publish(self, thread_id: str, messages: Sequence[bytes]) -> None:
        # The store lives in this process: its channel is the process's hub.
        for message in messages:
            HUB.deliver(self.store, thread_id, message)

    async def _subscribe(self, thread_id: str, inbox: Inbox) -> Callable[[], Awaitable[None]]:
        unsubscribe = HUB.subscribe(self.store, thread_id, inbox)

        async def stop() -> None:
            unsubscribe()

        return stop

    def scratch_url(self, name: str) -> str | None:
        """A new private store (``memory://``): nothing is shared with this one."""
        return "memory://"

    async def _drop_scratch(self) -> None:
        self.store = MemoryStore()  # a private store: nothing else refers to its data


_named: dict[str, MemoryStore] = {}

OPTIONS = {"max_attempts": "deliveries before a hand-off is dead-lettered (default 5)"}


async def open_backend(url: StoreURL, *, codec: StateCodec[Any] | None) -> MemoryBackend[Any]:
    """The opener of ``memory://`` (and ``memory://NAME`` for a store shared by name)."""
    url.check_options(OPTIONS)
    name = url.netloc + url.path.rstrip("/")
    store = _named.setdefault(name, MemoryStore()) if name else MemoryStore()
    return MemoryBackend(store, codec=codec, max_attempts=url.count("max_attempts", 5), url=url.raw)
