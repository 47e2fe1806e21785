"""Every example under examples/ runs and shows what it promises."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flowy.testing.backends import backend_missing, port_open

ROOT = Path(__file__).resolve().parents[1]

POSTGRES_EXAMPLE = "postgres_hitl_workers.py"

EXPECTED = {
    "conditional_routing.py": ["cache hit: completed", "resumed via policy: completed"],
    "hitl_overlay.py": ["stale approval rejected", "current token: inv-42@2", "paid=True"],
    "streaming_agent.py": ["effect search('tides')", "terminal event: completed", "2 effects"],
    "stream_request_stop.py": ["stopped: canceled context_canceled", "resumed: completed end"],
    POSTGRES_EXAMPLE: [
        "-> suspended (awaiting_manager) -> approved by maria -> handoff (book_payment)",
        "stale approval by bob for expense-2 rejected: resume token expense-2@2 is stale",
        "every thread completed exactly once: 8 threads, 8 payments",
        "dropped",
    ],
}

NEEDS_POSTGRES = {POSTGRES_EXAMPLE}


def run_example(name: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    for needle in EXPECTED[name]:
        assert needle in proc.stdout, f"{name}: {needle!r} not in:\n{proc.stdout}"
    return proc


@pytest.mark.parametrize("name", sorted(set(EXPECTED) - NEEDS_POSTGRES))
def test_example_runs(name: str) -> None:
    run_example(name)


def test_postgres_hitl_workers() -> None:
    if not os.environ.get("FLOWY_POSTGRES_DSN") and not port_open("127.0.0.1", 5432):
        backend_missing("PostgreSQL is not on 127.0.0.1:5432 and FLOWY_POSTGRES_DSN is unset")
    out = run_example(POSTGRES_EXAMPLE).stdout
    # Both worker processes took a share of the work.
    ran = dict(re.findall(r"^(worker-[ab]) ran (\d+) thread", out, flags=re.MULTILINE))
    assert set(ran) == {"worker-a", "worker-b"}, out
    assert all(int(n) >= 1 for n in ran.values()), out
    assert sum(int(n) for n in ran.values()) == 8, out
    # Every thread completed, approved by the first manager, and booked exactly once.
    threads = re.findall(
        r"^  (expense-\d+): completed at revision \d+, approved by maria, "
        r"pay-\1 booked 1x by worker-[ab]$",
        out,
        flags=re.MULTILINE,
    )
    assert sorted(threads) == sorted(f"expense-{n}" for n in range(1, 9)), out


def test_every_example_is_tested() -> None:
    on_disk = {p.name for p in (ROOT / "examples").glob("*.py")}
    assert sorted(on_disk - set(EXPECTED)) == []
