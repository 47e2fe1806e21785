"""Watch contract tests: ``Backend.watch`` yields every saved snapshot of a thread in
order and without gaps (status changes, effects, hand-offs, completion), resumes from
``after=``, ends when the thread completes or fails, and carries the progress of the
run: from another connection to the store where the store has a channel
(``live_progress``), from a run in the same process everywhere.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

from ... import live
from ..._directives import Directive, completed, effect, fail, handoff, suspend
from ..._graph import Graph, GraphBuilder
from ..._runner import Runner
from ...storage import Backend, RunStatus
from ...storage._watch import WatchEvent
from ._support import Suite, new_thread_id, peer_of, require_capability

__all__ = ["WatchSuite"]

State = dict[str, Any]
TIMEOUT = 30.0
"""Seconds a watch may take to see what a run did (a loaded machine is slow)."""
POLL = 0.05


def _merge(state: State, update: State) -> State:
    return {**state, **update}


def _steps(count: int, last: Callable[[], Directive[Any]] = completed) -> Graph[State, Any]:
    """``count`` nodes saved after each step; the last returns ``last()``."""
    b: GraphBuilder[State, Any] = GraphBuilder(_merge)
    names = [f"s{i}" for i in range(count)]
    for index, name in enumerate(names):

        async def node(s: State, _i: int = index) -> tuple[State, Directive[Any]]:
            done = {"done": [*s.get("done", []), _i]}
            return done, (last() if _i == count - 1 else completed())

        b.add_node(name, node)
    for a, c in itertools.pairwise(names):
        b.add_edge(a, c)
    b.allow_no_outgoing_route(names[-1])
    return b.compile(save_every_step=True)


def _talking(gate: asyncio.Event, tokens: list[str]) -> Graph[State, Any]:
    """``first`` saves; ``talk`` waits for ``gate``, sends ``tokens``, completes."""

    async def first(s: State) -> tuple[State, Directive[Any]]:
        return {"first": True}, completed()

    async def talk(s: State) -> tuple[State, Directive[Any]]:
        await gate.wait()
        for token in tokens:
            live.progress(token)
        return {"said": len(tokens)}, completed()

    b: GraphBuilder[State, Any] = GraphBuilder(_merge)
    b.add_node("first", first).add_node("talk", talk).add_edge("first", "talk")
    b.allow_no_outgoing_route("talk")
    return b.compile(save_every_step=True)


def _approval() -> Graph[State, Any]:
    """``ask`` suspends with an effect until approved; ``act`` hands off once."""

    async def ask(s: State) -> tuple[State, Directive[Any]]:
        if s.get("approved"):
            return {}, completed()
        return {}, effect(suspend("awaiting_approval"), {"kind": "approval"})

    async def act(s: State) -> tuple[State, Directive[Any]]:
        if not s.get("background"):
            return {"background": True}, handoff("to_worker")
        return {"acted": True}, completed()

    b: GraphBuilder[State, Any] = GraphBuilder(_merge)
    b.add_node("ask", ask).add_node("act", act).add_edge("ask", "act")
    b.allow_no_outgoing_route("act")
    return b.compile()


async def _collect(
    backend: Backend[Any],
    thread_id: str,
    *,
    after: int | None = None,
    on_event: Callable[[WatchEvent[Any]], None] | None = None,
) -> list[WatchEvent[Any]]:
    events: list[WatchEvent[Any]] = []
    async for event in backend.watch(thread_id, after=after, poll=POLL):
        events.append(event)
        if on_event is not None:
            on_event(event)
    return events


def _revisions(events: list[WatchEvent[Any]]) -> list[int]:
    return [e.revision for e in events if e.kind == "snapshot"]


class WatchSuite(Suite):
    """``watch``: every snapshot in order, ``after=``, the end, and progress."""

    async def test_every_snapshot_in_order_then_the_end(self, flowy_backend: Backend[Any]) -> None:
        thread_id = new_thread_id("watch-order")
        # after=0: from the first snapshot (the thread does not exist yet: it waits).
        watching = asyncio.ensure_future(_collect(flowy_backend, thread_id, after=0))
        await asyncio.sleep(POLL)
        result = await Runner(_steps(5), store=flowy_backend).start(thread_id, {})
        events = await asyncio.wait_for(watching, TIMEOUT)
        assert _revisions(events) == list(range(1, result.revision + 1))
        assert [e.snapshot.state["done"] for e in events if e.snapshot] == [
            list(range(i + 1)) for i in range(5)
        ]
        assert events[-1].terminal and events[-1].snapshot is not None
        assert events[-1].snapshot.status is RunStatus.COMPLETED
        assert not any(e.terminal for e in events[:-1])

    async def test_a_watch_from_another_connection_sees_the_same(
        self, flowy_backend: Backend[Any]
    ) -> None:
        thread_id = new_thread_id("watch-peer")
        async with peer_of(flowy_backend) as peer:
            watching = asyncio.ensure_future(_collect(peer, thread_id, after=0))
            await asyncio.sleep(POLL)
            result = await Runner(_steps(3), store=flowy_backend).start(thread_id, {})
            events = await asyncio.wait_for(watching, TIMEOUT)
        assert _revisions(events) == list(range(1, result.revision + 1))

    async def test_after_resumes_without_gaps(self, flowy_backend: Backend[Any]) -> None:
        thread_id = new_thread_id("watch-after")
        result = await Runner(_steps(6), store=flowy_backend).start(thread_id, {})
        assert result.revision == 6
        resumed = await asyncio.wait_for(_collect(flowy_backend, thread_id, after=2), TIMEOUT)
        assert _revisions(resumed) == [3, 4, 5, 6]
        whole = await asyncio.wait_for(_collect(flowy_backend, thread_id, after=0), TIMEOUT)
        assert _revisions(whole) == [1, 2, 3, 4, 5, 6]
        head = await asyncio.wait_for(_collect(flowy_backend, thread_id), TIMEOUT)
        assert _revisions(head) == [6]  # after=None: from the current head
        # After the last revision of a finished thread: nothing more will come.
        assert await asyncio.wait_for(_collect(flowy_backend, thread_id, after=6), TIMEOUT) == []
        assert await asyncio.wait_for(_collect(flowy_backend, thread_id, after=9), TIMEOUT) == []

    async def test_a_failed_run_ends_the_watch(self, flowy_backend: Backend[Any]) -> None:
        thread_id = new_thread_id("watch-fail")
        graph = _steps(2, last=lambda: fail("broken"))
        result = await Runner(graph, store=flowy_backend).start(thread_id, {})
        assert result.status is RunStatus.FAILED
        events = await asyncio.wait_for(_collect(flowy_backend, thread_id, after=0), TIMEOUT)
        assert events[-1].terminal and events[-1].snapshot is not None
        assert events[-1].snapshot.status is RunStatus.FAILED

    async def test_suspension_and_hand_off_do_not_end_it(self, flowy_backend: Backend[Any]) -> None:
        thread_id = new_thread_id("watch-pause")
        runner = Runner(_approval(), store=flowy_backend)
        statuses: list[RunStatus] = []
        watching = asyncio.ensure_future(
            _collect(
                flowy_backend,
                thread_id,
                after=0,
                on_event=lambda e: statuses.append(e.snapshot.status) if e.snapshot else None,
            )
        )
        suspended = await runner.start(thread_id, {})
        assert suspended.status is RunStatus.SUSPENDED and suspended.resume_token is not None
        await _until(lambda: RunStatus.SUSPENDED in statuses)
        handed = await runner.resume(suspended.resume_token, state_overlay={"approved": True})
        assert handed.status is RunStatus.HANDOFF and handed.resume_token is not None
        await _until(lambda: RunStatus.HANDOFF in statuses)
        assert not watching.done()
        done = await runner.resume(handed.resume_token)
        assert done.status is RunStatus.COMPLETED
        events = await asyncio.wait_for(watching, TIMEOUT)
        snapshots = [e.snapshot for e in events if e.snapshot is not None]
        parked = [s.status for s in snapshots if s.status is not RunStatus.RUNNING]
        assert parked == [RunStatus.SUSPENDED, RunStatus.HANDOFF, RunStatus.COMPLETED]
        assert snapshots[0].effects == ({"kind": "approval"},)
        assert _revisions(events) == list(range(1, done.revision + 1))

    async def test_a_deleted_thread_ends_the_watch(self, flowy_backend: Backend[Any]) -> None:
        thread_id = new_thread_id("watch-delete")
        suspended = await Runner(_approval(), store=flowy_backend).start(thread_id, {})
        seen: list[WatchEvent[Any]] = []
        watching = asyncio.ensure_future(_collect(flowy_backend, thread_id, on_event=seen.append))
        await _until(lambda: bool(seen))
        await flowy_backend.checkpointer.delete(thread_id)
        events = await asyncio.wait_for(watching, TIMEOUT)
        assert _revisions(events) == [suspended.revision]

    async def test_progress_of_a_run_in_this_process(self, flowy_backend: Backend[Any]) -> None:
        await self._progress(flowy_backend, flowy_backend)

    async def test_progress_reaches_a_watcher_on_another_connection(
        self, flowy_backend: Backend[Any]
    ) -> None:
        require_capability(flowy_backend, "live_progress")
        async with peer_of(flowy_backend) as peer:
            await self._progress(flowy_backend, peer)

    async def _progress(self, runs_on: Backend[Any], watcher: Backend[Any]) -> None:
        thread_id = new_thread_id("watch-progress")
        gate = asyncio.Event()
        tokens = [f"token-{i}" for i in range(20)]

        def on_event(event: WatchEvent[Any]) -> None:
            if event.kind == "snapshot":
                gate.set()  # the watcher listens: let the node talk

        watching = asyncio.ensure_future(_collect(watcher, thread_id, after=0, on_event=on_event))
        result = await Runner(_talking(gate, tokens), store=runs_on).start(thread_id, {})
        assert result.status is RunStatus.COMPLETED
        events = await asyncio.wait_for(watching, TIMEOUT)
        kinds = [(e.kind, e.revision if e.kind == "snapshot" else e.data) for e in events]
        assert kinds == [
            ("snapshot", 1),
            *(("progress", token) for token in tokens),
            ("snapshot", 2),
        ]
        assert {e.node for e in events if e.kind == "progress"} == {"talk"}


async def _until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(TIMEOUT):
        while not condition():  # noqa: ASYNC110 - the condition is another task's list
            await asyncio.sleep(0.01)
