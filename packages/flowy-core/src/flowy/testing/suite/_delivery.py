"""How a ``flowy.Worker`` on a real store ends a delivery that failed: a failure no
delivery can cure is dead-lettered at once with its reason, a passing one is given
back with a backoff for another delivery; and a lease left in the worker's own name by
a run that lost its store is released, while one a run of its process holds is not.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from ..._directives import Directive, end, handoff
from ..._graph import Graph, GraphBuilder
from ..._runner import Runner
from ..._worker import Failure, Outcome, Worker
from ...storage import Backend, OutboxMessage, RunStatus
from ._support import Suite, max_attempts_of, new_thread_id, require_corrupt

__all__ = ["DeliverySuite"]

State = dict[str, Any]


def _merge(state: State, update: State) -> State:
    return {**state, **update}


def _handing_off(*, publish: bool = True) -> Graph[State, Any]:
    """``hand`` hands off to ``publish``; without ``publish`` (same version) a worker
    meets a thread that resumes at a node its graph does not have."""

    async def hand(s: State) -> tuple[State, Directive[Any]]:
        return {}, handoff("to_worker", resume_at="publish" if publish else "hand")

    async def publish_node(s: State) -> tuple[State, Directive[Any]]:
        return {"published": True}, end()

    builder: GraphBuilder[State, Any] = GraphBuilder(_merge)
    builder.add_node("hand", hand)
    if publish:
        builder.add_node("publish", publish_node).add_edge("hand", "publish")
        builder.allow_no_outgoing_route("publish")
    else:
        builder.allow_no_outgoing_route("hand")
    return builder.compile(version="v1")


async def _published(s: State) -> tuple[State, Directive[Any]]:
    return {"published": True}, end()


async def _claim(backend: Backend[Any]) -> OutboxMessage:
    messages = await backend.consumer.claim(1, 30.0, wait=2.0)
    assert len(messages) == 1, messages
    return messages[0]


class DeliverySuite(Suite):
    """A failure no delivery can cure (an undecodable thread record, a resume at a node
    the graph does not have) is dead-lettered on its first delivery, with the reason;
    a transient one is given back for another delivery after a backoff."""

    requires: ClassVar[tuple[str, ...]] = ("handoff_outbox", "consumer")

    async def _handed_off(self, backend: Backend[Any], label: str) -> str:
        tid = new_thread_id(label)
        result = await Runner(_handing_off(), backend).start(tid, {})
        assert result.status is RunStatus.HANDOFF, result
        return tid

    async def _dead_at_once(
        self, backend: Backend[Any], worker: Worker[State, Any], failures: list[Failure], kind: str
    ) -> None:
        assert max_attempts_of(backend.consumer) > 1  # else every failure is a last one
        message = await _claim(backend)
        assert message.attempts == 1
        assert await worker.process(message) is Outcome.DEAD_LETTERED
        assert [f.dead for f in failures] == [True] and kind in failures[0].error
        letters = await backend.consumer.dead_letters()
        dead = [d for d in letters if d.message_id == message.message_id]
        assert len(dead) == 1 and kind in dead[0].error, dead
        assert dead[0].attempts == 1
        assert await backend.consumer.claim(1, 30.0, wait=0.0) == []  # not redelivered

    async def test_an_undecodable_thread_record_is_dead_lettered_at_once(
        self, flowy_backend: Backend[Any], flowy_corrupt: Any
    ) -> None:
        corrupt = require_corrupt(flowy_corrupt, flowy_backend)
        tid = await self._handed_off(flowy_backend, "poison-record")
        await corrupt(flowy_backend, tid)
        failures: list[Failure] = []
        worker = Worker(Runner(_handing_off(), flowy_backend), on_failure=failures.append)
        await self._dead_at_once(flowy_backend, worker, failures, "SnapshotEnvelopeInvalidError")

    async def test_a_resume_at_a_missing_node_is_dead_lettered_at_once(
        self, flowy_backend: Backend[Any]
    ) -> None:
        await self._handed_off(flowy_backend, "missing-node")
        failures: list[Failure] = []
        worker = Worker(
            Runner(_handing_off(publish=False), flowy_backend), on_failure=failures.append
        )
        await self._dead_at_once(flowy_backend, worker, failures, "UnknownNodeError")

    async def test_a_held_thread_is_given_back_with_a_backoff(
        self, flowy_backend: Backend[Any]
    ) -> None:
        tid = await self._handed_off(flowy_backend, "held")
        holder = await flowy_backend.leases.acquire(tid, "someone-else", 30.0)
        try:
            failures: list[Failure] = []
            worker = Worker(
                Runner(_handing_off(), flowy_backend),
                on_failure=failures.append,
                busy_grace=0.0,
                retry_delay=0.5,
            )
            message = await _claim(flowy_backend)
            assert await worker.process(message) is Outcome.RETRY
            assert [f.dead for f in failures] == [False] and failures[0].retry_in > 0
            assert "ThreadLeaseBusyError" in failures[0].error
            assert await flowy_backend.consumer.dead_letters() == []
        finally:
            await flowy_backend.leases.release(holder)

    async def test_a_stale_lease_in_the_workers_own_name_is_released(
        self, flowy_backend: Backend[Any]
    ) -> None:
        # An acquire that went through while its reply was lost (the store went away):
        # the lease is the worker's own, and no run of its process holds it.
        tid = await self._handed_off(flowy_backend, "own-lease")
        await flowy_backend.leases.acquire(tid, "worker-1", 30.0)
        worker = Worker(Runner(_handing_off(), flowy_backend), owner="worker-1", busy_grace=0.0)
        assert await worker.process(await _claim(flowy_backend)) is Outcome.RESUMED
        head, _ = await flowy_backend.checkpointer.load(tid)
        assert head.status is RunStatus.COMPLETED
        assert await flowy_backend.leases.holder(tid) is None

    async def test_a_lease_a_run_of_this_process_holds_is_left_alone(
        self, flowy_backend: Backend[Any]
    ) -> None:
        tid = new_thread_id("own-run")
        started, release = asyncio.Event(), asyncio.Event()

        async def hand(s: State) -> tuple[State, Directive[Any]]:
            started.set()
            await release.wait()
            return {}, handoff("to_worker", resume_at="publish")

        builder: GraphBuilder[State, Any] = GraphBuilder(_merge)
        builder.add_node("hand", hand).add_node("publish", _published)
        builder.add_edge("hand", "publish").allow_no_outgoing_route("publish")
        graph = builder.compile(version="v1")
        # A run of this process, in the worker's name, holds the thread; a stale message
        # of an earlier hand-off of it comes in meanwhile.
        await self._handed_off(flowy_backend, "own-run-earlier")
        app = Runner(graph, flowy_backend, run_lease=("worker-1", 30.0))
        running = asyncio.ensure_future(app.start(tid, {}))
        try:
            await asyncio.wait_for(started.wait(), 10)
            holder = await flowy_backend.leases.holder(tid)
            assert holder is not None and holder.owner == "worker-1"
            worker = Worker(Runner(_handing_off(), flowy_backend), owner="worker-1", busy_grace=0.0)
            consume = worker._consume  # pyright: ignore[reportPrivateUsage]
            assert not await consume._release_stale_own_lease(tid)  # pyright: ignore[reportPrivateUsage]
            assert await flowy_backend.leases.holder(tid) == holder
        finally:
            release.set()
            assert (await running).status is RunStatus.HANDOFF
