"""End to end on DynamoDB: a Runner hands runs off through the transactional outbox
(one TransactWriteItems per hand-off) and a flowy.Worker on another client resumes them
from ``DynamoOutboxConsumer``, under fenced leases."""

from __future__ import annotations

from typing import Any

import pytest

import flowy
from flowy.checkpoint import HandoffStatus, RunStatus
from flowy_dynamodb import DynamoBackend

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
    front = DynamoBackend[Any].create(dynamo_endpoint.client(), table_name, clock_skew=0.0)
    back = DynamoBackend[Any].create(dynamo_endpoint.client(), table_name, clock_skew=0.0)
    try:
        runner = flowy.Runner(
            graph(runs), front.checkpointer, lease_manager=front.leases, handoff_outbox=front.outbox
        )
        assert runner.checkpointer is front.checkpointer  # native fencing, no lease guard
        threads = [f"order:{{{i}}}\n" for i in range(5)] + ["k" * 10_000]
        for thread_id in threads:
            await runner.start(thread_id, {}, run_lease=("frontend", 5))
        pending = await front.checkpointer.list_threads(
            handoff_statuses=frozenset({HandoffStatus.ENQUEUED})
        )
        assert sorted(s.thread_id for s in pending) == sorted(threads)

        worker_runner = flowy.Runner(
            graph(runs), back.checkpointer, lease_manager=back.leases, handoff_outbox=back.outbox
        )
        worker = flowy.Worker(worker_runner, back.consumer, owner="worker-1", lease_ttl=5)
        assert await worker.run_until_idle() == len(threads)
        assert sorted(runs) == sorted(threads)
        for thread_id in threads:
            snapshot, _ = await back.checkpointer.load(thread_id)
            assert snapshot.status is RunStatus.COMPLETED
            assert snapshot.state == {"worked": True, "done": True}
            assert await back.leases.holder(thread_id) is None
        assert await back.consumer.claim(10, 30) == []
        assert await back.consumer.dead_letters() == []
    finally:
        await front.close()
        await back.close()
