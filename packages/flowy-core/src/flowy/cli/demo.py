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
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import sqlite3
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, NoReturn, TypeAlias, TypedDict, cast

from .._activities import activity
from .._context import run_metadata, use_budget
from .._directives import Directive, completed, effect, end, handoff, wait_for
from .._graph import Graph, GraphBuilder
from .._types import JSON
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


# ------------------------------------------------------------------ the outside world

ORDERS: dict[str, Order] = {
    "A-1001": {
        "order_id": "A-1001",
        "customer": "Sam Rivera",
        "email": "sam@example.com",
        "lines": [
            {"sku": "MUG-01", "name": "Ceramic mug", "price_cents": 2400},
            {"sku": "PLT-04", "name": "Dinner plate set (4)", "price_cents": 10500},
        ],
        "paid_cents": 12900,
        "delivered_on": "2025-05-30",
    }
}

_KEYWORDS = {"MUG-01": "mug", "PLT-04": "plate"}
_STEPS = (
    "plan",
    "lookup_order",
    "propose_refund",
    "await_approval",
    "issue_refund",
    "notify_customer",
)

FIRST_MESSAGE = (
    "Hi! Order A-1001 arrived today and both the mug and the plates are smashed. "
    "Can I get a refund?"
)
FOLLOW_UP = "Sorry, I looked again: only the mug is broken - the plates are fine."


def _pace() -> float:
    value = run_metadata().metadata.get("pace", 1.0)
    return float(value) if isinstance(value, int | float) else 1.0


async def _latency(seconds: float) -> None:
    # Always yields, even at pace 0, so a streamed "node started" line prints first.
    await asyncio.sleep(seconds * _pace())


def _say(who: str, text: str, color: str = "blue") -> None:
    if run_metadata().metadata.get("quiet"):
        return
    out = console()
    out.line(f"      {out.paint(who, color, 'bold')} {out.sym('say')} {text}")


class ScriptedModel:
    """A deterministic stand-in for a language model: canned answers chosen by simple
    rules, with a little latency. Every call counts against the ``model_calls`` budget."""

    async def _call(self, seconds: float) -> None:
        await _latency(seconds)
        use_budget("model_calls")

    async def plan(self, messages: list[str]) -> list[str]:
        """Plan the steps of a refund request."""
        await self._call(0.25)
        steps = [name for name in _STEPS if name != "plan"]
        arrow = f" {console().sym('arrow')} "
        _say("model", "refund request" + arrow + "plan: " + arrow.join(steps))
        return steps

    async def propose(self, order: Order, messages: list[str], number: int) -> Proposal:
        """Propose a refund for the items the latest message says are damaged."""
        await self._call(0.25)
        latest = messages[-1].lower()
        clauses = [c for part in latest.replace(":", ".").split(".") for c in part.split(" - ")]
        damaged = [
            line
            for line in order["lines"]
            if any(_KEYWORDS[line["sku"]] in clause and "fine" not in clause for clause in clauses)
        ]
        amount = sum(line["price_cents"] for line in damaged)
        names = ", ".join(line["name"] for line in damaged) or "nothing"
        proposal_id = f"P{number}"
        digest = hashlib.sha256(f"{run_metadata().thread_id}:{proposal_id}".encode()).hexdigest()
        arrow = console().sym("arrow")
        _say("model", f"damaged: {names} {arrow} propose {money(amount)} ({proposal_id})")
        return {
            "id": proposal_id,
            "number": number,
            "skus": [line["sku"] for line in damaged],
            "amount_cents": amount,
            "rationale": f"customer reports damaged: {names}",
            "idempotency_key": f"rf_{digest[:12]}",
        }

    async def reply(self, order: Order, refund: Refund) -> str:
        """Write the customer's reply."""
        await self._call(0.2)
        first = order["customer"].split()[0]
        text = (
            f"Hi {first}, we're sorry about the damage. We refunded "
            f"{money(refund['amount_cents'])} to your card (ref {refund['refund_id']})."
        )
        _say("model", f'reply: "{text}"')
        return text


MODEL = ScriptedModel()


