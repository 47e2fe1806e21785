"""A compiled graph drawn as SVG, with no dependency and no JavaScript: what
``flowy graph --svg`` writes and the inspector's thread page shows.

The layout is layered (Sugiyama style): cycles are broken by reversing the edges a
depth-first walk from the entry finds going back; each node goes to the layer of the
longest path reaching it; an edge spanning several layers passes through a point on
each layer between (so it bends around the nodes there); nodes in a layer are ordered
by the mean position of their neighbours, sweeping down and up a few times; then the
layers are placed top to bottom, each centred. A subgraph is drawn, laid out the same
way, inside the box of its node.

A thread's drawing marks the node it is at (and its inner node inside a subgraph), how
many times each node was reached along the history shown, and the edges it took.
"""

from __future__ import annotations

import html
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._compiled import Graph

__all__ = ["Box", "Drawing", "Edge", "layout", "to_svg"]

START = "__start__"
END = "__end__"

_CHAR = 7.4  # px per character of the 13 px label font (a generous mean)
_NODE_H = 34.0
_PAD_X = 14.0
_GAP_X = 28.0
_GAP_Y = 54.0
_MARGIN = 16.0
_TITLE = 24.0  # room for a subgraph box's title
_SWEEPS = 6


@dataclass(frozen=True)
class Edge:
    """A route from ``source`` to ``target``; ``kind`` says which (``edge``, ``route``,
    ``timeout``, ``retry``, ``parallel``, ``fan-out``, ``join``, ``end``)."""

    source: str
    target: str
    kind: str
    label: str = ""


@dataclass
class Box:
    """A node's place: its top-left corner and size, and, for a subgraph, the drawing
    inside it."""

    name: str
    x: float
    y: float
    width: float
    height: float
    inner: Drawing | None = None


@dataclass
class Drawing:
    """A laid-out graph: the boxes by node name, and each edge's polyline."""

    width: float
    height: float
    boxes: dict[str, Box] = field(default_factory=lambda: {})
    edges: list[tuple[Edge, list[tuple[float, float]]]] = field(default_factory=lambda: [])


def edges_of(graph: Graph[Any, Any]) -> list[Edge]:
    """Every route of ``graph``, from the start marker to the end marker."""
    found = [Edge(START, graph.entry, "edge")]
    found += [Edge(s, t, "edge") for s, t in graph.edges.items()]
    for src, cond in graph.conditional_edges.items():
        name = getattr(cond.router, "__name__", "") or "route"
        label = "route" if name == "<lambda>" else name
        found += [Edge(src, t, "route", label) for t in cond.targets]
    found += [Edge(s, t, "retry", "retries used up") for s, t in graph.retry_routes.items()]
    found += [Edge(s, t, "timeout", "timeout") for s, t in graph.timeout_routes.items()]
    for src, (branches, then) in graph.parallel_edges.items():
        for branch in branches:
            found += [Edge(src, branch, "parallel", "parallel"), Edge(branch, then, "join")]
    for src, (node, then) in graph.fan_outs.items():
        found += [Edge(src, node, "fan-out", "fan-out"), Edge(node, then, "join")]
    found += [Edge(n, END, "end") for n in sorted(graph.terminal_nodes)]
    seen: set[tuple[str, str, str]] = set()
    unique: list[Edge] = []
    for edge in found:
        if edge.source == edge.target or (edge.source, edge.target, edge.kind) in seen:
            if edge.source == edge.target:
                unique.append(edge)  # a loop on a node: drawn as a small arc
            continue
        seen.add((edge.source, edge.target, edge.kind))
        unique.append(edge)
    return unique


def _label_width(text: str) -> float:
    return len(text) * _CHAR + 2 * _PAD_X


