"""Human-in-the-loop: suspend for an approval, resume with a state overlay.

A stale approval (an old token) is rejected by optimistic concurrency; the caller asks
evaluate_resume for the current token.

    python examples/hitl_overlay.py
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace

import flowy


@dataclass
class Payment:
    invoice: str
    amount: int
    approved_by: str = ""
    paid: bool = False


async def prepare(state: Payment) -> tuple[Payment, flowy.Directive[str]]:
    return state, flowy.effect(flowy.completed(), f"ask approval for {state.amount}")


async def approval(state: Payment) -> tuple[Payment, flowy.Directive[str]]:
    if not state.approved_by:
        return state, flowy.suspend("awaiting_approval")
    return state, flowy.completed()


async def pay(state: Payment) -> tuple[Payment, flowy.Directive[str]]:
    return replace(state, paid=True), flowy.effect(flowy.completed(), f"paid {state.invoice}")


def build_graph() -> flowy.Graph[Payment, str]:
    b = flowy.GraphBuilder[Payment, str]()
    b.add_node("prepare", prepare).add_node("approval", approval).add_node("pay", pay)
    b.add_edge("prepare", "approval").add_edge("approval", "pay")
    b.allow_no_outgoing_route("pay")
    return b.compile()


def approve(stored: Payment, overlay: Payment) -> Payment:
    return replace(stored, approved_by=overlay.approved_by)


async def main() -> None:
    backend = await flowy.connect("memory://", codec=flowy.storage.JSONCodec(Payment))
    runner = flowy.Runner(build_graph(), backend)
    first = await runner.start("inv-42", Payment("inv-42", 1200))
    print("suspended:", first.reason, "token", first.resume_token, first.effects)
    assert first.resume_token is not None
    old = flowy.ResumeToken("inv-42", first.resume_token.snapshot_revision - 1)
    try:
        await runner.resume(old, state_overlay=Payment("inv-42", 0, "eve"), merge=approve)
    except flowy.ConcurrencyConflictError as exc:
        print("stale approval rejected:", exc)
    decision = await runner.evaluate_resume(old)
    print("current token:", decision.token)
    assert decision.token is not None
    done = await runner.resume(
        decision.token, state_overlay=Payment("inv-42", 0, "alice"), merge=approve
    )
    print("done:", done.status, done.state, done.effects)


if __name__ == "__main__":
    asyncio.run(main())
