"""End to end on Redis: a Runner hands runs off through the transactional outbox and a
flowy.Worker resumes them from the store's consumer, under fenced leases."""

from __future__ import annotations

from typing import Any

import pytest

import flowy
from flowy.storage import HandoffStatus, RunStatus
from flowy_redis import RedisBackend

pytestmark = pytest.mark.anyio

State = dict[str, Any]


def _merge(state: State, update: State) -> State:
    return {**state, **update}


def _graph(runs: list[str]) -> flowy.Graph[State, Any]:
    async def work(state: State) -> tuple[State, flowy.Directive[Any]]:
        return {"worked": True}, flowy.handoff("background", resume_at="side_effect")

    async def side_effect(state: State) -> tuple[State, flowy.Directive[Any]]:
        runs.append(flowy.run_metadata().thread_id)
        return {"done": True}, flowy.completed()

    builder: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(_merge)
    builder.add_node("work", work).add_node("side_effect", side_effect)
    builder.add_edge("work", "side_effect").allow_no_outgoing_route("side_effect")
    return builder.compile()


async def test_worker_resumes_handoffs(flowy_url: str) -> None:
    runs: list[str] = []
    async with flowy.connect(flowy_url) as front, flowy.connect(flowy_url) as back:
        assert isinstance(front, RedisBackend) and isinstance(back, RedisBackend)
        runner = flowy.Runner(_graph(runs), front)
        assert runner.checkpointer is front.checkpointer  # native fencing, no lease guard
        threads = [f"order:{{{i}}}\n" for i in range(6)]
        for thread_id in threads:
            await runner.start(thread_id, {})
        pending = await front.checkpointer.list_threads(
            handoff_statuses=frozenset({HandoffStatus.ENQUEUED})
        )
        assert [s.thread_id for s in pending] == sorted(threads)

        worker = flowy.Worker(flowy.Runner(_graph(runs), back), owner="worker-1", lease_ttl=5)
        assert await worker.run_until_idle() == len(threads)
        assert sorted(runs) == sorted(threads)
        for thread_id in threads:
            snapshot, _ = await back.checkpointer.load(thread_id)
            assert snapshot.status is RunStatus.COMPLETED
            assert snapshot.state == {"worked": True, "done": True}
            assert await back.leases.holder(thread_id) is None
        assert await back.consumer.claim(10, 30) == []
        assert await back.consumer.dead_letters() == []
