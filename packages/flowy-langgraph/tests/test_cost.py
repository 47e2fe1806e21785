"""What each FlowySaver call asks of the store, counted: one call of a store method is
one atomic operation of the store (one round trip on PostgreSQL, Redis and DynamoDB).

The saver knows no store, so the counts are the same on every store; they are taken on
the memory and SQLite stores' checkpointers.
"""

from __future__ import annotations

import collections
from typing import Any

import pytest
from lg_support import chain, checkpoint, config

from flowy_langgraph import FlowySaver

pytestmark = pytest.mark.anyio

METHODS = (
    "save",
    "load",
    "get_history",
    "prune",
    "delete",
    "list_threads",
    "put_activity",
    "journal",
)


class Counted:
    """Counts the calls of the store methods of ``saver``'s checkpointer."""

    def __init__(self, saver: FlowySaver) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        store: Any = saver._store  # pyright: ignore[reportPrivateUsage]
        for name in METHODS:
            setattr(store, name, self._counting(name, getattr(store, name)))

    def _counting(self, name: str, method: Any) -> Any:
        async def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return await method(*args, **kwargs)

        return call

    def take(self) -> dict[str, int]:
        taken = dict(self.calls)
        self.calls.clear()
        return taken


@pytest.mark.parametrize("store_url", ["memory", "sqlite"], indirect=True)
@pytest.mark.parametrize("fenced", [False, True], ids=["unfenced", "fenced"])
async def test_a_superstep_is_one_save_and_one_write_per_pending_write(
    store_url: str, fenced: bool
) -> None:
    async with FlowySaver.from_url(store_url, fenced=fenced) as saver:
        _, second = await chain(saver, "t", 2)
        counted = Counted(saver)
        stored = await saver.aput(config("t", second), checkpoint(2), {"step": 2}, {})
        assert counted.take() == {"save": 1}
        await saver.aput_writes(stored, [("a", 1), ("b", 2)], "task")
        assert counted.take() == {"put_activity": 2}
        assert await saver.aget_tuple(config("t")) is not None
        assert counted.take() == {"load": 1, "journal": 1}
        assert await saver.aget_tuple(stored) is not None  # by id: both at once
        assert counted.take() == {"load": 1, "journal": 1}

    async with FlowySaver.from_url(store_url, fenced=fenced) as other:
        # A saver that did not write the parent reads the head first.
        counted = Counted(other)
        await other.aput(stored, checkpoint(3), {"step": 3}, {})
        assert counted.take() == {"load": 1, "save": 1}


@pytest.mark.parametrize("store_url", ["memory", "sqlite"], indirect=True)
async def test_keep_last_prunes_without_reading(store_url: str) -> None:
    async with FlowySaver.from_url(store_url, keep_last=2) as saver:
        ids = await chain(saver, "t", 2)
        counted = Counted(saver)
        await saver.aput(config("t", ids[-1]), checkpoint(2), {"step": 2}, {})
        assert counted.take() == {"save": 1, "prune": 1, "delete": 1}
