"""The checkpointer: the head item and history entries of each thread.

A save is ONE ``TransactWriteItems``: an ``Update`` of the thread's head item whose
condition checks the revision, the stored thread id and the lease together, a ``Put`` of
the history entry, and for ``save_with_outbox`` the messages (and actions added with
``checkpointer.add_action``). The lease lives on the head item, so the last save of a
leased segment releases it in the same ``Update``, and the ``UpdateItem`` that takes a
lease returns the head it is on (a start or resume reads nothing more). A cancelled
transaction is judged from its cancellation reasons, which carry the head as it was:
our own write that landed earlier (botocore resent a request whose answer was lost) is
the success it was; a cancellation by a concurrent transaction is sent again; otherwise
the base class turns what was seen into the right error.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Hashable, Mapping
from typing import Any, Generic, TypeVar, cast

from flowy.errors import (
    SnapshotEnvelopeInvalidError,
    SnapshotTooLargeError,
    StorageError,
    StorageUnavailableError,
)
from flowy.storage import HandoffStatus, Lease, RunStatus, StateCodec, ThreadSummary
from flowy.storage.dialect import BaseCheckpointer, Busy, Refused, Write, new_write_id, show_id

from ._durable import DurableTime
from ._layout import (
    ACTIVITIES,
    HISTORY,
    MAX_NUMBER,
    MIN_NUMBER,
    PK,
    SHARDS,
    SIGNAL,
    SIGNAL_IDS,
    SK,
    THREADS_INDEX,
    TTL,
    A,
    Expression,
    Item,
    check_stored_id,
    entry_key,
    get_b,
    get_int,
    get_n,
    get_s,
    get_text,
    head_key,
    item_size,
    key_of,
    n,
    number_in,
    s,
    shard_of,
    sort_key,
    storable,
)
from ._leases import ATTEMPTS, lease_free, lease_held, lease_ttl, live_lease, take_lease
from ._outbox import message_write
from ._table import ConditionFailed, DynamoTable, is_size_error

__all__ = ["DynamoCheckpointer"]

S = TypeVar("S")

_HEAD_COLUMNS = (*A.SUMMARY[1:], A.RECORD, A.WRITE_TX, A.LIST_KEY, A.LIST_SORT, A.TIMER)
_ACTIONS = ("Put", "Update", "Delete", "ConditionCheck")


class DynamoCheckpointer(DurableTime, BaseCheckpointer[S], Generic[S]):
    """The checkpointer of one table (native fencing, transactional outbox; build it
    through :class:`~flowy_dynamodb.DynamoBackend`). Heads whose status is in
    ``expire_statuses`` get a time to live when the store has ``expire_after``. No index
    holds the heads by run status: ``oldest_heads`` reads the whole ``heads`` index."""

    def __init__(
        self,
        table: DynamoTable,
        *,
        codec: StateCodec[S] | None = None,
        expire_statuses: frozenset[RunStatus] = frozenset({RunStatus.COMPLETED}),
    ) -> None:
        super().__init__(codec=codec)
        self.table = table
        self.domain: Hashable = table.domain
        self.expire_statuses = expire_statuses

    def _native_action(self, action: object) -> object:
        """An action of the application (``{"Put": {...}}``, ``Update``, ``Delete`` or
        ``ConditionCheck``, in the low-level client's shape) for the save's
        ``TransactWriteItems``: it commits with the snapshot and the hand-off, or
        nothing does (``checkpointer.add_action(tx, action)``)."""
        if not isinstance(action, Mapping) or len(action) != 1:  # pyright: ignore[reportUnknownArgumentType]
            raise ValueError(f"an action is one of {', '.join(_ACTIONS)}, not {action!r:.80}")
        kind = next(iter(cast(Mapping[str, Any], action)))
        if kind not in _ACTIONS:
            raise ValueError(f"an action is one of {', '.join(_ACTIONS)}, not {kind!r:.80}")
        return dict(cast(Mapping[str, Any], action))

    async def _write(self, write: Write) -> Refused | None:
        return await self._transact(write)

    async def _write_release(self, write: Write) -> Refused | None:
        return await self._transact(write)  # the head's update removes the lease

    async def _transact(self, write: Write) -> Refused | None:
        table, extra = self.table, cast(tuple[Item, ...], write.native)
        if 2 + len(write.outbox) + len(extra) > 100:
            raise ValueError("a DynamoDB transaction holds at most 100 actions (2 are the save's)")
        write_tx = new_write_id()  # marks this save's items: a resent request is recognised
        revive: set[int] = set()
        for attempt in range(ATTEMPTS):
            now = table.clock()
            messages = [
                {"Update": message_write(table, row, now, revive=i in revive)}
                for i, row in enumerate(write.outbox)
            ]
            try:
                items = [*self._items(write, write_tx, now), *messages, *extra]
                await table.call("transact_write_items", TransactItems=items)
            except ConditionFailed as cancelled:
                failed, reasons = cancelled.failed(), cancelled.reasons
                if failed[:1] == [0]:
                    return await self._refused(write, cancelled.item, now, write_tx)
                dead = {i - 2 for i in failed if 2 <= i < 2 + len(write.outbox)}
                if dead and len(dead) == len(failed):
                    revive ^= dead  # a dead message of this revision: revive it (or not)
                    continue
                if failed == [1]:  # a history entry left from an earlier life of the thread
                    await self._drop_leftover(write, reasons[1][2])
                elif not cancelled.transient():
                    self._raise_for(write, cancelled)
                await asyncio.sleep(0.02 * 2**attempt)
                continue
            if write.outbox:
                table.wakeups.notify()
            return None
        raise StorageUnavailableError(
            f"the save of thread {show_id(write.thread_id)} at revision {write.revision} was "
            f"cancelled {ATTEMPTS} times by concurrent transactions; nothing was written"
        )

    def _items(self, write: Write, write_tx: str, now: float) -> tuple[Item, Item]:
        """The head ``Update`` and the history ``Put`` of ``write``, size-checked."""
        table, head, lease = self.table, write.summary, write.lease
        key = head_key(write.thread_id)
        fields: Item = {
            A.THREAD_ID: s(write.thread_id),  # :v0
            A.REVISION: n(write.revision),
            A.POINTER: s(head.execution_pointer),
            A.STATUS: s(head.status.value),
            A.REASON: s(head.reason),
            A.HANDOFF: s(head.handoff_status.value),
            A.UPDATED: n(head.updated_at),
            A.RECORD: {"B": write.record},
            A.WRITE_TX: s(write_tx),
            A.LIST_KEY: s(f"{head.handoff_status.value}#{shard_of(key[PK]['S'])}"),
            A.LIST_SORT: s(sort_key(write.thread_id)),
        }
        if head.handoff_pending_at is not None:
            fields[A.HANDOFF_AT] = n(head.handoff_pending_at)
        if head.graph_version:  # absent: saved by a graph without a version
            fields[A.GRAPH_VERSION] = s(head.graph_version)
        if head.wake_at is not None:  # a waiting head: in the timers index
            wake_at = float(head.wake_at)
            if not storable(wake_at):
                raise ValueError(
                    f"the snapshot of thread {show_id(write.thread_id)} wakes up at "
                    f"{wake_at!r}, which DynamoDB cannot store: a wake-up time is 0 or of a "
                    f"magnitude from {MIN_NUMBER:g} to below {MAX_NUMBER:g} seconds"
                )
            fields[A.TIMER] = s(f"timers#{shard_of(key[PK]['S'])}")
            fields[A.WAKE] = n(wake_at)
        if table.expire_after is not None and head.status in self.expire_statuses:
            expires = math.ceil(now + table.expire_after)
            if lease is not None:  # never before the lease ends
                expires = max(expires, lease_ttl(table, lease.expires_at, lease.fencing_token))
            fields[TTL] = n(expires)
        expr = Expression()
        optional = (A.HANDOFF_AT, TTL, A.TIMER, A.WAKE, A.GRAPH_VERSION)
        removed = [a for a in optional if a not in fields]
        if write.release and lease is not None:  # the lease (fenced below) goes; its token stays
            removed += [A.OWNER, A.EXPIRES]
        update = expr.sets(fields) + expr.removes(removed)
        rev, tid = expr(A.REVISION), expr(A.THREAD_ID)
        expected = write.expected_revision
        revision_ok = (
            f"{rev} = {expr.v(n(expected))}" if expected else f"attribute_not_exists({rev})"
        )
        lease_ok = (
            lease_free(expr, now - table.clock_skew)
            if lease is None
            else lease_held(expr, lease, now)
        )
        condition = f"{revision_ok} AND (attribute_not_exists({tid}) OR {tid} = :v0) AND {lease_ok}"
        entry: Item = entry_key(write.thread_id, HISTORY, write.revision)
        entry.update(
            {
                k: v
                for k, v in fields.items()
                if k in (A.THREAD_ID, A.REVISION, A.RECORD, A.WRITE_TX, TTL)
            }
        )
        size = max(item_size({**key, **fields}) + 1024, item_size(entry))  # 1 KiB: the lease
        if size > table.max_item_bytes:
            raise SnapshotTooLargeError(
                f"the snapshot of thread {show_id(write.thread_id)} at revision "
                f"{write.revision} needs a DynamoDB item of about {size} bytes (its record is "
                f"{len(write.record)} bytes); the limit is {table.max_item_bytes} bytes. "
                "Nothing was written. Keep large payloads out of the state (e.g. in S3)",
                size=size,
                limit=table.max_item_bytes,
            )
        head_update = {
            "TableName": table.name,
            "Key": key,
            "UpdateExpression": update,
            "ConditionExpression": condition,
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        return {"Update": {**head_update, **expr.params()}}, table.put_new(entry)

    async def _refused(
        self, write: Write, item: Item | None, now: float, write_tx: str
    ) -> Refused | None:
        """The head's condition failed: ``None`` if it is our own write that landed
        earlier, else what the head holds (the lease live by the judge of this save: the
        holder's own clock with a lease, the clock plus the skew without)."""
        check_stored_id(write.thread_id, item)
        actual = get_int(item, A.REVISION) or 0
        if actual == write.revision and get_s(item, A.WRITE_TX) == write_tx:
            return None  # botocore resent a request whose first copy landed
        if actual > write.revision:
            entry = await self.table.get(
                entry_key(write.thread_id, HISTORY, write.revision), (A.WRITE_TX,)
            )
            if get_s(entry, A.WRITE_TX) == write_tx:
                return None  # ours landed, and others saved on top since
        cutoff = now if write.lease is not None else now - self.table.clock_skew
        return Refused(actual, live_lease(write.thread_id, item, cutoff))

    def _raise_for(self, write: Write, cancelled: ConditionFailed) -> None:
        where = f"the save of thread {show_id(write.thread_id)} at revision {write.revision}"
        for code, message, _ in cancelled.reasons:
            if code == "ValidationError" and is_size_error(message):
                raise SnapshotTooLargeError(
                    f"DynamoDB refused {where}: an item is over the size limit ({message}); "
                    "nothing was written",
                    limit=self.table.max_item_bytes,
                )
        raise StorageError(
            f"{where} was cancelled and nothing was written ({cancelled.describe()}); an "
            "action the enqueue callback added failed its condition or was invalid"
        )

    async def _drop_leftover(self, write: Write, item: Item | None) -> None:
        # The head was at the expected revision, so an entry at the next revision can only
        # be left from an earlier life of the thread whose delete did not finish.
        expr = Expression()
        condition = f"{expr(A.WRITE_TX)} = {expr.v(s(get_s(item, A.WRITE_TX) or ''))}"
        try:
            await self.table.delete(
                entry_key(write.thread_id, HISTORY, write.revision), expr, condition
            )
        except ConditionFailed:
            pass  # gone or replaced already: the next attempt tells

    async def _acquire_head(
        self, thread_id: str, owner: str, ttl: float
    ) -> tuple[Lease | Busy, tuple[int, bytes] | None]:
        # The lease is on the head item: the acquisition's UpdateItem returns the head.
        got, item = await take_lease(self.table, thread_id, owner, ttl)
        if isinstance(got, Busy):
            return got, None
        return got, self._head_of(thread_id, item)

    async def _read_head(self, thread_id: str) -> tuple[int, bytes] | None:
        item = await self.table.get(head_key(thread_id), (A.THREAD_ID, A.REVISION, A.RECORD))
        return self._head_of(thread_id, item)

    @staticmethod
    def _head_of(thread_id: str, item: Item | None) -> tuple[int, bytes] | None:
        check_stored_id(thread_id, item)
        revision, record = get_int(item, A.REVISION), get_b(item, A.RECORD)
        if revision is None:
            return None  # no item, or one that holds only a lease
        if record is None:
            raise SnapshotEnvelopeInvalidError(
                f"the head of thread {show_id(thread_id)} has no record"
            )
        return revision, record

    async def _history(self, thread_id: str, limit: int | None, *attributes: str) -> list[Item]:
        return await self.table.thread_items(
            thread_id, HISTORY, limit, *attributes, newest_first=True
        )

    async def _read_history(self, thread_id: str, limit: int) -> list[tuple[int, bytes]]:
        out: list[tuple[int, bytes]] = []
        for item in await self._history(thread_id, limit, A.REVISION, A.RECORD):
            revision, record = number_in(item, HISTORY), get_b(item, A.RECORD)
            if record is None or get_int(item, A.REVISION) != revision:
                raise SnapshotEnvelopeInvalidError(
                    f"history entry {revision} of thread {show_id(thread_id)} is damaged"
                )
            out.append((revision, record))
        return out

    async def _prune(self, thread_id: str, keep: int) -> None:
        head = await self.table.get(head_key(thread_id), (A.THREAD_ID, A.REVISION))
        check_stored_id(thread_id, head)
        top = get_int(head, A.REVISION)
        doomed: list[Item] = []
        kept = 0
        for item in await self._history(thread_id, None):  # newest first
            revision = number_in(item, HISTORY)
            if top is not None and (revision == top or (revision < top and kept < keep)):
                kept += 1
            else:  # older than the kept ones, or debris beyond the head
                doomed.append(key_of(item))
        await self.table.delete_keys(doomed)

    async def _delete(self, thread_id: str, *, if_idle: bool) -> Lease | None:
        table = self.table
        for _ in range(ATTEMPTS):
            now = table.clock()
            expr = Expression()
            # The whole item goes unless a live lease holds it or its token is fresh: a
            # client whose clock is behind ours could still issue a smaller one.
            tid, tok, spent = (
                expr(A.THREAD_ID),
                expr(A.TOKEN),
                n(int((now - table.clock_skew) * 1e6)),
            )
            condition = (
                f"{tid} = {expr.v(s(thread_id))} AND {lease_free(expr, now - table.clock_skew)}"
                f" AND (attribute_not_exists({tok}) OR {tok} <= {expr.v(spent)})"
            )
            try:
                await table.delete(head_key(thread_id), expr, condition)
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
                f"thread {show_id(thread_id)} kept changing while deleted; retry"
            )
        # The history, then the signal ids before their signals (an id is never left
        # naming a number that a later signal could take), then the journal.
        history, signals, journal = await asyncio.gather(
            # "sig" begins the keys of signals and of signal ids alike
            *(table.thread_items(thread_id, p, None) for p in (HISTORY, SIGNAL[:3], ACTIVITIES))
        )
        signals.sort(key=lambda i: not (get_s(i, SK) or "").startswith(SIGNAL_IDS))
        await table.delete_keys([key_of(i) for i in (*history, *signals, *journal)])
        return None

    async def _strip(self, thread_id: str, item: Item, live: Lease | None) -> bool:
        """Remove the head's columns but keep its live lease, or the fresh token of an
        ended one, on an item whose time to live outlasts both."""
        token = get_int(item, A.TOKEN) or 0
        expr = Expression()
        removed = [*_HEAD_COLUMNS, *(() if live else (A.OWNER, A.EXPIRES))]
        ttl = lease_ttl(self.table, live.expires_at if live else 0.0, token)
        update = expr.sets({TTL: n(ttl)}) + expr.removes(removed)
        condition = f"{expr(A.TOKEN)} = {expr.v(n(token))}"
        if live is not None:
            condition += f" AND {expr(A.OWNER)} = {expr.v(s(live.owner))}"
        try:
            await self.table.update(head_key(thread_id), expr, update, condition)
        except ConditionFailed:
            return False
        return True

    async def _oldest_heads(self, statuses: frozenset[RunStatus]) -> dict[RunStatus, float]:
        # No index by run status: every partition of the `heads` index is read (O(threads)
        # read units), only the status and save time of the heads in `statuses` sent back.
        async def partition(list_key: str) -> list[Item]:
            expr = Expression()
            wanted = ", ".join(expr.v(s(status.value)) for status in sorted(statuses))
            return await self.table.query(
                None,
                IndexName=THREADS_INDEX,
                KeyConditionExpression=f"{expr(A.LIST_KEY)} = {expr.v(s(list_key))}",
                FilterExpression=f"{expr(A.STATUS)} IN ({wanted})",
                ProjectionExpression=f"{expr(A.STATUS)}, {expr(A.UPDATED)}",
                **expr.params(),
            )

        keys = [f"{h.value}#{i}" for h in HandoffStatus for i in range(SHARDS)]
        oldest: dict[RunStatus, float] = {}
        for part in await asyncio.gather(*(partition(key) for key in keys)):
            for item in part:
                status, at = RunStatus(get_s(item, A.STATUS) or ""), get_n(item, A.UPDATED)
                if at is not None and float(at) < oldest.get(status, math.inf):
                    oldest[status] = float(at)
        return oldest

    async def _list_heads(
        self, statuses: frozenset[HandoffStatus] | None, limit: int, after: str | None
    ) -> list[ThreadSummary]:
        keys = [f"{h.value}#{i}" for h in (statuses or HandoffStatus) for i in range(SHARDS)]
        parts = await asyncio.gather(*(self._index_range(key, limit, after) for key in keys))
        heads = sorted(
            (i for part in parts for i in part), key=lambda i: get_s(i, A.THREAD_ID) or ""
        )
        return [
            self.summary(get_s(i, A.THREAD_ID) or "", *(get_text(i, a) for a in A.SUMMARY[1:]))
            for i in heads[:limit]
        ]

    async def _index_range(self, list_key: str, limit: int, after: str | None) -> list[Item]:
        """The first ``limit`` heads of one index partition in thread-id order (past
        ``after``), read on while the index's sort key (the id cut to 1 KiB) ties."""
        expr = Expression()
        condition = f"{expr(A.LIST_KEY)} = {expr.v(s(list_key))}"
        if after is not None:
            condition += f" AND {expr(A.LIST_SORT)} >= {expr.v(s(sort_key(after)))}"
        pages = self.table.pages(
            IndexName=THREADS_INDEX,
            KeyConditionExpression=condition,
            Limit=limit + 1,
            **expr.params(),
        )
        out: list[Item] = []
        async for page in pages:
            items: list[Item] = page.get("Items") or []
            out.extend(i for i in items if after is None or (get_s(i, A.THREAD_ID) or "") > after)
            if not items or (
                len(out) >= limit
                and get_s(items[-1], A.LIST_SORT) != get_s(out[limit - 1], A.LIST_SORT)
            ):
                break
        return out

    def __repr__(self) -> str:
        return f"DynamoCheckpointer(table={self.table.name!r}, codec={self.codec!r})"
