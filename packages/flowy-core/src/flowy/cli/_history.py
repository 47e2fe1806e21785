"""``flowy history``: a thread's revisions, newest first, with what changed between
them (``--diff``) or as ``--json``. It reads through the ``Backend`` API only and never
writes.
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Mapping, Sequence
from typing import Any, cast

from .._errors import ThreadNotFoundError
from ..storage import (
    Checkpointer,
    Snapshot,
)
from ._inspect import not_found, print_json, snapshot_json, status_styler
from ._options import load_graph
from ._render import Console, clean, compact_json, fmt_time
from ._store import Store, codec_for, locate, open_store

__all__ = ["cmd_history", "print_history", "state_diff"]


async def print_history(
    out: Console, checkpointer: Checkpointer[Any], store: Store, thread: str, limit: int
) -> None:
    """The revisions table of ``thread``, newest first."""
    snaps = await _history(checkpointer, store, thread, limit)
    out.table(
        ["REV", "STATUS", "REASON", "POINTER", "HANDOFF", "SEGMENT", "STEPS", "UPDATED"],
        [
            [
                str(s.revision),
                s.status.value,
                clean(s.reason, 32),
                clean(s.execution_pointer, 32),
                s.handoff_status.value,
                str(s.segment),
                str(s.total_steps),
                fmt_time(s.updated_at),
            ]
            for s in snaps
        ],
        styler=status_styler(out, 1),
    )


async def _history(
    checkpointer: Checkpointer[Any], store: Store, thread: str, limit: int
) -> list[Snapshot[Any]]:
    snaps = await checkpointer.get_history(thread, limit)
    if not snaps:
        try:
            await checkpointer.load(thread)
        except ThreadNotFoundError:
            raise not_found(thread, store) from None
    return snaps


def state_diff(before: Any, after: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """What changed from ``before`` to ``after``, as ``(path, old, new)`` rows: keys of
    mappings are followed, anything else that differs is one row (``...`` marks a
    missing side)."""
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        rows: list[tuple[str, Any, Any]] = []
        old = cast(Mapping[str, Any], before)
        new = cast(Mapping[str, Any], after)
        for key in [*old, *(k for k in new if k not in old)]:
            where = f"{path}.{key}" if path else str(key)
            if key not in new:
                rows.append((where, old[key], ...))
            elif key not in old:
                rows.append((where, ..., new[key]))
            else:
                rows.extend(state_diff(old[key], new[key], where))
        return rows
    if before != after:
        return [(path or "state", before, after)]
    return []


def _print_diffs(out: Console, snaps: Sequence[Snapshot[Any]]) -> None:
    """Each revision and how its state differs from the one before (oldest first)."""
    ordered = sorted(snaps, key=lambda s: s.revision)
    for older, newer in zip([None, *ordered], ordered, strict=False):
        head = (
            f"revision {newer.revision} {out.sym('dot')} {newer.status.value} "
            f"{out.sym('dot')} at {clean(newer.execution_pointer, 40)}"
        )
        out.line(out.paint(head, "bold"))
        if older is None:
            out.line(f"  {compact_json(newer.state)[:200]}")
            continue
        changes = state_diff(_plain(older.state), _plain(newer.state))
        if not changes:
            out.line("  (state unchanged)")
        for where, old, new in changes:
            shown_old = "(absent)" if old is ... else compact_json(old)[:80]
            shown_new = "(absent)" if new is ... else compact_json(new)[:80]
            out.line(f"  {clean(where, 60)}: {shown_old} {out.sym('arrow')} {shown_new}")


def _plain(state: Any) -> Any:
    """A typed state as plain JSON values (what the diff compares)."""
    return json.loads(compact_json(state))


async def cmd_history(args: argparse.Namespace, out: Console) -> int:
    """``flowy history``."""
    store = locate(args.backend, args.db)
    graph = load_graph(args.graph) if args.graph else None
    async with open_store(store, codec_for(args.codec, graph)) as backend:
        if args.diff:
            snaps = await _history(backend.checkpointer, store, args.thread, args.limit)
            if args.json:
                ordered = sorted(snaps, key=lambda s: s.revision)
                print_json(
                    out,
                    [
                        {
                            "revision": newer.revision,
                            "changes": [
                                {
                                    "path": w,
                                    "old": None if o is ... else o,
                                    "new": None if n is ... else n,
                                }
                                for w, o, n in state_diff(_plain(older.state), _plain(newer.state))
                            ],
                        }
                        for older, newer in itertools.pairwise(ordered)
                    ],
                )
            else:
                _print_diffs(out, snaps)
            return 0
        if args.json:
            snaps = await _history(backend.checkpointer, store, args.thread, args.limit)
            print_json(out, [snapshot_json(s, s.revision) for s in snaps])
        else:
            await print_history(out, backend.checkpointer, store, args.thread, args.limit)
    return 0
