"""A store that cannot be namespaced (its backend has no scratch stores), for the tests of
``flowy check --backend``: importing this module registers the ``noscratch://`` scheme,
so a ``flowy check`` process that loads its graph from here can be pointed at it."""

from __future__ import annotations

from typing import Any

from check_graphs import safe_shop, shop_scenario

from flowy.memory import MemoryBackend
from flowy.storage import StateCodec
from flowy.storage.dialect import StoreURL, register_backend

__all__ = ["NoScratchBackend", "graph", "scenario"]


class NoScratchBackend(MemoryBackend[Any]):
    """A memory store that says it cannot make a scratch store next to itself."""

    def scratch_url(self, name: str) -> str | None:
        return None


async def open_backend(url: StoreURL, *, codec: StateCodec[Any] | None) -> NoScratchBackend:
    return NoScratchBackend(codec=codec, url=url.raw)


register_backend("noscratch", open_backend)
graph = safe_shop
scenario = shop_scenario
