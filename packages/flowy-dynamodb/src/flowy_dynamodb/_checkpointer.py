"""Strict-OCC snapshots on DynamoDB: :class:`DynamoCheckpointer`.

A save is ONE ``TransactWriteItems`` call: an ``Update`` of the thread's head item whose
condition checks the revision, the stored thread id and the lease together, plus a
``Put`` of the history entry at the new revision (``attribute_not_exists``).
``save_with_outbox`` adds the actions collected by the ``enqueue`` callback (the outbox
item) to the same call. A cancelled transaction is classified from its cancellation
reasons, which carry the head item as it was (``ReturnValuesOnConditionCheckFailure =
ALL_OLD``): a write of our own that already landed (botocore retried a request whose
response was lost) is reported as the success it was; otherwise a lease problem raises
``ThreadLeaseBusyError`` / ``LeaseLostError`` and a revision mismatch
``ConcurrencyConflictError``.

A single ``UpdateItem`` cannot do it: the history entry is a second item (keeping the
head O(1) to read and each item under 400 KB), and only a transaction writes two items
atomically.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import flowy
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

from ._executor import CancelReason, ConditionFailed, DynamoExecutor, TransactionCancelled
from ._executor import is_size_error as _is_size_error
from ._lease import (
    DEFAULT_CLOCK_SKEW,
    DynamoLeaseManager,
    check_stored_id,
    head_key,
    holds,
    lease_free_condition,
    lease_held_condition,
    live_lease,
    update_head,
)
from ._table import (
    A_HANDOFF,
    A_HANDOFF_AT,
    A_POINTER,
    A_REASON,
    A_RECORD,
    A_REVISION,
    A_STATUS,
    A_THREAD_ID,
    A_TOKEN,
    A_UPDATED,
    A_WRITE_TX,
    HISTORY_PREFIX,
    INDEX_NAME,
    INDEX_PK,
    MAX_ITEM_BYTES,
    PK,
    SK,
    TTL_ATTRIBUTE,
    Clock,
    DynamoTable,
    DynamoTransaction,
    Expression,
    Item,
    b,
    get_b,
    get_float,
    get_int,
    get_s,
    history_sk,
    item_size,
    n,
    s,
    shard_of,
    show_id,
    thread_key,
)

if TYPE_CHECKING:
    from botocore.client import BaseClient

__all__ = ["DEFAULT_INDEX_SHARDS", "DynamoCheckpointer"]

S = TypeVar("S")

DEFAULT_INDEX_SHARDS = 8
"""Partitions of the ``threads`` index per hand-off status (spreads index writes)."""

# Room kept in the head item for the lease attributes a save does not write.
_LEASE_ALLOWANCE = 1024
# Attempts of a transaction cancelled by a concurrent transaction (nothing written).
_CONFLICT_ATTEMPTS = 4
_TRANSIENT_CODES = frozenset(
    {"TransactionConflict", "ThrottlingError", "ProvisionedThroughputExceeded"}
)
_CHECKPOINT_ATTRIBUTES = (
    A_REVISION,
    A_POINTER,
    A_STATUS,
    A_REASON,
    A_HANDOFF,
    A_HANDOFF_AT,
    A_UPDATED,
    A_RECORD,
    A_WRITE_TX,
    INDEX_PK,
)


class _Retry(Exception):
    """Internal: the transaction did not apply and may be sent again as it is."""


class DynamoCheckpointer(Generic[S]):
    """Strict-OCC checkpointer on one DynamoDB table (single-table design).

    It fences natively with a :class:`DynamoLeaseManager` of the same table and commits
    hand-offs transactionally with a :class:`DynamoOutbox` (``save_with_outbox``).

    Args:
        client: a boto3 DynamoDB client (see :func:`flowy_dynamodb.make_client`).
        table_name: the table made by :func:`flowy_dynamodb.create_table`.
        codec: the state codec (JSON by default); every reader must use the same one.
        clock_skew: seconds the clocks of this table's clients may differ; a save
            without a lease is refused until ``clock_skew`` seconds after the expiry of
            the thread's last lease (use the lease manager's value).
        executor: the bounded thread pool for boto3 calls (a private one if omitted).
        index_shards: partitions of the ``threads`` index per hand-off status; every
            client of a table must use the same value.
        max_item_bytes: the item size limit checked before writing (DynamoDB's 400 KB).
        expire_after: if set, saves whose status is in ``expire_statuses`` stamp the
            head and the new history entry with a time-to-live attribute this many
            seconds ahead, and DynamoDB deletes them after that (other saves clear it).
        expire_statuses: the statuses ``expire_after`` applies to (completed only by
            default).
        ttl_attribute: the table's time-to-live attribute (see ``create_table``).
        clock: epoch seconds (``time.time``); replaceable for tests.
    """

    def __init__(
        self,
        client: BaseClient,
        table_name: str,
        *,
        codec: StateCodec[S] | None = None,
        clock_skew: float = DEFAULT_CLOCK_SKEW,
        executor: DynamoExecutor | None = None,
        index_shards: int = DEFAULT_INDEX_SHARDS,
        max_item_bytes: int = MAX_ITEM_BYTES,
        expire_after: float | None = None,
        expire_statuses: frozenset[RunStatus] = frozenset({RunStatus.COMPLETED}),
        ttl_attribute: str = TTL_ATTRIBUTE,
        clock: Clock = time.time,
    ) -> None:
        if clock_skew < 0:
            raise ValueError(f"clock_skew must be >= 0 seconds, got {clock_skew!r}")
        if index_shards < 1:
            raise ValueError(f"index_shards must be at least 1, got {index_shards!r}")
        if expire_after is not None and expire_after <= 0:
            raise ValueError(f"expire_after must be positive seconds, got {expire_after!r}")
        self._table = DynamoTable(client, table_name, executor=executor, clock=clock)
        self.codec = codec
        self.clock_skew = clock_skew
        self.index_shards = index_shards
        self.max_item_bytes = max_item_bytes
        self.expire_after = expire_after
        self.expire_statuses = expire_statuses
        self.ttl_attribute = ttl_attribute

    @property
    def table_name(self) -> str:
        """The DynamoDB table holding the checkpoints."""
        return self._table.name

    @property
    def domain(self) -> tuple[str, str, str]:
        """Endpoint, region and table: the coordination domain of this checkpointer."""
        return self._table.domain

    def fences(self, leases: LeaseManager) -> bool:
        """True for a :class:`DynamoLeaseManager` of the same table and endpoint: its
        leases are checked in the same conditional write as the revision."""
        return isinstance(leases, DynamoLeaseManager) and leases.domain == self.domain

    # -- saving -----------------------------------------------------------------------

    async def save(
        self, expected_revision: int, snapshot: Snapshot[S], *, lease: Lease | None = None
    ) -> int:
        """Store ``snapshot`` as the head if the head is at ``expected_revision``
        (see ``flowy.checkpoint.Checkpointer.save``): one ``TransactWriteItems``."""
        return await self._save(expected_revision, snapshot, lease, ())

    async def save_with_outbox(
        self,
        expected_revision: int,
        snapshot: Snapshot[S],
        enqueue: EnqueueCallback,
        *,
        lease: Lease | None = None,
    ) -> int:
        """Save like ``save`` and commit the actions ``await enqueue(tx, new_revision)``
        adds to ``tx`` (a :class:`DynamoTransaction`) in the same transaction: the head
        update, the history entry and the outbox item are written together or not at
        all."""
        validate_thread_id(snapshot.thread_id)
        tx = DynamoTransaction(self._table.name)
        try:
            await enqueue(tx, expected_revision + 1)
        finally:
            actions = tx.seal()
        return await self._save(expected_revision, snapshot, lease, actions)

    def _expiry(self, status: RunStatus, now: float) -> int | None:
        if self.expire_after is None or status not in self.expire_statuses:
            return None
        return int(now + self.expire_after) + 1

    async def _save(
        self,
        expected_revision: int,
        snapshot: Snapshot[S],
        lease: Lease | None,
        extra: Sequence[Mapping[str, Any]],
    ) -> int:
        thread_id = validate_thread_id(snapshot.thread_id)
        if lease is not None and lease.thread_id != thread_id:
            raise flowy.LeaseLostError(
                f"save refused: lease {lease.token} of {lease.owner!r} is for thread "
                f"{show_id(lease.thread_id)}, not for {show_id(thread_id)}; nothing was written"
            )
        revision = expected_revision + 1
        data = encode_snapshot(snapshot, revision, self.codec)
        # Identifies this save's write in the head and the history entry, so a resent
        # request whose first copy landed is recognised as ours.
        write_tx = uuid.uuid4().hex
        delay = 0.02
        for attempt in range(_CONFLICT_ATTEMPTS):
            now = self._table.clock()
            head, history = self._actions(snapshot, expected_revision, data, write_tx, lease, now)
            try:
                await self._table.call(
                    "transact_write_items", TransactItems=[head, history, *extra]
                )
                return revision
            except TransactionCancelled as cancelled:
                try:
                    return await self._resolve(
                        cancelled.reasons, thread_id, expected_revision, lease, now, write_tx
                    )
                except _Retry:
                    if attempt + 1 == _CONFLICT_ATTEMPTS:
                        raise flowy.StorageUnavailableError(
                            f"the save of thread {show_id(thread_id)} at revision {revision} "
                            f"was cancelled {_CONFLICT_ATTEMPTS} times by concurrent "
                            "transactions or throttling; nothing was written, retry later"
                        ) from cancelled
            await asyncio.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")  # pragma: no cover

    def _actions(
        self,
        snapshot: Snapshot[S],
        expected_revision: int,
        data: bytes,
        write_tx: str,
        lease: Lease | None,
        now: float,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The head ``Update`` and the history ``Put`` of one save, size-checked."""
        thread_id = snapshot.thread_id
        revision = expected_revision + 1
        expires = self._expiry(snapshot.status, now)
        fields: dict[str, Any] = {
            A_THREAD_ID: s(thread_id),
            A_REVISION: n(revision),
            A_POINTER: s(snapshot.execution_pointer),
            A_STATUS: s(snapshot.status.value),
            A_REASON: s(snapshot.reason),
            A_HANDOFF: s(snapshot.handoff_status.value),
            A_UPDATED: n(snapshot.updated_at),
            A_RECORD: b(data),
            A_WRITE_TX: s(write_tx),
            INDEX_PK: s(
                f"{snapshot.handoff_status.value}#{shard_of(thread_id, self.index_shards)}"
            ),
        }
        if snapshot.handoff_pending_at is not None:
            fields[A_HANDOFF_AT] = n(snapshot.handoff_pending_at)
        if expires is not None:
            fields[self.ttl_attribute] = n(expires)

        expr = Expression()
        labels = {
            name: expr.value(f"v{i}", value) for i, (name, value) in enumerate(fields.items())
        }
        sets = ", ".join(f"{expr.name(name)} = {label}" for name, label in labels.items())
        removes = [
            expr.name(name) for name in (A_HANDOFF_AT, self.ttl_attribute) if name not in fields
        ]
        update = f"SET {sets}" + (f" REMOVE {', '.join(removes)}" if removes else "")
        # Guard: the revision, the stored thread id and the lease, all in one condition.
        rev, tid = expr.name(A_REVISION), expr.name(A_THREAD_ID)
        revision_ok = (
            f"attribute_not_exists({rev})"
            if expected_revision == 0
            else f"{rev} = {expr.value('expected', n(expected_revision))}"
        )
        id_ok = f"(attribute_not_exists({tid}) OR {tid} = {labels[A_THREAD_ID]})"
        lease_ok = (
            lease_free_condition(expr, now - self.clock_skew)
            if lease is None
            else lease_held_condition(expr, lease, now)
        )
        head = {
            "Update": {
                "TableName": self._table.name,
                "Key": head_key(thread_id),
                "UpdateExpression": update,
                "ConditionExpression": f"{revision_ok} AND {id_ok} AND {lease_ok}",
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                **expr.params(),
            }
        }
        entry: Item = {
            PK: s(thread_key(thread_id)),
            SK: s(history_sk(revision)),
            A_THREAD_ID: s(thread_id),
            A_REVISION: n(revision),
            A_RECORD: b(data),
            A_WRITE_TX: s(write_tx),
        }
        if expires is not None:
            entry[self.ttl_attribute] = n(expires)
        history = {
            "Put": {
                "TableName": self._table.name,
                "Item": entry,
                "ConditionExpression": "attribute_not_exists(#pk)",
                "ExpressionAttributeNames": {"#pk": PK},
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }
        size = max(
            item_size({**head_key(thread_id), **fields}) + _LEASE_ALLOWANCE, item_size(entry)
        )
        if size > self.max_item_bytes:
            raise flowy.SnapshotTooLargeError(
                f"the snapshot of thread {show_id(thread_id)} at revision {revision} needs "
                f"a DynamoDB item of about {size} bytes (its record is {len(data)} bytes); "
                f"the limit is {self.max_item_bytes} bytes. Nothing was written. Keep large "
                "payloads out of the state (e.g. in S3, with a reference in the state)",
                size=size,
                limit=self.max_item_bytes,
            )
        return head, history

    async def _resolve(
        self,
        reasons: list[CancelReason],
        thread_id: str,
        expected: int,
        lease: Lease | None,
        now: float,
        write_tx: str,
    ) -> int:
        """Classify a cancelled save: return the revision if it was our own landed write,
        raise ``_Retry`` if it may simply be sent again, else raise the flowy error."""
        revision = expected + 1
        head = reasons[0] if reasons else CancelReason("None", "", None)
        if head.code == "ConditionalCheckFailed":
            item = head.item
            check_stored_id(thread_id, item)
            actual = (get_int(item, A_REVISION) if item is not None else None) or 0
            if item is not None and actual == revision and get_s(item, A_WRITE_TX) == write_tx:
                return revision  # a retried request of ours: the first one landed
            if actual > revision and await self._landed_in_history(thread_id, revision, write_tx):
                return revision  # ours landed, and others have saved on top since
            if lease is not None:
                if not holds(item, lease, now):
                    raise flowy.LeaseLostError(
                        f"save refused: lease {lease.token} of {lease.owner!r} on thread "
                        f"{show_id(thread_id)} is no longer live (fenced); nothing was written"
                    )
            else:
                live = live_lease(thread_id, item, now - self.clock_skew)
                if live is not None:
                    raise flowy.ThreadLeaseBusyError(
                        f"thread {show_id(thread_id)} is leased by {live.owner!r} (token "
                        f"{live.token}); save with its lease. Nothing was written"
                    )
            if actual == expected:  # pragma: no cover - the condition said otherwise
                raise _Retry()
            raise flowy.ConcurrencyConflictError(
                f"thread {show_id(thread_id)} is at revision {actual}, not {expected}; "
                "reload it and decide again. Nothing was written",
                thread_id=thread_id,
                expected=expected,
                actual=actual,
            )
        codes = [r.code for r in reasons]
        if any(code in _TRANSIENT_CODES for code in codes):
            raise _Retry()
        for index, reason in enumerate(reasons):
            if reason.code == "ValidationError" and _is_size_error(reason.message):
                raise flowy.SnapshotTooLargeError(
                    f"DynamoDB refused the save of thread {show_id(thread_id)} at revision "
                    f"{revision}: action {index} is over the item size limit "
                    f"({reason.message}). Nothing was written",
                    limit=self.max_item_bytes,
                )
        if len(reasons) > 1 and reasons[1].code == "ConditionalCheckFailed":
            # The head was at the expected revision, so an entry at the next revision can
            # only be left from an earlier life of the thread (deleted and created again)
            # whose clean-up did not finish: remove it and send the save again.
            await self._remove_stale_entry(thread_id, revision, reasons[1].item)
            raise _Retry()
        failed = [f"action {i}: {r.code} {r.message}".strip() for i, r in enumerate(reasons)]
        raise flowy.StorageError(
            f"the save of thread {show_id(thread_id)} at revision {revision} was cancelled "
            f"and nothing was written ({'; '.join(f for f in failed if 'None' not in f)}); "
            "an action added to the transaction by the enqueue callback failed its "
            "condition or was invalid"
        )

    async def _landed_in_history(self, thread_id: str, revision: int, write_tx: str) -> bool:
        expr = Expression()
        result = await self._table.call(
            "get_item",
            TableName=self._table.name,
            Key={PK: s(thread_key(thread_id)), SK: s(history_sk(revision))},
            ConsistentRead=True,
            ProjectionExpression=expr.name(A_WRITE_TX),
            **expr.params(),
        )
        item = result.get("Item")
        return item is not None and get_s(item, A_WRITE_TX) == write_tx

    async def _remove_stale_entry(
        self, thread_id: str, revision: int, item: Mapping[str, Any] | None
    ) -> None:
        stale_tx = get_s(item, A_WRITE_TX) if item is not None else None
        expr = Expression()
        condition = (
            f"{expr.name(A_WRITE_TX)} = {expr.value('tx', s(stale_tx))}"
            if stale_tx is not None
            else f"attribute_exists({expr.name(PK)})"
        )
        try:
            await self._table.call(
                "delete_item",
                TableName=self._table.name,
                Key={PK: s(thread_key(thread_id)), SK: s(history_sk(revision))},
                ConditionExpression=condition,
                **expr.params(),
            )
        except ConditionFailed:
            pass  # already gone or replaced: the next attempt will tell

    # -- reading ----------------------------------------------------------------------

    async def load(self, thread_id: str) -> tuple[Snapshot[S], int]:
        """Return the head snapshot and its revision (one strongly consistent
        ``GetItem``); ``ThreadNotFoundError`` if none, ``SnapshotEnvelopeInvalidError``
        if the stored item or record is corrupt or does not match the thread."""
        validate_thread_id(thread_id)
        expr = Expression()
        projection = ", ".join(expr.name(a) for a in (A_THREAD_ID, A_REVISION, A_POINTER, A_RECORD))
        result = await self._table.call(
            "get_item",
            TableName=self._table.name,
            Key=head_key(thread_id),
            ConsistentRead=True,
            ProjectionExpression=projection,
            **expr.params(),
        )
        item = result.get("Item")
        revision = get_int(item, A_REVISION) if item is not None else None
        if item is None or revision is None:
            raise flowy.ThreadNotFoundError(f"no checkpoint for thread {show_id(thread_id)}")
        snapshot = self._decode(thread_id, item, revision, get_s(item, A_POINTER))
        return snapshot, revision

    def _decode(
        self, thread_id: str, item: Mapping[str, Any], revision: int, pointer: str | None
    ) -> Snapshot[S]:
        stored_id = get_s(item, A_THREAD_ID)
        if stored_id != thread_id:
            raise flowy.SnapshotEnvelopeInvalidError(
                f"the item for thread {show_id(thread_id)} at revision {revision} names "
                f"thread {show_id(stored_id or '')}: it does not match its key"
            )
        data = get_b(item, A_RECORD)
        if data is None:
            raise flowy.SnapshotEnvelopeInvalidError(
                f"the item for thread {show_id(thread_id)} at revision {revision} has no "
                "record bytes"
            )
        return decode_snapshot(
            data, self.codec, thread_id=thread_id, revision=revision, execution_pointer=pointer
        )

    async def _history_items(
        self, thread_id: str, limit: int | None, projection: Sequence[str]
    ) -> list[Item]:
        expr = Expression()
        return await self._table.query_all(
            limit,
            TableName=self._table.name,
            KeyConditionExpression=(
                f"{expr.name(PK)} = {expr.value('pk', s(thread_key(thread_id)))} AND "
                f"begins_with({expr.name(SK)}, {expr.value('prefix', s(HISTORY_PREFIX))})"
            ),
            ProjectionExpression=", ".join(expr.name(a) for a in projection),
            ScanIndexForward=False,
            ConsistentRead=True,
            **({"Limit": limit} if limit is not None else {}),
            **expr.params(),
        )

    async def get_history(self, thread_id: str, limit: int = 100) -> list[Snapshot[S]]:
        """Up to ``limit`` stored snapshots, newest first (a ``Query`` of the thread's
        history entries, O(limit))."""
        validate_thread_id(thread_id)
        if limit <= 0:
            return []
        items = await self._history_items(
            thread_id, limit, (PK, SK, A_THREAD_ID, A_REVISION, A_RECORD)
        )
        out: list[Snapshot[S]] = []
        for item in items:
            revision = _revision_of(item)
            stored = get_int(item, A_REVISION)
            if stored != revision:
                raise flowy.SnapshotEnvelopeInvalidError(
                    f"history entry {get_s(item, SK)!r} of thread {show_id(thread_id)} "
                    f"says revision {stored}"
                )
            out.append(self._decode(thread_id, item, revision, None))
        return out

    async def prune(self, thread_id: str, retain: int) -> None:
        """Delete all but the newest ``retain`` history entries (at least one; the
        entry of the head revision always stays)."""
        validate_thread_id(thread_id)
        keep = max(retain, 1)
        head = await self._head_revision(thread_id)
        items = await self._history_items(thread_id, None, (PK, SK, A_THREAD_ID))
        doomed: list[Item] = []
        kept = 0
        for item in items:  # newest first
            revision = _revision_of(item)
            if get_s(item, A_THREAD_ID) != thread_id:
                continue  # not ours (never expected): leave it alone
            if head is not None and revision == head:
                kept += 1
                continue
            if head is not None and revision < head and kept < keep:
                kept += 1
                continue
            doomed.append({PK: item[PK], SK: item[SK]})
        await self._table.batch_delete(doomed)

    async def _head_revision(self, thread_id: str) -> int | None:
        expr = Expression()
        result = await self._table.call(
            "get_item",
            TableName=self._table.name,
            Key=head_key(thread_id),
            ConsistentRead=True,
            ProjectionExpression=f"{expr.name(A_THREAD_ID)}, {expr.name(A_REVISION)}",
            **expr.params(),
        )
        item = result.get("Item")
        check_stored_id(thread_id, item)
        return get_int(item, A_REVISION) if item is not None else None

    # -- deleting ---------------------------------------------------------------------

    async def delete(self, thread_id: str) -> None:
        """Delete the thread's head and history (missing is fine). The lease and its
        fencing token stay, so tokens never go back."""
        validate_thread_id(thread_id)
        await self._delete(thread_id, idle_only=False)

    async def delete_if_idle(self, thread_id: str) -> None:
        """Like ``delete`` but raise ``ThreadLeaseBusyError`` while a live lease holds
        the thread (checked in the same conditional write)."""
        validate_thread_id(thread_id)
        await self._delete(thread_id, idle_only=True)

    async def _delete(self, thread_id: str, *, idle_only: bool) -> None:
        now = self._table.clock()
        expr = Expression()
        tid = expr.name(A_THREAD_ID)
        update = "REMOVE " + ", ".join(
            expr.name(a) for a in (*_CHECKPOINT_ATTRIBUTES, self.ttl_attribute)
        )
        condition = f"{tid} = {expr.value('tid', s(thread_id))}"
        if idle_only:
            condition += " AND " + lease_free_condition(expr, now - self.clock_skew)
        try:
            result = await update_head(
                self._table,
                thread_id,
                expr,
                update,
                condition,
                ReturnValues="ALL_NEW",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ConditionFailed as failed:
            # No head (a missing thread, or only history left over), another thread's
            # item, or a live lease.
            check_stored_id(thread_id, failed.item)
            live = live_lease(thread_id, failed.item, now - self.clock_skew)
            if idle_only and live is not None:
                raise flowy.ThreadLeaseBusyError(
                    f"thread {show_id(thread_id)} is leased by {live.owner!r} (token "
                    f"{live.token}); not deleting it while the lease is live"
                ) from None
        else:
            remaining: Mapping[str, Any] = result.get("Attributes") or {}
            if A_TOKEN not in remaining:
                await self._drop_empty_head(thread_id)
        items = await self._history_items(thread_id, None, (PK, SK, A_THREAD_ID))
        await self._table.batch_delete(
            [{PK: i[PK], SK: i[SK]} for i in items if get_s(i, A_THREAD_ID) == thread_id]
        )

    async def _drop_empty_head(self, thread_id: str) -> None:
        # Never leased: nothing to keep. A lease acquired meanwhile (token present) or a
        # new save (revision present) makes the condition false and keeps the item.
        expr = Expression()
        try:
            await self._table.call(
                "delete_item",
                TableName=self._table.name,
                Key=head_key(thread_id),
                ConditionExpression=(
                    f"attribute_not_exists({expr.name(A_TOKEN)}) AND "
                    f"attribute_not_exists({expr.name(A_REVISION)})"
                ),
                **expr.params(),
            )
        except ConditionFailed:
            pass

    # -- listing ----------------------------------------------------------------------

    async def list_threads(
        self,
        *,
        handoff_statuses: frozenset[HandoffStatus] | None = None,
        limit: int = 100,
    ) -> list[ThreadSummary]:
        """List thread heads (optionally only those in ``handoff_statuses``), any order.

        Queries of the ``threads`` index (summary attributes only, no record decoding).
        Index reads are eventually consistent: a save may take a moment to show.
        """
        if limit <= 0:
            return []
        statuses = (
            sorted(HandoffStatus, key=lambda h: h.value)
            if handoff_statuses is None
            else sorted(handoff_statuses, key=lambda h: h.value)
        )
        out: list[ThreadSummary] = []
        for status in statuses:
            for shard in range(self.index_shards):
                expr = Expression()
                items = await self._table.query_all(
                    limit - len(out),
                    TableName=self._table.name,
                    IndexName=INDEX_NAME,
                    KeyConditionExpression=(
                        f"{expr.name(INDEX_PK)} = {expr.value('key', s(f'{status.value}#{shard}'))}"
                    ),
                    Limit=min(limit - len(out), 1000),
                    **expr.params(),
                )
                out.extend(_summary(item) for item in items)
                if len(out) >= limit:
                    return out[:limit]
        return out

    async def close(self) -> None:
        """Release the executor this checkpointer created (a shared one is left alone)."""
        self._table.close()

    def __repr__(self) -> str:
        return f"DynamoCheckpointer(table={self._table.name!r})"


def _revision_of(item: Mapping[str, Any]) -> int:
    sk = get_s(item, SK) or ""
    try:
        return int(sk.removeprefix(HISTORY_PREFIX))
    except ValueError:
        raise flowy.SnapshotEnvelopeInvalidError(
            f"history entry with sort key {sk!r} has no revision"
        ) from None


def _summary(item: Mapping[str, Any]) -> ThreadSummary:
    thread_id = get_s(item, A_THREAD_ID)
    revision = get_int(item, A_REVISION)
    if thread_id is None or revision is None:
        raise flowy.SnapshotEnvelopeInvalidError(
            f"a head item in the threads index lacks its thread id or revision: {item!r}"
        )
    try:
        status = RunStatus(get_s(item, A_STATUS) or "")
        handoff = HandoffStatus(get_s(item, A_HANDOFF) or "")
    except ValueError as exc:
        raise flowy.SnapshotEnvelopeInvalidError(
            f"the head of thread {show_id(thread_id)} has an unknown status: {exc}"
        ) from exc
    return ThreadSummary(
        thread_id=thread_id,
        revision=revision,
        execution_pointer=get_s(item, A_POINTER) or "",
        status=status,
        reason=get_s(item, A_REASON) or "",
        handoff_status=handoff,
        handoff_pending_at=get_float(item, A_HANDOFF_AT),
        updated_at=get_float(item, A_UPDATED) or 0.0,
    )
