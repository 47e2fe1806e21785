"""``RedisCheckpointer``: strict-OCC snapshots with native lease fencing and the
transactional outbox; every save is one Lua script (one round trip).
"""

from __future__ import annotations

import asyncio
import json
import math
import uuid
from collections.abc import Hashable
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from flowy.errors import SnapshotEnvelopeInvalidError
from flowy.storage import HandoffStatus, Lease, StateCodec, ThreadSummary, Timer
from flowy.storage.dialect import BaseCheckpointer, Busy, Refused, Write, recent_second, show_id

from ._keys import STATUS_DIGITS, ThreadKeys
from ._outbox import route_args
from ._scripts import (
    ACQUIRE_HEAD,
    ACTIVITY,
    DELETE,
    HEADS,
    HISTORY,
    LIST,
    PRUNE,
    RECENT,
    RECENT_FILL,
    RECENT_HEADS,
    SIGNAL,
    SIGNALS,
    TIMERS,
    save_script,
)
from ._store import Store

if TYPE_CHECKING:
    from ._outbox import RedisConsumer

__all__ = ["DEFAULT_MAX_RECORD_BYTES", "ClusterCheckpointer", "RedisCheckpointer", "lease_of"]

DEFAULT_MAX_RECORD_BYTES = 64 * 1024 * 1024
"""The largest encoded snapshot a save accepts by default (64 MiB)."""

_PRUNE_BATCH = 10_000
_FILL_PAGE = 500
"""Heads per script of the one-time fill of the recency index."""
_MAX_ASK = 1_000
"""The most index members a listing asks for at once beyond its limit."""
# The keys of a thread each script takes.
_HISTORY = attrgetter("head", "hist")
_LEASED_HEAD = attrgetter("lease", "head", "hist")
_CHECKPOINT = attrgetter("checkpoint")
_SIGNAL = attrgetter("inbox", "sigids", "head")
_JOURNAL = attrgetter("journal", "head")

S = TypeVar("S")


def score(seconds: float) -> str:
    """``seconds`` as a sorted-set score Redis parses back to the same double (``repr``
    is the shortest exact spelling)."""
    if math.isinf(seconds):
        return "+inf" if seconds > 0 else "-inf"
    return repr(float(seconds))


def lease_of(thread_id: str, owner: bytes, token: bytes, exp: bytes) -> Lease:
    """A lease from its stored fields (expiry in µs of the server's clock)."""
    return Lease(thread_id, owner.decode("utf-8", "replace"), int(token), int(exp) / 1e6)


