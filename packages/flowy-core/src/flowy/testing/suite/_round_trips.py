"""Round trips: how many store primitives the engine calls for a save, a leased segment
and a hand-off a worker continues, counted on the store and compared with what the store
declares (``BaseBackend.round_trips``).

Nothing is timed. The store is wrapped in ``flowy.testing.faults.FaultyBackend`` with a
plan that strikes nothing and records every primitive call (``_write``, ``_read_head``,
``_acquire``, ``_claim``, …): each is one round trip to the server. A new feature that
adds a read or a write on one of these paths fails here until the store's declaration
says so.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, ClassVar, cast

import pytest

from ..._directives import Directive, completed, end, handoff, suspend
from ..._errors import (
    ConcurrencyConflictError,
    LeaseLostError,
    ThreadLeaseBusyError,
    ThreadNotFoundError,
)
from ..._graph import Graph, GraphBuilder
from ..._runner import Runner
from ..._worker import Outcome, Worker
from ...storage import (
    Backend,
    Lease,
    OutboxMessage,
    RunStatus,
    TransactionalCheckpointer,
    TransactionalOutbox,
)
from ...storage.dialect import BaseBackend, BaseCheckpointer, RoundTrips
from ..faults import FaultKind, FaultPlan, FaultyBackend, Operation, Phase
from ._support import Suite, make_intent, make_snapshot, new_thread_id

__all__ = ["AckingSaveSuite", "AcquireAndLoadSuite", "ReleasingSaveSuite", "RoundTripSuite"]

State = dict[str, Any]


_SAVES = frozenset({"_write", "_write_release", "_write_ack"})
"""The primitives that are one save each."""


class _Counting(FaultPlan):
    """Strikes nothing; records the primitive of every operation, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def decide(self, operation: Operation) -> None:
        self.calls.append(operation.primitive)
        return None

    @property
    def saves(self) -> int:
        """The saves among the calls (each one conditional write)."""
        return sum(call in _SAVES for call in self.calls)


def _counted(backend: Backend[Any]) -> tuple[FaultyBackend[Any], _Counting]:
    """``backend`` with every primitive call recorded."""
    plan = _Counting()
    return FaultyBackend(backend, plan), plan


def _merge(state: State, update: State) -> State:
    return {**state, **update}


def _chain(steps: int, *, hand_off_after: int | None = None) -> Graph[State, Any]:
    """``steps`` nodes in a row, the last ending the run; with ``hand_off_after=k`` the
    k-th node hands off to the next."""
    builder: GraphBuilder[State, Any] = GraphBuilder(_merge)
    names = [f"n{i}" for i in range(1, steps + 1)]
    for i, name in enumerate(names, start=1):

        async def node(s: State, i: int = i, last: bool = i == steps) -> tuple[State, Any]:
            if last:
                return {"at": i}, end()
            if i == hand_off_after:
                return {"at": i}, handoff("to_worker", resume_at=f"n{i + 1}")
            return {"at": i}, completed()

        builder.add_node(name, node)
    for a, b in itertools.pairwise(names):
        builder.add_edge(a, b)
    builder.allow_no_outgoing_route(names[-1])
    return builder.compile(version="v1")


