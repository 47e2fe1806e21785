"""Durable schedules: start a graph's thread at every tick of a cron expression or an
interval, exactly once per tick across any number of workers.

Create one on a store (``backend.schedules``, typed as :func:`schedules_of` gives it)::

    await schedules_of(backend).create(
        "nightly-triage", graph="app.graphs:triage", cron="0 2 * * *",
        tz="Europe/Berlin", state={"queue": "inbox"},
    )

A ``flowy.Worker`` on the store fires the due ticks; each starts the thread
``Schedule.thread_id(tick)`` (``"nightly-triage@2026-12-03T01:00:00Z"``).

Cron expressions have the five standard fields, read in a time zone; see
:class:`CronExpression` for what is supported, how daylight saving changes are handled,
and what is not supported. ``every=timedelta(...)`` is the alternative to ``cron``.
"""

from __future__ import annotations

from ._cron import CronError as CronError
from ._cron import CronExpression as CronExpression
from ._cron import Every as Every
from ._cron import zone as zone
from .storage._schedules import CATCH_UP_POLICIES as CATCH_UP_POLICIES
from .storage._schedules import SKIP_GRACE as SKIP_GRACE
from .storage._schedules import CatchUp as CatchUp
from .storage._schedules import Schedule as Schedule
from .storage._schedules import TickClaim as TickClaim
from .storage._schedules import schedules_of as schedules_of

__all__ = [
    "CATCH_UP_POLICIES",
    "SKIP_GRACE",
    "CatchUp",
    "CronError",
    "CronExpression",
    "Every",
    "Schedule",
    "TickClaim",
    "schedules_of",
    "zone",
]
