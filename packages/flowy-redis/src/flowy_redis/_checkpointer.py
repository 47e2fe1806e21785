"""``RedisCheckpointer``: strict-OCC snapshots with native lease fencing and the
transactional outbox, each save one Lua script (one round trip).
"""

from __future__ import annotations

import math
from typing import Any, Generic, TypeVar

from flowy import (
    ConcurrencyConflictError,
    LeaseLostError,
    SnapshotEnvelopeInvalidError,
    SnapshotTooLargeError,
    ThreadLeaseBusyError,
    ThreadNotFoundError,
)
from flowy.checkpoint import (
    EnqueueCallback,
    HandoffStatus,
    Lease,
    LeaseManager,
    RunStatus,
    Snapshot,
    StateCodec,
    ThreadSummary,
    decode_snapshot,
    encode_snapshot,
    validate_thread_id,
)

from ._keys import DEFAULT_NAMESPACE, DEFAULT_SHARDS, describe
from ._lease import RedisLeaseManager
from ._outbox import RedisTransaction
from ._scripts import (
    DELETE,
    HEADS,
    HISTORY,
    LIST_MEMBERS,
    LOAD,
    OK,
    PRUNE,
    STATUS_CONFLICT,
    STATUS_LEASE_BUSY,
    save_script,
)
from ._store import RedisClient, StoreUser, connect

__all__ = ["DEFAULT_MAX_RECORD_BYTES", "RedisCheckpointer"]

S = TypeVar("S")

DEFAULT_MAX_RECORD_BYTES = 64 * 1024 * 1024
"""The largest encoded snapshot a save accepts by default (64 MiB)."""

_PRUNE_BATCH = 10_000
_HANDOFF_ORDER = tuple(HandoffStatus)
_HEAD_COLUMNS = 7


def lease_error(
    code: int, reply: list[Any], thread_id: str, lease: Lease | None, action: str
) -> ThreadLeaseBusyError | LeaseLostError:
    """The lease error of a script's ``STATUS_LEASE_*`` answer."""
    owner = _text(reply[1])
    token = _text(reply[2])
    expires_in = (int(reply[3]) - int(reply[4])) / 1e6 if len(reply) > 4 else 0.0
    if code == STATUS_LEASE_BUSY:
        return ThreadLeaseBusyError(
            f"cannot {action}: thread {describe(thread_id)} is leased by {owner!r} (token "
            f"{token}) for {expires_in:.1f}s more; pass that lease, or wait for it to be "
            f"released or to expire"
        )
    assert lease is not None
    return LeaseLostError(
        f"cannot {action}: lease {lease.token} of {lease.owner!r} on thread "
        f"{describe(thread_id)} is no longer live (it expired, was released or was taken "
        f"over; the current holder is {owner!r} with token {token}). The write was fenced."
    )


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _check_revision(expected_revision: object) -> int:
    if (
        isinstance(expected_revision, bool)
        or not isinstance(expected_revision, int)
        or expected_revision < 0
    ):
        raise ValueError(
            f"expected_revision must be an int >= 0 (0 creates the thread), got "
            f"{expected_revision!r}"
        )
    return expected_revision


