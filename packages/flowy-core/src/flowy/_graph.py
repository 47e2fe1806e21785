"""GraphBuilder → immutable Graph: declaring nodes and routes, validating them and
freezing the graph. The compiled graph and its parts are in ``_compiled``. No I/O."""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Generic, TypeVar, get_args

from ._compiled import CheckpointPolicy as CheckpointPolicy
from ._compiled import ConditionalEdge as ConditionalEdge
from ._compiled import Graph as Graph
from ._compiled import Migration as Migration
from ._compiled import MigrationStep as MigrationStep
from ._compiled import Node as Node
from ._compiled import Reducer as Reducer
from ._compiled import Router as Router
from ._compiled import SignalHandler as SignalHandler
from ._compiled import Subgraph as Subgraph
from ._errors import GraphValidationError
from ._types import E, S
from .storage._model import validate_queue_name

__all__ = [
    "CheckpointPolicy",
    "ConditionalEdge",
    "Graph",
    "GraphBuilder",
    "Migration",
    "MigrationStep",
    "Node",
    "Reducer",
    "Router",
    "SignalHandler",
    "Subgraph",
]


def _replace(_state: Any, update: Any) -> Any:
    return update


def _same(state: Any) -> Any:
    return state


def _child_state(_state: Any, child: Any) -> Any:
    return child


def _concrete(tp: Any) -> bool:
    """True for a state type a codec can decode into (not ``Any``, not a TypeVar)."""
    return tp is not None and tp is not Any and not isinstance(tp, TypeVar)


