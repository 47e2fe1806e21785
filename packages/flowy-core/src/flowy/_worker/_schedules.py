"""The worker's schedule part: every ``schedule_interval`` seconds it lists the store's
schedules, claims the due ticks of each (one compare-and-set: of any number of workers,
one claims a tick) and starts a thread per claimed tick, ``concurrency`` at a time.

The time is the runner's ``clock``, so tests move it instead of sleeping. A tick's
thread id is derived from the schedule and the tick, so even a second start of the same
tick is refused by the checkpointer. Once a tick's thread started (or exists), the worker
says so (``BaseScheduleStore.started``); a tick whose start failed, or whose worker died
first, stays pending and is claimed again once its hold (the worker's lease ttl) runs
out. A start that fails is logged with its traceback.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from typing import Any, Generic

from .._compiled import Graph
from .._errors import ConcurrencyConflictError, ThreadAlreadyRunningError, ThreadLeaseBusyError
from .._runner import Runner
from .._types import E, S
from ..storage import Schedule
from ..storage.dialect import BaseScheduleStore
from ._shared import Shared

__all__ = ["Schedules", "load_graph"]

logger = logging.getLogger("flowy.worker")


def load_graph(target: str) -> Graph[Any, Any]:
    """The compiled graph ``"package.module:attribute"`` names; ``ValueError`` if it
    cannot be imported or is not a compiled graph."""
    module_name, _, attribute = target.partition(":")
    try:
        found: object = importlib.import_module(module_name)
        for part in attribute.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load the graph {target!r}: {exc}") from None
    if not isinstance(found, Graph):
        raise ValueError(
            f"{target!r} is a {type(found).__name__}, not a compiled graph (GraphBuilder.compile())"
        )
    return found  # pyright: ignore[reportUnknownVariableType]


class Schedules(Generic[S, E]):
    """Fires the due schedules of one worker's store."""

    def __init__(self, shared: Shared[S, E], store: BaseScheduleStore | None) -> None:
        self.shared = shared
        self.store = store
        self._runners: dict[str, Runner[Any, Any]] = {}

    async def loop(self, interval: float) -> None:
        """Fire the due schedules every ``interval`` seconds until the worker stops."""
        shared = self.shared
        while not shared.stopping.is_set():
            await self.fire()
            await shared.pause(interval)

    async def fire(self) -> int:
        """Claim the due ticks of every schedule at the runner's clock and start their
        threads; returns how many threads this worker started."""
        if self.store is None:
            return 0
        shared = self.shared
        now = shared.runner.clock()
        hold = shared.options.lease_ttl
        try:
            schedules = await self.store.list()
        except Exception as exc:  # noqa: BLE001 - logged; the next look tries again
            shared.log_failure("listing schedules failed", exc)
            return 0
        starts: list[tuple[Schedule, float, str]] = []
        for schedule in schedules:
            if not schedule.due_at(now):
                continue
            try:
                claim = await self.store.claim_from(schedule, now, hold=hold)
            except Exception as exc:  # noqa: BLE001 - logged; the next look tries again
                shared.log_failure(f"claiming schedule {schedule.name!r} failed", exc)
                continue
            if claim is not None:  # else another worker claimed it first
                starts += [(claim.schedule, tick, thread) for tick, thread in claim.ticks]
        gate = asyncio.Semaphore(shared.options.concurrency)

        async def start(schedule: Schedule, tick: float, thread_id: str) -> int:
            async with gate:
                return await self._start(schedule, tick, thread_id)

        return sum(await asyncio.gather(*(start(*one) for one in starts)))

    async def _start(self, schedule: Schedule, tick: float, thread_id: str) -> int:
        shared = self.shared
        started = 1
        try:
            runner = self._runner(schedule.graph)
            state = _initial_state(runner, schedule)
            lease = (shared.owner, shared.options.lease_ttl)
            await runner.start(
                thread_id,
                state,
                run_lease=lease if runner.lease_manager is not None else None,
                metadata={"schedule": schedule.name, "tick": tick},
            )
        except ConcurrencyConflictError:
            started = 0  # the tick's thread exists already: another start got there
        except (ThreadAlreadyRunningError, ThreadLeaseBusyError):
            return 0  # another worker is starting it now; it says so when it has
        except Exception as exc:
            logger.error(
                "flowy worker %r: schedule %r could not start thread %r (it stays pending "
                "and is tried again once its hold runs out)",
                shared.owner,
                schedule.name,
                thread_id,
                exc_info=exc,
            )
            return 0
        assert self.store is not None
        try:
            await self.store.started(schedule.name, tick)
        except Exception as exc:  # noqa: BLE001 - the tick stays pending: a later start is refused
            shared.log_failure(f"marking tick {thread_id!r} started failed", exc)
        return started

    def _runner(self, target: str) -> Runner[Any, Any]:
        runner = self._runners.get(target)
        if runner is None:
            own = self.shared.runner
            graph = load_graph(target)
            if graph is own.graph:
                runner = own
            else:
                assert own.backend is not None
                runner = Runner(graph, own.backend, run_lease=own.run_lease, clock=own.clock)
            self._runners[target] = runner
        return runner


def _initial_state(runner: Runner[Any, Any], schedule: Schedule) -> Any:
    """The schedule's JSON state, as the graph's state type if it has one (built from
    the JSON object's fields)."""
    state: Any = schedule.state
    state_type: Any = runner.graph.state_type
    if state_type is None or state_type is dict or not isinstance(state, dict):
        return state
    return state_type(**state)
