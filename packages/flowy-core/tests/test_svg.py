"""The graph drawn as SVG (``flowy/cli/_svg.py``): no two boxes overlap and no line runs
through a box it does not join, on any example graph nor on random graphs of 40 nodes;
a subgraph fits inside its node, the document is well-formed XML, and a thread's
drawing marks its node, its visits and its path."""

from __future__ import annotations

import importlib
import itertools
import random
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from core_graphs import State, approval_graph, handoff_graph, linear_graph, merge

import flowy
from flowy.cli._svg import END, START, Box, Drawing, layout, to_svg
from flowy.cli.demo import build_graph as demo_graph

SVG = "{http://www.w3.org/2000/svg}"


async def _nop(s: State) -> tuple[State, flowy.Directive[Any]]:
    return {}, flowy.completed()


def _child() -> flowy.Graph[State, Any]:
    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    b.add_node("first", _nop).add_node("second", _nop).add_edge("first", "second")
    return b.allow_no_outgoing_route("second").compile()


def _router(s: State) -> str:
    return "left"


def _composite() -> flowy.Graph[State, Any]:
    """A subgraph, a router, a timeout route, a retry route, a loop back, a parallel
    superstep and a fan-out."""
    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    for name in ("start_here", "left", "right", "wait", "late", "p1", "p2", "join", "each"):
        b.add_node(name, _nop)
    b.add_subgraph("inner", _child())
    b.add_edge("start_here", "inner")
    b.add_conditional_edge("inner", _router, "left", "right")
    b.add_edge("left", "wait").add_timeout_route("wait", "late").add_edge("late", "start_here")
    b.add_edge("wait", "right").add_retry_route("right", "late")
    b.add_parallel_edge("right", ["p1", "p2"], then="join")
    b.add_edge("join", "late").add_fan_out("join", "each", then="late")
    return b.allow_no_outgoing_route("late").compile()


def _random(seed: int, n: int = 40) -> flowy.Graph[State, Any]:
    rng = random.Random(seed)
    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    names = [f"node_{i}_{'x' * rng.randrange(0, 12)}" for i in range(n)]
    for name in names:
        b.add_node(name, _nop)
    targets: dict[str, set[str]] = {name: set() for name in names}
    for i in range(1, n):  # every node reachable from the entry
        targets[names[rng.randrange(0, i)]].add(names[i])
    for name in names[:-1]:
        targets[name].update(rng.sample(names, rng.randrange(0, 3)))
        if not targets[name]:
            targets[name].add(names[-1])
    for i, name in enumerate(names):
        chosen = sorted(targets[name])
        if len(chosen) == 1:
            b.add_edge(name, chosen[0])
        elif chosen:
            b.add_conditional_edge(name, _router, *chosen)
        if rng.random() < 0.2:
            b.add_timeout_route(name, names[rng.randrange(i, n)])
    return b.allow_no_outgoing_route(names[-1]).compile()


def _examples() -> dict[str, flowy.Graph[Any, Any]]:
    graphs: dict[str, flowy.Graph[Any, Any]] = {
        "approval": approval_graph(),
        "handoff": handoff_graph(),
        "linear": linear_graph(6),
        "demo": demo_graph(),
        "composite": _composite(),
    }
    for module in ("conditional_routing", "hitl_overlay", "stream_request_stop", "streaming_agent"):
        graphs[module] = importlib.import_module(f"examples.{module}").build_graph()
    graphs["approval_app"] = importlib.import_module("examples.approval_app.graph").graph
    return graphs


def _overlap(a: Box, b: Box) -> bool:
    return (
        a.x < b.x + b.width
        and b.x < a.x + a.width
        and a.y < b.y + b.height
        and b.y < a.y + a.height
    )


