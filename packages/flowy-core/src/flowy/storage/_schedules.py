"""Durable schedules: :class:`Schedule` and the base of a store's schedule table,
:class:`BaseScheduleStore` (``backend.schedules``).

A store implements five atomic primitives over one record per schedule name, each
carrying a version: insert if absent, read one, read all, replace if the version is
unchanged (the version goes up by one), delete. The base owns everything else: the
checks of what is given (the same error on every store), the encoding, pause and
resume, and the claim of a due tick, which is one compare-and-set of the record's
version. So among any number of workers that find a tick due, exactly one claims it;
that one starts the tick's thread, whose id is derived from the schedule and the tick
(:meth:`Schedule.thread_id`), so a second start of the same tick is refused by the
checkpointer anyway.

Catch-up after downtime (the ticks that came due while no worker fired them):

- ``"skip"``: only the newest due tick starts, and only if it came due at most
  :data:`SKIP_GRACE` seconds ago; older ticks are dropped.
- ``"one"``: the newest due tick starts, however late; older ones are dropped.
- ``"all"``: every due tick starts, oldest first, but at most ``catch_up_cap`` of them
  (the newest ones); older ones are dropped.

A claim happens before the start, and the claimed ticks stay ``pending`` in the record,
each held by its claim until a deadline (``hold`` seconds), until the worker that
claimed them has started their threads (:meth:`BaseScheduleStore.started`). A worker
that dies in between leaves them pending: once their hold runs out, the next claim by any
worker takes them again and starts them. A start of a tick whose thread exists already
(the first worker started it, then died before saying so) is refused by the
checkpointer, so the tick starts once. The one gap: a graph that deletes its threads on
success (``delete_on_success``) whose run finished, in a worker that died before it said
so, starts again.
"""

from __future__ import annotations

import abc
import datetime as _dt
import functools
import json
import math
import re
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Literal, cast

from .._cron import CronError, CronExpression, Every, zone
from .._errors import ScheduleError, SnapshotEnvelopeInvalidError
from .._types import JSON
from ._limits import check_depth, dump_json

__all__ = [
    "CATCH_UP_POLICIES",
    "SKIP_GRACE",
    "BaseScheduleStore",
    "CatchUp",
    "Schedule",
    "TickClaim",
    "schedules_of",
    "validate_schedule_name",
]