class RedisCheckpointer(BaseCheckpointer[S], Generic[S]):
    """The checkpointer of a Redis store (standalone or Cluster).

    A save is one Lua script: it checks the lease (by the server's clock) and the
    revision, writes the head, the history entry and the head's wake-up time in its
    shard's timer index, and appends the hand-off messages of ``save_with_outbox`` to
    the thread's outbox shard, atomically; the last save of a leased segment also
    releases the lease and, for a run a ``Worker`` resumed, acknowledges the hand-off
    message it was resumed for as the consumer's ack does (``_write_ack``: the message
    lives in the thread's shard, so one script does both on Redis Cluster too). Threads
    saved ``completed`` or ``failed`` expire after ``completed_ttl`` seconds when it is
    set (with their signal inbox and activity journal). Appending a signal is one
    script (numbered by the inbox's length, once per signal id); the journal is a hash
    per thread. No index holds the heads by run status: ``oldest_heads`` is the base's
    scan of ``list_threads``' pages. On a standalone server a sorted set of the
    namespace scores each thread by its head's save second (``recent_threads``): a save
    writes it only when its second differs from the head's before, and threads saved
    before it existed get theirs once, on the first ``recent_threads`` of a process
    that finds the namespace not yet filled. A cluster has no such set (a save touches
    its own shard only): there ``recent_threads`` is the base's scan.
    """

    def __init__(
        self,
        store: Store,
        *,
        codec: StateCodec[S] | None = None,
        completed_ttl: float | None = None,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        consumer: RedisConsumer | None = None,
    ) -> None:
        super().__init__(codec=codec)
        self.store = store
        self.consumer: RedisConsumer | None = consumer
        """The consumer whose claimed messages an acking save acknowledges (its group and
        queue bookkeeping); ``RedisBackend`` gives its own."""
        self.domain: Hashable = store.domain
        self.completed_ttl = completed_ttl
        self.max_record_bytes: int | None = max_record_bytes
        ttl_ms = 0 if completed_ttl is None else max(1, round(completed_ttl * 1e3))
        # A standalone server keeps the recency index: every key is on one server, so a
        # save script may touch the namespace's one sorted set. A cluster cannot.
        self._recent = not store.cluster
        recent = self._recent
        self._save = save_script(ttl_ms, recent=recent)
        self._save_release = save_script(ttl_ms, release=True, recent=recent)
        self._save_ack = save_script(ttl_ms, release=True, ack=True, recent=recent)
        self._recent_filled = False

    async def _write(self, write: Write) -> Refused | None:
        return await self._run_save(write)

    async def _write_release(self, write: Write) -> Refused | None:
        return await self._run_save(write)  # the script releases the lease it fenced

    async def _write_ack(self, write: Write) -> Refused | None:
        return await self._run_save(write, self._ack_args(write))

    def _ack_args(self, write: Write) -> list[bytes | str] | None:
        """What the acking save script takes to acknowledge ``write.ack`` (the group, its
        entry id, the prefix of the queues' keys), or ``None`` when it names no message
        of this store: then the releasing save alone runs."""
        if write.ack is None or not write.release or write.lease is None:
            return None
        if self.consumer is None:
            raise TypeError(
                "this RedisCheckpointer was built without its consumer (consumer=), so its "
                f"save cannot acknowledge outbox message {write.ack!r}; use the "
                "checkpointer of a RedisBackend"
            )
        target = self.consumer.ack_arguments(write.ack)
        if target is None:
            return None
        shard, args = target
        thread_id = write.thread_id
        if shard.shard != self.store.layout.shard_of(thread_id):
            # As for save_with_outbox's rows: a save script touches its own shard only.
            raise ValueError(
                f"the save of thread {show_id(thread_id)} cannot acknowledge outbox message "
                f"{write.ack!r}, whose shard differs: one save script can only touch its own "
                "shard. A save acknowledges a hand-off of the saved thread."
            )
        return args

    async def _run_save(self, write: Write, ack: list[bytes | str] | None = None) -> Refused | None:
        thread_id = write.thread_id
        keys = self.store.layout.thread(thread_id)
        head, lease = write.summary, write.lease
        pending_at, wake_at = head.handoff_pending_at, head.wake_at
        args: list[bytes | str | int] = [
            write.expected_revision,
            write.record,
            # A snapshot with a write id is unique: the same record at the new revision is
            # this save, resent. Without one (an empty id in the envelope) it may not be.
            "0" if b'"write_id":""' in write.record else "1",
            "" if lease is None else lease.owner,
            "" if lease is None else str(lease.fencing_token),
            thread_id,
            # HEAD_COLUMNS (str enums: the driver sends their values)
            *(head.execution_pointer, head.status, head.reason, head.handoff_status),
            "" if pending_at is None else repr(pending_at),
            repr(head.updated_at),
            "" if wake_at is None else score(wake_at),
            head.graph_version,
        ]
        if ack is not None:
            args += ack  # ARGV[15..17] of the acking save, before the outbox rows
        key_list = keys.checkpoint
        if self._recent:
            key_list = (*key_list, self.store.layout.recent)
        if write.outbox:
            shard = keys.shard.shard
            for row in write.outbox:
                if self.store.layout.shard_of(row.thread_id) != shard:
                    raise ValueError(
                        f"save_with_outbox of thread {show_id(thread_id)} enqueued a hand-off "
                        f"of thread {show_id(row.thread_id)}, whose outbox shard differs: one "
                        "save script can only append to its own shard. Enqueue intents of the "
                        "saved thread."
                    )
                args += [f"{row.committed_revision}:{row.thread_id}", row.payload]
                args += route_args(row)
            key_list = (*key_list, *keys.shard.outbox)
        if ack is not None:
            if not write.outbox:
                key_list = (*key_list, *keys.shard.outbox)  # the acking save's last 7 KEYS
            script = self._save_ack
        elif write.release and lease is not None:
            script = self._save_release
        else:
            script = self._save
        reply: int | list[bytes] = await self.store.run(
            script,
            key_list,
            args,
            lambda: f"saving thread {show_id(thread_id)} at revision {write.revision}",
        )
        if isinstance(reply, int):
            return None
        holder = lease_of(thread_id, *reply[1:4]) if len(reply) > 1 else None
        return Refused(int(reply[0]), holder)

    async def _read_head(self, thread_id: str) -> tuple[int, bytes] | None:
        reply: list[Any] = await self.store.call(HISTORY, thread_id, _HISTORY, [1], "loading")
        if reply[0] == 0:
            return None
        if reply[1] is None:
            raise SnapshotEnvelopeInvalidError(
                f"the head of thread {show_id(thread_id)} names revision {reply[0]}, which has "
                "no history entry; the keys were changed by something other than flowy"
            )
        return reply[0], reply[1]

    async def _acquire_head(
        self, thread_id: str, owner: str, ttl: float
    ) -> tuple[Lease | Busy, tuple[int, bytes] | None]:
        args = [owner, max(1, round(ttl * 1e6)), uuid.uuid4().hex]
        reply: list[Any] = await self.store.call(
            ACQUIRE_HEAD, thread_id, _LEASED_HEAD, args, "acquiring the lease of"
        )
        if not int(reply[0]):
            return Busy(lease_of(thread_id, *reply[1:4])), None
        lease = Lease(thread_id, owner, int(reply[1]), int(reply[2]) / 1e6)
        revision = int(reply[3])
        if revision == 0:
            return lease, None
        if len(reply) < 5 or reply[4] is None:
            raise SnapshotEnvelopeInvalidError(
                f"the head of thread {show_id(thread_id)} names revision {revision}, which has "
                "no history entry; the keys were changed by something other than flowy"
            )
        return lease, (revision, reply[4])

    async def _read_history(self, thread_id: str, limit: int) -> list[tuple[int, bytes]]:
        reply: list[Any] = await self.store.call(
            HISTORY, thread_id, _HISTORY, [limit], "reading the history of"
        )
        head = int(reply[0])
        return [(head - i, record) for i, record in enumerate(reply[1:]) if record is not None]

    async def _prune(self, thread_id: str, keep: int) -> None:
        what = "pruning the history of"
        while await self.store.call(PRUNE, thread_id, _HISTORY, [keep, _PRUNE_BATCH], what):
            pass

    async def _delete(self, thread_id: str, *, if_idle: bool) -> Lease | None:
        keys = _CHECKPOINT if not self._recent else self._checkpoint_and_recent
        reply: list[bytes] = await self.store.call(
            DELETE, thread_id, keys, ["1" if if_idle else "0", thread_id], "deleting"
        )
        return lease_of(thread_id, *reply) if reply else None

    async def _list_heads(
        self, statuses: frozenset[HandoffStatus] | None, limit: int, after: str | None
    ) -> list[ThreadSummary]:
        # Two steps, each one script per shard (one call for all shards on a standalone
        # server): LIST merges the first `want` index members past `after` of every shard
        # and status in id order, then HEADS reads their heads' columns.
        store = self.store
        digits = sorted(STATUS_DIGITS[s] for s in statuses or STATUS_DIGITS)
        shards = [[s.threads, s.exp, s.timers] for s in store.layout.all_shards()]
        out: list[ThreadSummary] = []
        last: str | None = None
        want = limit
        while True:
            replies: list[bytes] = await store.run_sharded(
                LIST, shards, [want, "" if after is None else after, *digits], "listing threads"
            )
            members = [m for reply in replies if reply for m in reply.split(b"\0")]
            if len(replies) > 1:  # one answer per shard: merge them
                members.sort(key=lambda m: m[1:])
                del members[want:]
            if not members:
                return out
            rows = await self._heads(members, b"".join(digits))
            for member in members:
                row = rows[member]
                thread_id = member[1:].decode("utf-8")
                # A thread whose save moved it to another status since it was indexed
                # may come twice (its old member, not yet removed, then its new one).
                if row and thread_id != last:
                    out.append(self.summary(thread_id, *row))
                    last = thread_id
                    if len(out) == limit:
                        return out
            if len(members) < want:
                return out
            after = members[-1][1:].decode("utf-8")
            # Members of threads just gone (expired, deleted, moved): ask for more each
            # time, so a run of them costs a few round trips, not one per page of them.
            want = max(limit - len(out), min(2 * want, _MAX_ASK))

    def _checkpoint_and_recent(self, keys: ThreadKeys) -> tuple[bytes, ...]:
        return (*keys.checkpoint, self.store.layout.recent)

    async def _recent_heads(
        self, limit: int, before: tuple[int, str] | None
    ) -> list[ThreadSummary]:
        # Two scripts: RECENT reads a page of the index below the cursor, RECENT_HEADS the
        # columns of those heads. A head saved into another second between the two is
        # left out of this page (its place is elsewhere now); one gone is forgotten.
        if not self._recent:
            return await super()._recent_heads(limit, before)
        await self._fill_recent()
        store, layout = self.store, self.store.layout
        out: list[ThreadSummary] = []
        want = limit
        while True:
            args = [want, "", ""] if before is None else [want, before[0], before[1]]
            reply: list[bytes] = await store.run(
                RECENT, [layout.recent], args, "listing recent threads"
            )
            page = [(int(reply[i + 1]), reply[i]) for i in range(0, len(reply), 2)]
            if not page:
                return out
            heads = [layout.head_of(raw)[1] for _, raw in page]
            ids = [raw for _, raw in page]
            rows = json.loads(
                (
                    await store.run(
                        RECENT_HEADS, [layout.recent, *heads], ids, "reading thread heads"
                    )
                ).decode("utf-8", "replace")
            )
            for (second, raw), row in zip(page, rows, strict=True):
                if not row:
                    continue
                summary = self.summary(raw.decode("utf-8"), *row)
                if recent_second(summary.updated_at) == second:
                    out.append(summary)
                    if len(out) == limit:
                        return out
            if len(page) < want:
                return out
            before = (page[-1][0], page[-1][1].decode("utf-8"))
            want = max(limit - len(out), min(2 * want, _MAX_ASK))

    async def _fill_recent(self) -> None:
        """Give the threads saved before the recency index existed their members, once
        per namespace (recorded in its meta hash as ``recent``) and checked once per
        process: a scan of every head through ``list_threads``' pages."""
        if self._recent_filled:
            return
        store, layout = self.store, self.store.layout
        what = "filling the recency index"
        if not await store.execute(what, "HGET", layout.meta, "recent"):
            after: str | None = None
            while True:
                page = await self._list_heads(None, _FILL_PAGE, after)
                if page:
                    ids = [s.thread_id.encode("utf-8") for s in page]
                    heads = [layout.head_of(raw)[1] for raw in ids]
                    await store.run(RECENT_FILL, [layout.recent, *heads], ids, what)
                if len(page) < _FILL_PAGE:
                    break
                after = page[-1].thread_id
            await store.execute(what, "HSET", layout.meta, "recent", "1")
        self._recent_filled = True

    async def _heads(self, members: list[bytes], listed: bytes) -> dict[bytes, list[str] | None]:
        """The columns of the heads of index ``members``, by member; ``None`` for a head
        that is gone or whose status is not ``listed`` (status digits)."""
        store, layout = self.store, self.store.layout
        groups: dict[int, tuple[list[bytes], list[bytes]]] = {}
        for member in members:
            shard, head = layout.head_of(member[1:])
            group = groups.get(shard)
            if group is None:
                group = groups[shard] = ([layout.shard(shard).threads], [])
            group[0].append(head)
            group[1].append(member)
        calls: list[tuple[list[bytes], list[bytes]]] = []
        for keys, group_members in groups.values():
            if calls and not store.cluster:  # a standalone server takes every shard at once
                calls[0][0].extend(keys)
                calls[0][1].append(b"\0".join(group_members))
            else:
                calls.append((keys, [listed, b"\0".join(group_members)]))
        what = "reading thread heads"
        if len(calls) == 1:
            replies: list[bytes] = [await store.run(HEADS, *calls[0], what)]
        else:
            replies = await asyncio.gather(*(store.run(HEADS, *call, what) for call in calls))
        # Stored columns are the UTF-8 of str values; a byte that is not stays visible.
        rows = [row for reply in replies for row in json.loads(reply.decode("utf-8", "replace"))]
        ordered = [m for _, group_members in groups.values() for m in group_members]
        return {m: row or None for m, row in zip(ordered, rows, strict=True)}

    async def _timers(self, before: float, limit: int) -> list[Timer]:
        # Each shard's timer set is ordered by (wake_at, UTF-8 id), and UTF-8 byte order
        # is code point order: merge the first `limit` of every shard.
        replies = await self.store.run_sharded(
            TIMERS,
            [[shard.timers, shard.exp] for shard in self.store.layout.all_shards()],
            [score(before), limit],
            "listing due timers",
        )
        due = sorted(
            (float(reply[i + 1]), reply[i].decode("utf-8"))
            for reply in replies
            for i in range(0, len(reply), 2)
        )
        return [Timer(thread_id, wake_at) for wake_at, thread_id in due[:limit]]

    async def _append_signal(
        self, thread_id: str, signal_id: str, data: bytes, max_seq: int
    ) -> tuple[int, bool] | None:
        seq, added = await self.store.call(
            SIGNAL, thread_id, _SIGNAL, [signal_id, data, max_seq], "signalling"
        )
        return None if int(added) < 0 else (int(seq), bool(added))

    async def _read_signals(
        self, thread_id: str, after: int, limit: int
    ) -> list[tuple[int, bytes]]:
        reply: list[bytes | None] = await self.store.call(
            SIGNALS, thread_id, attrgetter("inbox"), [after, limit], "reading the signals of"
        )
        signals: list[tuple[int, bytes]] = []
        for data in reply:
            if data is None:  # a gap: the signals after it are not readable yet
                break
            signals.append((after + 1 + len(signals), data))
        return signals

    async def _put_activity(self, thread_id: str, key: str, data: bytes) -> None:
        what = f"recording activity {key!r:.80} of"
        await self.store.call(ACTIVITY, thread_id, _JOURNAL, [key, data], what)

    async def _get_activity(self, thread_id: str, key: str) -> bytes | None:
        journal = self.store.layout.thread(thread_id).journal
        return await self.store.execute(
            lambda: f"reading activity {key!r:.80} of thread {show_id(thread_id)}",
            "HGET",
            journal,
            key,
        )

    async def _list_activities(self, thread_id: str) -> list[bytes]:
        journal = self.store.layout.thread(thread_id).journal
        return list(
            await self.store.execute(
                lambda: f"reading the journal of thread {show_id(thread_id)}", "HVALS", journal
            )
        )


class ClusterCheckpointer(RedisCheckpointer[S], Generic[S]):
    """The checkpointer of a ``RedisBackend`` on Redis Cluster: without the recency
    index (``Capabilities.recent_index`` is false; ``recent_threads`` scans)."""

    _recent_heads = cast(Any, BaseCheckpointer)._recent_heads
