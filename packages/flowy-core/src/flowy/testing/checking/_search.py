"""The search of a check: seeds, schedules, shrinking and the report (:func:`check`,
:func:`acheck`), and the event loop whose clock jumps over waits."""

from __future__ import annotations

import asyncio
import random
import selectors
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, cast

from ..._graph import Graph
from ..._invariants import is_invariant
from ..._types import S
from ...memory import MemoryBackend, MemoryStore
from ...storage import Backend, redact_url
from ...storage.dialect import BaseBackend, open_scratch
from ..faults import Fault, FaultKind
from ._process import Clock, plain
from ._report import KINDS, CheckReport, Counterexample, Scenario, parse_schedule
from ._run import Outcome, Run, raise_if_cancelled

__all__ = ["acheck", "check"]

_EPOCH = 1_800_000_000.0


def _invariants_of(scenario: Callable[..., Any], extra: Sequence[Any]) -> list[Any]:
    module = sys.modules.get(getattr(scenario, "__module__", "") or "")
    found = [v for v in vars(module).values() if is_invariant(v)] if module else []
    return found + [v for v in extra if v not in found]


def _schedule(
    rng: random.Random, operations: list[tuple[str, str]], most: int
) -> dict[int, FaultKind]:
    """A random schedule over the operations of the fault-free run."""
    points = [i for i, (op, _) in enumerate(operations, 1) if op in KINDS]
    if not points:
        return {}
    n = min(rng.randint(1, most), len(points))
    return {at: rng.choice(KINDS[operations[at - 1][0]]) for at in sorted(rng.sample(points, n))}


def _by_number(faults: Sequence[Fault]) -> dict[int, FaultKind]:
    """A schedule by operation number (every fault of a schedule has one)."""
    schedule: dict[int, FaultKind] = {}
    for fault in faults:
        if fault.at is None:
            raise ValueError(f"a fault of a schedule strikes an operation number: {fault!r}")
        schedule[fault.at] = fault.kind
    return schedule


class _Checker(Generic[S]):
    def __init__(
        self,
        graph: Graph[S, Any],
        scenario: Callable[[], Scenario[S]],
        store: str | Callable[[], Backend[Any]] | None,
        invariants: Sequence[Callable[[Any], object]],
    ) -> None:
        self.graph = graph
        self.scenario = scenario
        self.store = store
        self.invariants = invariants
        self.runs = 0
        self.backend: BaseBackend[Any] | None = None
        self.created: set[str] = set()

    async def run(
        self,
        seed: int,
        faults: Mapping[int, FaultKind],
        by_words: Sequence[tuple[str, FaultKind]] = (),
    ) -> Outcome:
        self.runs += 1
        random.seed(seed)
        made = cast(object, self.scenario())
        if not isinstance(made, Scenario):
            raise TypeError(
                f"the scenario function returned a {type(made).__name__}, not a "
                "flowy.testing.Scenario"
            )
        story = cast(Scenario[S], made)
        fresh: Backend[Any] | None = None
        if self.store is None:
            clock = Clock(_EPOCH)
            base: Backend[Any] = MemoryBackend(MemoryStore(clock=clock))
            thread_id = story.thread_id
        elif callable(self.store):
            clock = Clock(time.time())
            base = fresh = self.store()
            thread_id = story.thread_id
        else:
            clock = Clock(time.time())
            if self.backend is None:
                # Never the store the URL names: a namespace of this check's own.
                self.backend = await open_scratch(self.store)
            base = cast(Backend[Any], self.backend)  # every store is both
            thread_id = f"{story.thread_id}-{uuid.uuid4().hex[:12]}"  # a fresh thread
        self.created.add(thread_id)
        run = Run(
            self.graph,
            story,
            base,
            clock,
            thread_id,
            faults,
            self.invariants,
            by_words,
            self.created,
        )
        try:
            await run.play()
            return await run.verify()
        finally:
            if fresh is not None:
                await fresh.aclose()

    @property
    def scratch(self) -> str | None:
        """The scratch store's URL, password masked (``None`` before one was opened)."""
        return None if self.backend is None else redact_url(self.backend.url)

    async def aclose(self) -> None:
        """Remove the scratch store (everything the check wrote) and close it."""
        if self.backend is not None:
            await self.backend.drop_scratch()

    async def shrink(self, seed: int, outcome: Outcome) -> Outcome:
        """The fewest faults of ``outcome``'s schedule that still fail."""
        best = outcome
        changed = True
        while changed and len(best.fired) > 1:
            changed = False
            for i in range(len(best.fired)):
                fewer = [f for j, f in enumerate(best.fired) if j != i]
                tried = await self.run(seed, _by_number([f for f, _, _ in fewer]))
                if not tried.violations:  # the others, aimed at the same operations
                    tried = await self.run(seed, {}, [(plain(o), f.kind) for f, _, o in fewer])
                if tried.violations and len(tried.fired) < len(best.fired):
                    best, changed = tried, True
                    break
        return best


