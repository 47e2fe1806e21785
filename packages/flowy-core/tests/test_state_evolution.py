"""A state type that changes between deploys, with the JSON, msgspec and pydantic codecs: an
added field with a default loads, a removed field is dropped on load (the record keeps
it), a changed type is refused naming the thread and the field, and nothing is lost."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pydantic
import pytest

from flowy.errors import SnapshotEnvelopeInvalidError
from flowy.memory import MemoryCheckpointer
from flowy.storage import JSONCodec, MsgspecCodec, PydanticCodec, Snapshot, StateCodec

pytestmark = pytest.mark.anyio


@dataclass
class OrderV1:
    order_id: str
    amount: int
    note: str = ""


@dataclass
class OrderV2:  # "note" removed, "currency" added with a default
    order_id: str
    amount: int
    currency: str = "EUR"
    tags: list[str] = field(default_factory=list)


@dataclass
class OrderV3:  # "amount" changed type
    order_id: str
    amount: str


class StructV1(msgspec.Struct):
    order_id: str
    amount: int
    note: str = ""


class StructV2(msgspec.Struct):
    order_id: str
    amount: int
    currency: str = "EUR"
    tags: list[str] = msgspec.field(default_factory=list)


class StructV3(msgspec.Struct):
    order_id: str
    amount: str


class ModelV1(pydantic.BaseModel):
    order_id: str
    amount: int
    note: str = ""


class ModelV2(pydantic.BaseModel):
    order_id: str
    amount: int
    currency: str = "EUR"
    tags: list[str] = pydantic.Field(default_factory=lambda: [])


class ModelV3(pydantic.BaseModel):
    order_id: str
    amount: str


Codec = Callable[[Any], StateCodec[Any]]
CASES = [
    pytest.param(JSONCodec, OrderV1, OrderV2, OrderV3, id="json"),
    pytest.param(MsgspecCodec, StructV1, StructV2, StructV3, id="msgspec"),
    pytest.param(PydanticCodec, ModelV1, ModelV2, ModelV3, id="pydantic"),
]


async def _saved(codec: Codec, v1: Any) -> MemoryCheckpointer[Any]:
    cp = MemoryCheckpointer[Any](codec=codec(v1))
    state = v1(order_id="o-1", amount=42, note="fragile")
    await cp.save(0, Snapshot("order-7", state, "pay"))
    return cp


@pytest.mark.parametrize(("codec", "v1", "v2", "v3"), CASES)
async def test_an_added_field_with_a_default_loads_and_a_removed_one_is_dropped(
    codec: Codec, v1: Any, v2: Any, v3: Any
) -> None:
    cp = await _saved(codec, v1)
    snap, _ = await cp.with_codec(codec(v2)).load("order-7")
    assert snap.state == v2(order_id="o-1", amount=42)  # currency defaulted, note dropped
    # The record keeps the removed field until the next save: the old type still reads it.
    old, _ = await cp.load("order-7")
    assert old.state.note == "fragile"


@pytest.mark.parametrize(("codec", "v1", "v2", "v3"), CASES)
async def test_a_changed_type_names_the_thread_and_the_field_and_loses_nothing(
    codec: Codec, v1: Any, v2: Any, v3: Any
) -> None:
    cp = await _saved(codec, v1)
    with pytest.raises(SnapshotEnvelopeInvalidError) as info:
        await cp.with_codec(codec(v3)).load("order-7")
    message = str(info.value)
    assert "'order-7'" in message and "amount" in message
    snap, revision = await cp.load("order-7")  # the old type reads it, unchanged
    assert revision == 1 and snap.state == v1(order_id="o-1", amount=42, note="fragile")
