"""Bytes a LangGraph thread leaves in SQLite after N supersteps of a growing message list:
LangGraph's own SQLite saver (``langgraph-checkpoint-sqlite``) against ``FlowySaver`` on
flowy's SQLite store, with ``keep_last=10`` and without.

The graph has one node that appends a ~100-byte message to a list channel (``operator.add``)
and loops to itself N times in one invocation: N supersteps, N+1 checkpoints. Each saver
writes to a fresh database file; the figure is the size of the database file and its WAL
after the saver is closed (pages freed by pruning are reused by later writes, so the file
is what a thread costs on disk), and the same after ``VACUUM``.

    .venv/bin/python scripts/langgraph_retention.py [--steps 1000] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import operator
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, StateGraph

from flowy_langgraph import FlowySaver


class Chat(TypedDict):
    messages: Annotated[list[str], operator.add]


def graph(steps: int, saver: Any) -> Any:
    async def reply(state: Chat) -> dict[str, list[str]]:
        n = len(state["messages"])
        return {"messages": [f"message {n:05d}: " + "lorem ipsum dolor sit amet " * 3]}

    def again(state: Chat) -> str:
        return "reply" if len(state["messages"]) < steps else END

    builder = StateGraph(Chat)
    builder.add_node("reply", reply)
    builder.add_edge(START, "reply")
    builder.add_conditional_edges("reply", again, ["reply", END])
    return builder.compile(checkpointer=saver)


def disk_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


def vacuumed_bytes(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        conn.execute("VACUUM")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return disk_bytes(path)


async def run(steps: int, saver: Any) -> float:
    started = time.perf_counter()
    config: Any = {"configurable": {"thread_id": "chat"}, "recursion_limit": steps + 10}
    result = await graph(steps, saver).ainvoke({"messages": []}, config)
    assert len(result["messages"]) == steps
    return time.perf_counter() - started


async def measure(steps: int, folder: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    stock = folder / "langgraph.db"
    async with AsyncSqliteSaver.from_conn_string(str(stock)) as saver:
        seconds = await run(steps, saver)
    rows.append(
        {"saver": "langgraph-checkpoint-sqlite AsyncSqliteSaver", "path": stock, "seconds": seconds}
    )
    for keep_last in (None, 10):
        path = folder / f"flowy-{keep_last or 'all'}.db"
        async with FlowySaver.from_url(f"sqlite:///{path}", keep_last=keep_last) as saver:
            seconds = await run(steps, saver)
        name = "FlowySaver" + (f"(keep_last={keep_last})" if keep_last else " (keep all)")
        rows.append({"saver": name, "path": path, "seconds": seconds})
    for row in rows:
        path = row.pop("path")
        row["bytes"] = disk_bytes(path)
        row["bytes_vacuumed"] = vacuumed_bytes(path)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = asyncio.run(measure(args.steps, Path(tmp)))
    print(f"{args.steps} supersteps of a growing message list, one thread, SQLite:")
    print("| saver | bytes on disk | after VACUUM | run time |")
    print("| --- | ---: | ---: | ---: |")
    for row in rows:
        print(
            f"| {row['saver']} | {row['bytes']:,} | {row['bytes_vacuumed']:,} "
            f"| {row['seconds']:.1f} s |"
        )
    if args.json:
        args.json.write_text(json.dumps({"steps": args.steps, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
