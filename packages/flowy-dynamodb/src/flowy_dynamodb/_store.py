"""The four components of a DynamoDB store over one :class:`DynamoTable`.

**Saves.** A save is ONE ``TransactWriteItems``: an ``Update`` of the thread's head
item whose condition checks the revision, the stored thread id and the lease together,
a ``Put`` of the history entry, and for ``save_with_outbox`` the messages (and actions
added with :meth:`DynamoCheckpointer.add_action`). A cancelled transaction is judged
from its cancellation reasons, which carry the head as it was: our own write that landed
earlier (botocore resent a request whose answer was lost) is the success it was; a
cancellation by a concurrent transaction is sent again; otherwise the base class turns
what was seen into the right error.

**Leases** are three attributes of the head item (``lease_owner``,
``lease_expires_at``, ``lease_token``), so one condition checks revision and lease.
Expiry is judged by the clients' clocks: a lease counts as live ``clock_skew`` seconds
past its expiry when another client decides whether to take it over (or to write
without it); its holder stops trusting it at the expiry itself. The fencing token is
``max(previous + 1, now in microseconds)``, so a lease record may go without tokens
going back: release removes the lease attributes, the token too once ``clock_skew`` has
passed since it was issued (no client can issue a smaller one after that), and an item
holding nothing but a lease has a time to live that outlasts the lease.

**Messages.** The message of a thread's committed revision is the item
``outbox#<revision>`` of the thread: unique per (thread, revision), written in the
save's transaction. A live one has ``live_key``, ``visible_at``, ``attempts``,
``error`` and ``enqueued_at`` (when it was enqueued, or came back from the dead
letters; a message written by flowy-dynamodb 0.2.0 has none) (the ``outbox`` index
finds visible ones, oldest first; a claim is a conditional update on the
``visible_at`` it saw); a dead letter has ``dead_key`` and ``dead_at`` instead. Index
reads are eventually consistent: on DynamoDB a new message may take a moment to be
claimable. The backlog (``stats``) reads the ``outbox`` index of every shard, the
``enqueued_at`` of each live message it lists (``BatchGetItem``, so O(messages
pending)), and counts the ``dead_letters`` index.

**Durable time.** A head that waits carries ``wake_at`` and ``timer_shard``, written (or
removed) by the save's own ``Update`` of the head: the sparse ``timers`` index holds the
waiting heads of each shard by wake-up time. A signal is the item ``sig#<seq>`` of its
thread, with the item ``sigid#<signal id>`` holding its number; both are written by one
``TransactWriteItems`` whose ``Put`` actions require the keys to be new, after a
strongly consistent read of the last number, so racing senders get consecutive numbers
(the loser reads again) and a signal id is stored once. An activity journal entry is
the item ``act#<key>``. Deleting a thread removes them with its history.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import random
import uuid
from collections.abc import Hashable, Mapping
from typing import Any, Generic, TypeVar

from flowy.errors import (
    SnapshotEnvelopeInvalidError,
    SnapshotTooLargeError,
    StorageError,
    StorageUnavailableError,
)
from flowy.storage import (
    HandoffStatus,
    Lease,
    OutboxStats,
    OutboxTransaction,
    RunStatus,
    Snapshot,
    StateCodec,
    ThreadSummary,
    Timer,
)
from flowy.storage.dialect import (
    BaseCheckpointer,
    BaseConsumer,
    BaseLeaseManager,
    BaseOutbox,
    Busy,
    EnqueueCallback,
    OutboxRow,
    RawMessage,
    Refused,
    Write,
    show_id,
)

from ._table import (
    ACTIVITIES,
    DEAD_INDEX,
    HISTORY,
    MAX_NUMBER,
    MAX_SEQ,
    MESSAGE,
    MIN_NUMBER,
    OUTBOX_INDEX,
    PK,
    SHARDS,
    SIGNAL,
    SIGNAL_IDS,
    SK,
    THREADS_INDEX,
    TIMERS_INDEX,
    TTL,
    A,
    ConditionFailed,
    DynamoTable,
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
    is_size_error,
    item_size,
    n,
    named_key,
    s,
    shard_of,
    sort_key,
    storable,
    thread_key,
)

__all__ = ["DynamoCheckpointer", "DynamoConsumer", "DynamoLeaseManager", "DynamoOutbox"]

S = TypeVar("S")

ATTEMPTS = 4
SIGNAL_ATTEMPTS = 64
"""Tries of one signal: each one lost to a racing sender (which took the number) reads
again, so this bounds the senders racing for one thread's inbox at once."""
_actions: contextvars.ContextVar[list[Item] | None] = contextvars.ContextVar(
    "flowy_dynamodb_actions", default=None
)
_TRANSIENT = {"TransactionConflict", "ThrottlingError", "ProvisionedThroughputExceeded"}
_HEAD_COLUMNS = (*A.SUMMARY[1:], A.RECORD, A.WRITE_TX, A.LIST_KEY, A.LIST_SORT, A.TIMER)
_ACTIONS = ("Put", "Update", "Delete", "ConditionCheck")


