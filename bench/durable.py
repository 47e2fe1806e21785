"""A durable step: a Runner running a 10-node chain that saves after every step (about
1 KiB of state, a fresh thread per run) against the raw driver's own conditional write
of the same bytes after each of the same node calls, on SQLite, PostgreSQL and Redis.

Per store, each round runs once (in a rotating order): flowy on the bare checkpointer,
flowy on the whole backend (a fenced run lease: acquire, fenced saves, release), the raw
conditional write, and a second raw baseline that also appends the history the way the
store does (information). A sample is one run's time divided by its 10 steps; the
figures are medians over rounds. Then, op by op, where one save's time goes.

Budgets (DESIGN §6): PostgreSQL and Redis ≤ 1.2× the raw write (≤ 1.3× with a fenced
run lease), SQLite ≤ 1.1× (same durability settings: WAL, synchronous=FULL).

Servers: ``FLOWY_POSTGRES_DSN`` (default postgresql://postgres@127.0.0.1:5432/test),
``FLOWY_REDIS_URL`` (default redis://127.0.0.1:6379/0); one that does not answer is
skipped.

    uv run --frozen --all-packages python bench/durable.py [--quick] [--store sqlite]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import hashlib
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import _common as c

import flowy
from flowy.memory import MemoryCheckpointer
from flowy.storage import Snapshot, as_backend
from flowy.storage.dialect import new_write_id

LEASE_OWNER = "bench-owner"


class Setup:
    """One store's flowy backend and raw writes, for the interleaved rounds."""

    name: str
    backend: Any
    raw: Callable[[str], Callable[[int], Awaitable[None]]]
    raw_history: Callable[[str], Callable[[int], Awaitable[None]]]
    raw_label: str
    history_label: str
    replay: Callable[[str], Callable[[int], Awaitable[None]]] | None = None
    """flowy's own save statements (captured from a run) sent raw on a held connection."""
    replay_pool: Callable[[str], Callable[[int], Awaitable[None]]] | None = None
    """The same through flowy's pool path (PostgreSQL)."""


def variants(setup: Setup) -> dict[str, c.timed]:
    graph = c.chain_graph()
    bare = flowy.Runner(graph, as_backend(setup.backend.checkpointer))
    leased = flowy.Runner(graph, setup.backend)
    engine = flowy.Runner(graph)
    memory = flowy.Runner(graph, as_backend(MemoryCheckpointer[c.State]()))
    base = f"bench-{uuid.uuid4().hex[:8]}"

    async def start(runner: flowy.Runner[c.State, Any], tid: str) -> None:
        result = await runner.start(tid, c.initial_state())
        assert result.status is flowy.RunStatus.COMPLETED, result

    out = {
        "flowy": c.timed(lambda r: start(bare, f"{base}-f-{r}"), c.STEPS),
        "flowy+lease": c.timed(lambda r: start(leased, f"{base}-l-{r}"), c.STEPS),
        "raw": c.timed(lambda r: c.raw_chain(setup.raw(f"{base}-r-{r}")), c.STEPS),
        "raw+history": c.timed(lambda r: c.raw_chain(setup.raw_history(f"{base}-h-{r}")), c.STEPS),
        "engine": c.timed(lambda r: start(engine, f"{base}-e-{r}"), c.STEPS),
        "memory": c.timed(lambda r: start(memory, f"{base}-m-{r}"), c.STEPS),
    }
    replay = setup.replay
    if replay is not None:
        out["replay"] = c.timed(lambda r: c.raw_chain(replay(f"{base}-s-{r}")), c.STEPS)
    pooled = setup.replay_pool
    if pooled is not None:
        out["replay+pool"] = c.timed(lambda r: c.raw_chain(pooled(f"{base}-p-{r}")), c.STEPS)
    return out