async def fetch_order(order_id: str) -> Order:
    """The shop's order service."""
    await _latency(0.12)
    order = ORDERS[order_id]
    _say(
        "orders",
        f"{order_id}: {len(order['lines'])} items, paid {money(order['paid_cents'])}, "
        f"delivered {order['delivered_on']}",
        "cyan",
    )
    return order


def payments_path(db: Path) -> Path:
    """Where the demo keeps its payments ledger next to the database ``db``."""
    return db.with_name(db.name + ".payments")


def open_ledger(path: str) -> sqlite3.Connection:
    """A connection to the payments ledger at ``path``, created (and stamped
    ``LEDGER_APPLICATION_ID``) if missing."""
    conn = sqlite3.connect(path, timeout=5.0, isolation_level=None)
    conn.execute(f"PRAGMA application_id = {LEDGER_APPLICATION_ID}")
    conn.execute(
        "CREATE TABLE IF NOT EXISTS refunds (idempotency_key TEXT PRIMARY KEY, "
        "refund_id TEXT NOT NULL, order_id TEXT NOT NULL, amount_cents INTEGER NOT NULL, "
        "requests INTEGER NOT NULL, created_at REAL NOT NULL)"
    )
    return conn


def read_ledger(path: Path) -> list[tuple[str, str, int, int]]:
    """The ledger's refunds: ``(idempotency_key, refund_id, amount_cents, requests)``."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        rows = conn.execute(
            "SELECT idempotency_key, refund_id, amount_cents, requests FROM refunds "
            "ORDER BY created_at"
        ).fetchall()
    return [(str(a), str(b), int(c), int(d)) for a, b, c, d in rows]


class PaymentsGateway:
    """A payments provider with idempotency keys, kept in its own SQLite file: a repeated
    request with a known key returns the first refund instead of paying again.

    With ``crash_after_refund`` the process running it dies right after the gateway's
    answer (the demo's first worker)."""

    def __init__(self, path: str, *, crash_after_refund: bool = False) -> None:
        self.path = path
        self.crash_after_refund = crash_after_refund

    def _refund(self, key: str, order_id: str, amount_cents: int) -> Refund:
        with contextlib.closing(open_ledger(self.path)) as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                row = conn.execute(
                    "SELECT refund_id, amount_cents FROM refunds WHERE idempotency_key = ?",
                    (key,),
                ).fetchone()
                if row is not None:
                    conn.execute(
                        "UPDATE refunds SET requests = requests + 1 WHERE idempotency_key = ?",
                        (key,),
                    )
                    refund: Refund = {
                        "refund_id": str(row[0]),
                        "amount_cents": int(row[1]),
                        "idempotency_key": key,
                        "replayed": True,
                    }
                else:
                    refund_id = "re_" + hashlib.sha256(key.encode()).hexdigest()[:10]
                    conn.execute(
                        "INSERT INTO refunds VALUES (?, ?, ?, ?, 1, ?)",
                        (key, refund_id, order_id, amount_cents, time.time()),
                    )
                    refund = {
                        "refund_id": refund_id,
                        "amount_cents": amount_cents,
                        "idempotency_key": key,
                        "replayed": False,
                    }
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        return refund

    def _find(self, key: str) -> Refund | None:
        with contextlib.closing(open_ledger(self.path)) as conn:
            row = conn.execute(
                "SELECT refund_id, amount_cents FROM refunds WHERE idempotency_key = ?", (key,)
            ).fetchone()
        if row is None:
            return None
        return {
            "refund_id": str(row[0]),
            "amount_cents": int(row[1]),
            "idempotency_key": key,
            "replayed": False,
        }

    async def refund(self, *, idempotency_key: str, order_id: str, amount_cents: int) -> Refund:
        """Refund ``amount_cents`` once per ``idempotency_key``."""
        await _latency(0.15)
        refund = await asyncio.to_thread(self._refund, idempotency_key, order_id, amount_cents)
        if refund["replayed"]:
            _say(
                "gateway",
                f"key {idempotency_key} was used before {console().sym('arrow')} same refund "
                f"{refund['refund_id']} returned, no money moved",
                "green",
            )
        else:
            _say(
                "gateway",
                f"refund {refund['refund_id']} of {money(amount_cents)} issued "
                f"(idempotency key {idempotency_key})",
                "green",
            )
        if self.crash_after_refund:
            _crash_now()
        return refund

    async def find_refund(
        self, *, idempotency_key: str, order_id: str, amount_cents: int
    ) -> Refund | None:
        """The refund made with ``idempotency_key``, looked up in the ledger (no request
        to the gateway, no money moved), or ``None`` if there is none: the ``reconcile``
        hook of the refund activity, so it takes the same arguments as :meth:`refund`."""
        await _latency(0.05)
        refund = await asyncio.to_thread(self._find, idempotency_key)
        arrow = console().sym("arrow")
        if refund is None:
            _say(
                "ledger", f"no refund with key {idempotency_key} {arrow} it never happened", "green"
            )
        else:
            _say(
                "ledger",
                f"key {idempotency_key} {arrow} refund {refund['refund_id']} of "
                f"{money(refund['amount_cents'])} exists: that is the outcome, the gateway is "
                "not called again",
                "green",
            )
        return refund


def _gateway(*, crash_after_refund: bool = False) -> PaymentsGateway:
    path = run_metadata().metadata.get("payments_db")
    if not isinstance(path, str):
        raise RuntimeError(
            "the demo thread has no 'payments_db' in its run metadata; start it with `flowy demo`"
        )
    return PaymentsGateway(path, crash_after_refund=crash_after_refund)


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
    await _latency(0.05)
    proposal = proposal_of(state)
    approval = state.get("approval")
    escalated_to = state.get("escalated_to")
    if approval is not None and _matches(approval, proposal):
        if approval["decision"] != "approve":
            _say("review", f"{approval['reviewer']} rejected {proposal['id']}", "yellow")
            return {}, end()
        _say(
            "review",
            f"{approval['reviewer']} approved {proposal['id']} ({money_of(proposal)})",
            "yellow",
        )
        return {}, handoff("refund_approved", resume_at="issue_refund")
    if approval is not None:
        _say(
            "review",
            f"{approval['reviewer']}'s decision is about {approval['proposal_id']} "
            f"({money(approval['amount_cents'])}), not the current {proposal['id']} "
            f"({money_of(proposal)}): kept, not applied {console().sym('arrow')} still waiting",
            "yellow",
        )
    if escalated_to is not None:
        if approval is None:
            _say(
                "review",
                f"{proposal['id']} ({money_of(proposal)}) waits for {escalated_to}'s decision, "
                "without a deadline now",
            )
        return {}, wait_for(REVIEW_SIGNAL, resume_at="await_approval", reason="awaiting_approval")
    timeout = approval_timeout(_pace())
    _say(
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
    _say(
        "escalate",
        f"no decision on {proposal['id']} within {approval_timeout(_pace()):g}s "
        f"{console().sym('arrow')} paged the senior reviewer, {SENIOR_REVIEWER}",
        "red",
    )
    return {"escalated_to": SENIOR_REVIEWER}, wait_for(
        REVIEW_SIGNAL, resume_at="await_approval", reason="escalated"
    )


def _crash_now() -> NoReturn:
    out = console()
    out.line(
        f"      {out.paint(out.sym('crash') + ' the worker process is killed', 'red', 'bold')}"
        " after the gateway's answer, before the journal records it"
    )
    sys.stdout.flush()
    kill = getattr(signal, "SIGKILL", None)
    if kill is not None:
        os.kill(os.getpid(), kill)
    os._exit(137)


def _issue_refund_node(crash_after_gateway: bool) -> Callable[[RefundState], Awaitable[Step]]:
    async def issue_refund(state: RefundState) -> Step:
        """Issue the approved refund through the gateway, as an activity recorded in the
        thread's journal, with the proposal's idempotency key."""
        proposal = proposal_of(state)
        gateway = _gateway(crash_after_refund=crash_after_gateway)
        key = activity_key(proposal)

        async def reconcile(**request: Any) -> Refund | None:
            _say(
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
