"""Cost tests: what a store reads for ``load``, a page of ``list_threads``, due timers
and ``claim`` must not grow with the number of revisions, threads or messages.

Nothing is timed. The suite counts what crosses the primitive layer while the public
call runs: every primitive called (``_read_head``, ``_read_history``, ``_list_heads``,
``_timers``, ``_claim``, ``_claim_queue``, ``_release``, ``_dead_letters``), every row
each one returns, and every head the store builds with ``self.summary``. The count is taken on the
store's own checkpointer and consumer objects, so a primitive built from another
primitive (a head read through the whole history, timers found by paging every head) or
rows materialised and filtered in Python are counted too. A store is measured twice, with
a few and with many revisions, threads or messages; the second count must not be larger.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pytest

from ...storage import Backend, RunStatus
from ...storage.dialect import BaseCheckpointer, BaseConsumer
from ._support import (
    Suite,
    fixed_time,
    make_intent,
    make_snapshot,
    new_thread_id,
    require_capability,
    saved_chain,
)

__all__ = ["CostSuite"]

_COUNTED = (
    "_read_head",
    "_read_history",
    "_list_heads",
    "_timers",
    "_claim",
    "_claim_queue",
    "_release",
    "_dead_letters",
)


class _Reads:
    """Primitive calls and the rows they returned, per primitive."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.rows: dict[str, int] = {}

    def add(self, name: str, rows: int) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        self.rows[name] = self.rows.get(name, 0) + rows

    @property
    def total(self) -> int:
        return sum(self.calls.values()) + sum(self.rows.values())

    def __repr__(self) -> str:
        parts = (f"{n}: {self.calls[n]} calls, {self.rows[n]} rows" for n in sorted(self.calls))
        return "; ".join(parts) or "nothing"


def _size(result: object) -> int:
    if result is None:
        return 0
    if isinstance(result, list):
        return len(result)  # pyright: ignore[reportUnknownArgumentType]
    return 1


