"""Runner-level contracts of branching history and evolving graphs on a real store:
forks that copy a revision (never the parent's inbox) and leave their parent alone,
``resume_from`` that always forks, and graph versions that fail closed unless a declared
migration covers them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ..._directives import Directive, completed, end, handoff, suspend, wait_for
from ..._errors import ConcurrencyConflictError, GraphVersionMismatchError, ThreadNotFoundError
from ..._graph import Graph, GraphBuilder
from ..._results import ResumeDecisionKind
from ..._runner import Runner
from ..._worker import Worker
from ...storage import Backend, RunStatus
from ._durable import require_durable
from ._support import Suite, history_revisions, new_thread_id, require_capability

__all__ = ["ForkSuite", "VersionSuite"]

State = dict[str, Any]


def _merge(state: State, update: State) -> State:
    return {**state, **update}


def _review_graph(
    version: str,
    *,
    review: str = "review",
    extend: Callable[[GraphBuilder[State, Any]], Any] | None = None,
) -> Graph[State, Any]:
    """Draft → ``review`` (suspends until ``approved``) → publish."""

    async def draft(s: State) -> tuple[State, Directive[Any]]:
        return {"drafts": s.get("drafts", 0) + 1}, completed()

    async def review_node(s: State) -> tuple[State, Directive[Any]]:
        if not s.get("approved"):
            return {}, suspend("needs_review")
        return {}, completed()

    async def publish(s: State) -> tuple[State, Directive[Any]]:
        return {"published_by": version}, end()

    builder: GraphBuilder[State, Any] = GraphBuilder(_merge)
    builder.add_node("draft", draft).add_node(review, review_node).add_node("publish", publish)
    builder.add_edge("draft", review).add_edge(review, "publish")
    builder.allow_no_outgoing_route("publish")
    if extend is not None:
        extend(builder)
    return builder.compile(version=version)


def _approval_graph() -> Graph[State, Any]:
    """Ask (wait for the signal "approval"), then decide on its answer."""

    async def ask(s: State) -> tuple[State, Directive[Any]]:
        return {}, wait_for("approval", resume_at="decide")

    async def decide(s: State) -> tuple[State, Directive[Any]]:
        return {"decided": s.get("answer")}, end()

    builder: GraphBuilder[State, Any] = GraphBuilder(_merge)
    builder.add_node("ask", ask).add_node("decide", decide).add_edge("ask", "decide")
    return builder.allow_no_outgoing_route("decide").compile(version="approvals")


async def _suspended(backend: Backend[Any], graph: Graph[State, Any], label: str) -> str:
    tid = new_thread_id(label)
    result = await Runner(graph, backend).start(tid, {"topic": label})
    assert result.status is RunStatus.SUSPENDED, result
    return tid


class ForkSuite(Suite):
    """``fork`` copies one revision into a new thread with its lineage and an inbox of
    its own; the parent's head and history never change; ``resume_from`` always forks."""

    async def test_a_fork_copies_a_revision_and_leaves_the_parent(
        self, flowy_backend: Backend[Any]
    ) -> None:
        graph = _review_graph("v1")
        runner = Runner(graph, flowy_backend)
        parent = await _suspended(flowy_backend, graph, "parent")
        before = await history_revisions(flowy_backend.checkpointer, parent)
        head_before, _ = await runner.head(parent)
        child = new_thread_id("child")
        token = await runner.fork(
            parent, at_revision=1, new_thread_id=child, state_overlay={"topic": "what if"}
        )
        assert (token.thread_id, token.snapshot_revision) == (child, 1)
        fork, _ = await runner.head(child)
        assert (fork.parent_thread_id, fork.parent_revision) == (parent, 1)
        assert (fork.status, fork.reason, fork.graph_version) == (
            RunStatus.SUSPENDED,
            "forked",
            "v1",
        )
        assert fork.state == {"topic": "what if", "drafts": 1}
        assert fork.execution_pointer == "review"
        assert await history_revisions(flowy_backend.checkpointer, parent) == before
        head_after, _ = await runner.head(parent)
        assert head_after == head_before
        done = await runner.resume(token, state_overlay={"approved": True})
        assert done.status is RunStatus.COMPLETED and done.state["topic"] == "what if"
        head, _ = await runner.head(child)
        assert (head.parent_thread_id, head.parent_revision) == (parent, 1)  # kept
        assert (await runner.head(parent))[0] == head_before

    async def test_a_fork_can_resume_elsewhere(self, flowy_backend: Backend[Any]) -> None:
        graph = _review_graph("v1")
        runner = Runner(graph, flowy_backend)
        parent = await _suspended(flowy_backend, graph, "elsewhere")
        child = new_thread_id("redo")
        token = await runner.fork(parent, at_revision=2, new_thread_id=child, resume_at="draft")
        result = await runner.resume(token)
        assert result.status is RunStatus.SUSPENDED and result.state["drafts"] == 2

    async def test_forks_that_cannot_be_made(self, flowy_backend: Backend[Any]) -> None:
        graph = _review_graph("v1")
        runner = Runner(graph, flowy_backend)
        parent = await _suspended(flowy_backend, graph, "refused")
        other = await _suspended(flowy_backend, graph, "taken")
        with pytest.raises(ThreadNotFoundError, match="revision 9"):
            await runner.fork(parent, at_revision=9, new_thread_id=new_thread_id("x"))
        with pytest.raises(ThreadNotFoundError):
            await runner.fork(new_thread_id("ghost"), at_revision=1, new_thread_id="y-1")
        with pytest.raises(ConcurrencyConflictError):
            await runner.fork(parent, at_revision=1, new_thread_id=other)
        with pytest.raises(ValueError):
            await runner.fork(parent, at_revision=0, new_thread_id=new_thread_id("z"))
        from ..._errors import UnknownNodeError

        with pytest.raises(UnknownNodeError):
            await runner.fork(
                parent, at_revision=1, new_thread_id=new_thread_id("w"), resume_at="nowhere"
            )
        assert (await runner.head(other))[0].parent_thread_id == ""

    async def test_a_fork_starts_with_an_inbox_of_its_own(
        self, flowy_backend: Backend[Any]
    ) -> None:
        """A fork neither sees its parent's signals nor keeps its cursors: its signals are
        numbered from 1 (the parent's signal ids are new to it) and it waits for its own."""
        require_capability(flowy_backend, "durable_timers_signals")
        graph = _approval_graph()
        runner = Runner(graph, flowy_backend)
        worker = Worker(runner, lease_ttl=5.0, timer_interval=0.05, retry_delay=0.05)
        parent = new_thread_id("inbox-parent")
        await runner.start(parent, {})
        await runner.signal(parent, "approval", {"answer": "parent"}, signal_id="hook-1")
        await worker.run_until_idle(0.1)
        head, token = await runner.head(parent)
        assert head.status is RunStatus.COMPLETED and head.state["decided"] == "parent"
        assert dict(head.signal_cursors) == {"approval": 1}
        child = new_thread_id("inbox-child")
        fork_token = await runner.fork(
            parent, at_revision=token.snapshot_revision, new_thread_id=child, resume_at="ask"
        )
        durable = require_durable(flowy_backend)
        assert await durable.signals(child) == []
        fork, _ = await runner.head(child)
        assert dict(fork.signal_cursors) == {}
        waiting = await runner.resume(fork_token)
        assert waiting.status is RunStatus.WAITING, waiting  # the parent's signal is not its
        stored = await runner.signal(child, "approval", {"answer": "fork"}, signal_id="hook-1")
        assert (stored.seq, stored.payload) == (1, {"answer": "fork"})
        await worker.run_until_idle(0.1)
        head, _ = await runner.head(child)
        assert head.status is RunStatus.COMPLETED and head.state["decided"] == "fork"
        assert dict(head.signal_cursors) == {"approval": 1}
        assert [(s.seq, s.payload) for s in await durable.signals(parent)] == [
            (1, {"answer": "parent"})
        ]

    async def test_resume_from_forks_and_never_rewrites(self, flowy_backend: Backend[Any]) -> None:
        graph = _review_graph("v1")
        runner = Runner(graph, flowy_backend)
        parent = await _suspended(flowy_backend, graph, "travel")
        before = await history_revisions(flowy_backend.checkpointer, parent)
        result = await runner.resume_from(parent, 1, state_overlay={"approved": True})
        assert result.thread_id != parent and result.thread_id.startswith(f"{parent}~")
        assert result.status is RunStatus.COMPLETED
        assert await history_revisions(flowy_backend.checkpointer, parent) == before
        head, _ = await runner.head(result.thread_id)
        assert (head.parent_thread_id, head.parent_revision) == (parent, 1)


