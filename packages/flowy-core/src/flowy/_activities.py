"""Durable activities: ``await flowy.activity(fn, *args, key=...)`` inside a node.

Each call is recorded in the thread's journal, in the run's store: ``STARTED`` before
``fn`` is called, then its outcome. A node that runs again (after a crash, or a wait)
gets a recorded result back without calling ``fn``; a call that started but has no
outcome is *unknown*, and is never called again on its own: a ``reconcile`` hook looks
the outcome up, an ``idempotent`` call is simply made again, and otherwise the node
gets ``ActivityOutcomeUnknownError``. A failed attempt with attempts left waits for the next
one as a durable timer (the run saves a waiting snapshot and a worker wakes it).
"""

from __future__ import annotations

import json
import random
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from ._errors import ActivityFailedError, ActivityOutcomeUnknownError, LimitError, NoRunContextError
from ._segment import maybe_await
from .storage import ActivityRecord, ActivityStatus, DurableCheckpointer

__all__ = [
    "ActivityRetry",
    "ActivityScope",
    "RetryLater",
    "activity",
    "current_scope",
    "on_call",
]


@dataclass(frozen=True, slots=True)
class ActivityRetry:
    """How often, and how far apart, an activity that raises is tried again.

    Attempt ``n + 1`` starts ``initial * multiplier ** (n - 1)`` seconds (at most
    ``maximum``, plus up to ``jitter`` of it at random) after attempt ``n`` failed; no
    attempt starts more than ``deadline`` seconds after the first (``None``: no
    deadline). The wait between attempts is a durable timer.
    """

    attempts: int = 3
    """Attempts in all (1: no retry)."""
    initial: float = 1.0
    """Seconds before the second attempt."""
    multiplier: float = 2.0
    """Each further wait is this many times the one before."""
    maximum: float = 300.0
    """The longest wait, in seconds."""
    jitter: float = 0.25
    """The fraction (0 to 1) of each wait added at random."""
    deadline: float | None = None
    """Seconds after the first attempt when no further attempt starts."""

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"ActivityRetry needs attempts >= 1, got {self.attempts!r}")
        if not (0 <= self.initial <= self.maximum and self.multiplier >= 1):
            raise ValueError("ActivityRetry needs 0 <= initial <= maximum and multiplier >= 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"ActivityRetry needs 0 <= jitter <= 1, got {self.jitter!r}")
        if self.deadline is not None and not self.deadline > 0:
            raise ValueError(f"ActivityRetry needs deadline > 0 or None, got {self.deadline!r}")

    def delay(self, failed_attempts: int) -> float:
        """Seconds before the next attempt after ``failed_attempts`` failures."""
        base = min(self.maximum, self.initial * self.multiplier ** max(failed_attempts - 1, 0))
        return base * (1 + self.jitter * random.random())


_NO_RETRY = ActivityRetry(attempts=1)


class RetryLater(BaseException):
    """Raised out of a node by ``activity()`` when a failed call is to be tried again at
    ``at``: the run saves a waiting snapshot there. A ``BaseException``, so a node's
    ``except Exception`` does not swallow it."""

    def __init__(self, at: float, key: str) -> None:
        super().__init__(f"activity {key!r} is tried again at {at:.3f}")
        self.at = at
        self.key = key


class ActivityScope:
    """What ``activity()`` needs from the run it is called in: the journal, the thread,
    the clock, and where the run stands (to key calls made without a ``key``)."""

    def __init__(
        self,
        journal: Callable[[], DurableCheckpointer[Any]],
        thread_id: str,
        clock: Callable[[], float],
        position: Callable[[], tuple[int, str]],
    ) -> None:
        self._journal = journal
        self.thread_id = thread_id
        self.clock = clock
        self._position = position
        self._calls: dict[str, int] = {}
        self._at: tuple[int, str] | None = None

    def journal(self) -> DurableCheckpointer[Any]:
        """The store's journal (``TypeError`` if the store keeps none)."""
        return self._journal()

    def default_key(self, name: str) -> str:
        """``<step>:<node>:<name>#<n>``: the ``n``-th call of ``name`` in this step, the
        same on every re-execution of the step."""
        at = self._position()
        if at != self._at:
            self._at, self._calls = at, {}
        n = self._calls[name] = self._calls.get(name, 0) + 1
        return f"{at[0]}:{at[1]}:{name}#{n}"


current_scope: ContextVar[ActivityScope | None] = ContextVar("flowy_activity", default=None)

on_call: ContextVar[Callable[[str, str, bool], None] | None] = ContextVar(
    "flowy_activity_calls", default=None
)
"""Told ``(thread_id, key, idempotent)`` just before each call of an activity's function
(``flowy.testing.check`` counts calls with it)."""


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _as_json(value: object, key: str) -> Any:
    """``value`` as it loads back from the journal (tuples become lists, …)."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError, RecursionError) as exc:
        raise TypeError(
            f"activity {key!r:.200} returned {type(value).__name__}, which the journal "
            f"cannot keep: return a JSON value (dict, list, str, number, bool, None): {exc}"
        ) from exc


async def activity(
    fn: Callable[..., Awaitable[Any] | Any],
    *args: Any,
    key: str | None = None,
    reconcile: Callable[..., Any] | None = None,
    idempotent: bool = False,
    retry: ActivityRetry | None = None,
    **kwargs: Any,
) -> Any:
    """Call ``fn(*args, **kwargs)`` once per thread, durably: inside a node, instead of
    calling the outside world directly.

    ``args`` and ``kwargs`` are passed to ``fn`` (and to ``reconcile``). Options
    (keyword-only; ``fn`` cannot take arguments with these names):

    - ``key``: the call's name in the thread's journal (default:
      ``<step>:<node>:<function>#<n>``, stable across re-executions of the step). Give
      one that names the business operation (``"charge:order-42"``) when a call must
      happen once per thread whatever path the run takes.
    - ``reconcile``: ``reconcile(*args, **kwargs)`` (sync or async) is called when an
      earlier attempt's outcome is unknown (a crash between the call and its record):
      it returns the result if the call took effect, or ``None`` if it did not (then
      ``fn`` is called again).
    - ``idempotent``: ``True`` if calling ``fn`` twice is harmless: an unknown outcome
      then simply calls it again.
    - ``retry``: an :class:`ActivityRetry` (default: one attempt).

    Returns the result as the journal keeps it (a JSON value: a tuple comes back as a
    list, the first time too). Raises ``ActivityOutcomeUnknownError`` (an unknown outcome
    without ``reconcile`` or ``idempotent``), ``ActivityFailedError`` (the last attempt
    raised), ``NoRunContextError`` outside a node, ``TypeError`` when the store keeps no
    journal or the result is not JSON.
    """
    retry = retry or _NO_RETRY
    scope = current_scope.get()
    if scope is None:
        raise NoRunContextError(
            "flowy.activity() records calls in a thread's journal: call it from a node "
            "run by a Runner"
        )
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    key = scope.default_key(name) if key is None else key
    journal = scope.journal()
    thread_id = scope.thread_id
    now = scope.clock()
    record = await journal.get_activity(thread_id, key)
    attempt, started_at = 1, now
    if record is not None:
        status = record.status
        if status is ActivityStatus.SUCCEEDED:
            return record.result
        if status is ActivityStatus.FAILED:
            raise ActivityFailedError(
                f"activity {key!r:.200} failed after {record.attempts} attempt(s): {record.error}",
                key=key,
                attempts=record.attempts,
                error=record.error,
            )
        started_at = record.started_at
        if status is ActivityStatus.RETRYING:
            if record.retry_at is not None and record.retry_at > now:
                raise RetryLater(record.retry_at, key)  # woken early: wait again
            attempt = record.attempts + 1
        else:  # STARTED: called, outcome never recorded
            if reconcile is not None:
                found = await maybe_await(reconcile(*args, **kwargs))
                if found is not None:
                    value = _as_json(found, key)
                    await journal.put_activity(
                        thread_id,
                        _entry(record, ActivityStatus.SUCCEEDED, now, result=value),
                    )
                    return value
                attempt = record.attempts + 1
            elif idempotent:
                attempt = record.attempts + 1
            else:
                raise ActivityOutcomeUnknownError(
                    f"activity {key!r:.200} started at {record.started_at:.3f} "
                    f"(attempt {record.attempts}) and its outcome was never recorded; "
                    "it may have happened. Give reconcile= to look it up, or "
                    "idempotent=True if calling it again is harmless",
                    key=key,
                    attempts=record.attempts,
                    started_at=record.started_at,
                )
    deadline = None if retry.deadline is None else started_at + retry.deadline
    if record is not None and deadline is not None and now > deadline:
        # A timer fired late (no worker looked in time): the deadline holds when an
        # attempt would start, not only when the retry was scheduled.
        await journal.put_activity(
            thread_id, _entry(record, ActivityStatus.FAILED, now, error=record.error)
        )
        raise ActivityFailedError(
            f"activity {key!r:.200} failed after {record.attempts} attempt(s): its retry "
            f"deadline ({retry.deadline} s after the first attempt) passed before attempt "
            f"{attempt} could start; the last error: {record.error or 'unknown'}",
            key=key,
            attempts=record.attempts,
            error=record.error,
        )
    started = ActivityRecord(
        key=key,
        status=ActivityStatus.STARTED,
        name=name,
        attempts=attempt,
        started_at=started_at,
        updated_at=now,
    )
    await journal.put_activity(thread_id, started)
    if (observe := on_call.get()) is not None:
        observe(thread_id, key, idempotent)
    try:
        result = await maybe_await(fn(*args, **kwargs))
    except Exception as exc:
        later = scope.clock()
        error = _describe(exc)
        retry_at = later + retry.delay(attempt)
        if attempt < retry.attempts and (deadline is None or retry_at <= deadline):
            await journal.put_activity(
                thread_id,
                _entry(started, ActivityStatus.RETRYING, later, error=error, retry_at=retry_at),
            )
            raise RetryLater(retry_at, key) from exc
        await journal.put_activity(
            thread_id, _entry(started, ActivityStatus.FAILED, later, error=error)
        )
        raise ActivityFailedError(
            f"activity {key!r:.200} failed after {attempt} attempt(s): {error}",
            key=key,
            attempts=attempt,
            error=error,
        ) from exc
    try:
        value = _as_json(result, key)
        await journal.put_activity(
            thread_id, _entry(started, ActivityStatus.SUCCEEDED, scope.clock(), result=value)
        )
    except (TypeError, LimitError) as exc:  # not JSON, or past a limit: it cannot be kept
        await journal.put_activity(
            thread_id, _entry(started, ActivityStatus.FAILED, scope.clock(), error=str(exc))
        )
        raise
    return value


def _entry(
    base: ActivityRecord,
    status: ActivityStatus,
    now: float,
    *,
    result: Any = None,
    error: str = "",
    retry_at: float | None = None,
) -> ActivityRecord:
    return ActivityRecord(
        key=base.key,
        status=status,
        name=base.name,
        attempts=base.attempts,
        result=result,
        error=error,
        started_at=base.started_at,
        updated_at=now,
        retry_at=retry_at,
    )
