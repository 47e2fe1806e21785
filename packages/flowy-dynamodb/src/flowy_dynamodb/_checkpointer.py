"""Strict-OCC snapshots on DynamoDB: :class:`DynamoCheckpointer`.

A save is ONE ``TransactWriteItems``: an ``Update`` of the thread's head item whose
condition checks the revision, the stored thread id and the lease together, a ``Put``
of the history entry, and, for ``save_with_outbox``, the outbox messages (and any
actions the application added with :meth:`DynamoCheckpointer.add_action`). A single
``UpdateItem`` cannot do it: the history entry is a second item, and only a
transaction writes two items atomically.

A cancelled transaction is classified from its cancellation reasons, which carry the
head item as it was: a write of our own that already landed (botocore resent a request
whose answer was lost) is the success it was; a cancellation by a concurrent
transaction or throttling is sent again; otherwise the base class turns what was seen
into ``ConcurrencyConflictError``, ``LeaseLostError`` or ``ThreadLeaseBusyError``.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import uuid
from collections.abc import Mapping
from typing import Any, Generic, TypeVar

from flowy.errors import (
    SnapshotEnvelopeInvalidError,
    SnapshotTooLargeError,
    StorageError,
    StorageUnavailableError,
)
from flowy.storage import (
    BaseCheckpointer,
    EnqueueCallback,
    HandoffStatus,
    Lease,
    OutboxTransaction,
    Refused,
    RunStatus,
    Snapshot,
    StateCodec,
    ThreadSummary,
    Write,
    show_id,
)

from ._leases import ATTEMPTS, lease_free, lease_held, lease_ttl, live_lease
from ._outbox import message_write
from ._store import (
    HISTORY_PREFIX,
    PK,
    SHARDS,
    SK,
    THREADS_INDEX,
    TTL,
    A,
    CancelReason,
    ConditionFailed,
    DynamoTable,
    Expression,
    Item,
    TransactionCancelled,
    check_stored_id,
    get_b,
    get_int,
    get_n,
    get_s,
    head_key,
    is_size_error,
    item_size,
    n,
    s,
    shard_of,
    sort_key,
    thread_key,
)

__all__ = ["DynamoCheckpointer"]

S = TypeVar("S")

_actions: contextvars.ContextVar[list[dict[str, Any]] | None] = contextvars.ContextVar(
    "flowy_dynamodb_actions", default=None
)
_TRANSIENT = frozenset({"TransactionConflict", "ThrottlingError", "ProvisionedThroughputExceeded"})
_HEAD_COLUMNS = (
    A.REVISION, A.POINTER, A.STATUS, A.REASON, A.HANDOFF, A.HANDOFF_AT, A.UPDATED, A.RECORD,
    A.WRITE_TX, A.LIST_KEY, A.LIST_SORT,
)  # fmt: skip
_LEASE_ALLOWANCE = 1024  # room kept in the head item for the lease attributes


class DynamoCheckpointer(BaseCheckpointer[S], Generic[S]):
    """The checkpointer of one table (native fencing, transactional outbox).

    Build it through :class:`~flowy_dynamodb.DynamoBackend`. ``expire_statuses``: the
    statuses whose heads get a time to live when the store has ``expire_after``.
    """

    def __init__(
        self,
        table: DynamoTable,
        *,
        codec: StateCodec[S] | None = None,
        expire_statuses: frozenset[RunStatus] = frozenset({RunStatus.COMPLETED}),
    ) -> None:
        super().__init__(codec=codec)
        self.table = table
        self.domain = table.domain
        self.expire_statuses = expire_statuses

    def add_action(self, tx: object, action: Mapping[str, Any]) -> None:
        """Inside the enqueue callback of :meth:`save_with_outbox`, add one action of the
        application (``{"Put": {...}}``, ``Update``, ``Delete`` or ``ConditionCheck``, in
        the low-level client's shape) to the checkpoint's ``TransactWriteItems``: it
        commits with the snapshot and the hand-off, or nothing does."""
        actions = _actions.get()
        if not isinstance(tx, OutboxTransaction) or not tx.open or actions is None:
            raise RuntimeError(
                "add_action works only inside the enqueue callback of save_with_outbox, "
                "with the handle it was given"
            )
        if tx.domain != self.domain:
            raise ValueError("the transaction belongs to another store")
        if len(action) != 1 or next(iter(action)) not in (
            "Put",
            "Update",
            "Delete",
            "ConditionCheck",
        ):
            raise ValueError(
                f"an action is one of Put, Update, Delete, ConditionCheck; got {sorted(action)!r}"
            )
        actions.append(dict(action))

    async def save_with_outbox(
        self,
        expected_revision: int,
        snapshot: Snapshot[S],
        enqueue: EnqueueCallback,
        *,
        lease: Lease | None = None,
    ) -> int:
        """Save like ``save`` and commit the messages ``enqueue(tx, revision)`` adds (and
        the actions it adds with :meth:`add_action`) in the same transaction."""
        token = _actions.set([])
        try:
            return await super().save_with_outbox(expected_revision, snapshot, enqueue, lease=lease)
        finally:
            _actions.reset(token)

    # -- saving ----------------------------------------------------------------------

    async def _write(self, write: Write) -> Refused | None:
        table = self.table
        extra = _actions.get() or []
        if 2 + len(write.outbox) + len(extra) > 100:
            raise ValueError("a DynamoDB transaction holds at most 100 actions (2 are the save's)")
        write_tx = uuid.uuid4().hex  # marks this save's items: a resent request is recognised
        revive: set[int] = set()
        for attempt in range(ATTEMPTS):
            now = table.clock()
            head, entry = self._items(write, write_tx, now)
            messages = [
                {"Update": message_write(table, row, now, revive=i in revive)}
                for i, row in enumerate(write.outbox)
            ]
            try:
                await table.call(
                    "transact_write_items", TransactItems=[head, entry, *messages, *extra]
                )
            except TransactionCancelled as cancelled:
                reasons = cancelled.reasons
                failed = [i for i, r in enumerate(reasons) if r.code == "ConditionalCheckFailed"]
                if failed and failed[0] == 0:
                    return await self._refused(write, reasons[0], now, write_tx)
                dead = {i - 2 for i in failed if 2 <= i < 2 + len(write.outbox)}
                if dead and len(dead) == len(failed):
                    revive ^= dead  # a dead message of this revision: revive it (or back)
                    continue
                if failed == [1]:  # a history entry left from an earlier life of the thread
                    await self._drop_leftover(write, reasons[1].item)
                elif not any(r.code in _TRANSIENT for r in reasons):
                    self._raise_for(write, reasons)
                await asyncio.sleep(0.02 * 2**attempt)
                continue
            if write.outbox:
                table.notify()
            return None
        raise StorageUnavailableError(
            f"the save of thread {show_id(write.thread_id)} at revision {write.revision} was "
            f"cancelled {ATTEMPTS} times by concurrent transactions or throttling; nothing "
            "was written, retry later"
        )

    def _items(self, write: Write, write_tx: str, now: float) -> tuple[Item, Item]:
        """The head ``Update`` and the history ``Put`` of ``write``, size-checked."""
        table, head, lease = self.table, write.summary, write.lease
        pk = thread_key(write.thread_id)
        fields: Item = {
            A.THREAD_ID: s(write.thread_id),
            A.REVISION: n(write.revision),
            A.POINTER: s(head.execution_pointer),
            A.STATUS: s(head.status.value),
            A.REASON: s(head.reason),
            A.HANDOFF: s(head.handoff_status.value),
            A.UPDATED: n(head.updated_at),
            A.RECORD: {"B": write.record},
            A.WRITE_TX: s(write_tx),
            A.LIST_KEY: s(f"{head.handoff_status.value}#{shard_of(pk)}"),
            A.LIST_SORT: s(sort_key(write.thread_id)),
        }
        if head.handoff_pending_at is not None:
            fields[A.HANDOFF_AT] = n(head.handoff_pending_at)
        if table.expire_after is not None and head.status in self.expire_statuses:
            expires = math.ceil(now + table.expire_after)
            if lease is not None:  # never before the lease ends
                expires = max(expires, lease_ttl(table, lease.expires_at, lease.fencing_token))
            fields[TTL] = n(expires)
        expr = Expression()  # the thread id is the first field: its placeholder is :v0
        sets = ", ".join(
            f"{expr.name(k)} = {expr.value(f'v{i}', v)}" for i, (k, v) in enumerate(fields.items())
        )
        removed = [expr.name(a) for a in (A.HANDOFF_AT, TTL) if a not in fields]
        rev, tid = expr.name(A.REVISION), expr.name(A.THREAD_ID)
        revision_ok = (
            f"attribute_not_exists({rev})"
            if write.expected_revision == 0
            else f"{rev} = {expr.value('expected', n(write.expected_revision))}"
        )
        lease_ok = (
            lease_free(expr, now - table.clock_skew)
            if lease is None
            else lease_held(expr, lease, now)
        )
        update = {
            "TableName": table.name,
            "Key": head_key(write.thread_id),
            "UpdateExpression": f"SET {sets}"
            + (f" REMOVE {', '.join(removed)}" if removed else ""),
            "ConditionExpression": (
                f"{revision_ok} AND (attribute_not_exists({tid}) OR {tid} = :v0) AND {lease_ok}"
            ),
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            **expr.params(),
        }
        entry: Item = {
            PK: s(pk),
            SK: s(f"{HISTORY_PREFIX}{write.revision:020d}"),
            **{k: fields[k] for k in (A.THREAD_ID, A.REVISION, A.RECORD, A.WRITE_TX)},
            **({TTL: fields[TTL]} if TTL in fields else {}),
        }
        size = max(
            item_size({**head_key(write.thread_id), **fields}) + _LEASE_ALLOWANCE, item_size(entry)
        )
        if size > table.max_item_bytes:
            raise SnapshotTooLargeError(
                f"the snapshot of thread {show_id(write.thread_id)} at revision "
                f"{write.revision} needs a DynamoDB item of about {size} bytes (its record is "
                f"{len(write.record)} bytes); the limit is {table.max_item_bytes} bytes. "
                "Nothing was written. Keep large payloads out of the state (e.g. in S3)",
                size=size,
                limit=table.max_item_bytes,
            )
        put = {
            "TableName": table.name,
            "Item": entry,
            "ConditionExpression": "attribute_not_exists(#pk)",
            "ExpressionAttributeNames": {"#pk": PK},
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        return {"Update": update}, {"Put": put}

    async def _refused(
        self, write: Write, reason: CancelReason, now: float, write_tx: str
    ) -> Refused | None:
        """The head's condition failed: ``None`` if it is our own write that landed
        earlier, else what the head held (revision, and the lease live by the judge of
        this save: its holder's own clock with a lease, plus the skew without)."""
        item = reason.item
        check_stored_id(write.thread_id, item)
        actual = get_int(item, A.REVISION) or 0
        if actual == write.revision and get_s(item, A.WRITE_TX) == write_tx:
            return None  # botocore resent a request whose first copy landed
        if actual > write.revision:
            entry = await self.table.get(
                {
                    PK: s(thread_key(write.thread_id)),
                    SK: s(f"{HISTORY_PREFIX}{write.revision:020d}"),
                },
                (A.WRITE_TX,),
            )
            if get_s(entry, A.WRITE_TX) == write_tx:
                return None  # ours landed, and others saved on top since
        cutoff = now if write.lease is not None else now - self.table.clock_skew
        return Refused(actual, live_lease(write.thread_id, item, cutoff))

    def _raise_for(self, write: Write, reasons: list[CancelReason]) -> None:
        """Raise for a cancellation that sending again cannot fix."""
        for index, r in enumerate(reasons):
            if r.code == "ValidationError" and is_size_error(r.message):
                raise SnapshotTooLargeError(
                    f"DynamoDB refused the save of thread {show_id(write.thread_id)} at "
                    f"revision {write.revision}: action {index} is over the item size limit "
                    f"({r.message}). Nothing was written",
                    limit=self.table.max_item_bytes,
                )
        failed = "; ".join(
            f"action {i}: {r.code} {r.message}".strip()
            for i, r in enumerate(reasons)
            if r.code != "None"
        )
        raise StorageError(
            f"the save of thread {show_id(write.thread_id)} at revision {write.revision} was "
            f"cancelled and nothing was written ({failed}); an action the enqueue callback "
            "added failed its condition or was invalid"
        )

    async def _drop_leftover(self, write: Write, item: Mapping[str, Any] | None) -> None:
        # The head was at the expected revision, so an entry at the next revision can only
        # be left from an earlier life of the thread whose delete did not finish.
        expr = Expression()
        stale = get_s(item, A.WRITE_TX)
        condition = (
            f"{expr.name(A.WRITE_TX)} = {expr.value('tx', s(stale))}"
            if stale is not None
            else f"attribute_exists({expr.name(PK)})"
        )
        try:
            await self.table.call(
                "delete_item",
                TableName=self.table.name,
                Key={
                    PK: s(thread_key(write.thread_id)),
                    SK: s(f"{HISTORY_PREFIX}{write.revision:020d}"),
                },
                ConditionExpression=condition,
                **expr.params(),
            )
        except ConditionFailed:
            pass  # gone or replaced already: the next attempt tells

    # -- reading ---------------------------------------------------------------------

    async def _read_head(self, thread_id: str) -> tuple[int, bytes] | None:
        item = await self.table.get(head_key(thread_id), (A.THREAD_ID, A.REVISION, A.RECORD))
        check_stored_id(thread_id, item)
        revision = get_int(item, A.REVISION)
        if revision is None:
            return None  # no item, or one that holds only a lease
        record = get_b(item, A.RECORD)
        if record is None:
            raise SnapshotEnvelopeInvalidError(
                f"the head of thread {show_id(thread_id)} has no record"
            )
        return revision, record

    async def _history(
        self, thread_id: str, limit: int | None, attributes: tuple[str, ...]
    ) -> list[Item]:
        expr = Expression()
        items = await self.table.query(
            limit,
            KeyConditionExpression=(
                f"{expr.name(PK)} = {expr.value('pk', s(thread_key(thread_id)))} AND "
                f"begins_with({expr.name(SK)}, {expr.value('prefix', s(HISTORY_PREFIX))})"
            ),
            ProjectionExpression=", ".join(
                expr.name(a) for a in (PK, SK, A.THREAD_ID, *attributes)
            ),
            ScanIndexForward=False,
            ConsistentRead=True,
            **({"Limit": limit} if limit is not None else {}),
            **expr.params(),
        )
        for item in items:
            check_stored_id(thread_id, item)
        return items

    async def _read_history(self, thread_id: str, limit: int) -> list[tuple[int, bytes]]:
        out: list[tuple[int, bytes]] = []
        for item in await self._history(thread_id, limit, (A.REVISION, A.RECORD)):
            revision, record = _revision_of(item), get_b(item, A.RECORD)
            if record is None or get_int(item, A.REVISION) != revision:
                raise SnapshotEnvelopeInvalidError(
                    f"history entry {revision} of thread {show_id(thread_id)} is damaged"
                )
            out.append((revision, record))
        return out

    async def _prune(self, thread_id: str, keep: int) -> None:
        head = await self._read_revision(thread_id)
        doomed: list[Item] = []
        kept = 0
        for item in await self._history(thread_id, None, ()):  # newest first
            revision = _revision_of(item)
            if head is not None and (revision == head or (revision < head and kept < keep)):
                kept += 1
            else:  # older than the kept ones, or debris beyond the head
                doomed.append({PK: item[PK], SK: item[SK]})
        await self.table.delete_keys(doomed)

    async def _read_revision(self, thread_id: str) -> int | None:
        item = await self.table.get(head_key(thread_id), (A.THREAD_ID, A.REVISION))
        check_stored_id(thread_id, item)
        return get_int(item, A.REVISION)

    # -- deleting --------------------------------------------------------------------

    async def _delete(self, thread_id: str, *, if_idle: bool) -> Lease | None:
        table = self.table
        for _ in range(ATTEMPTS):
            now = table.clock()
            expr = Expression()
            tid, tok = expr.name(A.THREAD_ID), expr.name(A.TOKEN)
            # Delete the whole item when no live lease holds it and its token (if any) is
            # spent: no client can issue a smaller one any more.
            spent = expr.value("spent", n(int((now - table.clock_skew) * 1e6)))
            condition = (
                f"{tid} = {expr.value('tid', s(thread_id))} AND "
                f"{lease_free(expr, now - table.clock_skew)} AND "
                f"(attribute_not_exists({tok}) OR {tok} <= {spent})"
            )
            try:
                await table.call(
                    "delete_item",
                    TableName=table.name,
                    Key=head_key(thread_id),
                    ConditionExpression=condition,
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                    **expr.params(),
                )
                break
            except ConditionFailed as failed:
                item = failed.item
            if item is None:
                break  # no head item: only history (if any) to delete
            check_stored_id(thread_id, item)
            live = live_lease(thread_id, item, now - table.clock_skew)
            if live is not None and if_idle:
                return live
            if await self._strip(thread_id, item, live):
                break
        else:
            raise StorageUnavailableError(
                f"could not delete thread {show_id(thread_id)}: its head kept changing; retry"
            )
        history = await self._history(thread_id, None, ())
        await table.delete_keys([{PK: i[PK], SK: i[SK]} for i in history])
        return None

    async def _strip(self, thread_id: str, item: Mapping[str, Any], live: Lease | None) -> bool:
        """Remove the head's columns but keep its live lease, or the fresh token of an
        ended one, on an item with a time to live that outlasts both."""
        token = get_int(item, A.TOKEN) or 0
        end = live.expires_at if live is not None else 0.0
        expr = Expression()
        removed = [*_HEAD_COLUMNS, *(() if live is not None else (A.OWNER, A.EXPIRES))]
        ttl = expr.value("ttl", n(lease_ttl(self.table, end, token)))
        update = f"SET {expr.name(TTL)} = {ttl} REMOVE " + ", ".join(expr.name(a) for a in removed)
        condition = f"{expr.name(A.TOKEN)} = {expr.value('token', n(token))}"
        if live is not None:
            condition += f" AND {expr.name(A.OWNER)} = {expr.value('owner', s(live.owner))}"
        try:
            await self.table.update(head_key(thread_id), expr, update, condition)
        except ConditionFailed:
            return False
        return True

    # -- listing ---------------------------------------------------------------------

    async def _list_heads(
        self, statuses: frozenset[HandoffStatus] | None, limit: int, after: str | None
    ) -> list[ThreadSummary]:
        wanted = sorted(statuses if statuses is not None else HandoffStatus, key=lambda h: h.value)
        parts = await asyncio.gather(
            *(
                self._index_range(f"{h.value}#{shard}", limit, after)
                for h in wanted
                for shard in range(SHARDS)
            )
        )
        items = sorted(
            (i for part in parts for i in part), key=lambda i: get_s(i, A.THREAD_ID) or ""
        )
        return [
            self.summary(
                get_s(i, A.THREAD_ID) or "",
                get_n(i, A.REVISION),
                get_s(i, A.POINTER),
                get_s(i, A.STATUS),
                get_s(i, A.REASON),
                get_s(i, A.HANDOFF),
                get_n(i, A.HANDOFF_AT),
                get_n(i, A.UPDATED),
            )
            for i in items[:limit]
        ]

    async def _index_range(self, list_key: str, limit: int, after: str | None) -> list[Item]:
        """The first ``limit`` heads of one index partition by thread id (past ``after``):
        read on while the index's sort key (the id cut to 1 KiB) ties with the last one."""
        expr = Expression()
        condition = f"{expr.name(A.LIST_KEY)} = {expr.value('key', s(list_key))}"
        if after is not None:
            condition += (
                f" AND {expr.name(A.LIST_SORT)} >= {expr.value('after', s(sort_key(after)))}"
            )
        out: list[Item] = []
        start: Item | None = None
        while True:
            page = await self.table.call(
                "query",
                TableName=self.table.name,
                IndexName=THREADS_INDEX,
                KeyConditionExpression=condition,
                Limit=limit + 1,
                **({"ExclusiveStartKey": start} if start else {}),
                **expr.params(),
            )
            items: list[Item] = page.get("Items") or []
            out.extend(i for i in items if after is None or (get_s(i, A.THREAD_ID) or "") > after)
            start = page.get("LastEvaluatedKey")
            if start is None or not items:
                return out
            if len(out) >= limit and get_s(items[-1], A.LIST_SORT) != get_s(
                out[limit - 1], A.LIST_SORT
            ):
                return out

    def __repr__(self) -> str:
        return f"DynamoCheckpointer(table={self.table.name!r}, codec={self.codec!r})"


def _revision_of(item: Mapping[str, Any]) -> int:
    sk = get_s(item, SK) or ""
    try:
        return int(sk.removeprefix(HISTORY_PREFIX))
    except ValueError:
        raise SnapshotEnvelopeInvalidError(f"history entry {sk!r} has no revision") from None
