"""Durable time: the timers, the signal inboxes and the activity journals of a table.

A head that waits carries ``wake_at`` and ``timer_shard``, written (or removed) by the
save's own ``Update`` of the head: the sparse ``timers`` index holds the waiting heads
of each shard by wake-up time. A signal is the item ``sig#<seq>`` of its thread, with
the item ``sigid#<signal id>`` holding its number; both are written by one
``TransactWriteItems`` whose ``Put`` actions require the keys to be new, after a
strongly consistent read of the last number, so racing senders get consecutive numbers
(the loser reads again) and a signal id is stored once. An activity journal entry is the
item ``act#<key>``. Deleting a thread removes them with its history.
"""

from __future__ import annotations

import asyncio
import random

from flowy.errors import SnapshotEnvelopeInvalidError, StorageError, StorageUnavailableError
from flowy.storage import Timer
from flowy.storage.dialect import show_id

from ._layout import (
    ACTIVITIES,
    MAX_SEQ,
    PK,
    SHARDS,
    SIGNAL,
    SIGNAL_IDS,
    SK,
    TIMERS_INDEX,
    A,
    Item,
    check_stored_id,
    get_b,
    get_int,
    get_n,
    get_s,
    n,
    named_key,
    number_in,
    s,
    storable,
)
from ._table import ConditionFailed, DynamoTable

__all__ = ["DurableTime"]

SIGNAL_ATTEMPTS = 64
"""Tries of one signal: each one lost to a racing sender (which took the number) reads
again, so this bounds the senders racing for one thread's inbox at once."""
_TIMERS = [f"timers#{shard}" for shard in range(SHARDS)]
"""The partitions of the ``timers`` index: one per shard."""


class DurableTime:
    """The durable-time primitives of :class:`~flowy_dynamodb.DynamoCheckpointer`."""

    table: DynamoTable

    async def _timers(self, before: float, limit: int) -> list[Timer]:
        # No stored time lies strictly between 0 and MIN_NUMBER: such a bound reads as 0.
        bound = n(before if storable(before) else 0.0)
        found = await self.table.query_index(
            TIMERS_INDEX, A.TIMER, _TIMERS, limit, lambda e: f"{e(A.WAKE)} <= {e.v(bound)}"
        )
        timers = sorted((get_n(i, A.WAKE) or 0, get_s(i, A.THREAD_ID) or "") for i in found)
        return [Timer(thread_id, float(at)) for at, thread_id in timers[:limit]]

    async def _append_signal(
        self, thread_id: str, signal_id: str, data: bytes, max_seq: int
    ) -> tuple[int, bool] | None:
        table = self.table
        seen_key = named_key(thread_id, SIGNAL_IDS, signal_id)
        named = {A.THREAD_ID: s(thread_id), A.SIGNAL_ID: s(signal_id)}
        for attempt in range(SIGNAL_ATTEMPTS):
            seen, last = await asyncio.gather(
                table.get(seen_key, (A.THREAD_ID, A.SIGNAL_ID, A.SEQ)),
                table.thread_items(thread_id, (SIGNAL, _signal_sk(MAX_SEQ)), 1, newest_first=True),
            )
            if seen is not None:
                return _seen_seq(thread_id, signal_id, seen), False
            seq = (number_in(last[0], SIGNAL) if last else 0) + 1
            if seq > max_seq:  # the transaction below fails if another took this number
                return None
            if seq > MAX_SEQ:
                raise StorageError(f"the inbox of thread {show_id(thread_id)} is full")
            signal = {PK: seen_key[PK], SK: s(_signal_sk(seq)), **named, A.DATA: {"B": data}}
            number = {**seen_key, **named, A.SEQ: n(seq)}
            try:
                await table.call(
                    "transact_write_items",
                    TransactItems=[table.put_new(signal), table.put_new(number)],
                )
            except ConditionFailed as cancelled:
                failed, reasons = cancelled.failed(), cancelled.reasons
                if 1 in failed and reasons[1][2] is not None:  # the id was sent meanwhile
                    return _seen_seq(thread_id, signal_id, reasons[1][2]), False
                if not failed and not cancelled.transient():
                    raise StorageError(
                        f"DynamoDB refused signal {seq} of thread {show_id(thread_id)} "
                        f"({cancelled.describe()}); nothing was written"
                    ) from cancelled
                # another sender took the number (or a transaction conflicted): again
                await asyncio.sleep(random.uniform(0, 0.002 * 2 ** min(attempt, 6)))
                continue
            return seq, True
        raise StorageUnavailableError(
            f"could not add a signal to thread {show_id(thread_id)} in {SIGNAL_ATTEMPTS} "
            "attempts: other senders kept taking the next number; try again"
        )

    async def _read_signals(
        self, thread_id: str, after: int, limit: int
    ) -> list[tuple[int, bytes]]:
        if after >= MAX_SEQ:
            return []
        bounds = (_signal_sk(after + 1), _signal_sk(MAX_SEQ))
        out: list[tuple[int, bytes]] = []
        for item in await self.table.thread_items(thread_id, bounds, limit, A.DATA):
            seq, data = number_in(item, SIGNAL), get_b(item, A.DATA)
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
        item = await self.table.get(named_key(thread_id, ACTIVITIES, key), (A.THREAD_ID, A.DATA))
        if item is None:
            return None
        check_stored_id(thread_id, item)
        return _activity_data(thread_id, item)

    async def _list_activities(self, thread_id: str) -> list[bytes]:
        items = await self.table.thread_items(thread_id, ACTIVITIES, None, A.DATA)
        return [_activity_data(thread_id, item) for item in items]


def _signal_sk(seq: int) -> str:
    return f"{SIGNAL}{seq:020d}"


def _seen_seq(thread_id: str, signal_id: str, item: Item) -> int:
    """The number a stored signal id names (checked to be this thread's and id's)."""
    check_stored_id(thread_id, item)
    seq = get_int(item, A.SEQ)
    if seq is None or get_s(item, A.SIGNAL_ID) != signal_id:
        raise SnapshotEnvelopeInvalidError(
            f"the record of signal id {signal_id!r:.80} of thread {show_id(thread_id)} is damaged"
        )
    return seq


def _activity_data(thread_id: str, item: Item) -> bytes:
    """The data of a journal entry (the base checks it names the key asked for)."""
    data = get_b(item, A.DATA)
    if data is None:
        raise SnapshotEnvelopeInvalidError(
            f"a journal entry of thread {show_id(thread_id)} has no data"
        )
    return data
