"""Supersteps: the branches of a ``fan_out`` or a parallel edge, run concurrently, each
recorded in the thread's journal when it finishes.

A branch that finished is recorded (its update and effects) under a key naming the
step, the origin node and the branch's index; when the superstep runs again — after a
crash, or after a branch suspended — a recorded branch returns its update without
running. ``_execution`` folds the outcomes in branch order and decides what the run
does next.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from ._activities import ActivityScope, current_scope
from ._directives import DirectiveKind
from ._graph import Graph
from ._waits import merge_update
from .storage import ActivityRecord, ActivityStatus, DurableCheckpointer, StateCodec
from .storage._codecs import JSON_CODEC_NAMES
from .storage._model import Route

__all__ = ["SAME_STATE", "Branch", "BranchOutcome", "run_branches"]

logger = logging.getLogger("flowy")

SAME_STATE: Any = object()
"""The item of a branch of a parallel edge: it runs on the state as it is."""


@dataclass(frozen=True, slots=True)
class Branch:
    """One branch of a superstep: ``node`` on the state with ``item`` merged in."""

    index: int
    node: str
    item: Any


@dataclass(slots=True)
class BranchOutcome:
    """How one branch ended: ``kind`` is ``ok`` (``update``, ``effects``), ``fail`` or
    ``suspend`` or ``handoff`` (``reason``), ``unsupported`` (a directive a branch
    cannot return) or ``error`` (the node raised: ``error``)."""

    branch: Branch
    kind: str
    update: Any = None
    effects: list[Any] = field(default_factory=lambda: [])
    reason: str = ""
    error: BaseException | None = None
    replayed: bool = False
    route: Route | None = None
    """The route of a ``handoff`` (its queue resolved with the branch node's default)."""


@dataclass(frozen=True, slots=True)
class _Journal:
    """Where finished branches are recorded, and how their updates are encoded."""

    store: DurableCheckpointer[Any]
    thread_id: str
    codec: StateCodec[Any] | None

    def encode(self, update: Any) -> Any:
        if self.codec is None:
            return json.loads(json.dumps(update, allow_nan=False))
        return json.loads(self.codec.encode(update))

    def decode(self, value: Any) -> Any:
        if self.codec is None:
            return value
        return self.codec.decode(json.dumps(value).encode())


def journal_of(
    store: DurableCheckpointer[Any] | None, thread_id: str, codec: StateCodec[Any] | None
) -> _Journal | None:
    """The journal a superstep records its branches in (``None``: not recorded)."""
    if store is None or (codec is not None and codec.name not in JSON_CODEC_NAMES):
        return None
    return _Journal(store, thread_id, codec)


async def run_branches(
    graph: Graph[Any, Any],
    state: Any,
    branches: Sequence[Branch],
    *,
    step: int,
    origin: str,
    concurrency: int | None,
    journal: _Journal | None,
    clock: Callable[[], float],
    thread_id: str,
) -> list[BranchOutcome]:
    """Run ``branches`` (at most ``concurrency`` at once), replaying the ones the
    journal recorded; their outcomes in branch order."""
    gate = asyncio.Semaphore(concurrency or max(len(branches), 1))

    async def run(branch: Branch) -> BranchOutcome:
        key = f"{step}:{origin}:branch#{branch.index}:{branch.node}"
        if journal is not None:
            recorded = await journal.store.get_activity(journal.thread_id, key)
            if recorded is not None and recorded.status is ActivityStatus.SUCCEEDED:
                result: dict[str, Any] = (
                    recorded.result if isinstance(recorded.result, dict) else {}
                )
                effects = result.get("effects")
                return BranchOutcome(
                    branch,
                    "ok",
                    journal.decode(result.get("update")),
                    list(cast("list[Any]", effects)) if isinstance(effects, list) else [],
                    replayed=True,
                )
        current_scope.set(
            ActivityScope(
                lambda: _require(journal),
                thread_id,
                clock,
                lambda: (step, f"{origin}/{branch.node}#{branch.index}"),
            )
        )
        async with gate:  # a branch holds its place until its outcome is recorded
            outcome = await _run_node(graph, state, branch)
            if outcome.kind == "ok" and journal is not None:
                await _record(journal, key, branch, outcome, clock())
        return outcome

    return list(await asyncio.gather(*(run(b) for b in branches)))


def _require(journal: _Journal | None) -> DurableCheckpointer[Any]:
    if journal is None:
        raise TypeError("flowy.activity() in a branch needs a store that keeps a journal")
    return journal.store


async def _run_node(graph: Graph[Any, Any], state: Any, branch: Branch) -> BranchOutcome:
    node = graph.nodes[branch.node]
    try:
        start = state if branch.item is SAME_STATE else merge_update(graph, state, branch.item)
        attempts = 0
        while True:
            attempts += 1
            update, directive = await node(start)
            if directive.kind is not DirectiveKind.RETRY or attempts >= directive.max_attempts:
                break
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - the branch's error is its outcome
        return BranchOutcome(branch, "error", error=exc)
    effects: list[Any] = []
    while directive.kind is DirectiveKind.EFFECT and directive.base is not None:
        effects.append(directive.payload)
        directive = directive.base
    kind = directive.kind
    if kind in (DirectiveKind.COMPLETED, DirectiveKind.END):
        return BranchOutcome(branch, "ok", update, effects)
    if kind is DirectiveKind.FAIL:
        return BranchOutcome(branch, "fail", reason=directive.reason)
    if kind is DirectiveKind.RETRY:
        return BranchOutcome(branch, "fail", reason="retry_exhausted")
    if kind is DirectiveKind.SUSPEND:
        return BranchOutcome(branch, "suspend", reason=directive.reason)
    if kind is DirectiveKind.HANDOFF:
        route = directive.route(graph.queue_of(branch.node))
        return BranchOutcome(branch, "handoff", reason=directive.reason, route=route)
    return BranchOutcome(branch, "unsupported", reason=kind.value)


async def _record(
    journal: _Journal, key: str, branch: Branch, outcome: BranchOutcome, now: float
) -> None:
    try:
        result = {"update": journal.encode(outcome.update), "effects": outcome.effects}
        json.dumps(result, allow_nan=False)
    except (TypeError, ValueError) as exc:
        logger.warning(
            "flowy: branch %d (%s) of %r is not recorded (its update or effects are not "
            "JSON): it runs again if the superstep does: %s",
            branch.index,
            branch.node,
            journal.thread_id,
            exc,
        )
        return
    await journal.store.put_activity(
        journal.thread_id,
        ActivityRecord(
            key=key,
            status=ActivityStatus.SUCCEEDED,
            name=branch.node,
            attempts=1,
            result=result,
            started_at=now,
            updated_at=now,
        ),
    )
