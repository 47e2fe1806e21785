"""Durable waits: sending a signal to a thread, and what a waiting thread does when it is
resumed (take its signal, or follow its timeout route).

A wait is a snapshot with status ``WAITING``, saved with its wake-up time (``wake_at``,
indexed by the store: ``Checkpointer.timers``) and the signal it waits for. Signals go
to the thread's inbox in the same store; a snapshot's ``signal_cursors`` record the last
signal of each name the run took, so a signal is taken once: the cursor moves in the
same write as the state it changed (strict OCC).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from ._errors import ThreadCompletedError
from ._graph import Graph
from ._segment import maybe_await, require_durable
from ._types import JSON, ResumeToken, S
from .storage import (
    Checkpointer,
    DurableCheckpointer,
    HandoffIntent,
    HandoffStatus,
    LeaseGuardCheckpointer,
    Outbox,
    Route,
    RunStatus,
    Signal,
    Snapshot,
)
from .storage._adapt import Merge
from .storage._codecs import merge_fields
from .storage._durable import check_key
from .storage.dialect import validate_thread_id

__all__ = [
    "Wake",
    "durable_of",
    "merge_update",
    "next_signal",
    "send_signal",
    "take_signal",
    "wake",
    "wake_from",
]


_FINISHED = (RunStatus.COMPLETED, RunStatus.FAILED)


def durable_of(cp: Checkpointer[Any] | None, what: str) -> DurableCheckpointer[Any]:
    """The checkpointer's timers, inbox and journal; ``TypeError`` naming ``what`` if
    the store keeps none."""
    inner = cp.inner if isinstance(cp, LeaseGuardCheckpointer) else cp
    return require_durable(
        inner if isinstance(inner, DurableCheckpointer) else None, type(inner).__name__, what
    )


def merge_update(graph: Graph[S, Any], state: S, update: object, merge: Merge | None = None) -> S:
    """``update`` merged into ``state`` as a ``state_overlay`` is: a mapping of fields
    into a dataclass, msgspec Struct, pydantic model or TypedDict state, field by field,
    the result validated by ``merge`` (the store codec's ``merge``, if it has one; an unknown field
    or a value that does not fit is a ``ValueError`` naming it); anything else through
    the graph's reducer."""
    if isinstance(update, Mapping):
        fields = cast(Mapping[str, Any], update)
        if merge is not None:
            merged = cast("S | None", merge(state, fields))
        else:  # no codec known: the fields are merged, not validated
            merged = merge_fields(state, fields, graph.state_type)
        if merged is not None:
            return merged
    return graph.reducer(state, cast(S, update))


async def next_signal(
    cp: DurableCheckpointer[Any], thread_id: str, name: str, cursors: Mapping[str, int]
) -> Signal | None:
    """The first signal ``name`` of the thread after the one its cursor names."""
    after = cursors.get(name, 0)
    while True:
        batch = await cp.signals(thread_id, after=after, limit=100)
        for signal in batch:
            if signal.name == name:
                return signal
        if len(batch) < 100:
            return None
        after = batch[-1].seq


async def take_signal(
    graph: Graph[S, Any],
    state: S,
    signal: Signal,
    cursors: dict[str, int],
    merge: Merge | None = None,
) -> S:
    """``state`` with ``signal``'s payload merged in (the graph's ``on_signal`` handler,
    else :func:`merge_update`), and the signal's cursor moved to it."""
    handler = graph.signal_handlers.get(signal.name)
    if handler is not None:
        state = cast(S, await maybe_await(handler(state, signal.payload)))
    elif signal.payload is not None:
        state = merge_update(graph, state, signal.payload, merge)
    cursors[signal.name] = signal.seq
    return state


@dataclass(frozen=True, slots=True)
class Wake:
    """How a resumed waiting thread goes on: at ``pointer``, with ``signal`` to take
    (``None`` on a timeout or an early resume)."""

    pointer: str
    signal: Signal | None = None
    timed_out: bool = False


async def wake(
    cp: Checkpointer[Any] | None, graph: Graph[Any, Any], snap: Snapshot[Any], now: float
) -> Wake:
    """Where a resume of the waiting head ``snap`` continues (see :func:`wake_from`),
    with the signals of ``cp``'s store."""
    inner = cp.inner if isinstance(cp, LeaseGuardCheckpointer) else cp
    durable = inner if isinstance(inner, DurableCheckpointer) else None
    return await wake_from(durable, type(inner).__name__, snap, now)


async def wake_from(
    durable: DurableCheckpointer[Any] | None, store: str, snap: Snapshot[Any], now: float
) -> Wake:
    """Where a resume of the waiting head ``snap`` continues: with its signal if one is
    in ``durable``'s inbox; at its timeout route once its deadline passed; else (an
    early resume by token) at its resume node without a signal."""
    pointer = snap.execution_pointer
    if snap.waiting_for:
        durable = require_durable(durable, store, "a resume of a thread waiting for a signal")
        signal = await next_signal(durable, snap.thread_id, snap.waiting_for, snap.signal_cursors)
        if signal is not None:
            return Wake(pointer, signal)
    if snap.wake_at is not None and snap.wake_at <= now:
        return Wake(snap.on_timeout or pointer, timed_out=True)
    return Wake(pointer)


async def send_signal(
    durable: DurableCheckpointer[Any],
    outbox: Outbox | None,
    thread_id: str,
    name: str,
    payload: JSON,
    signal_id: str | None,
    now: float,
) -> Signal:
    """Store the signal in the thread's inbox (once per ``signal_id``) and, if the
    thread waits for it, put a wake-up message in the outbox for a worker, in the queue
    its waiting snapshot names (its graph's default queue).

    The inbox is written before the head is read again, and a waiting run reads the
    inbox after its waiting snapshot is saved: so either the run sees the signal, or
    this sees the run waiting and wakes it.
    """
    validate_thread_id(thread_id)
    check_key(name, "signal name")
    if signal_id is not None:
        check_key(signal_id, "signal id")
    snap, _ = await durable.load(thread_id)
    if snap.status in _FINISHED:
        raise ThreadCompletedError(
            f"thread {thread_id!r:.200} has finished ({snap.status.value}, "
            f"{snap.reason!r:.80}); a signal to it would never be delivered"
        )
    signal = Signal(thread_id, name, payload, signal_id or uuid.uuid4().hex, sent_at=now)
    taken = max(snap.signal_cursors.values(), default=0)
    stored = await durable.append_signal(signal, taken=taken)
    snap, revision = await durable.load(thread_id)
    if (
        outbox is not None
        and snap.status is RunStatus.WAITING
        and snap.waiting_for == stored.name
        and snap.signal_cursors.get(stored.name, 0) < stored.seq
    ):
        await outbox.enqueue_intent(
            HandoffIntent(
                thread_id=thread_id,
                pending_snapshot_revision=revision,
                committed_snapshot_revision=revision,
                snapshot_revision=revision,
                resume_token=ResumeToken(thread_id, revision),
                handoff_status=HandoffStatus.ENQUEUED,
                reason=f"signal:{stored.name}",
                execution_pointer=snap.execution_pointer,
                created_at=now,
                route=Route(snap.route.queue),
            )
        )
    return stored
