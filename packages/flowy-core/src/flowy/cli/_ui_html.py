r"""The inspector's HTML building blocks (``flowy ui``): escaping, times, links, tables
and the Mermaid graph with the thread's node marked. Every value a store holds goes
through :func:`e` before it reaches a page.
"""

from __future__ import annotations

import html
import json
import time
import urllib.parse
from collections.abc import Iterable, Sequence
from typing import Any

from .._graph import Graph
from ..storage import Snapshot
from ._render import compact_json
from ._svg import to_svg

__all__ = [
    "CSS",
    "age",
    "e",
    "href",
    "in_seconds",
    "drawn_graph",
    "path_of",
    "plain",
    "table",
    "thread_href",
    "thread_path",
    "when",
]

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
nav a{margin-right:1em}
table{border-collapse:collapse;margin:.5em 0}
th,td{border:1px solid #ccc;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#f3f3f3}
pre{background:#f7f7f7;border:1px solid #ddd;padding:.5em;overflow:auto;max-height:30em}
.msg{background:#e7f6e7;border:1px solid #7c7;padding:.5em}
.err{background:#fbe9e9;border:1px solid #d77;padding:.5em}
.status{font-weight:bold}
form.inline{display:inline}
textarea{width:30em;height:6em;font-family:monospace}
dt{font-weight:bold;float:left;width:9em;clear:left}
dd{margin-left:10em}
"""


def e(value: object) -> str:
    r"""``value`` as escaped HTML text; control, format (bidi) and other non-printable
    characters but newlines shown as ``\uXXXX`` escapes, so stored text cannot
    reorder or hide what the page shows."""
    text = str(value)
    if not text.isprintable():
        text = "".join(c if c.isprintable() or c == "\n" else repr(c)[1:-1] for c in text)
    return html.escape(text, quote=True)


def when(timestamp: float) -> str:
    """``timestamp`` as local time; a time the platform cannot show as a date (past the
    year 9999, or NaN) as its number of seconds."""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))
    except (OverflowError, OSError, ValueError):
        return f"{timestamp:.6g} s since the epoch"


def in_seconds(seconds: float) -> str:
    """``seconds`` from now, for a person."""
    return f"in {seconds:.0f}s" if seconds < 1e12 else f"in {seconds:.3g}s"


def href(path: str, **params: str) -> str:
    query = urllib.parse.urlencode({k: v for k, v in params.items() if v})
    return e(path + ("?" + query if query else ""))


def thread_href(thread: str) -> str:
    return href("/threads/" + urllib.parse.quote(thread, safe=""))


def age(timestamp: float | None, now: float) -> str:
    if not timestamp:
        return "-"
    return f"{max(now - timestamp, 0.0):.0f}s ago"


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], empty: str) -> str:
    """A table of already-escaped cells."""
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    if not body:
        return f"<p><em>{e(empty)}</em></p>"
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def plain(state: Any) -> Any:
    return json.loads(compact_json(state))


def path_of(history: Sequence[Snapshot[Any]]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The nodes a thread reached along ``history`` (oldest first) with how many times
    each (a run of revisions at one node is one visit), and the edges it went along."""
    visits: dict[str, int] = {}
    taken: list[tuple[str, str]] = []
    previous: str | None = None
    for snap in history:
        node = snap.execution_pointer
        if node != previous:
            visits[node] = visits.get(node, 0) + 1
            if previous is not None:
                taken.append((previous, node))
        previous = node
    return visits, taken


def drawn_graph(
    graph: Graph[Any, Any], snap: Snapshot[Any], history: Sequence[Snapshot[Any]]
) -> str:
    """``graph`` as inline SVG with the node the thread is at (and, inside a subgraph,
    its inner node) marked, and the path of ``history`` with visit counts."""
    visits, taken = path_of(history)
    inner = snap.nested.get("pointer") if snap.nested else None
    return to_svg(
        graph,
        current=snap.execution_pointer,
        inner_current=None if inner is None else str(inner),
        visits=visits,
        taken=taken,
        title=f"the graph, at {snap.execution_pointer}",
    )


def thread_path(thread: str) -> str:
    return "/threads/" + urllib.parse.quote(thread, safe="")
