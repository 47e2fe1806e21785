r"""The inspector's HTML building blocks (``flowy ui``): escaping, times, links, tables
and the Mermaid graph with the thread's node marked. Every value a store holds goes
through :func:`e` before it reaches a page.
"""

from __future__ import annotations

import html
import json
import time
import urllib.parse
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from .._graph import Graph
from ..storage import Snapshot
from ._render import compact_json
from ._svg import to_svg

__all__ = [
    "CSS",
    "LIVE_JS",
    "age",
    "e",
    "href",
    "in_seconds",
    "drawn_graph",
    "path_of",
    "plain",
    "relative",
    "span",
    "status_badge",
    "table",
    "thread_href",
    "thread_path",
    "when",
]

CSS = """
:root{color-scheme:light dark;--bg:#f7f8fa;--fg:#1f2933;--muted:#616e7c;--card:#fff;
--line:#d9dee4;--head:#eef1f4;--link:#1c5fc4;--ok:#1b7a3e;--warn:#a15c00;--bad:#b3261e;
--info:#1c5fc4;--msg:#e6f4ea;--err:#fbe9e7}
@media (prefers-color-scheme:dark){:root{--bg:#12161b;--fg:#e4e9ee;--muted:#9aa8b6;
--card:#1a2027;--line:#2e3742;--head:#222a33;--link:#7fb2ff;--ok:#5fd48a;--warn:#f0b85a;
--bad:#ff8a80;--info:#7fb2ff;--msg:#173524;--err:#3d1c1a}}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;background:var(--bg);
color:var(--fg)}
a{color:var(--link)}
header{display:flex;flex-wrap:wrap;gap:.4em 1.2em;align-items:baseline;padding:.6em 1em;
background:var(--card);border-bottom:1px solid var(--line)}
header .brand{font-weight:700}
header nav a{margin-right:1em}
header .store{color:var(--muted);font-size:.9em;overflow-wrap:anywhere}
header .live{margin-left:auto;color:var(--muted);font-size:.85em}
main{padding:.5em 1em 2em;max-width:1400px}
h1{font-size:1.35em;margin:.6em 0 .3em;overflow-wrap:anywhere}
h2{font-size:1.1em;margin:1.3em 0 .4em}
.num,td,th,time,.count{font-variant-numeric:tabular-nums}
td time,td.num{white-space:nowrap}
.scroll{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;margin:.4em 0;background:var(--card)}
th,td{border:1px solid var(--line);padding:.3em .55em;text-align:left;vertical-align:top}
th{background:var(--head);font-weight:600}
td.num,th.num{text-align:right}
code,pre{font:12.5px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
pre{background:var(--card);border:1px solid var(--line);padding:.6em;overflow:auto;
max-height:32em;white-space:pre-wrap;overflow-wrap:anywhere}
.msg{background:var(--msg);border:1px solid var(--ok);padding:.5em}
.err{background:var(--err);border:1px solid var(--bad);padding:.5em}
.status{font-weight:600}
.st-completed{color:var(--ok)}.st-failed{color:var(--bad)}
.st-suspended,.st-waiting,.st-canceled{color:var(--warn)}.st-running,.st-handoff{color:var(--info)}
.muted{color:var(--muted)}
.cards{display:flex;flex-wrap:wrap;gap:.5em;margin:.4em 0}
.card{background:var(--card);border:1px solid var(--line);border-radius:6px;padding:.4em .7em;
min-width:7.5em;text-decoration:none;color:inherit}
.card b{display:block;font-size:1.3em}
a.card:hover{border-color:var(--link)}
.card.on{border-color:var(--link);box-shadow:0 0 0 1px var(--link)}
meter{width:7em;vertical-align:middle}
form.filters{display:flex;flex-wrap:wrap;gap:.4em .8em;align-items:end;margin:.6em 0}
form.filters label{display:flex;flex-direction:column;font-size:.85em;color:var(--muted)}
form.inline{display:inline}
form.bulk{display:flex;flex-wrap:wrap;gap:.4em .8em;align-items:center;margin:.6em 0}
input,select,textarea,button{font:inherit;color:inherit;background:var(--card);
border:1px solid var(--line);border-radius:4px;padding:.2em .4em}
button{cursor:pointer;background:var(--head)}
textarea{width:min(30em,100%);height:6em;font-family:ui-monospace,monospace}
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:.2em 1em;margin:.4em 0}
dl.facts dt{font-weight:600;color:var(--muted)}dl.facts dd{margin:0;overflow-wrap:anywhere}
details>summary{cursor:pointer;color:var(--link)}
.graph{width:fit-content;max-width:100%;overflow-x:auto;background:var(--card);
border:1px solid var(--line);padding:.3em}
.graph svg{display:block;max-width:none}
.pager{display:flex;gap:1em;margin:.5em 0}
.grid{display:grid;grid-template-columns:minmax(0,1fr) minmax(0,1fr);gap:0 1.5em}
@media (max-width:800px){.grid{grid-template-columns:minmax(0,1fr)}main{padding:.4em .6em}
header{padding:.5em .6em}header .live{margin-left:0}}
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


def span(seconds: float) -> str:
    """A length of time for a person: ``42 s``, ``3 min``, ``5 h``, ``2 d``."""
    if seconds != seconds:  # NaN
        return "? s"
    seconds = abs(seconds)
    if seconds < 10:
        return f"{seconds:.1f}".rstrip("0").rstrip(".") + " s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min"
    if seconds < 86400 * 2:
        return f"{seconds // 3600:.0f} h"
    if seconds < 86400 * 1e6:
        return f"{seconds // 86400:.0f} d"
    return f"{seconds / 86400:.3g} d"


def in_seconds(seconds: float) -> str:
    """``seconds`` from now, for a person: ``in 3 min``."""
    return f"in {span(seconds)}"


def relative(timestamp: float | None, now: float) -> str:
    """``timestamp`` relative to ``now`` (``3 min ago``, ``in 2 h``), as a ``<time>``
    whose title is the exact local time; ``-`` without one."""
    if not timestamp:
        return "-"
    delta = timestamp - now
    text = (
        "just now" if abs(delta) < 1 else (in_seconds(delta) if delta > 0 else f"{span(delta)} ago")
    )
    return f"<time title='{e(when(timestamp))}'>{e(text)}</time>"


def age(timestamp: float | None, now: float) -> str:
    """``timestamp`` as how long ago, as plain text (``3 min ago``)."""
    if not timestamp:
        return "-"
    return f"{span(max(now - timestamp, 0.0))} ago"


def href(path: str, **params: str) -> str:
    query = urllib.parse.urlencode({k: v for k, v in params.items() if v})
    return e(path + ("?" + query if query else ""))


def thread_href(thread: str) -> str:
    return href("/threads/" + urllib.parse.quote(thread, safe=""))


def table(
    headers: Sequence[str],
    rows: Iterable[Sequence[str]],
    empty: str,
    *,
    nums: Collection[int] = (),
    ident: str = "",
) -> str:
    """A table of already-escaped cells (the columns ``nums`` right-aligned), in a box
    that scrolls sideways on a narrow screen; ``empty`` when there are no rows."""

    def cell(tag: str, i: int, text: str) -> str:
        return f"<{tag} class='num'>{text}</{tag}>" if i in nums else f"<{tag}>{text}</{tag}>"

    body = "".join(
        "<tr>" + "".join(cell("td", i, c) for i, c in enumerate(row)) + "</tr>" for row in rows
    )
    if not body:
        return f"<p class='muted'><em>{e(empty)}</em></p>"
    head = "".join(cell("th", i, e(h)) for i, h in enumerate(headers))
    at = f" id='{e(ident)}'" if ident else ""
    return (
        f"<div class='scroll'><table{at}><thead><tr>{head}</tr></thead>"
        f"<tbody>{body}</tbody></table></div>"
    )


def status_badge(status: str, ident: str = "") -> str:
    """A run status, coloured by what it means."""
    at = f" id='{e(ident)}'" if ident else ""
    return f"<span class='status st-{e(status)}'{at}>{e(status)}</span>"


LIVE_JS = """// flowy ui: refresh the live part of the page in place, unless a form is being
// filled in: on a thread page as soon as the store's watch says a revision was saved
// (server-sent events), every few seconds on the others and on a thread page whose
// stream is not connected (it failed, or is connecting again); without JavaScript the
// page's <noscript> refresh does it.
(function () {
  var body = document.body;
  var every = 1000 * (Number(body.getAttribute("data-refresh")) || 3);
  var events = body.getAttribute("data-events");
  var dirty = false, running = false, again = false, timer = null, saves = 0;
  var watching = false;  // the stream is open: it says when to refresh
  document.addEventListener("input", function () { dirty = true; });
  document.addEventListener("submit", function () { dirty = true; });
  function busy() {
    var a = document.activeElement;
    return dirty || (a && /^(INPUT|TEXTAREA|SELECT)$/.test(a.tagName));
  }
  function stamp(text) {
    var s = document.getElementById("updated");
    if (s) { s.textContent = text; }
  }
  var took = 0;  // how long the last page took: a slow store is asked less often
  // The next refresh: periodic unless the stream is open; `retry` also while it is (a
  // save it told of is not on the page yet: a form was being filled in, or the fetch
  // failed).
  function later(retry) {
    clearTimeout(timer);
    if (!watching || retry) { timer = setTimeout(tick, Math.max(every, 5 * took)); }
  }
  function tick() {
    if (running) { again = true; return; }
    if (document.hidden || busy()) { later(true); return; }
    clearTimeout(timer);
    running = true;
    var started = Date.now(), failed = false;
    fetch(location.href, {credentials: "same-origin", cache: "no-store"})
      .then(function (r) {
        if (!r.ok) { throw new Error("HTTP " + r.status); }
        return r.text();
      })
      .then(function (text) {
        took = Date.now() - started;
        var doc = new DOMParser().parseFromString(text, "text/html");
        var fresh = doc.getElementById("live"), old = document.getElementById("live");
        if (fresh && old && busy()) { failed = true; }
        if (fresh && old && !busy()) {
          var open = {};
          old.querySelectorAll("details[id]").forEach(function (d) { open[d.id] = d.open; });
          fresh = document.importNode(fresh, true);
          fresh.querySelectorAll("details[id]").forEach(function (d) {
            if (d.id in open) { d.open = open[d.id]; }
          });
          old.replaceWith(fresh);
        }
        stamp("live · updated " + new Date().toLocaleTimeString() +
              (saves ? " · " + saves + " save(s) heard" : ""));
      })
      .catch(function (err) {
        failed = true;
        stamp("live · not updated: " + err.message);
      })
      .then(function () {
        running = false;
        if (again) { again = false; tick(); } else { later(failed); }
      });
  }
  if (events && window.EventSource) {
    var stream = new EventSource(events);
    stream.addEventListener("open", function () {
      body.setAttribute("data-watching", "yes");
      watching = true;
      clearTimeout(timer);  // the stream says when: no periodic refresh while it is open
    });
    stream.addEventListener("snapshot", function () {
      saves += 1;
      body.setAttribute("data-saves", String(saves));
      tick();
    });
    stream.addEventListener("end", function () {
      stream.close();
      body.setAttribute("data-watching", "ended");
      watching = false;
      later();
    });
    stream.addEventListener("error", function () {
      // Closed for good (a store that cannot be watched) or connecting again: refresh
      // periodically until it is open again.
      body.setAttribute("data-watching", stream.readyState === 2 ? "closed" : "again");
      watching = false;
      later();
    });
  }
  later();
})();
"""
"""The script that keeps a page live (served as ``/live.js``: the pages' CSP allows
scripts from the inspector itself only)."""


def plain(state: Any) -> Any:
    return json.loads(compact_json(state))


def path_of(
    history: Sequence[Snapshot[Any]], entry: str
) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The nodes a thread reached along ``history`` (oldest first) with how many times
    each (a run of revisions at one node is one visit), and the edges it went along. A
    snapshot points at the node to run next, so a history from the first revision
    starts at the ``entry`` node, which ran before that save."""
    visits: dict[str, int] = {}
    taken: list[tuple[str, str]] = []
    previous: str | None = None
    pointers = [s.execution_pointer for s in history]
    if history and history[0].revision == 1 and pointers[0] != entry:
        pointers.insert(0, entry)
    for node in pointers:
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
    visits, taken = path_of(history, graph.entry)
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
