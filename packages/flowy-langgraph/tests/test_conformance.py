"""LangGraph's own checkpointer conformance suite (``langgraph-checkpoint-conformance``)
on ``FlowySaver``, on each of flowy's five stores: every base capability (put,
put_writes, get_tuple, list, delete_thread) and every extended one (copy_thread,
delete_for_runs, prune) must pass.

Set ``FLOWY_LANGGRAPH_REPORT=path`` to also append each store's result as a JSON line
(``scripts/langgraph_report.py`` turns them into the README's table).
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.report import ProgressCallbacks
from lg_support import STORES

from flowy_langgraph import FlowySaver

pytestmark = pytest.mark.anyio

EXTENDED = {"copy_thread", "delete_for_runs", "prune"}


@pytest.mark.parametrize("store_url", STORES, indirect=True)
async def test_the_langgraph_conformance_suite_passes_in_full(
    store_url: str, request: pytest.FixtureRequest
) -> None:
    store = request.node.callspec.id

    @checkpointer_test(name=f"FlowySaver[{store}]")
    async def factory() -> AsyncIterator[FlowySaver]:
        async with FlowySaver.from_url(store_url) as saver:
            yield saver

    report = await validate(factory, progress=ProgressCallbacks.quiet())
    results: dict[str, Any] = report.to_dict()
    if path := os.environ.get("FLOWY_LANGGRAPH_REPORT"):
        line = json.dumps({"store": store, **results}) + "\n"
        async with await anyio.open_file(path, "a", encoding="utf-8") as out:
            await out.write(line)
    failures = {
        name: r["failures"] for name, r in results["results"].items() if r["passed"] is not True
    }
    assert not failures, failures
    assert report.conformance_level() == "FULL"
    assert {n for n, r in results["results"].items() if r["detected"]} >= EXTENDED
