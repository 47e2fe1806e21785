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
    print(report)
    assert report.ok, str(report)


async def test_the_queue_check_sees_runs_beyond_absent_limits(tmp_path: Path) -> None:
    """Without limits the same workers run more than 3 at once, and more than one of a
    partition: the queue check's observer would see a store that let them."""
    url = f"sqlite:///{tmp_path / 'crash.db'}"
    report = await crash.check_queue_crash(
        url, tmp_path, handoffs=120, partitions=2, kills=0, limited=False
    )
    fields = dict(f.split("=", 1) for f in report.detail.split() if f.count("=") == 1)
    assert int(fields["max_in_flight"]) > 3 and int(fields["max_per_partition"]) > 1, report
    assert fields["lost"] == fields["double"] == "0" and not report.ok


def test_runs_at_work_are_counted_from_begin_to_end_or_kill() -> None:
    ids = ["a", "b", "c"]
    lines = [
        "begin a p1 10 1.0",
        "begin b p2 11 1.5",
        "end a p1 10 2.0",
        "begin c p1 12 2.0",  # begins as a ends: not at work together
        "begin b p2 13 2.5",  # b again, in another process: the first was killed at 3.0
        "end c p1 12 4.0",
        "end b p2 13 4.0",
        "begin x p1 14 1.0",  # another check's thread
        "garbled",
    ]
    assert crash._most_at_work(lines, {"11": 3.0}, ids) == (3, 2, 1)  # pyright: ignore[reportPrivateUsage]
    assert crash._most_at_work(lines, {}, ids)[:2] == (3, 2)  # pyright: ignore[reportPrivateUsage]
