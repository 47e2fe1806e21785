"""One run segment: the execution loop, routing, suspension, terminal saves and
interrupts (stop, local hand-off, lost lease, cancellation).

``Runner`` prepares an ``Execution`` (start or resume preflight) and awaits ``run()``;
everything between the first node and the terminal result happens here. The hand-off
paths are in ``_handoff``, the shared machinery in ``_segment``.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from collections.abc import Awaitable
from typing import Any, cast

from . import _tracing
from ._activities import ActivityScope, RetryLater, current_scope
from ._context import current_run
from ._directives import Directive, DirectiveKind
from ._errors import LeaseLostError, LimitError, UnknownNodeError
from ._events import EventType, InterruptKind
from ._fanout import SAME_STATE, Branch, journal_of, run_branches
from ._graph import Graph
from ._handoff import HandoffSegment
from ._observer import LifecycleEventType
from ._results import Reason, RunResult
from ._segment import Stop, maybe_await, unregister_run
from ._types import E, S
from ._waits import next_signal, take_signal
from .storage import RunStatus, StateCodec
from .storage._codecs import codec_for_type
from .storage.dialect import MAX_TIMESTAMP

__all__ = ["Execution"]

logger = logging.getLogger("flowy")

_CANCEL_SAVE_TIMEOUT = 10.0


class Execution(HandoffSegment[S, E]):
    """One run segment: the loop of a start or a resume, with its lease and interrupts."""

    task: asyncio.Task[Any] | None = None
    renewer: asyncio.Task[None] | None = None
    in_node: bool = False
    step_state: Any = None
    interrupt_kind: InterruptKind | None

    # -------------------------------------------------------------- control
    def interrupt(self, kind: InterruptKind) -> None:
        """Ask the run to stop at the next safe point: ``stop`` (request_stop),
        ``handoff`` (request_local_handoff) or ``lease_lost``."""
        if self.interrupt_kind is not None and kind != "lease_lost":
            return
        self.interrupt_kind = kind
        if self.in_node and self.task is not None:
            self.task.cancel()
            self.cancels_sent += 1

    def _take_own_cancels(self) -> bool:
        """Take back the cancellations interrupts sent to the run's task. True if one
        was sent and no other is pending: a cancellation from outside (the caller's task
        cancelled, ``handle.cancel()``) is never taken for an interrupt's."""
        task, sent = self.task, self.cancels_sent
        self.cancels_sent = 0
        if task is None or not sent:
            return False
        for _ in range(sent):
            task.uncancel()
        return task.cancelling() == 0

    async def _absorb_cancel(self) -> None:
        """An interrupt cancelled the task just as its node returned: take the pending
        cancellation here, so it cannot land in the middle of a save (one from outside
        goes on)."""
        if not self.cancels_sent:
            return
        try:
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            if not self._take_own_cancels():
                raise
        else:
            self._take_own_cancels()

    async def _renew_loop(self) -> None:
        lm = self.services.lease_manager
        assert lm is not None and self.lease is not None
        interval = max(self.lease_ttl / 3.0, 0.01)
        while True:
            await asyncio.sleep(interval)
            try:
                self.lease = await lm.renew(self.lease, self.lease_ttl)
            except LeaseLostError:
                logger.warning("flowy: lease on thread %r was lost; stopping", self.thread_id)
                self.interrupt("lease_lost")
                return
            except Exception as exc:  # noqa: BLE001 - a transient store error: try again next tick
                logger.warning("flowy: renewing lease on %r failed: %s", self.thread_id, exc)

    # -------------------------------------------------------------- the run
    async def run(self) -> RunResult[S, E]:
        """Run the segment to its terminal result (the source of truth)."""
        self.task = asyncio.current_task()
        if self.lease is not None:
            self.renewer = asyncio.ensure_future(self._renew_loop())
        ctx_token = current_run.set(self.meta)
        scope_token = current_scope.set(
            ActivityScope(
                lambda: self._journal("flowy.activity()"),
                self.thread_id,
                self.clock,
                lambda: (self.meta.total_steps + 1, self.pointer),
            )
        )
        result: RunResult[S, E] | None = None
        tracing = _tracing.active()
        span = (
            tracing.segment(self.thread_id, "resume" if self.meta.segment else "start", self.store)
            if tracing is not None
            else None
        )
        try:
            try:
                result = await self._loop()
            except Stop as stop:
                result = cast(RunResult[S, E], stop.result)
            except asyncio.CancelledError:
                kind = self.interrupt_kind
                if kind is not None and self._take_own_cancels():
                    result = await self._on_interrupt(kind)
                else:
                    await self._on_external_cancel()
                    raise
            return result
        finally:
            current_scope.reset(scope_token)
            current_run.reset(ctx_token)
            if span is not None:
                if result is None:
                    span.end("canceled", error=asyncio.CancelledError())
                else:
                    span.end(
                        result.status.value,
                        result.reason,
                        result.revision,
                        result.error,
                        result.step_count,
                    )
            await self._finish(result)

    async def _on_external_cancel(self) -> None:
        """The task was cancelled from outside (``handle.cancel()``, or the caller's
        task): the same terminal save as ``request_stop``, shielded and bounded, before
        the cancellation goes on."""
        try:
            await asyncio.wait_for(asyncio.shield(self._on_interrupt("stop")), _CANCEL_SAVE_TIMEOUT)
        except (TimeoutError, asyncio.CancelledError) as exc:
            logger.warning(
                "flowy: the cancel checkpoint of thread %r did not finish: %r", self.thread_id, exc
            )

    async def _finish(self, result: RunResult[S, E] | None) -> None:
        if self.renewer is not None:
            self.renewer.cancel()
        lm = self.services.lease_manager
        try:
            if self.lease is not None and lm is not None and self.interrupt_kind != "lease_lost":
                try:
                    await asyncio.shield(lm.release(self.lease))
                except Exception as exc:  # noqa: BLE001 - the lease expires on its own
                    logger.warning("flowy: releasing lease on %r failed: %s", self.thread_id, exc)
        finally:
            unregister_run(self.key)  # even when the release is interrupted
        if result is not None:
            await self._post_run_cleanup(result)

    async def _post_run_cleanup(self, result: RunResult[S, E]) -> None:
        cp = self.cp
        if cp is None or result.revision == 0:
            return
        try:
            if result.status is RunStatus.COMPLETED and self.graph.delete_on_success:
                await cp.delete_if_idle(self.thread_id)
            elif (
                result.status in (RunStatus.COMPLETED, RunStatus.FAILED)
                and self.graph.retention_limit is not None
            ):
                await cp.prune(self.thread_id, self.graph.retention_limit)
        except Exception as exc:  # noqa: BLE001 - post-run cleanup only logs (the specification)
            logger.warning("flowy: post-run cleanup of %r failed: %s", self.thread_id, exc)

    async def _terminal(self, status: RunStatus, reason: str, event: EventType) -> RunResult[S, E]:
        """Save a completed/failed snapshot and build the result."""
        kind = "completed" if status is RunStatus.COMPLETED else "failed"
        error: BaseException | None = None
        if self.cp is not None:
            error = await self._save_or_stop(self._snapshot(status, reason), kind)
            if error is not None:
                reason = f"{kind}_checkpoint_skipped"
        result = self._result(status, reason, error=error)
        self._emit(event, reason=reason, execution_pointer=self.pointer, state=self.state)
        return result

    async def _fail(self, reason: str, error: BaseException | None = None) -> RunResult[S, E]:
        result = await self._terminal(RunStatus.FAILED, reason, EventType.FAILED)
        if error is not None and result.error is None:
            result.error = error
        return result

    async def _loop(self) -> RunResult[S, E]:
        graph = self.graph
        nodes = graph.nodes
        reducer = graph.reducer
        budgets = graph.budgets
        max_steps = graph.max_steps
        max_total = graph.max_total_steps
        meta = self.meta
        emit = self.sink is not None
        save_steps = graph.save_every_step and self.cp is not None
        edges = graph.edges
        effect_kind, completed_kind = DirectiveKind.EFFECT, DirectiveKind.COMPLETED
        attempts = self.attempts
        subgraphs = graph.subgraphs
        tracing = _tracing.active()
        while True:
            if self.interrupt_kind is not None:
                return await self._on_interrupt(self.interrupt_kind)
            pointer = self.pointer
            if meta.step_count >= max_steps:
                return await self._fail(Reason.MAX_STEPS_EXCEEDED)
            if max_total is not None and meta.total_steps >= max_total:
                self._publish(LifecycleEventType.STEP_LIMIT_EXCEEDED, reason=pointer)
                return await self._fail(Reason.MAX_TOTAL_STEPS_EXCEEDED)
            meta.node = pointer
            if pointer in subgraphs:
                result = await self._subgraph(pointer)
                if result is not None:
                    return result
                continue
            if emit:
                self._emit(EventType.NODE_STARTED, node=pointer, step=meta.step_count + 1)
            self.step_state = self.state
            node_span = (
                tracing.node(self.thread_id, pointer, meta.step_count + 1) if tracing else None
            )
            self.in_node = True
            try:
                update, directive = await nodes[pointer](self.state)
            except asyncio.CancelledError:
                if node_span is not None:
                    node_span.end("canceled")
                raise
            except RetryLater as later:  # an activity waits for its next attempt
                self.in_node = False
                if node_span is not None:
                    node_span.end(Reason.ACTIVITY_RETRY)
                return await self._save_wait(Reason.ACTIVITY_RETRY, later.at)
            except Exception as exc:  # noqa: BLE001 - a node's error fails the run, reported on the result
                if node_span is not None:
                    node_span.end("failed", error=exc)
                return self._fail_unsaved(Reason.NODE_ERROR, exc)
            finally:
                self.in_node = False
            if node_span is not None:
                node_span.end(directive.kind.value)
            if self.interrupt_kind is not None:
                await self._absorb_cancel()
            try:
                self.state = reducer(self.state, update)
            except Exception as exc:  # noqa: BLE001 - a reducer's error fails the run, reported on the result
                return self._fail_unsaved(Reason.REDUCER_ERROR, exc)
            meta.step_count += 1
            meta.total_steps += 1
            if budgets:
                for name, limit in budgets.items():
                    if meta.budget_counts.get(name, 0) > limit:
                        return await self._fail(f"{Reason.BUDGET_EXCEEDED}:{name}")
            if self.invariant is not None:
                try:
                    await maybe_await(self.invariant(self.state))
                except Exception as exc:  # noqa: BLE001 - a violated invariant fails the run
                    return await self._fail(Reason.INVARIANT_VIOLATION, exc)
            while directive.kind is effect_kind:
                payload = cast(E, directive.payload)
                self.effects.append(payload)
                if emit:
                    self._emit(
                        EventType.EFFECT,
                        node=pointer,
                        step=meta.step_count,
                        effect=payload,
                        has_effect=True,
                    )
                assert directive.base is not None
                directive = directive.base
            if emit:
                self._emit(
                    EventType.NODE_COMPLETED, node=pointer, step=meta.step_count, state=self.state
                )
            if directive.kind is completed_kind and (nxt := edges.get(pointer)) is not None:
                # The common step, inline: a completed node with a static edge.
                if attempts:
                    attempts.pop(pointer, None)
                self.pointer = nxt
                if save_steps:
                    await self._save_or_stop(self._snapshot(RunStatus.RUNNING, ""), "step")
                continue
            result = await self._after_step(pointer, directive, save_steps)
            if result is not None:
                return result

    async def _after_step(
        self, pointer: str, directive: Directive[E], save_steps: bool
    ) -> RunResult[S, E] | None:
        """Apply the node's directive: the terminal result, or ``None`` to go on."""
        kind = directive.kind
        graph = self.graph
        if kind is DirectiveKind.COMPLETED and pointer in graph.parallel_edges:
            self.attempts.pop(pointer, None)
            names, then = graph.parallel_edges[pointer]
            branches = [Branch(i, name, SAME_STATE) for i, name in enumerate(names)]
            result = await self._superstep(pointer, branches, then, None)
            if result is not None:
                return result
        elif kind is DirectiveKind.FAN_OUT:
            declared = graph.fan_outs.get(pointer)
            if declared is None or declared[0] != directive.resume_at:
                return await self._fail(
                    Reason.FAN_OUT_UNDECLARED,
                    UnknownNodeError(
                        f"node {pointer!r} returned fan_out({directive.resume_at!r}, ...) "
                        "but declares no such fan-out (GraphBuilder.add_fan_out)"
                    ),
                )
            branches = [Branch(i, declared[0], item) for i, item in enumerate(directive.items)]
            result = await self._superstep(pointer, branches, declared[1], directive.concurrency)
            if result is not None:
                return result
        elif kind is DirectiveKind.COMPLETED:
            self.attempts.pop(pointer, None)
            nxt = await self._route(pointer)
            if nxt is None:
                return await self._terminal(
                    RunStatus.COMPLETED, Reason.COMPLETED, EventType.COMPLETED
                )
            self.pointer = nxt
        elif kind is DirectiveKind.RETRY:
            used = self.attempts.get(pointer, 0) + 1
            self.attempts[pointer] = used
            if used >= directive.max_attempts:
                self.attempts.pop(pointer, None)
                fallback = graph.retry_routes.get(pointer)
                if fallback is None:
                    return await self._fail(Reason.RETRY_EXHAUSTED)
                self.pointer = fallback
        elif kind is DirectiveKind.END:
            return await self._terminal(RunStatus.COMPLETED, Reason.END, EventType.COMPLETED)
        elif kind is DirectiveKind.FAIL:
            return await self._fail(directive.reason)
        elif kind is DirectiveKind.SUSPEND:
            return await self._suspend(directive)
        elif kind is DirectiveKind.WAIT:
            result = await self._wait(directive)
            if result is not None:
                return result
        elif kind is DirectiveKind.HANDOFF:
            target = directive.resume_at or pointer
            if not graph.has_node(target):
                return await self._fail(
                    Reason.HANDOFF_RESUME_TARGET_INVALID,
                    UnknownNodeError(f"handoff resume_at names unknown node {target!r}"),
                )
            self.pointer = target
            return await self._handoff(directive.reason)
        else:  # pragma: no cover - every kind is handled above
            raise AssertionError(f"unhandled directive {directive!r}")
        if save_steps:
            await self._save_or_stop(self._snapshot(RunStatus.RUNNING, ""), "step")
        return None

    async def _superstep(
        self, origin: str, branches: list[Branch], then: str, concurrency: int | None
    ) -> RunResult[S, E] | None:
        """Run a superstep's branches, fold their updates in branch order and go on at
        ``then``; a branch that fails fails the run, one that suspends or hands off
        makes the run do so at ``origin`` once the others finished (they are recorded,
        so the superstep runs only the unfinished ones again)."""
        graph, meta = self.graph, self.meta
        count = len(branches)
        if meta.step_count + count > graph.max_steps:
            return await self._fail(Reason.MAX_STEPS_EXCEEDED)
        max_total = graph.max_total_steps
        if max_total is not None and meta.total_steps + count > max_total:
            return await self._fail(Reason.MAX_TOTAL_STEPS_EXCEEDED)
        store = self.services.store
        journal = (
            journal_of(store.journal, self.thread_id, store.codec) if store is not None else None
        )
        if self.sink is not None:
            for branch in branches:
                self._emit(EventType.NODE_STARTED, node=branch.node, step=meta.step_count + 1)
        outcomes = await run_branches(
            graph,
            self.state,
            branches,
            step=meta.total_steps,
            origin=origin,
            concurrency=concurrency,
            journal=journal,
            clock=self.clock,
            thread_id=self.thread_id,
        )
        for outcome in outcomes:
            if outcome.kind == "error":
                assert outcome.error is not None
                return self._fail_unsaved(Reason.NODE_ERROR, outcome.error)
        for outcome in outcomes:
            node = outcome.branch.node
            if outcome.kind == "fail":
                return await self._fail(f"{Reason.BRANCH_FAILED}:{node}:{outcome.reason}")
            if outcome.kind == "unsupported":
                return await self._fail(
                    f"{Reason.BRANCH_DIRECTIVE_UNSUPPORTED}:{node}:{outcome.reason}"
                )
        waiting = [o for o in outcomes if o.kind in ("suspend", "handoff")]
        if waiting:
            # Back to before the origin node: a resume runs it and the superstep again,
            # and the branches that finished replay from the journal.
            self.state, self.pointer = self.step_state, origin
            meta.step_count -= 1
            meta.total_steps -= 1
            first = waiting[0]
            if first.kind == "suspend":
                return await self._suspend(
                    Directive(DirectiveKind.SUSPEND, reason=first.reason, resume_at=origin)
                )
            return await self._handoff(first.reason)
        reducer = graph.reducer
        try:
            for outcome in outcomes:
                self.state = reducer(self.state, outcome.update)
        except Exception as exc:  # noqa: BLE001 - a reducer's error fails the run, reported on the result
            return self._fail_unsaved(Reason.REDUCER_ERROR, exc)
        for outcome in outcomes:
            for payload in outcome.effects:
                self.effects.append(payload)
                self._emit(
                    EventType.EFFECT, node=outcome.branch.node, effect=payload, has_effect=True
                )
            self._emit(EventType.NODE_COMPLETED, node=outcome.branch.node, state=self.state)
        meta.step_count += count
        meta.total_steps += count
        for name, limit in graph.budgets.items():
            if meta.budget_counts.get(name, 0) > limit:
                return await self._fail(f"{Reason.BUDGET_EXCEEDED}:{name}")
        if self.invariant is not None:
            try:
                await maybe_await(self.invariant(self.state))
            except Exception as exc:  # noqa: BLE001 - a violated invariant fails the run
                return await self._fail(Reason.INVARIANT_VIOLATION, exc)
        self.pointer = then
        return None

    async def _subgraph(self, name: str) -> RunResult[S, E] | None:
        """Run the subgraph node ``name``: enter it (or continue where the run paused
        inside), run the child graph to its end, fold ``leave`` and follow ``name``'s
        route. A suspend, hand-off or wait inside pauses the whole run at ``name`` with
        the child's node and state in the snapshot."""
        spec = self.graph.subgraphs[name]
        child = spec.graph
        codec = codec_for_type(child.state_type)
        meta = self.meta
        nested, self.nested = self.nested, {}
        if nested:
            cstate = codec.decode(json.dumps(nested["state"]).encode())
            cptr = str(nested["pointer"])
            woke, self.nested_wake = self.nested_wake, None
            if woke is not None and woke[0] is not None:
                cstate = await take_signal(child, cstate, woke[0], self.signal_cursors)
            elif woke is not None and woke[1]:
                cptr = str(nested.get("on_timeout") or cptr)
        else:
            try:
                cstate = await maybe_await(spec.enter(self.state))
            except Exception as exc:  # noqa: BLE001 - fails the run, reported on the result
                return self._fail_unsaved(Reason.NODE_ERROR, exc)
            cptr = child.entry
        tries: dict[str, int] = {}
        save_steps = self.graph.save_every_step and self.cp is not None
        while True:
            kind_now = self.interrupt_kind
            if kind_now is not None:  # stop here, inside: the resume goes on from here
                self._nest(name, cptr, cstate, codec)
                return await self._on_interrupt(kind_now)
            if meta.step_count >= self.graph.max_steps:
                return await self._fail(Reason.MAX_STEPS_EXCEEDED)
            path = f"{name}/{cptr}"
            self._emit(EventType.NODE_STARTED, node=path, step=meta.step_count + 1)
            self.in_node = True
            try:
                update, directive = await child.nodes[cptr](cstate)
                cstate = child.reducer(cstate, update)
            except asyncio.CancelledError:
                self._nest(name, cptr, cstate, codec)  # a stop saves the run inside
                raise
            except RetryLater as later:
                self.in_node = False
                self._nest(name, cptr, cstate, codec)
                return await self._save_wait(Reason.ACTIVITY_RETRY, later.at)
            except Exception as exc:  # noqa: BLE001 - a node's error fails the run, reported on the result
                return self._fail_unsaved(Reason.NODE_ERROR, exc)
            finally:
                self.in_node = False
            meta.step_count += 1
            meta.total_steps += 1
            over = [
                b for b, limit in self.graph.budgets.items() if meta.budget_counts.get(b, 0) > limit
            ]
            if over:
                return await self._fail(f"{Reason.BUDGET_EXCEEDED}:{over[0]}")
            while directive.kind is DirectiveKind.EFFECT and directive.base is not None:
                payload = cast(E, directive.payload)
                self.effects.append(payload)
                self._emit(EventType.EFFECT, node=path, effect=payload, has_effect=True)
                directive = directive.base
            self._emit(EventType.NODE_COMPLETED, node=path, step=meta.step_count)
            kind = directive.kind
            target = directive.resume_at or cptr
            if kind is DirectiveKind.END:
                break
            if kind is DirectiveKind.COMPLETED:
                nxt = await self._route(cptr, child, cstate)
                if nxt is None:
                    break
                cptr = nxt
            elif kind is DirectiveKind.RETRY:
                tries[cptr] = tries.get(cptr, 0) + 1
                if tries[cptr] >= directive.max_attempts:
                    return await self._fail(f"{name}/{cptr}:{Reason.RETRY_EXHAUSTED}")
            elif kind is DirectiveKind.FAIL:
                return await self._fail(f"{name}/{cptr}:{directive.reason}")
            elif kind is DirectiveKind.SUSPEND:
                self._nest(name, target, cstate, codec)
                return await self._suspend(
                    Directive(DirectiveKind.SUSPEND, reason=directive.reason, resume_at=name)
                )
            elif kind is DirectiveKind.HANDOFF:
                self._nest(name, target, cstate, codec)
                return await self._handoff(directive.reason)
            elif kind is DirectiveKind.WAIT:
                signal = directive.signal
                timeout_to = directive.on_timeout or child.timeout_routes.get(cptr, "")
                if signal and self.cp is not None:
                    found = await next_signal(
                        self._durable("wait_for()"), self.thread_id, signal,
                        self.signal_cursors,
                    )  # fmt: skip
                    if found is not None:
                        cstate = await take_signal(child, cstate, found, self.signal_cursors)
                        cptr = target
                        continue
                now = self.clock()
                delay, until = directive.delay, directive.until
                self._nest(name, target, cstate, codec, on_timeout=timeout_to)
                waited = await self._save_wait(
                    directive.reason,
                    now + delay if delay is not None else until,
                    signal,
                    emit=False,
                )
                if signal and waited.resume_token is not None:
                    # A signal sent while the wait was being saved: take it and go on.
                    found = await next_signal(
                        self._durable("wait_for()"), self.thread_id, signal,
                        self.signal_cursors,
                    )  # fmt: skip
                    if found is not None:
                        cstate = await take_signal(child, cstate, found, self.signal_cursors)
                        cptr, self.nested = target, {}
                        continue
                self._emit_wait(waited)
                return waited
            else:
                return await self._fail(
                    f"{Reason.BRANCH_DIRECTIVE_UNSUPPORTED}:{name}/{cptr}:{kind.value}"
                )
            if save_steps:
                self._nest(name, cptr, cstate, codec)
                self.pointer = name
                await self._save_or_stop(self._snapshot(RunStatus.RUNNING, ""), "step")
                self.nested = {}
        try:
            update = await maybe_await(spec.leave(self.state, cstate))
            self.state = self.graph.reducer(self.state, update)
        except Exception as exc:  # noqa: BLE001 - fails the run, reported on the result
            return self._fail_unsaved(Reason.REDUCER_ERROR, exc)
        self.nested = {}
        return await self._after_step(name, Directive(DirectiveKind.COMPLETED), save_steps)

    def _nest(
        self, name: str, pointer: str, state: Any, codec: StateCodec[Any], on_timeout: str = ""
    ) -> None:
        """Record where the run is inside the subgraph ``name`` (saved with the next
        snapshot); the run's own pointer is ``name``."""
        self.pointer = name
        self.nested = {
            "node": name,
            "pointer": pointer,
            "state": json.loads(codec.encode(state)),
            **({"on_timeout": on_timeout} if on_timeout else {}),
        }

    async def _route(
        self, src: str, graph: Graph[Any, Any] | None = None, state: Any = None
    ) -> str | None:
        """Where the run goes after ``src`` completed, in ``graph`` (default: the run's)
        with ``state`` (default: the run's); ``None`` at a terminal node. A router that
        raises or names an undeclared target ends the run (``Stop``)."""
        graph = self.graph if graph is None else graph
        dst = graph.edges.get(src)
        if dst is not None:
            return dst
        cond = graph.conditional_edges.get(src)
        if cond is None:
            return None  # a terminal node (validated at compile time)
        try:
            target = cond.router(self.state if state is None else state)
            if cond.is_async or inspect.isawaitable(target):
                target = await cast(Awaitable[str], target)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise Stop(self._fail_unsaved(Reason.ROUTER_ERROR, exc)) from exc
        if target not in cond.targets:
            err = UnknownNodeError(
                f"router of {src!r} returned {target!r}, which is not among its declared "
                f"targets {list(cond.targets)}"
            )
            raise Stop(await self._fail(Reason.ROUTER_TARGET_UNDECLARED, err))
        return target

    async def _suspend(self, directive: Directive[E]) -> RunResult[S, E]:
        target = directive.resume_at or self.pointer
        if not self.graph.has_node(target):
            return await self._fail(
                Reason.SUSPEND_RESUME_TARGET_INVALID,
                UnknownNodeError(f"suspend resume_at names unknown node {target!r}"),
            )
        self.pointer = target
        reason = directive.reason
        if self.cp is None:
            result = self._result(RunStatus.SUSPENDED, reason)
            self._emit(EventType.SUSPENDED, reason=reason, execution_pointer=target)
            return result
        error = await self._save_or_stop(self._snapshot(RunStatus.SUSPENDED, reason), "suspend")
        saved = error is None
        if saved:
            reason, error = await self._retention(reason, "suspend")
        else:
            reason = Reason.SUSPEND_CHECKPOINT_SKIPPED
        result = self._result(RunStatus.SUSPENDED, reason, token=saved, error=error)
        self._emit(
            EventType.SUSPENDED,
            reason=reason,
            execution_pointer=target,
            resume_token=result.resume_token,
        )
        return result

    async def _wait(self, directive: Directive[E]) -> RunResult[S, E] | None:
        """A ``sleep`` / ``wait_for``: take a signal already in the inbox and go on, or
        save the waiting snapshot (and take a signal that arrived meanwhile)."""
        graph = self.graph
        target = directive.resume_at or self.pointer
        on_timeout = directive.on_timeout or graph.timeout_routes.get(self.pointer, "")
        for node in (target, on_timeout):
            if node and not graph.has_node(node):
                return await self._fail(
                    Reason.WAIT_TARGET_INVALID,
                    UnknownNodeError(f"the wait names unknown node {node!r}"),
                )
        name = directive.signal
        self.pointer = target
        if name and self.cp is not None and await self._take_pending(name):
            return None
        now = self.clock()
        wake_at = now + directive.delay if directive.delay is not None else directive.until
        result = await self._save_wait(directive.reason, wake_at, name, on_timeout, emit=False)
        if name and result.resume_token is not None:
            # A signal sent while the wait was being saved saw no waiting head, so it
            # woke nobody: look once more, now that the wait is stored.
            try:
                if await self._take_pending(name):
                    return None
            except Exception as exc:  # noqa: BLE001 - the wait is saved; a sender wakes it
                logger.warning(
                    "flowy: reading the inbox of thread %r after its wait was saved failed: %s",
                    self.thread_id,
                    exc,
                )
        self._emit_wait(result)
        return result

    async def _take_pending(self, name: str) -> bool:
        """Take the next signal ``name`` from the inbox into the state, if there is one."""
        durable = self._durable("wait_for()")
        signal = await next_signal(durable, self.thread_id, name, self.signal_cursors)
        if signal is None:
            return False
        self.state = await take_signal(
            self.graph, self.state, signal, self.signal_cursors, self._merge
        )
        return True

    async def _save_wait(
        self,
        reason: str,
        wake_at: float | None,
        signal: str = "",
        on_timeout: str = "",
        *,
        emit: bool = True,
    ) -> RunResult[S, E]:
        """Save the waiting snapshot (its wake-up time indexed by the store) and build
        the result; ``emit`` the terminal event now (else the caller does)."""
        store = self.services.store
        if store is None:
            result = self._result(RunStatus.WAITING, reason)
            if emit:
                self._emit_wait(result)
            return result
        if wake_at is not None:
            longest = store.limits.max_sleep
            now = self.clock()
            if not 0 <= wake_at <= MAX_TIMESTAMP or wake_at - now > longest:
                return self._fail_unsaved(
                    Reason.NODE_ERROR,
                    LimitError(
                        f"the wait of thread {self.thread_id!r:.200} at node {self.pointer!r} "
                        f"would end at {wake_at!r}, {wake_at - now:.0f} seconds from now; the "
                        f"longest sleep or deadline is {longest:.0f} seconds "
                        "(Limits.max_sleep)"
                    ),
                )
        snap = self._snapshot(
            RunStatus.WAITING, reason, wake_at=wake_at, waiting_for=signal, on_timeout=on_timeout
        )
        error = await self._save_or_stop(snap, "wait")
        saved = error is None
        if saved:
            reason, error = await self._retention(reason, "wait")
        else:
            reason = Reason.WAIT_CHECKPOINT_SKIPPED
        result = self._result(RunStatus.WAITING, reason, token=saved, error=error)
        if emit:
            self._emit_wait(result)
        return result

    def _emit_wait(self, result: RunResult[S, E]) -> None:
        self._emit(
            EventType.WAITING,
            reason=result.reason,
            execution_pointer=result.execution_pointer,
            resume_token=result.resume_token,
        )

    async def _on_interrupt(self, kind: InterruptKind) -> RunResult[S, E]:
        try:
            if kind == "lease_lost":
                err = LeaseLostError(
                    f"the lease on thread {self.thread_id!r:.200} was lost; the run stopped "
                    "without saving (another worker may own the thread now)"
                )
                raise self._lease_lost(err)
            if kind == "handoff":
                return await self._handoff(Reason.LOCAL_HANDOFF)
            return await self._cancel_save()
        except Stop as stop:
            return cast(RunResult[S, E], stop.result)

    async def _cancel_save(self) -> RunResult[S, E]:
        """Save a resumable snapshot after a stop or a cancellation (reason
        ``context_canceled``); a failed save is ``context_canceled_save_failed`` (or
        ``..._checkpoint_skipped`` under SKIP_ON_SAVE_ERROR), reported on the
        ``context_canceled`` event, never as ``failed``."""
        reason: str = Reason.CONTEXT_CANCELED
        error: BaseException | None = None
        persisted = False
        if self.cp is not None:
            try:
                await self._save(self._snapshot(RunStatus.CANCELED, reason))
                persisted = True
            except LeaseLostError as exc:
                raise self._lease_lost(exc) from exc
            except Exception as exc:  # noqa: BLE001 - a failed cancel save is reported on the result and event
                if self.skip_saves:
                    reason = Reason.CONTEXT_CANCELED_CHECKPOINT_SKIPPED
                    error = self._skipped("context_canceled", exc)
                else:
                    reason = Reason.CONTEXT_CANCELED_SAVE_FAILED
                    error = exc
                    self._publish(LifecycleEventType.CHECKPOINT_FAILED, reason=reason, error=exc)
                    logger.warning(
                        "flowy: the cancel checkpoint of thread %r failed: %r", self.thread_id, exc
                    )
            if persisted:
                reason, error = await self._retention(reason, "context_canceled")
        result = self._result(RunStatus.CANCELED, reason, token=persisted, error=error)
        self._emit(
            EventType.CONTEXT_CANCELED,
            reason=reason,
            execution_pointer=self.pointer,
            resume_token=result.resume_token,
        )
        return result