def live_lease(thread_id: str, item: Mapping[str, Any] | None, cutoff: float) -> Lease | None:
    """The lease recorded in ``item`` if it expires after ``cutoff``."""
    owner, token, expires = get_s(item, A.OWNER), get_int(item, A.TOKEN), get_n(item, A.EXPIRES)
    if owner is None or token is None or expires is None or expires <= cutoff:
        return None
    return Lease(thread_id, owner, token, float(expires))


def lease_free(expr: Expression, cutoff: float) -> str:
    """Condition: no lease, or one that expired at or before ``cutoff``."""
    return f"(attribute_not_exists({expr(A.EXPIRES)}) OR {expr(A.EXPIRES)} <= {expr.v(n(cutoff))})"


def lease_held(expr: Expression, lease: Lease, now: float) -> str:
    """Condition: ``lease`` (thread, owner and token) is the live lease at ``now``."""
    return (
        f"{expr(A.THREAD_ID)} = {expr.v(s(lease.thread_id))} AND "
        f"{expr(A.OWNER)} = {expr.v(s(lease.owner))} AND "
        f"{expr(A.TOKEN)} = {expr.v(n(lease.fencing_token))} AND "
        f"{expr(A.EXPIRES)} > {expr.v(n(now))}"
    )


def lease_ttl(table: DynamoTable, lease_end: float, token: int) -> int:
    """The time to live (epoch second) an item needs to outlast a lease ending at
    ``lease_end``, and for no client to issue a token below ``token`` once it is gone."""
    return math.ceil(max(lease_end, token / 1e6) + table.clock_skew) + 1


