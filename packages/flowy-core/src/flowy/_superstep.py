"""Supersteps: a node's parallel edges or fan-out run as branches, their updates
folded in branch order (``_fanout`` runs the branches)."""

from __future__ import annotations

from typing import Generic

from ._directives import Directive, DirectiveKind
from ._events import EventType
from ._fanout import Branch, journal_of, run_branches
from ._handoff import Handoffs
from ._pauses import Pauses
from ._results import Reason, RunResult
from ._segment import Segment, maybe_await
from ._types import E, S

__all__ = ["Supersteps"]


class Supersteps(Generic[S, E]):
    """The supersteps of the segment ``seg``; a paused branch pauses it with ``pauses``
    (or hands it off with ``handoffs``)."""

    def __init__(self, seg: Segment[S, E], pauses: Pauses[S, E], handoffs: Handoffs[S, E]) -> None:
        self.seg = seg
        self.pauses = pauses
        self.handoffs = handoffs

    async def run(
        self, origin: str, branches: list[Branch], then: str, concurrency: int | None
    ) -> RunResult[S, E] | None:
        """Run a superstep's branches, fold their updates in branch order and go on at
        ``then``; a branch that fails fails the run, one that suspends or hands off
        makes the run do so at ``origin`` once the others finished (they are recorded,
        so the superstep runs only the unfinished ones again)."""
        seg = self.seg
        graph, meta = seg.graph, seg.meta
        count = len(branches)
        if meta.step_count + count > graph.max_steps:
            return await seg.fail(Reason.MAX_STEPS_EXCEEDED)
        max_total = graph.max_total_steps
        if max_total is not None and meta.total_steps + count > max_total:
            return await seg.fail(Reason.MAX_TOTAL_STEPS_EXCEEDED)
        store = seg.services.store
        journal = (
            journal_of(store.journal, seg.thread_id, store.codec) if store is not None else None
        )
        if seg.sink is not None:
            for branch in branches:
                seg.emit(EventType.NODE_STARTED, node=branch.node, step=meta.step_count + 1)
        outcomes = await run_branches(
            graph,
            seg.state,
            branches,
            step=meta.total_steps,
            origin=origin,
            concurrency=concurrency,
            journal=journal,
            clock=seg.clock,
            thread_id=seg.thread_id,
        )
        for outcome in outcomes:
            if outcome.kind == "error":
                assert outcome.error is not None
                return seg.fail_unsaved(Reason.NODE_ERROR, outcome.error)
        for outcome in outcomes:
            node = outcome.branch.node
            if outcome.kind == "fail":
                return await seg.fail(f"{Reason.BRANCH_FAILED}:{node}:{outcome.reason}")
            if outcome.kind == "unsupported":
                return await seg.fail(
                    f"{Reason.BRANCH_DIRECTIVE_UNSUPPORTED}:{node}:{outcome.reason}"
                )
        waiting = [o for o in outcomes if o.kind in ("suspend", "handoff")]
        if waiting:
            # Back to before the origin node: a resume runs it and the superstep again,
            # and the branches that finished replay from the journal.
            seg.state, seg.pointer = seg.step_state, origin
            meta.step_count -= 1
            meta.total_steps -= 1
            first = waiting[0]
            if first.kind == "suspend":
                return await self.pauses.suspend(
                    Directive(DirectiveKind.SUSPEND, reason=first.reason, resume_at=origin)
                )
            return await self.handoffs.handoff(first.reason, first.route)
        reducer = graph.reducer
        try:
            for outcome in outcomes:
                seg.state = reducer(seg.state, outcome.update)
        except Exception as exc:  # noqa: BLE001 - a reducer's error fails the run, reported on the result
            return seg.fail_unsaved(Reason.REDUCER_ERROR, exc)
        for outcome in outcomes:
            for payload in outcome.effects:
                seg.effects.append(payload)
                seg.emit(
                    EventType.EFFECT, node=outcome.branch.node, effect=payload, has_effect=True
                )
            seg.emit(EventType.NODE_COMPLETED, node=outcome.branch.node, state=seg.state)
        meta.step_count += count
        meta.total_steps += count
        for name, limit in graph.budgets.items():
            if meta.budget_counts.get(name, 0) > limit:
                return await seg.fail(f"{Reason.BUDGET_EXCEEDED}:{name}")
        if seg.invariant is not None:
            try:
                await maybe_await(seg.invariant(seg.state))
            except Exception as exc:  # noqa: BLE001 - a violated invariant fails the run
                return await seg.fail(Reason.INVARIANT_VIOLATION, exc)
        seg.pointer = then
        return None
