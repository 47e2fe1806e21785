"""Pydantic v2 models as state (``PydanticCodec``, extra ``flowy-core[pydantic]``).

A graph whose state type is a ``BaseModel`` stores it with ``PydanticCodec`` without
being told; nodes return new models (``model_copy(update=...)``); nested models, enums,
datetimes, dates and optional fields round-trip; overlays and signal payloads name some
fields, merged and validated by the model; a stored state that does not fit is
flowy's ``SnapshotEnvelopeInvalidError`` naming the thread and the field, never
pydantic's ``ValidationError``. The runner tests run on memory, SQLite and PostgreSQL;
``flowy resume --overlay`` on SQLite and PostgreSQL. Schema evolution is in
``test_state_evolution.py``; that core imports and runs without pydantic is the last
test here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
import math
import subprocess
import sys
from collections.abc import Iterator, Mapping
from typing import Any, cast

import pydantic
import pytest
from pydantic_app import (
    AWAITING_APPROVAL,
    NOON,
    Customer,
    Message,
    Priority,
    Role,
    Ticket,
    graph,
    opened,
    said,
    signal_graph,
)
from stores_support import Store, environment, fresh_store

import flowy
from flowy.errors import SnapshotEnvelopeInvalidError
from flowy.storage import JSONCodec, PydanticCodec, Snapshot
from flowy.storage._codecs import codec_for_type
from flowy.storage.dialect import decode_snapshot, encode_snapshot


def full_ticket() -> Ticket:
    return Ticket(
        customer=Customer(name="ann", email=None),
        messages=[Message(role=Role.USER, text="late", at=NOON)],
        priority=Priority.HIGH,
        due=dt.date(2026, 1, 9),
        approver=None,
    )


# ------------------------------------------------------------------ the codec


def test_a_model_round_trips_with_nested_models_enums_datetimes_and_optionals() -> None:
    codec = PydanticCodec(Ticket)
    ticket = full_ticket()
    data = codec.encode(ticket)
    assert json.loads(data) == {
        "customer": {"name": "ann", "email": None},
        "messages": [{"role": "user", "text": "late", "at": "2026-01-02T12:00:00Z"}],
        "priority": 2,
        "due": "2026-01-09",
        "approved": False,
        "approver": None,
    }
    back = codec.decode(data)
    assert back == ticket
    assert type(back.messages[0].role) is Role and type(back.priority) is Priority
    assert back.messages[0].at == NOON and back.messages[0].at.utcoffset() == dt.timedelta(0)
    assert codec.name == "pydantic-json"


def test_other_types_round_trip_through_a_type_adapter() -> None:
    codec = PydanticCodec(list[Message])
    messages = [Message(role=Role.ASSISTANT, text="hi", at=NOON)]
    assert codec.decode(codec.encode(messages)) == messages


def test_plain_json_encodes_a_model_as_its_json_fields() -> None:
    data = JSONCodec().encode({"who": Customer(name="ann"), "at": NOON})
    assert json.loads(data) == {"who": {"name": "ann", "email": None}, "at": NOON.isoformat()}


def test_a_base_model_state_type_gets_the_pydantic_codec() -> None:
    @dataclasses.dataclass
    class Plain:
        n: int

    assert isinstance(codec_for_type(Ticket), PydanticCodec)
    assert isinstance(codec_for_type(Plain), JSONCodec)
    assert isinstance(codec_for_type(dict[str, Any]), JSONCodec)
    assert graph.state_type is Ticket


def test_a_record_that_does_not_fit_names_the_thread_and_the_field() -> None:
    codec = PydanticCodec(Ticket)
    loose = PydanticCodec(dict[str, Any])  # the same codec name: its records are read
    stored = {**json.loads(codec.encode(full_ticket())), "priority": 7}
    bad = encode_snapshot(Snapshot("t-9", stored, "triage"), 1, loose)
    with pytest.raises(SnapshotEnvelopeInvalidError) as info:
        decode_snapshot(bad, codec)
    assert not isinstance(info.value, pydantic.ValidationError)
    assert not isinstance(info.value.__cause__, pydantic.ValidationError)
    message = str(info.value)
    assert "'t-9'" in message and "PydanticCodec(Ticket)" in message
    assert "state.priority: Input should be 1 or 2 (got 7)" in message
    assert "\n" not in message


def test_decode_errors_are_one_line_value_errors_at_each_field() -> None:
    codec = PydanticCodec(Ticket)
    data = b'{"customer": {"email": 3}, "messages": [{"role": "bot", "text": "x", "at": "x"}]}'
    with pytest.raises(ValueError) as info:
        codec.decode(data)
    assert type(info.value) is ValueError and info.value.__cause__ is None
    assert str(info.value) == (
        "state.customer.name: Field required; "
        "state.customer.email: Input should be a valid string (got 3); "
        "state.messages[0].role: Input should be 'user' or 'assistant' (got 'bot'); "
        "and 1 more"
    )
    with pytest.raises(ValueError, match=r"^state: Invalid JSON"):
        codec.decode(b"{not json")


def test_what_would_not_load_back_is_refused_on_save() -> None:
    codec = PydanticCodec(Ticket)
    with pytest.raises(TypeError, match=r"PydanticCodec\(Ticket\) cannot encode dict"):
        codec.encode({"customer": {"name": "ann"}})  # type: ignore[arg-type]
    floats = PydanticCodec(dict[str, float | None])
    for number in (math.nan, math.inf):  # pydantic writes them as null
        with pytest.raises(ValueError, match="is not a JSON number"):
            floats.encode({"x": number})
    assert floats.decode(floats.encode({"x": None, "y": 1.5})) == {"x": None, "y": 1.5}
    ints = PydanticCodec(list[int])
    with pytest.raises(ValueError, match="more than 4300 digits"):
        ints.encode([1, 10**4300])
    assert ints.decode(ints.encode([10**4299])) == [10**4299]
    texts = PydanticCodec(list[str])  # a long run of digits in a string is fine
    assert texts.decode(texts.encode(["9" * 5000])) == ["9" * 5000]


# ------------------------------------------------------------------ overlays


def test_an_overlay_replaces_the_fields_it_names_and_the_model_validates_it() -> None:
    codec = PydanticCodec(Ticket)
    ticket = full_ticket()
    merged = codec.merge(ticket, {"approved": True, "approver": "bob"})
    assert merged == ticket.model_copy(update={"approved": True, "approver": "bob"})
    assert ticket.approved is False  # the stored state is not changed
    # A nested value is replaced as a whole and built into its model from plain JSON.
    moved = codec.merge(ticket, {"customer": {"name": "bo"}, "due": "2026-02-01"})
    assert moved is not None
    assert moved.customer == Customer(name="bo") and moved.due == dt.date(2026, 2, 1)
    with pytest.raises(ValueError) as unknown:
        codec.merge(ticket, {"aproved": True})
    assert str(unknown.value) == (
        "the overlay names 'aproved', not fields of Ticket (fields: approved, approver, "
        "customer, due, messages, priority)"
    )
    with pytest.raises(ValueError) as wrong:
        codec.merge(ticket, {"customer": {"email": "x@y"}})
    assert str(wrong.value) == (
        "the overlay does not fit Ticket: state.customer.name: Field required"
    )


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    with fresh_store(request, "pydantic") as made, environment(made):
        yield made


async def _approve(url: str, overlays: list[Mapping[str, Any]]) -> list[Any]:
    """Open a ticket (it waits for a person), resume it with each overlay in turn: the
    outcome of each (its result, or the error it raised), then the stored head and the
    name of the codec its record was written with."""
    outcomes: list[Any] = []
    async with flowy.connect(url) as backend:
        runner = flowy.Runner(graph, backend)
        first = await runner.start("tk-1", opened())
        assert first.reason == AWAITING_APPROVAL and first.resume_token is not None
        outcomes.append(first)
        for overlay in overlays:
            try:
                outcomes.append(await runner.resume(first.resume_token, state_overlay=overlay))
            except ValueError as exc:
                outcomes.append(exc)
        outcomes.append((await runner.head("tk-1"))[0])
        outcomes.append(cast(Any, runner.checkpointer).codec.name)
    return outcomes


def test_runner_runs_a_model_state_and_resume_merges_an_overlay(store: Store) -> None:
    first, wrong, unknown, done, head, codec = asyncio.run(
        _approve(
            store.url,
            [
                {"approved": [1]},
                {"approved": True, "aprover": "x"},
                {"approved": True, "approver": "bob"},
            ],
        )
    )
    assert codec == "pydantic-json"
    assert isinstance(first.state, Ticket) and len(first.state.messages) == 2
    assert isinstance(wrong, ValueError)
    assert "does not fit Ticket: state.approved: Input should be a valid boolean" in str(wrong)
    assert isinstance(unknown, ValueError) and "'aprover', not fields of Ticket" in str(unknown)
    assert done.status is flowy.RunStatus.COMPLETED, done
    expected = said(
        opened().model_copy(update={"approved": True, "approver": "bob"}),
        Role.ASSISTANT,
        "a person will look at it",
    )
    expected = said(expected, Role.ASSISTANT, "approved by bob")
    assert done.state == expected
    assert head.state == expected and isinstance(head.state, Ticket)


async def _signalled(url: str, payloads: list[Any]) -> list[Any]:
    """A ticket waits for "approval"; each payload is sent and the thread resumed."""
    outcomes: list[Any] = []
    async with flowy.connect(url) as backend:
        runner = flowy.Runner(signal_graph, backend)
        for i, payload in enumerate(payloads):
            first = await runner.start(f"s-{i}", opened())
            assert first.status is flowy.RunStatus.WAITING and first.resume_token is not None
            await runner.signal(f"s-{i}", "approval", payload)
            try:
                outcomes.append((await runner.resume(first.resume_token)).state)
            except ValueError as exc:
                outcomes.append(exc)
    return outcomes


def test_a_signal_payload_is_merged_into_the_model(store: Store) -> None:
    done, wrong = asyncio.run(
        _signalled(store.url, [{"approved": True, "approver": "bob"}, {"priority": 9}])
    )
    assert isinstance(done, Ticket) and done.approver == "bob" and done.approved
    assert done.messages[-1].text == "approved by bob"
    assert isinstance(wrong, ValueError)
    assert "does not fit Ticket: state.priority: Input should be 1 or 2 (got 9)" in str(wrong)


async def _nested(url: str) -> tuple[Any, Any]:
    """A model graph inside another: it suspends inside, and the resume goes on there."""

    async def note(s: Ticket) -> tuple[Ticket, flowy.Directive[Any]]:
        return said(s, Role.ASSISTANT, "inside"), flowy.suspend("inside", resume_at="close")

    async def close(s: Ticket) -> tuple[Ticket, flowy.Directive[Any]]:
        return s.model_copy(update={"priority": Priority.HIGH}), flowy.completed()

    child: flowy.GraphBuilder[Ticket, Any] = flowy.GraphBuilder(state=Ticket)
    child.add_node("note", note).add_node("close", close).add_edge("note", "close")
    parent: flowy.GraphBuilder[Ticket, Any] = flowy.GraphBuilder(state=Ticket)
    parent.add_subgraph("sub", child.allow_no_outgoing_route("close").compile())
    compiled = parent.allow_no_outgoing_route("sub").compile()
    async with flowy.connect(url) as backend:
        runner = flowy.Runner(compiled, backend)
        first = await runner.start("nest", opened())
        assert first.resume_token is not None
        done = await runner.resume(first.resume_token)
        return first.status, done.state


def test_a_model_state_pauses_and_resumes_inside_a_subgraph(store: Store) -> None:
    status, state = asyncio.run(_nested(store.url))
    assert status is flowy.RunStatus.SUSPENDED
    assert isinstance(state, Ticket) and state.priority is Priority.HIGH
    assert [m.text for m in state.messages] == ["my order is late", "inside"]


# ------------------------------------------------------------------ the flowy command


@pytest.fixture(params=["sqlite", "postgres"])
def shared_store(request: pytest.FixtureRequest) -> Iterator[Store]:
    with fresh_store(request, "pydantic-cli") as made:
        yield made


async def _open_ticket(url: str) -> int:
    async with flowy.connect(url) as backend:
        first = await flowy.Runner(graph, backend).start("tk", opened())
        assert first.resume_token is not None
        return first.resume_token.snapshot_revision


def test_flowy_resume_overlay_approves_a_model_state(shared_store: Store) -> None:
    store = shared_store
    with environment(store):
        revision = asyncio.run(_open_ticket(store.url))
    app = ("--graph", "pydantic_app:graph")
    token = f"tk@{revision}"
    unknown = store.flowy("resume", token, *app, "--overlay", '{"aproved": true}')
    assert unknown.returncode == 2 and "'aproved', not fields of Ticket" in unknown.stderr
    assert "Traceback" not in unknown.stderr
    wrong = store.flowy("resume", token, *app, "--overlay", '{"priority": 9}')
    assert wrong.returncode == 2 and "state.priority: Input should be 1 or 2" in wrong.stderr
    assert "Traceback" not in wrong.stderr
    overlay = '{"approved": true, "approver": "cli"}'
    proc = store.flowy("resume", token, *app, "--overlay", overlay, "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["status"] == "completed"
    assert result["state"]["approver"] == "cli" and result["state"]["customer"] == {
        "name": "ann",
        "email": None,
    }
    assert [m["text"] for m in result["state"]["messages"]] == [
        "my order is late",
        "a person will look at it",
        "approved by cli",
    ]
    shown = store.flowy("show", "tk", *app, "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["state"] == result["state"]


# ------------------------------------------------------------------ without pydantic


def test_core_imports_and_runs_without_pydantic() -> None:
    code = """
import sys
sys.modules["pydantic"] = None  # import pydantic now raises ImportError
import asyncio, dataclasses
import flowy
from flowy.storage import PydanticCodec
from flowy.storage._codecs import codec_for_type

@dataclasses.dataclass
class S:
    n: int = 0

async def step(s):
    return S(s.n + 1), flowy.completed()

b = flowy.GraphBuilder(state=S)
b.add_node("step", step).allow_no_outgoing_route("step")
async def main():
    async with flowy.connect("memory://no-pydantic") as backend:
        return await flowy.Runner(b.compile(), backend).start("t", S())
print(asyncio.run(main()).state, type(codec_for_type(S)).__name__)
try:
    PydanticCodec(S)
except ImportError as exc:
    print(exc)
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.splitlines() == [
        "S(n=1) JSONCodec",
        'PydanticCodec needs pydantic v2: pip install "flowy-core[pydantic]"',
    ]