class DynamoLeaseManager(BaseLeaseManager):
    """Exclusive, expiring, fenced leases on the head items of one table (build it
    through :class:`~flowy_dynamodb.DynamoBackend`)."""

    def __init__(self, table: DynamoTable) -> None:
        self.table = table
        self.domain: Hashable = table.domain

    async def _acquire(self, thread_id: str, owner: str, ttl: float) -> Lease | Busy:
        table = self.table
        table.check_clock("take")
        seen = 0
        for _ in range(ATTEMPTS):
            now = table.clock()
            lease = Lease(thread_id, owner, max(int(now * 1e6), seen + 1), now + ttl)
            expr = Expression()
            fields = {A.THREAD_ID: s(thread_id), A.OWNER: s(owner), A.EXPIRES: n(lease.expires_at)}
            update = expr.sets({**fields, A.TOKEN: n(lease.fencing_token)})  # :v0 … :v3
            tid, tok = expr(A.THREAD_ID), expr(A.TOKEN)
            condition = (
                f"(attribute_not_exists({tid}) OR {tid} = :v0) AND "
                f"{lease_free(expr, now - table.clock_skew)} AND "
                f"(attribute_not_exists({tok}) OR {tok} < :v3)"
            )
            try:
                result = await table.update(head_key(thread_id), expr, update, condition)
            except ConditionFailed as failed:
                check_stored_id(thread_id, failed.item)
                live = live_lease(thread_id, failed.item, now - table.clock_skew)
                if live is not None:
                    return Busy(live)
                seen = get_int(failed.item, A.TOKEN) or 0  # issued by a clock ahead of ours
                continue
            if await self._keep_alive(lease, result):
                return lease
        raise StorageUnavailableError(
            f"could not lease a thread of table {table.name!r} in {ATTEMPTS} attempts: its "
            "lease record kept changing; try again"
        )

    async def _keep_alive(self, lease: Lease, item: Mapping[str, Any]) -> bool:
        """Give an item that holds only the lease a time to live that outlasts it (and
        push back a completed head's that would end sooner). False if the item is gone:
        its own time to live had passed."""
        need = lease_ttl(self.table, lease.expires_at, lease.fencing_token)
        current = get_int(item, TTL)
        if A.REVISION in item and (current is None or current >= need):
            return True
        expr = Expression()
        update = expr.sets({TTL: n(need)})  # :v0
        condition = (
            f"{expr(A.TOKEN)} = {expr.v(n(lease.fencing_token))} AND "
            f"(attribute_not_exists({expr(A.REVISION)}) OR {expr(TTL)} < :v0)"
        )
        try:
            await self.table.update(head_key(lease.thread_id), expr, update, condition)
        except ConditionFailed as failed:
            return failed.item is not None
        return True

    async def _update_held(self, lease: Lease, expr: Expression, update: str) -> Item | None:
        condition = lease_held(expr, lease, self.table.clock())
        try:
            return await self.table.update(head_key(lease.thread_id), expr, update, condition)
        except ConditionFailed:
            return None

    async def _renew(self, lease: Lease, ttl: float) -> Lease | None:
        self.table.check_clock("renew")
        renewed = Lease(lease.thread_id, lease.owner, lease.fencing_token, self.table.clock() + ttl)
        expr = Expression()
        item = await self._update_held(lease, expr, expr.sets({A.EXPIRES: n(renewed.expires_at)}))
        if item is None or not await self._keep_alive(renewed, item):
            return None
        return renewed

    async def _release(self, lease: Lease) -> bool:
        table = self.table
        # Once clock_skew has passed since the token was issued, no client (their clocks
        # are within clock_skew) can issue a smaller one: the token may go too.
        spent = table.clock() - lease.fencing_token / 1e6 >= table.clock_skew
        expr = Expression()
        removed = expr.removes([A.OWNER, A.EXPIRES, *([A.TOKEN] if spent else [])])
        item = await self._update_held(lease, expr, removed.strip())
        if item is None:
            return False
        if A.REVISION not in item and spent:  # nothing left but the key
            expr = Expression()
            condition = expr.all_absent(A.REVISION, A.TOKEN)
            try:
                await table.delete(head_key(lease.thread_id), expr, condition)
            except ConditionFailed:
                pass  # saved or leased again meanwhile
        return True

    async def _holder(self, thread_id: str) -> Lease | None:
        item = await self.table.get(head_key(thread_id), (A.THREAD_ID, A.OWNER, A.EXPIRES, A.TOKEN))
        check_stored_id(thread_id, item)
        return live_lease(thread_id, item, self.table.clock() - self.table.clock_skew)

    def __repr__(self) -> str:
        return f"DynamoLeaseManager(table={self.table.name!r})"


def _key_of(item: Item) -> Item:
    return {PK: item[PK], SK: item[SK]}


def _message_id(item: Item) -> str:
    return f"{item[SK]['S']}|{item[PK]['S']}"  # a sort key never holds "|"


def _message_key(message_id: str) -> Item | None:
    sk, sep, pk = message_id.partition("|")
    if not sep or not sk.startswith(MESSAGE) or not pk.startswith(("thread", "legacy#")):
        return None
    return {PK: s(pk), SK: s(sk)}


def _revive(expr: Expression, pk: str, now: float, payload: bytes | None = None) -> str:
    fields: Item = {
        A.LIVE: s(f"live#{shard_of(pk)}"),
        A.VISIBLE: n(now),
        A.ATTEMPTS: n(0),
        A.ERROR: s(""),
        A.ENQUEUED: n(now),
    }
    if payload is not None:  # written again: the new row's payload
        fields[A.PAYLOAD] = {"B": payload}
    return expr.sets(fields) + expr.removes([A.DEAD, A.DEAD_AT])