class RoundTripSuite(Suite):
    """A save is ``round_trips.save`` primitive calls, fenced or not; a leased start or
    resume of N steps is N saves plus ``round_trips.segment``; a hand-off a worker
    claims and continues for N steps is N saves plus ``round_trips.handoff``."""

    requires: ClassVar[tuple[str, ...]] = ("run_leases",)

    def _declared(self, backend: Backend[Any]) -> RoundTrips:
        if not isinstance(backend, BaseBackend):
            pytest.skip(
                f"{type(backend).__name__} is not built on flowy.storage.dialect.BaseBackend: "
                "its primitives cannot be counted"
            )
        return type(backend).round_trips

    async def test_a_save_is_its_declared_round_trips_fenced_or_not(
        self, flowy_backend: Backend[Any]
    ) -> None:
        declared = self._declared(flowy_backend)
        counted, plan = _counted(flowy_backend)
        tid = new_thread_id("rt-save")
        assert await counted.checkpointer.save(0, make_snapshot(tid)) == 1
        assert len(plan.calls) == declared.save, plan.calls
        lease = await flowy_backend.leases.acquire(tid, "rt-owner", self.long_ttl)
        plan.calls.clear()
        assert await counted.checkpointer.save(1, make_snapshot(tid), lease=lease) == 2
        assert len(plan.calls) == declared.save, plan.calls

    async def test_a_leased_start_of_n_steps_is_n_saves_and_the_segments_round_trips(
        self, flowy_backend: Backend[Any]
    ) -> None:
        declared = self._declared(flowy_backend)
        for steps in (1, 5):
            counted, plan = _counted(flowy_backend)
            runner = Runner(_chain(steps), counted, run_lease=("rt-owner", self.long_ttl))
            result = await runner.start(new_thread_id("rt-start"), {})
            assert result.status is RunStatus.COMPLETED, result
            assert plan.saves == steps, plan.calls
            assert len(plan.calls) == steps + declared.segment, plan.calls
            assert await flowy_backend.leases.holder(result.thread_id) is None

    async def test_a_leased_resume_is_its_saves_and_the_segments_round_trips(
        self, flowy_backend: Backend[Any]
    ) -> None:
        declared = self._declared(flowy_backend)

        async def ask(s: State) -> tuple[State, Directive[Any]]:
            return {}, suspend("approval") if not s.get("ok") else end()

        builder: GraphBuilder[State, Any] = GraphBuilder(_merge)
        builder.add_node("ask", ask).allow_no_outgoing_route("ask")
        graph = builder.compile(version="v1")
        tid = new_thread_id("rt-resume")
        first = await Runner(graph, flowy_backend).start(tid, {})
        assert first.status is RunStatus.SUSPENDED and first.resume_token is not None, first
        counted, plan = _counted(flowy_backend)
        runner = Runner(graph, counted, run_lease=("rt-owner", self.long_ttl))
        result = await runner.resume(first.resume_token, state_overlay={"ok": True})
        assert result.status is RunStatus.COMPLETED, result
        assert len(plan.calls) == plan.saves + declared.segment, plan.calls
        assert await flowy_backend.leases.holder(tid) is None

    async def test_a_hand_off_a_worker_continues_is_its_saves_and_the_hand_offs_round_trips(
        self, flowy_backend: Backend[Any]
    ) -> None:
        declared = self._declared(flowy_backend)
        if not flowy_backend.capabilities.consumer:
            pytest.skip(f"{type(flowy_backend).__name__} has no consumer: no worker claims")
        for continued in (1, 3):
            graph = _chain(1 + continued, hand_off_after=1)
            tid = new_thread_id("rt-handoff")
            first = await Runner(graph, flowy_backend).start(tid, {})
            assert first.status is RunStatus.HANDOFF, first
            counted, plan = _counted(flowy_backend)
            worker = Worker(Runner(graph, counted), owner="rt-worker", busy_grace=0.0)
            (message,) = await counted.consumer.claim(1, self.long_ttl, wait=2.0)
            assert message.intent.thread_id == tid
            assert await worker.process(message) is Outcome.RESUMED
            head, _ = await flowy_backend.checkpointer.load(tid)
            assert head.status is RunStatus.COMPLETED, head
            assert plan.saves == continued, plan.calls
            assert len(plan.calls) == continued + declared.handoff, plan.calls