class RedisCheckpointer(StoreUser, Generic[S]):
    """Strict-OCC checkpointer on Redis (standalone or Cluster).

    A save is one Lua script: it checks the lease (fencing, by the server's clock) and
    the revision, writes the head and the history entry, and (``save_with_outbox``)
    appends the hand-off intents to the thread's outbox shard, atomically. It fences
    with the leases of any ``RedisLeaseManager`` of the same namespace and server.

    Args:
        client: a ``redis.asyncio.Redis`` or ``redis.asyncio.RedisCluster`` client
            (``decode_responses=False``).
        namespace: the prefix of every key (no ``{`` or ``}``).
        shards: the number of outbox shards; the same for every client of a namespace.
        codec: the state codec (JSON by default).
        completed_ttl: seconds after which a thread whose head was saved completed or
            failed expires (head and history); ``None`` keeps threads until deleted.
        max_record_bytes: the largest encoded snapshot accepted; larger saves raise
            ``SnapshotTooLargeError``.
    """

    def __init__(
        self,
        client: RedisClient,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        shards: int = DEFAULT_SHARDS,
        codec: StateCodec[S] | None = None,
        completed_ttl: float | None = None,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    ) -> None:
        super().__init__(client, namespace=namespace, shards=shards)
        if completed_ttl is not None and not (
            math.isfinite(completed_ttl) and completed_ttl >= 0.001
        ):
            raise ValueError(
                f"completed_ttl must be a number of seconds >= 0.001, or None to keep "
                f"completed threads; got {completed_ttl!r}"
            )
        self.codec = codec
        self.completed_ttl = completed_ttl
        self.max_record_bytes = max_record_bytes
        self._save_script = save_script(
            0 if completed_ttl is None else max(1, round(completed_ttl * 1000))
        )

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        cluster: bool = False,
        namespace: str = DEFAULT_NAMESPACE,
        shards: int = DEFAULT_SHARDS,
        codec: StateCodec[S] | None = None,
        completed_ttl: float | None = None,
        **client_options: Any,
    ) -> RedisCheckpointer[S]:
        """A checkpointer with its own client for ``url`` (``cluster=True`` for a
        ``RedisCluster``); ``aclose()`` closes that client."""
        checkpointer = cls(
            connect(url, cluster=cluster, **client_options),
            namespace=namespace,
            shards=shards,
            codec=codec,
            completed_ttl=completed_ttl,
        )
        return checkpointer._owning_client()

    @property
    def client(self) -> RedisClient:
        """The Redis client."""
        return self._store.client

    def fences(self, leases: LeaseManager) -> bool:
        """True for a ``RedisLeaseManager`` of the same namespace on the same Redis."""
        return isinstance(leases, RedisLeaseManager) and self._store.same_domain(leases._store)

    async def save(
        self, expected_revision: int, snapshot: Snapshot[S], *, lease: Lease | None = None
    ) -> int:
        """Store ``snapshot`` at ``expected_revision + 1`` if the head is at
        ``expected_revision`` (see ``flowy.checkpoint.Checkpointer.save``)."""
        return await self._save(expected_revision, snapshot, lease, ())

    async def save_with_outbox(
        self,
        expected_revision: int,
        snapshot: Snapshot[S],
        enqueue: EnqueueCallback,
        *,
        lease: Lease | None = None,
    ) -> int:
        """Save and append the intents ``enqueue`` gives ``RedisOutbox.enqueue_intent_tx``
        in the same script. ``enqueue(tx, new_revision)`` runs first and only collects the
        intents in ``tx`` (a ``RedisTransaction``); if it raises, nothing is written."""
        thread_id = validate_thread_id(snapshot.thread_id)
        expected = _check_revision(expected_revision)
        tx = RedisTransaction(self._store.layout, thread_id)
        try:
            await enqueue(tx, expected + 1)
        finally:
            tx.close()
        return await self._save(expected, snapshot, lease, tx.intents)

    async def _save(
        self,
        expected_revision: int,
        snapshot: Snapshot[S],
        lease: Lease | None,
        intents: tuple[bytes, ...] | list[bytes],
    ) -> int:
        thread_id = validate_thread_id(snapshot.thread_id)
        expected = _check_revision(expected_revision)
        if lease is not None and lease.thread_id != thread_id:
            raise ValueError(
                f"the lease given to save names thread {describe(lease.thread_id)}, not "
                f"{describe(thread_id)}; pass the lease of the thread being saved"
            )
        revision = expected + 1
        record = encode_snapshot(snapshot, revision, self.codec)
        if len(record) > self.max_record_bytes:
            raise SnapshotTooLargeError(
                f"the snapshot of thread {describe(thread_id)} encodes to {len(record)} bytes; "
                f"this checkpointer accepts at most {self.max_record_bytes} (max_record_bytes)."
                f" Keep large data outside the state and store a reference."
            )
        keys = self._store.layout.thread(thread_id)
        key_list = (*keys.checkpoint_keys, keys.stream) if intents else keys.checkpoint_keys
        pending_at = snapshot.handoff_pending_at
        # Enum members are str: the driver sends their values.
        args: list[bytes | str | int] = [
            expected,
            record,
            snapshot.execution_pointer,
            snapshot.status,
            snapshot.reason,
            snapshot.handoff_status,
            "" if pending_at is None else repr(float(pending_at)),
            repr(float(snapshot.updated_at)),
            ("1" if snapshot.write_id else "0")
            + ("" if lease is None else f"{int(lease.token)}:{lease.owner}"),
            *intents,
        ]
        reply: int | list[Any] = await self._store.run(
            self._save_script,
            key_list,
            args,
            lambda: f"saving thread {describe(thread_id)} at {revision}",
        )
        if isinstance(reply, int):
            return reply
        code = int(reply[0])
        if code == STATUS_CONFLICT:
            actual = int(reply[1])
            raise ConcurrencyConflictError(
                f"thread {describe(thread_id)} is at revision {actual}, not "
                f"{expected}; reload it and decide again",
                thread_id=thread_id,
                expected=expected,
                actual=actual,
            )
        raise lease_error(code, reply, thread_id, lease, "save")

    async def load(self, thread_id: str) -> tuple[Snapshot[S], int]:
        """The head snapshot and its revision; ``ThreadNotFoundError`` if none."""
        thread_id = validate_thread_id(thread_id)
        keys = self._store.layout.thread(thread_id)
        reply: list[Any] = await self._store.run(
            LOAD,
            [keys.head, keys.hist],
            [],
            lambda: f"loading thread {describe(thread_id)}",
        )
        if not reply:
            raise ThreadNotFoundError(f"no checkpoint for thread {describe(thread_id)}")
        revision, pointer, record = reply
        if record is None or pointer is None:
            raise SnapshotEnvelopeInvalidError(
                f"the head of thread {describe(thread_id)} names revision {int(revision)}, "
                f"which has no history entry; the keys were changed by something other "
                f"than flowy"
            )
        rev = int(revision)
        snapshot: Snapshot[S] = decode_snapshot(
            record,
            self.codec,
            thread_id=thread_id,
            revision=rev,
            execution_pointer=pointer.decode("utf-8", "replace"),
        )
        return snapshot, rev

    async def get_history(self, thread_id: str, limit: int = 100) -> list[Snapshot[S]]:
        """Up to ``limit`` stored snapshots, newest first (empty if none)."""
        thread_id = validate_thread_id(thread_id)
        if limit <= 0:
            return []
        keys = self._store.layout.thread(thread_id)
        reply: list[Any] = await self._store.run(
            HISTORY,
            [keys.head, keys.hist],
            [int(limit)],
            lambda: f"reading the history of thread {describe(thread_id)}",
        )
        head = int(reply[0])
        out: list[Snapshot[S]] = []
        for offset, record in enumerate(reply[1:]):
            if record is None:
                continue
            snapshot: Snapshot[S] = decode_snapshot(
                record, self.codec, thread_id=thread_id, revision=head - offset
            )
            out.append(snapshot)
        return out

    async def prune(self, thread_id: str, retain: int) -> None:
        """Delete all but the newest ``retain`` history entries (the head always stays)."""
        thread_id = validate_thread_id(thread_id)
        keys = self._store.layout.thread(thread_id)
        while True:
            remaining = await self._store.run(
                PRUNE,
                [keys.head, keys.hist],
                [max(int(retain), 1), _PRUNE_BATCH],
                lambda: f"pruning the history of thread {describe(thread_id)}",
            )
            if int(remaining) <= 0:
                return

    async def delete(self, thread_id: str) -> None:
        """Delete the thread's head and history (missing is fine). Its lease record,
        which holds the fencing-token counter, is kept."""
        await self._delete(validate_thread_id(thread_id), only_if_idle=False)

    async def delete_if_idle(self, thread_id: str) -> None:
        """Like ``delete`` but raise ``ThreadLeaseBusyError`` while a live lease holds it."""
        await self._delete(validate_thread_id(thread_id), only_if_idle=True)

    async def _delete(self, thread_id: str, *, only_if_idle: bool) -> None:
        keys = self._store.layout.thread(thread_id)
        reply: list[Any] = await self._store.run(
            DELETE,
            keys.checkpoint_keys,
            [1 if only_if_idle else 0],
            lambda: f"deleting thread {describe(thread_id)}",
        )
        code = int(reply[0])
        if code != OK:
            raise lease_error(code, reply, thread_id, None, "delete the thread")

    async def list_threads(
        self,
        *,
        handoff_statuses: frozenset[HandoffStatus] | None = None,
        limit: int = 100,
    ) -> list[ThreadSummary]:
        """Thread heads (optionally only those in ``handoff_statuses``), any order.

        Reads the per-shard hand-off status indexes and the heads' columns; no record
        is decoded.
        """
        if limit <= 0:
            return []
        wanted = [s for s in _HANDOFF_ORDER if handoff_statuses is None or s in handoff_statuses]
        if not wanted:
            return []
        layout = self._store.layout
        replies = await self._store.run_sharded(
            LIST_MEMBERS,
            [[shard.index] for shard in layout.all_shards()],
            [int(limit), *(layout.index_position(s) for s in wanted)],
            "listing threads",
        )
        thread_ids: list[str] = []
        seen: set[bytes] = set()
        for reply in replies:
            for member in reply:
                if member not in seen:
                    seen.add(member)
                    thread_ids.append(layout.decode_member(member))
        thread_ids = thread_ids[:limit]
        by_shard: dict[int, list[str]] = {}
        for thread_id in thread_ids:
            by_shard.setdefault(layout.shard_of(thread_id), []).append(thread_id)
        ordered = [tid for group in by_shard.values() for tid in group]
        groups = [[layout.thread(tid).head for tid in group] for group in by_shard.values()]
        answers = await self._store.run_sharded(HEADS, groups, [], "reading thread heads")
        columns = [value for answer in answers for value in answer]
        wanted_set = frozenset(wanted)
        out: list[ThreadSummary] = []
        for index, thread_id in enumerate(ordered):
            row = columns[index * _HEAD_COLUMNS : (index + 1) * _HEAD_COLUMNS]
            summary = _summary(thread_id, row)
            if summary is not None and summary.handoff_status in wanted_set:
                out.append(summary)
        return out


def _summary(thread_id: str, row: list[Any]) -> ThreadSummary | None:
    revision, pointer, status, reason, handoff, pending_at, updated_at = row
    if revision is None:
        return None  # deleted or expired since it was listed
    try:
        return ThreadSummary(
            thread_id=thread_id,
            revision=int(revision),
            execution_pointer=pointer.decode("utf-8"),
            status=RunStatus(status.decode()),
            reason=reason.decode("utf-8"),
            handoff_status=HandoffStatus(handoff.decode()),
            handoff_pending_at=float(pending_at) if pending_at else None,
            updated_at=float(updated_at),
        )
    except (AttributeError, TypeError, ValueError, UnicodeDecodeError) as exc:
        raise SnapshotEnvelopeInvalidError(
            f"the head columns of thread {describe(thread_id)} are malformed ({exc}); the "
            f"key was written by something other than flowy"
        ) from exc
