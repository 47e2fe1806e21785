"""Every example under examples/ runs and shows what it promises."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

EXPECTED = {
    "conditional_routing.py": ["cache hit: completed", "resumed via policy: completed"],
    "hitl_overlay.py": ["stale approval rejected", "current token: inv-42@2", "paid=True"],
    "streaming_agent.py": ["effect search('tides')", "terminal event: completed", "2 effects"],
    "stream_request_stop.py": ["stopped: canceled context_canceled", "resumed: completed end"],
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_runs(name: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    for needle in EXPECTED[name]:
        assert needle in proc.stdout, f"{name}: {needle!r} not in:\n{proc.stdout}"


def test_every_example_is_tested() -> None:
    on_disk = {p.name for p in (ROOT / "examples").glob("*.py")}
    assert on_disk - set(EXPECTED) <= {p for p in on_disk if p.startswith("postgres_")}
