"""Partial state overlays: a mapping names some fields of a typed state (a dataclass, a
TypedDict, a msgspec Struct); they are merged into the stored state one by one, and the
result is validated as a whole by the state's codec. A field the overlay names replaces
the stored value (a nested value is replaced, not merged into).

The codec merges (``JSONCodec.merge``, ``MsgspecCodec.merge``); ``Runner.resume`` merges
with the store's codec, on every store. The first-app guide's ``Expense`` is approved
here through ``Runner.resume``; through ``flowy resume --overlay`` in
``test_cli_stores.py``, through the inspector's Resume form in ``test_ui.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any, TypedDict

import msgspec
import pytest
from stores_support import ALL_STORES, Store, environment, fresh_store
from stores_support import dynamodb_endpoint as dynamodb_endpoint  # a fixture

import flowy
from examples.approval_app.graph import AWAITING_APPROVAL, PAYMENT_QUEUED, Expense, graph
from flowy.storage import JSONCodec, MsgspecCodec


@dataclasses.dataclass
class Address:
    street: str
    city: str


@dataclasses.dataclass
class Customer:
    name: str
    address: Address
    tags: list[str] = dataclasses.field(default_factory=lambda: [])
    vip: bool = False


class CustomerDict(TypedDict):
    name: str
    age: int


class AddressStruct(msgspec.Struct):
    street: str
    city: str


class CustomerStruct(msgspec.Struct):
    name: str
    address: AddressStruct
    age: int = 0


# ------------------------------------------------------------------ the codec's merge


def test_a_dataclass_overlay_replaces_the_fields_it_names() -> None:
    codec = JSONCodec(Customer)
    state = Customer("ann", Address("Main St", "Oslo"), ["new"])
    merged = codec.merge(state, {"vip": True, "tags": ["gold"]})
    assert merged == Customer("ann", Address("Main St", "Oslo"), ["gold"], vip=True)
    assert state.vip is False  # the stored state is not changed
    # a nested value is replaced as a whole, and built into its type from plain JSON
    moved = codec.merge(state, {"address": {"street": "Pier 4", "city": "Bergen"}})
    assert moved == Customer("ann", Address("Pier 4", "Bergen"), ["new"])
    with pytest.raises(ValueError, match=r"does not fit Customer: state\.address\.street: missing"):
        codec.merge(state, {"address": {"city": "Bergen"}})  # not merged into the address


def test_a_typeddict_overlay_replaces_the_fields_it_names() -> None:
    codec = JSONCodec(CustomerDict)
    state = CustomerDict(name="ann", age=40)
    assert codec.merge(state, {"age": 41}) == {"name": "ann", "age": 41}
    with pytest.raises(ValueError, match=r"'agee', not fields of CustomerDict"):
        codec.merge(state, {"agee": 41})
    with pytest.raises(ValueError, match=r"does not fit CustomerDict: state\.age: expected int"):
        codec.merge(state, {"age": "old"})


def test_a_msgspec_struct_overlay_replaces_the_fields_it_names() -> None:
    codec = MsgspecCodec(CustomerStruct)
    state = CustomerStruct("ann", AddressStruct("Main St", "Oslo"), 40)
    assert codec.merge(state, {"age": 41}) == CustomerStruct(
        "ann", AddressStruct("Main St", "Oslo"), 41
    )
    moved = codec.merge(state, {"address": {"street": "Pier 4", "city": "Bergen"}})
    assert moved == CustomerStruct("ann", AddressStruct("Pier 4", "Bergen"), 40)
    with pytest.raises(ValueError, match=r"'agee', not fields of CustomerStruct"):
        codec.merge(state, {"agee": 41})
    with pytest.raises(ValueError, match=r"does not fit CustomerStruct: Expected `int`.*\$\.age"):
        codec.merge(state, {"age": "old"})
    with pytest.raises(ValueError, match=r"missing required field `street`.*\$\.address"):
        codec.merge(state, {"address": {"city": "Bergen"}})


def test_the_errors_name_the_field_in_one_line() -> None:
    codec = JSONCodec(Expense)
    state = Expense("ann", 500, "laptop")
    with pytest.raises(ValueError) as unknown:
        codec.merge(state, {"approved": True, "aprover": "cli"})
    assert str(unknown.value) == (
        "the overlay names 'aprover', not fields of Expense (fields: amount, approved, "
        "approver, payment_id, reason, summary, who)"
    )
    with pytest.raises(ValueError) as wrong:
        codec.merge(state, {"amount": "a lot"})
    assert str(wrong.value) == (
        "the overlay does not fit Expense: state.amount: expected int, got 'a lot'"
    )


def test_a_state_without_known_fields_is_left_to_the_reducer() -> None:
    assert JSONCodec[dict[str, int]]().merge({"a": 1}, {"b": 2}) is None
    assert JSONCodec(dict[str, int]).merge({"a": 1}, {"b": 2}) is None


# ------------------------------------------------------------------ Runner.resume


@pytest.fixture(params=ALL_STORES)
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    with fresh_store(request, "overlay") as made, environment(made):
        yield made


async def _approve(url: str, overlays: list[Mapping[str, Any]]) -> list[Any]:
    """Start a large expense (it waits for a person), then resume it with each overlay in
    turn: the outcome of each (its result, or the error it raised) and the head after."""
    outcomes: list[Any] = []
    async with flowy.connect(url) as backend:
        runner = flowy.Runner(graph, backend)
        first = await runner.start("exp-1", Expense("ann", 500, "laptop"))
        assert first.reason == AWAITING_APPROVAL and first.resume_token is not None
        for overlay in overlays:
            try:
                outcomes.append(await runner.resume(first.resume_token, state_overlay=overlay))
            except ValueError as exc:
                outcomes.append(exc)
        outcomes.append((await runner.head("exp-1"))[0])
    return outcomes


def test_runner_resume_approves_the_first_app_expense(store: Store) -> None:
    wrong, unknown, done, head = asyncio.run(
        _approve(
            store.url,
            [
                {"approved": "yes"},
                {"approved": True, "aprover": "cli"},
                {"approved": True, "approver": "cli"},
            ],
        )
    )
    assert isinstance(wrong, ValueError) and "state.approved: expected bool" in str(wrong)
    assert isinstance(unknown, ValueError) and "'aprover', not fields of Expense" in str(unknown)
    assert done.reason == PAYMENT_QUEUED, done
    assert done.status is flowy.RunStatus.HANDOFF
    approved = Expense(
        "ann", 500, "laptop", "ann asks for 500 for 'laptop'", approver="cli", approved=True
    )
    assert done.state == approved
    assert head.state == approved


async def _msgspec_resume(url: str) -> tuple[object, object]:
    async with flowy.connect(url, codec=MsgspecCodec(CustomerStruct)) as backend:
        b: flowy.GraphBuilder[CustomerStruct, Any] = flowy.GraphBuilder(state=CustomerStruct)

        async def ask(s: CustomerStruct) -> tuple[CustomerStruct, flowy.Directive[Any]]:
            return s, (flowy.completed() if s.age else flowy.suspend("wait"))

        b.add_node("ask", ask).allow_no_outgoing_route("ask")
        runner = flowy.Runner(b.compile(), backend)
        first = await runner.start("c", CustomerStruct("ann", AddressStruct("Main St", "Oslo")))
        assert first.resume_token is not None
        try:
            await runner.resume(first.resume_token, state_overlay={"age": "old"})
        except ValueError as exc:
            refused: object = exc
        else:
            refused = None
        done = await runner.resume(first.resume_token, state_overlay={"age": 41})
        return refused, done.state


def test_runner_resume_merges_into_a_msgspec_struct(store: Store) -> None:
    refused, state = asyncio.run(_msgspec_resume(store.url))
    assert isinstance(refused, ValueError) and "$.age" in str(refused)
    assert state == CustomerStruct("ann", AddressStruct("Main St", "Oslo"), 41)


# ------------------------------------------------------------------ signal payloads


@dataclasses.dataclass
class Request:
    who: str
    approved: bool = False
    approver: str = ""


def _signal_graph() -> flowy.Graph[Request, Any]:
    async def ask(s: Request) -> tuple[Request, flowy.Directive[Any]]:
        return s, flowy.wait_for("approval", resume_at="done")

    async def done(s: Request) -> tuple[Request, flowy.Directive[Any]]:
        return s, flowy.completed()

    b: flowy.GraphBuilder[Request, Any] = flowy.GraphBuilder(state=Request)
    b.add_node("ask", ask).add_node("done", done).add_edge("ask", "done")
    return b.allow_no_outgoing_route("done").compile()


async def _signalled(url: str, payloads: list[Any]) -> list[Any]:
    """A thread waits for "approval"; each payload is sent and the thread resumed."""
    outcomes: list[Any] = []
    async with flowy.connect(url) as backend:
        runner = flowy.Runner(_signal_graph(), backend)
        for i, payload in enumerate(payloads):
            first = await runner.start(f"r-{i}", Request("ann"))
            assert first.status is flowy.RunStatus.WAITING and first.resume_token is not None
            await runner.signal(f"r-{i}", "approval", payload)
            try:
                outcomes.append((await runner.resume(first.resume_token)).state)
            except ValueError as exc:
                outcomes.append(exc)
    return outcomes


def test_a_signal_payload_is_merged_like_an_overlay(store: Store) -> None:
    done, wrong = asyncio.run(
        _signalled(store.url, [{"approved": True, "approver": "bob"}, {"approved": "yes"}])
    )
    assert done == Request("ann", approved=True, approver="bob")
    assert isinstance(wrong, ValueError)
    assert "does not fit Request: state.approved: expected bool" in str(wrong)