def _async_counter(reads: _Reads, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    async def counted(*args: Any, **kwargs: Any) -> Any:
        result = await method(*args, **kwargs)
        reads.add(name, _size(result))
        return result

    return counted


def _sync_counter(reads: _Reads, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    def counted(*args: Any, **kwargs: Any) -> Any:
        reads.add(name, 0)
        return method(*args, **kwargs)

    return counted


def _builds_heads(part: object) -> bool:
    """True for a checkpointer: its stores build heads with ``self.summary``."""
    return isinstance(part, BaseCheckpointer)


@contextmanager
def _counting(*parts: object) -> Generator[_Reads]:
    """Count the primitives of ``parts`` (instance attributes shadow the methods, so
    calls a store makes to its own primitives are counted too)."""
    reads = _Reads()
    patched: list[tuple[object, str]] = []
    try:
        for part in parts:
            for name in _COUNTED:
                if hasattr(part, name) and name not in vars(part):
                    setattr(part, name, _async_counter(reads, name, getattr(part, name)))
                    patched.append((part, name))
            if _builds_heads(part) and "summary" not in vars(part):
                summary = getattr(part, "summary")  # noqa: B009
                setattr(part, "summary", _sync_counter(reads, "summary", summary))  # noqa: B010
                patched.append((part, "summary"))
        yield reads
    finally:
        for part, name in patched:
            delattr(part, name)


def _checkpointer(backend: Backend[Any]) -> BaseCheckpointer[Any]:
    cp = backend.checkpointer
    if not isinstance(cp, BaseCheckpointer):
        pytest.fail(
            f"the cost of {type(cp).__name__} is counted through its primitives: it must "
            "subclass flowy.storage.dialect.BaseCheckpointer"
        )
    return cp


def _consumer(backend: Backend[Any]) -> BaseConsumer:
    consumer = backend.consumer
    if not isinstance(consumer, BaseConsumer):
        pytest.fail(
            f"the cost of {type(consumer).__name__} is counted through its primitives: it "
            "must subclass flowy.storage.dialect.BaseConsumer"
        )
    return consumer


def _no_growth(what: str, few: _Reads, many: _Reads) -> None:
    assert few.total > 0, f"{what}: no primitive was called ({few!r})"
    assert many.total <= few.total, (
        f"{what} read more as the store grew, so it scans instead of using an index: "
        f"few: {few!r}; many: {many!r}"
    )


async def _save_threads(backend: Backend[Any], count: int) -> None:
    cp = backend.checkpointer
    await asyncio.gather(*(cp.save(0, make_snapshot(new_thread_id("cost"))) for _ in range(count)))


async def _wait_until(backend: Backend[Any], wake_at: float) -> None:
    snap = make_snapshot(new_thread_id("cost-timer"), status=RunStatus.WAITING, reason="sleep")
    await backend.checkpointer.save(0, replace(snap, wake_at=wake_at))


class CostSuite(Suite):
    """What ``load``, ``list_threads``, due timers and ``claim`` read does not grow with
    the history, the threads or the backlog (counted through the primitive layer)."""

    revisions: int = 50
    """Revisions of the long thread ``load`` reads."""
    threads: int = 60
    """Threads (or messages) added for the "many" measurement."""

    async def test_load_reads_the_same_for_a_long_history(
        self, flowy_backend: Backend[Any]
    ) -> None:
        cp = _checkpointer(flowy_backend)
        short, long = new_thread_id("cost-short"), new_thread_id("cost-long")
        await saved_chain(cp, short, 1)
        await saved_chain(cp, long, self.revisions)
        with _counting(cp) as few:
            await cp.load(short)
        with _counting(cp) as many:
            _, revision = await cp.load(long)
        assert revision == self.revisions
        assert "_read_history" not in many.calls, f"load read the history: {many!r}"
        _no_growth(f"load of a thread with {self.revisions} revisions", few, many)

    async def test_list_threads_page_reads_the_same_for_many_threads(
        self, flowy_backend: Backend[Any]
    ) -> None:
        cp = _checkpointer(flowy_backend)
        await _save_threads(flowy_backend, 12)
        with _counting(cp) as few:
            assert len(await cp.list_threads(limit=10)) == 10
        await _save_threads(flowy_backend, self.threads)
        with _counting(cp) as many:
            assert len(await cp.list_threads(limit=10)) == 10
        _no_growth(f"list_threads(limit=10) over {12 + self.threads} threads", few, many)

    async def test_due_timers_read_the_same_for_many_waiting_threads(
        self, flowy_backend: Backend[Any]
    ) -> None:
        require_capability(flowy_backend, "durable_timers_signals")
        cp = _checkpointer(flowy_backend)
        due, later = fixed_time, fixed_time + 1_000_000
        for i in range(3):
            await _wait_until(flowy_backend, due + i)
            await _wait_until(flowy_backend, later + i)
        await _save_threads(flowy_backend, 3)
        with _counting(cp) as few:
            assert len(await cp.timers(before=due + 10, limit=10)) == 3
        await asyncio.gather(
            *(_wait_until(flowy_backend, later + 10 + i) for i in range(self.threads))
        )
        with _counting(cp) as many:
            assert len(await cp.timers(before=due + 10, limit=10)) == 3
        _no_growth(f"timers(limit=10) with 3 due among {self.threads + 9} threads", few, many)

    async def test_claim_reads_the_same_for_a_long_backlog(
        self, flowy_backend: Backend[Any]
    ) -> None:
        consumer = _consumer(flowy_backend)
        outbox = flowy_backend.outbox
        for _ in range(3):
            await outbox.enqueue_intent(make_intent(new_thread_id("cost-msg"), 1))
        with _counting(consumer) as few:
            claimed = await consumer.claim(2, self.long_ttl)
        assert len(claimed) == 2
        for message in claimed:
            await consumer.ack(message)
        await asyncio.gather(
            *(
                outbox.enqueue_intent(make_intent(new_thread_id("cost-msg"), 1))
                for _ in range(self.threads)
            )
        )
        with _counting(consumer) as many:
            assert len(await consumer.claim(2, self.long_ttl)) == 2
        _no_growth(f"claim(2) with {self.threads + 1} messages queued", few, many)
