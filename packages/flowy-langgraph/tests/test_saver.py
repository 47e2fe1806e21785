"""FlowySaver's own contracts, beyond LangGraph's conformance suite: bad input, fencing
of one out-of-date writer, ``keep_last`` retention, the sync methods, and a real
``StateGraph`` resuming from the store."""

from __future__ import annotations

import asyncio
import operator
import uuid
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from lg_support import STORES, chain, checkpoint, config

import flowy
from flowy.errors import ConcurrencyConflictError
from flowy.storage import JSONCodec
from flowy_langgraph import FlowySaver, ThreadForkedError
from flowy_langgraph._saver import _address, _writes_address  # pyright: ignore[reportPrivateUsage]

pytestmark = pytest.mark.anyio


async def stored_writes(saver: FlowySaver, thread: str, ids: list[str]) -> list[int]:
    """How many pending writes the store holds for each of ``ids`` (of the root
    namespace of ``thread``), read from the store itself."""
    store: Any = saver.backend.checkpointer
    address = _address(thread, "")
    return [len(await store.journal(_writes_address(address, i))) for i in ids]


async def test_a_store_opened_with_a_typed_codec_is_refused() -> None:
    async with flowy.connect("memory://", codec=JSONCodec(Counter)) as backend:
        with pytest.raises(TypeError, match="stores plain JSON states"):
            FlowySaver(backend)
    async with flowy.connect("memory://", codec=JSONCodec()) as backend:
        FlowySaver(backend)


async def test_bad_arguments_are_one_line_errors() -> None:
    async with flowy.connect("memory://") as backend:
        for bad in (0, -1, True, 2.5, "3"):
            with pytest.raises(ValueError, match="keep_last must be an int >= 1"):
                FlowySaver(backend, keep_last=bad)  # type: ignore[arg-type]
        saver = FlowySaver(backend)
        with pytest.raises(ValueError, match="no configurable thread_id"):
            await saver.aget_tuple({"configurable": {}})
        with pytest.raises(ValueError, match="needs the config of a stored checkpoint"):
            await saver.aput_writes(config("t"), [("ch", 1)], "task")
        with pytest.raises(ValueError, match="unknown prune strategy 'oldest'"):
            await saver.aprune(["t"], strategy="oldest")


@pytest.mark.parametrize("store_url", STORES, indirect=True)
async def test_fenced_refuses_a_stale_parent_and_stores_nothing(store_url: str) -> None:
    async with FlowySaver.from_url(store_url, fenced=True) as saver:
        first, second = await chain(saver, "t", 2)
        with pytest.raises(ThreadForkedError, match=f"its latest is '{second}'") as caught:
            await saver.aput(config("t", first), checkpoint(9), {"step": 9}, {})
        assert isinstance(caught.value, ConcurrencyConflictError)
        with pytest.raises(ThreadForkedError, match="its latest is"):
            await saver.aput(config("t"), checkpoint(9), {"step": 9}, {})  # no parent
        assert [t.checkpoint["id"] async for t in saver.alist(config("t"))] == [second, first]
        # A new thread starts without a parent; the next checkpoint follows the latest.
        await saver.aput(config("u"), checkpoint(0), {}, {})
        await saver.aput(config("t", second), checkpoint(3), {"step": 3}, {})


@pytest.mark.parametrize("store_url", STORES, indirect=True)
async def test_prune_and_delete_thread_remove_the_writes_too(store_url: str) -> None:
    async with FlowySaver.from_url(store_url) as saver:
        ids = await chain(saver, "t", 4, writes=True)
        assert await stored_writes(saver, "t", ids) == [2, 2, 2, 2]
        await saver.aprune(["t"], strategy="keep_latest")
        assert await stored_writes(saver, "t", ids) == [0, 0, 0, 2]
        latest = await saver.aget_tuple(config("t"))
        assert latest is not None
        assert latest.pending_writes == [("task-3", "ch", 3), ("task-3", "other", "x")]
        await saver.adelete_thread("t")
        assert await stored_writes(saver, "t", ids) == [0, 0, 0, 0]