def _crosses(box: Box, a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether the segment ``a``-``b`` enters the inside of ``box`` (Liang-Barsky
    clipping against the box shrunk by a pixel, so touching its edge is not crossing)."""
    (x1, y1), (x2, y2) = a, b
    dx, dy = x2 - x1, y2 - y1
    low, high = 0.0, 1.0
    left, right = box.x + 1, box.x + box.width - 1
    top, bottom = box.y + 1, box.y + box.height - 1
    for p, q in ((-dx, x1 - left), (dx, right - x1), (-dy, y1 - top), (dy, bottom - y1)):
        if p == 0:
            if q < 0:
                return False
            continue
        t = q / p
        if p < 0:
            low = max(low, t)
        else:
            high = min(high, t)
        if low > high:
            return False
    return True


def _check(drawing: Drawing) -> None:
    for edge, line in drawing.edges:  # no line runs through a box it does not join
        if edge.source == edge.target:
            continue
        for a, b in itertools.pairwise(line):
            for name, box in drawing.boxes.items():
                if name not in (edge.source, edge.target):
                    assert not _crosses(box, a, b), (edge, name)
    boxes = list(drawing.boxes.values())
    for i, a in enumerate(boxes):
        assert a.x >= 0 and a.y >= 0, a
        assert a.x + a.width <= drawing.width and a.y + a.height <= drawing.height, a
        for b in boxes[i + 1 :]:
            assert not _overlap(a, b), (a.name, b.name)
        if a.inner is not None:
            assert a.inner.width <= a.width and a.inner.height < a.height
            _check(a.inner)


@pytest.mark.parametrize("name", sorted(_examples()))
def test_no_two_nodes_overlap_on_the_example_graphs(name: str) -> None:
    graph = _examples()[name]
    drawing = layout(graph)
    assert set(drawing.boxes) >= set(graph.nodes) | {START}
    _check(drawing)
    ET.fromstring(to_svg(graph))  # well-formed


@pytest.mark.parametrize("seed", range(5))
def test_no_two_nodes_overlap_on_a_random_graph_of_40_nodes(seed: int) -> None:
    graph = _random(seed)
    drawing = layout(graph)
    assert len(drawing.boxes) == 40 + 2  # and the start and end markers
    _check(drawing)
    # Every route is drawn, and every edge goes from its source's box to its target's.
    drawn = {(e.source, e.target) for e, _ in drawing.edges}
    assert all((s, t) in drawn for s, t in graph.edges.items() if s != t)
    for edge, line in drawing.edges:
        a, b = drawing.boxes[edge.source], drawing.boxes[edge.target]
        assert a.x <= line[0][0] <= a.x + a.width
        assert b.x <= line[-1][0] <= b.x + b.width + 30


def test_routes_are_labelled_and_a_subgraph_is_drawn_inside_its_node() -> None:
    svg = ET.fromstring(to_svg(_composite()))
    labels = {t.text for t in svg.iter(f"{SVG}text") if t.get("class") == "lbl"}
    assert {"_router", "timeout", "retries used up", "parallel", "fan-out"} <= labels
    nodes = {g.get("data-node") for g in svg.iter(f"{SVG}g")}
    assert {"inner", "inner/first", "inner/second", "late", END} <= nodes
    inside = ET.fromstring(to_svg(_composite(), current="inner", inner_current="second"))
    marked = [
        g.get("data-node") for g in inside.iter(f"{SVG}g") if "current" in (g.get("class") or "")
    ]
    assert marked == ["inner", "inner/second"]
    outer = layout(_composite()).boxes["inner"]
    assert outer.inner is not None and set(outer.inner.boxes) >= {"first", "second"}


def test_a_threads_drawing_marks_its_node_visits_and_path() -> None:
    graph = approval_graph()
    svg = ET.fromstring(
        to_svg(graph, current="ask", visits={"plan": 1, "ask": 2}, taken=[("plan", "ask")])
    )
    groups = {g.get("data-node"): (g.get("class") or "").split() for g in svg.iter(f"{SVG}g")}
    assert "current" in groups["ask"] and "visited" in groups["ask"]
    assert "current" not in groups["plan"] and "visited" in groups["plan"]
    assert "visited" not in groups["act"]
    counts = [t.text or "" for t in svg.iter(f"{SVG}text") if t.get("class") == "visits"]
    assert sorted(counts) == ["1", "2"]
    taken = {
        p.get("data-edge") for p in svg.iter(f"{SVG}path") if "taken" in (p.get("class") or "")
    }
    assert taken == {f"{START}>plan", "plan>ask"}


def test_hostile_node_names_are_escaped() -> None:
    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    b.add_node("<script>x</script>'\"&", _nop)
    svg = to_svg(b.allow_no_outgoing_route("<script>x</script>'\"&").compile())
    assert "<script>" not in svg
    ET.fromstring(svg)


DRAWN_IN_THE_DOCS = {
    "demo-graph.svg": "flowy.cli.demo:build_graph",
    "conditional-routing.svg": "examples.conditional_routing:build_graph",
}


@pytest.mark.parametrize("name", sorted(DRAWN_IN_THE_DOCS))
def test_the_docs_drawings_are_current(name: str) -> None:
    """The docs show ``docs/images/NAME``, which ``flowy graph SPEC --svg
    docs/images/NAME`` (run at the repository's root) rewrites."""
    spec = DRAWN_IN_THE_DOCS[name]
    module, _, attr = spec.partition(":")
    graph = getattr(importlib.import_module(module), attr)()
    shown = Path(__file__).parents[3] / "docs" / "images" / name
    expected = to_svg(graph, title=f"the graph {spec}") + "\n"
    assert shown.read_text(encoding="utf-8") == expected, f"run: flowy graph {spec} --svg {shown}"
