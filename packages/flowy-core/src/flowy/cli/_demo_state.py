"""The state of the ``flowy demo`` refund agent (:mod:`flowy.cli.demo`): its constants,
its TypedDicts and the pure helpers its nodes, its world and the story share.
"""

from __future__ import annotations

from typing import Any, TypeAlias, TypedDict, cast

from .._directives import Directive
from .._types import JSON

__all__ = [
    "APPROVAL_TIMEOUT",
    "CRASHING_GRAPH_SPEC",
    "GRAPH_SPEC",
    "LEDGER_APPLICATION_ID",
    "REVIEW_SIGNAL",
    "SENIOR_REVIEWER",
    "THREAD_ID",
    "Approval",
    "DemoEffect",
    "Order",
    "OrderLine",
    "Proposal",
    "Refund",
    "RefundState",
    "Step",
    "activity_key",
    "approval_payload",
    "approval_timeout",
    "merge_state",
    "money",
    "money_of",
    "order_of",
    "proposal_of",
    "refund_of",
    "take_review",
]

THREAD_ID = "refund-A1001"
"""The thread the demo runs."""

GRAPH_SPEC = "flowy.cli.demo:build_graph"
"""How ``--graph`` names the demo's graph."""

CRASHING_GRAPH_SPEC = "flowy.cli.demo:crashing_worker_graph"
"""How ``--graph`` names the graph of the worker that crashes."""

LEDGER_APPLICATION_ID = 0x464C5950
"""``PRAGMA application_id`` of the demo's payments ledger (the bytes ``FLYP``)."""

REVIEW_SIGNAL = "review"
"""The signal a reviewer's decision arrives as (``Runner.signal`` / ``flowy signal``)."""

APPROVAL_TIMEOUT = 1.5
"""Seconds ``await_approval`` waits for a first decision before it escalates (at pace 1)."""

SENIOR_REVIEWER = "dana"
"""Who an escalated refund goes to."""


# ----------------------------------------------------------------------------- state


class OrderLine(TypedDict):
    """One line of an order."""

    sku: str
    name: str
    price_cents: int


class Order(TypedDict):
    """An order as the shop's order service returns it."""

    order_id: str
    customer: str
    email: str
    lines: list[OrderLine]
    paid_cents: int
    delivered_on: str


class Proposal(TypedDict):
    """The refund the agent proposes; ``idempotency_key`` is fixed before any money moves."""

    id: str
    number: int
    skus: list[str]
    amount_cents: int
    rationale: str
    idempotency_key: str


class Approval(TypedDict):
    """A reviewer's decision on one proposal: the payload of a ``"review"`` signal, put
    in the state by :func:`take_review`."""

    proposal_id: str
    decision: str
    reviewer: str
    amount_cents: int


class Refund(TypedDict):
    """What the payments gateway answered."""

    refund_id: str
    amount_cents: int
    idempotency_key: str
    replayed: bool


class RefundState(TypedDict, total=False):
    """The agent's state: plain JSON, so any process can load it."""

    order_id: str
    customer_messages: list[str]
    plan: list[str]
    order: Order
    proposal: Proposal
    approval: Approval
    escalated_to: str
    refund: Refund
    reply: str


DemoEffect: TypeAlias = dict[str, str]
"""Effects of the demo graph: ``{"kind": ..., ...}`` with string values."""

Step: TypeAlias = tuple[RefundState, Directive[DemoEffect]]


def merge_state(state: RefundState, update: RefundState) -> RefundState:
    """The graph's reducer: a node's update overwrites the keys it names."""
    merged = state.copy()
    merged.update(update)
    return merged


def _missing(key: str, node: str) -> RuntimeError:
    return RuntimeError(f"the state has no {key!r} yet: {node} has not run")


def order_of(state: RefundState) -> Order:
    """The order ``lookup_order`` put in the state."""
    order = state.get("order")
    if order is None:
        raise _missing("order", "lookup_order")
    return order


def proposal_of(state: RefundState) -> Proposal:
    """The proposal ``propose_refund`` put in the state."""
    proposal = state.get("proposal")
    if proposal is None:
        raise _missing("proposal", "propose_refund")
    return proposal


def refund_of(state: RefundState) -> Refund:
    """The refund ``issue_refund`` put in the state."""
    refund = state.get("refund")
    if refund is None:
        raise _missing("refund", "issue_refund")
    return refund


def money(cents: int) -> str:
    """``2400`` → ``$24.00``."""
    return f"${cents / 100:,.2f}"


def money_of(proposal: Proposal) -> str:
    """The proposal's amount as money."""
    return money(proposal["amount_cents"])


def approval_timeout(pace: float) -> float:
    """Seconds the first wait for a decision lasts: :data:`APPROVAL_TIMEOUT` scaled by the
    demo's pace, and never less than 0.2 s (``--fast``)."""
    return max(APPROVAL_TIMEOUT * pace, 0.2)


def activity_key(proposal: Proposal) -> str:
    """The journal key of the refund of ``proposal``: one refund per proposal."""
    return f"refund:{proposal['id']}"


def approval_payload(approval: Approval) -> JSON:
    """``approval`` as the JSON payload of a ``"review"`` signal."""
    return {
        "proposal_id": approval["proposal_id"],
        "decision": approval["decision"],
        "reviewer": approval["reviewer"],
        "amount_cents": approval["amount_cents"],
    }


def take_review(state: RefundState, payload: Any) -> RefundState:
    """The graph's ``on_signal("review")`` handler: the decision enters the state as
    ``approval`` (whatever proposal it is about: ``await_approval`` checks that). A
    payload that is not a decision leaves the state as it was."""
    if not isinstance(payload, dict):
        return state
    fields = cast(dict[str, Any], payload)
    proposal_id, decision = fields.get("proposal_id"), fields.get("decision")
    reviewer, amount = fields.get("reviewer"), fields.get("amount_cents")
    if not (
        isinstance(proposal_id, str)
        and isinstance(decision, str)
        and isinstance(reviewer, str)
        and isinstance(amount, int)
        and not isinstance(amount, bool)
    ):
        return state
    approval: Approval = {
        "proposal_id": proposal_id,
        "decision": decision,
        "reviewer": reviewer,
        "amount_cents": amount,
    }
    return merge_state(state, {"approval": approval})
