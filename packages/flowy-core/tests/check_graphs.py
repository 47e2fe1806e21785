"""Graphs and scenarios the crash-safety checker's tests run (``test_checking.py``; the
``flowy check`` subprocesses load them as ``check_graphs:...``).

A shop charges a card after an approval and then hands the receipt to a worker. The
unsafe graph calls the gateway straight from a node; the safe one calls it as an
activity with a reconcile hook.
"""

from __future__ import annotations

from typing import Any

import flowy
from flowy.testing import Scenario

State = dict[str, Any]


class Gateway:
    """The card gateway's fake: its call log is the outside world."""

    def __init__(self) -> None:
        self.charges: list[str] = []

    async def charge(self, order: str) -> str:
        self.charges.append(order)
        return f"ch_{order}_{len(self.charges)}"

    async def find(self, order: str) -> str | None:
        return f"ch_{order}_1" if order in self.charges else None


GATEWAY: flowy.BindingKey[Gateway] = flowy.BindingKey("gateway")


def merge(state: State, update: State) -> State:
    return {**state, **update}


async def approve(state: State) -> Any:
    if not state.get("approved"):
        return {}, flowy.suspend("needs_approval")
    return {}, flowy.completed()


async def charge_directly(state: State) -> Any:
    receipt = await flowy.binding(GATEWAY).charge(state["order"])
    return {"receipt": receipt}, flowy.handoff("send_receipt", resume_at="receipt")


async def charge_as_activity(state: State) -> Any:
    gateway = flowy.binding(GATEWAY)
    order = state["order"]
    receipt = await flowy.activity(
        gateway.charge, order, key=f"charge:{order}", reconcile=gateway.find
    )
    return {"receipt": receipt}, flowy.handoff("send_receipt", resume_at="receipt")


async def receipt(state: State) -> Any:
    return {"sent": state["receipt"]}, flowy.completed()


def _shop(charge: Any) -> flowy.Graph[State, Any]:
    return (
        flowy.GraphBuilder(merge)
        .add_node("approve", approve)
        .add_node("charge", charge)
        .add_node("receipt", receipt)
        .add_edge("approve", "charge")
        .add_edge("charge", "receipt")
        .allow_no_outgoing_route("receipt")
        .compile()
    )


def unsafe_shop() -> flowy.Graph[State, Any]:
    """The gateway is called from the node: a crash before the save charges twice."""
    return _shop(charge_directly)


def safe_shop() -> flowy.Graph[State, Any]:
    """The gateway is called as an activity with a reconcile hook."""
    return _shop(charge_as_activity)


def shop_scenario() -> Scenario[State]:
    gateway = Gateway()

    def charged_at_most_once(state: State) -> bool:
        assert len(gateway.charges) <= 1, f"{len(gateway.charges)} charges"
        return True

    return Scenario(
        state={"order": "A-1"},
        bindings=flowy.bind(flowy.RunBindings(), GATEWAY, gateway),
        approve=lambda head: {"approved": True},
        expect=[charged_at_most_once],
    )


async def nap(state: State) -> Any:
    return {}, flowy.wait_for("go", timeout=60.0, resume_at="woke")


async def woke(state: State) -> Any:
    return {"woke": True}, flowy.completed()


def waiting_graph() -> flowy.Graph[State, Any]:
    """Waits for "go" for a minute at most (a signal and a timer race)."""
    return (
        flowy.GraphBuilder(merge)
        .add_node("nap", nap)
        .add_node("woke", woke)
        .add_edge("nap", "woke")
        .allow_no_outgoing_route("woke")
        .compile()
    )


def waiting_scenario() -> Scenario[State]:
    return Scenario(state={}, signal=lambda head: {"by": "ops"})


async def wait_forever(state: State) -> Any:
    return {}, flowy.wait_for("go", resume_at="woke")


def patient_graph() -> flowy.Graph[State, Any]:
    """Waits for "go" without a deadline."""
    return (
        flowy.GraphBuilder(merge)
        .add_node("wait", wait_forever)
        .add_node("woke", woke)
        .add_edge("wait", "woke")
        .allow_no_outgoing_route("woke")
        .compile()
    )
