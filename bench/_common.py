"""What the benchmarks share: the workload, interleaved timing, medians, server discovery,
memory readings, and the rows of the budget table.

Every benchmark measures flowy and its baseline in the same process, in interleaved
rounds (the order rotates every round), so the noise of a shared machine hits both
alike; it reports medians and their ratio. A benchmark ends with :func:`report`, which
prints its rows as a table and, with ``--rows-json FILE``, writes them for
``bench/run.py`` (which prints one table for all of them).
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import gc
import json
import os
import platform
import socket
import statistics
import sys
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import flowy
from flowy.storage import as_backend

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_POSTGRES_DSN = "postgresql://postgres@127.0.0.1:5432/test"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"

# ---------------------------------------------------------------------------- the workload

STEPS = 10
"""Nodes of the chain every durable benchmark runs (one save after each)."""
TEXT = "lorem ipsum dolor sit amet, " * 32  # with the envelope: a record of about 1.2 KiB

State = dict[str, Any]


STAMPS: contextvars.ContextVar[list[float] | None] = contextvars.ContextVar(
    "bench_stamps", default=None
)
"""When set (to a list), each node call appends ``time.perf_counter()`` to it: the step
latencies of the concurrency benchmark."""


def _node(index: int, last: bool) -> Callable[[State], Awaitable[tuple[State, Any]]]:
    async def node(state: State) -> tuple[State, flowy.Directive[Any]]:
        stamps = STAMPS.get()
        if stamps is not None:
            stamps.append(time.perf_counter())
        new = {"n": state["n"] + 1, "node": index, "text": TEXT}
        return new, (flowy.end() if last else flowy.completed())

    node.__name__ = f"n{index}"
    return node


NODES = [_node(i, i == STEPS - 1) for i in range(STEPS)]
"""The chain's node functions, in order (the raw baselines call the same ones)."""


def chain_graph(**compile_options: Any) -> flowy.Graph[State, Any]:
    """A chain of :data:`STEPS` nodes, each replacing the ~1 KiB state; saved after
    every step (the default)."""
    b = flowy.GraphBuilder[State, Any]()
    for i, node in enumerate(NODES):
        b.add_node(f"n{i}", node)
        if i:
            b.add_edge(f"n{i - 1}", f"n{i}")
    b.allow_no_outgoing_route(f"n{STEPS - 1}")
    return b.compile(**compile_options)


def initial_state() -> State:
    return {"n": 0, "node": -1, "text": TEXT}


async def sample_record() -> bytes:
    """A record flowy stores for one step of the chain (taken from a run on the memory
    store): the raw baselines write these bytes, without encoding anything themselves."""
    from flowy.memory import MemoryCheckpointer

    cp = MemoryCheckpointer[State]()
    records: list[bytes] = []
    write = cp._write  # the bytes the store is handed

    async def capture(w: Any) -> Any:
        records.append(w.record)
        return await write(w)

    cp._write = capture  # type: ignore[method-assign]
    await flowy.Runner(chain_graph(), as_backend(cp)).start("bench-sample-0001", initial_state())
    return records[len(records) // 2]


async def raw_chain(write: Callable[[int], Awaitable[None]]) -> None:
    """The baseline of one run: the same node calls, each followed by ``write(revision)``
    (the driver's conditional write of revision ``revision + 1``; 0 creates)."""
    state = initial_state()
    for revision, node in enumerate(NODES):
        state, _ = await node(state)
        await write(revision)


# ----------------------------------------------------------------------------- timing


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0 < q < 1) of ``values``, by the nearest rank."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


Variant = Callable[[int], Awaitable[float]]
"""One measurement of a variant: given the round number, returns seconds (per op)."""


