"""The compiled graph: ``Graph``, the parts it is made of, and the types of what a graph
is built from (nodes, reducers, routers, migrations, signal handlers). No I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, TypeAlias

from ._directives import Directive
from ._errors import UnknownNodeError
from ._types import E, S
from .storage._model import DEFAULT_QUEUE

__all__ = [
    "CheckpointPolicy",
    "ConditionalEdge",
    "Graph",
    "Migration",
    "MigrationStep",
    "Node",
    "Reducer",
    "Router",
    "SignalHandler",
    "Subgraph",
]

Node: TypeAlias = Callable[[S], Awaitable[tuple[S, Directive[E]]]]
"""``async def node(state: S) -> tuple[S, Directive[E]]``: returns a state update."""

Reducer: TypeAlias = Callable[[S, S], S]
"""``reducer(state, update) -> new state``."""

Router: TypeAlias = Callable[[S], "str | Awaitable[str]"]
"""``router(state) -> target node name`` (sync or async)."""

Migration: TypeAlias = Callable[[Any, str], "tuple[Any, str]"]
"""``migration(state, pointer) -> (state, pointer)``: brings a thread saved under an
older graph version to the next one."""

SignalHandler: TypeAlias = Callable[[S, Any], "S | Awaitable[S]"]
"""``handler(state, payload) -> new state`` (sync or async): how a signal's payload
enters the state when a ``wait_for`` receives it."""


class CheckpointPolicy(enum.Enum):
    """What a failed checkpoint save does to a run."""

    FAIL_ON_SAVE_ERROR = "fail_on_save_error"
    """A failed save fails the run (``*_save_failed`` reasons). The default."""
    SKIP_ON_SAVE_ERROR = "skip_on_save_error"
    """A failed save emits ``checkpoint_failed`` and the run goes on
    (``*_checkpoint_skipped`` reasons)."""


@dataclass(frozen=True)
class ConditionalEdge(Generic[S]):
    """An edge whose target is chosen at run time by ``router`` among ``targets``."""

    router: Router[S]
    targets: tuple[str, ...]
    is_async: bool


@dataclass(frozen=True)
class Subgraph:
    """A compiled graph used as a node: ``enter(state) -> child state`` when the run
    enters it, ``leave(state, child_state) -> update`` (folded by this graph's reducer)
    when it finishes there."""

    graph: Graph[Any, Any]
    """The graph run inside the node."""
    enter: Callable[[Any], Any]
    """Parent state → the child's initial state (sync or async)."""
    leave: Callable[[Any, Any], Any]
    """(parent state, finished child state) → the parent's update (sync or async)."""


@dataclass(frozen=True)
class MigrationStep:
    """One declared step from a graph version to the next: ``migrate`` (if any), then
    the node ``renames``."""

    to_version: str
    """The version it brings a thread to."""
    migrate: Migration | None = None
    """``migrate(state, pointer) -> (state, pointer)``, or ``None`` for renames only."""
    renames: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Old node name → new node name, applied to the pointer and the timeout route."""


@dataclass(frozen=True)
class Graph(Generic[S, E]):
    """A compiled, immutable graph. Run it with ``flowy.Runner(graph, backend)``."""

    nodes: Mapping[str, Node[S, E]]
    """The nodes by name."""
    entry: str
    """The node every run starts at."""
    reducer: Reducer[S]
    """Merges a node's returned update into the state."""
    edges: Mapping[str, str]
    """The plain edges: node → the node after it."""
    conditional_edges: Mapping[str, ConditionalEdge[S]]
    """The routed edges: node → its router and declared targets."""
    retry_routes: Mapping[str, str]
    """Node → where the run continues when its ``retry()`` attempts are used up."""
    terminal_nodes: frozenset[str]
    """The nodes where ``completed()`` finishes the run."""
    max_steps: int = 100
    """Steps one segment may run; more fails it with ``max_steps_exceeded``."""
    budgets: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    """Budget name → limit (``use_budget``); going over fails the run."""
    delete_on_success: bool = False
    """Delete a completed thread (unless a live lease holds it)."""
    retention_limit: int | None = None
    """History entries kept per thread after a persisted stop or the end (``None``: all)."""
    checkpoint_policy: CheckpointPolicy = CheckpointPolicy.FAIL_ON_SAVE_ERROR
    """What a failed checkpoint save does to the run."""
    save_every_step: bool = True
    """Save a checkpoint after every step, so a crash resumes from the last one."""
    state_type: Any = None
    """The state's type, which stores decode snapshots into (``None``: plain JSON)."""
    max_total_steps: int | None = 10_000
    """Steps a thread may run across all its segments (``None``: no bound); more fails
    it with ``max_total_steps_exceeded``."""
    timeout_routes: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Node → where a ``wait_for`` of that node continues when its deadline passes."""
    signal_handlers: Mapping[str, SignalHandler[S]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    """Signal name → how its payload enters the state (``on_signal``)."""
    version: str = ""
    """The graph's version, saved in every snapshot: ``compile(version=...)``, else a
    fingerprint of its nodes, edges and routes."""
    migrations: Mapping[str, MigrationStep] = field(default_factory=lambda: MappingProxyType({}))
    """From-version → the step that brings a thread saved under it forward."""
    parallel_edges: Mapping[str, tuple[tuple[str, ...], str]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    """Node → the branches that run in parallel after it completes, and their join."""
    fan_outs: Mapping[str, tuple[str, str]] = field(default_factory=lambda: MappingProxyType({}))
    """Node → the branch node its ``fan_out`` runs, and the join after the superstep."""
    subgraphs: Mapping[str, Subgraph] = field(default_factory=lambda: MappingProxyType({}))
    """Node → the compiled graph it runs (``add_subgraph``)."""
    queue: str | None = None
    """The queue of its hand-offs and wake-up messages that name none
    (``compile(queue=...)``; ``None``: ``"default"``)."""
    node_queues: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Node → the queue of its hand-offs that name none (``add_node(queue=...)``)."""

    @property
    def default_queue(self) -> str:
        """The queue of the graph's messages that name none: ``queue``, else
        ``"default"``."""
        return self.queue if self.queue is not None else DEFAULT_QUEUE

    def queue_of(self, node: str) -> str:
        """The queue of a hand-off from ``node`` that names none: the node's queue, else
        the graph's, else ``"default"``."""
        return self.node_queues.get(node, self.default_queue)

    def queues(self) -> frozenset[str]:
        """Every queue the graph and its subgraphs name as a default (not those its
        nodes' ``handoff(queue=...)`` name)."""
        names = {self.default_queue, *self.node_queues.values()}
        for sub in self.subgraphs.values():
            names |= sub.graph.queues()
        return frozenset(names)

    def migration_path(self, version: str) -> list[MigrationStep] | None:
        """The steps that bring a thread saved under ``version`` to this graph's version
        (empty if it is this version, or ``""``: saved before graphs had versions), or
        ``None`` if no chain of declared migrations covers it."""
        path: list[MigrationStep] = []
        seen = {version}
        while version and version != self.version:
            step = self.migrations.get(version)
            if step is None or step.to_version in seen:
                return None
            path.append(step)
            version = step.to_version
            seen.add(version)
        return path

    def node(self, name: str) -> Node[S, E]:
        """The node called ``name``; ``UnknownNodeError`` if there is none."""
        try:
            return self.nodes[name]
        except KeyError:
            raise UnknownNodeError(
                f"no node named {name!r} in the graph; known nodes: {sorted(self.nodes)}"
            ) from None

    def has_node(self, name: str) -> bool:
        """True if the graph has a node called ``name``."""
        return name in self.nodes

    def to_mermaid(self) -> str:
        """A Mermaid ``flowchart`` of the graph (entry, edges, routers, retry routes)."""

        def ident(name: str) -> str:
            return "n_" + "".join(c if c.isalnum() else "_" for c in name)

        lines = ["flowchart TD", "    __start__([start])"]
        for name in self.nodes:
            label = name.replace('"', "'")
            lines.append(f'    {ident(name)}["{label}"]')
        lines.append(f"    __start__ --> {ident(self.entry)}")
        for src, dst in self.edges.items():
            lines.append(f"    {ident(src)} --> {ident(dst)}")
        for src, cond in self.conditional_edges.items():
            for dst in cond.targets:
                lines.append(f"    {ident(src)} -.-> {ident(dst)}")
        for src, dst in self.retry_routes.items():
            lines.append(f"    {ident(src)} -- retry exhausted --> {ident(dst)}")
        for src, dst in self.timeout_routes.items():
            lines.append(f"    {ident(src)} -- timeout --> {ident(dst)}")
        for src, (branches, then) in self.parallel_edges.items():
            for branch in branches:
                lines.append(f"    {ident(src)} == parallel ==> {ident(branch)}")
                lines.append(f"    {ident(branch)} ==> {ident(then)}")
        for src, (node, then) in self.fan_outs.items():
            lines.append(f"    {ident(src)} == fan-out ==> {ident(node)}")
            lines.append(f"    {ident(node)} ==> {ident(then)}")
        for name, sub in self.subgraphs.items():
            inner = sub.graph.to_mermaid().splitlines()[1:]
            prefix = ident(name) + "__"
            lines.append(f'    subgraph {prefix}box ["{name}"]')
            lines.extend(
                "    "
                + line.replace("n_", prefix)
                .replace("__start__", prefix + "start")
                .replace("__end__", prefix + "end")
                for line in inner
            )
            lines.append("    end")
            lines.append(f"    {ident(name)} -.-> {prefix}start")
        if self.terminal_nodes:
            lines.append("    __end__([end])")
            for name in sorted(self.terminal_nodes):
                lines.append(f"    {ident(name)} --> __end__")
        return "\n".join(lines) + "\n"
