"""The bulk forms of ``resume`` (every thread matching ``--status``, ``--node`` and
``--older-than``) and of ``dead-letters --requeue`` (every dead letter matching
``--node``, ``--older-than`` and ``--error``): pages, ``--dry-run``, a progress line per
page and a summary, safe to interrupt and run again (a resumed thread or a requeued
letter no longer matches).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Literal, cast

from .._errors import FlowyError
from .._runner import Runner, default_owner
from .._types import ResumeToken
from ..storage import OutboxConsumer, RunStatus
from ..storage._model import DeadLetter
from ._inspect import dead_letter_json, print_json
from ._operate import cmd_dead_letters, cmd_resume, result_json
from ._options import CliError, load_graph, one_line, parse_overlay
from ._render import Console, clean, fmt_time, result_line
from ._stop import Filters, matching, progress
from ._store import codec_for, locate, open_store

__all__ = [
    "RESUMABLE",
    "SCAN",
    "RequeuePage",
    "Requeued",
    "bulk_requeue",
    "bulk_resume",
    "cmd_dead_letters_any",
    "cmd_resume_any",
    "requeue_pages",
]

RESUMABLE = (RunStatus.CANCELED, RunStatus.SUSPENDED, RunStatus.FAILED, RunStatus.RUNNING)
"""The statuses a bulk resume may take (default: canceled only)."""

SCAN = 10_000
"""Dead letters a bulk requeue reads at most in one run (run it again for more)."""


async def bulk_resume(args: argparse.Namespace, out: Console, filters: Filters) -> int:
    """``flowy resume --graph G`` with filters instead of THREAD: resume each matching
    thread from its head, one after another."""
    if args.revision is not None or args.at is not None:
        raise CliError("--revision and --at go with one THREAD, not with filters", 2)
    store = locate(args.backend, args.db)
    graph = load_graph(args.graph)
    codec = codec_for(args.codec, graph)
    overlay = parse_overlay(args.overlay, codec)
    limit = cast("int | None", args.limit)
    rows: list[dict[str, Any]] = []
    acted = failed = 0
    async with open_store(store, codec) as backend:
        runner: Runner[Any, Any] = Runner(
            graph, backend, run_lease=(args.owner or default_owner(), args.lease_ttl)
        )
        async for page in matching(backend, filters, args.page_size, out, "resume"):
            for head in page:
                if limit is not None and acted >= limit:
                    break
                acted += 1
                if args.dry_run:
                    rows.append({"thread_id": head.thread_id, "revision": head.revision})
                    if not args.json:
                        out.line(
                            f"would resume {clean(head.thread_id, 80)}@{head.revision} "
                            f"({head.status.value} at {clean(head.execution_pointer, 40)}, "
                            f"saved {fmt_time(head.updated_at)})"
                        )
                    continue
                token = ResumeToken(head.thread_id, head.revision)
                try:
                    result = await runner.resume(token, state_overlay=overlay)
                except (FlowyError, ValueError) as exc:  # moved on meanwhile, busy, …
                    failed += 1
                    rows.append({"thread_id": head.thread_id, "error": one_line(str(exc))})
                    if not args.json:
                        out.line(f"{clean(head.thread_id, 80)}: not resumed: {one_line(str(exc))}")
                    continue
                failed += result.status is RunStatus.FAILED
                rows.append(result_json(result))
                if not args.json:
                    out.line(f"{clean(head.thread_id, 80)}: {result_line(out, result)}")
            if limit is not None and acted >= limit:
                break
    if args.json:
        print_json(out, rows)
    elif args.dry_run:
        out.line(f"dry run: would resume {acted} thread(s); nothing was changed")
    else:
        out.line(f"resumed {acted} thread(s), {failed} failed or not resumed")
    return 1 if failed else 0


def _letter_matches(letter: DeadLetter, args: argparse.Namespace, now: float) -> bool:
    intent = letter.intent
    if args.node is not None and (intent is None or intent.execution_pointer != args.node):
        return False
    if args.older_than is not None and (
        intent is None or intent.created_at > now - args.older_than
    ):
        return False
    return args.error is None or args.error in letter.error


@dataclass(frozen=True)
class Requeued:
    """What a bulk requeue did with one dead letter: ``"requeued"`` (in a dry run: would
    be), ``"gone"`` (no longer a dead letter when its turn came: requeued or dropped by
    someone else meanwhile) or ``"failed"`` (``error`` says why)."""

    letter: DeadLetter
    outcome: Literal["requeued", "gone", "failed"]
    error: str = ""


@dataclass(frozen=True)
class RequeuePage:
    """One page of a bulk requeue: what it did with each letter it took, in order, and
    how many of the ``total`` dead letters it has read so far."""

    done: tuple[Requeued, ...]
    read: int
    total: int


async def requeue_pages(
    consumer: OutboxConsumer,
    keep: Callable[[DeadLetter], bool],
    *,
    limit: int,
    page_size: int,
    dry_run: bool = False,
) -> AsyncIterator[RequeuePage]:
    """Requeue the dead letters ``keep`` accepts (up to ``limit`` of them, the first
    :data:`SCAN` read), a page of ``page_size`` at a time; a letter whose requeue fails
    is reported and the rest go on. Safe to stop between pages and run again: a
    requeued letter is no longer a dead letter."""
    letters = await consumer.dead_letters(SCAN)
    acted = 0
    for start in range(0, len(letters), page_size):
        done: list[Requeued] = []
        for letter in letters[start : start + page_size]:
            if acted >= limit:
                break
            if not keep(letter):
                continue
            if not dry_run:
                try:
                    await consumer.retry_dead_letter(letter.message_id)
                # The SQLite store turns a numeric id into a 64-bit integer first.
                except (KeyError, OverflowError):
                    done.append(Requeued(letter, "gone"))
                    continue
                except FlowyError as exc:
                    acted += 1
                    error = f"{type(exc).__name__}: {one_line(str(exc))}"
                    done.append(Requeued(letter, "failed", error))
                    continue
            acted += 1
            done.append(Requeued(letter, "requeued"))
        yield RequeuePage(tuple(done), min(start + page_size, len(letters)), len(letters))
        if acted >= limit:
            break


async def bulk_requeue(args: argparse.Namespace, out: Console) -> int:
    """``flowy dead-letters --requeue``: requeue every dead letter that matches."""
    store = locate(args.backend, args.db)
    now = time.time()
    rows: list[dict[str, Any]] = []
    acted = gone = failed = 0
    async with open_store(store, None) as backend:
        pages = requeue_pages(
            backend.consumer,
            lambda letter: _letter_matches(letter, args, now),
            limit=cast("int", args.limit),
            page_size=cast("int", args.page_size),
            dry_run=args.dry_run,
        )
        async for page in pages:
            for step in page.done:
                letter = step.letter
                if step.outcome == "gone":
                    gone += 1
                    continue
                row = dead_letter_json(letter)
                message = clean(letter.message_id, 80)
                thread = clean(letter.intent.thread_id, 60) if letter.intent else "(undecodable)"
                if step.outcome == "failed":
                    failed += 1
                    rows.append({**row, "requeue_error": step.error})
                    if not args.json:
                        out.line(f"{message} ({thread}): not requeued: {step.error}")
                    continue
                acted += 1
                rows.append(row)
                if not args.json:
                    verb = "would requeue" if args.dry_run else "requeued"
                    out.line(f"{verb} {message} ({thread})")
            progress(out, "dead-letters", f"{page.read} of {page.total} dead letters read")
    if args.json:
        print_json(out, rows)
    elif args.dry_run:
        out.line(f"dry run: would requeue {acted} dead letter(s); nothing was changed")
    else:
        tail = f", {gone} gone meanwhile" if gone else ""
        tail += f", {failed} failed" if failed else ""
        out.line(f"requeued {acted} dead letter(s){tail}")
    return 1 if failed else 0


async def cmd_resume_any(args: argparse.Namespace, out: Console) -> int:
    """``flowy resume``: one THREAD, or every thread the filters match."""
    filters = Filters.of(args, (RunStatus.CANCELED,))
    if args.thread is not None and filters is not None:
        raise CliError("give a THREAD or filters (--status, --node, --older-than), not both", 2)
    if filters is not None:
        return await bulk_resume(args, out, filters)
    if args.thread is None:
        raise CliError(
            "give the THREAD[@N] to resume, or filters: --status, --node, --older-than", 2
        )
    return await cmd_resume(args, out)


async def cmd_dead_letters_any(args: argparse.Namespace, out: Console) -> int:
    """``flowy dead-letters``: list, ``--retry ID``, or ``--requeue`` by filters."""
    filtered = args.node is not None or args.older_than is not None or args.error is not None
    if args.requeue:
        if args.retry:
            raise CliError("give --retry ID or --requeue with filters, not both", 2)
        return await bulk_requeue(args, out)
    if filtered or args.dry_run:
        raise CliError("--node, --older-than, --error and --dry-run go with --requeue", 2)
    return await cmd_dead_letters(args, out)
