"""``flowy check GRAPH --scenario MODULE:FN``: the crash-safety checker
(``flowy.testing.check``) on the command line."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable
from typing import Any, cast

from ._options import CliError, load_graph, load_object, one_line
from ._render import Console

__all__ = ["cmd_check"]


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
        if args.backend is None:
            # In a thread of its own: on fresh memory stores check() runs its loop on a
            # clock that skips waits.
            report = await asyncio.to_thread(check, args.spec, made, **options)
        else:
            # In this loop: Ctrl-C cancels the check here, and it removes its scratch
            # store before the command ends.
            report = await acheck(args.spec, made, **options)
    except TypeError as exc:  # the scenario function returned something else
        raise CliError(f"--scenario {args.scenario!r}: {one_line(str(exc))}", 2) from None
    for line in str(report).splitlines():
        out.line(line)
    return 0 if report.ok else 1
