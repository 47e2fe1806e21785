"""Hostile bytes never escape decoding as anything but the documented errors.

Records (``decode_record`` / ``decode_snapshot``) raise only
``SnapshotEnvelopeInvalidError``; hand-off intents (``decode_intent``) raise only
``ValueError``. Inputs: arbitrary bytes, damaged valid records, and well-formed
envelopes (with a correct digest) around hostile headers and states: deep nesting,
5,000-digit integers, wrong types, lone surrogates.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowy.errors import SnapshotEnvelopeInvalidError
from flowy.storage import JSONCodec, MsgspecCodec, Snapshot
from flowy.storage.dialect import decode_intent, decode_record, decode_snapshot, encode_snapshot

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)

hostile_texts = st.sampled_from(
    [
        b"[" * 50_000,
        b"{" * 3000 + b"}" * 3000,
        b"9" * 5000,
        b'{"a": ' + b"1" * 6000 + b"}",
        '"\udcff"'.encode("utf-8", "surrogatepass"),
        b"\xff\xfe\xfd",
        b"NaN",
        b"",
    ]
)


def envelope(header: bytes, state: bytes, version: int = 1) -> bytes:
    """A record envelope with a correct digest around any header and state bytes."""
    body = b"".join(
        (
            b"FLWY",
            bytes((version,)),
            struct.pack(">I", len(header)),
            header,
            struct.pack(">I", len(state)),
            state,
        )
    )
    return body + hashlib.blake2b(body, digest_size=16).digest()


VALID_HEADER: dict[str, Any] = {
    "thread_id": "t",
    "revision": 1,
    "execution_pointer": "n",
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
    "updated_at": 0.0,
    "write_id": "",
}


def only_envelope_errors(data: bytes, **address: Any) -> None:
    try:
        decode_snapshot(data, **address)
    except SnapshotEnvelopeInvalidError:
        pass


@dataclass
class Order:
    order_id: str
    amount: int


@FUZZ
@given(st.binary(max_size=300))
def test_arbitrary_bytes(data: bytes) -> None:
    try:
        decode_record(data)
    except SnapshotEnvelopeInvalidError:
        pass


@FUZZ
@given(st.data())
def test_damaged_valid_records(data: st.DataObject) -> None:
    record = encode_snapshot(Snapshot("thread", {"n": 1, "s": "x" * 10}, "node"), 3)
    index = data.draw(st.integers(0, len(record) - 1))
    damage = data.draw(
        st.sampled_from(["flip", "truncate", "extend", "splice"]),
    )
    if damage == "flip":
        damaged = record[:index] + bytes((record[index] ^ 0xFF,)) + record[index + 1 :]
    elif damage == "truncate":
        damaged = record[:index]
    elif damage == "extend":
        damaged = record + data.draw(st.binary(min_size=1, max_size=20))
    else:
        damaged = record[:index] + data.draw(st.binary(max_size=20)) + record[index:]
    if damaged != record:
        only_envelope_errors(damaged, thread_id="thread", revision=3)


@FUZZ
@given(st.dictionaries(st.text(max_size=12), json_values, max_size=8), json_values)
def test_well_formed_envelopes_with_hostile_headers(extra: dict[str, Any], value: Any) -> None:
    header = {**VALID_HEADER, **extra}
    for raw in (json.dumps(header).encode(), json.dumps(value).encode()):
        only_envelope_errors(envelope(raw, b"{}"))


@FUZZ
@given(hostile_texts, st.sampled_from(sorted(VALID_HEADER)))
def test_hostile_header_fields_and_texts(text: bytes, field: str) -> None:
    only_envelope_errors(envelope(text, b"{}"))
    header = json.dumps({**VALID_HEADER, field: "__X__"}).encode()
    only_envelope_errors(envelope(header.replace(b'"__X__"', text), b"{}"))


@FUZZ
@given(
    st.one_of(
        hostile_texts, st.binary(max_size=100), json_values.map(lambda v: json.dumps(v).encode())
    )
)
def test_hostile_states_for_every_codec(state: bytes) -> None:
    header = json.dumps(VALID_HEADER).encode()
    for codec in (None, JSONCodec(Order), JSONCodec(dict[str, int])):
        try:
            decode_snapshot(envelope(header, state), codec)
        except SnapshotEnvelopeInvalidError:
            pass
    msgspec_header = json.dumps({**VALID_HEADER, "codec": "msgspec-json"}).encode()
    for msgspec_codec in (MsgspecCodec(), MsgspecCodec(Order)):
        try:
            decode_snapshot(envelope(msgspec_header, state), msgspec_codec)
        except SnapshotEnvelopeInvalidError:
            pass


@FUZZ
@given(st.one_of(st.binary(max_size=300), hostile_texts))
def test_intents_from_arbitrary_bytes(data: bytes) -> None:
    try:
        decode_intent(data)
    except ValueError:
        pass


@FUZZ
@given(st.dictionaries(st.text(max_size=12), json_values, max_size=10))
def test_intents_from_hostile_objects(extra: dict[str, Any]) -> None:
    valid = {
        "v": 1,
        "thread_id": "t",
        "pending": 1,
        "committed": 2,
        "revision": 2,
        "token_revision": 2,
        "handoff_status": "enqueued",
        "reason": "r",
        "pointer": "n",
        "created_at": 1.0,
    }
    try:
        decode_intent(json.dumps({**valid, **extra}))
    except ValueError:
        pass


def test_a_state_too_deep_to_load_back_is_refused_at_save_time() -> None:
    deep: Any = 1
    for _ in range(300):
        deep = {"a": deep}
    with pytest.raises(ValueError, match="nested more than 100 levels"):
        encode_snapshot(Snapshot("t", deep, "n"), 1)
    shallow: Any = 1
    for _ in range(100):
        shallow = {"a": shallow}
    assert decode_snapshot(encode_snapshot(Snapshot("t", shallow, "n"), 1)).state == shallow
