"""The ``flowy demo`` workflow: a refund agent that waits for a reviewer (escalating when
nobody answers in time), hands off to a background worker, survives that worker's crash
and refunds exactly once.

The agent is a graph over a JSON state with a deterministic scripted "model" (no
network, no keys)::

    plan → lookup_order → propose_refund → await_approval ⇢ issue_refund → notify_customer
                                  (timeout route) await_approval ⇢ escalate ⇢ await_approval

``await_approval`` waits, durably, for the signal ``"review"`` (``flowy.wait_for``) with
a short timeout; the graph's ``on_signal("review")`` handler puts the reviewer's
decision in the state. A decision about another proposal than the current one is kept
but not applied: the node waits again. When the deadline passes first, a worker's timer
resumes the run at ``escalate`` (the timeout route), which pages a senior reviewer and
waits for the review without a deadline. An approval of the current proposal hands the
run off to a background worker through the SQLite outbox.

``issue_refund`` calls a payments "gateway" (a table in a second SQLite file) as a
``flowy.activity`` keyed ``refund:<proposal>``: the thread's journal records the call
before and after it happens. A worker that dies between the gateway's answer and that
record leaves the outcome unknown; the next worker's ``reconcile`` hook looks the refund
up in the ledger by its idempotency key and never calls the gateway again. The gateway
keeps its idempotency keys anyway (defence in depth).

``build_graph`` is the factory ``flowy worker --graph flowy.cli.demo:build_graph`` loads;
``crashing_worker_graph`` is the same graph whose worker process kills itself right
after the gateway's answer, before the journal records it (the demo's first worker runs
it). ``flowy demo`` plays the whole story and prints it.

This module holds the nodes and the graph; the state and its helpers are in
:mod:`._demo_state`, the outside world (orders, the scripted model, the payments
gateway and its ledger) in :mod:`._demo_world`, and every name of theirs the story, the
checker and the tests use is importable from here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from .._activities import activity
from .._directives import completed, effect, end, handoff, wait_for
from .._graph import Graph, GraphBuilder
from ._demo_state import APPROVAL_TIMEOUT as APPROVAL_TIMEOUT
from ._demo_state import CRASHING_GRAPH_SPEC as CRASHING_GRAPH_SPEC
from ._demo_state import GRAPH_SPEC as GRAPH_SPEC
from ._demo_state import LEDGER_APPLICATION_ID as LEDGER_APPLICATION_ID
from ._demo_state import REVIEW_SIGNAL as REVIEW_SIGNAL
from ._demo_state import SENIOR_REVIEWER as SENIOR_REVIEWER
from ._demo_state import THREAD_ID as THREAD_ID
from ._demo_state import Approval as Approval
from ._demo_state import DemoEffect as DemoEffect
from ._demo_state import Order as Order
from ._demo_state import OrderLine as OrderLine
from ._demo_state import Proposal as Proposal
from ._demo_state import Refund as Refund
from ._demo_state import RefundState as RefundState
from ._demo_state import Step as Step
from ._demo_state import activity_key as activity_key
from ._demo_state import approval_payload as approval_payload
from ._demo_state import approval_timeout as approval_timeout
from ._demo_state import merge_state as merge_state
from ._demo_state import money as money
from ._demo_state import money_of as money_of
from ._demo_state import order_of as order_of
from ._demo_state import proposal_of as proposal_of
from ._demo_state import refund_of as refund_of
from ._demo_state import take_review as take_review
from ._demo_world import FIRST_MESSAGE as FIRST_MESSAGE
from ._demo_world import FOLLOW_UP as FOLLOW_UP
from ._demo_world import MODEL as MODEL
from ._demo_world import ORDERS as ORDERS
from ._demo_world import PaymentsGateway as PaymentsGateway
from ._demo_world import ScriptedModel as ScriptedModel
from ._demo_world import demo_pace, fetch_order, latency, open_gateway, say
from ._demo_world import open_ledger as open_ledger
from ._demo_world import payments_path as payments_path
from ._demo_world import read_ledger as read_ledger
from ._render import console

__all__ = [
    "APPROVAL_TIMEOUT",
    "CRASHING_GRAPH_SPEC",
    "GRAPH_SPEC",
    "LEDGER_APPLICATION_ID",
    "REVIEW_SIGNAL",
    "SENIOR_REVIEWER",
    "THREAD_ID",
    "RefundState",
    "activity_key",
    "approval_payload",
    "approval_timeout",
    "build_graph",
    "crashing_worker_graph",
    "open_ledger",
    "payments_path",
    "read_ledger",
    "take_review",
]


# ----------------------------------------------------------------------------- nodes


async def plan(state: RefundState) -> Step:
    """Ask the model for a plan."""
    return {"plan": await MODEL.plan(state.get("customer_messages", []))}, completed()


async def lookup_order(state: RefundState) -> Step:
    """Load the order the customer writes about."""
    return {"order": await fetch_order(state.get("order_id", ""))}, completed()


async def propose_refund(state: RefundState) -> Step:
    """Let the model propose a refund; the proposal is an effect for the support UI."""
    previous = state.get("proposal")
    number = previous["number"] + 1 if previous is not None else 1
    order = order_of(state)
    proposal = await MODEL.propose(order, state.get("customer_messages", []), number)
    names = {line["sku"]: line["name"] for line in order["lines"]}
    emitted: DemoEffect = {
        "kind": "refund_proposed",
        "proposal": proposal["id"],
        "amount": money(proposal["amount_cents"]),
        "items": ", ".join(names[sku] for sku in proposal["skus"]),
    }
    return {"proposal": proposal}, effect(completed(), emitted)


def _matches(approval: Approval, proposal: Proposal) -> bool:
    return (
        approval["proposal_id"] == proposal["id"]
        and approval["amount_cents"] == proposal["amount_cents"]
    )


async def await_approval(state: RefundState) -> Step:
    """Wait for a reviewer's decision on the current proposal (the ``"review"`` signal);
    on an approval, hand the refund to a background worker.

    The first wait has a short deadline: when it passes without a decision the run goes
    on at ``escalate`` (the node's timeout route). Once escalated, it waits without one.
    """
    await latency(0.05)
    proposal = proposal_of(state)
    approval = state.get("approval")
    escalated_to = state.get("escalated_to")
    if approval is not None and _matches(approval, proposal):
        if approval["decision"] != "approve":
            say("review", f"{approval['reviewer']} rejected {proposal['id']}", "yellow")
            return {}, end()
        say(
            "review",
            f"{approval['reviewer']} approved {proposal['id']} ({money_of(proposal)})",
            "yellow",
        )
        return {}, handoff("refund_approved", resume_at="issue_refund")
    if approval is not None:
        say(
            "review",
            f"{approval['reviewer']}'s decision is about {approval['proposal_id']} "
            f"({money(approval['amount_cents'])}), not the current {proposal['id']} "
            f"({money_of(proposal)}): kept, not applied {console().sym('arrow')} still waiting",
            "yellow",
        )
    if escalated_to is not None:
        if approval is None:
            say(
                "review",
                f"{proposal['id']} ({money_of(proposal)}) waits for {escalated_to}'s decision, "
                "without a deadline now",
            )
        return {}, wait_for(REVIEW_SIGNAL, resume_at="await_approval", reason="awaiting_approval")
    timeout = approval_timeout(demo_pace())
    say(
        "review",
        f"{proposal['id']} ({money_of(proposal)}) waits for a reviewer; escalates in "
        f"{timeout:g}s without a decision",
    )
    return {}, wait_for(
        REVIEW_SIGNAL, timeout=timeout, resume_at="await_approval", reason="awaiting_approval"
    )


async def escalate(state: RefundState) -> Step:
    """Nobody decided in time: page the senior reviewer and wait for the review without a
    deadline (the timeout route of ``await_approval``)."""
    proposal = proposal_of(state)
    say(
        "escalate",
        f"no decision on {proposal['id']} within {approval_timeout(demo_pace()):g}s "
        f"{console().sym('arrow')} paged the senior reviewer, {SENIOR_REVIEWER}",
        "red",
    )
    return {"escalated_to": SENIOR_REVIEWER}, wait_for(
        REVIEW_SIGNAL, resume_at="await_approval", reason="escalated"
    )


def _issue_refund_node(crash_after_gateway: bool) -> Callable[[RefundState], Awaitable[Step]]:
    async def issue_refund(state: RefundState) -> Step:
        """Issue the approved refund through the gateway, as an activity recorded in the
        thread's journal, with the proposal's idempotency key."""
        proposal = proposal_of(state)
        gateway = open_gateway(crash_after_refund=crash_after_gateway)
        key = activity_key(proposal)

        async def reconcile(**request: Any) -> Refund | None:
            say(
                "journal",
                f"{key} started before and its outcome was never recorded "
                f"{console().sym('arrow')} reconcile: look the refund up in the ledger",
                "magenta",
            )
            return await gateway.find_refund(**request)

        refund: Refund = await activity(
            gateway.refund,
            key=key,
            reconcile=reconcile,
            idempotency_key=proposal["idempotency_key"],
            order_id=order_of(state)["order_id"],
            amount_cents=proposal["amount_cents"],
        )
        return {"refund": refund}, completed()

    return issue_refund


async def notify_customer(state: RefundState) -> Step:
    """Write to the customer; the e-mail is an effect."""
    order = order_of(state)
    reply = await MODEL.reply(order, refund_of(state))
    emitted: DemoEffect = {
        "kind": "email",
        "to": order["email"],
        "subject": f"Your refund for order {order['order_id']}",
    }
    return {"reply": reply}, effect(completed(), emitted)


def build_graph(*, crash_after_gateway: bool = False) -> Graph[RefundState, DemoEffect]:
    """The refund agent's graph (``flowy worker --graph flowy.cli.demo:build_graph``)."""
    builder: GraphBuilder[RefundState, DemoEffect] = GraphBuilder(merge_state)
    builder.add_node("plan", plan)
    builder.add_node("lookup_order", lookup_order)
    builder.add_node("propose_refund", propose_refund)
    builder.add_node("await_approval", await_approval)
    builder.add_node("escalate", escalate)
    builder.add_node("issue_refund", _issue_refund_node(crash_after_gateway))
    builder.add_node("notify_customer", notify_customer)
    builder.add_edge("plan", "lookup_order")
    builder.add_edge("lookup_order", "propose_refund")
    builder.add_edge("propose_refund", "await_approval")
    builder.add_edge("await_approval", "issue_refund")
    builder.add_timeout_route("await_approval", "escalate")
    builder.add_edge("escalate", "await_approval")
    builder.add_edge("issue_refund", "notify_customer")
    builder.allow_no_outgoing_route("notify_customer")
    builder.on_signal(REVIEW_SIGNAL, take_review)
    return builder.compile(max_steps=20, budgets={"model_calls": 6})


def crashing_worker_graph() -> Graph[RefundState, DemoEffect]:
    """The same graph, but the process running ``issue_refund`` kills itself right after
    the gateway accepted the refund, before the journal records the call's outcome (the
    demo's first worker)."""
    return build_graph(crash_after_gateway=True)
