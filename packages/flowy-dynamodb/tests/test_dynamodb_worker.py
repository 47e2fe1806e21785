"""End to end on DynamoDB: a Runner hands runs off through the transactional outbox (one
TransactWriteItems per hand-off) and a flowy.Worker on another connection resumes them,
under fenced leases."""

from __future__ import annotations

from typing import Any

import pytest

import flowy
from flowy.storage import HandoffStatus, RunStatus

pytestmark = pytest.mark.anyio

State = dict[str, Any]


def merge(state: State, update: State) -> State:
    return {**state, **update}


def graph(runs: list[str]) -> flowy.Graph[State, Any]:
    async def work(state: State) -> tuple[State, flowy.Directive[Any]]:
        return {"worked": True}, flowy.handoff("background", resume_at="side_effect")

    async def side_effect(state: State) -> tuple[State, flowy.Directive[Any]]:
        runs.append(flowy.run_metadata().thread_id)
        return {"done": True}, flowy.completed()

    builder: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    builder.add_node("work", work).add_node("side_effect", side_effect)
    builder.add_edge("work", "side_effect").allow_no_outgoing_route("side_effect")
    return builder.compile()


async def test_worker_resumes_handoffs(dynamo_endpoint: Any, table_name: str) -> None:
    runs: list[str] = []
    url = dynamo_endpoint.store_url(table_name, clock_skew=0)
    async with flowy.connect(url) as front, flowy.connect(url) as back:
        runner = flowy.Runner(graph(runs), front)
        assert runner.checkpointer is front.checkpointer  # native fencing, no lease guard
        threads = [f"order:{{{i}}}\n" for i in range(5)] + ["k" * 10_000]
        for thread_id in threads:
            await runner.start(thread_id, {}, run_lease=("frontend", 5))
        enqueued = frozenset({HandoffStatus.ENQUEUED})
        pending = await front.checkpointer.list_threads(handoff_statuses=enqueued)
        assert [s.thread_id for s in pending] == sorted(threads)

        worker = flowy.Worker(flowy.Runner(graph(runs), back), owner="worker-1", lease_ttl=5)
        assert await worker.run_until_idle() == len(threads)
        assert sorted(runs) == sorted(threads)
        for thread_id in threads:
            snapshot, _ = await back.checkpointer.load(thread_id)
            assert snapshot.status is RunStatus.COMPLETED
            assert snapshot.state == {"worked": True, "done": True}
            assert await back.leases.holder(thread_id) is None
        assert await back.consumer.claim(10, 30) == []
        assert await back.consumer.dead_letters() == []