class ReleasingSaveSuite(Suite):
    """A save that releases (``Capabilities.release_on_save``): the written save gives
    the lease up in its own atomic write, keeping the token counter; a refused one
    writes nothing and leaves the lease held; a leased segment makes no separate
    release call."""

    requires: ClassVar[tuple[str, ...]] = ("release_on_save",)

    async def test_a_releasing_save_writes_and_gives_the_lease_up(
        self, flowy_backend: Backend[Any]
    ) -> None:
        cp = flowy_backend.checkpointer
        assert isinstance(cp, BaseCheckpointer)
        tid = new_thread_id("rel-save")
        lease = await flowy_backend.leases.acquire(tid, "rel-owner", self.long_ttl)
        assert await cp.save_and_release(0, make_snapshot(tid), lease=lease) == 1
        assert await flowy_backend.leases.holder(tid) is None
        _, revision = await cp.load(tid)
        assert revision == 1
        again = await flowy_backend.leases.acquire(tid, "rel-other", self.long_ttl)
        assert again.fencing_token > lease.fencing_token

    async def test_a_refused_releasing_save_keeps_the_lease_and_writes_nothing(
        self, flowy_backend: Backend[Any]
    ) -> None:
        cp = flowy_backend.checkpointer
        assert isinstance(cp, BaseCheckpointer)
        tid = new_thread_id("rel-refused")
        lease = await flowy_backend.leases.acquire(tid, "rel-owner", self.long_ttl)
        with pytest.raises(ConcurrencyConflictError):
            await cp.save_and_release(3, make_snapshot(tid), lease=lease)
        holder = await flowy_backend.leases.holder(tid)
        assert holder is not None and holder.fencing_token == lease.fencing_token
        stale = Lease(tid, "rel-stale", lease.fencing_token - 1, lease.expires_at)
        with pytest.raises(LeaseLostError):
            await cp.save_and_release(0, make_snapshot(tid), lease=stale)
        holder = await flowy_backend.leases.holder(tid)
        assert holder is not None and holder.fencing_token == lease.fencing_token
        with pytest.raises(ThreadNotFoundError):
            await cp.load(tid)
        await flowy_backend.leases.release(lease)

    async def test_a_leased_segment_releases_in_its_last_save(
        self, flowy_backend: Backend[Any]
    ) -> None:
        counted, plan = _counted(flowy_backend)
        runner = Runner(_chain(2), counted, run_lease=("rel-owner", self.long_ttl))
        result = await runner.start(new_thread_id("rel-run"), {})
        assert result.status is RunStatus.COMPLETED, result
        assert plan.calls[-1] == "_write_release", plan.calls
        assert "_release" not in plan.calls, plan.calls
        assert await flowy_backend.leases.holder(result.thread_id) is None

    async def test_a_segment_whose_last_save_fails_still_releases_the_lease(
        self, flowy_backend: Backend[Any]
    ) -> None:
        counted = FaultyBackend(flowy_backend)
        counted.arm(Phase.SAVE_TERMINAL, FaultKind.UNAVAILABLE, times=10)
        runner = Runner(_chain(1), counted, run_lease=("rel-owner", self.long_ttl))
        result = await runner.start(new_thread_id("rel-fail"), {})
        assert result.status is RunStatus.FAILED, result
        assert await flowy_backend.leases.holder(result.thread_id) is None