def message_write(table: DynamoTable, row: OutboxRow, now: float, *, revive: bool) -> Item:
    """``UpdateItem`` parameters that add ``row``'s message: a new one is created, a live
    one left exactly as it is (condition: not dead); with ``revive``, a dead one comes
    back with ``row``'s payload, its attempts and error reset (condition: dead)."""
    key = entry_key(row.thread_id, MESSAGE, row.committed_revision)
    expr = Expression()
    if revive:
        update = _revive(expr, key[PK]["S"], now, row.payload)
    else:
        kept = {A.PAYLOAD: {"B": row.payload}, A.VISIBLE: n(now), A.ATTEMPTS: n(0), A.ERROR: s("")}
        kept[A.ENQUEUED] = n(now)
        update = expr.sets(
            {A.THREAD_ID: s(row.thread_id), A.LIVE: s(f"live#{shard_of(key[PK]['S'])}")}
        )
        update += "".join(
            f", {expr(k)} = if_not_exists({expr(k)}, {expr.v(v)})" for k, v in kept.items()
        )
    condition = f"attribute_{'exists' if revive else 'not_exists'}({expr(A.DEAD)})"
    return {
        "TableName": table.name,
        "Key": key,
        "UpdateExpression": update,
        "ConditionExpression": condition,
        **expr.params(),
    }


class DynamoOutbox(BaseOutbox):
    """The producing side: one conditional ``UpdateItem`` per message (or, through
    ``save_with_outbox``, an action of the checkpoint's transaction)."""

    def __init__(self, table: DynamoTable) -> None:
        self.table = table
        self.domain: Hashable = table.domain

    async def _append(self, row: OutboxRow) -> None:
        for revive in (False, True, False):  # new or live; else dead; else raced: again
            try:
                params = message_write(self.table, row, self.table.clock(), revive=revive)
                await self.table.call("update_item", **params)
                break
            except ConditionFailed:
                continue
        self.table.notify()


