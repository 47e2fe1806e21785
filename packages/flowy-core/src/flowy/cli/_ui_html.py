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

__all__ = [
    "CSS",
    "age",
    "e",
    "href",
    "in_seconds",
    "mermaid_marked",
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


def mermaid_id(name: str) -> str:
    """The Mermaid node id ``Graph.to_mermaid`` gives ``name``."""
    return "n_" + "".join(c if c.isalnum() else "_" for c in name)


def mermaid_marked(graph: Graph[Any, Any], snap: Snapshot[Any]) -> str:
    """``graph.to_mermaid()`` with the node the thread is at (and, inside a subgraph,
    its inner node) in the ``current`` class."""
    text = graph.to_mermaid()
    marked = [mermaid_id(snap.execution_pointer)]
    inner = snap.nested.get("pointer") if snap.nested else None
    if inner is not None:
        marked.append(mermaid_id(snap.execution_pointer) + "__" + mermaid_id(str(inner))[2:])
    lines = ["    classDef current fill:#ffd54f,stroke:#e65100,stroke-width:3px"]
    lines += [f"    class {m} current" for m in marked]
    return text + "\n".join(lines) + "\n"


def thread_path(thread: str) -> str:
    return "/threads/" + urllib.parse.quote(thread, safe="")
