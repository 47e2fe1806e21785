"""Cron expressions and the ticks of a schedule, with the standard library only.

:class:`CronExpression` parses the five standard fields (minute, hour, day of month,
month, day of week): ``*``, numbers, lists (``1,15``), ranges (``1-5``), steps (``*/15``,
``8-18/2``, ``5/10``) and the English names of months and days (``jan``-``dec``,
``sun``-``sat``, any case). Day of week 0 and 7 are both Sunday. As in Vixie cron, when
both the day of month and the day of week are restricted, a day matching either one
matches.

Not supported, refused with a message naming it: a sixth (seconds or year) field,
``L``, ``W``, ``#``, ``?``, ``H`` and the ``@`` shortcuts (``@daily``, ``@reboot``, ...).

Ticks are computed in the wall time of a time zone (:mod:`zoneinfo`), so that
``0 2 * * *`` in ``Europe/Berlin`` is 02:00 in Berlin all year. Around a daylight
saving change:

- a wall time that does not exist (the clock jumps from 02:00 to 03:00) fires at the
  same offset after the jump, once (02:30 fires at 03:30);
- a wall time that occurs twice (the clock goes back from 03:00 to 02:00) fires once,
  at its first occurrence, unless the hour field is ``*``: then it fires at both, as
  an hourly job runs every hour that passes.

:class:`Every` is a fixed interval instead: ticks at ``anchor + k * interval``.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass

__all__ = ["CronError", "CronExpression", "Every", "zone"]

_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_FIELDS = (
    ("minute", 0, 59, ()),
    ("hour", 0, 23, ()),
    ("day of month", 1, 31, ()),
    ("month", 1, 12, _MONTHS),
    ("day of week", 0, 7, _DAYS),
)
_DAYS_IN_MONTH = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_UNSUPPORTED = {
    "L": "L (last day)",
    "W": "W (nearest weekday)",
    "#": "# (nth weekday)",
    "?": "? (no specific value)",
    "H": "H (hashed values)",
}
_SEARCH_DAYS = 366 * 9  # a 29 February restricted to a weekday recurs within 28 years


class CronError(ValueError):
    """A cron expression that cannot be parsed (or a time zone that does not exist)."""


def zone(name: str) -> _dt.tzinfo:
    """The time zone ``name`` (``"Europe/Berlin"``, ``"UTC"``) from :mod:`zoneinfo`;
    ``CronError`` if the system's time zone database has no such zone."""
    # Imported here: zoneinfo loads sysconfig data, which ``import flowy`` must not.
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    if not isinstance(name, str) or not name:  # pyright: ignore[reportUnnecessaryIsInstance]
        raise CronError(f"a time zone is a name such as 'Europe/Berlin', got {name!r:.80}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise CronError(
            f"unknown time zone {name!r:.80}; use an IANA name such as 'Europe/Berlin' or 'UTC'"
        ) from None


def _number(text: str, field: str, low: int, high: int, names: tuple[str, ...]) -> int:
    lowered = text.lower()
    if lowered in names:
        return names.index(lowered) + (1 if field == "month" else 0)
    if text[-1:].upper() in "LWH" and (text[:-1].isdecimal() or len(text) == 1):
        raise CronError(f"{_UNSUPPORTED[text[-1].upper()]} is not supported, in {text!r:.40}")
    if not (text.isascii() and text.isdecimal()) or len(text) > 4:
        expected = f"{low}-{high}" + (f" or {names[0]}-{names[-1]}" if names else "")
        raise CronError(f"{field} field: {text!r:.40} is not a number ({expected})")
    value = int(text)
    if not low <= value <= high:
        raise CronError(f"{field} field: {value} is out of range {low}-{high}")
    return value


def _field(text: str, field: str, low: int, high: int, names: tuple[str, ...]) -> frozenset[int]:
    values: set[int] = set()
    for part in text.split(","):
        if not part:
            raise CronError(f"{field} field: empty list item in {text!r:.40}")
        body, slash, step_text = part.partition("/")
        step = 1
        if slash:
            if not (step_text.isascii() and step_text.isdecimal()) or len(step_text) > 4:
                raise CronError(f"{field} field: step {step_text!r:.40} is not a number")
            step = int(step_text)
            if not 1 <= step <= high - low + 1:
                raise CronError(f"{field} field: step {step} must be 1-{high - low + 1}")
        if body == "*":
            first, last = low, high
        elif "-" in body:
            start, _, end = body.partition("-")
            first = _number(start, field, low, high, names)
            last = _number(end, field, low, high, names)
            if first > last:
                raise CronError(f"{field} field: range {body!r:.40} runs backwards")
        else:
            first = _number(body, field, low, high, names)
            last = high if slash else first  # "5/10": from 5 to the end, every 10
        values.update(range(first, last + 1, step))
    return frozenset(values)