async def measure(
    setup: Setup, rounds: int, max_seconds: float
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """The interleaved rounds: wall time samples per variant, and median CPU per step."""
    timers = variants(setup)
    samples = await c.interleave(timers, rounds, max_seconds=max_seconds)
    cpu = {name: c.median(t.cpu[3:]) for name, t in timers.items()}
    return samples, cpu


def rows_of(
    setup: Setup,
    measured: tuple[dict[str, list[float]], dict[str, float]],
    budget: float,
    lease_budget: float | None,
) -> list[c.Row]:
    samples, cpu = measured
    m = {name: c.median(v) for name, v in samples.items()}
    n = len(samples["flowy"])
    title = setup.name
    w = 52

    def line(indent: int, label: str, name: str) -> None:
        print(f"{' ' * indent}{label:<{w + 3 - indent}} {c.us(m[name]):>9}   {c.us(cpu[name]):>9}")

    print(f"{title}: per step, medians of {n} interleaved rounds of {c.STEPS}-step runs:")
    print(f"   {'':<{w}} {'wall':>9}   {'CPU':>9} (this process, all threads)")
    line(3, "flowy durable step", "flowy")
    line(5, "the same Runner on the memory store (flowy CPU)", "memory")
    line(7, "of which the engine alone (no store)", "engine")
    if "replay" in m:
        line(5, "its save statements replayed on a held connection", "replay")
        via = "replay"
        if "replay+pool" in m:
            line(5, "the same through flowy's pool path", "replay+pool")
            via = "replay+pool"
        rest = m["flowy"] - m["memory"] - m[via]
        print(f"     {'the rest (load of the new thread, waits)':<{w - 2}} {c.us(rest):>9}")
    line(3, "flowy durable step with a fenced run lease", "flowy+lease")
    line(3, setup.raw_label, "raw")
    line(3, setup.history_label, "raw+history")
    sys.stdout.flush()
    key = title.lower()
    extra = {"rounds": float(n), **{f"median_{k}": v for k, v in m.items()}}
    extra.update({f"cpu_{k}": v for k, v in cpu.items()})
    rows = [
        c.at_most(
            f"{key}.durable",
            f"{title} durable step (vs {setup.raw_label})",
            m["flowy"],
            m["raw"],
            budget,
            **extra,
        )
    ]
    what = f"{title} durable step, fenced run lease (vs {setup.raw_label})"
    if lease_budget is None:
        rows.append(c.info(f"{key}.durable_lease", what, m["flowy+lease"], m["raw"], **extra))
    else:
        rows.append(
            c.at_most(
                f"{key}.durable_lease", what, m["flowy+lease"], m["raw"], lease_budget, **extra
            )
        )
    rows.append(
        c.info(
            f"{key}.durable_vs_history",
            f"{title} durable step (vs {setup.history_label}: 2nd baseline)",
            m["flowy"],
            m["raw+history"],
            **extra,
        )
    )
    return rows


# ------------------------------------------------------------------- decomposition


def snapshot(tid: str, n: int) -> Snapshot[c.State]:
    return Snapshot(
        tid,
        {"n": n, "node": n % c.STEPS, "text": c.TEXT},
        f"n{n % c.STEPS}",
        step_count=n,
        total_steps=n,
        updated_at=time.time(),
        write_id=new_write_id(),
    )


class Clock:
    """Wraps an async method of one object, recording the time spent inside it, until
    :meth:`restore`. (A class with ``__slots__`` is patched on the class, for this one
    instance only.)"""

    def __init__(self, owner: Any, method: str) -> None:
        self.samples: list[float] = []
        inner = getattr(owner, method)
        record = self.samples.append

        async def timed(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return await inner(*args, **kwargs)
            finally:
                record(time.perf_counter() - began)

        try:
            setattr(owner, method, timed)
            self.restore = lambda: delattr(owner, method)
        except AttributeError:  # __slots__: patch the class, for ``owner`` only
            cls = type(owner)
            original = cls.__dict__[method]

            async def patched(this: Any, *args: Any, **kwargs: Any) -> Any:
                if this is owner:
                    return await timed(*args, **kwargs)
                return await original(this, *args, **kwargs)

            setattr(cls, method, patched)
            self.restore = lambda: setattr(cls, method, original)

    def since(self, mark: int) -> float:
        return sum(self.samples[mark:])


async def decompose(
    setup: Setup,
    backend: Any,
    io_owner: Any,
    io_method: str,
    io_label: str,
    ops: int,
    acquire: tuple[Any, str] | None = None,
) -> dict[str, float]:
    """Where one save goes, op by op (a fresh thread every 10 saves, as in the rounds):
    the whole ``save``, the time inside the store's I/O call (``io_owner.io_method``;
    for PostgreSQL also the pool acquire inside it), ``_prepare`` alone (checks and
    encoding), a fenced save, and the raw writes; then the per-run costs of a leased
    run (lease acquire, the load that checks the thread is new, lease release).
    ``backend`` is a second backend of the same store, instrumented here (not the one
    the rounds measured)."""
    cp = backend.checkpointer
    io = Clock(io_owner, io_method)
    pool = Clock(*acquire) if acquire is not None else None
    try:
        return await _decompose(setup, backend, cp, io, pool, io_label, ops)
    finally:
        io.restore()
        if pool is not None:
            pool.restore()


async def _decompose(
    setup: Setup,
    backend: Any,
    cp: Any,
    io: Clock,
    pool: Clock | None,
    io_label: str,
    ops: int,
) -> dict[str, float]:
    base = f"bench-{uuid.uuid4().hex[:8]}"
    names = ("save", "fenced", "prepare", "raw", "history", "io", "acquire")
    times: dict[str, list[float]] = {k: [] for k in names}
    clock = time.perf_counter
    lease: Any = None
    raw: Callable[[int], Awaitable[None]] = setup.raw("")
    history: Callable[[int], Awaitable[None]] = setup.raw_history("")
    for i in range(ops):
        k, rev = divmod(i, c.STEPS)
        plain, fenced = f"{base}-d-{k}", f"{base}-df-{k}"
        if rev == 0:  # a fresh thread for each 10 saves, as in the rounds (untimed)
            if lease is not None:
                await backend.leases.release(lease)
            lease = await backend.leases.acquire(fenced, LEASE_OWNER, 600)
            raw, history = setup.raw(f"{base}-dr-{k}"), setup.raw_history(f"{base}-dh-{k}")
        snap, fsnap = snapshot(plain, rev + 1), snapshot(fenced, rev + 1)
        steps: list[tuple[str, Callable[[], Awaitable[object]]]] = [
            ("save", functools.partial(cp.save, rev, snap)),
            ("fenced", functools.partial(cp.save, rev, fsnap, lease=lease)),
            ("raw", functools.partial(raw, rev)),
            ("history", functools.partial(history, rev)),
        ]
        shift = i % len(steps)
        for name, call in steps[shift:] + steps[:shift]:
            io_mark, pool_mark = len(io.samples), len(pool.samples) if pool else 0
            began = clock()
            await call()
            times[name].append(clock() - began)
            if name == "save":
                times["io"].append(io.since(io_mark))
                if pool is not None:
                    times["acquire"].append(pool.since(pool_mark))
        began = clock()
        cp._prepare(rev, snap, None)  # the part of save before any I/O
        times["prepare"].append(clock() - began)
    if lease is not None:
        await backend.leases.release(lease)
    per_run: dict[str, list[float]] = {"lease_acquire": [], "load_missing": [], "release": []}
    for i in range(max(ops // 5, 20)):
        tid = f"{base}-run-{i}"
        began = clock()
        got = await backend.leases.acquire(tid, LEASE_OWNER, 30)
        per_run["lease_acquire"].append(clock() - began)
        began = clock()
        try:
            await cp.load(tid)
        except flowy.ThreadNotFoundError:
            pass
        per_run["load_missing"].append(clock() - began)
        began = clock()
        await backend.leases.release(got)
        per_run["release"].append(clock() - began)
    m = {k: c.median(v) for k, v in {**times, **per_run}.items() if v}
    w = 46
    print(f"{setup.name}: where one save goes ({ops} saves, op by op, medians):")
    print(f"   {'save() of a ~1 KiB snapshot':<{w}} {c.us(m['save'])}")
    print(f"     {'_prepare: checks + encode_snapshot (CPU)':<{w - 2}} {c.us(m['prepare'])}")
    if "acquire" in m:
        print(f"     {'pool acquire':<{w - 2}} {c.us(m['acquire'])}")
        m["statement"] = c.median(
            [a - b for a, b in zip(times["io"], times["acquire"], strict=True)]
        )
        label = "the save statement on the held connection"
        print(f"     {label:<{w - 2}} {c.us(m['statement'])}")
    else:
        print(f"     {io_label:<{w - 2}} {c.us(m['io'])}")
    m["rest"] = (
        c.median([s - i for s, i in zip(times["save"], times["io"], strict=True)]) - m["prepare"]
    )
    print(f"     {'the rest (base class, errors, result)':<{w - 2}} {c.us(m['rest'])}")
    print(f"   {'save() with a fenced lease':<{w}} {c.us(m['fenced'])}")
    print(f"   {setup.raw_label:<{w}} {c.us(m['raw'])}")
    print(f"   {setup.history_label:<{w}} {c.us(m['history'])}")
    run_cost = m["lease_acquire"] + m["load_missing"] + m["release"]
    print(
        f"   per leased run: lease acquire {c.us(m['lease_acquire'])}, load of the new "
        f"thread {c.us(m['load_missing'])}, release {c.us(m['release'])} "
        f"(over {c.STEPS} steps: {c.us(run_cost / c.STEPS)}/step); per bare run: the "
        f"load ({c.us(m['load_missing'] / c.STEPS)}/step)",
        flush=True,
    )
    return m


# ------------------------------------------------------------------------- stores


Replay = Callable[[str], Callable[[int], Awaitable[None]]]


async def capture_run(checkpointer: Any) -> str:
    """Run the chain once on ``checkpointer`` (whose store calls are being captured);
    return the thread id."""
    tid = f"bench-capture-{uuid.uuid4().hex[:8]}"
    result = await flowy.Runner(c.chain_graph(), as_backend(checkpointer)).start(
        tid, c.initial_state()
    )
    assert result.status is flowy.RunStatus.COMPLETED, result
    return tid


def substitute(values: tuple[Any, ...], mapping: dict[Any, Any]) -> list[Any]:
    return [mapping.get(v, v) if isinstance(v, str | bytes) else v for v in values]


async def postgres_replay(probe: Any, conn: Any) -> tuple[Replay, Replay] | None:
    """flowy's save statements of one run, captured, to send again with another thread
    id: on ``conn`` (a held connection: what the statements cost without flowy's code
    or its pool), and through the probe's own connector (its pool path: acquire,
    statement, release)."""
    connector = probe.checkpointer.connector
    calls: list[tuple[str, tuple[Any, ...]]] = []
    inner = connector.fetchrow

    async def fetchrow(action: str, sql: str, *args: Any, read: bool = False) -> Any:
        if not read:
            calls.append((sql, args))
        return await inner(action, sql, *args, read=read)

    connector.fetchrow = fetchrow
    try:
        tid = await capture_run(probe.checkpointer)
    finally:
        del connector.fetchrow
    key = hashlib.sha256(tid.encode()).digest()
    if len(calls) != c.STEPS or not all(tid in a and key in a for _, a in calls):
        print("   (replay unavailable: the save statements did not look as expected)")
        return None

    def replay_with(send: Callable[..., Awaitable[Any]]) -> Replay:
        def replay(new_tid: str) -> Callable[[int], Awaitable[None]]:
            mapping = {tid: new_tid, key: hashlib.sha256(new_tid.encode()).digest()}

            async def write(rev: int) -> None:
                sql, args = calls[rev]
                row = await send(sql, *substitute(args, mapping))
                assert row is not None and row[0] is not None, row

            return write

        return replay

    async def pooled(sql: str, *args: Any) -> Any:
        return await connector.fetchrow("replay a save", sql, *args)

    return replay_with(conn.fetchrow), replay_with(pooled)


async def redis_replay(probe: Any, client: Any) -> Replay | None:
    """flowy's save scripts of one run (EVALSHA keys and arguments), captured, to send
    again for another thread on ``client``."""
    store = probe.store
    calls: list[tuple[Any, tuple[Any, ...], tuple[Any, ...]]] = []
    cls = type(store)
    original = cls.__dict__["run"]

    async def run(this: Any, script: Any, keys: Any, args: Any, action: Any) -> Any:
        if this is store:
            calls.append((script, tuple(keys), tuple(args)))
        return await original(this, script, keys, args, action)

    cls.run = run
    try:
        tid = await capture_run(probe.checkpointer)
    finally:
        cls.run = original
    saves = [call for call in calls if call[0] is calls[-1][0]]
    layout = store.layout
    if len(saves) != c.STEPS or not all(tid in a for _, _, a in saves):
        print("   (replay unavailable: the save scripts did not look as expected)")
        return None

    def replay(new_tid: str) -> Callable[[int], Awaitable[None]]:
        old_keys, new_keys = layout.thread(tid).checkpoint, layout.thread(new_tid).checkpoint
        mapping: dict[Any, Any] = {tid: new_tid, **dict(zip(old_keys, new_keys, strict=True))}

        async def write(rev: int) -> None:
            script, keys, args = saves[rev]
            new = substitute(keys, mapping)
            reply = await client.execute_command(
                "EVALSHA", script.sha, len(new), *new, *substitute(args, mapping)
            )
            assert isinstance(reply, int), reply

        return write

    return replay


async def bench_sqlite(args: argparse.Namespace, rows: list[c.Row]) -> None:
    record = await c.sample_record()
    with tempfile.TemporaryDirectory() as tmp:
        raw_conn = sqlite3.connect(
            Path(tmp) / "raw.db", isolation_level=None, check_same_thread=False
        )
        raw_conn.execute("PRAGMA journal_mode=WAL")
        raw_conn.execute("PRAGMA synchronous=FULL")
        raw_conn.execute("CREATE TABLE head (id TEXT PRIMARY KEY, rev INTEGER, body BLOB)")
        raw_conn.execute("CREATE TABLE head2 (id TEXT PRIMARY KEY, rev INTEGER, body BLOB)")
        raw_conn.execute(
            "CREATE TABLE history (id TEXT, rev INTEGER, body BLOB, PRIMARY KEY (id, rev))"
        )
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="raw-sqlite")
        loop = asyncio.get_running_loop()

        def transaction(statements: list[tuple[str, tuple[Any, ...]]]) -> None:
            raw_conn.execute("BEGIN IMMEDIATE")
            try:
                for sql, params in statements:
                    assert raw_conn.execute(sql, params).rowcount == 1
                raw_conn.execute("COMMIT")
            except BaseException:
                raw_conn.execute("ROLLBACK")
                raise

        def raw(tid: str) -> Callable[[int], Awaitable[None]]:
            async def write(rev: int) -> None:
                if rev == 0:
                    stmt = ("INSERT OR IGNORE INTO head VALUES (?, 1, ?)", (tid, record))
                else:
                    sql = "UPDATE head SET rev = rev + 1, body = ? WHERE id = ? AND rev = ?"
                    stmt = (sql, (record, tid, rev))
                await loop.run_in_executor(executor, transaction, [stmt])

            return write

        def raw_history(tid: str) -> Callable[[int], Awaitable[None]]:
            async def write(rev: int) -> None:
                if rev == 0:
                    stmt = ("INSERT OR IGNORE INTO head2 VALUES (?, 1, ?)", (tid, record))
                else:
                    sql = "UPDATE head2 SET rev = rev + 1, body = ? WHERE id = ? AND rev = ?"
                    stmt = (sql, (record, tid, rev))
                hist = ("INSERT INTO history VALUES (?, ?, ?)", (tid, rev + 1, record))
                await loop.run_in_executor(executor, transaction, [stmt, hist])

            return write

        url = f"sqlite:///{tmp}/flowy.db"
        async with flowy.connect(url) as backend, flowy.connect(url) as probe:
            setup = Setup()
            setup.name, setup.backend = "SQLite", backend
            setup.raw, setup.raw_history = raw, raw_history
            setup.raw_label = "raw sqlite3 conditional UPDATE"
            setup.history_label = "raw head+history transaction"
            rounds, cap = (6, 15.0) if args.quick else (150, 45.0)
            rows += rows_of(setup, await measure(setup, rounds, cap), 1.1, None)
            ops = 30 if args.quick else 300
            await decompose(setup, probe, probe.database, "run", "the write job (thread)", ops)
        executor.shutdown()
        raw_conn.close()


async def bench_postgres(args: argparse.Namespace, rows: list[c.Row]) -> None:
    import asyncpg

    record = await c.sample_record()
    dsn = c.postgres_dsn()
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    driver: Any = asyncpg
    admin = await driver.connect(dsn)
    raw_conn = await driver.connect(dsn)
    try:
        await admin.execute(f"CREATE SCHEMA {schema}")
        await admin.execute(
            f"CREATE TABLE {schema}.raw_head (id text PRIMARY KEY, rev bigint NOT NULL, "
            "body bytea NOT NULL)"
        )
        await admin.execute(
            f"CREATE TABLE {schema}.raw_head2 (id text PRIMARY KEY, rev bigint NOT NULL)"
        )
        await admin.execute(
            f"CREATE TABLE {schema}.raw_history (id text, rev bigint, body bytea NOT NULL, "
            "PRIMARY KEY (id, rev))"
        )
        create = f"INSERT INTO {schema}.raw_head VALUES ($1, 1, $2) ON CONFLICT (id) DO NOTHING"
        update = f"UPDATE {schema}.raw_head SET rev = rev + 1, body = $2 WHERE id = $1 AND rev = $3"
        cte_create = (
            f"WITH h AS (INSERT INTO {schema}.raw_head2 VALUES ($1, 1) ON CONFLICT (id) "
            f"DO NOTHING RETURNING rev) INSERT INTO {schema}.raw_history SELECT $1, rev, $2 "
            "FROM h"
        )
        cte_update = (
            f"WITH h AS (UPDATE {schema}.raw_head2 SET rev = rev + 1 WHERE id = $1 AND "
            f"rev = $3 RETURNING rev) INSERT INTO {schema}.raw_history SELECT $1, rev, $2 FROM h"
        )

        def raw(tid: str) -> Callable[[int], Awaitable[None]]:
            async def write(rev: int) -> None:
                if rev == 0:
                    assert await raw_conn.execute(create, tid, record) == "INSERT 0 1"
                else:
                    assert await raw_conn.execute(update, tid, record, rev) == "UPDATE 1"

            return write

        def raw_history(tid: str) -> Callable[[int], Awaitable[None]]:
            async def write(rev: int) -> None:
                if rev == 0:
                    status = await raw_conn.execute(cte_create, tid, record)
                else:
                    status = await raw_conn.execute(cte_update, tid, record, rev)
                assert status == "INSERT 0 1", status

            return write

        url = c.with_query(dsn, schema=schema, listen="false", pool_size=2)
        async with flowy.connect(url) as backend, flowy.connect(url) as probe:
            setup = Setup()
            setup.name, setup.backend = "PostgreSQL", backend
            setup.raw, setup.raw_history = raw, raw_history
            setup.raw_label = "raw asyncpg OCC UPDATE"
            setup.history_label = "raw one-statement head+history CTE"
            replays = await postgres_replay(probe, raw_conn)
            if replays is not None:
                setup.replay, setup.replay_pool = replays
            rows += rows_of(setup, await measure(setup, 200, 45.0), 1.2, 1.3)
            connector = probe.checkpointer.connector
            await decompose(
                setup,
                probe,
                connector,
                "fetchrow",
                "the statement",
                400,
                acquire=(connector, "acquire"),
            )
    finally:
        await admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await admin.close()
        await raw_conn.close()


CAS = """
local rev = tonumber(redis.call('HGET', KEYS[1], 'rev') or '0')
if rev ~= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'rev', rev + 1, 'body', ARGV[2])
return 1
"""
CAS_HISTORY = """
local rev = tonumber(redis.call('HGET', KEYS[1], 'rev') or '0')
if rev ~= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'rev', rev + 1)
redis.call('HSET', KEYS[2], rev + 1, ARGV[2])
return 1
"""


async def bench_redis(args: argparse.Namespace, rows: list[c.Row]) -> None:
    from redis.asyncio import Redis

    record = await c.sample_record()
    url = c.redis_url()
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    raw_prefix = f"{namespace}-raw"
    client: Any = Redis.from_url(url)  # pyright: ignore[reportUnknownMemberType]
    cas, cas_history = await client.script_load(CAS), await client.script_load(CAS_HISTORY)

    def raw(tid: str) -> Callable[[int], Awaitable[None]]:
        key = f"{raw_prefix}:{{{tid}}}:head"

        async def write(rev: int) -> None:
            assert await client.evalsha(cas, 1, key, rev, record) == 1

        return write

    def raw_history(tid: str) -> Callable[[int], Awaitable[None]]:
        keys = (f"{raw_prefix}:{{{tid}}}:head2", f"{raw_prefix}:{{{tid}}}:history")

        async def write(rev: int) -> None:
            assert await client.evalsha(cas_history, 2, *keys, rev, record) == 1

        return write

    store_url = c.with_query(url, namespace=namespace)
    try:
        async with flowy.connect(store_url) as backend, flowy.connect(store_url) as probe:
            setup = Setup()
            setup.name, setup.backend = "Redis", backend
            setup.raw, setup.raw_history = raw, raw_history
            setup.raw_label = "raw EVALSHA compare-and-set"
            setup.history_label = "raw EVALSHA CAS + history"
            setup.replay = await redis_replay(probe, client)
            rows += rows_of(setup, await measure(setup, 300, 30.0), 1.2, 1.3)
            await decompose(setup, probe, probe.store, "run", "EVALSHA of the save script", 600)
            await backend.purge()
    finally:
        async for key in client.scan_iter(match=f"{raw_prefix}:*"):
            await client.unlink(key)
        await client.aclose()


STORES = {"sqlite": bench_sqlite, "postgres": bench_postgres, "redis": bench_redis}
TITLES = {"sqlite": "SQLite", "postgres": "PostgreSQL", "redis": "Redis"}
MISSING: dict[str, Callable[[], Awaitable[str | None]]] = {
    "postgres": c.postgres_missing,
    "redis": c.redis_missing,
}


def placeholders(store: str, verdict: Callable[[str, str], c.Row]) -> list[c.Row]:
    title = TITLES[store]
    return [
        verdict(f"{store}.durable", f"{title} durable step"),
        verdict(f"{store}.durable_lease", f"{title} durable step, fenced run lease"),
        verdict(f"{store}.durable_vs_history", f"{title} durable step (2nd baseline)"),
    ]


async def main(args: argparse.Namespace) -> list[c.Row]:
    rows: list[c.Row] = []
    record = await c.sample_record()
    print(f"durable step: {c.STEPS}-node chain, record {len(record)} bytes, fresh thread per run")
    for store in args.store or list(STORES):
        if args.quick and store != "sqlite":
            rows += placeholders(store, lambda i, w: c.skipped(i, w, "--quick"))
            continue
        missing = await MISSING[store]() if store in MISSING else None
        if missing:
            print(f"{store}: skipped: {missing}")
            rows += placeholders(store, lambda i, w: c.skipped(i, w, "no server"))
            continue
        before = len(rows)
        try:
            await STORES[store](args, rows)
        except Exception as exc:  # noqa: BLE001 - one broken store must not hide the others
            print(f"{store}: failed: {exc!r}")
            del rows[before:]
            rows += placeholders(store, lambda i, w, e=exc: c.failed(i, w, e))
    return rows


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", action="append", choices=sorted(STORES))


if __name__ == "__main__":
    arguments = c.arguments(__doc__ or "", _options)
    c.report(asyncio.run(main(arguments)), arguments)
