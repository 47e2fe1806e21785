"""What a check verifies once a run settled: the thread's ending, its history, its
hand-offs, activities, effects and invariants, and the scenario's post-conditions.
Each check returns the problems it found, in words (none: it holds)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from typing import Any

from ..._results import RunResult
from ..._types import RunStatus
from ...storage import ActivityStatus, Backend, DurableCheckpointer, Snapshot
from ._process import node_words
from ._report import Scenario

__all__ = [
    "activities",
    "chain",
    "effects",
    "ending",
    "expectations",
    "handoffs",
    "holds",
    "invariants",
    "saved_end",
]


def saved_end(result: RunResult[Any, Any]) -> bool:
    """True if ``result`` is the saved end of a segment (completed, or parked)."""
    return result.status is RunStatus.COMPLETED or result.resume_token is not None


def _key(effect: object) -> str:
    try:
        return json.dumps(effect, sort_keys=True, default=repr)
    except (TypeError, ValueError):
        return repr(effect)


def holds(check: Callable[[Any], object], state: Any) -> str | None:
    """None if ``check(state)`` holds, else why not."""
    try:
        verdict = check(state)
    except AssertionError as exc:
        return str(exc) or "assertion failed"
    except Exception as exc:  # noqa: BLE001 - a check that raises has failed
        return f"{type(exc).__name__}: {exc}"
    return "returned False" if verdict is False else None


def ending(head: Snapshot[Any], scenario: Scenario[Any], sent: Collection[str]) -> list[str]:
    """The thread ended terminal, or parked for an answer the scenario does not give."""
    status = head.status
    if status in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELED):
        return []
    if status is RunStatus.SUSPENDED and (
        scenario.approve is None or scenario.approve(head) is None
    ):
        return []
    if status is RunStatus.WAITING and f"{head.waiting_for}@{head.revision}" in sent:
        return [f"the thread never woke for the {head.waiting_for!r} signal it was sent"]
    if status is RunStatus.WAITING and head.wake_at is None:
        return []
    words = node_words(head.status, head.execution_pointer)
    return [f"the thread ended {words} ({head.reason or 'no reason'})"]


def chain(history: Sequence[Snapshot[Any]], revision: int) -> list[str]:
    """The history is one chain of consecutive revisions, ending at the head."""
    revisions = [s.revision for s in history]
    if not revisions:
        return ["the thread has no history"]
    if revisions != list(range(revisions[0], revisions[0] + len(revisions))):
        return [f"the history is not one chain: revisions {revisions}"]
    if revisions[-1] != revision:
        return [f"the history ends at revision {revisions[-1]}, the head is {revision}"]
    return []


async def handoffs(
    head: Snapshot[Any],
    base: Backend[Any],
    thread_id: str,
    results: Sequence[RunResult[Any, Any]],
) -> list[str]:
    """No hand-off was lost (a hand-off head, a dead letter) or resumed twice."""
    problems: list[str] = []
    if head.status is RunStatus.HANDOFF:
        problems.append(f"a hand-off was lost: the thread ended {head.handoff_status.value}")
    for dead in await base.consumer.dead_letters(limit=1000):
        if dead.intent is not None and dead.intent.thread_id == thread_id:
            problems.append(f"a hand-off was dead-lettered: {dead.error[:200]}")
    ended: dict[int, int] = {}  # segment -> the revision its saved end is at
    for result in results:
        if not saved_end(result):
            continue
        if result.segment in ended and ended[result.segment] != result.revision:
            problems.append(
                f"a hand-off was resumed twice: two runs of segment {result.segment} "
                f"saved their ends, at revisions {ended[result.segment]} and "
                f"{result.revision}"
            )
        ended.setdefault(result.segment, result.revision)
    return problems


async def activities(
    head: Snapshot[Any],
    base: Backend[Any],
    thread_id: str,
    calls: Counter[str],
    idempotent: Collection[str],
    exactly_once: Collection[str],
) -> list[str]:
    """Every activity was called at most once (idempotent ones may be called again),
    exactly once for ``exactly_once``, and none is left open in the journal."""
    problems: list[str] = []
    for key, n in sorted(calls.items()):
        if n > 1 and key not in idempotent:
            problems.append(f"activity {key!r} was called {n} times")
    for key in sorted(exactly_once):
        if calls[key] != 1 and head.status is RunStatus.COMPLETED:
            problems.append(f"activity {key!r} was called {calls[key]} times, not exactly once")
    cp = base.checkpointer
    if isinstance(cp, DurableCheckpointer) and head.status is RunStatus.COMPLETED:
        for record in await cp.journal(thread_id):
            if record.status in (ActivityStatus.STARTED, ActivityStatus.RETRYING):
                problems.append(
                    f"activity {record.key!r} is still {record.status.value} in the "
                    "journal of a completed thread"
                )
    return problems


def effects(history: Sequence[Snapshot[Any]], results: Sequence[RunResult[Any, Any]]) -> list[str]:
    """No effect was delivered more often than it was saved."""
    saved: Counter[str] = Counter()
    last: dict[int, Snapshot[Any]] = {}
    for snap in history:
        last[snap.segment] = snap
    for snap in last.values():
        saved.update(_key(e) for e in snap.effects)
    delivered: Counter[str] = Counter()
    for result in results:
        if saved_end(result):
            delivered.update(_key(e) for e in result.effects)
    return [
        f"effect {e[:200]} was delivered {n} times, saved {saved[e]}"
        for e, n in sorted(delivered.items())
        if n > saved[e]
    ]


def invariants(
    history: Sequence[Snapshot[Any]], checks: Sequence[Callable[[Any], object]]
) -> list[str]:
    """Every invariant holds over every saved state (the first that broke)."""
    for snap in history:
        for check in checks:
            problem = holds(check, snap.state)
            if problem is not None:
                name = getattr(check, "name", None) or getattr(check, "__name__", "invariant")
                return [f"invariant {name} broke at revision {snap.revision}: {problem}"]
    return []


def expectations(scenario: Scenario[Any], state: Any) -> list[str]:
    """The scenario's post-conditions over the final state."""
    problems: list[str] = []
    for expect in scenario.expect:
        problem = holds(expect, state)
        if problem is not None:
            problems.append(
                f"post-condition {getattr(expect, '__name__', 'expect')} failed: {problem}"
            )
    return problems
