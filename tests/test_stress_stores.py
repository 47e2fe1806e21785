"""A small version of ``make verify-stress`` on the real servers: worker processes with
faults at every phase, one SIGKILLed mid-run, on PostgreSQL and Redis (SQLite's runs in
flowy-core's tests). DynamoDB's runs only in ``make verify-stress``: moto, its local
stand-in, serves about ten saves a second."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from flowy.testing import stress_stores
from flowy.testing.backends import backend_missing, port_open

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[1]


def _script() -> Any:
    spec = importlib.util.spec_from_file_location(
        "stress_stores_script", ROOT / "scripts" / "stress_stores.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("store", "port"), [("postgres", 5432), ("redis", 6379)])
async def test_worker_processes_killed_mid_flight_lose_nothing(store: str, port: int) -> None:
    if not port_open("127.0.0.1", port):
        backend_missing(f"no {store} server on 127.0.0.1:{port}")
    async with _script().MAKERS[store]() as url:
        summary = await stress_stores.run(
            url, 150, workers=2, kills=1, seed=3, deadline_seconds=240
        )
    assert summary["kills"] == 1
    assert int(summary["faults"]) > 10  # the faults really struck
    assert summary["lost"] == 0
    assert summary["double_resumed"] == 0
