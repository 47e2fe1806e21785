"""Routing: where a run goes after a node completed (its static edge or its router)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable
from typing import Any, cast

from ._errors import UnknownNodeError
from ._graph import Graph
from ._results import Reason
from ._segment import Segment, Stop

__all__ = ["route"]


async def route(
    seg: Segment[Any, Any], src: str, graph: Graph[Any, Any] | None = None, state: Any = None
) -> str | None:
    """Where the run goes after ``src`` completed, in ``graph`` (default: the run's)
    with ``state`` (default: the run's); ``None`` at a terminal node. A router that
    raises or names an undeclared target ends the run (``Stop``)."""
    graph = seg.graph if graph is None else graph
    dst = graph.edges.get(src)
    if dst is not None:
        return dst
    cond = graph.conditional_edges.get(src)
    if cond is None:
        return None  # a terminal node (validated at compile time)
    try:
        target = cond.router(seg.state if state is None else state)
        if cond.is_async or inspect.isawaitable(target):
            target = await cast(Awaitable[str], target)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        raise Stop(seg.fail_unsaved(Reason.ROUTER_ERROR, exc)) from exc
    if target not in cond.targets:
        err = UnknownNodeError(
            f"router of {src!r} returned {target!r}, which is not among its declared "
            f"targets {list(cond.targets)}"
        )
        raise Stop(await seg.fail(Reason.ROUTER_TARGET_UNDECLARED, err))
    return target
