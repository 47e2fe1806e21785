"""A support agent whose state is a pydantic model with a message list: what
``test_pydantic.py`` runs, in this process and through the ``flowy`` command
(``--graph pydantic_app:graph``).

    triage -> reply

``triage`` notes the customer's message and suspends ("awaiting_approval") until a
person approves; ``reply`` then answers and completes. ``signal_graph`` waits for an
"approval" signal instead of suspending.
"""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any

from pydantic import BaseModel, Field

import flowy

AWAITING_APPROVAL = "awaiting_approval"
NOON = dt.datetime(2026, 1, 2, 12, 0, tzinfo=dt.UTC)


class Role(enum.Enum):
    USER = "user"
    ASSISTANT = "assistant"


class Priority(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Message(BaseModel):
    role: Role
    text: str
    at: dt.datetime


class Customer(BaseModel):
    name: str
    email: str | None = None


class Ticket(BaseModel):
    customer: Customer
    messages: list[Message] = Field(default_factory=lambda: [])
    priority: Priority = Priority.LOW
    due: dt.date | None = None
    approved: bool = False
    approver: str | None = None


Step = tuple[Ticket, flowy.Directive[Any]]


def said(state: Ticket, role: Role, text: str) -> Ticket:
    """``state`` with one more message (a node returns a new model; the stored one is
    not changed)."""
    message = Message(role=role, text=text, at=NOON)
    return state.model_copy(update={"messages": [*state.messages, message]})


async def triage(state: Ticket) -> Step:
    if not state.approved:
        noted = said(state, Role.ASSISTANT, "a person will look at it")
        return noted, flowy.suspend(AWAITING_APPROVAL)
    return state, flowy.completed()


async def reply(state: Ticket) -> Step:
    return said(state, Role.ASSISTANT, f"approved by {state.approver}"), flowy.completed()


def _build() -> flowy.Graph[Ticket, Any]:
    b: flowy.GraphBuilder[Ticket, Any] = flowy.GraphBuilder(state=Ticket)
    b.add_node("triage", triage).add_node("reply", reply).add_edge("triage", "reply")
    return b.allow_no_outgoing_route("reply").compile()


graph = _build()


async def ask(state: Ticket) -> Step:
    return state, flowy.wait_for("approval", resume_at="reply")


def _signal_build() -> flowy.Graph[Ticket, Any]:
    b: flowy.GraphBuilder[Ticket, Any] = flowy.GraphBuilder(state=Ticket)
    b.add_node("ask", ask).add_node("reply", reply).add_edge("ask", "reply")
    return b.allow_no_outgoing_route("reply").compile()


signal_graph = _signal_build()


def opened() -> Ticket:
    """A new ticket with the customer's first message."""
    return said(Ticket(customer=Customer(name="ann")), Role.USER, "my order is late")
