"""The story of ``flowy demo``'s refund agent for the crash-safety checker.

Run it with ``flowy check flowy.cli.demo:build_graph --scenario
flowy.testing.demo:refund_scenario``.
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

from .._types import JSON
from ..cli.demo import (
    FIRST_MESSAGE,
    SENIOR_REVIEWER,
    THREAD_ID,
    RefundState,
    approval_payload,
    open_ledger,
    proposal_of,
    read_ledger,
)
from ..storage import Snapshot
from .checking import Scenario

__all__ = ["refund_scenario"]


def refund_scenario() -> Scenario[RefundState]:
    """The demo's story for the crash-safety checker, with a fresh payments ledger:
    ``flowy check flowy.cli.demo:build_graph --scenario flowy.testing.demo:refund_scenario``.

    The customer asks for a refund, a reviewer approves the current proposal (unless
    the wait's deadline passes first and the run escalates), the refund is issued and
    the customer is told. Whatever crashes and faults strike, the ledger holds at most
    one refund, and exactly one of the approved amount when the thread completes.
    """
    folder = Path(tempfile.mkdtemp(prefix="flowy-check-"))
    ledger = folder / "payments.db"
    with contextlib.closing(open_ledger(str(ledger))):
        pass

    def approve(head: Snapshot[RefundState]) -> JSON:
        proposal = proposal_of(head.state)
        return approval_payload(
            {
                "proposal_id": proposal["id"],
                "decision": "approve",
                "reviewer": SENIOR_REVIEWER,
                "amount_cents": proposal["amount_cents"],
            }
        )

    def one_refund(state: RefundState) -> bool:
        refunds = read_ledger(ledger)
        assert len(refunds) <= 1, f"{len(refunds)} refunds in the ledger: {refunds}"
        if "reply" in state:  # the thread completed: the approved amount, once
            proposal = proposal_of(state)
            assert [r[2] for r in refunds] == [proposal["amount_cents"]], refunds
        return True

    return Scenario(
        state={"order_id": "A-1001", "customer_messages": [FIRST_MESSAGE]},
        thread_id=THREAD_ID,
        metadata={"payments_db": str(ledger), "pace": 0.0, "quiet": True},
        signal=approve,
        expect=[one_refund],
    )