CatchUp = Literal["skip", "one", "all"]
"""What a schedule starts after downtime (see this module's notes)."""
CATCH_UP_POLICIES: tuple[CatchUp, ...] = ("skip", "one", "all")
"""Every catch-up policy."""
SKIP_GRACE = 60.0
"""Seconds after which a tick counts as missed under ``catch_up="skip"``."""
MAX_CATCH_UP_CAP = 1000
"""The largest ``catch_up_cap``."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_GRAPH = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*")
_MAX_STATE_BYTES = 256 * 1024
_WINDOWS = (3600.0, 86400.0, 32 * 86400.0, 367 * 86400.0, 9 * 367 * 86400.0)


def validate_schedule_name(name: object) -> str:
    """``name`` if it is a schedule name (1-100 letters, digits, ``.``, ``_``, ``-``,
    starting with a letter or digit), else ``ValueError`` (``TypeError`` if not a str)."""
    if not isinstance(name, str):
        raise TypeError(f"a schedule name is a str, got {type(name).__name__}")
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"schedule name {name!r:.120} is not 1-100 letters, digits, '.', '_' or '-' "
            "starting with a letter or digit"
        )
    return name


@functools.lru_cache(maxsize=256)
def _parsed(cron: str) -> CronExpression:
    return CronExpression.parse(cron)


@dataclass(frozen=True, slots=True)
class Schedule:
    """A durable schedule: which graph to start, when, with what state.

    Read it with ``backend.schedules.get(name)`` or ``.list()``; it changes only
    through the store's methods.
    """

    name: str
    """Its unique name."""
    graph: str
    """The graph to start, as ``"package.module:attribute"``."""
    cron: str | None
    """A five-field cron expression (``None`` for an ``every`` schedule)."""
    tz: str
    """The time zone the cron expression is read in (``"UTC"`` unless given)."""
    every: float | None
    """The interval in seconds (``None`` for a cron schedule)."""
    state: JSON
    """The initial state of each thread it starts."""
    catch_up: CatchUp
    """What starts after downtime: ``"skip"``, ``"one"`` or ``"all"``."""
    catch_up_cap: int
    """The most ticks ``"all"`` starts at once."""
    paused: bool
    """A paused schedule starts nothing; resuming it skips the ticks it missed."""
    next_tick: float
    """The next tick not yet claimed, in seconds since the epoch."""
    last_tick: float | None
    """The newest tick claimed (started or dropped), or ``None``."""
    created_at: float
    """When it was created (an ``every`` schedule's ticks count from here)."""
    pending: tuple[tuple[float, float], ...] = ()
    """``(tick, held until)`` of each claimed tick whose thread its worker has not yet
    said it started: past its hold, the next claim takes it again (module notes)."""
    version: int = 0
    """The store's version of the record: every change adds one."""

    def to_json(self) -> dict[str, Any]:
        """Every field but ``version`` as a JSON object (``pending`` as lists): what the
        store keeps and what ``flowy schedules --json`` prints."""
        body = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "version"}
        body["pending"] = [list(pair) for pair in self.pending]
        return body

    def thread_id(self, tick: float) -> str:
        """The id of the thread this schedule starts for ``tick``: the name and the tick
        in UTC, ``"nightly@2026-12-03T02:00:00Z"``."""
        when = _dt.datetime.fromtimestamp(tick, _dt.UTC)
        return f"{self.name}@{when.strftime('%Y-%m-%dT%H:%M:%SZ')}"

    def due_at(self, now: float) -> bool:
        """Whether a claim at ``now`` takes something: a tick is due, or a pending tick's
        hold ran out (a paused schedule takes nothing)."""
        if self.paused:
            return False
        return self.next_tick <= now or any(until <= now for _, until in self.pending)

    def next_after(self, after: float) -> float:
        """The first tick of this schedule strictly after ``after``."""
        if self.every is not None:
            return Every(self.every, self.created_at).next_after(after)
        assert self.cron is not None
        return _parsed(self.cron).next_after(after, zone(self.tz))

    def due(self, now: float) -> tuple[list[float], float | None, float]:
        """``(ticks to start, newest due tick, next tick)`` if ``now`` claims this
        schedule: the due ticks its catch-up policy starts, oldest first, the newest
        due tick (started or not; ``None`` if none is due), and its first tick after
        ``now``."""
        if self.paused or self.next_tick > now:
            return [], None, self.next_tick
        following = self.next_after(now)
        keep = self.catch_up_cap if self.catch_up == "all" else 1
        ticks = self._ticks_until(self._recent_start(now, keep), now, keep)
        newest = ticks[-1] if ticks else None
        if self.catch_up == "skip":
            ticks = [t for t in ticks if now - t <= SKIP_GRACE]
        return ticks, newest, following

    def _recent_start(self, now: float, keep: int) -> float:
        """A time from which the newest ``keep`` due ticks are found in a few steps
        (never earlier than ``next_tick``)."""
        for window in _WINDOWS:
            start = max(self.next_tick, now - window)
            if start == self.next_tick or len(self._ticks_until(start, now, keep)) >= keep:
                return start
        return self.next_tick

    def _ticks_until(self, start: float, now: float, keep: int) -> list[float]:
        """The newest ``keep`` ticks from ``start`` (included) to ``now`` (included)."""
        ticks: list[float] = []
        tick = start if start == self.next_tick else self.next_after(math.nextafter(start, 0))
        while tick <= now:
            ticks.append(tick)
            if len(ticks) > keep:
                del ticks[0]
            tick = self.next_after(tick)
        return ticks


@dataclass(frozen=True, slots=True)
class TickClaim:
    """What a successful claim gives its worker: the schedule as it was claimed (its
    new version) and the ticks to start, each with its thread id."""

    schedule: Schedule
    """The schedule after the claim (its next tick moved past the claimed ones)."""
    ticks: tuple[tuple[float, str], ...]
    """``(tick, thread id)`` of each tick to start, oldest first (none when the
    catch-up policy dropped every due tick)."""


def _encode(schedule: Schedule) -> bytes:
    return dump_json(f"schedule {schedule.name!r}", {"flowy_schedule": 1, **schedule.to_json()})


def _decode(name: str, version: int, data: bytes | str) -> Schedule:
    try:
        body = cast(dict[str, Any], json.loads(data))
        if body.pop("flowy_schedule") != 1 or body["name"] != name:
            raise ValueError("not this schedule's record")
        pending = tuple((float(tick), float(until)) for tick, until in body.pop("pending", ()))
        return Schedule(**body, pending=pending, version=int(version))
    except (ValueError, TypeError, KeyError) as exc:
        raise SnapshotEnvelopeInvalidError(
            f"the stored record of schedule {name!r} is corrupt: {exc}"
        ) from None


