"""The record envelope and the state codecs (``_records.py``, ``_codecs.py``)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import struct
from typing import Any, TypedDict

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

import flowy
from flowy import errors, storage
from flowy.storage import JSONCodec, MsgspecCodec
from flowy.storage.dialect import (
    DecodeRecordOptions,
    Record,
    decode_record,
    decode_snapshot,
    encode_snapshot,
)


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclasses.dataclass
class Item:
    sku: str
    qty: int
    tags: tuple[str, ...] = ()


@dataclasses.dataclass
class Order:
    order_id: str
    color: Color
    placed_at: dt.datetime
    items: list[Item]
    notes: dict[str, str] = dataclasses.field(default_factory=dict)
    refund: float | None = None
    seen: set[str] = dataclasses.field(default_factory=set)


class Profile(TypedDict):
    name: str
    age: int


def sample_order() -> Order:
    return Order(
        "o-1",
        Color.BLUE,
        dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC),
        [Item("a", 2, ("x", "y")), Item("b", 1)],
        {"k": "v"},
        12.5,
        {"z", "a"},
    )


_DEFAULT: Any = object()


def snap(state: Any = _DEFAULT, **kw: Any) -> storage.Snapshot[Any]:
    fields: dict[str, Any] = {
        "handoff_pending_at": 1700000000.5,
        "updated_at": 1700000001.25,
        **kw,
    }
    return storage.Snapshot(
        "thread-1",
        {"n": 1} if state is _DEFAULT else state,
        "node",
        flowy.RunStatus.SUSPENDED,
        reason="why",
        step_count=3,
        segment=2,
        total_steps=9,
        budget_counts={"llm": 4},
        metadata={"who": "me", "nested": {"a": [1, 2]}},
        handoff_status=flowy.HandoffStatus.PENDING,
        write_id="w-1",
        **fields,
    )


def test_round_trip_keeps_every_field() -> None:
    data = encode_snapshot(snap(), 7)
    back = decode_snapshot(data, thread_id="thread-1", revision=7, execution_pointer="node")
    assert back == dataclasses.replace(snap(), revision=7)


@pytest.mark.parametrize("field", ["updated_at", "handoff_pending_at", "wake_at"])
def test_each_time_of_a_record_is_checked_at_write(field: str) -> None:
    # The common case (floats in range) is checked without building a message: an int
    # in range still passes, and every bad value still gets the full diagnosis.
    assert decode_snapshot(encode_snapshot(snap(**{field: 1700000000}), 1)).revision == 1
    for bad in (-0.5, 253402300800.0, float("nan"), float("inf")):
        with pytest.raises(errors.LimitError, match=f"^the {field} of thread 'thread-1' is "):
            encode_snapshot(snap(**{field: bad}), 1)
    for wrong in (True, "1.0"):
        with pytest.raises(TypeError, match=f"^the {field} of thread 'thread-1' must be sec"):
            encode_snapshot(snap(**{field: wrong}), 1)


def test_typed_json_codec_round_trips_dataclasses_enums_datetimes() -> None:
    codec: JSONCodec[Order] = JSONCodec(Order)
    data = encode_snapshot(snap(sample_order()), 1, codec)
    back = decode_snapshot(data, codec)
    assert back.state == sample_order()
    assert isinstance(back.state.items[0], Item) and back.state.color is Color.BLUE
    profile_codec: JSONCodec[Profile] = JSONCodec(Profile)
    assert profile_codec.decode(profile_codec.encode({"name": "a", "age": 3})) == {
        "name": "a",
        "age": 3,
    }


def test_msgspec_codec_typed_decode() -> None:
    class Struct(msgspec.Struct):
        name: str
        count: int

    codec: MsgspecCodec[Struct] = MsgspecCodec(Struct)
    back = decode_snapshot(encode_snapshot(snap(Struct("a", 2)), 1, codec), codec)
    assert back.state == Struct("a", 2)
    bad = MsgspecCodec(Struct)
    with pytest.raises(errors.SnapshotEnvelopeInvalidError, match="does not decode"):
        decode_snapshot(encode_snapshot(snap({"name": 1}), 1, JSONCodec()), _Renamed(bad))


class _Renamed:
    """Reads msgspec state under the JSON codec's name, to reach the decode error path."""

    name = "json"

    def __init__(self, inner: MsgspecCodec[Any]) -> None:
        self.inner = inner

    def encode(self, state: Any) -> bytes:
        return self.inner.encode(state)

    def decode(self, data: bytes) -> Any:
        return self.inner.decode(data)


def test_codec_mismatch_is_an_envelope_error() -> None:
    data = encode_snapshot(snap(), 1, JSONCodec())
    with pytest.raises(errors.SnapshotEnvelopeInvalidError, match="codec"):
        decode_snapshot(data, MsgspecCodec())


def test_unencodable_state_is_a_clear_type_error() -> None:
    with pytest.raises(TypeError, match="cannot encode the state of thread 'thread-1'"):
        encode_snapshot(snap({"x": object()}), 1)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        (DecodeRecordOptions(thread_id="other"), "stored under thread 'other'"),
        (DecodeRecordOptions(revision=8), "stored at revision 8"),
        (DecodeRecordOptions(execution_pointer="elsewhere"), "stored pointer 'elsewhere'"),
    ],
)
def test_address_mismatch(options: DecodeRecordOptions, match: str) -> None:
    with pytest.raises(errors.SnapshotEnvelopeInvalidError, match=match):
        decode_record(encode_snapshot(snap(), 7), options)