class GraphBuilder(Generic[S, E]):
    """Declare nodes and routes, then ``compile()`` into an immutable ``Graph``.

    The first node added is the entry point unless ``set_entry_point`` names another.
    ``GraphBuilder[Refund, Effect]()`` records the state type ``Refund`` as
    ``state=Refund`` does.

    Args:
        reducer: ``reducer(state, update) -> new state``; ``None``: the update replaces
            the state.
        state: the state's type: stores then decode snapshots into it (a dataclass, a
            TypedDict, ``dict[str, Any]``, …) instead of handing back plain JSON values.
    """

    def __init__(self, reducer: Reducer[S] | None = None, *, state: type[S] | None = None) -> None:
        self._state_type: Any = state
        self._reducer: Reducer[S] = reducer if reducer is not None else _replace
        self._nodes: dict[str, Node[S, E]] = {}
        self._entry: str | None = None
        self._edges: dict[str, list[str]] = {}
        self._conditional: dict[str, list[ConditionalEdge[S]]] = {}
        self._retry_routes: dict[str, list[str]] = {}
        self._timeout_routes: dict[str, list[str]] = {}
        self._signal_handlers: dict[str, SignalHandler[S]] = {}
        self._migrations: dict[str, tuple[str | None, Migration | None, dict[str, str]]] = {}
        self._parallel: dict[str, list[tuple[tuple[str, ...], str]]] = {}
        self._subgraphs: dict[str, Subgraph] = {}
        self._fan_outs: dict[str, list[tuple[str, str]]] = {}
        self._terminal: set[str] = set()
        self._budgets: dict[str, int] = {}
        self._queues: dict[str, str] = {}
        self._problems: list[str] = []

    def add_node(
        self, name: str, node: Node[S, E], *, queue: str | None = None
    ) -> GraphBuilder[S, E]:
        """Add ``node`` (an ``async def``) under ``name``.

        Args:
            name: the node's name.
            node: ``async def node(state) -> (update, directive)``.
            queue: the queue of its hand-offs that name none (``None``: the graph's,
                ``compile(queue=...)``).

        Raises:
            ValueError: ``queue`` is not a queue name (1 to 64 letters, digits,
                ``_ . : -``, starting with a letter or digit).
        """
        if queue is not None:
            validate_queue_name(queue)
        if not name:
            self._problems.append(f"node name must be a non-empty str, got {name!r}")
            return self
        if name in self._nodes:
            self._problems.append(f"node {name!r} is added twice")
            return self
        if not callable(node):
            self._problems.append(f"node {name!r} is not callable: {node!r}")
        elif not inspect.iscoroutinefunction(node) and not inspect.iscoroutinefunction(
            getattr(node, "__call__", None)  # noqa: B004 - async callable objects
        ):
            self._problems.append(
                f"node {name!r} must be an async function (async def), got {node!r}"
            )
        self._nodes[name] = node
        if queue is not None:
            self._queues[name] = queue
        if self._entry is None:
            self._entry = name
        return self

    def set_entry_point(self, name: str) -> GraphBuilder[S, E]:
        """Start runs at ``name`` (default: the first node added)."""
        self._entry = name
        return self

    def add_edge(self, src: str, dst: str) -> GraphBuilder[S, E]:
        """After ``src`` completes, run ``dst``."""
        self._edges.setdefault(src, []).append(dst)
        return self

    def add_conditional_edge(
        self, src: str, router: Router[S], *targets: str
    ) -> GraphBuilder[S, E]:
        """After ``src`` completes, run ``router(state)``'s choice among ``targets``.

        Args:
            src: the node the edge leaves.
            router: ``router(state) -> node name``, sync or async. A router returning a
                name not in ``targets`` fails the run with reason
                ``router_target_undeclared``; one that raises, with ``router_error``.
            *targets: the nodes the router may choose.
        """
        if not targets:
            self._problems.append(f"conditional edge from {src!r} declares no targets")
        is_async = inspect.iscoroutinefunction(router)
        self._conditional.setdefault(src, []).append(ConditionalEdge(router, targets, is_async))
        return self

    def add_retry_route(self, src: str, fallback: str) -> GraphBuilder[S, E]:
        """When ``src``'s ``retry()`` attempts are used up, continue at ``fallback``."""
        self._retry_routes.setdefault(src, []).append(fallback)
        return self

    def add_subgraph(
        self,
        name: str,
        graph: Graph[Any, Any],
        *,
        enter: Callable[[S], Any] | None = None,
        leave: Callable[[S, Any], S] | None = None,
    ) -> GraphBuilder[S, E]:
        """Add the compiled ``graph`` as the node ``name``: the run enters it with
        ``enter(state)`` (default: the state as it is), runs it to its end, and folds
        ``leave(state, child_state)`` (default: the child's final state) into this
        graph's state. A suspend, hand-off, sleep or wait inside pauses the whole run at
        ``name`` with the child's node and state saved in the snapshot; the resume
        continues inside. Route ``name`` like any node.

        Args:
            name: the node's name in this graph.
            graph: the compiled child graph (itself validated when it was compiled).
            enter: ``enter(state) -> child_state`` (sync or async).
            leave: ``leave(state, child_state) -> update`` (sync or async).
        """

        async def runs_in_the_engine(state: Any) -> Any:
            raise RuntimeError(f"the subgraph node {name!r} runs inside a flowy run only")

        if graph.subgraphs or graph.fan_outs or graph.parallel_edges:
            self._problems.append(
                f"subgraph {name!r}: a subgraph may not contain subgraphs, fan-outs or "
                "parallel edges yet"
            )
        self.add_node(name, runs_in_the_engine)
        self._subgraphs[name] = Subgraph(
            graph,
            enter if enter is not None else _same,
            leave if leave is not None else _child_state,
        )
        return self

    def add_parallel_edge(
        self, src: str, branches: Sequence[str], *, then: str
    ) -> GraphBuilder[S, E]:
        """When ``src`` completes, run ``branches`` in parallel on the same state (a
        superstep), fold their updates in the order given, and continue at ``then``.
        Branch nodes need no routes of their own."""
        self._parallel.setdefault(src, []).append((tuple(branches), then))
        return self

    def add_fan_out(self, src: str, node: str, *, then: str) -> GraphBuilder[S, E]:
        """Declare that ``src`` may return ``flowy.fan_out(node, items)``: one branch of
        ``node`` per item, then the run continues at ``then``. ``node`` needs no route
        of its own."""
        self._fan_outs.setdefault(src, []).append((node, then))
        return self

    def add_timeout_route(self, src: str, dst: str) -> GraphBuilder[S, E]:
        """When a ``wait_for`` of ``src`` reaches its deadline before its signal,
        continue at ``dst`` (a directive's own ``on_timeout`` takes precedence)."""
        self._timeout_routes.setdefault(src, []).append(dst)
        return self

    def on_signal(self, name: str, handler: SignalHandler[S]) -> GraphBuilder[S, E]:
        """Merge the payload of signal ``name`` into the state when a ``wait_for``
        receives it (without a handler, a payload is merged like a ``state_overlay``).

        Args:
            name: the signal's name.
            handler: ``handler(state, payload) -> state`` (sync or async).
        """
        if name in self._signal_handlers:
            self._problems.append(f"signal {name!r} has two on_signal handlers; declare one")
        self._signal_handlers[name] = handler
        return self

    def add_migration(
        self, from_version: str, migrate: Migration, *, to_version: str | None = None
    ) -> GraphBuilder[S, E]:
        """Bring threads saved under ``from_version`` to ``to_version`` (default: this
        graph's version), applied when such a thread is resumed, recovered or forked.
        Steps chain: declare v1 → v2 and v2 → v3, and a v1 thread goes through both.

        Args:
            from_version: the graph version the threads were saved under.
            migrate: ``migrate(state, pointer) -> (state, pointer)`` (sync or async).
            to_version: the version it brings them to (default: this graph's).
        """
        if not from_version:
            self._problems.append("add_migration needs a non-empty from_version")
        to, fn, renames = self._migrations.get(from_version, (to_version, None, {}))
        if fn is not None:
            self._problems.append(f"two migrations from version {from_version!r}; declare one")
        self._migrations[from_version] = (
            to_version if to_version is not None else to,
            migrate,
            renames,
        )
        return self

    def rename_node(self, old: str, new: str, *, from_version: str) -> GraphBuilder[S, E]:
        """Threads saved under ``from_version`` at node ``old`` (or whose wait times out
        to it) continue at ``new``: a migration step of its own, or part of the one
        declared from that version (applied after its function)."""
        to, fn, renames = self._migrations.get(from_version, (None, None, {}))
        renames[old] = new
        self._migrations[from_version] = (to, fn, renames)
        return self

    def allow_no_outgoing_route(self, *names: str) -> GraphBuilder[S, E]:
        """Mark ``names`` as terminal nodes: ``completed()`` there finishes the run."""
        self._terminal.update(names)
        return self

    def add_budget(self, name: str, limit: int) -> GraphBuilder[S, E]:
        """Declare the budget ``name`` with ``limit`` (>= 1) units per thread.

        Nodes spend it with ``use_budget(name)``; a count over ``limit`` fails the run
        with ``budget_exceeded:<name>``. ``compile(budgets=...)`` may override the limit.
        """
        self._budgets[name] = limit
        return self

    def _validate(
        self, max_steps: int, budgets: Mapping[str, int], retention: int | None
    ) -> list[str]:
        problems = list(self._problems)
        known = self._nodes
        if not known:
            problems.append("the graph has no nodes")
        if self._entry is not None and self._entry not in known:
            problems.append(f"entry point {self._entry!r} is not a node")

        def check(kind: str, src: str, targets: Iterable[str]) -> None:
            if src not in known:
                problems.append(f"{kind} from unknown node {src!r}")
            for t in targets:
                if t not in known:
                    problems.append(f"{kind} from {src!r} targets unknown node {t!r}")

        for src, dsts in self._edges.items():
            check("edge", src, dsts)
        for src, conds in self._conditional.items():
            for cond in conds:
                check("conditional edge", src, cond.targets)
        for src, dsts in self._retry_routes.items():
            check("retry route", src, dsts)
            if len(dsts) > 1:
                problems.append(f"node {src!r} has {len(dsts)} retry routes; declare one")
        for src, parallels in self._parallel.items():
            for branches, then in parallels:
                check("parallel edge", src, [*branches, then])
                if not branches:
                    problems.append(f"the parallel edge from {src!r} has no branches")
        for src, fans in self._fan_outs.items():
            for node, then in fans:
                check("fan-out", src, [node, then])
            if len(fans) > 1:
                problems.append(f"node {src!r} declares {len(fans)} fan-outs; declare one")
        for src, dsts in self._timeout_routes.items():
            check("timeout route", src, dsts)
            if len(dsts) > 1:
                problems.append(f"node {src!r} has {len(dsts)} timeout routes; declare one")
        for name in sorted(self._terminal - set(known)):
            problems.append(f"allow_no_outgoing_route names unknown node {name!r}")
        branch_nodes = {b for ps in self._parallel.values() for bs, _ in ps for b in bs}
        branch_nodes |= {node for fs in self._fan_outs.values() for node, _ in fs}
        for name in known:
            routes = len(self._edges.get(name, ())) + len(self._conditional.get(name, ()))
            routes += len(self._parallel.get(name, ()))
            if routes > 1:
                problems.append(
                    f"node {name!r} has {routes} outgoing routes; declare one edge or one "
                    "conditional edge"
                )
            if routes == 0 and name not in self._terminal and name not in branch_nodes:
                problems.append(
                    f"node {name!r} has no outgoing route; add an edge or declare it terminal "
                    "with allow_no_outgoing_route"
                )
        if self._entry in known:
            seen: set[str] = set()
            todo = [self._entry]
            while todo:
                cur = todo.pop()
                if cur in seen or cur not in known:
                    continue
                seen.add(cur)
                todo.extend(self._edges.get(cur, ()))
                for cond in self._conditional.get(cur, ()):
                    todo.extend(cond.targets)
                todo.extend(self._retry_routes.get(cur, ()))
                todo.extend(self._timeout_routes.get(cur, ()))
                for branches, then in self._parallel.get(cur, ()):
                    todo.extend([*branches, then])
                for node, then in self._fan_outs.get(cur, ()):
                    todo.extend([node, then])
            for name in known:
                if name not in seen:
                    problems.append(f"node {name!r} is unreachable from entry {self._entry!r}")
        if max_steps < 1:
            problems.append(f"max_steps must be >= 1, got {max_steps!r}")
        for name, limit in budgets.items():
            if not name or limit < 1:
                problems.append(f"budget {name!r} needs a name and a limit >= 1, got {limit!r}")
        if retention is not None and retention < 1:
            problems.append(f"retention_limit must be >= 1 or None, got {retention!r}")
        return problems

    def compile(
        self,
        *,
        max_steps: int = 100,
        budgets: Mapping[str, int] | None = None,
        delete_on_success: bool = False,
        retention_limit: int | None = None,
        checkpoint_policy: CheckpointPolicy = CheckpointPolicy.FAIL_ON_SAVE_ERROR,
        save_every_step: bool = True,
        max_total_steps: int | None = 10_000,
        version: str | None = None,
        queue: str | None = None,
    ) -> Graph[S, E]:
        """Validate and freeze the graph.

        ``max_steps`` bounds the steps of one segment (a start or a resume);
        ``max_total_steps`` (default 10,000; ``None``: no bound) the steps of a thread
        across all its segments, persisted, so a graph that keeps handing off to itself
        ends with ``max_total_steps_exceeded`` instead of spinning a worker. ``budgets``
        declares named budgets (``use_budget``) and their limits, persisted across
        resumes. ``delete_on_success`` deletes a completed thread (if idle);
        ``retention_limit`` keeps that many history entries. ``save_every_step`` saves a
        checkpoint after each step so a crash resumes from the last completed step.
        ``checkpoint_policy`` decides what a failed save does (fail the run, or go on
        with a ``checkpoint_failed`` event). ``version`` names this graph in every
        snapshot it saves (default: a fingerprint of its nodes, edges and routes, so a
        deploy that changes them changes it); a thread saved under another version is
        resumed, recovered or forked only through declared migrations
        (``add_migration``, ``rename_node``). ``queue`` is the queue of the graph's
        hand-offs (of nodes without a queue of their own) and of its wake-up messages
        (signals) that name none (``None``: ``"default"``; a bad name raises
        ``ValueError`` at once). Raises ``GraphValidationError`` listing every problem.
        """
        if queue is not None:
            validate_queue_name(queue)
        budgets = {**self._budgets, **(budgets or {})}
        problems = self._validate(max_steps, budgets, retention_limit)
        if max_total_steps is not None and max_total_steps < 1:
            problems.append(f"max_total_steps must be >= 1 or None, got {max_total_steps!r}")
        graph_version = version if version is not None else self._fingerprint()
        if not graph_version:
            problems.append("version must be a non-empty string")
        migrations: dict[str, MigrationStep] = {}
        for source, (to, fn, renames) in self._migrations.items():
            target = to if to is not None else graph_version
            if source == target:
                problems.append(f"a migration from version {source!r} to itself")
            for old, new in renames.items():
                if target == graph_version and new not in self._nodes:
                    problems.append(f"rename_node({old!r}, {new!r}): {new!r} is not a node")
            migrations[source] = MigrationStep(target, fn, MappingProxyType(dict(renames)))
        if problems:
            raise GraphValidationError(problems)
        assert self._entry is not None
        state_type = self._state_type
        if state_type is None:
            # GraphBuilder[Refund, E]() leaves its type arguments on the instance.
            args = get_args(getattr(self, "__orig_class__", None))
            state_type = args[0] if args and _concrete(args[0]) else None
        return Graph(
            nodes=MappingProxyType(dict(self._nodes)),
            entry=self._entry,
            reducer=self._reducer,
            edges=MappingProxyType({k: v[0] for k, v in self._edges.items()}),
            conditional_edges=MappingProxyType({k: v[0] for k, v in self._conditional.items()}),
            retry_routes=MappingProxyType({k: v[0] for k, v in self._retry_routes.items()}),
            terminal_nodes=frozenset(self._terminal),
            max_steps=max_steps,
            budgets=MappingProxyType(budgets),
            delete_on_success=delete_on_success,
            retention_limit=retention_limit,
            checkpoint_policy=checkpoint_policy,
            save_every_step=save_every_step,
            state_type=state_type,
            max_total_steps=max_total_steps,
            timeout_routes=MappingProxyType({k: v[0] for k, v in self._timeout_routes.items()}),
            signal_handlers=MappingProxyType(dict(self._signal_handlers)),
            version=graph_version,
            migrations=MappingProxyType(migrations),
            parallel_edges=MappingProxyType({k: v[0] for k, v in self._parallel.items()}),
            fan_outs=MappingProxyType({k: v[0] for k, v in self._fan_outs.items()}),
            subgraphs=MappingProxyType(dict(self._subgraphs)),
            queue=queue,
            node_queues=MappingProxyType(dict(self._queues)),
        )

    def _fingerprint(self) -> str:
        """A short digest of the graph's structure: nodes, entry, edges and routes (not
        the code inside the nodes)."""
        shape = {
            "entry": self._entry,
            "nodes": sorted(self._nodes),
            "edges": {k: sorted(v) for k, v in sorted(self._edges.items())},
            "routes": {
                k: sorted(t for c in v for t in c.targets)
                for k, v in sorted(self._conditional.items())
            },
            "retry": {k: sorted(v) for k, v in sorted(self._retry_routes.items())},
            "timeout": {k: sorted(v) for k, v in sorted(self._timeout_routes.items())},
            "parallel": {
                k: [[list(b), t] for b, t in v] for k, v in sorted(self._parallel.items())
            },
            "fan_out": {k: [list(f) for f in v] for k, v in sorted(self._fan_outs.items())},
            "subgraphs": {k: v.graph.version for k, v in sorted(self._subgraphs.items())},
            "terminal": sorted(self._terminal),
        }
        digest = hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()
        return f"g-{digest[:12]}"