class DynamoConsumer(BaseConsumer):
    """The consuming side, for ``flowy.Worker``: a claim queries the ``outbox`` index of
    every shard; while there is nothing, ``claim(wait=...)`` polls with a growing pause
    (up to ``poll_interval``) and wakes at once for messages this store adds."""

    def __init__(
        self, table: DynamoTable, *, max_attempts: int = 5, poll_interval: float = 0.5
    ) -> None:
        super().__init__(max_attempts=max_attempts, poll_interval=poll_interval)
        self.table = table
        self.domain: Hashable = table.domain
        self._pause = 0.02

    async def _claim(self, limit: int, visibility_timeout: float) -> list[RawMessage]:
        now = self.table.clock()

        async def visible(shard: int) -> list[Item]:
            expr = Expression()
            live, now_value = expr.v(s(f"live#{shard}")), expr.v(n(now))
            condition = f"{expr(A.LIVE)} = {live} AND {expr(A.VISIBLE)} <= {now_value}"
            return await self.table.query(
                limit,
                IndexName=OUTBOX_INDEX,
                KeyConditionExpression=condition,
                Limit=limit,
                **expr.params(),
            )

        found = await asyncio.gather(*(visible(shard) for shard in range(SHARDS)))
        oldest = sorted(
            (i for items in found for i in items), key=lambda i: get_n(i, A.VISIBLE) or 0
        )
        taken = await asyncio.gather(
            *(self._take(i, now, visibility_timeout) for i in oldest[:limit])
        )
        claimed = [message for message in taken if message is not None]
        if claimed:
            self._pause = 0.02
        return claimed

    async def _take(self, item: Item, now: float, visibility_timeout: float) -> RawMessage | None:
        expr = Expression()
        update = expr.sets({A.VISIBLE: n(now + visibility_timeout)})
        update += f", {expr(A.ATTEMPTS)} = {expr(A.ATTEMPTS)} + {expr.v(n(1))}"
        condition = (
            f"attribute_exists({expr(A.LIVE)}) AND {expr(A.VISIBLE)} = {expr.v(item[A.VISIBLE])}"
        )
        try:
            return _raw_message(await self.table.update(_key_of(item), expr, update, condition))
        except ConditionFailed:
            return None  # claimed, released or acked by someone else meanwhile

    async def _change(
        self, message_id: str, expr: Expression, update: str | None, live: bool
    ) -> bool:
        key = _message_key(message_id)
        if key is None:
            return False
        condition = f"attribute_exists({expr(A.LIVE if live else A.DEAD)})"
        try:
            if update is None:
                await self.table.delete(key, expr, condition)
            else:
                await self.table.update(key, expr, update, condition)
        except ConditionFailed:
            return False
        return True

    async def _ack(self, message_id: str) -> None:
        await self._change(message_id, Expression(), None, live=True)

    async def _release(self, message_id: str, *, error: str, delay: float, dead: bool) -> None:
        now = self.table.clock()
        expr = Expression()
        if dead:
            fields = {A.DEAD: s("dead"), A.DEAD_AT: n(now), A.ERROR: s(error)}
            update = expr.sets(fields) + expr.removes([A.LIVE, A.VISIBLE])
        else:
            update = expr.sets({A.VISIBLE: n(now + delay), A.ERROR: s(error)})
        if await self._change(message_id, expr, update, live=True) and not dead:
            self.table.notify()

    async def _dead_letters(self, limit: int) -> list[RawMessage]:
        expr = Expression()
        condition = f"{expr(A.DEAD)} = {expr.v(s('dead'))}"
        items = await self.table.query(
            limit,
            IndexName=DEAD_INDEX,
            KeyConditionExpression=condition,
            Limit=limit,
            **expr.params(),
        )
        return [_raw_message(item) for item in items]

    async def _retry_dead_letter(self, message_id: str) -> bool:
        expr = Expression()
        pk = message_id.partition("|")[2]
        revived = await self._change(
            message_id, expr, _revive(expr, pk, self.table.clock()), live=False
        )
        if revived:
            self.table.notify()
        return revived

    async def _stats(self) -> OutboxStats:
        async def listed(shard: int) -> list[Item]:
            expr = Expression()
            condition = f"{expr(A.LIVE)} = {expr.v(s(f'live#{shard}'))}"
            return await self.table.query(
                None, IndexName=OUTBOX_INDEX, KeyConditionExpression=condition, **expr.params()
            )

        async def dead() -> int:
            expr = Expression()
            condition = f"{expr(A.DEAD)} = {expr.v(s('dead'))}"
            return await self.table.count(
                IndexName=DEAD_INDEX, KeyConditionExpression=condition, **expr.params()
            )

        parts, buried = await asyncio.gather(
            asyncio.gather(*(listed(shard) for shard in range(SHARDS))), dead()
        )
        keys = [_key_of(item) for part in parts for item in part]
        # The index is KEYS_ONLY: the enqueue times are on the items. A message acked
        # since the index was read is gone (or dead) by now, and not counted.
        items = await self.table.get_keys(keys, (A.LIVE, A.ENQUEUED, A.VISIBLE))
        times = [
            get_n(i, A.ENQUEUED) or get_n(i, A.VISIBLE) or 0  # 0.2.0 messages: visible_at
            for i in items
            if A.LIVE in i
        ]
        oldest = float(min(times)) if times else None
        return OutboxStats(len(times), oldest, buried)

    async def _wait(self, seconds: float) -> None:
        await self.table.wait_notified(min(seconds, self._pause))
        self._pause = min(self._pause * 2, self.poll_interval)

    def __repr__(self) -> str:
        return f"DynamoConsumer(table={self.table.name!r}, max_attempts={self.max_attempts})"


def _raw_message(item: Item) -> RawMessage:
    payload, error = get_b(item, A.PAYLOAD) or b"", get_s(item, A.ERROR) or ""
    return RawMessage(_message_id(item), payload, get_int(item, A.ATTEMPTS) or 0, error)


