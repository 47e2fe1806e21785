"""A small randomised hand-off run: faults at every phase, nothing lost, nothing twice."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from flowy.testing import stress_stores
from flowy.testing.stress import run_stress

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("seed", [11, 12])
async def test_random_faults_lose_nothing_and_resume_nothing_twice(seed: int) -> None:
    logging.getLogger("flowy").setLevel(logging.ERROR)
    try:
        summary = await run_stress(150, seed=seed, fault_rate=0.3, crash_rate=0.1)
    finally:
        logging.getLogger("flowy").setLevel(logging.NOTSET)
    assert summary["faults"] > 50  # the faults really struck
    assert summary["lost"] == 0
    assert summary["double_resumed"] == 0


async def test_worker_processes_killed_mid_flight_lose_nothing(tmp_path: Path) -> None:
    """Worker processes on one SQLite file, one SIGKILLed mid-run and replaced."""
    summary = await stress_stores.run(
        f"sqlite:///{tmp_path / 'stress.db'}", 200, workers=2, kills=1, seed=5, deadline_seconds=240
    )
    assert summary["kills"] == 1
    assert int(summary["faults"]) > 20  # the faults really struck
    assert summary["lost"] == 0
    assert summary["double_resumed"] == 0
