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


# The suite's tests that put a second checkpoint on a thread without naming its parent:
# a fork, which a fenced saver refuses by design.
FORKING = {
    "list": {"test_list_metadata_filter_multiple_keys", "test_list_metadata_custom_keys"},
    "delete_for_runs": {"test_delete_for_runs_preserves_other_runs"},
}


@pytest.mark.parametrize("store_url", ["memory", "postgres"], indirect=True)
async def test_fenced_fails_only_the_suites_forks(store_url: str) -> None:
    @checkpointer_test(name="FlowySaver[fenced]")
    async def factory() -> AsyncIterator[FlowySaver]:
        async with FlowySaver.from_url(store_url, fenced=True) as saver:
            yield saver

    report = await validate(factory, progress=ProgressCallbacks.quiet())
    results: dict[str, Any] = report.to_dict()["results"]
    failed = {
        name: {f.split(":")[0] for f in r["failures"]}
        for name, r in results.items()
        if r["failures"]
    }
    assert failed == FORKING
    for r in results.values():
        for failure in r["failures"]:
            assert "parent is None" in failure and "moved on since this run read it" in failure
    assert sum(r["tests_passed"] for r in results.values()) == 78
