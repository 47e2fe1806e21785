"""The agent: draft an expense request, wait for a person when it is large, then hand the
payment off to a worker.

    draft -> review -> pay

``review`` suspends ("awaiting_approval") while a large request has no decision; once
approved it hands off ("payment_queued"), and the run goes on at ``pay`` on a worker.
"""

import asyncio
import os
import sqlite3
from dataclasses import dataclass, replace

import flowy

THRESHOLD = 100  # requests above this amount wait for a human approval
AWAITING_APPROVAL = "awaiting_approval"
PAYMENT_QUEUED = "payment_queued"


def store_url() -> str:
    """Where runs are stored: $APP_BACKEND, else a SQLite file in this directory."""
    return os.environ.get("APP_BACKEND", "sqlite:///approvals.db")


@dataclass
class Expense:
    who: str
    amount: int
    reason: str
    summary: str = ""
    approver: str = ""
    approved: bool = False
    payment_id: str = ""


class Payments:
    """The payments ledger, a stand-in for the bank: one SQLite file, a row per request.

    Paying a request again pays nothing and only counts the attempt, so a step that
    runs twice (a worker crashed after paying, before saving) never pays twice.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._execute(
            "CREATE TABLE IF NOT EXISTS payments (request TEXT PRIMARY KEY, "
            "who TEXT NOT NULL, amount INTEGER NOT NULL, attempts INTEGER NOT NULL)"
        )

    def _execute(self, sql: str, *args: object) -> list[tuple[str, str, int, int]]:
        db = sqlite3.connect(self.path, timeout=10)
        try:
            with db:  # one transaction
                return db.execute(sql, args).fetchall()
        finally:
            db.close()

    async def pay(self, request: str, who: str, amount: int) -> str:
        await asyncio.to_thread(
            self._execute,
            "INSERT INTO payments VALUES (?, ?, ?, 1) "
            "ON CONFLICT (request) DO UPDATE SET attempts = attempts + 1",
            request,
            who,
            amount,
        )
        return f"pay-{request}"

    def rows(self) -> list[tuple[str, str, int, int]]:
        """Every payment: (request, who, amount, attempts)."""
        return self._execute("SELECT * FROM payments ORDER BY request")


PAYMENTS = flowy.BindingKey[Payments]("payments")  # bound by the worker (worker.py)
Step = tuple[Expense, flowy.Directive[flowy.NoEffect]]


async def draft(state: Expense) -> Step:
    # Where a model would write the summary a reviewer reads.
    summary = f"{state.who} asks for {state.amount} for {state.reason!r}"
    return replace(state, summary=summary), flowy.completed()


async def review(state: Expense) -> Step:
    if state.amount <= THRESHOLD:
        state = replace(state, approved=True, approver="auto")
    elif not state.approver:
        return state, flowy.suspend(AWAITING_APPROVAL)  # a human decides; nothing waits
    if not state.approved:
        return state, flowy.end()  # rejected: nothing to pay
    return state, flowy.handoff(PAYMENT_QUEUED, resume_at="pay")


async def pay(state: Expense) -> Step:
    payments = flowy.binding(PAYMENTS)
    request = flowy.run_metadata().thread_id  # the idempotency key: one payment per request
    # Live progress for whoever follows the request (GET /requests/{id}/events); never saved.
    flowy.live.progress({"paying": state.amount})
    payment_id = await payments.pay(request, state.who, state.amount)
    flowy.live.progress({"paid": payment_id})
    return replace(state, payment_id=payment_id), flowy.completed()


builder = flowy.GraphBuilder[Expense, flowy.NoEffect]()  # snapshots load back as Expense
builder.add_node("draft", draft).add_node("review", review).add_node("pay", pay)
builder.add_edge("draft", "review").add_edge("review", "pay")
builder.allow_no_outgoing_route("pay")
graph = builder.compile(max_steps=20)