class DynamoCheckpointer(BaseCheckpointer[S], Generic[S]):
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

    def add_action(self, tx: object, action: Mapping[str, Any]) -> None:
        """In the enqueue callback of :meth:`save_with_outbox`, add an action of the
        application (``{"Put": {...}}``, ``Update``, ``Delete`` or ``ConditionCheck``, in
        the low-level client's shape) to the save's ``TransactWriteItems``: it commits
        with the snapshot and the hand-off, or nothing does."""
        actions = _actions.get()
        if not isinstance(tx, OutboxTransaction) or not tx.open or actions is None:
            raise RuntimeError(
                "add_action works only inside the enqueue callback of save_with_outbox"
            )
        if tx.domain != self.domain:
            raise ValueError("the transaction belongs to another store")
        if len(action) != 1 or next(iter(action)) not in _ACTIONS:
            raise ValueError(f"an action is one of {', '.join(_ACTIONS)}, not {sorted(action)!r}")
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

    async def _write(self, write: Write) -> Refused | None:
        table, extra = self.table, _actions.get() or []
        if 2 + len(write.outbox) + len(extra) > 100:
            raise ValueError("a DynamoDB transaction holds at most 100 actions (2 are the save's)")
        write_tx = uuid.uuid4().hex  # marks this save's items: a resent request is recognised
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
                elif not any(code in _TRANSIENT for code, _, _ in reasons):
                    self._raise_for(write, reasons)
                await asyncio.sleep(0.02 * 2**attempt)
                continue
            if write.outbox:
                table.notify()
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
        update = expr.sets(fields) + expr.removes(a for a in optional if a not in fields)
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
        common = {"TableName": table.name, "ReturnValuesOnConditionCheckFailure": "ALL_OLD"}
        absent = {
            "ConditionExpression": "attribute_not_exists(#pk)",
            "ExpressionAttributeNames": {"#pk": PK},
        }
        head_update = {"Key": key, "UpdateExpression": update, "ConditionExpression": condition}
        return (
            {"Update": {**common, **head_update, **expr.params()}},
            {"Put": {**common, "Item": entry, **absent}},
        )

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

    def _raise_for(self, write: Write, reasons: list[tuple[str, str, Item | None]]) -> None:
        where = f"the save of thread {show_id(write.thread_id)} at revision {write.revision}"
        for code, message, _ in reasons:
            if code == "ValidationError" and is_size_error(message):
                raise SnapshotTooLargeError(
                    f"DynamoDB refused {where}: an item is over the size limit ({message}); "
                    "nothing was written",
                    limit=self.table.max_item_bytes,
                )
        failed = "; ".join(
            f"action {i}: {c} {m}".strip() for i, (c, m, _) in enumerate(reasons) if c != "None"
        )
        raise StorageError(
            f"{where} was cancelled and nothing was written ({failed}); an action the "
            "enqueue callback added failed its condition or was invalid"
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

    async def _read_head(self, thread_id: str) -> tuple[int, bytes] | None:
        item = await self.table.get(head_key(thread_id), (A.THREAD_ID, A.REVISION, A.RECORD))
        check_stored_id(thread_id, item)
        revision, record = get_int(item, A.REVISION), get_b(item, A.RECORD)
        if revision is None:
            return None  # no item, or one that holds only a lease
        if record is None:
            raise SnapshotEnvelopeInvalidError(
                f"the head of thread {show_id(thread_id)} has no record"
            )
        return revision, record

    async def _items_of(
        self,
        thread_id: str,
        sort: str | tuple[str, str],
        limit: int | None,
        *attributes: str,
        newest_first: bool = False,
    ) -> list[Item]:
        """Up to ``limit`` (or all) items of the thread whose sort key begins with
        ``sort`` (or lies between its two bounds), in sort key order; strongly
        consistent, each checked to be the thread's."""
        expr = Expression()
        condition = f"{expr(PK)} = {expr.v(s(thread_key(thread_id)))} AND "
        if isinstance(sort, str):
            condition += f"begins_with({expr(SK)}, {expr.v(s(sort))})"
        else:
            condition += f"{expr(SK)} BETWEEN {expr.v(s(sort[0]))} AND {expr.v(s(sort[1]))}"
        items = await self.table.query(
            limit,
            KeyConditionExpression=condition,
            ProjectionExpression=", ".join(map(expr, (PK, SK, A.THREAD_ID, *attributes))),
            ScanIndexForward=not newest_first,
            ConsistentRead=True,
            **({"Limit": limit} if limit is not None else {}),
            **expr.params(),
        )
        for item in items:
            check_stored_id(thread_id, item)
        return items

    async def _history(self, thread_id: str, limit: int | None, *attributes: str) -> list[Item]:
        return await self._items_of(thread_id, HISTORY, limit, *attributes, newest_first=True)

    async def _read_history(self, thread_id: str, limit: int) -> list[tuple[int, bytes]]:
        out: list[tuple[int, bytes]] = []
        for item in await self._history(thread_id, limit, A.REVISION, A.RECORD):
            revision, record = _revision_of(item), get_b(item, A.RECORD)
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
            revision = _revision_of(item)
            if top is not None and (revision == top or (revision < top and kept < keep)):
                kept += 1
            else:  # older than the kept ones, or debris beyond the head
                doomed.append(_key_of(item))
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
            *(self._items_of(thread_id, p, None) for p in (HISTORY, SIGNAL[:3], ACTIVITIES))
        )
        signals.sort(key=lambda i: not (get_s(i, SK) or "").startswith(SIGNAL_IDS))
        await table.delete_keys([_key_of(i) for i in (*history, *signals, *journal)])
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

    # -- durable time --------------------------------------------------------------------
    async def _timers(self, before: float, limit: int) -> list[Timer]:
        if before <= -MAX_NUMBER:
            return []  # no wake-up time is stored this early

        async def due(shard: int) -> list[Item]:
            expr = Expression()
            condition = f"{expr(A.TIMER)} = {expr.v(s(f'timers#{shard}'))}"
            if before < MAX_NUMBER:  # else: every timer
                # No stored time lies strictly between 0 and +-MIN_NUMBER: compare with 0.
                op = "<" if -MIN_NUMBER < before < 0 else "<="
                bound = before if storable(before) else 0.0
                condition += f" AND {expr(A.WAKE)} {op} {expr.v(n(bound))}"
            return await self.table.query(
                limit,
                IndexName=TIMERS_INDEX,
                KeyConditionExpression=condition,
                Limit=limit,
                **expr.params(),
            )

        found = await asyncio.gather(*(due(shard) for shard in range(SHARDS)))
        timers = sorted(
            (get_n(i, A.WAKE) or 0, get_s(i, A.THREAD_ID) or "") for part in found for i in part
        )
        return [Timer(thread_id, float(at)) for at, thread_id in timers[:limit]]

    async def _append_signal(
        self, thread_id: str, signal_id: str, data: bytes, max_seq: int
    ) -> tuple[int, bool] | None:
        table = self.table
        seen_key = named_key(thread_id, SIGNAL_IDS, signal_id)
        named = {A.THREAD_ID: s(thread_id), A.SIGNAL_ID: s(signal_id)}
        absent = {
            "TableName": table.name,
            "ConditionExpression": "attribute_not_exists(#pk)",
            "ExpressionAttributeNames": {"#pk": PK},
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        for attempt in range(SIGNAL_ATTEMPTS):
            seen, last = await asyncio.gather(
                table.get(seen_key, (A.THREAD_ID, A.SIGNAL_ID, A.SEQ)),
                self._items_of(thread_id, (SIGNAL, _signal_sk(MAX_SEQ)), 1, newest_first=True),
            )
            if seen is not None:
                return self._seen_seq(thread_id, signal_id, seen), False
            seq = (_seq_of(last[0]) if last else 0) + 1
            if seq > max_seq:  # the transaction below fails if another took this number
                return None
            if seq > MAX_SEQ:
                raise StorageError(f"the inbox of thread {show_id(thread_id)} is full")
            signal = {PK: seen_key[PK], SK: s(_signal_sk(seq)), **named, A.DATA: {"B": data}}
            number = {**seen_key, **named, A.SEQ: n(seq)}
            try:
                await table.call(
                    "transact_write_items",
                    TransactItems=[
                        {"Put": {**absent, "Item": signal}},
                        {"Put": {**absent, "Item": number}},
                    ],
                )
            except ConditionFailed as cancelled:
                failed, reasons = cancelled.failed(), cancelled.reasons
                if 1 in failed and reasons[1][2] is not None:  # the id was sent meanwhile
                    return self._seen_seq(thread_id, signal_id, reasons[1][2]), False
                if not failed and not any(code in _TRANSIENT for code, _, _ in reasons):
                    reason = "; ".join(f"{c} {m}".strip() for c, m, _ in reasons if c != "None")
                    raise StorageError(
                        f"DynamoDB refused signal {seq} of thread {show_id(thread_id)} "
                        f"({reason}); nothing was written"
                    ) from cancelled
                # another sender took the number (or a transaction conflicted): again
                await asyncio.sleep(random.uniform(0, 0.002 * 2 ** min(attempt, 6)))
                continue
            return seq, True
        raise StorageUnavailableError(
            f"could not add a signal to thread {show_id(thread_id)} in {SIGNAL_ATTEMPTS} "
            "attempts: other senders kept taking the next number; try again"
        )

    @staticmethod
    def _seen_seq(thread_id: str, signal_id: str, item: Item) -> int:
        """The number a stored signal id names (checked to be this thread's and id's)."""
        check_stored_id(thread_id, item)
        seq = get_int(item, A.SEQ)
        if seq is None or get_s(item, A.SIGNAL_ID) != signal_id:
            raise SnapshotEnvelopeInvalidError(
                f"the record of signal id {signal_id!r:.80} of thread {show_id(thread_id)} "
                "is damaged"
            )
        return seq

    async def _read_signals(
        self, thread_id: str, after: int, limit: int
    ) -> list[tuple[int, bytes]]:
        if after >= MAX_SEQ:
            return []
        bounds = (_signal_sk(after + 1), _signal_sk(MAX_SEQ))
        out: list[tuple[int, bytes]] = []
        for item in await self._items_of(thread_id, bounds, limit, A.DATA):
            seq, data = _seq_of(item), get_b(item, A.DATA)
            if data is None:
                raise SnapshotEnvelopeInvalidError(
                    f"signal {seq} of thread {show_id(thread_id)} has no data"
                )
            out.append((seq, data))
        return out

    async def _put_activity(self, thread_id: str, key: str, data: bytes) -> None:
        item = named_key(thread_id, ACTIVITIES, key)
        item |= {A.THREAD_ID: s(thread_id), A.KEY: s(key), A.DATA: {"B": data}}
        await self.table.call("put_item", TableName=self.table.name, Item=item)

    async def _get_activity(self, thread_id: str, key: str) -> bytes | None:
        item = await self.table.get(
            named_key(thread_id, ACTIVITIES, key), (A.THREAD_ID, A.KEY, A.DATA)
        )
        if item is None:
            return None
        check_stored_id(thread_id, item)
        return _activity_data(thread_id, item, key)

    async def _list_activities(self, thread_id: str) -> list[bytes]:
        items = await self._items_of(thread_id, ACTIVITIES, None, A.KEY, A.DATA)
        return [_activity_data(thread_id, item, None) for item in items]

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


def _signal_sk(seq: int) -> str:
    return f"{SIGNAL}{seq:020d}"


def _seq_of(item: Item) -> int:
    sk = get_s(item, SK) or ""
    try:
        return int(sk.removeprefix(SIGNAL))
    except ValueError:
        raise SnapshotEnvelopeInvalidError(f"signal {sk!r} has no number") from None


def _activity_data(thread_id: str, item: Item, key: str | None) -> bytes:
    """The data of a journal entry, checked to be entry ``key`` (any key: ``None``)."""
    stored, data = get_s(item, A.KEY), get_b(item, A.DATA)
    if data is None or stored is None or (key is not None and stored != key):
        raise SnapshotEnvelopeInvalidError(
            f"the journal entry {stored or key!r:.80} of thread {show_id(thread_id)} is damaged"
        )
    return data


def _revision_of(item: Item) -> int:
    sk = get_s(item, SK) or ""
    try:
        return int(sk.removeprefix(HISTORY))
    except ValueError:
        raise SnapshotEnvelopeInvalidError(f"history entry {sk!r} has no revision") from None
