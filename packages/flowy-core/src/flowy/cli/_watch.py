"""``flowy watch``: follow a thread from any process, each saved snapshot as a line and
the progress its nodes send between them, until it completes or fails (``--json``: one
JSON object a line). It reads through ``Backend.watch`` and never writes.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..storage import RunStatus
from ..storage._watch import WatchEvent
from ._inspect import snapshot_json
from ._options import load_graph
from ._render import Console, clean, compact_json
from ._store import codec_for, locate, open_store

__all__ = ["cmd_watch"]


def _event_json(event: WatchEvent[Any]) -> dict[str, Any]:
    if event.snapshot is not None:
        return {"kind": "snapshot", **snapshot_json(event.snapshot, event.revision)}
    return {
        "kind": "progress",
        "thread_id": event.thread_id,
        "revision": event.revision,
        "node": event.node,
        "data": event.data,
    }


def _event_line(out: Console, event: WatchEvent[Any]) -> str:
    snap = event.snapshot
    if snap is None:
        where = clean(event.node, 32)
        return f"  {out.paint(where, 'dim')} {compact_json(event.data)[:200]}"
    status = out.status(snap.status)
    reason = f" ({clean(snap.reason, 40)})" if snap.reason else ""
    return (
        f"revision {event.revision} {out.sym('dot')} {status}{reason} {out.sym('dot')} "
        f"at {clean(snap.execution_pointer, 40)}"
    )


async def cmd_watch(args: argparse.Namespace, out: Console) -> int:
    """``flowy watch``: 0 once the thread completed, 1 if it failed."""
    store = locate(args.backend, args.db)
    graph = load_graph(args.graph) if args.graph else None
    async with open_store(store, codec_for(args.codec, graph)) as backend:
        last: WatchEvent[Any] | None = None
        async for event in backend.watch(args.thread, after=args.after, poll=args.poll):
            last = event
            if args.json:
                out.line(compact_json(_event_json(event)))
            else:
                out.line(_event_line(out, event))
    if last is not None and last.snapshot is not None:
        return 1 if last.snapshot.status is RunStatus.FAILED else 0
    return 0