def layout(graph: Graph[Any, Any]) -> Drawing:
    """Lay ``graph`` out: no two boxes of one drawing overlap."""
    names = [START, *graph.nodes]
    if graph.terminal_nodes:
        names.append(END)
    edges = edges_of(graph)
    inner = {name: layout(sub.graph) for name, sub in graph.subgraphs.items()}
    sizes: dict[str, tuple[float, float]] = {}
    for name in names:
        if name in inner:
            d = inner[name]
            sizes[name] = (max(d.width, _label_width(name)), d.height + _TITLE)
        elif name in (START, END):
            sizes[name] = (56.0, 26.0)
        else:
            sizes[name] = (max(_label_width(name), 60.0), _NODE_H)

    # 1. Break cycles: edges a depth-first walk from the start meets going back.
    succ: dict[str, list[str]] = {n: [] for n in names}
    for edge in edges:
        if edge.source != edge.target and edge.target not in succ[edge.source]:
            succ[edge.source].append(edge.target)
    back: set[tuple[str, str]] = set()
    state: dict[str, int] = {}
    for root in names:
        if root in state:
            continue
        stack: list[tuple[str, int]] = [(root, 0)]
        state[root] = 1
        while stack:
            node, i = stack[-1]
            if i < len(succ[node]):
                stack[-1] = (node, i + 1)
                nxt = succ[node][i]
                if state.get(nxt) == 1:
                    back.add((node, nxt))
                elif nxt not in state:
                    state[nxt] = 1
                    stack.append((nxt, 0))
            else:
                state[node] = 2
                stack.pop()
    forward: list[tuple[str, str]] = []
    for src in names:
        for dst in succ[src]:
            forward.append((dst, src) if (src, dst) in back else (src, dst))

    # 2. Layers: the longest path from a source (the graph is acyclic now).
    preds: dict[str, list[str]] = {n: [] for n in names}
    for src, dst in forward:
        preds[dst].append(src)
    layer: dict[str, int] = {}

    def depth(node: str) -> int:
        todo = [node]
        while todo:
            top = todo[-1]
            if top in layer:
                todo.pop()
                continue
            missing = [p for p in preds[top] if p not in layer]
            if missing:
                todo.extend(missing)
                continue
            layer[top] = 1 + max((layer[p] for p in preds[top]), default=-1)
            todo.pop()
        return layer[node]

    for name in names:
        depth(name)
    if END in layer:  # the end marker sits below everything
        layer[END] = 1 + max((v for k, v in layer.items() if k != END), default=0)

    # 3. Long edges pass through a dummy point on every layer between.
    rows: dict[int, list[str]] = {}
    for name in names:
        rows.setdefault(layer[name], []).append(name)
    chains: dict[tuple[str, str], list[str]] = {}
    up: dict[str, list[str]] = {n: [] for n in names}
    down: dict[str, list[str]] = {n: [] for n in names}
    for src, dst in forward:
        chain = [src]
        for level in range(layer[src] + 1, layer[dst]):
            dummy = f"\0{src}\0{dst}\0{level}"
            rows.setdefault(level, []).append(dummy)
            up[dummy], down[dummy] = [], []
            chain.append(dummy)
        chain.append(dst)
        for a, b in itertools.pairwise(chain):
            down[a].append(b)
            up[b].append(a)
        chains[(src, dst)] = chain

    # 4. Order each layer by the mean position of its neighbours.
    levels = sorted(rows)
    order = {lv: list(rows[lv]) for lv in levels}

    def sweep(sequence: Sequence[int], neighbours: Mapping[str, list[str]]) -> None:
        for lv in sequence:
            pos = {n: i for row in order.values() for i, n in enumerate(row)}
            keyed: list[tuple[float, int, str]] = []
            for i, n in enumerate(order[lv]):
                near = [pos[m] for m in neighbours[n] if m in pos]
                keyed.append((sum(near) / len(near) if near else float(i), i, n))
            order[lv] = [n for _, _, n in sorted(keyed)]

    for _ in range(_SWEEPS):
        sweep(levels[1:], up)
        sweep(levels[-2::-1], down)

    # 5. Coordinates: each layer a row, centred.
    def size(n: str) -> tuple[float, float]:
        return sizes.get(n, (0.0, 0.0))

    widths = {
        lv: sum(size(n)[0] for n in row) + _GAP_X * max(len(row) - 1, 0)
        for lv, row in order.items()
    }
    heights = {lv: max((size(n)[1] for n in row), default=0.0) for lv, row in order.items()}
    total_w = max(widths.values(), default=0.0) + 2 * _MARGIN
    boxes: dict[str, Box] = {}
    points: dict[str, tuple[float, float, float]] = {}  # centre x, band top, band bottom
    y = _MARGIN
    for lv in levels:
        x = (total_w - widths[lv]) / 2
        for n in order[lv]:
            w, h = size(n)
            top = y + (heights[lv] - h) / 2
            if n in sizes:
                boxes[n] = Box(n, x, top, w, h, inner.get(n))
            points[n] = (x + w / 2, y, y + heights[lv])
            x += w + _GAP_X
        y += heights[lv] + _GAP_Y
    total_h = y - _GAP_Y + _MARGIN

    drawn: list[tuple[Edge, list[tuple[float, float]]]] = []
    for edge in edges:
        if edge.source == edge.target:
            b = boxes[edge.source]
            right, mid = b.x + b.width, b.y + b.height / 2
            drawn.append((edge, [(right, mid - 8), (right + 22, mid), (right, mid + 8)]))
            continue
        reverse = (edge.source, edge.target) in back
        chain = chains[(edge.target, edge.source) if reverse else (edge.source, edge.target)]
        # Downwards along the chain: each slanted stretch lies in the gap between two
        # layers, which holds no box; within a layer the line runs straight down its
        # own slot (a dummy's, or below or above its own box).
        a, b = boxes[chain[0]], boxes[chain[-1]]
        ax, _, a_bottom = points[chain[0]]
        line = [(ax, a.y + a.height)]
        if a.y + a.height < a_bottom:
            line.append((ax, a_bottom))
        for dummy in chain[1:-1]:
            dx, top, bottom = points[dummy]
            line += [(dx, top), (dx, bottom)]
        bx, b_top, _ = points[chain[-1]]
        line.append((bx, b_top))
        if b.y > b_top:
            line.append((bx, b.y))
        if reverse:
            line.reverse()
        drawn.append((edge, line))
    for edge, line in drawn:  # room for the labels, which may stick out on the right
        if edge.label:
            x, _, w = _label_at(edge.label, line)
            total_w = max(total_w, x + w + _MARGIN)
    return Drawing(total_w, total_h, boxes, drawn)


