"""Runner-level contracts on a real backend: write ownership between two "processes",
faults at every phase of the hand-off FSM, and ambiguous saves.

These run the real ``flowy.Runner`` and ``flowy.Worker`` over the bundle's checkpointer,
lease manager, outbox and consumer, wrapped in the fault injectors of
:mod:`flowy.testing.faults`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ..._directives import Directive, completed, handoff, suspend
from ..._errors import (
    ConcurrencyConflictError,
    HandoffEnqueueFailedError,
    StorageError,
    StorageUnavailableError,
    ThreadAlreadyRunningError,
    ThreadLeaseBusyError,
)
from ..._graph import Graph, GraphBuilder
from ..._results import ResumeDecisionKind
from ..._runner import Runner
from ..._worker import Worker
from ...storage import (
    Backend,
    ResumeToken,
    RunStatus,
    TransactionalCheckpointer,
    TransactionalOutbox,
    as_backend,
)
from ...storage.dialect import confirmed_save
from ..faults import FaultKind, FaultyBackend, Phase
from ._support import (
    Suite,
    history_revisions,
    make_snapshot,
    new_thread_id,
    peer_of,
    require_consumer,
)

__all__ = ["FaultSuite", "WriteOwnershipSuite"]

State = dict[str, Any]


def _merge(state: State, update: State) -> State:
    return {**state, **update}


def _effect_graph(
    effects: list[str],
    gate: asyncio.Event | None = None,
    approved_runs: list[str] | None = None,
) -> Graph[State, Any]:
    """Work → (hand-off) → effect → done. ``effect`` records the thread id: a second
    record means a segment ran twice. ``work`` suspends first when ``approve_first`` is
    set; its approved runs are recorded in ``approved_runs`` (after ``gate``)."""

    async def work(state: State) -> tuple[State, Directive[Any]]:
        if state.get("approve_first") and not state.get("approved"):
            return {}, suspend("awaiting_approval")
        if approved_runs is not None:
            if gate is not None:
                await gate.wait()
            approved_runs.append(state.get("who", "?"))
        return {"worked": True}, handoff("to_worker", resume_at="effect")

    async def effect(state: State) -> tuple[State, Directive[Any]]:
        if gate is not None:
            await gate.wait()
        from ..._context import run_metadata

        effects.append(run_metadata().thread_id)
        return {"effect_done": True}, completed()

    async def done(state: State) -> tuple[State, Directive[Any]]:
        return {"done": True}, completed()

    builder: GraphBuilder[State, Any] = GraphBuilder(_merge)
    builder.add_node("work", work).add_node("effect", effect).add_node("done", done)
    builder.add_edge("work", "effect").add_edge("effect", "done")
    builder.allow_no_outgoing_route("done")
    return builder.compile()


def _lease(bundle: Backend[Any], owner: str) -> tuple[str, float]:
    return (owner, 30.0)


async def _assert_single_chain(bundle: Backend[Any], thread_id: str) -> list[int]:
    revisions = await history_revisions(bundle.checkpointer, thread_id)
    assert revisions == sorted(set(revisions), reverse=True), revisions
    head = revisions[0]
    assert revisions == list(range(head, head - len(revisions), -1)), revisions
    return revisions


class WriteOwnershipSuite(Suite):
    """Two runners (two "processes") resuming one token: exactly one runs."""

    async def test_two_runners_resume_one_token_exactly_one_runs(
        self, flowy_backend: Backend[Any]
    ) -> None:
        bundle = flowy_backend
        effects: list[str] = []
        runs: list[str] = []
        gate = asyncio.Event()
        thread_id = new_thread_id("own")
        async with peer_of(bundle) as peer:
            graph = _effect_graph(effects, gate, runs)
            runner_a = Runner(graph, as_backend(bundle.checkpointer, leases=bundle.leases))
            runner_b = Runner(graph, as_backend(peer.checkpointer, leases=peer.leases))
            first = await runner_a.start(
                thread_id, {"approve_first": True}, run_lease=_lease(bundle, "a")
            )
            assert first.status is RunStatus.SUSPENDED and first.resume_token is not None
            token = first.resume_token

            async def resume(runner: Runner[State, Any], owner: str) -> object:
                try:
                    return await runner.resume(
                        token,
                        state_overlay={"approved": True, "who": owner},
                        run_lease=_lease(bundle, owner),
                    )
                except (
                    ConcurrencyConflictError,
                    ThreadLeaseBusyError,
                    ThreadAlreadyRunningError,
                ) as exc:
                    return exc

            task_a = asyncio.ensure_future(resume(runner_a, "a"))
            task_b = asyncio.ensure_future(resume(runner_b, "b"))
            await asyncio.sleep(0.2)
            gate.set()
            outcomes = await asyncio.gather(task_a, task_b)
        losers = [o for o in outcomes if isinstance(o, Exception)]
        winners = [o for o in outcomes if not isinstance(o, Exception)]
        assert len(winners) == 1, outcomes
        assert len(losers) == 1, outcomes
        assert len(runs) == 1, f"with leases the loser must not run any node: {runs}"
        snap, _ = await bundle.checkpointer.load(thread_id)
        assert snap.status is RunStatus.HANDOFF
        assert snap.state["who"] == getattr(winners[0], "state", {}).get("who")
        await _assert_single_chain(bundle, thread_id)

    async def test_stale_token_after_another_runner_advanced(
        self, flowy_backend: Backend[Any]
    ) -> None:
        bundle = flowy_backend
        effects: list[str] = []
        thread_id = new_thread_id("stale")
        async with peer_of(bundle) as peer:
            graph = _effect_graph(effects)
            runner_a = Runner(graph, as_backend(bundle.checkpointer, leases=bundle.leases))
            runner_b = Runner(graph, as_backend(peer.checkpointer, leases=peer.leases))
            first = await runner_a.start(
                thread_id, {"approve_first": True}, run_lease=_lease(bundle, "a")
            )
            assert first.resume_token is not None
            await runner_a.resume(
                first.resume_token,
                state_overlay={"approved": True},
                run_lease=_lease(bundle, "a"),
            )
            with pytest.raises(ConcurrencyConflictError):
                await runner_b.resume(first.resume_token, run_lease=_lease(bundle, "b"))
            decision = await runner_b.evaluate_resume(first.resume_token)
            assert decision.kind is ResumeDecisionKind.STALE_TOKEN
            head, revision = await peer.checkpointer.load(thread_id)
            assert decision.resume_token == ResumeToken(thread_id, revision)
            assert head.status is RunStatus.HANDOFF
        await _assert_single_chain(bundle, thread_id)


_SAVE_PHASES = (Phase.SAVE_PENDING, Phase.PATCH_ENQUEUED, Phase.PATCH_ORPHANED)


class FaultSuite(Suite):
    """A fault at every phase of a hand-off leaves the thread resumable or recoverable:
    never lost, never resumed twice."""

    async def _scenario(
        self,
        bundle: Backend[Any],
        *,
        phase: Phase,
        after_write: bool,
        transactional: bool,
    ) -> None:
        outbox, consumer = require_consumer(bundle)
        if transactional and not (
            isinstance(bundle.checkpointer, TransactionalCheckpointer)
            and isinstance(outbox, TransactionalOutbox)
        ):
            pytest.skip(f"{type(bundle).__name__} has no transactional outbox")
        effects: list[str] = []
        thread_id = new_thread_id(f"fault-{phase.value}")
        graph = _effect_graph(effects)
        faulty = FaultyBackend(bundle, three_phase=not transactional)
        kind = FaultKind.UNKNOWN if after_write else FaultKind.UNAVAILABLE

        def error() -> BaseException:
            if after_write:
                return StorageUnavailableError(f"injected: connection lost after {phase}")
            return StorageError(f"injected: {phase} failed")

        if phase is Phase.PATCH_ORPHANED:
            faulty.arm(Phase.ENQUEUE, error=lambda: ConnectionError("injected: queue down"))
        faulty.arm(phase, kind, error=error)
        runner = Runner(graph, faulty)
        first = await runner.start(thread_id, {}, run_lease=_lease(bundle, "fg"))
        assert faulty.struck, "the fault never struck"

        # The clean side: a worker with a recovery pass (stale_after=0: no waiting).
        clean = Runner(graph, as_backend(bundle.checkpointer, leases=bundle.leases, outbox=outbox))
        worker = Worker(clean, consumer, owner="suite-worker", lease_ttl=30.0, stale_after=0)
        if isinstance(first.error, HandoffEnqueueFailedError) and not first.error.orphaned:
            # the worst case of the runbook: enqueued without a message -> force re-enqueue
            await clean.recover_stale_handoff(thread_id, force_reenqueue=True)
        for _ in range(4):
            await worker.recover_once()
            await worker.run_until_idle(idle_wait=0.2)
            if effects:
                break
            decision = await clean.evaluate_resume(ResumeToken(thread_id, 1))
            if decision.kind is ResumeDecisionKind.NOT_FOUND:
                # nothing was ever saved: the run failed before its first save; start again
                assert first.status is RunStatus.FAILED
                await clean.start(thread_id, {}, run_lease=_lease(bundle, "retry"))
                continue
            head, revision = await bundle.checkpointer.load(thread_id)
            if head.status is not RunStatus.HANDOFF:
                # the hand-off was not persisted: the thread is resumable from its last save
                await clean.resume(
                    ResumeToken(thread_id, revision), run_lease=_lease(bundle, "retry")
                )
        assert effects == [thread_id], (
            f"after a fault at {phase} the side effect ran {len(effects)} time(s); first "
            f"result: {first.status} {first.reason}"
        )
        snap, _ = await bundle.checkpointer.load(thread_id)
        assert snap.status is RunStatus.COMPLETED and snap.state.get("done") is True
        await _assert_single_chain(bundle, thread_id)

    @pytest.mark.parametrize("after_write", [False, True], ids=["before-write", "after-write"])
    @pytest.mark.parametrize("phase", [*_SAVE_PHASES, Phase.ENQUEUE], ids=lambda p: p.value)
    async def test_three_phase_fault(
        self, flowy_backend: Backend[Any], phase: Phase, after_write: bool
    ) -> None:
        await self._scenario(
            flowy_backend, phase=phase, after_write=after_write, transactional=False
        )

    @pytest.mark.parametrize("after_write", [False, True], ids=["before-write", "after-write"])
    async def test_transactional_commit_fault(
        self, flowy_backend: Backend[Any], after_write: bool
    ) -> None:
        await self._scenario(
            flowy_backend, phase=Phase.COMMIT, after_write=after_write, transactional=True
        )

    async def test_ambiguous_save_is_resolved_not_reported_as_conflict(
        self, flowy_backend: Backend[Any]
    ) -> None:
        bundle = flowy_backend
        thread_id = new_thread_id("ambiguous")
        faulty = FaultyBackend(bundle)
        await bundle.checkpointer.save(0, make_snapshot(thread_id, {"n": 1}))
        faulty.arm(Phase.SAVE_STEP, FaultKind.UNKNOWN)  # lands, then the caller sees an error
        revision = await confirmed_save(faulty.checkpointer, 1, make_snapshot(thread_id, {"n": 2}))
        assert revision == 2
        head, stored = await bundle.checkpointer.load(thread_id)
        assert stored == 2 and head.state == {"n": 2}
        assert await history_revisions(bundle.checkpointer, thread_id) == [2, 1]
        faulty.arm(Phase.SAVE_STEP)  # fails before the write: retried
        assert await confirmed_save(faulty.checkpointer, 2, make_snapshot(thread_id, {"n": 3})) == 3
        assert await history_revisions(bundle.checkpointer, thread_id) == [3, 2, 1]

    async def test_ambiguous_step_saves_during_a_run(self, flowy_backend: Backend[Any]) -> None:
        bundle = flowy_backend
        effects: list[str] = []
        thread_id = new_thread_id("amb-run")
        faulty = FaultyBackend(bundle)
        faulty.arm(Phase.SAVE_STEP, FaultKind.UNKNOWN, times=2)
        runner = Runner(
            _effect_graph(effects), as_backend(faulty.checkpointer, leases=bundle.leases)
        )
        result = await runner.start(thread_id, {}, run_lease=_lease(bundle, "fg"))
        assert result.status is RunStatus.HANDOFF and result.error is None
        done = await runner.resume(result.resume_token, run_lease=_lease(bundle, "bg"))  # type: ignore[arg-type]
        assert done.status is RunStatus.COMPLETED and effects == [thread_id]
        await _assert_single_chain(bundle, thread_id)
