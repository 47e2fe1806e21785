"""The limits of what is stored (``flowy/storage/_limits.py``), through the engine: a
value accepted at write is always read back, so a deep signal or activity result never
wedges its thread; a value past a limit is refused with one clear error; long sleeps and
full inboxes are refused. The conformance suite (``LimitsSuite``) runs the store-level
contracts on every store; these tests run the engine on the memory and SQLite stores,
and check the read-side ceilings on bytes no write would produce."""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import AsyncGenerator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import flowy
from flowy.errors import LimitError, SnapshotEnvelopeInvalidError, ThreadNotFoundError
from flowy.memory import MemoryCheckpointer
from flowy.storage import ActivityStatus, Backend, Limits, RunStatus, Signal, Snapshot, Timer
from flowy.storage._durable import decode_activity, decode_signal
from flowy.storage._limits import check_time, value_depth
from flowy.storage.dialect import (
    MAX_DEPTH,
    MAX_TIMESTAMP,
    BaseBackend,
    BaseCheckpointer,
    decode_record,
)
from flowy.testing.suite._limits import nested

pytestmark = pytest.mark.anyio

State = dict[str, Any]


def merge(state: State, update: State) -> State:
    return {**state, **update}


@pytest.fixture(params=["memory", "sqlite"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncGenerator[Backend[Any]]:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 'limits.db'}"
    async with flowy.connect(url) as opened:
        yield opened


def approval_graph() -> flowy.Graph[State, Any]:
    async def ask(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {}, flowy.wait_for("approval", resume_at="done")

    async def done(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {"done": True}, flowy.completed()

    builder: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    return (
        builder.add_node("ask", ask)
        .add_node("done", done)
        .add_edge("ask", "done")
        .allow_no_outgoing_route("done")
        .compile()
    )


async def test_a_signal_100_levels_deep_is_delivered_and_101_is_refused(
    backend: Backend[Any],
) -> None:
    runner = flowy.Runner(approval_graph(), backend)
    assert (await runner.start("t", {})).status is RunStatus.WAITING
    with pytest.raises(LimitError, match="nested more than 100 levels"):
        await runner.signal("t", "approval", {"deep": nested(MAX_DEPTH)})
    cp = backend.checkpointer
    assert isinstance(cp, BaseCheckpointer)
    assert await cp.signals("t") == []
    await runner.signal("t", "approval", {"deep": nested(MAX_DEPTH - 1)})
    assert await flowy.Worker(runner).run_until_idle(idle_wait=0.05) == 1
    head, _ = await runner.head("t")
    assert head.status is RunStatus.COMPLETED
    assert head.state == {"deep": nested(MAX_DEPTH - 1), "done": True}


async def test_an_activity_result_80_levels_deep_is_kept_and_one_too_deep_fails_it(
    backend: Backend[Any],
) -> None:
    depth: list[int] = [80]

    async def deep() -> Any:
        return nested(depth[0])

    async def call(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {"got": await flowy.activity(deep, key="deep")}, flowy.end()

    builder: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    graph = builder.add_node("call", call).allow_no_outgoing_route("call").compile()
    runner = flowy.Runner(graph, backend)
    result = await runner.start("ok", {})
    assert result.status is RunStatus.COMPLETED and result.state == {"got": nested(80)}
    cp = backend.checkpointer
    assert isinstance(cp, BaseCheckpointer)
    assert [r.result for r in await cp.journal("ok")] == [nested(80)]
    depth[0] = MAX_DEPTH + 1
    result = await runner.start("too-deep", {})
    assert result.status is RunStatus.FAILED and isinstance(result.error, LimitError)
    (record,) = await cp.journal("too-deep")
    assert record.status is ActivityStatus.FAILED and "nested more than" in record.error


@pytest.mark.parametrize("seconds", [1e30, 367 * 86400.0])
async def test_a_sleep_past_max_sleep_fails_the_run_clearly(
    backend: Backend[Any], seconds: float
) -> None:
    async def nap(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {}, flowy.sleep(seconds)

    builder: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    graph = builder.add_node("nap", nap).allow_no_outgoing_route("nap").compile()
    runner = flowy.Runner(graph, backend)
    result = await runner.start("t", {})
    assert result.status is RunStatus.FAILED
    assert isinstance(result.error, LimitError) and "max_sleep" in str(result.error)
    with pytest.raises(ThreadNotFoundError):
        await runner.head("t")


async def test_a_sleep_until_out_of_range_fails_the_run(backend: Backend[Any]) -> None:
    async def nap(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {}, flowy.sleep_until(-1.0 if s.get("past") else 1e300)

    builder: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    graph = builder.add_node("nap", nap).allow_no_outgoing_route("nap").compile()
    runner = flowy.Runner(graph, backend)
    for tid, state in (("future", {}), ("past", {"past": True})):
        result = await runner.start(tid, state)
        assert result.status is RunStatus.FAILED and isinstance(result.error, LimitError)


async def test_3000_signals_to_one_thread_stop_at_the_pending_limit(
    backend: Backend[Any],
) -> None:
    runner = flowy.Runner(approval_graph(), backend)
    await runner.start("t", {})
    errors: list[LimitError] = []
    for i in range(3000):
        try:
            await runner.signal("t", "noise", i, signal_id=f"n{i}")
        except LimitError as exc:
            errors.append(exc)
    assert len(errors) == 2000
    assert all("max_pending_signals" in str(exc) for exc in errors)
    cp = backend.checkpointer
    assert isinstance(cp, BaseCheckpointer)
    assert len(await cp.signals("t", limit=5000)) == 1000


async def test_taken_signals_make_room_in_the_inbox(backend: Backend[Any]) -> None:
    assert isinstance(backend, BaseBackend)
    assert backend.limits == Limits()
    backend.limits = Limits(max_pending_signals=2)
    assert backend.limits == Limits(max_pending_signals=2)

    async def loop(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {}, flowy.wait_for("approval")

    builder: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    graph = builder.add_node("loop", loop).allow_no_outgoing_route("loop").compile()
    runner = flowy.Runner(graph, backend)
    await runner.start("t", {})
    worker = flowy.Worker(runner)
    for i in range(5):  # each is taken before the next: never more than one pending
        await runner.signal("t", "approval", {"i": i})
        await worker.run_until_idle(idle_wait=0.05)
    head, _ = await runner.head("t")
    assert head.state == {"i": 4} and dict(head.signal_cursors) == {"approval": 5}
    await runner.signal("t", "other", 1)
    await runner.signal("t", "other", 2)
    with pytest.raises(LimitError, match="inbox"):
        await runner.signal("t", "other", 3)


async def test_connect_takes_limits() -> None:
    limits = Limits(max_pending_signals=1)
    async with flowy.connect("memory://", limits=limits) as backend:
        cp = backend.checkpointer
        assert isinstance(cp, BaseCheckpointer)
        assert cp.limits is limits
        await cp.save(0, _snapshot("t"))
        await cp.append_signal(Signal("t", "a", 1, "1"))
        with pytest.raises(LimitError):
            await cp.append_signal(Signal("t", "a", 2, "2"))
    with pytest.raises(TypeError, match="Limits"):
        flowy.connect("memory://", limits={"max_sleep": 1})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"max_sleep": 0}, ValueError),
        ({"max_sleep": math.inf}, ValueError),
        ({"max_sleep": math.nan}, ValueError),
        ({"max_sleep": "1"}, TypeError),
        ({"max_pending_signals": 0}, ValueError),
        ({"max_pending_signals": 1.5}, TypeError),
        ({"max_signal_bytes": 17 * 1024 * 1024}, ValueError),
        ({"max_activity_bytes": True}, TypeError),
    ],
)
def test_limits_refuse_bad_values(kwargs: dict[str, Any], error: type[Exception]) -> None:
    name = next(iter(kwargs))
    with pytest.raises(error, match=name):
        Limits(**kwargs)


def test_depth_and_time_checks() -> None:
    assert value_depth(1) == 0 and value_depth([]) == 1 and value_depth({"a": [1]}) == 2
    assert value_depth(nested(10_000), limit=MAX_DEPTH) == MAX_DEPTH + 1  # stops early
    assert check_time("t", 0) == 0.0 and check_time("t", MAX_TIMESTAMP) == MAX_TIMESTAMP
    for bad in (-0.001, MAX_TIMESTAMP + 1, math.nan, math.inf):
        with pytest.raises(LimitError, match="t is"):
            check_time("t", bad)
    with pytest.raises(TypeError):
        check_time("t", True)


def _snapshot(thread_id: str) -> Snapshot[Any]:
    return Snapshot(thread_id=thread_id, state=None, execution_pointer="a", updated_at=1.0)


# --- the same ceilings at read, on bytes no write produces -----------------------------


def _envelope(header: dict[str, Any], state: bytes = b"{}") -> bytes:
    raw = json.dumps(header, separators=(",", ":")).encode()
    body = b"FLWY\x01" + struct.pack(">I", len(raw)) + raw + struct.pack(">I", len(state)) + state
    return body + hashlib.blake2b(body, digest_size=16).digest()


_HEADER: dict[str, Any] = {
    "thread_id": "t",
    "revision": 1,
    "execution_pointer": "a",
    "status": "running",
    "codec": "json",
    "reason": "",
    "step_count": 0,
    "segment": 0,
    "total_steps": 0,
    "budget_counts": {},
    "metadata": {},
    "handoff_status": "none",
    "handoff_pending_at": None,
    "updated_at": 1.0,
    "write_id": "w",
}


def test_a_record_at_the_limits_decodes() -> None:
    header = {
        **_HEADER,
        "metadata": {"m": nested(MAX_DEPTH - 1)},
        "effects": [nested(MAX_DEPTH)],
        "wake_at": MAX_TIMESTAMP,
    }
    state = json.dumps(nested(MAX_DEPTH)).encode()
    snap: Snapshot[Any] = decode_record(_envelope(header, state)).to_snapshot()
    assert snap.state == nested(MAX_DEPTH) and snap.wake_at == MAX_TIMESTAMP


@pytest.mark.parametrize(
    ("change", "state", "message"),
    [
        ({"wake_at": MAX_TIMESTAMP + 1}, b"{}", "wake_at"),
        ({"updated_at": -1}, b"{}", "updated_at"),
        ({"handoff_pending_at": 1e300}, b"{}", "handoff_pending_at"),
        ({"effects": [nested(MAX_DEPTH + 1)]}, b"{}", "nested more than"),
        ({}, json.dumps(nested(MAX_DEPTH + 1)).encode(), "nested more than"),
        ({}, b"[NaN]", "NaN"),
    ],
)
def test_a_record_past_the_limits_is_refused_at_read(
    change: dict[str, Any], state: bytes, message: str
) -> None:
    with pytest.raises(SnapshotEnvelopeInvalidError, match=message):
        decode_record(_envelope({**_HEADER, **change}, state)).to_snapshot()


def test_a_signal_or_activity_past_the_limits_is_refused_at_read() -> None:
    def signal(payload: str, sent_at: str = "1.0") -> bytes:
        text = f'{{"name":"n","signal_id":"s","payload":{payload},"sent_at":{sent_at}}}'
        return text.encode()

    deepest = json.dumps(nested(MAX_DEPTH))
    assert decode_signal("t", 1, signal(deepest)).payload == nested(MAX_DEPTH)
    for bad in (
        signal(json.dumps(nested(MAX_DEPTH + 1))),
        signal("NaN"),
        signal("1", sent_at="-5"),
        signal("1", sent_at="1e300"),
    ):
        with pytest.raises(SnapshotEnvelopeInvalidError):
            decode_signal("t", 1, bad)
    record = {
        "key": "k",
        "status": "succeeded",
        "name": "f",
        "attempts": 1,
        "result": nested(MAX_DEPTH),
        "error": "",
        "started_at": 0,
        "updated_at": MAX_TIMESTAMP,
        "retry_at": None,
    }
    assert decode_activity(json.dumps(record).encode()).result == nested(MAX_DEPTH)
    for change in (
        {"result": nested(MAX_DEPTH + 1)},
        {"retry_at": -1},
        {"started_at": MAX_TIMESTAMP * 2},
    ):
        with pytest.raises(SnapshotEnvelopeInvalidError):
            decode_activity(json.dumps({**record, **change}).encode())


@pytest.mark.parametrize(
    "bad", [math.nan, math.inf, -math.inf, pytest.param(10**4300, id="4301-digits")]
)
async def test_codecs_refuse_numbers_that_would_not_read_back(bad: Any) -> None:
    from flowy.storage import JSONCodec, MsgspecCodec, StateCodec

    codecs: list[StateCodec[Any]] = [JSONCodec[Any](), MsgspecCodec[Any]()]
    async with flowy.connect("memory://") as backend:
        for codec in codecs:
            cp = backend.checkpointer
            assert isinstance(cp, BaseCheckpointer)
            view = cp.with_codec(codec)
            snap = Snapshot(thread_id="t", state={"x": [1.5, bad]}, execution_pointer="a")
            with pytest.raises(LimitError, match="state"):
                await view.save(0, snap)
            with pytest.raises(ThreadNotFoundError):
                await view.load("t")
    msgspec_codec = MsgspecCodec[Any]()
    assert msgspec_codec.decode(msgspec_codec.encode({"x": None})) == {"x": None}


async def test_values_thousands_of_levels_deep_are_refused_as_too_deep() -> None:
    deep = nested(5000)
    plain: Snapshot[Any] = Snapshot(thread_id="t", state=None, execution_pointer="a")
    async with flowy.connect("memory://") as backend:
        cp = backend.checkpointer
        assert isinstance(cp, BaseCheckpointer)
        cases: list[tuple[str, Snapshot[Any]]] = [
            ("state", replace(plain, state=deep)),
            ("effect", replace(plain, effects=(deep,))),
            ("metadata", replace(plain, metadata={"m": deep})),
        ]
        for field, snap in cases:
            with pytest.raises(LimitError, match=field):
                await cp.save(0, snap)
        with pytest.raises(LimitError, match="payload"):
            await cp.append_signal(Signal("t", "go", deep, "s"))
        with pytest.raises(ThreadNotFoundError):
            await cp.load("t")


@pytest.mark.parametrize(
    "times",
    [
        {"updated_at": "-1"},
        {"updated_at": "inf"},
        {"wake_at": "1e300"},
        {"wake_at": "nan"},
        {"handoff_pending_at": str(MAX_TIMESTAMP + 1)},
    ],
)
def test_head_columns_with_a_time_out_of_range_are_invalid(times: dict[str, str]) -> None:
    columns: dict[str, object] = {
        "handoff_pending_at": None,
        "updated_at": "1.5",
        "wake_at": str(MAX_TIMESTAMP),
        **times,
    }
    with pytest.raises(SnapshotEnvelopeInvalidError, match="head columns"):
        BaseCheckpointer.summary("t", 1, "a", "waiting", "", "none", **columns)
    assert BaseCheckpointer.summary("t", 1, "a", "waiting", "", "none", None, "0", "0").wake_at == 0


def test_head_columns_may_be_utf8_bytes_with_empty_text_for_no_time() -> None:
    """A store keeping text (Redis's hash fields) passes its columns as they are."""
    columns = (b"3", "n\u00e9".encode(), b"waiting", b"why", b"pending", b"", b"1.5", b"", b"")
    head = BaseCheckpointer.summary("t", *columns)
    assert (head.revision, head.execution_pointer, head.status, head.reason) == (
        3,
        "n\u00e9",
        "waiting",
        "why",
    )
    assert (head.handoff_pending_at, head.updated_at, head.wake_at) == (None, 1.5, None)
    assert head.graph_version == ""
    timed = BaseCheckpointer.summary("t", *columns[:5], b"2.5", b"1.5", b"7", b"v2")
    assert (timed.handoff_pending_at, timed.wake_at, timed.graph_version) == (2.5, 7.0, "v2")


async def test_timers_ask_the_store_within_the_range_of_stored_times() -> None:
    """Every stored wake-up time is within 0 .. MAX_TIMESTAMP, so a store's ``_timers``
    gets a bound in that range: a later one reads every timer, an earlier one none (the
    store is not asked)."""
    asked: list[float] = []

    class Recording(MemoryCheckpointer[Any]):
        async def _timers(self, before: float, limit: int) -> list[Timer]:
            asked.append(before)
            return await super()._timers(before, limit)

    cp = Recording()
    assert await cp.timers(before=-1e-300) == [] and await cp.timers(before=-math.inf) == []
    for before in (math.inf, 1e300, MAX_TIMESTAMP, -0.0, 1e-300):
        await cp.timers(before=before)
    assert asked == [MAX_TIMESTAMP, MAX_TIMESTAMP, MAX_TIMESTAMP, 0.0, 1e-300]
    assert math.copysign(1.0, asked[3]) == 1.0  # never -0.0
