"""Limits contract tests: every kind of stored value at its limit is accepted and read
back as it was written; just past it, the write is refused with a ``ValueError`` (a
``LimitError``) or ``TypeError`` naming the field, and nothing is stored.

The limits are ``flowy.storage.Limits`` (set on the backend) and the fixed ceilings
``MAX_DEPTH`` and ``MAX_TIMESTAMP``; the bases check them, and every store must keep
what they let through (a store that rounds a time, truncates a value or ignores the
inbox limit fails here).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest

from ..._directives import Directive, completed, sleep
from ..._errors import LimitError, ThreadNotFoundError
from ..._graph import GraphBuilder
from ..._runner import Runner
from ...storage import ActivityRecord, ActivityStatus, Backend, Limits, RunStatus, Signal
from ...storage._durable import encode_activity, encode_signal
from ...storage.dialect import MAX_DEPTH, MAX_TIMESTAMP, BaseBackend
from ._durable import require_durable
from ._support import Suite, fixed_time, make_snapshot, new_thread_id, require_capability

__all__ = ["LimitsSuite"]

State = dict[str, Any]


def nested(depth: int) -> Any:
    """A JSON value ``depth`` levels of lists deep (``nested(2) == [[0]]``)."""
    value: Any = 0
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


def set_limits(backend: Backend[Any], limits: Limits) -> None:
    """Give ``backend`` these limits (``BaseBackend.limits``)."""
    if not isinstance(backend, BaseBackend):
        pytest.fail(f"{type(backend).__name__} must be a flowy.storage.dialect.BaseBackend")
    backend.limits = limits


def _record(key: str, result: Any = None, **kw: Any) -> ActivityRecord:
    return ActivityRecord(
        key=key,
        status=kw.pop("status", ActivityStatus.SUCCEEDED),
        name="charge",
        attempts=1,
        result=result,
        started_at=kw.pop("started_at", fixed_time),
        updated_at=kw.pop("updated_at", fixed_time),
        retry_at=kw.pop("retry_at", None),
    )


def _refused(error: pytest.ExceptionInfo[BaseException], field: str) -> None:
    assert isinstance(error.value, ValueError | TypeError), repr(error.value)
    assert field in str(error.value), f"the error does not name {field!r}: {error.value}"


class LimitsSuite(Suite):
    """Each kind of value at its limit round-trips; one step past it is refused at write,
    naming the field, with nothing stored."""

    async def test_state_depth(self, flowy_backend: Backend[Any]) -> None:
        cp = flowy_backend.checkpointer
        tid = new_thread_id("deep-state")
        deepest = make_snapshot(tid, state={"v": nested(MAX_DEPTH - 1)})
        assert await cp.save(0, deepest) == 1
        loaded, _ = await cp.load(tid)
        assert loaded.state == deepest.state
        other = new_thread_id("too-deep-state")
        with pytest.raises(ValueError) as error:
            await cp.save(0, make_snapshot(other, state={"v": nested(MAX_DEPTH)}))
        _refused(error, "state")
        with pytest.raises(ThreadNotFoundError):
            await cp.load(other)

    async def test_state_numbers(self, flowy_backend: Backend[Any]) -> None:
        cp = flowy_backend.checkpointer
        tid = new_thread_id("numbers")
        longest = 10**4299  # 4300 digits: the most JSON decoding accepts back
        state = {"big": longest, "neg": -longest, "f": 1.5e308, "tiny": 5e-324}
        await cp.save(0, make_snapshot(tid, state=state))
        loaded, _ = await cp.load(tid)
        assert loaded.state == state
        for bad in (math.nan, math.inf, -math.inf, 10**4300):
            other = new_thread_id("bad-number")
            with pytest.raises(ValueError) as error:
                await cp.save(0, make_snapshot(other, state={"x": [bad]}))
            _refused(error, "state")
            with pytest.raises(ThreadNotFoundError):
                await cp.load(other)

    async def test_metadata_and_effects(self, flowy_backend: Backend[Any]) -> None:
        cp = flowy_backend.checkpointer
        tid = new_thread_id("header")
        snap = replace(
            make_snapshot(tid),
            metadata={"m": nested(MAX_DEPTH - 1), "n": 10**4299},
            effects=(nested(MAX_DEPTH), {"ok": 1.0}),
        )
        await cp.save(0, snap)
        loaded, _ = await cp.load(tid)
        assert dict(loaded.metadata) == dict(snap.metadata)
        assert tuple(loaded.effects) == tuple(snap.effects)
        past = [
            ("metadata", {"metadata": {"m": nested(MAX_DEPTH)}}),
            ("metadata", {"metadata": {"m": math.nan}}),
            ("metadata", {"metadata": {"m": 10**4300}}),
            ("effect", {"effects": (nested(MAX_DEPTH + 1),)}),
            ("effect", {"effects": (math.inf,)}),
        ]
        for field, change in past:
            other = new_thread_id("bad-header")
            with pytest.raises(ValueError) as error:
                await cp.save(0, replace(make_snapshot(other), **change))
            _refused(error, field)
            with pytest.raises(ThreadNotFoundError):
                await cp.load(other)

    async def test_timer_times(self, flowy_backend: Backend[Any]) -> None:
        cp = require_durable(flowy_backend)
        tid = new_thread_id("far-timer")
        snap = replace(
            make_snapshot(tid, status=RunStatus.WAITING, reason="sleep"),
            wake_at=MAX_TIMESTAMP,
            updated_at=MAX_TIMESTAMP,
        )
        await cp.save(0, snap)
        loaded, _ = await cp.load(tid)
        assert loaded.wake_at == MAX_TIMESTAMP and loaded.updated_at == MAX_TIMESTAMP
        assert [t.wake_at for t in await cp.timers(limit=10_000) if t.thread_id == tid] == [
            MAX_TIMESTAMP
        ]
        zero = new_thread_id("epoch-timer")
        await cp.save(0, replace(snap, thread_id=zero, wake_at=0.0, updated_at=0.0))
        assert (await cp.load(zero))[0].wake_at == 0.0
        for field, bad in [
            ("wake_at", MAX_TIMESTAMP + 1),
            ("wake_at", -1.0),
            ("wake_at", math.inf),
            ("wake_at", math.nan),
            ("updated_at", 1e30),
            ("handoff_pending_at", -0.5),
        ]:
            other = new_thread_id("bad-time")
            with pytest.raises(ValueError) as error:
                await cp.save(0, replace(snap, thread_id=other, **{field: bad}))
            _refused(error, field)
            with pytest.raises(ThreadNotFoundError):
                await cp.load(other)
        timers = await cp.timers(limit=10_000)
        assert [t for t in timers if t.thread_id.startswith("suite-bad-time-")] == []

    async def test_signal_payload(self, flowy_backend: Backend[Any]) -> None:
        cp = require_durable(flowy_backend)
        limit = 16 * 1024
        set_limits(flowy_backend, Limits(max_signal_bytes=limit))
        tid = new_thread_id("payload")
        deepest = Signal(tid, "go", nested(MAX_DEPTH), "deep", sent_at=MAX_TIMESTAMP)
        empty = Signal(tid, "go", "", "full", sent_at=0.0)
        fill = limit - len(encode_signal(empty))
        largest = replace(empty, payload="x" * fill)
        assert len(encode_signal(largest)) == limit
        numbers = Signal(tid, "go", {"n": 10**4299, "f": -1.5e308}, "numbers", sent_at=fixed_time)
        for signal in (deepest, largest, numbers):
            await cp.append_signal(signal)
        stored = await cp.signals(tid)
        assert [(s.payload, s.sent_at) for s in stored] == [
            (s.payload, s.sent_at) for s in (deepest, largest, numbers)
        ]
        over = limit + 1 - len(encode_signal(replace(largest, payload="", signal_id="bad-1")))
        past = [
            ("payload", replace(deepest, payload=nested(MAX_DEPTH + 1))),
            ("payload", replace(largest, payload="x" * over)),
            ("payload", replace(numbers, payload={"n": math.nan})),
            ("payload", replace(numbers, payload={"n": 10**4300})),
            ("sent_at", replace(numbers, sent_at=MAX_TIMESTAMP * 2)),
            ("sent_at", replace(numbers, sent_at=-1.0)),
        ]
        for i, (field, signal) in enumerate(past):
            with pytest.raises((ValueError, TypeError)) as error:
                await cp.append_signal(replace(signal, signal_id=f"bad-{i}"))
            _refused(error, field)
        assert len(await cp.signals(tid)) == 3

    async def test_activity_result(self, flowy_backend: Backend[Any]) -> None:
        cp = require_durable(flowy_backend, "journal")
        limit = 16 * 1024
        set_limits(flowy_backend, Limits(max_activity_bytes=limit))
        tid = new_thread_id("result")
        deepest = _record("deep", nested(MAX_DEPTH), retry_at=MAX_TIMESTAMP)
        fill = limit - len(encode_activity(replace(deepest, key="full", result="")))
        largest = replace(deepest, key="full", result="x" * fill)
        assert len(encode_activity(largest)) == limit
        numbers = _record("numbers", {"n": -(10**4299), "f": 2.5e-308}, started_at=0.0)
        for record in (deepest, largest, numbers):
            await cp.put_activity(tid, record)
            assert await cp.get_activity(tid, record.key) == record
        over = limit + 1 - len(encode_activity(replace(largest, key="bad-1", result="")))
        past = [
            ("result", replace(deepest, key="bad-0", result=nested(MAX_DEPTH + 1))),
            ("result", replace(largest, key="bad-1", result="x" * over)),
            ("result", replace(numbers, key="bad-2", result=[math.inf])),
            ("result", replace(numbers, key="bad-3", result=10**4300)),
            ("retry_at", replace(numbers, key="bad-4", retry_at=math.nan)),
            ("started_at", replace(numbers, key="bad-5", started_at=-1.0)),
            ("updated_at", replace(numbers, key="bad-6", updated_at=1e300)),
        ]
        for field, record in past:
            with pytest.raises((ValueError, TypeError)) as error:
                await cp.put_activity(tid, record)
            _refused(error, field)
            assert await cp.get_activity(tid, record.key) is None
        assert len(await cp.journal(tid)) == 3

    async def test_pending_signals(self, flowy_backend: Backend[Any]) -> None:
        cp = require_durable(flowy_backend)
        set_limits(flowy_backend, Limits(max_pending_signals=3))
        tid = new_thread_id("inbox")

        def signal(i: int) -> Signal:
            return Signal(tid, "go", i, f"s{i}", sent_at=fixed_time)

        assert [(await cp.append_signal(signal(i))).seq for i in (1, 2, 3)] == [1, 2, 3]
        with pytest.raises(ValueError) as error:
            await cp.append_signal(signal(4))
        _refused(error, "inbox")
        assert isinstance(error.value, LimitError)
        assert [s.payload for s in await cp.signals(tid)] == [1, 2, 3]
        again = await cp.append_signal(signal(2))  # an id sent before is still answered
        assert (again.seq, again.payload) == (2, 2)
        # Past the signals the thread took, the inbox has room again.
        assert (await cp.append_signal(signal(4), taken=1)).seq == 4
        with pytest.raises(LimitError):
            await cp.append_signal(signal(5), taken=1)
        assert [s.seq for s in await cp.signals(tid)] == [1, 2, 3, 4]
        other = new_thread_id("other-inbox")  # the limit is per thread
        assert (await cp.append_signal(replace(signal(1), thread_id=other))).seq == 1

    async def test_sleep(self, flowy_backend: Backend[Any]) -> None:
        require_capability(flowy_backend, "durable_timers_signals")
        set_limits(flowy_backend, Limits(max_sleep=3600.0))
        asked: list[float] = []

        async def nap(s: State) -> tuple[State, Directive[Any]]:
            return {}, sleep(asked[-1], resume_at="after")

        async def after(s: State) -> tuple[State, Directive[Any]]:
            return {}, completed()

        builder: GraphBuilder[State, Any] = GraphBuilder(lambda a, b: {**a, **b})
        graph = (
            builder.add_node("nap", nap)
            .add_node("after", after)
            .add_edge("nap", "after")
            .allow_no_outgoing_route("after")
            .compile()
        )
        runner = Runner(graph, flowy_backend, clock=lambda: fixed_time)
        tid = new_thread_id("longest-sleep")
        asked.append(3600.0)
        result = await runner.start(tid, {})
        assert result.status is RunStatus.WAITING
        head, _ = await runner.head(tid)
        assert head.wake_at == fixed_time + 3600.0
        for too_long in (3600.5, 1e30):
            asked.append(too_long)
            other = new_thread_id("too-long-sleep")
            result = await runner.start(other, {})
            assert result.status is RunStatus.FAILED
            assert isinstance(result.error, LimitError), repr(result.error)
            assert "max_sleep" in str(result.error)
            with pytest.raises(ThreadNotFoundError):
                await runner.head(other)