class AcquireAndLoadSuite(Suite):
    """Take a lease and read the head in one round trip
    (``Capabilities.acquire_with_load``): the lease the lease manager would give (busy
    while another holds it, a greater fencing token each time) and the head as
    ``load`` reads it, with every save made before the lease was taken (the last save of
    the holder before, which may have released the lease in the same write); a leased
    segment starts with that one call."""

    requires: ClassVar[tuple[str, ...]] = ("acquire_with_load",)

    async def test_it_takes_the_lease_and_reads_no_head_of_a_new_thread(
        self, flowy_backend: Backend[Any]
    ) -> None:
        cp = flowy_backend.checkpointer
        assert isinstance(cp, BaseCheckpointer)
        tid = new_thread_id("al-new")
        lease, head = await cp.acquire_and_load(tid, "al-owner", self.long_ttl)
        assert head is None
        holder = await flowy_backend.leases.holder(tid)
        assert holder is not None and holder.fencing_token == lease.fencing_token
        assert holder.owner == "al-owner"
        await flowy_backend.leases.release(lease)

    async def test_it_reads_the_head_and_is_refused_while_another_holds_the_thread(
        self, flowy_backend: Backend[Any]
    ) -> None:
        cp = flowy_backend.checkpointer
        assert isinstance(cp, BaseCheckpointer)
        tid = new_thread_id("al-head")
        await cp.save(0, make_snapshot(tid, state={"n": 1}))
        first, head = await cp.acquire_and_load(tid, "al-owner", self.long_ttl)
        assert head is not None
        snapshot, revision = head
        assert revision == 1 and snapshot.state == {"n": 1}
        with pytest.raises(ThreadLeaseBusyError):
            await cp.acquire_and_load(tid, "al-other", self.long_ttl)
        await cp.save(1, make_snapshot(tid, state={"n": 2}), lease=first)
        await flowy_backend.leases.release(first)
        second, head = await cp.acquire_and_load(tid, "al-other", self.long_ttl)
        assert second.fencing_token > first.fencing_token
        assert head is not None and head[1] == 2 and head[0].state == {"n": 2}
        await flowy_backend.leases.release(second)

    async def test_racing_takers_read_the_save_of_the_lease_before_theirs(
        self, flowy_backend: Backend[Any]
    ) -> None:
        """Two takers per thread try until one of them gets the lease, as two workers
        firing one timer do: the first does the step and saves (releasing the lease in
        the save where the store can); whoever gets the lease after that save reads
        it, and does not do the step again."""
        cp = flowy_backend.checkpointer
        assert isinstance(cp, BaseCheckpointer)
        leases = flowy_backend.leases
        releasing = flowy_backend.capabilities.release_on_save
        tids = [new_thread_id("al-race") for _ in range(20)]
        for tid in tids:
            await cp.save(0, make_snapshot(tid, state={"n": 0}))
        done: list[tuple[str, str]] = []

        async def take(tid: str, owner: str) -> None:
            async with asyncio.timeout(30):
                while True:
                    try:
                        lease, head = await cp.acquire_and_load(tid, owner, self.long_ttl)
                    except ThreadLeaseBusyError:
                        await asyncio.sleep(0)
                        continue
                    break
            assert head is not None
            if head[1] == 1:  # the step is still to do
                done.append((tid, owner))
                after = make_snapshot(tid, state={"n": 1})
                try:
                    if releasing:
                        await cp.save_and_release(1, after, lease=lease)
                        return
                    await cp.save(1, after, lease=lease)
                except ConcurrencyConflictError:
                    pass  # it read a head older than the one saved: counted below
            await leases.release(lease)

        await asyncio.gather(*(take(tid, owner) for tid in tids for owner in ("al-a", "al-b")))
        twice = [tid for tid in tids if sum(t == tid for t, _ in done) > 1]
        assert not twice, f"the step ran twice in {len(twice)} of {len(tids)} threads"
        assert sorted(t for t, _ in done) == sorted(tids)

    async def test_a_leased_segment_starts_with_one_call(self, flowy_backend: Backend[Any]) -> None:
        counted, plan = _counted(flowy_backend)
        runner = Runner(_chain(1), counted, run_lease=("al-owner", self.long_ttl))
        result = await runner.start(new_thread_id("al-run"), {})
        assert result.status is RunStatus.COMPLETED, result
        assert plan.calls[0] == "_acquire_head", plan.calls
        assert "_acquire" not in plan.calls and "_read_head" not in plan.calls, plan.calls


