"""The outside world of the ``flowy demo`` refund agent (:mod:`flowy.cli.demo`): the
shop's orders, a scripted "model" (no network, no keys), and a payments gateway with
idempotency keys kept in a SQLite ledger of its own, with the latency and the printed
lines that make the story readable.
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
from pathlib import Path
from typing import NoReturn

from .._context import run_metadata, use_budget
from ._demo_state import LEDGER_APPLICATION_ID, Order, Proposal, Refund, money
from ._render import console

__all__ = [
    "FIRST_MESSAGE",
    "FOLLOW_UP",
    "MODEL",
    "ORDERS",
    "PaymentsGateway",
    "ScriptedModel",
    "crash_now",
    "demo_pace",
    "fetch_order",
    "latency",
    "open_gateway",
    "open_ledger",
    "payments_path",
    "read_ledger",
    "say",
]

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


def demo_pace() -> float:
    value = run_metadata().metadata.get("pace", 1.0)
    return float(value) if isinstance(value, int | float) else 1.0


async def latency(seconds: float) -> None:
    # Always yields, even at pace 0, so a streamed "node started" line prints first.
    await asyncio.sleep(seconds * demo_pace())


def say(who: str, text: str, color: str = "blue") -> None:
    if run_metadata().metadata.get("quiet"):
        return
    out = console()
    out.line(f"      {out.paint(who, color, 'bold')} {out.sym('say')} {text}")


class ScriptedModel:
    """A deterministic stand-in for a language model: canned answers chosen by simple
    rules, with a little latency. Every call counts against the ``model_calls`` budget."""

    async def _call(self, seconds: float) -> None:
        await latency(seconds)
        use_budget("model_calls")

    async def plan(self, messages: list[str]) -> list[str]:
        """Plan the steps of a refund request."""
        await self._call(0.25)
        steps = [name for name in _STEPS if name != "plan"]
        arrow = f" {console().sym('arrow')} "
        say("model", "refund request" + arrow + "plan: " + arrow.join(steps))
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
        say("model", f"damaged: {names} {arrow} propose {money(amount)} ({proposal_id})")
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
        say("model", f'reply: "{text}"')
        return text


MODEL = ScriptedModel()


async def fetch_order(order_id: str) -> Order:
    """The shop's order service."""
    await latency(0.12)
    order = ORDERS[order_id]
    say(
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
        await latency(0.15)
        refund = await asyncio.to_thread(self._refund, idempotency_key, order_id, amount_cents)
        if refund["replayed"]:
            say(
                "gateway",
                f"key {idempotency_key} was used before {console().sym('arrow')} same refund "
                f"{refund['refund_id']} returned, no money moved",
                "green",
            )
        else:
            say(
                "gateway",
                f"refund {refund['refund_id']} of {money(amount_cents)} issued "
                f"(idempotency key {idempotency_key})",
                "green",
            )
        if self.crash_after_refund:
            crash_now()
        return refund

    async def find_refund(
        self, *, idempotency_key: str, order_id: str, amount_cents: int
    ) -> Refund | None:
        """The refund made with ``idempotency_key``, looked up in the ledger (no request
        to the gateway, no money moved), or ``None`` if there is none: the ``reconcile``
        hook of the refund activity, so it takes the same arguments as :meth:`refund`."""
        await latency(0.05)
        refund = await asyncio.to_thread(self._find, idempotency_key)
        arrow = console().sym("arrow")
        if refund is None:
            say(
                "ledger", f"no refund with key {idempotency_key} {arrow} it never happened", "green"
            )
        else:
            say(
                "ledger",
                f"key {idempotency_key} {arrow} refund {refund['refund_id']} of "
                f"{money(refund['amount_cents'])} exists: that is the outcome, the gateway is "
                "not called again",
                "green",
            )
        return refund


def open_gateway(*, crash_after_refund: bool = False) -> PaymentsGateway:
    path = run_metadata().metadata.get("payments_db")
    if not isinstance(path, str):
        raise RuntimeError(
            "the demo thread has no 'payments_db' in its run metadata; start it with `flowy demo`"
        )
    return PaymentsGateway(path, crash_after_refund=crash_after_refund)


def crash_now() -> NoReturn:
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
