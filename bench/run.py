"""``make bench``: run every benchmark of this folder and print ONE table of flowy's
figures next to their baselines and budgets, with a verdict per row.

Each benchmark runs in its own process (so memory figures start clean) and measures
flowy against its baseline in the same run, in interleaved rounds: quote the medians
and the ratios, not absolute times, on a shared machine. A benchmark whose server does
not answer says "skipped: no server" in its rows.

    uv run --frozen --all-packages python bench/run.py [--quick] [--full]
        [--only NAME ...] [--json FILE] [--strict]

``--quick``: a few iterations on the memory store and SQLite only (the smoke test's
mode); ``--full``: the slow full-size runs too (a million Worker messages, 100,000
suspended threads, DynamoDB's load on moto); ``--json FILE``: the rows, with the
environment, as JSON; ``--strict``: exit 1 when a row is over budget (otherwise only a
benchmark that failed to run makes the exit status non-zero).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, fields
from pathlib import Path

import _common as c

HERE = Path(__file__).resolve().parent
ORDER = [
    "engine",
    "codecs",
    "durable",
    "backend_dynamodb",
    "concurrency",
    "load",
    "memory",
    "outbox",
    "queue_limits",
    "peer_langgraph",
    "peer_langgraph_send",
]


def run_one(name: str, passed: list[str], folder: Path) -> tuple[list[c.Row], float]:
    """Run ``bench/<name>.py`` and read back its rows (an error row if it wrote none)."""
    out = folder / f"{name}.json"
    print(f"== {name}", flush=True)
    began = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(HERE / f"{name}.py"), *passed, "--rows-json", str(out)],
        check=False,
    )
    elapsed = time.monotonic() - began
    print(f"   ({elapsed:.1f} s)", flush=True)
    if out.exists():
        known = {f.name for f in fields(c.Row)}
        rows = [
            c.Row(**{k: v for k, v in r.items() if k in known}) for r in json.loads(out.read_text())
        ]
        if proc.returncode == 0:
            return rows, elapsed
    else:
        rows = []
    rows.append(
        c.Row(f"{name}.run", f"bench/{name}.py", verdict=f"error: exited {proc.returncode}")
    )
    return rows, elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--full", action="store_true")
    parser.add_argument("--only", action="append", choices=ORDER, help="run only these")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--strict", action="store_true", help="exit 1 if a row is over")
    args = parser.parse_args()
    passed = [flag for flag, on in (("--quick", args.quick), ("--full", args.full)) if on]
    names = [n for n in ORDER if not args.only or n in args.only]
    env = c.environment()
    print(
        f"flowy-core {env['flowy_core']}, Python {env['python']}, {env['cpus']} CPUs, "
        f"load average {env['load_average']}",
        flush=True,
    )
    began = time.monotonic()
    rows: list[c.Row] = []
    timings: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            got, timings[name] = run_one(name, passed, Path(tmp))
            rows += got
    total = time.monotonic() - began
    print()
    print(f"## flowy benchmarks ({time.strftime('%Y-%m-%d %H:%M')}, {total:.0f} s)")
    print()
    print(c.table(rows))
    over = [r for r in rows if r.verdict == "over"]
    errors = [r for r in rows if r.verdict.startswith("error")]
    print()
    print(
        f"{sum(r.verdict == 'within' for r in rows)} within budget, {len(over)} over, "
        f"{sum(r.verdict == 'info' for r in rows)} for information, "
        f"{sum(r.verdict.startswith('skipped') for r in rows)} skipped, {len(errors)} errors"
    )
    if any(r.id == "peer.langgraph" and "not installed" in r.verdict for r in rows):
        print(
            "peer comparison: install langgraph-checkpoint-postgres in a separate venv and "
            "run bench/peer_langgraph.py from it (its docstring shows how)"
        )
    if args.json is not None:
        env["load_average_after"] = c.environment()["load_average"]
        payload = {
            "environment": env,
            "arguments": passed,
            "seconds": {"total": total, **timings},
            "rows": [asdict(r) for r in rows],
        }
        args.json.write_text(json.dumps(payload, indent=1))
        print(f"rows written to {args.json}")
    if errors:
        return 1
    return 1 if args.strict and over else 0


if __name__ == "__main__":
    raise SystemExit(main())
