"""Stopping a thread from outside its run: ``flowy.operations.cancel`` and
``terminate`` in each state a thread can be in, racing a save, fencing a live holder,
idempotent, refused on a finished thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pytest

from ..._directives import Directive, completed, end, fail, handoff, suspend, wait_for
from ..._errors import (
    ConcurrencyConflictError,
    InvalidThreadIdError,
    LeaseLostError,
    ThreadFinishedError,
    ThreadNotFoundError,
)
from ..._graph import Graph, GraphBuilder
from ..._runner import Runner
from ..._worker import Worker
from ...operations import cancel, terminate
from ...storage import Backend, HandoffStatus, RunStatus
from ...storage.dialect import BaseCheckpointer, BaseLeaseManager, new_write_id
from ._durable import require_durable
from ._support import Suite, history_revisions, new_thread_id, require_capability, require_leases

__all__ = ["CancelSuite"]

State = dict[str, Any]


def _merge(state: State, update: State) -> State:
    return {**state, **update}


def _chain(length: int, gate: asyncio.Event | None = None, at: int = 1) -> Graph[State, Any]:
    """Steps ``s0 … s{length-1}``, each counting itself; step ``at`` waits for ``gate``."""
    builder: GraphBuilder[State, Any] = GraphBuilder(_merge)

    def step(i: int) -> Any:
        async def node(s: State) -> tuple[State, Directive[Any]]:
            if gate is not None and i == at:
                await gate.wait()
            if s.get("stop_at") == i:
                return {}, suspend("stop_here")
            return {"done": [*s.get("done", []), i]}, completed() if i < length - 1 else end()

        return node

    for i in range(length):
        builder.add_node(f"s{i}", step(i))
        if i:
            builder.add_edge(f"s{i - 1}", f"s{i}")
    builder.allow_no_outgoing_route(f"s{length - 1}")
    return builder.compile(version="cancel-chain")


def _pauses() -> Graph[State, Any]:
    """``start`` routes on ``mode``: suspend, wait (with a timeout), hand off, fail, end."""

    async def start(s: State) -> tuple[State, Directive[Any]]:
        mode = s.get("mode")
        if s.get("resumed"):
            return {"ran": True}, end()
        if mode == "suspend":
            return {}, suspend("needs_review")
        if mode == "wait":
            return {}, wait_for("approval", timeout=3600.0)
        if mode == "handoff":
            return {}, handoff("background", resume_at="after")
        if mode == "fail":
            return {}, fail("broken")
        return {}, end()

    async def after(s: State) -> tuple[State, Directive[Any]]:
        return {"ran": True}, end()

    builder: GraphBuilder[State, Any] = GraphBuilder(_merge)
    builder.add_node("start", start).add_node("after", after).add_edge("start", "after")
    builder.allow_no_outgoing_route("after")
    return builder.compile(version="cancel-pauses")


def _gated(gate: asyncio.Event, then: str) -> Graph[State, Any]:
    """``first`` (saved), then ``work`` waits for ``gate`` and completes, suspends or
    hands off (``then``); ``after`` ends."""

    async def first(s: State) -> tuple[State, Directive[Any]]:
        return {"first": True}, completed()

    async def work(s: State) -> tuple[State, Directive[Any]]:
        await gate.wait()
        directive = {
            "complete": completed(),
            "suspend": suspend("later", resume_at="after"),
            "handoff": handoff("background", resume_at="after"),
        }[then]
        return {"worked": True}, directive

    async def after(s: State) -> tuple[State, Directive[Any]]:
        return {"after": True}, end()

    builder: GraphBuilder[State, Any] = GraphBuilder(_merge)
    builder.add_node("first", first).add_node("work", work).add_node("after", after)
    builder.add_edge("first", "work").add_edge("work", "after")
    return builder.allow_no_outgoing_route("after").compile(version="cancel-gated")


async def _started(backend: Backend[Any], mode: str) -> tuple[Runner[State, Any], str]:
    runner = Runner(_pauses(), backend)
    tid = new_thread_id(f"cancel-{mode}")
    await runner.start(tid, {"mode": mode})
    return runner, tid


class CancelSuite(Suite):
    """``cancel`` writes a ``canceled`` head in every state a run can stop in (a running
    worker's next save is refused and it ends canceled), keeps signals, drops timers,
    neutralises a queued hand-off, is idempotent and refused on a finished thread;
    ``terminate`` fails the thread and fences the live holder's saves and renewals."""

    async def test_cancel_a_suspended_thread(self, flowy_backend: Backend[Any]) -> None:
        runner, tid = await _started(flowy_backend, "suspend")
        head, token = await runner.head(tid)
        assert head.status is RunStatus.SUSPENDED
        done = await cancel(flowy_backend, tid, reason="  the customer\n asked ")
        assert (done.status, done.reason, done.changed) == (
            RunStatus.CANCELED,
            "canceled: the customer asked",
            True,
        )
        assert (done.previous_status, done.revision) == (RunStatus.SUSPENDED, 2)
        now, current = await runner.head(tid)
        assert (now.status, now.reason, now.execution_pointer) == (
            RunStatus.CANCELED,
            "canceled: the customer asked",
            "start",
        )
        assert now.state == head.state
        with pytest.raises(ConcurrencyConflictError):
            await runner.resume(token)  # the old token is spent
        resumed = await runner.resume(current, state_overlay={"resumed": True})
        assert resumed.status is RunStatus.COMPLETED  # resumed on purpose

    async def test_cancel_a_waiting_thread_drops_its_timer_and_keeps_its_signals(
        self, flowy_backend: Backend[Any]
    ) -> None:
        cp = require_durable(flowy_backend)
        runner, tid = await _started(flowy_backend, "wait")
        await runner.signal(tid, "note", {"n": 1})
        assert tid in {t.thread_id for t in await cp.timers(limit=10_000)}
        await cancel(flowy_backend, tid)
        head, _ = await runner.head(tid)
        assert (head.status, head.reason, head.wake_at, head.waiting_for) == (
            RunStatus.CANCELED,
            "canceled",
            None,
            "",
        )
        assert tid not in {t.thread_id for t in await cp.timers(limit=10_000)}
        assert [s.name for s in await cp.signals(tid)] == ["note"]
        await runner.signal(tid, "approval", {"ok": True})  # wakes nothing
        await Worker(runner, timer_interval=0.05).run_until_idle(0.2)
        assert (await runner.head(tid))[0].status is RunStatus.CANCELED

    async def test_a_queued_handoff_is_dropped_by_the_worker(
        self, flowy_backend: Backend[Any]
    ) -> None:
        require_capability(flowy_backend, "consumer")
        runner, tid = await _started(flowy_backend, "handoff")
        head, _ = await runner.head(tid)
        assert (head.status, head.handoff_status) == (RunStatus.HANDOFF, HandoffStatus.ENQUEUED)
        done = await cancel(flowy_backend, tid, reason="stop")
        head, _ = await runner.head(tid)
        assert (head.status, head.handoff_status) == (RunStatus.CANCELED, HandoffStatus.NONE)
        worker = Worker(runner, timer_interval=None, retry_delay=0.05)
        assert await worker.run_until_idle(0.2) >= 1
        assert worker.stats.outcomes.get("canceled") == 1
        after, revision = await flowy_backend.checkpointer.load(tid)
        assert (after.status, revision) == (RunStatus.CANCELED, done.revision)
        assert "ran" not in after.state
        assert await flowy_backend.consumer.dead_letters() == []

    async def test_a_running_thread_stops_at_its_next_save(
        self, flowy_backend: Backend[Any]
    ) -> None:
        leases = require_leases(flowy_backend)
        gate = asyncio.Event()
        runner = Runner(_chain(6, gate, at=2), flowy_backend, run_lease=("suite-w", self.long_ttl))
        tid = new_thread_id("cancel-running")
        run = asyncio.ensure_future(runner.start(tid, {}))
        await _reached(flowy_backend, tid, 2, run)
        done = await Runner(_chain(6), flowy_backend).cancel(tid, reason="operator")
        assert done.changed and done.fenced is not None
        assert done.fenced.owner == "suite-w"
        gate.set()
        result = await asyncio.wait_for(run, 10)
        assert (result.status, result.reason) == (RunStatus.CANCELED, "canceled: operator")
        assert result.resume_token is not None
        assert result.resume_token.snapshot_revision == done.revision
        head, revision = await flowy_backend.checkpointer.load(tid)
        assert (head.status, revision) == (RunStatus.CANCELED, done.revision)
        assert head.state["done"] == [0, 1]  # s2's save was refused; nothing after it ran
        assert await history_revisions(flowy_backend.checkpointer, tid) == list(
            range(done.revision, 0, -1)
        )
        assert await leases.holder(tid) is None  # the run let go of its lease

    @pytest.mark.parametrize("then", ["complete", "suspend", "handoff"])
    async def test_a_run_canceled_in_a_node_ends_canceled_whatever_it_saves_next(
        self, flowy_backend: Backend[Any], then: str
    ) -> None:
        require_leases(flowy_backend)
        gate = asyncio.Event()
        runner = Runner(_gated(gate, then), flowy_backend, run_lease=("suite-w", self.long_ttl))
        tid = new_thread_id(f"cancel-{then}")
        run = asyncio.ensure_future(runner.start(tid, {}))
        await _reached(flowy_backend, tid, 1, run)
        done = await cancel(flowy_backend, tid, reason=then)
        assert done.previous_status is RunStatus.RUNNING and done.fenced is not None
        gate.set()
        result = await asyncio.wait_for(run, 10)
        assert (result.status, result.reason) == (RunStatus.CANCELED, f"canceled: {then}")
        head, revision = await flowy_backend.checkpointer.load(tid)
        assert (head.status, revision, head.execution_pointer) == (
            RunStatus.CANCELED,
            done.revision,
            "work",
        )
        assert "worked" not in head.state
        if flowy_backend.capabilities.consumer:
            worker = Worker(runner, timer_interval=None, retry_delay=0.05)
            assert await worker.run_until_idle(0.2) == 0  # the hand-off never committed
        assert await flowy_backend.leases.holder(tid) is None

    async def test_cancel_racing_a_save_exactly_one_wins(self, flowy_backend: Backend[Any]) -> None:
        leases = require_leases(flowy_backend)
        cp = flowy_backend.checkpointer
        for attempt in range(6):
            runner = Runner(_chain(3), flowy_backend)
            tid = new_thread_id(f"race{attempt}")
            await runner.start(tid, {"stop_at": 1})
            snap, revision = await cp.load(tid)
            lease = await leases.acquire(tid, "suite-racer", self.long_ttl)
            step = replace(snap, status=RunStatus.RUNNING, reason="", write_id=new_write_id())
            saved, canceled = await asyncio.gather(
                cp.save(revision, step, lease=lease),
                cancel(flowy_backend, tid),
                return_exceptions=True,
            )
            assert not isinstance(canceled, BaseException), canceled
            history = await cp.get_history(tid)
            if isinstance(saved, BaseException):
                assert isinstance(saved, ConcurrencyConflictError), saved
                assert canceled.revision == revision + 1  # the cancel won the revision
                assert [h.status for h in history[:1]] == [RunStatus.CANCELED]
            else:
                assert saved == revision + 1  # the save won; the cancel came after it
                assert canceled.revision == revision + 2
                assert [h.status for h in history[:2]] == [RunStatus.CANCELED, RunStatus.RUNNING]
            assert history[0].reason == "canceled"
            await leases.release(lease)

    async def test_a_cancel_is_three_round_trips_and_a_step_reads_nothing_more(
        self, flowy_backend: Backend[Any]
    ) -> None:
        _, tid = await _started(flowy_backend, "suspend")
        with _round_trips(flowy_backend) as calls:
            await cancel(flowy_backend, tid)
        # The head, the lease holder, one conditional write.
        assert calls == {"_read_head": 1, "_holder": 1, "_write": 1}, calls
        reads: list[dict[str, int]] = []
        for length in (3, 9):
            with _round_trips(flowy_backend) as calls:
                runner = Runner(_chain(length), flowy_backend, run_lease=("suite-c", 30.0))
                result = await runner.start(new_thread_id(f"steps{length}"), {})
            assert result.status is RunStatus.COMPLETED
            saves = sum(calls.get(n, 0) for n in ("_write", "_write_release", "_write_ack"))
            assert saves == length, calls  # one save per step (the last may release)
            writes = ("_write", "_write_release", "_write_ack", "_renew")
            reads.append({k: v for k, v in calls.items() if k not in writes})
        assert reads[0] == reads[1], reads  # no read per step, canceled or not

    async def test_cancel_is_idempotent(self, flowy_backend: Backend[Any]) -> None:
        _, tid = await _started(flowy_backend, "suspend")
        first = await cancel(flowy_backend, tid, reason="once")
        again = await cancel(flowy_backend, tid, reason="twice")
        assert (again.changed, again.revision) == (False, first.revision)
        assert again.reason == first.reason == "canceled: once"
        assert await history_revisions(flowy_backend.checkpointer, tid) == [2, 1]

    @pytest.mark.parametrize("mode", ["end", "fail"])
    async def test_a_finished_thread_is_refused(
        self, flowy_backend: Backend[Any], mode: str
    ) -> None:
        _, tid = await _started(flowy_backend, mode)
        before = await flowy_backend.checkpointer.load(tid)
        with pytest.raises(ThreadFinishedError, match="no run to cancel"):
            await cancel(flowy_backend, tid)
        with pytest.raises(ThreadFinishedError, match="no run to terminate"):
            await terminate(flowy_backend, tid)
        assert await flowy_backend.checkpointer.load(tid) == before

    async def test_an_unknown_thread_is_not_found(self, flowy_backend: Backend[Any]) -> None:
        with pytest.raises(ThreadNotFoundError):
            await cancel(flowy_backend, new_thread_id("nobody"))
        with pytest.raises(ThreadNotFoundError):
            await terminate(flowy_backend, new_thread_id("nobody"))

    async def test_bad_arguments_are_refused_before_anything_is_written(
        self, flowy_backend: Backend[Any]
    ) -> None:
        _, tid = await _started(flowy_backend, "suspend")
        before = await flowy_backend.checkpointer.load(tid)
        with pytest.raises(ValueError, match="at most 500"):
            await cancel(flowy_backend, tid, reason="x" * 501)
        with pytest.raises(TypeError, match="reason must be a str"):
            await terminate(flowy_backend, tid, reason=42)  # pyright: ignore[reportArgumentType]
        with pytest.raises(InvalidThreadIdError):
            await cancel(flowy_backend, "")
        assert await flowy_backend.checkpointer.load(tid) == before

    async def test_a_canceled_thread_can_be_forked(self, flowy_backend: Backend[Any]) -> None:
        runner, tid = await _started(flowy_backend, "suspend")
        done = await cancel(flowy_backend, tid)
        child = new_thread_id("cancel-fork")
        token = await runner.fork(tid, at_revision=done.revision, new_thread_id=child)
        result = await runner.resume(token, state_overlay={"resumed": True})
        assert result.status is RunStatus.COMPLETED
        assert (await runner.head(tid))[0].status is RunStatus.CANCELED

    async def test_terminate_fences_a_live_holder(self, flowy_backend: Backend[Any]) -> None:
        leases = require_leases(flowy_backend)
        cp = flowy_backend.checkpointer
        _, tid = await _started(flowy_backend, "suspend")
        snap, _ = await cp.load(tid)
        lease = await leases.acquire(tid, "suite-holder", self.long_ttl)
        done = await terminate(flowy_backend, tid, reason="runaway")
        assert (done.status, done.reason, done.fenced) == (
            RunStatus.FAILED,
            "terminated: runaway",
            lease,
        )
        head, now = await cp.load(tid)
        assert (head.status, head.reason, now) == (RunStatus.FAILED, "terminated: runaway", 2)
        with pytest.raises(LeaseLostError):
            await leases.renew(lease, self.long_ttl)
        with pytest.raises((LeaseLostError, ConcurrencyConflictError)):
            await cp.save(now, snap, lease=lease)
        assert await leases.holder(tid) is None
        again = await terminate(flowy_backend, tid)
        assert (again.changed, again.revision) == (False, 2)
        with pytest.raises(ThreadFinishedError):
            await cancel(flowy_backend, tid)

    async def test_terminate_stops_a_node_that_never_returns(
        self, flowy_backend: Backend[Any]
    ) -> None:
        require_leases(flowy_backend)
        never = asyncio.Event()
        ttl = max(self.short_ttl, 2.0)  # renewed every ttl / 3: the run stops within that
        runner = Runner(_chain(3, never, at=1), flowy_backend, run_lease=("suite-runaway", ttl))
        tid = new_thread_id("runaway")
        run = asyncio.ensure_future(runner.start(tid, {}))
        await _reached(flowy_backend, tid, 1, run)
        done = await terminate(flowy_backend, tid)
        assert done.fenced is not None and done.fenced.owner == "suite-runaway"
        result = await asyncio.wait_for(run, 10 + ttl * 3)
        assert result.status is RunStatus.FAILED
        assert result.reason == "terminated", result
        head, revision = await flowy_backend.checkpointer.load(tid)
        assert (head.status, head.reason) == (RunStatus.FAILED, "terminated")
        assert revision == done.revision


@contextmanager
def _round_trips(backend: Backend[Any]) -> Generator[dict[str, int]]:
    """Count the calls of the store's head read, write and lease primitives while the
    block runs (the store's round trips: each primitive is one atomic operation)."""
    cp, leases = backend.checkpointer, backend.leases
    if not isinstance(cp, BaseCheckpointer) or not isinstance(leases, BaseLeaseManager):
        pytest.skip("round trips are counted on stores built on the bases")
    calls: dict[str, int] = {}
    patched: list[tuple[object, str]] = []

    def count(owner: object, name: str) -> None:
        method = getattr(owner, name)

        async def counted(*args: Any, **kwargs: Any) -> Any:
            calls[name] = calls.get(name, 0) + 1
            return await method(*args, **kwargs)

        setattr(owner, name, counted)
        patched.append((owner, name))

    for name in (
        "_read_head",
        "_read_history",
        "_write",
        "_write_release",
        "_write_ack",
        "_acquire_head",
    ):
        count(cp, name)
    for name in ("_holder", "_acquire", "_renew", "_release"):
        count(leases, name)
    try:
        yield calls
    finally:
        for owner, name in patched:
            delattr(owner, name)


async def _reached(
    backend: Backend[Any], tid: str, revision: int, run: asyncio.Future[Any]
) -> None:
    """Wait until the run in ``run`` has saved ``revision`` of ``tid`` (a loaded machine
    may take a while; the run must not have ended)."""
    deadline = asyncio.get_running_loop().time() + 60
    while True:
        assert not run.done(), f"the run ended before revision {revision}: {run.result()!r}"
        head = await _head(backend, tid)
        if head is not None and head[1] >= revision:
            return
        assert asyncio.get_running_loop().time() < deadline, f"no revision {revision} in 60 s"
        await asyncio.sleep(0.01)


async def _head(backend: Backend[Any], tid: str) -> tuple[Any, int] | None:
    try:
        return await backend.checkpointer.load(tid)
    except ThreadNotFoundError:
        return None