class VersionSuite(Suite):
    """Every snapshot names its graph version; a thread saved by another version is
    resumed, recovered or forked only through declared migrations, else refused with
    nothing written."""

    async def test_snapshots_name_the_graph_version(self, flowy_backend: Backend[Any]) -> None:
        graph = _review_graph("v1")
        tid = await _suspended(flowy_backend, graph, "named")
        for snap in await flowy_backend.checkpointer.get_history(tid):
            assert snap.graph_version == "v1"
        summaries = [
            s for s in await flowy_backend.checkpointer.list_threads(limit=10_000)
            if s.thread_id == tid
        ]  # fmt: skip
        assert [s.graph_version for s in summaries] == ["v1"]

    async def test_another_version_fails_closed(self, flowy_backend: Backend[Any]) -> None:
        tid = await _suspended(flowy_backend, _review_graph("v1"), "closed")
        renamed = Runner(_review_graph("v2", review="approve"), flowy_backend)
        before, token = await renamed.head(tid)
        decision = await renamed.evaluate_resume(token)
        assert decision.kind is ResumeDecisionKind.VERSION_MISMATCH
        with pytest.raises(GraphVersionMismatchError) as info:
            await renamed.resume(token, state_overlay={"approved": True})
        assert (info.value.stored, info.value.current) == ("v1", "v2")
        assert "'v1'" in str(info.value) and "'v2'" in str(info.value)
        with pytest.raises(GraphVersionMismatchError):
            await renamed.fork(tid, at_revision=1, new_thread_id=new_thread_id("nope"))
        after, _ = await renamed.head(tid)
        assert after == before  # nothing ran, nothing was written

    async def test_a_rename_and_a_migration_chain(self, flowy_backend: Backend[Any]) -> None:
        tid = await _suspended(flowy_backend, _review_graph("v1"), "chain")

        def v1_to_v2(state: State, pointer: str) -> tuple[State, str]:
            return {**state, "topic": state["topic"].upper()}, pointer

        def declare(builder: GraphBuilder[State, Any]) -> None:
            builder.add_migration("v1", v1_to_v2, to_version="v2")
            builder.rename_node("review", "approve", from_version="v2")

        v3 = Runner(_review_graph("v3", review="approve", extend=declare), flowy_backend)
        _, token = await v3.head(tid)
        assert (await v3.evaluate_resume(token)).kind is ResumeDecisionKind.RESUMABLE
        result = await v3.resume(token, state_overlay={"approved": True})
        assert result.status is RunStatus.COMPLETED, result
        assert result.state["topic"] == tid.split("-")[1].upper()
        assert result.state["published_by"] == "v3"
        head, _ = await v3.head(tid)
        assert head.graph_version == "v3"
        versions = [s.graph_version for s in await flowy_backend.checkpointer.get_history(tid)]
        assert versions[0] == "v3" and versions[-1] == "v1"  # history keeps what was saved

    async def test_a_worker_of_another_version_leaves_the_hand_off(
        self, flowy_backend: Backend[Any]
    ) -> None:
        def graph(version: str) -> Graph[State, Any]:
            async def hand(s: State) -> tuple[State, Directive[Any]]:
                return {}, handoff("to_worker", resume_at="publish")

            async def publish(s: State) -> tuple[State, Directive[Any]]:
                return {"published_by": version}, end()

            builder: GraphBuilder[State, Any] = GraphBuilder(_merge)
            builder.add_node("hand", hand).add_node("publish", publish)
            builder.add_edge("hand", "publish").allow_no_outgoing_route("publish")
            return builder.compile(version=version)

        new = Runner(graph("v2"), flowy_backend)
        tid = new_thread_id("rolling")
        result = await new.start(tid, {})
        assert result.status is RunStatus.HANDOFF
        failures: list[str] = []
        old_worker = Worker(
            Runner(graph("v1"), flowy_backend),
            on_failure=lambda failure: failures.append(failure.error),
            retry_delay=0.0,
        )
        assert (
            await old_worker.process((await flowy_backend.consumer.claim(1, 30, wait=2.0))[0])
            is not None
        )
        assert failures and "GraphVersionMismatchError" in failures[0]
        head, _ = await new.head(tid)
        assert head.status is RunStatus.HANDOFF  # left for a worker of its version
        await Worker(new).run_until_idle(0.2)
        head, _ = await new.head(tid)
        assert head.status is RunStatus.COMPLETED and head.state["published_by"] == "v2"
