"""Stopping a thread from outside the process that runs it: cancel and terminate.

Both are one conditional write of a new head, so they work the same on every store and
need nothing of a store beyond its save, its head read and its lease read:

- **cancel** writes a ``canceled`` head at the next revision, fenced by the thread's live
  lease when a worker holds one. Its timers go with the old head (a store indexes the
  head's ``wake_at``), its signals stay in the inbox, and a queued hand-off's message
  finds a head it no longer names, which a worker acknowledges without running it. A
  worker in the middle of the run keeps its lease, but its next save expects the old
  revision: the store refuses it, and the runner, finding a canceled head, ends with a
  ``canceled`` result. No read is added to a step.
- **terminate** writes a ``failed`` head the same way, then releases the holder's lease:
  its next save and its next renewal are refused, so a run stuck in a node that never
  returns is interrupted by its lease renewal.

A save of the running worker and the cancel race on the revision: exactly one of them
writes it, and the history shows which came first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ._errors import (
    ConcurrencyConflictError,
    LeaseLostError,
    ThreadFinishedError,
    ThreadLeaseBusyError,
)
from ._results import Reason
from .storage import (
    Checkpointer,
    HandoffStatus,
    Lease,
    LeaseManager,
    RunStatus,
    Snapshot,
)
from .storage.dialect import confirmed_save, new_write_id, validate_thread_id

__all__ = [
    "MAX_STOP_REASON",
    "StopOutcome",
    "cancel_thread",
    "is_canceled_from_outside",
    "is_terminated",
    "stop_reason",
    "terminate_thread",
]

MAX_STOP_REASON = 500
"""The longest reason text a cancel or terminate takes (characters)."""

_ATTEMPTS = 50
"""How many times a cancel reloads the head after losing the race to a save."""


def stop_reason(kind: Reason, reason: str | None) -> str:
    """The stored reason of a cancel or terminate: ``kind``, or ``kind: reason``."""
    if reason is None:
        return kind.value
    if not isinstance(reason, str):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise TypeError(f"reason must be a str, got {type(reason).__name__}")
    text = " ".join(reason.split())
    if len(text) > MAX_STOP_REASON:
        raise ValueError(
            f"the reason is {len(text)} characters; a {kind.value} reason takes at most "
            f"{MAX_STOP_REASON}"
        )
    return f"{kind.value}: {text}" if text else kind.value


def _is(reason: str, kind: Reason) -> bool:
    return reason == kind.value or reason.startswith(f"{kind.value}: ")


def is_canceled_from_outside(status: RunStatus | None, reason: str) -> bool:
    """True for a head written by a cancel (not by ``request_stop``, whose run a worker
    continues)."""
    return status is RunStatus.CANCELED and _is(reason, Reason.CANCELED)


def is_terminated(status: RunStatus | None, reason: str) -> bool:
    """True for a head written by a terminate."""
    return status is RunStatus.FAILED and _is(reason, Reason.TERMINATED)


@dataclass(frozen=True, slots=True)
class StopOutcome:
    """What a cancel or terminate did."""

    thread_id: str
    """The thread."""
    status: RunStatus
    """Its status now: ``canceled`` or ``failed``."""
    reason: str
    """Its reason now (``canceled…`` or ``terminated…``)."""
    revision: int
    """Its head revision now."""
    previous_status: RunStatus
    """Its status before (the same as ``status`` when nothing changed)."""
    changed: bool
    """False when it was canceled (terminated) already: nothing was written."""
    fenced: Lease | None = None
    """The live lease of the run that held the thread, if one did: cancel fenced its
    write with it; terminate took it away."""


def _stopped(snapshot: Snapshot[Any], status: RunStatus, reason: str, now: float) -> Snapshot[Any]:
    return replace(
        snapshot,
        status=status,
        reason=reason,
        revision=0,
        handoff_status=HandoffStatus.NONE,
        handoff_pending_at=None,
        updated_at=now,
        write_id=new_write_id(),
        wake_at=None,
        waiting_for="",
        on_timeout="",
    )


async def _stop(
    checkpointer: Checkpointer[Any],
    leases: LeaseManager | None,
    thread_id: str,
    kind: Reason,
    reason: str | None,
    clock: Callable[[], float],
) -> StopOutcome:
    validate_thread_id(thread_id)
    stored_reason = stop_reason(kind, reason)
    terminate = kind is Reason.TERMINATED
    status = RunStatus.FAILED if terminate else RunStatus.CANCELED
    pause = 0.005
    for _ in range(_ATTEMPTS):
        snapshot, revision = await checkpointer.load(thread_id)
        done = (is_terminated if terminate else is_canceled_from_outside)(
            snapshot.status, snapshot.reason
        )
        holder = await leases.holder(thread_id) if leases is not None else None
        if done:
            if terminate and holder is not None:
                await _take_away(leases, holder)
            return StopOutcome(
                thread_id, snapshot.status, snapshot.reason, revision, snapshot.status, False
            )
        if snapshot.status in (RunStatus.COMPLETED, RunStatus.FAILED):
            raise ThreadFinishedError(
                f"thread {thread_id!r:.200} is {snapshot.status.value} ({snapshot.reason!r:.200})"
                f"; there is no run to {'terminate' if terminate else 'cancel'}. Fork it to "
                "run it again"
            )
        stopped = _stopped(snapshot, status, stored_reason, clock())
        try:
            new_revision = await confirmed_save(checkpointer, revision, stopped, lease=holder)
        except (ConcurrencyConflictError, ThreadLeaseBusyError, LeaseLostError):
            # A save of the running worker (or a lease change) got there first: look again.
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.2)
            continue
        if terminate and holder is not None:
            await _take_away(leases, holder)
        return StopOutcome(
            thread_id, status, stored_reason, new_revision, snapshot.status, True, holder
        )
    raise ConcurrencyConflictError(
        f"thread {thread_id!r:.200} moved on at every one of {_ATTEMPTS} attempts to "
        f"{'terminate' if terminate else 'cancel'} it; try again",
        thread_id=thread_id,
    )


async def _take_away(leases: LeaseManager | None, holder: Lease) -> None:
    """Release ``holder``'s lease for it: its renewals and saves are refused from now on."""
    assert leases is not None
    try:
        await leases.release(holder)
    except LeaseLostError:
        pass  # it ended (or lost the lease) on its own meanwhile


async def cancel_thread(
    checkpointer: Checkpointer[Any],
    leases: LeaseManager | None,
    thread_id: str,
    reason: str | None = None,
    *,
    clock: Callable[[], float],
) -> StopOutcome:
    """Cancel ``thread_id`` (see the module's docstring)."""
    return await _stop(checkpointer, leases, thread_id, Reason.CANCELED, reason, clock)


async def terminate_thread(
    checkpointer: Checkpointer[Any],
    leases: LeaseManager | None,
    thread_id: str,
    reason: str | None = None,
    *,
    clock: Callable[[], float],
) -> StopOutcome:
    """Terminate ``thread_id`` (see the module's docstring)."""
    return await _stop(checkpointer, leases, thread_id, Reason.TERMINATED, reason, clock)