def _label_at(label: str, line: Sequence[tuple[float, float]]) -> tuple[float, float, float]:
    """Where an edge's label goes (left, middle height, width): beside the middle of
    its middle segment, so that it does not hide the line."""
    i = max((len(line) - 1) // 2, 0)
    (ax, ay), (bx, by) = line[i], line[min(i + 1, len(line) - 1)]
    return (ax + bx) / 2 + 4, (ay + by) / 2, len(label) * 6.4 + 8


_STYLE = """
.fg{font:13px system-ui,sans-serif}
.fg .box{fill:#fff;stroke:#607d8b;stroke-width:1.2}
.fg .sub{fill:#f4f7fb;stroke:#90a4ae;stroke-dasharray:4 3}
.fg .mark{fill:#eceff1;stroke:#90a4ae}
.fg text{fill:#1f2933}
.fg .lbl{font-size:11px;fill:#52606d}
.fg .lblbg{fill:#fff;opacity:.85}
.fg .e{fill:none;stroke:#90a4ae;stroke-width:1.3}
.fg .e.route,.fg .e.parallel,.fg .e.fan-out{stroke-dasharray:5 3}
.fg .e.timeout,.fg .e.retry{stroke:#c77c02;stroke-dasharray:2 3}
.fg .e.taken{stroke:#1e6fd9;stroke-width:2.4}
.fg .visited .box{fill:#e3f0ff;stroke:#1e6fd9}
.fg .current .box{fill:#ffe08a;stroke:#d9480f;stroke-width:3}
.fg .current .sub{fill:#fff8e1}
.fg .count{fill:#1e6fd9}
.fg .visits{fill:#fff;font-size:10px;font-weight:bold}
.fg .arrow{fill:#90a4ae}
@media (prefers-color-scheme:dark){
.fg .box{fill:#1d2530;stroke:#8aa1b4}
.fg .sub{fill:#161c24;stroke:#5b6d7c}
.fg .mark{fill:#27313d;stroke:#5b6d7c}
.fg text{fill:#e4e9ee}
.fg .lbl{fill:#aab7c4}
.fg .lblbg{fill:#12171d}
.fg .visited .box{fill:#173252;stroke:#5aa2ff}
.fg .current .box{fill:#6b4e00;stroke:#ffb347}
.fg .current .sub{fill:#2a2310}
.fg .e.taken{stroke:#5aa2ff}
}
"""


def _x(value: object) -> str:
    """``value`` escaped for SVG text or an attribute."""
    text = str(value)
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return html.escape(text, quote=True)


def _f(value: float) -> str:
    return f"{value:.1f}".removesuffix(".0")


def to_svg(
    graph: Graph[Any, Any],
    *,
    current: str | None = None,
    inner_current: str | None = None,
    visits: Mapping[str, int] | None = None,
    taken: Sequence[tuple[str, str]] = (),
    title: str = "",
) -> str:
    """``graph`` as a standalone SVG document (its own style, light and dark).

    ``current`` marks the node a thread is at (``inner_current`` its node inside that
    subgraph); ``visits`` gives how many times each node was reached (drawn as a count
    on each node reached more than zero times); ``taken`` the edges ``(source,
    target)`` the thread went along.
    """
    drawing = layout(graph)
    counts = dict(visits or {})
    went = set(taken)
    if counts or current:
        went.add((START, graph.entry))
    label = title or f"graph with {len(graph.nodes)} nodes"
    parts = [
        f"<svg xmlns='http://www.w3.org/2000/svg' class='fg' role='img' "
        f"width='{_f(drawing.width)}' height='{_f(drawing.height)}' "
        f"viewBox='0 0 {_f(drawing.width)} {_f(drawing.height)}' "
        f"aria-label='{_x(label)}'><title>{_x(label)}</title><style>{_STYLE}</style>",
        "<defs><marker id='fa' viewBox='0 0 10 10' refX='9' refY='5' markerWidth='7' "
        "markerHeight='7' orient='auto-start-reverse'><path class='arrow' "
        "d='M0 0L10 5L0 10z'/></marker></defs>",
    ]
    _draw(parts, drawing, 0.0, 0.0, "", current, inner_current, counts, went)
    parts.append("</svg>")
    return "".join(parts)


def _draw(
    parts: list[str],
    drawing: Drawing,
    dx: float,
    dy: float,
    prefix: str,
    current: str | None,
    inner_current: str | None,
    counts: Mapping[str, int],
    went: set[tuple[str, str]],
) -> None:
    for edge, line in drawing.edges:
        kinds = edge.kind + (" taken" if (edge.source, edge.target) in went else "")
        pts = [(x + dx, y + dy) for x, y in line]
        d = "M" + " L".join(f"{_f(x)} {_f(y)}" for x, y in pts)
        if len(pts) == 3 and edge.source == edge.target:
            (x0, y0), (x1, _), (x2, y2) = pts
            d = f"M{_f(x0)} {_f(y0)} C{_f(x1 + 10)} {_f(y0 - 14)} {_f(x1 + 10)} "
            d += f"{_f(y2 + 14)} {_f(x2)} {_f(y2)}"
        parts.append(
            f"<path class='e {kinds}' data-edge='{_x(prefix + edge.source)}>"
            f"{_x(prefix + edge.target)}' d='{d}' marker-end='url(#fa)'/>"
        )
        if edge.label:
            lx, my, w = _label_at(edge.label, pts)
            parts.append(
                f"<rect class='lblbg' x='{_f(lx)}' y='{_f(my - 8)}' width='{_f(w)}' "
                f"height='15' rx='3'/><text class='lbl' x='{_f(lx + 3)}' y='{_f(my + 3)}'>"
                f"{_x(edge.label)}</text>"
            )
    for name, box in drawing.boxes.items():
        x, y = box.x + dx, box.y + dy
        classes = ["n"]
        if name == current:
            classes.append("current")
        if counts.get(name):
            classes.append("visited")
        attrs = f"class='{' '.join(classes)}' data-node='{_x(prefix + name)}'"
        if name in (START, END):
            parts.append(
                f"<g {attrs}><rect class='mark' x='{_f(x)}' y='{_f(y)}' width='{_f(box.width)}'"
                f" height='{_f(box.height)}' rx='13'/><text x='{_f(x + box.width / 2)}' "
                f"y='{_f(y + box.height / 2 + 4)}' text-anchor='middle'>"
                f"{'start' if name == START else 'end'}</text></g>"
            )
            continue
        kind = "box sub" if box.inner is not None else "box"
        title_y = y + 16 if box.inner is not None else y + box.height / 2 + 4.5
        anchor_x = x + (10 if box.inner is not None else box.width / 2)
        anchor = "start" if box.inner is not None else "middle"
        parts.append(
            f"<g {attrs}><title>{_x(name)}"
            + (f" (reached {counts[name]}×)" if counts.get(name) else "")
            + f"</title><rect class='{kind}' x='{_f(x)}' y='{_f(y)}' width='{_f(box.width)}' "
            f"height='{_f(box.height)}' rx='6'/><text x='{_f(anchor_x)}' y='{_f(title_y)}' "
            f"text-anchor='{anchor}'>{_x(name)}</text>"
        )
        if counts.get(name):
            cx, cy = x + box.width - 2, y + 2
            parts.append(
                f"<circle class='count' cx='{_f(cx)}' cy='{_f(cy)}' r='9'/><text "
                f"class='visits' x='{_f(cx)}' y='{_f(cy + 3.5)}' text-anchor='middle'>"
                f"{counts[name]}</text>"
            )
        parts.append("</g>")
        if box.inner is not None:
            _draw(
                parts,
                box.inner,
                x + (box.width - box.inner.width) / 2,
                y + _TITLE,
                prefix + name + "/",
                inner_current if name == current else None,
                None,
                {},
                set(),
            )