def _replay_line(
    graph_spec: str | None,
    scenario: Callable[..., Any],
    store: str | None,
    schedule: str,
    seed: int,
) -> str:
    spec = f"{getattr(scenario, '__module__', '?')}:{getattr(scenario, '__qualname__', '?')}"
    if graph_spec is None:
        where = f"store={redact_url(store)!r}, " if store else ""
        return (
            f"flowy.testing.check(graph, {spec.split(':')[-1]}, {where}seed={seed}, "
            f"replay={schedule!r})"
        )
    store_option = f" --backend {redact_url(store)}" if store else ""
    return (
        f"flowy check {graph_spec} --scenario {spec}{store_option} --seed {seed} "
        f"--replay {schedule}"
    )


async def acheck(
    graph: Graph[S, Any] | str,
    scenario: Callable[[], Scenario[S]],
    *,
    seeds: int = 1000,
    store: str | Callable[[], Backend[Any]] | None = None,
    max_faults: int = 3,
    invariants: Sequence[Callable[[S], object]] = (),
    replay: str | Sequence[Fault] | None = None,
    seed: int = 0,
    first_seed: int = 0,
) -> CheckReport:
    """:func:`check`, awaited inside a running event loop (same arguments).

    Args:
        graph: as in :func:`check`.
        scenario: as in :func:`check`.
        seeds: as in :func:`check`.
        store: as in :func:`check`.
        max_faults: as in :func:`check`.
        invariants: as in :func:`check`.
        replay: as in :func:`check`.
        seed: as in :func:`check`.
        first_seed: as in :func:`check`.

    Returns:
        The report.
    """
    graph_spec: str | None = None
    if isinstance(graph, str):
        from ...cli._options import CliError, load_graph

        try:
            graph_spec, graph = graph, load_graph(graph)
        except CliError as exc:
            raise ValueError(str(exc).replace("--graph ", "graph ", 1)) from None
    if seeds < 1 or max_faults < 1:
        raise ValueError(f"need seeds >= 1 and max_faults >= 1, got {seeds!r}, {max_faults!r}")
    name = graph_spec or getattr(graph, "name", None) or "graph"
    probe = scenario()
    checks = _invariants_of(scenario, [*invariants, *getattr(probe, "invariants", ())])
    checker = _Checker(graph, scenario, store, checks)
    started = time.perf_counter()
    where = (
        "memory://"
        if store is None
        else redact_url(store)
        if isinstance(store, str)
        else getattr(store, "__name__", "a store")
    )
    injected: Counter[str] = Counter()

    def report(seeds_run: int, failure: Counterexample | None = None) -> CheckReport:
        elapsed = time.perf_counter() - started
        return CheckReport(
            name, where, seeds_run, checker.runs, injected, elapsed, failure, checker.scratch
        )

    try:
        if replay is not None:
            faults = parse_schedule(replay) if isinstance(replay, str) else tuple(replay)
            outcome = await checker.run(seed, _by_number(faults))
            injected.update(f.kind.value for f, _, _ in outcome.fired)
            failure = _failure(outcome, seed, len(outcome.fired), graph_spec, scenario, store)
            return report(1, failure)
        clean = await checker.run(first_seed, {})
        if clean.violations:
            failure = _failure(clean, first_seed, 0, graph_spec, scenario, store)
            return report(0, failure)
        for n in range(first_seed, first_seed + seeds):
            raise_if_cancelled()
            rng = random.Random(n)
            outcome = await checker.run(n, _schedule(rng, clean.operations, max_faults))
            injected.update(f.kind.value for f, _, _ in outcome.fired)
            if outcome.violations:
                found_with = len(outcome.fired)
                shrunk = await checker.shrink(n, outcome)
                failure = _failure(shrunk, n, found_with, graph_spec, scenario, store)
                return report(n - first_seed + 1, failure)
        return report(seeds)
    finally:
        await checker.aclose()