def test_every_flipped_byte_is_detected() -> None:
    data = encode_snapshot(snap(), 3)
    for i in range(len(data)):
        broken = bytearray(data)
        broken[i] ^= 0x01
        with pytest.raises(errors.SnapshotEnvelopeInvalidError):
            decode_record(bytes(broken))


def test_truncation_and_garbage() -> None:
    data = encode_snapshot(snap(), 3)
    for cut in (0, 3, 10, len(data) - 1):
        with pytest.raises(errors.SnapshotEnvelopeInvalidError):
            decode_record(data[:cut])
    with pytest.raises(errors.SnapshotEnvelopeInvalidError, match="not a flowy record"):
        decode_record(b"\x80\x04pickle-looking bytes that must never be executed")


def _reseal(body: bytes) -> bytes:
    import hashlib

    return body + hashlib.blake2b(body, digest_size=16).digest()


def _with_header(header: dict[str, Any], version: int = 1) -> bytes:
    import json

    raw = json.dumps(header).encode()
    body = b"FLWY" + bytes((version,)) + struct.pack(">I", len(raw)) + raw + struct.pack(">I", 2)
    return _reseal(body + b"{}")


def _header(**changes: Any) -> dict[str, Any]:
    record = decode_record(encode_snapshot(snap(), 3))
    header = {
        f.name: getattr(record, f.name)
        for f in dataclasses.fields(Record)
        if f.name not in ("state", "format_version")
    }
    header["status"] = record.status.value
    header["handoff_status"] = record.handoff_status.value
    header["budget_counts"] = dict(record.budget_counts)
    header["metadata"] = dict(record.metadata)
    header["route"] = {}
    header.update(changes)
    return header


def test_well_formed_handmade_record_decodes() -> None:
    assert decode_record(_with_header(_header())).revision == 3


def test_a_route_is_kept_and_the_default_is_not_written() -> None:
    route = storage.Route("llm", "customer-7", 3)
    record = decode_record(encode_snapshot(dataclasses.replace(snap(), route=route), 3))
    assert record.route == route and record.to_snapshot(JSONCodec()).route == route
    plain = encode_snapshot(snap(), 3)
    assert b'"route"' not in plain and decode_record(plain).route == storage.Route()


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"thread_id": ""}, "empty thread id"),
        ({"execution_pointer": ""}, "empty execution pointer"),
        ({"revision": 0}, "revision 0 < 1"),
        ({"revision": True}, "wrong type"),
        ({"status": "exploded"}, "exploded"),
        ({"budget_counts": {"a": "x"}}, "budget_counts"),
        ({"handoff_pending_at": "soon"}, "handoff_pending_at"),
        ({"route": []}, "route"),
        ({"route": {"queue": "no spaces"}}, "queue name"),
        ({"route": {"priority": -1}}, "priority"),
        ({"route": {"lane": "x"}}, "unknown fields"),
    ],
)
def test_invalid_headers(changes: dict[str, Any], match: str) -> None:
    with pytest.raises(errors.SnapshotEnvelopeInvalidError, match=match):
        decode_record(_with_header(_header(**changes)))


def test_unknown_format_version() -> None:
    with pytest.raises(errors.SnapshotEnvelopeInvalidError, match="unknown format version 9"):
        decode_record(_with_header(_header(), version=9))


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.text()
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@given(state=json_values, revision=st.integers(min_value=1, max_value=2**53))
def test_property_any_json_state_round_trips(state: Any, revision: int) -> None:
    data = encode_snapshot(snap(state), revision)
    assert decode_snapshot(data, revision=revision).state == state


@pytest.mark.anyio
async def test_the_engine_builds_snapshots_with_every_field_a_snapshot_has() -> None:
    """The engine builds its per-step snapshot without ``Snapshot.__init__``: a field added
    to ``Snapshot`` and not given there would be missing from the snapshots it saves."""
    from flowy.memory import MemoryBackend
    from flowy.storage._model import SNAPSHOT_FIELDS

    backend: MemoryBackend[Any] = MemoryBackend()
    checkpointer = backend.checkpointer
    saved: list[set[str]] = []
    save, save_and_release = checkpointer.save, checkpointer.save_and_release

    async def recording_save(expected: int, snap: Any, **kwargs: Any) -> Any:
        saved.append(set(vars(snap)))
        return await save(expected, snap, **kwargs)

    async def recording_save_and_release(expected: int, snap: Any, **kwargs: Any) -> Any:
        saved.append(set(vars(snap)))
        return await save_and_release(expected, snap, **kwargs)

    checkpointer.save = recording_save  # type: ignore[method-assign]
    checkpointer.save_and_release = recording_save_and_release  # type: ignore[method-assign]
    b: flowy.GraphBuilder[dict[str, Any], Any] = flowy.GraphBuilder(lambda s, u: {**s, **u})

    async def step(s: dict[str, Any]) -> tuple[dict[str, Any], Any]:
        return {"n": 1}, flowy.end()

    b.add_node("step", step).allow_no_outgoing_route("step")
    result = await flowy.Runner(b.compile(version="v1"), backend).start("t", {})
    assert result.status == flowy.RunStatus.COMPLETED, result
    assert saved and all(names == SNAPSHOT_FIELDS for names in saved)