async def interleave(
    variants: Mapping[str, Variant],
    rounds: int,
    *,
    warmup: int = 3,
    max_seconds: float | None = None,
    min_rounds: int = 5,
) -> dict[str, list[float]]:
    """Run every variant once per round, rotating their order each round; return the
    samples of each (warm-up rounds dropped). With ``max_seconds``, stop early once that
    much time went by and ``min_rounds`` were measured."""
    names = list(variants)
    samples: dict[str, list[float]] = {name: [] for name in names}
    started = time.monotonic()
    for r in range(warmup + rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            value = await variants[name](r)
            if r >= warmup:
                samples[name].append(value)
        measured = r + 1 - warmup
        if (
            max_seconds is not None
            and measured >= min_rounds
            and time.monotonic() - started > max_seconds
        ):
            break
    return samples


class timed:
    """A variant timing ``await fn(round)``, divided by ``per`` operations; ``cpu``
    collects the process CPU time of each call likewise (all threads)."""

    def __init__(self, fn: Callable[[int], Awaitable[object]], per: int = 1) -> None:
        self.fn, self.per = fn, per
        self.cpu: list[float] = []

    async def __call__(self, r: int) -> float:
        cpu = time.process_time()
        started = time.perf_counter()
        await self.fn(r)
        elapsed = time.perf_counter() - started
        self.cpu.append((time.process_time() - cpu) / self.per)
        return elapsed / self.per


def us(seconds: float) -> str:
    """Seconds as microseconds, for a table cell."""
    value = seconds * 1e6
    return f"{value:,.1f} µs" if value < 100 else f"{value:,.0f} µs"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.2f} ms"


def per_s(value: float) -> str:
    return f"{value:,.0f}/s"


# ------------------------------------------------------------------------------ memory


