"""``flowy schedules list|create|pause|resume|delete``: the durable schedules of a store
(``backend.schedules``), the same on every store that keeps them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
from typing import Any, cast

from .._errors import ScheduleError
from ..schedules import schedules_of
from ..storage import Schedule
from ..storage.dialect import BaseScheduleStore
from ._inspect import print_json
from ._options import CliError, one_line, parse_json
from ._render import Console, clean, fmt_time
from ._store import Store, locate, open_store

__all__ = ["cmd_schedules", "interval", "schedule_json"]

_INTERVAL = re.compile(r"(\d{1,9})([smhd]?)")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def interval(text: str) -> dt.timedelta:
    """``--every``: whole seconds, or a number with ``s``, ``m``, ``h`` or ``d``."""
    found = _INTERVAL.fullmatch(text.strip())
    if found is None:
        raise argparse.ArgumentTypeError(
            f"expected an interval such as 90s, 15m, 2h or 1d, got {text[:40]!r}"
        )
    return dt.timedelta(seconds=int(found[1]) * _UNITS[found[2]])


def schedule_json(schedule: Schedule) -> dict[str, Any]:
    """A schedule as ``--json`` prints it: its fields and the thread of its next tick."""
    body = schedule.to_json()
    body["next_thread"] = schedule.thread_id(schedule.next_tick)
    return body


def _when(schedule: Schedule) -> str:
    if schedule.cron is not None:
        return f"{schedule.cron} ({schedule.tz})"
    return f"every {dt.timedelta(seconds=schedule.every or 0)}"


def _store_of(backend: Any, store: Store) -> BaseScheduleStore:
    try:
        return schedules_of(backend)
    except TypeError:
        raise CliError(f"{store.label!r} keeps no schedules (its store has none)", 2) from None


async def cmd_schedules(args: argparse.Namespace, out: Console) -> int:
    """``flowy schedules ACTION``."""
    store = locate(args.backend, args.db)
    action: str = args.action
    state: dict[str, Any] = {}
    if action == "create":
        if (args.cron is None) == (args.every is None):
            raise CliError("give --cron EXPR or --every INTERVAL (one of them)", 2)
        given: object = parse_json(args.state, "--state") if args.state is not None else {}
        if not isinstance(given, dict):
            raise CliError('--state must be a JSON object, e.g. \'{"queue": "inbox"}\'', 2)
        state = cast(dict[str, Any], given)
    async with open_store(store, None) as backend:
        schedules = _store_of(backend, store)
        try:
            if action == "list":
                listed = await schedules.list()
                return _print_list(out, store, listed, json=args.json)
            if action == "create":
                made = await schedules.create(
                    args.name,
                    graph=args.graph,
                    cron=args.cron,
                    tz=args.tz,
                    every=args.every,
                    state=state,
                    catch_up=args.catch_up,
                    catch_up_cap=args.catch_up_cap,
                    paused=args.paused,
                )
                return _print_one(out, made, "created", json=args.json)
            if action == "pause":
                return _print_one(out, await schedules.pause(args.name), "paused", json=args.json)
            if action == "resume":
                resumed = await schedules.resume(args.name)
                return _print_one(out, resumed, "resumed", json=args.json)
            await schedules.delete(args.name)
        except (ValueError, TypeError) as exc:
            raise CliError(one_line(str(exc)), 2) from None
        except ScheduleError as exc:
            raise CliError(f"{exc}; `{store.command('schedules', 'list')}` lists them") from None
    if args.json:
        print_json(out, {"deleted": args.name})
    else:
        out.line(f"deleted schedule {clean(args.name)} (the threads it started stay)")
    return 0


def _print_one(out: Console, schedule: Schedule, what: str, *, json: bool) -> int:
    if json:
        print_json(out, schedule_json(schedule))
        return 0
    state = "paused" if schedule.paused else f"next tick {fmt_time(schedule.next_tick)}"
    out.line(f"{what} schedule {clean(schedule.name)}: {_when(schedule)}, {state}")
    return 0


def _print_list(out: Console, store: Store, listed: list[Schedule], *, json: bool) -> int:
    if json:
        print_json(out, [schedule_json(s) for s in listed])
        return 0
    if not listed:
        out.line("no schedules")
        out.line(
            out.paint(
                "create one: "
                + store.command("schedules", "create", "NAME", "--graph", "MODULE:ATTR")
                + " --cron '0 2 * * *'",
                "dim",
            )
        )
        return 0
    out.table(
        ["NAME", "GRAPH", "WHEN", "CATCH-UP", "STATUS", "NEXT TICK", "LAST TICK"],
        [
            [
                clean(s.name, 48),
                clean(s.graph, 48),
                clean(_when(s), 48),
                s.catch_up + (f" (cap {s.catch_up_cap})" if s.catch_up == "all" else ""),
                "paused" if s.paused else "active",
                "-" if s.paused else fmt_time(s.next_tick),
                fmt_time(s.last_tick),
            ]
            for s in listed
        ],
    )
    return 0
