"""The crash checks on this store, with worker processes SIGKILLed around an activity, a
timer, a signal, a superstep, a cancel and a limited queue (``flowy.testing.crash``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowy.testing import crash

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("check", crash.CHECKS, ids=lambda c: c.__name__)
async def test_crash_check(check: crash.Check, flowy_url: str, tmp_path: Path) -> None:
    report = await check(flowy_url, tmp_path)
    print(report)
    assert report.ok, str(report)
