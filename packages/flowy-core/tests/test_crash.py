"""The crash checks of durable time on SQLite, with worker processes SIGKILLed
(``flowy.testing.crash``; the adapters run the same checks on their stores)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowy.testing import crash

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("check", crash.CHECKS, ids=lambda c: c.__name__)
async def test_crash_check_on_sqlite(check: crash.Check, tmp_path: Path) -> None:
    report = await check(f"sqlite:///{tmp_path / 'crash.db'}", tmp_path)
    assert report.ok, str(report)
