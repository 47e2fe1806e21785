"""The crash checks on this store, with worker processes SIGKILLed around an activity, a
timer, a signal, a superstep, a cancel and a limited queue (``flowy.testing.crash``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from flowy.testing import crash

pytestmark = pytest.mark.anyio

QUEUE_HANDOFFS = "FLOWY_QUEUE_CRASH_HANDOFFS"
"""Hand-offs of the queue check (default: 500, or 40 on moto). moto's server answers one
request at a time and a query by reading the whole table: 40 take it about a minute,
100 about 2.5 minutes, and of 500 it finished 29 in 40 minutes."""


@pytest.mark.parametrize("check", crash.CHECKS, ids=lambda c: c.__name__)
async def test_crash_check(
    check: crash.Check, flowy_url: str, tmp_path: Path, dynamo_endpoint: Any
) -> None:
    if check is crash.check_queue_crash:
        default = 40 if dynamo_endpoint.kind == "moto" else 500
        handoffs = int(os.environ.get(QUEUE_HANDOFFS, default))
        kills = 6 if handoffs >= 500 else 2
        report = await crash.check_queue_crash(
            flowy_url, tmp_path, handoffs=handoffs, kills=kills, seconds=3600
        )
    else:
        report = await check(flowy_url, tmp_path)
    print(report)
    assert report.ok, str(report)
