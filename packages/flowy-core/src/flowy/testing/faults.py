"""Fault injection for tests: wrappers that fail (or crash) at a chosen phase.

``FaultyCheckpointer`` and ``FaultyOutbox`` delegate to a real backend and raise at the
operations a test arms. ``after_write=True`` performs the write first and then raises,
which is what a lost connection after commit looks like to the caller (an ambiguous
outcome). Phases of the hand-off FSM are picked by the snapshot they save:
``Phase.SAVE_PENDING`` / ``PATCH_ENQUEUED`` / ``PATCH_ORPHANED`` / ``COMMIT``
(transactional save) and ``Phase.ENQUEUE`` on the outbox.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic

from .._errors import StorageUnavailableError
from .._types import S
from ..storage import (
    Checkpointer,
    HandoffIntent,
    HandoffStatus,
    Lease,
    LeaseManager,
    Outbox,
    RunStatus,
    Snapshot,
    StateCodec,
    ThreadSummary,
    TransactionalCheckpointer,
    TransactionalOutbox,
)
from ..storage.dialect import EnqueueCallback

__all__ = ["Fault", "FaultyCheckpointer", "FaultyOutbox", "Phase", "phase_of"]


class Phase(enum.StrEnum):
    """Where a fault strikes."""

    SAVE_STEP = "save_step"
    SAVE_SUSPEND = "save_suspend"
    SAVE_PENDING = "save_pending"
    PATCH_ENQUEUED = "patch_enqueued"
    PATCH_ORPHANED = "patch_orphaned"
    SAVE_TERMINAL = "save_terminal"
    SAVE_CANCEL = "save_cancel"
    COMMIT = "commit"
    ENQUEUE = "enqueue"
    PRUNE = "prune"
    LOAD = "load"


def phase_of(snapshot: Snapshot[Any], transactional: bool = False) -> Phase:
    """The phase a save of ``snapshot`` belongs to."""
    if transactional:
        return Phase.COMMIT
    if snapshot.status is RunStatus.HANDOFF:
        return {
            HandoffStatus.PENDING: Phase.SAVE_PENDING,
            HandoffStatus.ENQUEUED: Phase.PATCH_ENQUEUED,
            HandoffStatus.ORPHANED: Phase.PATCH_ORPHANED,
        }.get(snapshot.handoff_status, Phase.SAVE_SUSPEND)
    if snapshot.status is RunStatus.SUSPENDED:
        return Phase.SAVE_SUSPEND
    if snapshot.status is RunStatus.CANCELED:
        return Phase.SAVE_CANCEL
    if snapshot.status in (RunStatus.COMPLETED, RunStatus.FAILED):
        return Phase.SAVE_TERMINAL
    return Phase.SAVE_STEP


@dataclass
class Fault:
    """One armed fault: strike at ``phase`` ``times`` times; ``after_write`` makes the
    write land before the error (ambiguous outcome)."""

    phase: Phase
    times: int = 1
    after_write: bool = False
    error: Callable[[], BaseException] = lambda: StorageUnavailableError(
        "injected fault: connection lost"
    )


class _Faults:
    """The faults armed on one wrapper and the phases they have struck so far."""

    def __init__(self) -> None:
        self.armed: list[Fault] = []
        self.struck: list[Phase] = []

    def take(self, phase: Phase) -> Fault | None:
        """Use up one strike of the first fault armed for ``phase``; None if there is none."""
        for fault in self.armed:
            if fault.phase is phase and fault.times > 0:
                fault.times -= 1
                self.struck.append(phase)
                return fault
        return None


class FaultyCheckpointer(Generic[S]):
    """A checkpointer wrapper that raises at armed phases (see module doc)."""

    def __init__(self, inner: Checkpointer[S]) -> None:
        self.inner = inner
        self.faults: _Faults = _Faults()

    def arm(
        self,
        phase: Phase,
        *,
        times: int = 1,
        after_write: bool = False,
        error: Callable[[], BaseException] | None = None,
    ) -> None:
        """Make the next ``times`` operations of ``phase`` fail."""
        fault = Fault(phase, times, after_write)
        if error is not None:
            fault.error = error
        self.faults.armed.append(fault)

    @property
    def struck(self) -> list[Phase]:
        """Phases where a fault was raised, in order."""
        return self.faults.struck

    @property
    def transactional(self) -> bool:
        """True if the wrapped checkpointer is transactional."""
        return isinstance(self.inner, TransactionalCheckpointer)

    @property
    def codec(self) -> StateCodec[S] | None:
        """The wrapped checkpointer's codec."""
        return self.inner.codec

    @property
    def domain(self) -> object:
        """The wrapped checkpointer's store (the runner's one-run-per-thread key)."""
        return getattr(self.inner, "domain", None)

    def with_codec(self, codec: StateCodec[Any]) -> FaultyCheckpointer[Any]:
        """The same faults over a view of the wrapped checkpointer using ``codec``."""
        with_codec = getattr(self.inner, "with_codec", None)
        if with_codec is None:
            raise TypeError(f"{type(self.inner).__name__} has no with_codec")
        view: FaultyCheckpointer[Any] = FaultyCheckpointer(with_codec(codec))
        view.faults = self.faults
        return view

    def fences(self, leases: LeaseManager) -> bool:
        """Whether the wrapped checkpointer fences ``leases``."""
        fences = getattr(self.inner, "fences", None)
        return bool(fences(leases)) if callable(fences) else False

    async def save(
        self, expected_revision: int, snapshot: Snapshot[S], *, lease: Lease | None = None
    ) -> int:
        """``save`` of the wrapped checkpointer, failing at armed phases."""
        fault = self.faults.take(phase_of(snapshot))
        if fault is not None and not fault.after_write:
            raise fault.error()
        revision = await self.inner.save(expected_revision, snapshot, lease=lease)
        if fault is not None:
            raise fault.error()
        return revision

    async def save_with_outbox(
        self,
        expected_revision: int,
        snapshot: Snapshot[S],
        enqueue: EnqueueCallback,
        *,
        lease: Lease | None = None,
    ) -> int:
        """``save_with_outbox`` of the wrapped checkpointer, failing at ``COMMIT``."""
        inner = self.inner
        if not isinstance(inner, TransactionalCheckpointer):
            raise TypeError("the wrapped checkpointer is not transactional")
        fault = self.faults.take(Phase.COMMIT)
        if fault is not None and not fault.after_write:
            raise fault.error()
        tx: TransactionalCheckpointer[Any] = inner
        revision = await tx.save_with_outbox(expected_revision, snapshot, enqueue, lease=lease)
        if fault is not None:
            raise fault.error()
        return revision

    async def load(self, thread_id: str) -> tuple[Snapshot[S], int]:
        """``load`` of the wrapped checkpointer, failing at ``LOAD``."""
        fault = self.faults.take(Phase.LOAD)
        if fault is not None:
            raise fault.error()
        return await self.inner.load(thread_id)

    async def get_history(self, thread_id: str, limit: int = 100) -> list[Snapshot[S]]:
        """``get_history`` of the wrapped checkpointer."""
        return await self.inner.get_history(thread_id, limit)

    async def prune(self, thread_id: str, retain: int) -> None:
        """``prune`` of the wrapped checkpointer, failing at ``PRUNE``."""
        fault = self.faults.take(Phase.PRUNE)
        if fault is not None:
            raise fault.error()
        await self.inner.prune(thread_id, retain)

    async def delete(self, thread_id: str) -> None:
        """``delete`` of the wrapped checkpointer."""
        await self.inner.delete(thread_id)

    async def delete_if_idle(self, thread_id: str) -> None:
        """``delete_if_idle`` of the wrapped checkpointer."""
        await self.inner.delete_if_idle(thread_id)

    async def list_threads(
        self,
        *,
        handoff_statuses: frozenset[HandoffStatus] | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> list[ThreadSummary]:
        """``list_threads`` of the wrapped checkpointer."""
        return await self.inner.list_threads(
            handoff_statuses=handoff_statuses, limit=limit, after=after
        )


class FaultyOutbox:
    """An outbox wrapper whose ``enqueue_intent`` fails when armed."""

    def __init__(self, inner: Outbox) -> None:
        self.inner = inner
        self.faults: _Faults = _Faults()

    def arm(
        self,
        *,
        times: int = 1,
        after_write: bool = False,
        error: Callable[[], BaseException] | None = None,
    ) -> None:
        """Make the next ``times`` enqueues fail."""
        fault = Fault(Phase.ENQUEUE, times, after_write)
        if error is not None:
            fault.error = error
        self.faults.armed.append(fault)

    @property
    def transactional(self) -> bool:
        """True if the wrapped outbox is transactional."""
        return isinstance(self.inner, TransactionalOutbox)

    async def enqueue_intent(self, intent: HandoffIntent) -> None:
        """``enqueue_intent`` of the wrapped outbox, failing at ``ENQUEUE``."""
        fault = self.faults.take(Phase.ENQUEUE)
        if fault is not None and not fault.after_write:
            raise fault.error()
        await self.inner.enqueue_intent(intent)
        if fault is not None:
            raise fault.error()

    async def enqueue_intent_tx(self, tx: object, intent: HandoffIntent) -> None:
        """``enqueue_intent_tx`` of the wrapped outbox, failing at ``ENQUEUE``."""
        inner = self.inner
        if not isinstance(inner, TransactionalOutbox):
            raise TypeError("the wrapped outbox is not transactional")
        fault = self.faults.take(Phase.ENQUEUE)
        if fault is not None:
            raise fault.error()
        await inner.enqueue_intent_tx(tx, intent)
