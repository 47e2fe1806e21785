"""``flowy queues [set|reset NAME]`` and ``flowy threads --queue NAME``: the queues of a
store (``backend.queues``), their limits changed at run time and their backlog, the same
on every store that keeps them.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from typing import Any, cast

from .._errors import ThreadNotFoundError
from ..queues import QueueLimits, Queues, QueueStats, queues_of
from ..storage._model import validate_queue_name
from ..storage._queues import MAX_RATE_PERIOD
from ._inspect import cmd_threads, print_json
from ._options import CliError, one_line
from ._render import Console, clean, fmt_time
from ._store import Store, locate, open_store

__all__ = [
    "LIMIT_OPTIONS",
    "cmd_queues",
    "cmd_threads_any",
    "limit_value",
    "queue_name",
    "rate_period",
]

LIMIT_OPTIONS = (
    "global_concurrency",
    "worker_concurrency",
    "partition_concurrency",
    "rate_limit",
    "partition_rate_limit",
    "rate_period",
)
"""The limits ``flowy queues set`` changes (``--global-concurrency`` and so on)."""


def queue_name(text: str) -> str:
    """A queue name (``--queue``, ``NAME``)."""
    try:
        return validate_queue_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(one_line(str(exc))) from None


def limit_value(text: str) -> int | None:
    """A limit: a whole number from 0 (nothing starts) up, or ``none`` (no limit)."""
    word = text.strip()
    if word.lower() == "none":
        return None
    if not word.isdecimal() or len(word) > 10 or int(word) > 2**31 - 1:
        raise argparse.ArgumentTypeError(
            f"expected a whole number from 0 to {2**31 - 1}, or 'none', got {clean(text, 40)!r}"
        )
    return int(word)


def rate_period(text: str) -> float | None:
    """``--rate-period``: seconds, or ``none`` (back to the default, 60)."""
    if text.strip().lower() == "none":
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected seconds or 'none', got {clean(text, 40)!r}"
        ) from None
    if not (math.isfinite(value) and 0.001 <= value <= MAX_RATE_PERIOD):
        raise argparse.ArgumentTypeError(
            f"expected seconds from 0.001 to {MAX_RATE_PERIOD:.0f}, got {clean(text, 40)!r}"
        )
    return value


def _queues(backend: Any, store: Store) -> Queues:
    try:
        return queues_of(backend)
    except TypeError:
        raise CliError(
            f"{store.label!r} keeps no queues (its store has none): every hand-off waits in "
            "the default queue",
            2,
        ) from None


def _limits_text(limits: QueueLimits) -> str:
    parts: list[str] = []
    for name, label in (
        ("global_concurrency", "global"),
        ("worker_concurrency", "worker"),
        ("partition_concurrency", "partition"),
    ):
        value = getattr(limits, name)
        if value is not None:
            parts.append(f"{label} {value}")
    period = f"{limits.rate_period:g}s"
    if limits.rate_limit is not None:
        parts.append(f"rate {limits.rate_limit}/{period}")
    if limits.partition_rate_limit is not None:
        parts.append(f"partition rate {limits.partition_rate_limit}/{period}")
    return ", ".join(parts) or "none"


def _age(seconds: float) -> str:
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole // 60 % 60:02d}m"


def _stats_json(stats: QueueStats, now: float) -> dict[str, Any]:
    oldest = stats.oldest_pending_at
    return {
        "queue": stats.queue,
        "limits": stats.limits.to_json(),
        "in_flight": stats.in_flight,
        "pending": stats.pending,
        "oldest_pending_at": oldest,
        "oldest_pending_age": None if oldest is None else max(now - oldest, 0.0),
        "started": stats.started,
    }


async def cmd_queues(args: argparse.Namespace, out: Console) -> int:
    """``flowy queues [set|reset NAME]``."""
    store = locate(args.backend, args.db)
    action = cast(str, args.action or "list")
    name = cast("str | None", args.name)
    changes = {k: getattr(args, k) for k in LIMIT_OPTIONS if hasattr(args, k)}
    if action == "list" and name is not None:
        raise CliError(f"`flowy queues` lists every queue; did you mean `set {name}`?", 2)
    if action != "list" and name is None:
        raise CliError(f"`flowy queues {action}` needs the queue's NAME", 2)
    if action != "set" and changes:
        raise CliError("limits (--global-concurrency, ...) go with `flowy queues set NAME`", 2)
    if action == "set" and not changes:
        raise CliError(
            "give at least one limit to change: --global-concurrency, --worker-concurrency, "
            "--partition-concurrency, --rate-limit, --partition-rate-limit or --rate-period",
            2,
        )
    async with open_store(store, None) as backend:
        queues = _queues(backend, store)
        if action == "list":
            listed = await queues.list()
            return _print_list(out, listed, json=args.json)
        assert name is not None
        try:
            if action == "set":
                limits = await queues.configure(name, **changes)
            else:
                await queues.reset(name)
                limits = QueueLimits()
        except (ValueError, TypeError) as exc:
            raise CliError(one_line(str(exc)), 2) from None
    if args.json:
        print_json(out, {"queue": name, "limits": limits.to_json()})
    elif action == "set":
        shown = _limits_text(limits)
        out.line(f"queue {clean(name)}: {'no limits' if shown == 'none' else shown}")
    else:
        out.line(f"queue {clean(name)}: every limit lifted (its messages stay)")
    return 0


def _print_list(out: Console, listed: list[QueueStats], *, json: bool) -> int:
    now = time.time()
    if json:
        print_json(out, [_stats_json(s, now) for s in listed])
        return 0
    rows: list[list[str]] = []
    for s in listed:
        oldest = s.oldest_pending_at
        limits = s.limits
        started = str(s.started) if limits.rate_limited else "-"
        if limits.rate_limit is not None:
            started += f"/{limits.rate_limit}"
        rows.append(
            [
                clean(s.queue, 64),
                str(s.in_flight),
                str(s.pending),
                "-" if oldest is None else _age(max(now - oldest, 0.0)),
                started,
                _limits_text(limits),
            ]
        )
    out.table(["QUEUE", "IN FLIGHT", "PENDING", "OLDEST", "STARTED", "LIMITS"], rows)
    return 0


async def cmd_threads_any(args: argparse.Namespace, out: Console) -> int:
    """``flowy threads``, or with ``--queue NAME`` the threads with a live message in
    that queue, in the order a worker takes them."""
    queue = cast("str | None", args.queue)
    if queue is None:
        return await cmd_threads(args, out)
    if args.after is not None or args.version is not None:
        raise CliError("--after and --version do not go with --queue", 2)
    if args.recent or args.before is not None:
        raise CliError("--recent and --before do not go with --queue", 2)
    store = locate(args.backend, args.db)
    rows: list[dict[str, Any]] = []
    async with open_store(store, None) as backend:
        messages = await _queues(backend, store).messages(queue, args.limit)
        for m in messages:
            intent = m.intent
            row: dict[str, Any] = {
                "message_id": m.message_id,
                "thread_id": intent.thread_id if intent else None,
                "status": None,
                "execution_pointer": intent.execution_pointer if intent else None,
                "revision": intent.snapshot_revision if intent else None,
                "partition_key": intent.route.partition_key if intent else None,
                "priority": intent.route.priority if intent else None,
                "attempts": m.attempts,
                "enqueued_at": intent.created_at if intent else None,
            }
            if intent is not None:
                try:
                    head, _ = await backend.checkpointer.load(intent.thread_id)
                    row["status"] = head.status.value
                except ThreadNotFoundError:
                    row["status"] = "gone"
            rows.append(row)
    if args.json:
        print_json(out, rows)
        return 0
    if not rows:
        out.line(f"no threads with a message in queue {clean(queue)!r} of {clean(store.label)}")
        return 0
    out.table(
        ["THREAD", "STATUS", "POINTER", "PRIORITY", "PARTITION", "ATTEMPTS", "ENQUEUED"],
        [
            [
                clean(r["thread_id"], 48) if r["thread_id"] is not None else "(undecodable)",
                r["status"] or "-",
                clean(r["execution_pointer"] or "-", 32),
                "-" if r["priority"] is None else str(r["priority"]),
                clean(r["partition_key"] or "-", 32),
                str(r["attempts"]),
                fmt_time(r["enqueued_at"]),
            ]
            for r in rows
        ],
    )
    return 0


def add_queues(sub: Any, store: Sequence[argparse.ArgumentParser]) -> None:
    """Add ``flowy queues`` to the subcommands ``sub`` (``store``: the parent parsers of
    a command that opens a store)."""
    p = sub.add_parser(
        "queues",
        parents=store,
        help="list the queues of a store, or change a queue's limits",
        description="Without ACTION: every queue with its messages in flight and pending, "
        "the age of the oldest pending one, the starts in the current rate window and "
        "its limits. `set NAME` changes some limits of a queue (the others stay; `none` "
        "lifts one); `reset NAME` lifts them all. Every worker's next claim obeys.",
    )
    p.add_argument("action", nargs="?", choices=("set", "reset"), help="set or reset")
    p.add_argument("name", nargs="?", type=queue_name, metavar="NAME", help="the queue")
    limits = p.add_argument_group("limits (with set; a number, or none to lift it)")
    for option, what in (
        ("global_concurrency", "messages in flight across every worker"),
        ("worker_concurrency", "messages in flight in one worker"),
        ("partition_concurrency", "messages of one partition in flight"),
        ("rate_limit", "starts per rate period"),
        ("partition_rate_limit", "starts of one partition per rate period"),
    ):
        limits.add_argument(
            "--" + option.replace("_", "-"),
            dest=option,
            type=limit_value,
            default=argparse.SUPPRESS,
            metavar="N",
            help=f"the most {what}",
        )
    limits.add_argument(
        "--rate-period",
        dest="rate_period",
        type=rate_period,
        default=argparse.SUPPRESS,
        metavar="SECONDS",
        help="the window of both rate limits (default 60)",
    )
    p.set_defaults(handler=cmd_queues)