class AckingSaveSuite(Suite):
    """A releasing save that also acknowledges the hand-off message its run was resumed
    for (``Capabilities.ack_on_save``): a written save removes that message, and only
    that one; a refused save leaves it claimed; a message already gone is no refusal;
    a worker's resumed run makes no separate ack."""

    requires: ClassVar[tuple[str, ...]] = ("ack_on_save",)

    async def _claimed(self, backend: Backend[Any], label: str) -> tuple[str, OutboxMessage]:
        """A thread at revision 1 whose hand-off message is claimed."""
        tid = new_thread_id(label)
        cp = cast(TransactionalCheckpointer[Any], backend.checkpointer)
        outbox = cast(TransactionalOutbox, backend.outbox)

        async def enqueue(tx: object, revision: int) -> None:
            await outbox.enqueue_intent_tx(tx, make_intent(tid, revision))

        assert await cp.save_with_outbox(0, make_snapshot(tid), enqueue) == 1
        claimed = await backend.consumer.claim(10, self.long_ttl, wait=2.0)
        mine = [m for m in claimed if m.intent.thread_id == tid]
        assert len(mine) == 1, claimed
        return tid, mine[0]

    async def _claim_again(self, backend: Backend[Any]) -> list[str]:
        """The threads of the messages claimable now (claimed with a short lease)."""
        claimed = await backend.consumer.claim(50, self.long_ttl, wait=0.5)
        return [m.intent.thread_id for m in claimed]

    async def test_an_acking_save_writes_releases_and_removes_the_message(
        self, flowy_backend: Backend[Any]
    ) -> None:
        cp = flowy_backend.checkpointer
        assert isinstance(cp, BaseCheckpointer)
        tid, message = await self._claimed(flowy_backend, "ack-save")
        lease = await flowy_backend.leases.acquire(tid, "ack-owner", self.long_ttl)
        assert await cp.save_and_release(1, make_snapshot(tid), lease=lease, ack=message) == 2
        assert await flowy_backend.leases.holder(tid) is None
        _, revision = await cp.load(tid)
        assert revision == 2
        await flowy_backend.consumer.release(message, error="given back", delay=0.0)
        assert tid not in await self._claim_again(flowy_backend)

    async def test_a_refused_acking_save_keeps_the_message(
        self, flowy_backend: Backend[Any]
    ) -> None:
        cp = flowy_backend.checkpointer
        assert isinstance(cp, BaseCheckpointer)
        tid, message = await self._claimed(flowy_backend, "ack-refused")
        lease = await flowy_backend.leases.acquire(tid, "ack-owner", self.long_ttl)
        with pytest.raises(ConcurrencyConflictError):
            await cp.save_and_release(5, make_snapshot(tid), lease=lease, ack=message)
        holder = await flowy_backend.leases.holder(tid)
        assert holder is not None and holder.fencing_token == lease.fencing_token
        await flowy_backend.consumer.release(message, error="given back", delay=0.0)
        assert await self._claim_again(flowy_backend) == [tid]

    async def test_an_acking_save_leaves_the_other_messages(
        self, flowy_backend: Backend[Any]
    ) -> None:
        cp = flowy_backend.checkpointer
        assert isinstance(cp, BaseCheckpointer)
        tid, message = await self._claimed(flowy_backend, "ack-one")
        other, other_message = await self._claimed(flowy_backend, "ack-other")
        lease = await flowy_backend.leases.acquire(tid, "ack-owner", self.long_ttl)
        assert await cp.save_and_release(1, make_snapshot(tid), lease=lease, ack=message) == 2
        await flowy_backend.consumer.release(other_message, error="given back", delay=0.0)
        assert await self._claim_again(flowy_backend) == [other]

    async def test_an_acking_save_of_a_message_already_gone_still_writes(
        self, flowy_backend: Backend[Any]
    ) -> None:
        cp = flowy_backend.checkpointer
        assert isinstance(cp, BaseCheckpointer)
        tid, message = await self._claimed(flowy_backend, "ack-gone")
        await flowy_backend.consumer.ack(message)
        lease = await flowy_backend.leases.acquire(tid, "ack-owner", self.long_ttl)
        assert await cp.save_and_release(1, make_snapshot(tid), lease=lease, ack=message) == 2
        assert await flowy_backend.leases.holder(tid) is None

    async def test_a_worker_acknowledges_in_the_last_save_of_the_run(
        self, flowy_backend: Backend[Any]
    ) -> None:
        graph = _chain(2, hand_off_after=1)
        tid = new_thread_id("ack-worker")
        first = await Runner(graph, flowy_backend).start(tid, {})
        assert first.status is RunStatus.HANDOFF, first
        counted, plan = _counted(flowy_backend)
        worker = Worker(Runner(graph, counted), owner="ack-worker", busy_grace=0.0)
        (message,) = await counted.consumer.claim(1, self.long_ttl, wait=2.0)
        assert await worker.process(message) is Outcome.RESUMED
        assert plan.calls[-1] == "_write_ack", plan.calls
        assert "_ack" not in plan.calls, plan.calls
        await flowy_backend.consumer.release(message, error="given back", delay=0.0)
        assert tid not in await self._claim_again(flowy_backend)
