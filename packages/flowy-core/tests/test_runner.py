"""Runner: start/resume, the resume pipeline, OCC, budgets, bad input (``_runner.py``)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, TypedDict

import pytest
from core_graphs import State, approval_graph, linear_graph, merge

import flowy
from flowy import errors, storage, stream_helpers
from flowy import types as ftypes
from flowy.memory import MemoryCheckpointer
from flowy.storage import as_backend
from flowy.testing.faults import FaultyCheckpointer, Phase

pytestmark = pytest.mark.anyio


def runner_for(
    graph: flowy.Graph[State, Any], cp: storage.Checkpointer[State] | None = None, **kw: Any
) -> flowy.Runner[State, Any]:
    return flowy.Runner(graph, as_backend(cp if cp is not None else MemoryCheckpointer()), **kw)


async def test_start_suspend_resume_with_overlay() -> None:
    cp: MemoryCheckpointer[State] = MemoryCheckpointer()
    runner = runner_for(approval_graph(), cp)
    first = await runner.start("t", {})
    assert first.status is flowy.RunStatus.SUSPENDED
    assert first.reason == "awaiting_approval"
    assert first.execution_pointer == "ask"
    assert first.effects == [{"kind": "approval"}]
    assert first.resume_token == flowy.ResumeToken("t", first.revision)
    snap, rev = await cp.load("t")
    assert rev == first.revision and snap.status is flowy.RunStatus.SUSPENDED
    assert snap.execution_pointer == "ask" and snap.reason == "awaiting_approval"

    second = await runner.resume(first.resume_token, state_overlay={"approved": True})
    assert second.status is flowy.RunStatus.HANDOFF
    assert second.reason == "to_worker"
    assert second.execution_pointer == "act"
    assert second.segment == 1
    third = await runner.resume(second.resume_token)  # type: ignore[arg-type]
    assert third.status is flowy.RunStatus.COMPLETED
    assert third.state["log"] == ["plan", "ask", "act", "done"]
    assert third.resume_token is None
    assert third.total_steps == second.total_steps + third.step_count == 6


async def test_stale_and_zero_tokens_conflict_and_change_nothing() -> None:
    cp: MemoryCheckpointer[State] = MemoryCheckpointer()
    runner = runner_for(approval_graph(), cp)
    first = await runner.start("t", {})
    assert first.resume_token is not None
    before = await cp.get_history("t")
    for bad in (
        flowy.ResumeToken("t", 0),
        flowy.ResumeToken("t", first.revision - 1),
        flowy.ResumeToken("t", first.revision + 5),
    ):
        with pytest.raises(flowy.ConcurrencyConflictError) as info:
            await runner.resume(bad)
        assert info.value.actual == first.revision
    assert await cp.get_history("t") == before
    decision = await runner.evaluate_resume(flowy.ResumeToken("t", 1))
    assert decision.kind is flowy.ResumeDecisionKind.STALE_TOKEN
    assert decision.resume_token == first.resume_token
    ok = await runner.evaluate_resume(first.resume_token)
    assert ok.resumable and ok.resume_token == first.resume_token
    missing = await runner.evaluate_resume(flowy.ResumeToken("nope", 1))
    assert missing.kind is flowy.ResumeDecisionKind.NOT_FOUND and missing.resume_token is None


async def test_second_resume_of_same_token_conflicts() -> None:
    runner = runner_for(approval_graph())
    first = await runner.start("t", {})
    assert first.resume_token is not None
    await runner.resume(first.resume_token, state_overlay={"approved": True})
    with pytest.raises(flowy.ConcurrencyConflictError):
        await runner.resume(first.resume_token, state_overlay={"approved": True})


async def test_start_of_existing_thread_conflicts_before_running() -> None:
    ran: list[str] = []

    async def node(s: State) -> tuple[State, flowy.Directive[Any]]:
        ran.append("x")
        return s, flowy.suspend("wait")

    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    b.add_node("n", node).allow_no_outgoing_route("n")
    runner = runner_for(b.compile())
    await runner.start("t", {})
    with pytest.raises(flowy.ConcurrencyConflictError, match="already exists"):
        await runner.start("t", {})
    assert ran == ["x"]


@pytest.mark.parametrize("bad", ["", "x" * (16 * 1024 + 1), "a\x00b", 42])
async def test_invalid_thread_ids(bad: Any) -> None:
    cp: MemoryCheckpointer[State] = MemoryCheckpointer()
    runner = runner_for(linear_graph(), cp)
    with pytest.raises(errors.InvalidThreadIdError):
        await runner.start(bad, {})
    with pytest.raises(flowy.InvalidResumeTokenError):
        await runner.resume(flowy.ResumeToken(bad, 1))
    assert await cp.list_threads() == []


async def test_resume_pipeline_order() -> None:
    """token → load+OCC → after_load → overlay → segment reset → metadata → policy →
    pointer validation → execute."""
    trace: list[str] = []

    async def wait_user(s: State) -> tuple[State, flowy.Directive[Any]]:
        trace.append("execute:wait_user")
        flowy.use_budget("tokens", 10)
        return s, flowy.suspend("need_user")

    async def router(s: State) -> tuple[State, flowy.Directive[Any]]:
        meta = flowy.run_metadata()
        trace.append(f"execute:router seg={meta.segment} steps={meta.step_count}")
        trace.append(f"budget={flowy.budget_used('tokens')} meta={meta.metadata}")
        return s, flowy.completed()

    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    b.add_node("wait_user", wait_user).add_node("router", router)
    b.add_edge("wait_user", "router").allow_no_outgoing_route("router")
    graph = b.compile(budgets={"tokens": 1000})

    def after_load(state: State) -> State:
        trace.append(f"after_load:{sorted(state)}")
        return {**state, "loaded": True}

    def merge_fn(state: State, overlay: State) -> State:
        trace.append(f"overlay:loaded={state.get('loaded')}")
        return {**state, **overlay}

    def policy(state: State, current: str) -> tuple[State, ftypes.ResumePlan]:
        trace.append(f"policy:{current}:route_ready={state.get('route_ready')}")
        if current == "wait_user" and state.get("route_ready"):
            return state, flowy.resume_to("router")
        return state, flowy.resume_current()

    runner = runner_for(graph, after_load=after_load)
    first = await runner.start("t", {"q": 1})
    assert first.budget_counts == {"tokens": 10}
    trace.clear()
    assert first.resume_token is not None
    result = await runner.resume(
        first.resume_token,
        state_overlay={"route_ready": True},
        merge=merge_fn,
        # The given count replaces the stored one (10), as WithRunMetadata does: 25, not 35.
        run_metadata=flowy.RunMetadataInput(budget_counts={"tokens": 25}, metadata={"k": "v"}),
        resume_target_policy=policy,
    )
    assert trace == [
        "after_load:['q']",
        "overlay:loaded=True",
        "policy:wait_user:route_ready=True",
        "execute:router seg=1 steps=0",
        "budget=25 meta={'k': 'v'}",
    ]
    assert result.status is flowy.RunStatus.COMPLETED
    assert result.step_count == 1 and result.segment == 1
    assert result.budget_counts == {"tokens": 25}


async def test_resume_plan_errors_are_rejected_before_execute() -> None:
    runner = runner_for(approval_graph())
    first = await runner.start("t", {})
    token = first.resume_token
    assert token is not None
    with pytest.raises(errors.InvalidResumePlanError, match="resume_current"):
        await runner.resume(token, resume_target_policy=lambda s, p: (s, ftypes.ResumePlan()))
    with pytest.raises(errors.InvalidResumePlanError, match="unknown node 'ghost'"):
        await runner.resume(token, resume_target_policy=lambda s, p: (s, flowy.resume_to("ghost")))
    # nothing ran, the token is still good
    assert (await runner.evaluate_resume(token)).resumable


async def test_persisted_pointer_not_in_graph_is_rejected() -> None:
    cp: MemoryCheckpointer[State] = MemoryCheckpointer()
    await cp.save(0, storage.Snapshot("t", {}, "removed_node", flowy.RunStatus.SUSPENDED))
    with pytest.raises(flowy.UnknownNodeError, match="removed_node"):
        await runner_for(linear_graph(), cp).resume(flowy.ResumeToken("t", 1))


async def test_node_and_reducer_errors_leave_snapshot_unchanged() -> None:
    async def boom(s: State) -> tuple[State, flowy.Directive[Any]]:
        if s.get("approved"):
            raise RuntimeError("tool crashed")
        return s, flowy.suspend("wait")

    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    b.add_node("boom", boom).allow_no_outgoing_route("boom")
    cp: MemoryCheckpointer[State] = MemoryCheckpointer()
    runner = runner_for(b.compile(), cp)
    first = await runner.start("t", {})
    assert first.resume_token is not None
    history = await cp.get_history("t")
    result = await runner.resume(first.resume_token, state_overlay={"approved": True})
    assert result.status is flowy.RunStatus.FAILED
    assert result.reason == flowy.Reason.NODE_ERROR
    assert isinstance(result.error, RuntimeError)
    with pytest.raises(RuntimeError, match="tool crashed"):
        result.raise_for_error()
    assert await cp.get_history("t") == history
    assert (await runner.evaluate_resume(first.resume_token)).resumable

    def bad_reducer(state: State, update: State) -> State:
        raise ValueError("cannot merge")

    b2: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(bad_reducer)
    b2.add_node("boom", boom).allow_no_outgoing_route("boom")
    r2 = await runner_for(b2.compile(), cp).start("t2", {})
    assert r2.reason == flowy.Reason.REDUCER_ERROR and isinstance(r2.error, ValueError)
    with pytest.raises(flowy.ThreadNotFoundError):
        await cp.load("t2")


async def test_named_budget_exceeded_fails_naming_it_and_persists_across_resume() -> None:
    async def spend(s: State) -> tuple[State, flowy.Directive[Any]]:
        flowy.use_budget("llm_calls", 2)
        return s, flowy.suspend("more")

    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    b.add_node("spend", spend).allow_no_outgoing_route("spend")
    cp: MemoryCheckpointer[State] = MemoryCheckpointer()
    runner = runner_for(b.compile(budgets={"llm_calls": 5}), cp)
    r = await runner.start("t", {})
    r = await runner.resume(r.resume_token)  # type: ignore[arg-type]
    assert r.budget_counts == {"llm_calls": 4}
    r = await runner.resume(r.resume_token)  # type: ignore[arg-type]
    assert r.status is flowy.RunStatus.FAILED
    assert r.reason == "budget_exceeded:llm_calls"
    snap, _ = await cp.load("t")
    assert snap.status is flowy.RunStatus.FAILED and snap.budget_counts == {"llm_calls": 6}


async def test_max_steps_per_segment() -> None:
    async def loop(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {"n": s.get("n", 0) + 1}, flowy.completed()

    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    b.add_node("a", loop).add_node("b", loop).add_edge("a", "b").add_edge("b", "a")
    r = await runner_for(b.compile(max_steps=7)).start("t", {})
    assert r.status is flowy.RunStatus.FAILED
    assert r.reason == flowy.Reason.MAX_STEPS_EXCEEDED
    assert r.state["n"] == 7 and r.step_count == 7


async def test_invariant_validator_runs_in_loop() -> None:
    def no_negative(s: State) -> None:
        if s.get("balance", 0) < 0:
            raise ValueError("balance went negative")

    async def spend(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {"balance": s["balance"] - 60}, flowy.completed()

    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    b.add_node("a", spend).add_node("b", spend).add_edge("a", "b").allow_no_outgoing_route("b")
    r = await runner_for(b.compile()).start("t", {"balance": 100}, invariant_validator=no_negative)
    assert r.reason == flowy.Reason.INVARIANT_VIOLATION
    assert r.execution_pointer == "b" and r.state["balance"] == -20
    assert isinstance(r.error, ValueError)


async def test_thread_already_running_in_process() -> None:
    gate = asyncio.Event()

    async def slow(s: State) -> tuple[State, flowy.Directive[Any]]:
        await gate.wait()
        return s, flowy.completed()

    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    b.add_node("slow", slow).allow_no_outgoing_route("slow")
    runner = runner_for(b.compile())
    handle = await runner.stream("t", {})
    with pytest.raises(flowy.ThreadAlreadyRunningError):
        await runner.start("t", {})
    gate.set()
    assert (await handle.wait_result()).status is flowy.RunStatus.COMPLETED
    with pytest.raises(flowy.ConcurrencyConflictError):  # done, and it exists now
        await runner.start("t", {})


async def test_bindings_are_typed_and_not_persisted() -> None:
    class Pool:
        pass

    pool_key: flowy.BindingKey[Pool] = flowy.BindingKey("db_pool")
    missing_key: flowy.BindingKey[int] = flowy.BindingKey("missing")
    seen: list[Pool] = []

    async def use(s: State) -> tuple[State, flowy.Directive[Any]]:
        seen.append(flowy.binding(pool_key))
        if s.get("probe_missing"):
            flowy.binding(missing_key)
        return s, flowy.suspend("x")

    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    b.add_node("use", use).allow_no_outgoing_route("use")
    cp: MemoryCheckpointer[State] = MemoryCheckpointer()
    runner = runner_for(b.compile(), cp)
    pool = Pool()
    bindings = flowy.bind(flowy.RunBindings(), pool_key, pool)
    r = await runner.start("t", {}, bindings=bindings)
    assert seen == [pool]
    snap, _ = await cp.load("t")
    assert "db_pool" not in repr(snap)
    r2 = await runner.resume(
        r.resume_token,
        bindings=bindings,  # type: ignore[arg-type]
        state_overlay={"probe_missing": True},
    )
    assert isinstance(r2.error, errors.MissingBindingError)
    assert "missing" in str(r2.error)


async def test_context_helpers_outside_runner() -> None:
    async def node(s: State) -> tuple[State, flowy.Directive[Any]]:
        flowy.use_budget("calls")
        return {"thread": flowy.run_metadata().thread_id}, flowy.completed()

    with pytest.raises(errors.NoRunContextError):
        await node({})
    with flowy.context_with_run_metadata("iso", budget_counts={"calls": 2}) as meta:
        update, directive = await node({})
        assert update == {"thread": "iso"} and meta.budget_counts == {"calls": 3}
        assert directive.kind is ftypes.DirectiveKind.COMPLETED
        assert flowy.budget_used("calls") == 3


async def test_delete_on_success_and_retention() -> None:
    cp: MemoryCheckpointer[State] = MemoryCheckpointer()
    r = await runner_for(linear_graph(4, delete_on_success=True), cp).start("t", {})
    assert r.status is flowy.RunStatus.COMPLETED and r.revision > 0
    with pytest.raises(flowy.ThreadNotFoundError):
        await cp.load("t")

    r2 = await runner_for(linear_graph(6, retention_limit=2), cp).start("t2", {})
    assert r2.status is flowy.RunStatus.COMPLETED
    assert [s.revision for s in await cp.get_history("t2")] == [r2.revision, r2.revision - 1]


async def test_in_loop_retention_failure_keeps_success_status() -> None:
    inner: MemoryCheckpointer[State] = MemoryCheckpointer()
    cp = FaultyCheckpointer(inner)
    runner = runner_for(approval_graph(retention_limit=1), cp)
    cp.arm(Phase.PRUNE)
    r = await runner.start("t", {})
    assert r.status is flowy.RunStatus.SUSPENDED
    assert r.reason == "suspend_retention_failed"
    assert isinstance(r.error, flowy.StorageUnavailableError)
    assert r.resume_token is not None
    assert (await runner.evaluate_resume(r.resume_token)).resumable


async def test_post_run_prune_failure_only_logs(caplog: pytest.LogCaptureFixture) -> None:
    cp = FaultyCheckpointer(MemoryCheckpointer[State]())
    cp.arm(Phase.PRUNE)
    r = await runner_for(linear_graph(3, retention_limit=1), cp).start("t", {})
    assert r.status is flowy.RunStatus.COMPLETED and r.reason == "completed"
    assert r.error is None
    assert cp.struck == [Phase.PRUNE]
    assert "post-run cleanup" in caplog.text


async def test_suspend_save_failure_hard_fail_and_skip_policy() -> None:
    cp = FaultyCheckpointer(MemoryCheckpointer[State]())
    cp.arm(Phase.SAVE_SUSPEND, error=lambda: flowy.StorageError("disk full"))
    r = await runner_for(approval_graph(), cp).start("t", {})
    assert r.status is flowy.RunStatus.FAILED
    assert r.reason == flowy.Reason.SUSPEND_SAVE_FAILED
    assert r.resume_token is None
    assert isinstance(r.error, flowy.StorageError) and "disk full" in str(r.error)

    # an unknown outcome (connection lost) is retried by confirmed_save and succeeds
    cp1 = FaultyCheckpointer(MemoryCheckpointer[State]())
    cp1.arm(Phase.SAVE_SUSPEND)
    r1 = await runner_for(approval_graph(), cp1).start("t", {})
    assert r1.status is flowy.RunStatus.SUSPENDED and r1.error is None
    assert cp1.struck == [Phase.SAVE_SUSPEND]

    cp2 = FaultyCheckpointer(MemoryCheckpointer[State]())
    cp2.arm(Phase.SAVE_SUSPEND, times=5)
    graph = approval_graph(checkpoint_policy=flowy.CheckpointPolicy.SKIP_ON_SAVE_ERROR)
    handle = await runner_for(graph, cp2).stream("t", {})
    events, result = await stream_helpers.collect_events_and_wait(handle)
    assert result.status is flowy.RunStatus.SUSPENDED
    assert result.reason == "suspend_checkpoint_skipped"
    assert result.resume_token is None
    assert isinstance(result.error, errors.CheckpointSkippedError)
    failed = [e for e in events if e.type is flowy.EventType.CHECKPOINT_FAILED]
    assert len(failed) == 1 and failed[0].execution_pointer == "ask"
    assert events[-1].reason == result.reason


async def test_unknown_resume_at_fails_with_reason() -> None:
    async def bad(s: State) -> tuple[State, flowy.Directive[Any]]:
        return s, flowy.suspend("x", resume_at="nowhere")

    async def bad_h(s: State) -> tuple[State, flowy.Directive[Any]]:
        return s, flowy.handoff("x", resume_at="nowhere")

    for node, reason in (
        (bad, "suspend_resume_target_invalid"),
        (bad_h, "handoff_resume_target_invalid"),
    ):
        b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
        b.add_node("n", node).allow_no_outgoing_route("n")
        r = await runner_for(b.compile()).start("t", {})
        assert r.status is flowy.RunStatus.FAILED and r.reason == reason


async def test_ambiguous_step_save_is_resolved_not_a_conflict() -> None:
    inner: MemoryCheckpointer[State] = MemoryCheckpointer()
    cp = FaultyCheckpointer(inner)
    cp.arm(Phase.SAVE_STEP, after_write=True)  # the write lands, the caller sees an error
    r = await runner_for(linear_graph(3), cp).start("t", {})
    assert r.status is flowy.RunStatus.COMPLETED and r.error is None
    revisions = [s.revision for s in await inner.get_history("t")]
    assert revisions == [3, 2, 1]  # one chain, nothing applied twice


async def test_run_without_checkpointer() -> None:
    r = await flowy.Runner(approval_graph()).start("t", {})
    assert r.status is flowy.RunStatus.SUSPENDED and r.resume_token is None
    with pytest.raises(TypeError, match="needs a store"):
        await flowy.Runner(approval_graph()).resume(flowy.ResumeToken("t", 1))


async def test_react_pattern_bounded_by_budget() -> None:
    async def reason(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {"thoughts": s.get("thoughts", 0) + 1}, flowy.completed()

    async def act(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {"tools": s.get("tools", 0) + 1}, flowy.completed()

    from flowy.patterns import build_react

    g = build_react(reason, act, lambda s: s.get("tools", 0) < 2, 8, reducer=merge).compile()
    r = await runner_for(g).start("t", {})
    assert r.status is flowy.RunStatus.COMPLETED
    assert r.state == {"thoughts": 3, "tools": 2}
    g2 = build_react(reason, act, lambda s: True, 3, reducer=merge).compile()
    r2 = await runner_for(g2).start("t", {})
    assert r2.reason == "budget_exceeded:react_iterations"


async def test_resume_of_completed_thread_is_refused_unless_targeted() -> None:
    cp: MemoryCheckpointer[State] = MemoryCheckpointer()
    runner = runner_for(linear_graph(2), cp)
    done = await runner.start("t", {})
    token = flowy.ResumeToken("t", done.revision)
    with pytest.raises(flowy.ThreadCompletedError, match="nothing to resume"):
        await runner.resume(token)
    again = await runner.resume(token, resume_target_policy=lambda s, p: (s, flowy.resume_to("n1")))
    assert again.status is flowy.RunStatus.COMPLETED
    assert again.state["visited"] == ["n0", "n1", "n1"]


@dataclasses.dataclass
class Approval:
    order_id: str
    amount: int = 0
    approved: bool = False


class ApprovalDict(TypedDict, total=False):
    order_id: str
    approved: bool


def typed_approval_graph(state_type: Any) -> flowy.Graph[Any, Any]:
    async def ask(s: Any) -> tuple[Any, flowy.Directive[Any]]:
        approved = s.approved if dataclasses.is_dataclass(s) else s.get("approved")
        return s, (flowy.completed() if approved else flowy.suspend("wait"))

    b: flowy.GraphBuilder[Any, Any] = flowy.GraphBuilder(state=state_type)
    b.add_node("ask", ask).allow_no_outgoing_route("ask")
    return b.compile()


async def test_a_mapping_overlay_merges_fields_into_a_dataclass_state() -> None:
    runner = flowy.Runner(typed_approval_graph(Approval), as_backend(MemoryCheckpointer[Any]()))
    first = await runner.start("t", Approval("o-1", 12))
    assert first.resume_token is not None
    with pytest.raises(ValueError, match=r"'aproved', not fields of Approval"):
        await runner.resume(first.resume_token, state_overlay={"aproved": True})
    done = await runner.resume(first.resume_token, state_overlay={"approved": True})
    assert done.state == Approval("o-1", 12, approved=True)


async def test_a_mapping_overlay_merges_fields_into_a_typeddict_state() -> None:
    runner = flowy.Runner(typed_approval_graph(ApprovalDict), as_backend(MemoryCheckpointer[Any]()))
    first = await runner.start("t", ApprovalDict(order_id="o-1"))
    assert first.resume_token is not None
    with pytest.raises(ValueError, match=r"'amount', not fields of ApprovalDict"):
        await runner.resume(first.resume_token, state_overlay={"amount": 3})
    done = await runner.resume(first.resume_token, state_overlay={"approved": True})
    assert done.state == {"order_id": "o-1", "approved": True}


async def test_a_typed_graph_never_receives_plain_json() -> None:
    cp: MemoryCheckpointer[Any] = MemoryCheckpointer()  # no codec: plain JSON by default
    runner = flowy.Runner(typed_approval_graph(Approval), as_backend(cp))
    first = await runner.start("t", Approval("o-1"))
    assert first.resume_token is not None
    done = await runner.resume(first.resume_token, state_overlay={"approved": True})
    assert isinstance(done.state, Approval)
    snap, _ = await runner.checkpointer.load("t")  # type: ignore[union-attr]
    assert isinstance(snap.state, Approval)
    untyped, _ = await cp.load("t")
    assert untyped.state == {"order_id": "o-1", "amount": 0, "approved": True}


class InstrumentedCheckpointer:
    """A delegating wrapper as 0.1 taught to write one: no ``codec``, no ``with_codec``."""

    def __init__(self, inner: MemoryCheckpointer[Any]) -> None:
        self.inner = inner
        self.saves = 0

    async def save(
        self,
        expected_revision: int,
        snapshot: storage.Snapshot[Any],
        *,
        lease: storage.Lease | None = None,
    ) -> int:
        self.saves += 1
        return await self.inner.save(expected_revision, snapshot, lease=lease)

    async def load(self, thread_id: str) -> tuple[storage.Snapshot[Any], int]:
        return await self.inner.load(thread_id)

    async def get_history(self, thread_id: str, limit: int = 100) -> list[storage.Snapshot[Any]]:
        return await self.inner.get_history(thread_id, limit)

    async def prune(self, thread_id: str, retain: int) -> None:
        await self.inner.prune(thread_id, retain)

    async def delete(self, thread_id: str) -> None:
        await self.inner.delete(thread_id)


class Loose(TypedDict, total=False):
    order_id: str
    approved: bool
    notes: list[dict[str, Any]]


@pytest.mark.parametrize(
    "state_type",
    [
        dict[str, Any],
        dict,
        Loose,
        ApprovalDict,
        dict[str, str | bool | list[dict[str, int]] | None],
    ],
)
async def test_a_codec_less_wrapper_runs_a_graph_whose_state_is_plain_json(
    state_type: Any,
) -> None:
    cp = InstrumentedCheckpointer(MemoryCheckpointer[Any]())
    # The same run, step for step, as on a store that decodes into the state type.
    states: list[list[Any]] = []
    for checkpointer in (cp, MemoryCheckpointer[Any]()):
        runner = flowy.Runner(typed_approval_graph(state_type), as_backend(checkpointer))  # pyright: ignore[reportArgumentType]
        first = await runner.start("t", {"order_id": "o-1", "notes": [{"n": 1}]})
        assert first.status is flowy.RunStatus.SUSPENDED and first.resume_token is not None
        done = await runner.resume(first.resume_token, state_overlay={"approved": True})
        assert done.status is flowy.RunStatus.COMPLETED
        assert done.state["approved"] is True
        states.append([first.state, done.state, (await runner.head("t"))[0].state])
    assert states[0] == states[1]
    assert cp.saves >= 2


@pytest.mark.parametrize("state_type", [Approval, dict[str, Approval], list[tuple[int, int]]])
def test_a_codec_less_wrapper_is_refused_for_a_state_plain_json_cannot_hand_back(
    state_type: Any,
) -> None:
    cp = InstrumentedCheckpointer(MemoryCheckpointer[Any]())
    with pytest.raises(TypeError, match="would hand this graph plain JSON"):
        flowy.Runner(typed_approval_graph(state_type), as_backend(cp))  # pyright: ignore[reportArgumentType]


async def test_head_is_the_typed_latest_snapshot_and_its_token() -> None:
    runner = flowy.Runner(typed_approval_graph(Approval), as_backend(MemoryCheckpointer[Any]()))
    first = await runner.start("t", Approval("o-1"))
    snap, token = await runner.head("t")
    assert isinstance(snap.state, Approval)
    assert token == first.resume_token
    assert (await runner.evaluate_resume(token)).kind is flowy.ResumeDecisionKind.RESUMABLE
    with pytest.raises(flowy.ThreadNotFoundError):
        await runner.head("missing")
    with pytest.raises(errors.InvalidThreadIdError):
        await runner.head("")
    with pytest.raises(TypeError, match="no checkpointer"):
        await flowy.Runner(typed_approval_graph(Approval)).head("t")


async def test_a_record_that_does_not_fit_the_state_type_names_the_field() -> None:
    cp: MemoryCheckpointer[Any] = MemoryCheckpointer()
    await cp.save(0, storage.Snapshot("t", {"order_id": "o", "amount": "many"}, "ask"))
    runner = flowy.Runner(typed_approval_graph(Approval), as_backend(cp))
    with pytest.raises(errors.SnapshotEnvelopeInvalidError, match=r"state\.amount: expected int"):
        await runner.evaluate_resume(flowy.ResumeToken("t", 1))


def test_printed_resume_tokens_parse_back() -> None:
    token = flowy.ResumeToken("order@7:x", 12)
    assert str(token) == "order@7:x@12"
    assert flowy.ResumeToken.parse(str(token)) == token
    for bad in ("no-revision", "@3", "t@", "t@0", "t@-1", "t@1.5", "t@12x", "t@" + "9" * 30):
        with pytest.raises(ValueError):
            flowy.ResumeToken.parse(bad)


class _Interrupted(BaseException):
    """Something that is not an ``Exception`` (a signal, a cancel of the whole process)."""


async def test_an_interrupted_lease_release_does_not_leave_the_thread_marked_running() -> None:
    from flowy.memory import MemoryBackend

    backend: MemoryBackend[State] = MemoryBackend()
    release = backend.leases.release
    interrupted = []

    async def interrupted_release(lease: Any) -> None:
        if not interrupted:
            interrupted.append(lease)
            raise _Interrupted("interrupted while letting go of the lease")
        await release(lease)

    backend.leases.release = interrupted_release  # type: ignore[method-assign]
    runner = flowy.Runner(approval_graph(), backend, run_lease=("me", 30.0))
    with pytest.raises(_Interrupted):
        await runner.start("t", {})
    await release(interrupted[0])  # the lease runs out
    head, token = await runner.head("t")
    assert head.status is flowy.RunStatus.SUSPENDED
    # This process may run the thread again: it is not still marked as running.
    result = await runner.resume(token, state_overlay={"approved": True})
    assert result.status is not flowy.RunStatus.SUSPENDED
