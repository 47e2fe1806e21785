"""``cancel`` and ``terminate``: stop threads from the command line, one by id or many by
filters (``--status``, ``--node``, ``--older-than``) in pages, with ``--dry-run``; and the
filters the bulk forms of ``resume`` and ``dead-letters --requeue`` share.

A bulk action acts thread by thread, each in one atomic write, and prints a progress
line per page and a summary: interrupted, it leaves every thread either done or as it
was, and running it again picks up what is left (a stopped thread no longer matches).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import time
from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass
from typing import Any, cast

from .._cancel import StopOutcome, cancel_thread, is_canceled_from_outside, terminate_thread
from .._errors import ThreadFinishedError, ThreadNotFoundError
from ..storage import Backend, RunStatus, ThreadSummary
from ..storage._adapt import backend_of, bind
from ._inspect import not_found, print_json
from ._options import CliError, one_line
from ._render import Console, clean, fmt_time
from ._store import Store, locate, open_store

__all__ = [
    "Filters",
    "age",
    "add_filters",
    "cmd_cancel",
    "cmd_terminate",
    "matching",
    "progress",
]

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_AGE = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_MAX_AGE = 100 * 365 * 86400.0
_PAGE = 100

CANCELABLE = (
    RunStatus.RUNNING,
    RunStatus.SUSPENDED,
    RunStatus.WAITING,
    RunStatus.HANDOFF,
    RunStatus.CANCELED,
)
"""The statuses a cancel acts on (a ``canceled`` one only if ``request_stop`` wrote it)."""


def age(text: str) -> float:
    """``--older-than``: a number and a unit, ``30s``, ``15m``, ``12h``, ``7d`` or
    ``2w``; in seconds."""
    match = _AGE.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"expected an age like 30s, 15m, 12h, 7d or 2w, got {clean(text, 40)!r}"
        )
    seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if not math.isfinite(seconds) or seconds > _MAX_AGE:
        raise argparse.ArgumentTypeError(f"an age of at most 100 years, got {clean(text, 40)!r}")
    return seconds


def add_filters(
    p: argparse.ArgumentParser,
    statuses: Collection[RunStatus],
    what: str,
    *,
    default: Collection[RunStatus] | None = None,
) -> None:
    """The options of a bulk action over threads: ``--status`` (one of ``statuses``;
    ``default`` when not given, all of them by default), ``--node``, ``--older-than``,
    ``--limit``, ``--page-size`` and ``--dry-run``."""
    group = p.add_argument_group(f"bulk {what} (instead of THREAD)")
    shown = ", ".join(s.value for s in (statuses if default is None else default))
    group.add_argument(
        "--status",
        action="append",
        choices=[s.value for s in statuses],
        help=f"only threads in this status (repeatable; default: {shown})",
    )
    group.add_argument("--node", metavar="NODE", help="only threads whose pointer is NODE")
    group.add_argument(
        "--older-than",
        type=age,
        metavar="AGE",
        help="only threads whose head was saved longer ago than AGE (30s, 15m, 12h, 7d, 2w)",
    )
    group.add_argument(
        "--limit", type=_positive, metavar="N", help="act on at most N threads, then stop"
    )
    group.add_argument(
        "--page-size",
        type=_positive,
        default=_PAGE,
        metavar="N",
        help=f"threads read per page (default: {_PAGE})",
    )
    group.add_argument(
        "--dry-run", action="store_true", help=f"list the threads it would {what}; change nothing"
    )


def _positive(text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a whole number, got {clean(text, 40)!r}"
        ) from None
    if not 1 <= value <= 1_000_000:
        raise argparse.ArgumentTypeError(f"expected 1 to 1000000, got {clean(text, 40)!r}")
    return value


@dataclass(frozen=True)
class Filters:
    """Which threads a bulk action takes."""

    statuses: frozenset[RunStatus]
    node: str | None
    older_than: float | None
    now: float

    @classmethod
    def of(cls, args: argparse.Namespace, default: Collection[RunStatus]) -> Filters | None:
        """The filters given, or ``None`` when none was (a single-thread command)."""
        given = args.status is not None or args.node is not None or args.older_than is not None
        if not given:
            if args.dry_run or args.limit is not None:
                raise CliError("--dry-run and --limit go with --status, --node or --older-than", 2)
            return None
        statuses = frozenset(RunStatus(s) for s in args.status or [s.value for s in default])
        return cls(statuses, args.node, args.older_than, time.time())

    def match(self, head: ThreadSummary) -> bool:
        """True if ``head`` passes every filter."""
        if head.status not in self.statuses:
            return False
        if self.node is not None and head.execution_pointer != self.node:
            return False
        return self.older_than is None or head.updated_at <= self.now - self.older_than


async def matching(
    backend: Backend[Any], filters: Filters, page_size: int, out: Console, verb: str
) -> AsyncIterator[list[ThreadSummary]]:
    """The heads that pass ``filters``, page by page in thread-id order, with a progress
    line on standard error after each page."""
    after: str | None = None
    scanned = pages = 0
    while True:
        page = await backend.checkpointer.list_threads(limit=page_size, after=after)
        pages += 1
        scanned += len(page)
        picked = [head for head in page if filters.match(head)]
        yield picked
        progress(out, verb, f"page {pages}: {scanned} threads read")
        if len(page) < page_size:
            return
        after = page[-1].thread_id


def progress(out: Console, verb: str, text: str) -> None:
    """One progress line of a bulk action, on standard error."""
    del out
    sys.stderr.write(f"flowy {verb}: {text}\n")
    sys.stderr.flush()


def _outcome_json(outcome: StopOutcome) -> dict[str, Any]:
    return {
        "thread_id": outcome.thread_id,
        "status": outcome.status.value,
        "reason": outcome.reason,
        "revision": outcome.revision,
        "previous_status": outcome.previous_status.value,
        "changed": outcome.changed,
        "fenced_owner": outcome.fenced.owner if outcome.fenced else None,
    }


def _outcome_line(outcome: StopOutcome, verb: str) -> str:
    thread = clean(outcome.thread_id, 80)
    if not outcome.changed:
        return f"thread {thread} was {verb} already (revision {outcome.revision})"
    holder = (
        f"; the run of {clean(outcome.fenced.owner, 60)} stops at its next save"
        if outcome.fenced is not None and verb == "canceled"
        else f"; the lease of {clean(outcome.fenced.owner, 60)} is taken away"
        if outcome.fenced is not None
        else ""
    )
    return (
        f"{verb} thread {thread} at revision {outcome.revision} (was "
        f"{outcome.previous_status.value}): {clean(outcome.reason, 120)}{holder}"
    )


async def _stop_one(
    backend: Backend[Any], thread: str, reason: str | None, terminate: bool, store: Store
) -> StopOutcome:
    parts = bind(backend_of(backend, None, None), None)
    act = terminate_thread if terminate else cancel_thread
    try:
        return await act(parts.checkpointer, parts.leases, thread, reason, clock=time.time)
    except ThreadNotFoundError:
        raise not_found(thread, store) from None
    except ThreadFinishedError as exc:
        raise CliError(one_line(str(exc))) from None
    except (ValueError, TypeError) as exc:  # a bad thread id or reason
        raise CliError(one_line(str(exc)), 2) from None


async def cmd_cancel(args: argparse.Namespace, out: Console) -> int:
    """``flowy cancel``."""
    return await _stop(args, out, terminate=False)


async def cmd_terminate(args: argparse.Namespace, out: Console) -> int:
    """``flowy terminate``."""
    return await _stop(args, out, terminate=True)


async def _stop(args: argparse.Namespace, out: Console, *, terminate: bool) -> int:
    verb, past = ("terminate", "terminated") if terminate else ("cancel", "canceled")
    filters = Filters.of(args, CANCELABLE) if not terminate else None
    thread = cast("str | None", args.thread)
    if thread is not None and filters is not None:
        raise CliError("give a THREAD or filters (--status, --node, --older-than), not both", 2)
    if thread is None and filters is None:
        raise CliError(
            f"give the THREAD to {verb}"
            + ("" if terminate else ", or filters: --status, --node, --older-than"),
            2,
        )
    reason = cast("str | None", args.reason)
    store = locate(args.backend, args.db)
    async with open_store(store, None) as backend:
        if thread is not None:
            outcome = await _stop_one(backend, thread, reason, terminate, store)
            if args.json:
                print_json(out, _outcome_json(outcome))
            else:
                out.line(_outcome_line(outcome, past))
            return 0
        assert filters is not None
        return await _bulk_cancel(backend, filters, args, out, reason, store)


async def _bulk_cancel(
    backend: Backend[Any],
    filters: Filters,
    args: argparse.Namespace,
    out: Console,
    reason: str | None,
    store: Store,
) -> int:
    limit = cast("int | None", args.limit)
    done: list[dict[str, Any]] = []
    acted = skipped = 0
    async for page in matching(backend, filters, args.page_size, out, "cancel"):
        for head in page:
            if limit is not None and acted >= limit:
                break
            if is_canceled_from_outside(head.status, head.reason):
                continue  # canceled already: a re-run after an interruption
            acted += 1
            if args.dry_run:
                done.append(_head_json(head))
                if not args.json:
                    out.line(
                        f"would cancel {clean(head.thread_id, 80)} ({head.status.value} at "
                        f"{clean(head.execution_pointer, 40)}, saved {fmt_time(head.updated_at)})"
                    )
                continue
            try:
                outcome = await _stop_one(backend, head.thread_id, reason, False, store)
            except CliError as exc:  # finished or gone meanwhile: the others go on
                skipped += 1
                acted -= 1
                if not args.json:
                    out.line(f"skipped {clean(head.thread_id, 80)}: {exc}")
                continue
            done.append(_outcome_json(outcome))
            if not args.json:
                out.line(_outcome_line(outcome, "canceled"))
        if limit is not None and acted >= limit:
            break
    if args.json:
        print_json(out, done)
    elif args.dry_run:
        out.line(f"dry run: would cancel {acted} thread(s); nothing was changed")
    else:
        tail = f", {skipped} skipped (finished or gone meanwhile)" if skipped else ""
        out.line(f"canceled {acted} thread(s){tail}")
    return 0


def _head_json(head: ThreadSummary) -> dict[str, Any]:
    return {
        "thread_id": head.thread_id,
        "status": head.status.value,
        "reason": head.reason,
        "execution_pointer": head.execution_pointer,
        "revision": head.revision,
        "updated_at": head.updated_at,
    }
