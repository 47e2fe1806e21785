"""Cron expressions (``flowy/_cron.py``): the five fields, names, steps, time zones and
daylight saving changes, the interval form, and one-line errors for what is not
supported."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowy.schedules import CronError, CronExpression, Every

UTC = ZoneInfo("UTC")
BERLIN = ZoneInfo("Europe/Berlin")


def at(tz: ZoneInfo, *parts: int, fold: int = 0) -> float:
    return dt.datetime(*parts, tzinfo=tz, fold=fold).timestamp()


def wall(tz: ZoneInfo, instant: float) -> str:
    return dt.datetime.fromtimestamp(instant, tz).strftime("%Y-%m-%d %H:%M %z")


def ticks(expr: str, tz: ZoneInfo, start: float, n: int) -> list[str]:
    cron = CronExpression.parse(expr)
    out: list[str] = []
    for _ in range(n):
        start = cron.next_after(start, tz)
        out.append(wall(tz, start))
    return out


@pytest.mark.parametrize(
    ("expr", "start", "expected"),
    [
        ("*/15 * * * *", (2026, 1, 1, 0, 7), ["00:15", "00:30", "00:45", "01:00"]),
        ("0 9-17/4 * * *", (2026, 1, 1, 0, 0), ["09:00", "13:00", "17:00", "09:00"]),
        ("5,10 0 * * *", (2026, 1, 1, 0, 5), ["00:10", "00:05", "00:10", "00:05"]),
        ("5/20 1 * * *", (2026, 1, 1, 0, 0), ["01:05", "01:25", "01:45", "01:05"]),
    ],
)
def test_minutes_and_hours(expr: str, start: tuple[int, ...], expected: list[str]) -> None:
    got = ticks(expr, UTC, at(UTC, *start), len(expected))
    assert [g[11:16] for g in got] == expected


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        # 2026-01-01 is a Thursday.
        ("0 0 * * MON", ["2026-01-05", "2026-01-12"]),
        ("0 0 * * fri-SAT", ["2026-01-02", "2026-01-03", "2026-01-09"]),
        ("0 0 * * 7", ["2026-01-04", "2026-01-11"]),  # 7 is Sunday, like 0
        ("0 0 1 feb,Apr *", ["2026-02-01", "2026-04-01", "2027-02-01"]),
        ("0 0 31 * *", ["2026-01-31", "2026-03-31", "2026-05-31"]),
        ("0 0 29 2 *", ["2028-02-29", "2032-02-29"]),
        # Both day fields restricted: either matches (the 13th, or any Friday).
        ("0 0 13 * 5", ["2026-01-02", "2026-01-09", "2026-01-13", "2026-01-16"]),
        ("0 0 * 3 1-5/2", ["2026-03-02", "2026-03-04", "2026-03-06", "2026-03-09"]),
    ],
)
def test_days_and_months(expr: str, expected: list[str]) -> None:
    got = ticks(expr, UTC, at(UTC, 2026, 1, 1, 0, 30), len(expected))
    assert [g[:10] for g in got] == expected


def test_a_time_zone_keeps_the_wall_time_across_a_change() -> None:
    start = at(BERLIN, 2026, 3, 27, 12, 0)
    assert ticks("0 9 * * *", BERLIN, start, 3) == [
        "2026-03-28 09:00 +0100",
        "2026-03-29 09:00 +0200",
        "2026-03-30 09:00 +0200",
    ]


def test_a_wall_time_that_does_not_exist_fires_once_after_the_jump() -> None:
    start = at(BERLIN, 2026, 3, 28, 12, 0)
    assert ticks("30 2 * * *", BERLIN, start, 2) == [
        "2026-03-29 03:30 +0200",
        "2026-03-30 02:30 +0200",
    ]
    # Every 20 minutes through the gap: the skipped wall times land on real ones once.
    assert ticks("*/20 * * * *", BERLIN, at(BERLIN, 2026, 3, 29, 1, 30), 4) == [
        "2026-03-29 01:40 +0100",
        "2026-03-29 03:00 +0200",
        "2026-03-29 03:20 +0200",
        "2026-03-29 03:40 +0200",
    ]


def test_a_wall_time_that_occurs_twice_fires_once_unless_every_hour() -> None:
    start = at(BERLIN, 2026, 10, 24, 12, 0)
    assert ticks("30 2 * * *", BERLIN, start, 2) == [
        "2026-10-25 02:30 +0200",
        "2026-10-26 02:30 +0100",
    ]
    assert ticks("30 * * * *", BERLIN, at(BERLIN, 2026, 10, 25, 1, 0), 3) == [
        "2026-10-25 01:30 +0200",
        "2026-10-25 02:30 +0200",
        "2026-10-25 02:30 +0100",
    ]


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("* * * *", "five fields"),
        ("0 * * * * *", "seconds and years are not supported"),
        ("@daily", "shortcuts are not supported"),
        ("@reboot", "shortcuts are not supported"),
        ("0 0 L * *", "L (last day) is not supported"),
        ("0 0 15W * *", "W (nearest weekday) is not supported"),
        ("0 0 * * 5#2", "# (nth weekday) is not supported"),
        ("0 0 ? * *", "? (no specific value) is not supported"),
        ("H * * * *", "H (hashed values) is not supported"),
        ("60 * * * *", "minute field: 60 is out of range 0-59"),
        ("* 24 * * *", "hour field: 24 is out of range 0-23"),
        ("* * 0 * *", "day of month field: 0 is out of range 1-31"),
        ("* * * 13 *", "month field: 13 is out of range 1-12"),
        ("* * * * 8", "day of week field: 8 is out of range 0-7"),
        ("5-1 * * * *", "runs backwards"),
        ("*/0 * * * *", "step 0 must be 1-60"),
        ("1,,2 * * * *", "empty list item"),
        ("x * * * *", "'x' is not a number"),
        ("* * * foo *", "'foo' is not a number (1-12 or jan-dec)"),
        ("0 0 30 2 *", "never fires"),
        ("", "five fields"),
    ],
)
def test_bad_expressions_say_why(expr: str, message: str) -> None:
    with pytest.raises(CronError) as info:
        CronExpression.parse(expr)
    assert message in str(info.value)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, ValueError)


def _matches(cron: CronExpression, moment: dt.datetime) -> bool:
    by_day = moment.day in cron.days
    by_weekday = moment.isoweekday() % 7 in cron.weekdays
    days = by_day and by_weekday if cron.any_day or cron.any_weekday else by_day or by_weekday
    return (
        moment.minute in cron.minutes
        and moment.hour in cron.hours
        and moment.month in cron.months
        and days
    )


fields = st.tuples(
    st.sampled_from(["*", "0", "*/7", "5-20/5", "1,31,59"]),
    st.sampled_from(["*", "3", "*/5", "8-17", "0,12"]),
    st.sampled_from(["*", "1", "13", "*/10", "28-31"]),
    st.sampled_from(["*", "2", "jan-jun", "*/3", "dec"]),
    st.sampled_from(["*", "0", "mon-fri", "6,0", "*/2"]),
)


@settings(max_examples=200, deadline=None)
@given(fields=fields, start=st.integers(0, 4_000_000_000))
def test_next_after_is_the_first_matching_minute_in_utc(
    fields: tuple[str, ...], start: int
) -> None:
    cron = CronExpression.parse(" ".join(fields))
    tick = cron.next_after(float(start), UTC)
    moment = dt.datetime.fromtimestamp(tick, UTC)
    assert tick > start and moment.second == 0
    assert _matches(cron, moment)
    # No matching minute in between (checked over the first day after the start).
    probe = (start // 60 + 1) * 60
    while probe < min(tick, start + 86400):
        assert not _matches(cron, dt.datetime.fromtimestamp(probe, UTC))
        probe += 60


@settings(max_examples=100, deadline=None)
@given(
    start=st.integers(1_700_000_000, 1_900_000_000),
    expr=st.sampled_from(["0 * * * *", "*/30 1-4 * * *", "15 2 * * 0"]),
)
def test_ticks_in_a_zone_strictly_increase(start: int, expr: str) -> None:
    cron = CronExpression.parse(expr)
    tick = float(start)
    for _ in range(30):
        following = cron.next_after(tick, BERLIN)
        assert following > tick
        tick = following


def test_every_counts_from_its_anchor() -> None:
    every = Every(300.0, 1000.0)
    assert every.next_after(0.0) == 1300.0
    assert every.next_after(1300.0) == 1600.0
    assert every.next_after(1599.5) == 1600.0
    with pytest.raises(CronError, match="1 second to 366 days"):
        Every(0.5, 0.0)
