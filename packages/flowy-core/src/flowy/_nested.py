"""Subgraph nodes: a child graph run inside the parent's run, entered and left through
its ``enter`` / ``leave`` functions; a pause inside is saved with the child's node and
state (``Segment.nested``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, Generic, cast

from ._activities import RetryLater
from ._directives import Directive, DirectiveKind
from ._events import EventType, InterruptKind
from ._handoff import Handoffs
from ._pauses import Pauses
from ._results import Reason, RunResult
from ._routing import route
from ._segment import Segment, maybe_await
from ._types import E, S
from ._waits import next_signal, take_signal
from .storage import RunStatus, StateCodec
from .storage._codecs import codec_for_type

__all__ = ["Subgraphs"]


class Subgraphs(Generic[S, E]):
    """The subgraph nodes of the segment ``seg``: a pause inside goes through
    ``pauses`` (a hand-off through ``handoffs``), an interrupt to ``on_interrupt``, the
    node's own directive (once the child ended) to ``after_step``."""

    def __init__(
        self,
        seg: Segment[S, E],
        pauses: Pauses[S, E],
        handoffs: Handoffs[S, E],
        after_step: Callable[[str, Directive[E], bool], Awaitable[RunResult[S, E] | None]],
        on_interrupt: Callable[[InterruptKind], Awaitable[RunResult[S, E]]],
    ) -> None:
        self.seg = seg
        self.pauses = pauses
        self.handoffs = handoffs
        self.after_step = after_step
        self.on_interrupt = on_interrupt

    async def run(self, name: str) -> RunResult[S, E] | None:
        """Run the subgraph node ``name``: enter it (or continue where the run paused
        inside), run the child graph to its end, fold ``leave`` and follow ``name``'s
        route. A suspend, hand-off or wait inside pauses the whole run at ``name`` with
        the child's node and state in the snapshot."""
        seg = self.seg
        spec = seg.graph.subgraphs[name]
        child = spec.graph
        codec = codec_for_type(child.state_type)
        meta = seg.meta
        nested, seg.nested = seg.nested, {}
        if nested:
            cstate = codec.decode(json.dumps(nested["state"]).encode())
            cptr = str(nested["pointer"])
            woke, seg.nested_wake = seg.nested_wake, None
            if woke is not None and woke[0] is not None:
                cstate = await take_signal(child, cstate, woke[0], seg.signal_cursors)
            elif woke is not None and woke[1]:
                cptr = str(nested.get("on_timeout") or cptr)
        else:
            try:
                cstate = await maybe_await(spec.enter(seg.state))
            except Exception as exc:  # noqa: BLE001 - fails the run, reported on the result
                return seg.fail_unsaved(Reason.NODE_ERROR, exc)
            cptr = child.entry
        tries: dict[str, int] = {}
        save_steps = seg.graph.save_every_step and seg.cp is not None
        while True:
            kind_now = seg.interrupt_kind
            if kind_now is not None:  # stop here, inside: the resume goes on from here
                self.nest(name, cptr, cstate, codec)
                return await self.on_interrupt(kind_now)
            if meta.step_count >= seg.graph.max_steps:
                return await seg.fail(Reason.MAX_STEPS_EXCEEDED)
            path = f"{name}/{cptr}"
            seg.emit(EventType.NODE_STARTED, node=path, step=meta.step_count + 1)
            seg.in_node = True
            try:
                update, directive = await child.nodes[cptr](cstate)
                cstate = child.reducer(cstate, update)
            except asyncio.CancelledError:
                self.nest(name, cptr, cstate, codec)  # a stop saves the run inside
                raise
            except RetryLater as later:
                seg.in_node = False
                self.nest(name, cptr, cstate, codec)
                return await self.pauses.save_wait(Reason.ACTIVITY_RETRY, later.at)
            except Exception as exc:  # noqa: BLE001 - a node's error fails the run, reported on the result
                return seg.fail_unsaved(Reason.NODE_ERROR, exc)
            finally:
                seg.in_node = False
            meta.step_count += 1
            meta.total_steps += 1
            over = [
                b for b, limit in seg.graph.budgets.items() if meta.budget_counts.get(b, 0) > limit
            ]
            if over:
                return await seg.fail(f"{Reason.BUDGET_EXCEEDED}:{over[0]}")
            while directive.kind is DirectiveKind.EFFECT and directive.base is not None:
                payload = cast(E, directive.payload)
                seg.effects.append(payload)
                seg.emit(EventType.EFFECT, node=path, effect=payload, has_effect=True)
                directive = directive.base
            seg.emit(EventType.NODE_COMPLETED, node=path, step=meta.step_count)
            kind = directive.kind
            target = directive.resume_at or cptr
            if kind is DirectiveKind.END:
                break
            if kind is DirectiveKind.COMPLETED:
                nxt = await route(seg, cptr, child, cstate)
                if nxt is None:
                    break
                cptr = nxt
            elif kind is DirectiveKind.RETRY:
                tries[cptr] = tries.get(cptr, 0) + 1
                if tries[cptr] >= directive.max_attempts:
                    return await seg.fail(f"{name}/{cptr}:{Reason.RETRY_EXHAUSTED}")
            elif kind is DirectiveKind.FAIL:
                return await seg.fail(f"{name}/{cptr}:{directive.reason}")
            elif kind is DirectiveKind.SUSPEND:
                self.nest(name, target, cstate, codec)
                return await self.pauses.suspend(
                    Directive(DirectiveKind.SUSPEND, reason=directive.reason, resume_at=name)
                )
            elif kind is DirectiveKind.HANDOFF:
                self.nest(name, target, cstate, codec)
                # The child node's queue, else the child graph's, else this graph's.
                own = child.node_queues.get(cptr, child.queue)
                queue = own if own is not None else seg.graph.queue_of(name)
                return await self.handoffs.handoff(directive.reason, directive.route(queue))
            elif kind is DirectiveKind.WAIT:
                signal = directive.signal
                timeout_to = directive.on_timeout or child.timeout_routes.get(cptr, "")
                if signal and seg.cp is not None:
                    found = await next_signal(
                        seg.durable("wait_for()"), seg.thread_id, signal,
                        seg.signal_cursors,
                    )  # fmt: skip
                    if found is not None:
                        cstate = await take_signal(child, cstate, found, seg.signal_cursors)
                        cptr = target
                        continue
                now = seg.clock()
                delay, until = directive.delay, directive.until
                self.nest(name, target, cstate, codec, on_timeout=timeout_to)
                waited = await self.pauses.save_wait(
                    directive.reason,
                    now + delay if delay is not None else until,
                    signal,
                    emit=False,
                )
                if signal and waited.resume_token is not None:
                    # A signal sent while the wait was being saved: take it and go on.
                    found = await next_signal(
                        seg.durable("wait_for()"), seg.thread_id, signal,
                        seg.signal_cursors,
                    )  # fmt: skip
                    if found is not None:
                        cstate = await take_signal(child, cstate, found, seg.signal_cursors)
                        cptr, seg.nested = target, {}
                        continue
                self.pauses.emit_wait(waited)
                return waited
            else:
                return await seg.fail(
                    f"{Reason.BRANCH_DIRECTIVE_UNSUPPORTED}:{name}/{cptr}:{kind.value}"
                )
            if save_steps:
                self.nest(name, cptr, cstate, codec)
                seg.pointer = name
                await seg.save_or_stop(seg.snapshot(RunStatus.RUNNING, ""), "step")
                seg.nested = {}
        try:
            update = await maybe_await(spec.leave(seg.state, cstate))
            seg.state = seg.graph.reducer(seg.state, update)
        except Exception as exc:  # noqa: BLE001 - fails the run, reported on the result
            return seg.fail_unsaved(Reason.REDUCER_ERROR, exc)
        seg.nested = {}
        return await self.after_step(name, Directive(DirectiveKind.COMPLETED), save_steps)

    def nest(
        self, name: str, pointer: str, state: Any, codec: StateCodec[Any], on_timeout: str = ""
    ) -> None:
        """Record where the run is inside the subgraph ``name`` (saved with the next
        snapshot); the run's own pointer is ``name``."""
        seg = self.seg
        seg.pointer = name
        seg.nested = {
            "node": name,
            "pointer": pointer,
            "state": json.loads(codec.encode(state)),
            **({"on_timeout": on_timeout} if on_timeout else {}),
        }
