"""``make bench`` keeps working: its harness runs in its quick mode (a few iterations, the
memory store and SQLite only, no servers) and prints the one table with every row and a
verdict. Timings are never asserted: only that each figure was measured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

HEADER = "| what | flowy | baseline | ratio | budget | verdict |"

# Rows measured in quick mode (their figures must be there, whatever they are).
MEASURED = {
    "engine",
    "engine.alone",
    "engine.fan_out",
    "memory.durable_cpu",
    "codec.dict",
    "codec.dataclass",
    "codec.msgspec",
    "codec.pydantic",
    "sqlite.durable",
    "sqlite.durable_lease",
    "sqlite.durable_vs_history",
    "memory.load",
    "memory.list",
    "sqlite.load",
    "sqlite.list",
    "memory.worker_rss",
    "memory.worker_traced",
    "memory.suspended",
    "memory.queue_limits",
    # langgraph is a dev dependency (flowy-langgraph's tests): the fan-out peer runs here.
    "peer.langgraph_send",
}
# Rows that need a server (or --full): present, and skipped in quick mode.
SKIPPED = {
    "postgres.durable",
    "postgres.durable_lease",
    "redis.durable",
    "redis.durable_lease",
    "dynamodb.save",
    "postgres.concurrency",
    "redis.concurrency",
    "postgres.load",
    "redis.load",
    "postgres.outbox_worker",
    "redis.outbox_worker",
    "postgres.handoff_latency",
    "postgres.queue_limits",
    "redis.queue_limits",
    "peer.langgraph",
}
BUDGETED = {
    "engine",
    "engine.alone",
    "memory.durable_cpu",
    "sqlite.durable",
    "memory.load",
    "sqlite.list",
    "memory.suspended",
}


def test_quick_bench_prints_the_table(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert HEADER in proc.stdout, proc.stdout[-3000:]
    table = proc.stdout[proc.stdout.index(HEADER) :]
    rows = {row["id"]: row for row in json.loads(out.read_text())["rows"]}
    missing = (MEASURED | SKIPPED) - set(rows)
    assert not missing, sorted(missing)
    for key in MEASURED:
        row = rows[key]
        assert row["verdict"] in ("within", "over", "info"), (key, row["verdict"])
        assert row["ratio"] is not None and row["ratio"] > 0, (key, row)
        assert f"| {row['what']} |" in table, key
    for key in BUDGETED:
        assert rows[key]["budget"] != "—", key
    for key in SKIPPED:
        assert rows[key]["verdict"].startswith("skipped"), (key, rows[key]["verdict"])
    for line in table.splitlines()[2:]:
        if not line.startswith("|"):
            break
        verdict = line.rstrip(" |").rsplit("| ", 1)[-1]
        assert verdict in ("within", "over", "info") or verdict.startswith("skipped"), line