def _failure(
    outcome: Outcome,
    seed: int,
    found_with: int,
    graph_spec: str | None,
    scenario: Callable[..., Any],
    store: object,
) -> Counterexample | None:
    if not outcome.violations:
        return None
    schedule = tuple(f for f, _, _ in outcome.fired)
    text = ",".join(str(f) for f in schedule) or "none"
    return Counterexample(
        seed=seed,
        schedule=schedule,
        words=tuple(f"{w} [{f}]" for f, w, _ in outcome.fired) or ("no fault",),
        violations=tuple(outcome.violations),
        history=tuple(outcome.history),
        replay=_replay_line(
            graph_spec, scenario, store if isinstance(store, str) else None, text, seed
        ),
        found_with=max(found_with, len(schedule)),
    )


def check(
    graph: Graph[S, Any] | str,
    scenario: Callable[[], Scenario[S]],
    *,
    seeds: int = 1000,
    store: str | Callable[[], Backend[Any]] | None = None,
    max_faults: int = 3,
    invariants: Sequence[Callable[[S], object]] = (),
    replay: str | Sequence[Fault] | None = None,
    seed: int = 0,
    first_seed: int = 0,
) -> CheckReport:
    """Run ``graph`` through ``scenario`` under ``seeds`` random fault schedules (see
    the module's documentation); :func:`acheck` is the same inside an event loop.

    The first run has no faults (it must pass, and its operations are what the
    schedules strike); then seed ``n`` draws between 1 and ``max_faults`` faults. The
    first failing seed is shrunk to its fewest faults and reported: ``print(report)``.

    Args:
        graph: the graph, or ``"module:attribute"`` naming it (or a function returning
            it); with a name, the report's replay command is a ``flowy check`` line.
        scenario: a function returning a fresh :class:`Scenario` for each run.
        seeds: how many schedules to try.
        store: a store URL: the runs write only in a scratch store of their own next
            to the one it names (a schema, key namespace, table or file), removed when
            the check ends, also on failure; a store that cannot be namespaced raises
            ``BackendURLError`` before anything is written. Or a function returning a
            fresh ``Backend`` for each run (default: a fresh memory store per run, on
            the simulated clock).
        max_faults: the most faults in one schedule.
        invariants: invariants over every saved state, besides those of the scenario's
            module and ``Scenario.invariants``.
        replay: run only this schedule (a report's schedule text, or faults).
        seed: the seed of a replayed run.
        first_seed: the first seed of the search (seeds ``first_seed`` to
            ``first_seed + seeds - 1`` are tried).

    Returns:
        The report: ``report.ok``, and the shrunk counterexample if a run failed.

    Raises:
        RuntimeError: called inside a running event loop (``await acheck(...)`` there).
        BackendURLError: ``store`` is a URL of a store that cannot be namespaced.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError("flowy.testing.check runs its own event loop: await acheck() here")
    checking = acheck(
        graph,
        scenario,
        seeds=seeds,
        store=store,
        max_faults=max_faults,
        invariants=invariants,
        replay=replay,
        seed=seed,
        first_seed=first_seed,
    )
    # On a store in this process, waits (a save's retry backoff, a worker's pause) take
    # no real time: the loop's clock jumps to the next timer when nothing else can run.
    virtual = not isinstance(store, str)
    with asyncio.Runner(loop_factory=_jumping_loop if virtual else None) as runner:
        return runner.run(checking)


class _JumpingSelector(selectors.DefaultSelector):
    """A selector that, instead of sleeping until the next timer, moves the loop's clock
    there (it still blocks for real when no timer is due: threads, sockets)."""

    skipped = 0.0

    def select(self, timeout: float | None = None) -> list[tuple[Any, int]]:
        ready = super().select(0)
        if ready or timeout is None or timeout <= 0:
            return ready or (super().select(timeout) if timeout else ready)
        self.skipped += timeout
        return []


class _JumpingLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self.jumps = _JumpingSelector()
        super().__init__(self.jumps)

    def time(self) -> float:
        return super().time() + self.jumps.skipped


def _jumping_loop() -> asyncio.AbstractEventLoop:
    return _JumpingLoop()