@pytest.mark.parametrize("store_url", STORES, indirect=True)
async def test_unfenced_accepts_a_fork_like_langgraphs_own_savers(store_url: str) -> None:
    async with FlowySaver.from_url(store_url) as saver:
        first, _ = await chain(saver, "t", 2)
        fork = await saver.aput(config("t", first), checkpoint(9), {"step": 9}, {})
        latest = await saver.aget_tuple(config("t"))
        assert latest is not None
        assert latest.config == fork
        assert latest.parent_config == config("t", first)


@pytest.mark.parametrize("store_url", STORES, indirect=True)
async def test_keep_last_keeps_the_newest_checkpoints_of_each_namespace(store_url: str) -> None:
    async with FlowySaver.from_url(store_url, keep_last=3) as saver:
        ids = await chain(saver, "t", 7, writes=True)
        await saver.aput(config("t", ns="child:1"), checkpoint(0), {}, {})
        listed = [t async for t in saver.alist(config("t"))]
        assert [t.checkpoint["id"] for t in listed] == list(reversed(ids[-3:]))
        assert [t.pending_writes for t in listed] == [
            [(f"task-{n}", "ch", n), (f"task-{n}", "other", "x")] for n in (6, 5, 4)
        ]
        assert await saver.aget_tuple(config("t", ids[0])) is None
        # The writes of pruned checkpoints go with them.
        assert await stored_writes(saver, "t", ids) == [0, 0, 0, 0, 2, 2, 2]
        child = [t async for t in saver.alist(config("t", ns="child:1"))]
        assert len(child) == 1
        other = [t async for t in saver.alist(config("other"))]
        assert other == []
        await saver.adelete_thread("t")
        assert await stored_writes(saver, "t", ids) == [0] * 7


async def test_sync_methods_run_on_the_savers_loop_from_another_thread() -> None:
    async with FlowySaver.from_url("memory://") as saver:
        with pytest.raises(asyncio.InvalidStateError, match="another thread"):
            saver.get_tuple(config("t"))

        def work() -> tuple[Any, list[Any]]:
            stored = saver.put(config("t"), checkpoint(0), {"step": 0}, {})
            saver.put_writes(stored, [("ch", "v")], "task")
            return saver.get_tuple(config("t")), list(saver.list(config("t")))

        got, listed = await asyncio.to_thread(work)
        assert got.pending_writes == [("task", "ch", "v")]
        assert [t.config for t in listed] == [got.config]
        await asyncio.to_thread(saver.delete_thread, "t")
        assert await saver.aget_tuple(config("t")) is None


async def test_a_saver_made_outside_an_event_loop_says_so() -> None:
    async with flowy.connect("memory://") as backend:
        saver = await asyncio.to_thread(FlowySaver, backend)
        with pytest.raises(asyncio.InvalidStateError, match="made outside an event loop"):
            saver.get_tuple(config("t"))


class Counter(TypedDict):
    messages: Annotated[list[str], operator.add]


@pytest.mark.parametrize("store_url", STORES, indirect=True)
async def test_a_state_graph_resumes_from_the_store(store_url: str) -> None:
    def graph(saver: FlowySaver) -> Any:
        async def say(state: Counter) -> dict[str, list[str]]:
            return {"messages": [f"m{len(state['messages'])}"]}

        builder = StateGraph(Counter)
        builder.add_node("say", say)
        builder.add_edge(START, "say")
        builder.add_edge("say", END)
        return builder.compile(checkpointer=saver)

    thread = {"configurable": {"thread_id": f"g-{uuid.uuid4().hex[:6]}"}}
    async with FlowySaver.from_url(store_url) as saver:
        await graph(saver).ainvoke({"messages": ["hi"]}, thread)
    async with FlowySaver.from_url(store_url) as saver:  # a new process would do the same
        result = await graph(saver).ainvoke({"messages": ["again"]}, thread)
        assert result["messages"] == ["hi", "m1", "again", "m3"]
        assert len([t async for t in saver.alist(thread)]) == 6
