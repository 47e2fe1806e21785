"""``make bench``: run every benchmark of this folder and print its figures.

Each benchmark measures flowy against its own baseline (a bare loop, the raw driver's
conditional write) in the same run, so the ratios hold on a noisy shared machine; quote
medians and ratios, not absolute times. A benchmark whose backend is not reachable says
so and is skipped.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ORDER = [
    "engine.py",
    "durable.py",
    "backend_postgres.py",
    "backend_redis.py",
    "backend_dynamodb.py",
]


def main() -> int:
    scripts = [HERE / n for n in ORDER if (HERE / n).exists()]
    scripts += sorted(p for p in HERE.glob("*.py") if p.name not in ORDER and p.name != "run.py")
    failed = 0
    for script in scripts:
        print(f"== {script.name}", flush=True)
        started = time.monotonic()
        proc = subprocess.run([sys.executable, str(script), *sys.argv[1:]], check=False)
        if proc.returncode != 0:
            failed += 1
            print(f"   {script.name} exited {proc.returncode}")
        print(f"   ({time.monotonic() - started:.1f}s)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