def rss_bytes() -> int:
    """The resident set size of this process now (Linux: /proc/self/statm)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux: the peak, which can only grow
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def settled_rss() -> int:
    """RSS after a full garbage collection."""
    gc.collect()
    return rss_bytes()


def mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


# ------------------------------------------------------------------------------ servers


def postgres_dsn() -> str:
    return os.environ.get("FLOWY_POSTGRES_DSN", DEFAULT_POSTGRES_DSN)


def redis_url() -> str:
    return os.environ.get("FLOWY_REDIS_URL", DEFAULT_REDIS_URL)


def with_query(url: str, **options: object) -> str:
    """``url`` with ``options`` added to its query string."""
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query)
    query += [(k, str(v)) for k, v in options.items()]
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


def port_open(url: str, default_port: int) -> bool:
    parts = urllib.parse.urlsplit(url)
    try:
        with socket.create_connection(
            (parts.hostname or "127.0.0.1", parts.port or default_port), timeout=1.0
        ):
            return True
    except OSError:
        return False


async def postgres_missing() -> str | None:
    """Why PostgreSQL cannot be used (``None``: it answers)."""
    import asyncpg

    dsn = postgres_dsn()
    driver: Any = asyncpg
    try:
        conn = await asyncio.wait_for(driver.connect(dsn), 5)
    except Exception as exc:  # noqa: BLE001 - any failure to connect means: skip
        where = flowy.storage.redact_url(dsn)
        return f"no server at {where} ({type(exc).__name__}; set FLOWY_POSTGRES_DSN)"
    await conn.close()
    return None


async def redis_missing() -> str | None:
    """Why Redis cannot be used (``None``: it answers)."""
    from redis.asyncio import Redis

    url = redis_url()
    client: Any = Redis.from_url(url, socket_connect_timeout=2)  # pyright: ignore[reportUnknownMemberType]
    try:
        await client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure to reach the server means: skip
        where = flowy.storage.redact_url(url)
        return f"no server at {where} ({type(exc).__name__}; set FLOWY_REDIS_URL)"
    finally:
        await client.aclose()
    return None


# ------------------------------------------------------------------------------ rows


@dataclass
class Row:
    """One line of the budget table."""

    id: str
    """A stable key (``postgres.durable``): what tests and the README look rows up by."""
    what: str
    flowy: str = ""
    baseline: str = ""
    ratio: float | None = None
    budget: str = "—"
    verdict: str = "info"
    """``within``, ``over``, ``info`` (no budget), ``skipped: why`` or ``error: what``."""
    values: dict[str, float] = field(default_factory=lambda: {})
    """The numbers behind the cells (seconds, bytes, per second)."""


def at_most(
    id: str,
    what: str,
    flowy_value: float,
    baseline_value: float,
    limit: float,
    fmt: Callable[[float], str] = us,
    **values: float,
) -> Row:
    """A row whose budget is ``flowy / baseline <= limit``."""
    ratio = flowy_value / baseline_value
    return Row(
        id,
        what,
        fmt(flowy_value),
        fmt(baseline_value),
        ratio,
        f"≤ {limit:.2f}×",
        "within" if ratio <= limit else "over",
        {"flowy": flowy_value, "baseline": baseline_value, **values},
    )


def at_least(
    id: str,
    what: str,
    flowy_value: float,
    baseline_value: float,
    limit: float,
    fmt: Callable[[float], str] = per_s,
    **values: float,
) -> Row:
    """A row whose budget is ``flowy / baseline >= limit``."""
    ratio = flowy_value / baseline_value
    return Row(
        id,
        what,
        fmt(flowy_value),
        fmt(baseline_value),
        ratio,
        f"≥ {limit:.2f}×",
        "within" if ratio >= limit else "over",
        {"flowy": flowy_value, "baseline": baseline_value, **values},
    )


def below(
    id: str,
    what: str,
    flowy_value: float,
    baseline_value: float | None,
    limit: float,
    fmt: Callable[[float], str] = us,
    **values: float,
) -> Row:
    """A row whose budget is an absolute ``flowy <= limit`` (the baseline, if any, is
    shown for comparison)."""
    extra = {"flowy": flowy_value, **values}
    if baseline_value is not None:
        extra["baseline"] = baseline_value
    return Row(
        id,
        what,
        fmt(flowy_value),
        "" if baseline_value is None else fmt(baseline_value),
        None if baseline_value is None else flowy_value / baseline_value,
        f"≤ {fmt(limit)}",
        "within" if flowy_value <= limit else "over",
        extra,
    )


def info(
    id: str,
    what: str,
    flowy_value: float,
    baseline_value: float | None,
    fmt: Callable[[float], str] = us,
    **values: float,
) -> Row:
    """A row without a budget (shown for information)."""
    extra = {"flowy": flowy_value, **values}
    if baseline_value is None:
        return Row(id, what, fmt(flowy_value), "", None, "—", "info", extra)
    extra["baseline"] = baseline_value
    return Row(
        id,
        what,
        fmt(flowy_value),
        fmt(baseline_value),
        flowy_value / baseline_value,
        "—",
        "info",
        extra,
    )


def skipped(id: str, what: str, reason: str) -> Row:
    return Row(id, what, verdict=f"skipped: {reason}")


def failed(id: str, what: str, error: BaseException) -> Row:
    return Row(id, what, verdict=f"error: {type(error).__name__}: {error}"[:160])


def table(rows: Sequence[Row]) -> str:
    """The rows as a Markdown table."""
    lines = [
        "| what | flowy | baseline | ratio | budget | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        ratio = "" if row.ratio is None else f"{row.ratio:.2f}×"
        cells = (row.what, row.flowy, row.baseline, ratio, row.budget, row.verdict)
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines)


def environment() -> dict[str, Any]:
    """What the figures were measured on."""
    try:
        load = os.getloadavg()
    except OSError:
        load = (float("nan"),) * 3
    return {
        "python": platform.python_version(),
        "flowy_core": flowy.__version__,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in load],
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


# ------------------------------------------------------------------------------ CLI


def arguments(description: str, extra: Callable[[argparse.ArgumentParser], None] | None = None):
    """The options every benchmark takes (``run.py`` passes the same ones to all):
    ``--quick`` (a few iterations, memory and SQLite only), ``--full`` (the slow
    full-size runs) and ``--rows-json FILE``. Unknown options are ignored."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="a few iterations, no servers")
    parser.add_argument("--full", action="store_true", help="the slow full-size runs too")
    parser.add_argument("--rows-json", type=Path, help="write the rows here as JSON")
    if extra is not None:
        extra(parser)
    args, _ = parser.parse_known_args()
    return args


def report(rows: Sequence[Row], args: argparse.Namespace) -> None:
    """Print ``rows`` as a table; write them to ``--rows-json`` if given."""
    print()
    print(table(rows), flush=True)
    if args.rows_json is not None:
        args.rows_json.write_text(json.dumps([asdict(r) for r in rows], indent=1))


def quick_skip(args: argparse.Namespace) -> str | None:
    return "--quick (memory and SQLite only)" if args.quick else None