@dataclass(frozen=True, slots=True)
class CronExpression:
    """A parsed five-field cron expression (:meth:`parse`); :meth:`next_after` gives
    its next tick in a time zone."""

    text: str
    """The expression as given."""
    minutes: frozenset[int]
    """Minutes of the hour, 0-59."""
    hours: frozenset[int]
    """Hours of the day, 0-23."""
    days: frozenset[int]
    """Days of month, 1-31."""
    months: frozenset[int]
    """Months, 1-12."""
    weekdays: frozenset[int]
    """Days of week, 0-6 (0 is Sunday; a 7 in the expression is stored as 0)."""
    any_day: bool
    """The day of month field is ``*`` (so only the day of week restricts days)."""
    any_weekday: bool
    """The day of week field is ``*``."""

    @classmethod
    def parse(cls, text: str) -> CronExpression:
        """Parse ``text``; ``CronError`` (a ``ValueError``) with a one-line reason if it is
        not five standard fields, or can never fire (``0 0 30 2 *``)."""
        if not isinstance(text, str):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise CronError(f"a cron expression is a str, got {type(text).__name__}")
        stripped = text.strip()
        if stripped.startswith("@"):
            raise CronError(
                f"{stripped.split()[0]!r:.40} shortcuts are not supported; write the five "
                "fields (e.g. '0 0 * * *' for @daily)"
            )
        parts = stripped.split()
        if len(parts) != 5:
            raise CronError(
                f"a cron expression has five fields (minute hour day-of-month month "
                f"day-of-week), got {len(parts)} in {text!r:.80}"
                + ("; seconds and years are not supported" if len(parts) in (6, 7) else "")
            )
        for part in parts:
            for mark in "#?":
                if mark in part:
                    raise CronError(f"{_UNSUPPORTED[mark]} is not supported, in {part!r:.40}")
        values = [
            _field(part, field, low, high, names)
            for part, (field, low, high, names) in zip(parts, _FIELDS, strict=True)
        ]
        minutes, hours, days, months, weekdays = values
        weekdays = frozenset(d % 7 for d in weekdays)
        any_day, any_weekday = parts[2] == "*", parts[4] == "*"
        if any_weekday and not any(
            day <= _DAYS_IN_MONTH[month - 1] for month in months for day in days
        ):
            raise CronError(f"{text.strip()!r:.80} never fires: no month has those days")
        return cls(stripped, minutes, hours, days, months, weekdays, any_day, any_weekday)

    def _day_matches(self, date: _dt.date) -> bool:
        if date.month not in self.months:
            return False
        by_day = date.day in self.days
        by_weekday = (date.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:
            return by_day and by_weekday
        return by_day or by_weekday

    def next_after(self, after: float, tz: _dt.tzinfo) -> float:
        """The first tick strictly after ``after`` (seconds since the epoch), as seconds
        since the epoch; wall times are read in the time zone ``tz`` (see the module's
        notes on daylight saving changes)."""
        start = _dt.datetime.fromtimestamp(after, tz).replace(tzinfo=None)
        folds = (0, 1) if len(self.hours) == 24 else (0,)
        hours, minutes = sorted(self.hours), sorted(self.minutes)
        near = _dt.timedelta(hours=3)  # a daylight saving change shifts a wall time less
        floor = start if _stable(start, tz, near) else start - near
        date = start.date() - _dt.timedelta(days=1)
        for _ in range(_SEARCH_DAYS):
            if self._day_matches(date):
                best: tuple[float, _dt.datetime] | None = None
                for hour in hours:
                    for minute in minutes:
                        wall = _dt.datetime(date.year, date.month, date.day, hour, minute)
                        if wall < floor:
                            continue
                        if best is not None and wall > best[1] + near:
                            return best[0]
                        for fold in folds:
                            if fold and _exists_once(wall, tz):
                                continue
                            instant = wall.replace(tzinfo=tz, fold=fold).timestamp()
                            if instant > after and (best is None or instant < best[0]):
                                if _stable(wall, tz, near):
                                    return instant  # no change nearby: wall order is time order
                                best = (instant, wall)
                if best is not None:
                    return best[0]
            date += _dt.timedelta(days=1)
        raise CronError(f"{self.text!r:.80} has no tick in the {_SEARCH_DAYS} days after {after}")

    def __str__(self) -> str:
        return self.text


def _stable(wall: _dt.datetime, tz: _dt.tzinfo, near: _dt.timedelta) -> bool:
    """True if ``tz`` has the same UTC offset from ``near`` before ``wall`` to ``near``
    after it (no daylight saving change nearby)."""
    offset = wall.replace(tzinfo=tz).utcoffset()
    return (
        (wall - near).replace(tzinfo=tz).utcoffset() == offset
        and (wall + near).replace(tzinfo=tz).utcoffset() == offset
        and wall.replace(tzinfo=tz, fold=1).utcoffset() == offset
    )


def _exists_once(wall: _dt.datetime, tz: _dt.tzinfo) -> bool:
    """True unless ``wall`` occurs twice in ``tz`` (fold 1 is then a second instant)."""
    first = wall.replace(tzinfo=tz, fold=0).utcoffset()
    second = wall.replace(tzinfo=tz, fold=1).utcoffset()
    return first == second


@dataclass(frozen=True, slots=True)
class Every:
    """Ticks at a fixed interval: ``anchor + k * seconds`` for whole ``k >= 1``."""

    seconds: float
    """The interval, in seconds (1 to 366 days)."""
    anchor: float
    """The time the ticks count from (itself no tick), in seconds since the epoch."""

    def __post_init__(self) -> None:
        seconds = self.seconds
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise CronError(f"every must be a timedelta, got {seconds!r:.80}")
        if not 1 <= seconds <= 366 * 86400:
            raise CronError(f"every must be from 1 second to 366 days, got {seconds!r} seconds")

    def next_after(self, after: float) -> float:
        """The first tick strictly after ``after`` (seconds since the epoch)."""
        if after < self.anchor:
            return self.anchor + self.seconds
        steps = int((after - self.anchor) // self.seconds) + 1
        tick = self.anchor + steps * self.seconds
        while tick <= after:  # float rounding
            steps += 1
            tick = self.anchor + steps * self.seconds
        return tick
