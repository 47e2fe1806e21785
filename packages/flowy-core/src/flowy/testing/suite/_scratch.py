"""A tool that writes test data never touches the store it is pointed at:
``flowy check --backend URL`` (``flowy.testing.acheck(store=URL)``) runs in a scratch
namespace of its own and removes it, leaving the store's own threads and messages
exactly as they were, byte for byte.
"""

from __future__ import annotations

from typing import Any

import pytest

from ..._directives import Directive, completed, handoff, wait_for
from ..._errors import BackendURLError
from ..._graph import Graph, GraphBuilder
from ..._runner import Runner
from ...storage import Backend, RunStatus, redact_url
from ...storage.dialect import BaseBackend
from ..backends import require_backends
from ..checking import Scenario, acheck
from ..hooks import Dump
from ._support import Suite, make_intent, max_attempts_of, new_thread_id

__all__ = ["ScratchSuite"]

State = dict[str, Any]


def _merge(state: State, update: State) -> State:
    return {**state, **update}


def _refund_graph() -> Graph[State, Any]:
    """``refund`` hands off to a worker, which runs ``notify``; ``review`` waits for a
    reviewer."""

    async def refund(s: State) -> tuple[State, Directive[Any]]:
        if s.get("review"):
            return {}, wait_for("approval")
        return {"refunded": True}, handoff("send_receipt", resume_at="notify")

    async def notify(s: State) -> tuple[State, Directive[Any]]:
        return {"notified": True}, completed()

    builder: GraphBuilder[State, Any] = GraphBuilder(_merge)
    return (
        builder.add_node("refund", refund)
        .add_node("notify", notify)
        .add_edge("refund", "notify")
        .allow_no_outgoing_route("notify")
        .compile(version="refunds")
    )


def _refund_scenario() -> Scenario[State]:
    return Scenario(
        state={"order": "A1001"},
        thread_id="refund-A1001",
        expect=[lambda s: s.get("notified") is True],
    )


def require_dump(dump: Dump | None, backend: Backend[Any]) -> Dump:
    """The ``flowy_dump`` fixture's hook, or skip (fail under
    ``FLOWY_REQUIRE_BACKENDS=1``: every store's tests provide one)."""
    if dump is None:
        reason = (
            f"no flowy_dump fixture for {type(backend).__name__}: define one that reads "
            "everything the store at a URL holds, as stored"
        )
        if require_backends():
            pytest.fail(reason)
        pytest.skip(reason)
    return dump


class ScratchSuite(Suite):
    """``flowy check --backend URL`` leaves the store ``URL`` names as it was."""

    async def test_a_check_leaves_the_store_it_ran_on_as_it_was(
        self, flowy_url: str, flowy_backend: Backend[Any], flowy_dump: Dump | None
    ) -> None:
        dump = require_dump(flowy_dump, flowy_backend)
        # The application's data: a dead letter, a waiting thread, a live hand-off.
        outbox, consumer = flowy_backend.outbox, flowy_backend.consumer
        await outbox.enqueue_intent(make_intent(new_thread_id("dead"), 1))
        for _ in range(max_attempts_of(consumer)):
            (message,) = await consumer.claim(1, 60.0, 0.0)
            await consumer.release(message, error="the gateway refused it")
        assert len(await consumer.dead_letters()) == 1
        app = Runner(_refund_graph(), flowy_backend)
        waiting = await app.start(new_thread_id("refund-A1001-review"), {"review": True})
        assert waiting.status is RunStatus.WAITING
        live = await app.start(new_thread_id("refund-A1001"), {"order": "A1001"})
        assert live.status is RunStatus.HANDOFF
        before = await dump(flowy_url)
        assert before

        if not isinstance(flowy_backend, BaseBackend) or flowy_backend.scratch_url("x") is None:
            # A store that cannot be namespaced is refused before anything is written.
            with pytest.raises(BackendURLError, match="cannot be namespaced"):
                await acheck(_refund_graph(), _refund_scenario, store=flowy_url, seeds=3)
            assert await dump(flowy_url) == before
            return
        report = await acheck(_refund_graph(), _refund_scenario, store=flowy_url, seeds=3)

        assert report.ok, str(report)
        assert report.store == redact_url(flowy_url)
        assert report.scratch is not None and report.scratch in str(report)
        assert await dump(flowy_url) == before  # byte for byte
        assert not await dump(report.scratch)  # the scratch namespace is gone
        (message,) = await consumer.claim(10, 60.0, 0.0)  # the live hand-off is still due
        assert message.intent.thread_id == live.thread_id
