"""Peer comparison (optional): LangGraph's ``AsyncPostgresSaver`` on the durable-step
workload, against the same raw asyncpg OCC ``UPDATE``, flowy, and ``FlowySaver``
(flowy-langgraph: LangGraph's saver interface on flowy's PostgreSQL store, unfenced and
fenced), in one run.

LangGraph's loop checkpoints a step with ``aput_writes`` (the node's writes) and
``aput`` (the next checkpoint); a run also puts its input checkpoint first. This script
makes those calls itself around the same 10 node calls (a fresh thread per run, the
~1 KiB state as one channel), so it measures the saver's cost per step, not LangGraph's
engine; the same calls go to ``FlowySaver`` on the same database. Rounds interleave the
savers, the raw ``UPDATE`` and a flowy Runner on PostgreSQL; per-step medians.

It runs only where ``langgraph-checkpoint-postgres`` is importable: flowy's development
environment has it (a dev dependency, with flowy-langgraph). Elsewhere:

    python -m venv /tmp/peer
    /tmp/peer/bin/pip install -e packages/flowy-core -e packages/flowy-postgres \\
        -e packages/flowy-langgraph langgraph-checkpoint-postgres "psycopg[binary]"
    /tmp/peer/bin/python bench/peer_langgraph.py

``FLOWY_POSTGRES_DSN`` as for the other benchmarks; the saver's tables go to a fresh
schema, dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import importlib.util
import urllib.parse
import uuid
from typing import Any

import _common as c

import flowy
from flowy.storage import as_backend

HOW = (
    "peer comparison skipped: langgraph-checkpoint-postgres is not importable here; "
    "to include it, run bench/peer_langgraph.py from a venv that has it (see its docstring)"
)


def versions() -> dict[str, str]:
    out = {}
    for name in (
        "langgraph-checkpoint-postgres",
        "langgraph-checkpoint",
        "psycopg",
        "flowy-langgraph",
    ):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "?"
    return out


def with_search_path(dsn: str, schema: str) -> str:
    """``dsn`` whose sessions use ``schema`` (libpq's ``options``)."""
    parts = urllib.parse.urlsplit(dsn)
    query = [*urllib.parse.parse_qsl(parts.query), ("options", f"-csearch_path={schema}")]
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


async def measure(args: argparse.Namespace) -> list[c.Row]:
    import asyncpg
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.base.id import uuid6
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    from flowy_langgraph import FlowySaver

    dsn = c.postgres_dsn()
    schema = f"bench_peer_{uuid.uuid4().hex[:8]}"
    driver: Any = asyncpg
    admin = await driver.connect(dsn)
    raw_conn = await driver.connect(dsn)
    record = await c.sample_record()
    await admin.execute(f"CREATE SCHEMA {schema}")
    try:
        await admin.execute(
            f"CREATE TABLE {schema}.raw_head (id text PRIMARY KEY, rev bigint NOT NULL, "
            "body bytea NOT NULL)"
        )
        create = f"INSERT INTO {schema}.raw_head VALUES ($1, 1, $2) ON CONFLICT (id) DO NOTHING"
        update = f"UPDATE {schema}.raw_head SET rev = rev + 1, body = $2 WHERE id = $1 AND rev = $3"

        def raw(tid: str) -> Any:
            async def write(rev: int) -> None:
                if rev == 0:
                    assert await raw_conn.execute(create, tid, record) == "INSERT 0 1"
                else:
                    assert await raw_conn.execute(update, tid, record, rev) == "UPDATE 1"

            return write

        async with AsyncPostgresSaver.from_conn_string(with_search_path(dsn, schema)) as saver:
            await saver.setup()

            async def langgraph_run(tid: str, saver: Any = saver) -> None:
                config: Any = {"configurable": {"thread_id": tid, "checkpoint_ns": ""}}
                checkpoint: Any = empty_checkpoint()
                state = c.initial_state()
                checkpoint["channel_values"] = {"state": state}
                checkpoint["channel_versions"] = {"state": 1}
                config = await saver.aput(config, checkpoint, {"step": -1}, {"state": 1})
                for step, node in enumerate(c.NODES):
                    state, _ = await node(state)
                    await saver.aput_writes(config, [("state", state)], str(uuid.uuid4()))
                    checkpoint = {
                        **checkpoint,
                        "id": str(uuid6(clock_seq=step)),
                        "channel_values": {"state": state},
                        "channel_versions": {"state": step + 2},
                        "versions_seen": {node.__name__: {"state": step + 1}},
                    }
                    config = await saver.aput(
                        config, checkpoint, {"step": step, "source": "loop"}, {"state": step + 2}
                    )

            url = c.with_query(dsn, schema=schema, listen="false", pool_size=2)
            async with flowy.connect(url) as backend:
                runner = flowy.Runner(c.chain_graph(), as_backend(backend.checkpointer))
                base = f"bench-{uuid.uuid4().hex[:8]}"

                async def flowy_run(tid: str) -> None:
                    result = await runner.start(tid, c.initial_state())
                    assert result.status is flowy.RunStatus.COMPLETED, result

                flowy_saver = FlowySaver(backend)
                fenced_saver = FlowySaver(backend, fenced=True)
                timers = {
                    "langgraph": c.timed(lambda r: langgraph_run(f"{base}-g-{r}"), c.STEPS),
                    "flowysaver": c.timed(
                        lambda r: langgraph_run(f"{base}-s-{r}", flowy_saver), c.STEPS
                    ),
                    "flowysaver_fenced": c.timed(
                        lambda r: langgraph_run(f"{base}-x-{r}", fenced_saver), c.STEPS
                    ),
                    "raw": c.timed(lambda r: c.raw_chain(raw(f"{base}-r-{r}")), c.STEPS),
                    "flowy": c.timed(lambda r: flowy_run(f"{base}-f-{r}"), c.STEPS),
                }
                rounds = 10 if args.quick else 150
                samples = await c.interleave(timers, rounds, max_seconds=40.0)
    finally:
        await admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await admin.close()
        await raw_conn.close()
    m = {k: c.median(v) for k, v in samples.items()}
    cpu = {k: c.median(t.cpu[3:]) for k, t in timers.items()}
    v = versions()
    label = ", ".join(f"{k} {x}" for k, x in v.items())
    print(f"peer: LangGraph AsyncPostgresSaver ({label}), {len(samples['raw'])} rounds:")
    for k, what in (
        ("langgraph", "AsyncPostgresSaver (aput_writes + aput) per step"),
        ("flowysaver", "FlowySaver (aput_writes + aput) per step"),
        ("flowysaver_fenced", "FlowySaver(fenced=True) per step"),
        ("flowy", "flowy durable step"),
        ("raw", "raw asyncpg OCC UPDATE"),
    ):
        print(f"   {what:<50} {c.us(m[k]):>9}   CPU {c.us(cpu[k]):>9}")
    return [
        c.Row(
            "peer.langgraph",
            f"peer: LangGraph AsyncPostgresSaver step ({v['langgraph-checkpoint-postgres']}) "
            "vs raw OCC UPDATE",
            f"LangGraph {c.us(m['langgraph'])}",
            c.us(m["raw"]),
            m["langgraph"] / m["raw"],
            "—",
            "info",
            {
                "peer": m["langgraph"],
                "baseline": m["raw"],
                "flowy": m["flowy"],
                "peer_cpu": cpu["langgraph"],
            },
        ),
        c.info(
            "peer.flowysaver",
            f"peer run: FlowySaver step (flowy-langgraph {v['flowy-langgraph']}) "
            "vs AsyncPostgresSaver step",
            m["flowysaver"],
            m["langgraph"],
            fenced=m["flowysaver_fenced"],
            cpu=cpu["flowysaver"],
        ),
        c.info(
            "peer.flowysaver_fenced",
            "peer run: FlowySaver(fenced=True) step vs AsyncPostgresSaver step",
            m["flowysaver_fenced"],
            m["langgraph"],
        ),
        c.info(
            "peer.flowy",
            "peer run: flowy durable step vs raw OCC UPDATE (same run)",
            m["flowy"],
            m["raw"],
        ),
    ]


async def main(args: argparse.Namespace) -> list[c.Row]:
    what = "peer: LangGraph AsyncPostgresSaver step vs raw OCC UPDATE"
    try:
        found = importlib.util.find_spec("langgraph.checkpoint.postgres") is not None
    except ModuleNotFoundError:  # no langgraph at all
        found = False
    if not found:
        print(HOW)
        return [c.skipped("peer.langgraph", what, "langgraph-checkpoint-postgres not installed")]
    if args.quick:
        return [c.skipped("peer.langgraph", what, "--quick")]
    if why := await c.postgres_missing():
        print(f"peer: skipped: {why}")
        return [c.skipped("peer.langgraph", what, "no server")]
    return await measure(args)


if __name__ == "__main__":
    arguments = c.arguments(__doc__ or "")
    c.report(asyncio.run(main(arguments)), arguments)