class BaseScheduleStore(abc.ABC):
    """A store's schedules over five atomic primitives (``backend.schedules``).

    Subclasses set ``domain`` like their store's checkpointer and implement the
    ``_``-prefixed abstract methods; ``clock`` is the time :meth:`create` and
    :meth:`resume` read (tests inject one).
    """

    domain: Hashable = None
    clock: Callable[[], float]

    @abc.abstractmethod
    async def _insert(self, name: str, data: bytes) -> bool:
        """Atomically store ``data`` as schedule ``name`` at version 1 if there is no
        schedule of that name; ``False`` (nothing written) if there is."""

    @abc.abstractmethod
    async def _read(self, name: str) -> tuple[int, bytes] | None:
        """``(version, data)`` of schedule ``name``, or ``None``."""

    @abc.abstractmethod
    async def _read_all(self) -> list[tuple[str, int, bytes]]:
        """``(name, version, data)`` of every schedule, in any order."""

    @abc.abstractmethod
    async def _replace(self, name: str, version: int, data: bytes) -> bool:
        """Atomically: if schedule ``name`` is at ``version``, store ``data`` as version
        ``version + 1`` and return ``True``; else change nothing and return ``False``."""

    @abc.abstractmethod
    async def _delete(self, name: str) -> bool:
        """Remove schedule ``name``; ``False`` if there was none."""

    async def create(
        self,
        name: str,
        *,
        graph: str,
        cron: str | None = None,
        tz: str = "UTC",
        every: _dt.timedelta | None = None,
        state: Mapping[str, JSON] | None = None,
        catch_up: CatchUp = "skip",
        catch_up_cap: int = 10,
        paused: bool = False,
    ) -> Schedule:
        """Create the schedule ``name``: start ``graph`` at every tick of ``cron`` (read in
        ``tz``) or every ``every``, each thread from ``state``.

        Args:
            name: 1-100 letters, digits, ``.``, ``_``, ``-``.
            graph: ``"package.module:attribute"`` naming a compiled graph; the worker
                imports it when a tick fires.
            cron: five cron fields (see :mod:`flowy.schedules` for what is supported).
            tz: an IANA time zone name for ``cron``.
            every: an interval of whole seconds (1 s to 366 days) instead of ``cron``;
                the first tick is one interval after now.
            state: the JSON initial state of every thread (``{}`` unless given).
            catch_up: after downtime, ``"skip"``, ``"one"`` or ``"all"``.
            catch_up_cap: the most ticks ``"all"`` starts at once (1-1000).
            paused: create it paused.

        Raises:
            ValueError: a bad name, graph, cron expression, time zone, interval, policy
                or cap (``TypeError`` for a value of the wrong type).
            flowy.errors.ScheduleError: a schedule of that name exists.
        """
        schedule = self._build(
            name, graph, cron, tz, every, state, catch_up, catch_up_cap, paused, self.clock()
        )
        if not await self._insert(name, _encode(schedule)):
            raise ScheduleError(
                f"a schedule named {name!r} exists already; delete it first, or pick another name"
            )
        return replace(schedule, version=1)

    @staticmethod
    def _build(
        name: str,
        graph: str,
        cron: str | None,
        tz: str,
        every: _dt.timedelta | None,
        state: Mapping[str, JSON] | None,
        catch_up: str,
        catch_up_cap: int,
        paused: bool,
        now: float,
    ) -> Schedule:
        validate_schedule_name(name)
        if not isinstance(graph, str) or not _GRAPH.fullmatch(graph):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f"graph must be 'package.module:attribute', got {graph!r:.120}")
        if (cron is None) == (every is None):
            raise ValueError("give a schedule either cron=... or every=..., not both or neither")
        seconds: float | None = None
        if every is not None:
            if not isinstance(every, _dt.timedelta):  # pyright: ignore[reportUnnecessaryIsInstance]
                raise TypeError(f"every must be a datetime.timedelta, got {every!r:.80}")
            seconds = every.total_seconds()
            if seconds != int(seconds):
                raise ValueError(f"every must be whole seconds, got {every}")
        try:
            zone(tz)
            if cron is not None:
                CronExpression.parse(cron)
            if seconds is not None:
                Every(seconds, 0.0)
        except CronError as exc:
            raise ValueError(str(exc)) from None
        if catch_up not in CATCH_UP_POLICIES:
            raise ValueError(f"catch_up must be 'skip', 'one' or 'all', got {catch_up!r:.40}")
        if isinstance(catch_up_cap, bool) or not isinstance(catch_up_cap, int):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"catch_up_cap must be an int, got {catch_up_cap!r:.40}")
        if not 1 <= catch_up_cap <= MAX_CATCH_UP_CAP:
            raise ValueError(f"catch_up_cap must be 1-{MAX_CATCH_UP_CAP}, got {catch_up_cap}")
        initial: JSON = {} if state is None else dict(state)
        if not isinstance(state, Mapping | None):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"state must be a JSON object (a dict), got {type(state).__name__}")
        check_depth(f"schedule {name!r} state", initial)
        dump_json(f"schedule {name!r} state", initial, _MAX_STATE_BYTES)
        created = float(math.ceil(now))
        draft = Schedule(
            name,
            graph,
            None if cron is None else cron.strip(),
            tz,
            seconds,
            initial,
            catch_up,
            catch_up_cap,
            bool(paused),
            0.0,
            None,
            created,
        )
        return replace(draft, next_tick=draft.next_after(now))

    async def get(self, name: str) -> Schedule:
        """The schedule ``name``; ``ScheduleError`` if there is none."""
        validate_schedule_name(name)
        found = await self._read(name)
        if found is None:
            raise self._missing(name)
        return _decode(name, *found)

    async def list(self) -> list[Schedule]:
        """Every schedule, by name."""
        return sorted(
            (_decode(name, version, data) for name, version, data in await self._read_all()),
            key=lambda s: s.name,
        )

    async def pause(self, name: str) -> Schedule:
        """Stop starting threads for ``name`` (idempotent); returns the schedule."""
        return await self._change(name, lambda s, now: replace(s, paused=True))

    async def resume(self, name: str) -> Schedule:
        """Start threads for ``name`` again from its next tick after now; the ticks
        missed while it was paused are not caught up (idempotent)."""

        def resumed(schedule: Schedule, now: float) -> Schedule:
            if not schedule.paused:
                return schedule
            return replace(schedule, paused=False, next_tick=schedule.next_after(now))

        return await self._change(name, resumed)

    async def delete(self, name: str) -> None:
        """Remove ``name``; the threads it started stay. ``ScheduleError`` if there is none."""
        validate_schedule_name(name)
        if not await self._delete(name):
            raise self._missing(name)

    async def claim(self, name: str, now: float, *, hold: float = 60.0) -> TickClaim | None:
        """Claim the due ticks of ``name`` at ``now``: ``None`` if none is due (or it is
        paused, deleted, or another worker claimed them first); else the ticks to start,
        by the schedule's catch-up policy, with their thread ids, and the pending ticks
        whose hold ran out (their claimer died). Each stays pending, held for ``hold``
        seconds, until :meth:`started` says its thread started. One read and one
        compare-and-set: of any number of workers claiming at once, one succeeds."""
        validate_schedule_name(name)
        found = await self._read(name)
        if found is None:
            return None
        return await self.claim_from(_decode(name, *found), now, hold=hold)

    async def claim_from(
        self, schedule: Schedule, now: float, *, hold: float = 60.0
    ) -> TickClaim | None:
        """:meth:`claim` for ``schedule`` as already read (by :meth:`list`) at ``now``:
        one compare-and-set, which fails (``None``) if the schedule changed since; the
        ticks it takes stay pending, held for ``hold`` seconds."""
        if not schedule.due_at(now):
            return None
        lapsed = [tick for tick, until in schedule.pending if until <= now]
        held = [(tick, until) for tick, until in schedule.pending if until > now]
        ticks, newest, following = schedule.due(now)
        starts = sorted({*lapsed, *ticks})
        claimed = replace(
            schedule,
            next_tick=following,
            last_tick=schedule.last_tick if newest is None else newest,
            pending=tuple(sorted([*held, *((tick, now + hold) for tick in starts)])),
        )
        if not await self._replace(schedule.name, schedule.version, _encode(claimed)):
            return None
        claimed = replace(claimed, version=schedule.version + 1)
        return TickClaim(claimed, tuple((t, claimed.thread_id(t)) for t in starts))

    async def started(self, name: str, tick: float) -> None:
        """Say that the thread of ``name``'s claimed ``tick`` started (or exists): it is
        no longer pending. Nothing happens if the schedule is gone or the tick is not
        pending."""

        def done(schedule: Schedule, now: float) -> Schedule:
            return replace(schedule, pending=tuple(p for p in schedule.pending if p[0] != tick))

        try:
            await self._change(name, done)
        except ScheduleError:
            return  # deleted meanwhile: nothing is pending any more

    async def _change(self, name: str, change: Callable[[Schedule, float], Schedule]) -> Schedule:
        validate_schedule_name(name)
        while True:
            current = await self.get(name)
            changed = change(current, self.clock())
            if changed == current:
                return current
            if await self._replace(name, current.version, _encode(changed)):
                return replace(changed, version=current.version + 1)

    @staticmethod
    def _missing(name: str) -> ScheduleError:
        return ScheduleError(f"there is no schedule named {name!r}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def schedules_of(backend: object) -> BaseScheduleStore:
    """The schedules of ``backend`` (``backend.schedules``, typed); ``TypeError`` if its
    store keeps none (``backend.capabilities.schedules`` is false)."""
    store: object = getattr(backend, "schedules", None)
    capabilities: Any = getattr(backend, "capabilities", None)
    if not isinstance(store, BaseScheduleStore) or not getattr(capabilities, "schedules", False):
        raise TypeError(
            f"{type(backend).__name__} keeps no schedules (its store has no "
            "backend.schedules); open a store with flowy.connect(url)"
        )
    return store
