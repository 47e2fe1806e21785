"""Live progress from inside a node (``flowy.live.progress``) on a run's own stream, and
what ``Backend.watch`` checks before it follows a thread (``flowy/live.py``,
``storage/_watch.py``). What watch yields on each store is the ``WatchSuite``'s."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from core_graphs import State, merge

import flowy
from flowy import errors, live
from flowy.storage import RunStatus

pytestmark = pytest.mark.anyio


def talking_graph(tokens: list[Any], **kw: Any) -> flowy.Graph[State, Any]:
    """``talk`` sends each of ``tokens`` as progress, then ``end`` completes."""

    async def talk(s: State) -> tuple[State, flowy.Directive[Any]]:
        for token in tokens:
            live.progress(token)
        return {"said": len(tokens)}, flowy.completed()

    async def end(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {"ended": True}, flowy.completed()

    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    b.add_node("talk", talk).add_node("end", end).add_edge("talk", "end")
    b.allow_no_outgoing_route("end")
    return b.compile(**kw)


async def test_progress_reaches_the_run_stream_in_order_between_node_events() -> None:
    async with await flowy.connect("memory://") as backend:
        runner = flowy.Runner(talking_graph(["a", {"n": 1}, [2]]), store=backend)
        handle = await runner.stream("t", {})
        collected = await handle.collect()
    kinds = [(e.type, e.node, e.data) for e in collected.events]
    assert kinds[:5] == [
        (flowy.EventType.NODE_STARTED, "talk", None),
        (flowy.EventType.PROGRESS, "talk", "a"),
        (flowy.EventType.PROGRESS, "talk", {"n": 1}),
        (flowy.EventType.PROGRESS, "talk", [2]),
        (flowy.EventType.NODE_COMPLETED, "talk", None),
    ]
    assert collected.outcome.status is RunStatus.COMPLETED
    assert not any(e.terminal for e in collected.events if e.type is flowy.EventType.PROGRESS)


async def test_progress_is_never_saved() -> None:
    async with await flowy.connect("memory://") as backend:
        runner = flowy.Runner(talking_graph(["secret-token"], save_every_step=True), store=backend)
        await runner.start("t", {})
        history = await backend.checkpointer.get_history("t")
    assert history and all("secret-token" not in repr(s) for s in history)


async def test_progress_is_dropped_first_when_the_stream_consumer_falls_behind() -> None:
    async with await flowy.connect("memory://") as backend:
        runner = flowy.Runner(talking_graph(list(range(50))), store=backend)
        handle = await runner.stream("t", {}, max_buffer=8)
        outcome = await handle.wait_result()  # nobody reads while the run goes
        events = [event async for event in handle]
    assert outcome.status is RunStatus.COMPLETED
    assert handle.dropped_events > 0
    assert len(events) == 8
    # The node events and the terminal one survive; the oldest progress went first.
    types = [e.type for e in events]
    assert types[-1] is flowy.EventType.COMPLETED
    assert flowy.EventType.NODE_STARTED in types
    progress = [e.data for e in events if e.type is flowy.EventType.PROGRESS]
    assert progress == sorted(progress) and (not progress or progress[-1] == 49)


async def test_progress_outside_a_node_is_a_clear_error() -> None:
    with pytest.raises(errors.NoRunContextError, match="only available inside a running node"):
        live.progress("x")


async def test_progress_that_is_not_json_fails_the_node_when_someone_may_listen() -> None:
    async with await flowy.connect("memory://") as backend:
        runner = flowy.Runner(talking_graph([object()]), store=backend)
        result = await runner.start("t", {})
    assert result.status is RunStatus.FAILED
    assert isinstance(result.error, TypeError)
    assert "progress data must be a JSON value" in str(result.error)


async def test_progress_over_the_limit_is_refused() -> None:
    async with await flowy.connect("memory://") as backend:
        runner = flowy.Runner(talking_graph(["x" * live.MAX_PROGRESS_BYTES]), store=backend)
        result = await runner.start("t", {})
    assert result.status is RunStatus.FAILED
    assert isinstance(result.error, ValueError)
    assert f"the limit is {live.MAX_PROGRESS_BYTES} bytes" in str(result.error)


async def test_progress_without_a_store_goes_to_the_stream_only() -> None:
    runner = flowy.Runner(talking_graph(["a", "b"]))
    collected = await (await runner.stream("t", {})).collect()
    assert [e.data for e in collected.events if e.type is flowy.EventType.PROGRESS] == ["a", "b"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"after": -1}, "after must be a revision"),
        ({"after": "3"}, "after must be a revision"),
        ({"after": True}, "after must be a revision"),
        ({"poll": 0}, "poll must be a positive number"),
        ({"poll": float("nan")}, "poll must be a positive number"),
    ],
)
async def test_watch_refuses_bad_arguments(kwargs: dict[str, Any], message: str) -> None:
    async with await flowy.connect("memory://") as backend:
        with pytest.raises(ValueError, match=message):
            async for _ in backend.watch("t", **kwargs):
                pass
        with pytest.raises(errors.InvalidThreadIdError):
            async for _ in backend.watch(""):
                pass


async def test_a_stray_message_on_the_channel_is_ignored() -> None:
    async with await flowy.connect("memory://") as backend:
        runner = flowy.Runner(talking_graph(["a"], save_every_step=True), store=backend)
        seen: list[Any] = []

        async def follow() -> None:
            async for event in backend.watch("t", poll=0.05):
                seen.append((event.kind, event.data))

        task = asyncio.ensure_future(follow())
        await asyncio.sleep(0.05)
        await cast(Any, backend)._publish("t", [b"not json", b'{"n": 1}'])
        await runner.start("t", {})
        await asyncio.wait_for(task, 10)
    assert ("progress", "a") in seen
    assert seen[-1][0] == "snapshot"


async def test_a_channel_that_falls_behind_drops_the_oldest_and_counts_them() -> None:
    # 2000 events sent without a pause: the backend queues at most 1024 for its channel.
    async with await flowy.connect("memory://") as backend:
        runner = flowy.Runner(talking_graph(list(range(2000))), store=backend)
        seen: list[Any] = []

        async def follow() -> None:
            async for event in backend.watch("t", after=0, poll=0.05):
                if event.kind == "progress":
                    seen.append(event.data)

        task = asyncio.ensure_future(follow())
        await asyncio.sleep(0.05)
        result = await runner.start("t", {})
        await asyncio.wait_for(task, 10)
        dropped = cast(Any, backend).progress_dropped
    assert result.status is RunStatus.COMPLETED
    assert dropped == 2000 - 1024
    assert seen == list(range(dropped, 2000))  # the newest kept, in order


async def test_progress_costs_a_lookup_when_no_one_can_listen(tmp_path: Any) -> None:
    # SQLite has no channel: with no watcher in the process, nothing is encoded or sent,
    # so even a value that is not JSON passes unnoticed (it would fail a watcher).
    async with await flowy.connect(f"sqlite:///{tmp_path / 'quiet.db'}") as backend:
        assert backend.capabilities.live_progress is False
        result = await flowy.Runner(talking_graph([object()]), store=backend).start("t", {})
    assert result.status is RunStatus.COMPLETED


async def test_loose_components_carry_progress_to_watchers_in_their_process() -> None:
    from flowy.memory import MemoryCheckpointer
    from flowy.storage import as_backend

    store = as_backend(MemoryCheckpointer[Any]())
    assert store.capabilities.live_progress is False
    runner = flowy.Runner(talking_graph(["a", "b"], save_every_step=True), store=store)
    seen: list[Any] = []

    async def follow() -> None:
        async for event in store.watch("t", after=0, poll=0.05):
            seen.append(event.data if event.kind == "progress" else event.revision)

    task = asyncio.ensure_future(follow())
    await asyncio.sleep(0.05)
    await runner.start("t", {})
    await asyncio.wait_for(task, 10)
    assert seen == ["a", "b", 1, 2]
