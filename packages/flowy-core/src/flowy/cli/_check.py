"""``flowy check GRAPH --scenario MODULE:FN``: the crash-safety checker
(``flowy.testing.check``) on the command line."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import threading
from collections.abc import Callable
from typing import Any, cast

from ._options import CliError, load_graph, load_object, one_line
from ._render import Console

__all__ = ["cmd_check"]


class _Stoppable:
    """The scenario function, called by the check inside its own event loop (in another
    thread): each call notes that loop's current task, which ``stop()`` cancels."""

    def __init__(self, scenario: Callable[[], Any]) -> None:
        functools.update_wrapper(self, scenario)  # the check reads its module and name
        self._scenario = scenario
        self._lock = threading.Lock()
        self._stopped = False
        self._task: tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]] | None = None

    def __call__(self) -> Any:
        task = asyncio.current_task()
        if task is not None:
            with self._lock:
                self._task = (task.get_loop(), task)
                stopped = self._stopped
            if stopped:
                task.cancel()
        return self._scenario()

    def stop(self) -> None:
        """Cancel the check's task (from any thread)."""
        with self._lock:
            self._stopped = True
            noted = self._task
        if noted is not None:
            loop, task = noted
            with contextlib.suppress(RuntimeError):  # its loop is closed: it ended
                loop.call_soon_threadsafe(task.cancel)


async def cmd_check(args: argparse.Namespace, out: Console) -> int:
    """``flowy check``: 0 when every seed passed, 1 with the shrunk counterexample."""
    from ..testing.checking import Scenario, acheck, check, parse_schedule

    load_graph(args.spec)  # a graph that cannot be loaded is a usage error
    scenario = load_object(args.scenario, "--scenario")
    if not callable(scenario) or isinstance(scenario, Scenario):
        raise CliError(
            f"--scenario {args.scenario!r} must name a function that returns a "
            "flowy.testing.Scenario",
            2,
        )
    replay = None
    if args.replay is not None:
        try:
            replay = parse_schedule(args.replay)
        except ValueError as exc:
            raise CliError(f"--replay: {one_line(str(exc))}", 2) from None
    options: dict[str, Any] = {
        "seeds": args.seeds,
        "store": args.backend,
        "max_faults": args.max_faults,
        "replay": replay,
        "seed": args.seed,
        "first_seed": args.seed,
    }
    made = cast(Callable[[], Scenario[Any]], scenario)
    try:
        if args.backend is not None:
            # In this loop: Ctrl-C cancels the check here, and it removes its scratch
            # store before the command ends.
            report = await acheck(args.spec, made, **options)
        else:
            # In a thread of its own: on fresh memory stores check() runs its loop on a
            # clock that skips waits.
            stoppable = _Stoppable(made)
            done = asyncio.ensure_future(asyncio.to_thread(check, args.spec, stoppable, **options))
            try:
                report = await asyncio.shield(done)
            except asyncio.CancelledError:
                # Ctrl-C: stop the check's runs and wait for them to save where they
                # were and let go of their leases, before its stores close.
                stoppable.stop()
                with contextlib.suppress(BaseException):
                    await done
                raise
    except TypeError as exc:  # the scenario function returned something else
        raise CliError(f"--scenario {args.scenario!r}: {one_line(str(exc))}", 2) from None
    for line in str(report).splitlines():
        out.line(line)
    return 0 if report.ok else 1
