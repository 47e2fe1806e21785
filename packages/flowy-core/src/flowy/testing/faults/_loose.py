"""Fault injection into one loose component (not part of a ``Backend``), at its public
methods: ``FaultyCheckpointer`` and ``FaultyOutbox``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Generic

from ..._errors import StorageUnavailableError
from ..._types import S
from ...storage import (
    Checkpointer,
    HandoffIntent,
    HandoffStatus,
    Lease,
    LeaseManager,
    Outbox,
    Snapshot,
    StateCodec,
    ThreadSummary,
    TransactionalCheckpointer,
    TransactionalOutbox,
)
from ...storage._recent import RecentCursor, recent_threads
from ...storage.dialect import EnqueueCallback
from ._model import ArmedFaults, Fault, FaultKind, Phase, phase_of

__all__ = ["FaultyCheckpointer", "FaultyOutbox"]


def _armed(
    phase: Phase, times: int, after_write: bool, error: Callable[[], BaseException] | None
) -> Fault:
    kind = FaultKind.UNKNOWN if after_write else FaultKind.UNAVAILABLE
    if error is None:
        return Fault(kind=kind, phase=phase, times=times, error=_connection_lost)
    return Fault(kind=kind, phase=phase, times=times, error=error)


def _connection_lost() -> BaseException:
    return StorageUnavailableError("injected fault: connection lost")


class FaultyCheckpointer(Generic[S]):
    """A loose checkpointer that raises at armed phases, at its public methods
    (a store's: use :class:`FaultyBackend`)."""

    def __init__(self, inner: Checkpointer[S]) -> None:
        self.inner = inner
        self.faults: ArmedFaults = ArmedFaults()

    def arm(
        self,
        phase: Phase,
        *,
        times: int = 1,
        after_write: bool = False,
        error: Callable[[], BaseException] | None = None,
    ) -> None:
        """Make the next ``times`` operations of ``phase`` fail; ``after_write``: the
        write lands first (an unknown outcome)."""
        self.faults.arm(_armed(phase, times, after_write, error))

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

    async def _around(self, phase: Phase, write: Callable[[], Awaitable[Any]]) -> Any:
        fault = self.faults.take(phase)
        if fault is not None and fault.kind is not FaultKind.UNKNOWN:
            raise fault.raise_error()
        result = await write()
        if fault is not None:
            raise fault.raise_error()
        return result

    async def save(
        self, expected_revision: int, snapshot: Snapshot[S], *, lease: Lease | None = None
    ) -> int:
        """``save`` of the wrapped checkpointer, failing at armed phases."""
        return await self._around(
            phase_of(snapshot), lambda: self.inner.save(expected_revision, snapshot, lease=lease)
        )

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
        tx: TransactionalCheckpointer[Any] = inner
        return await self._around(
            Phase.COMMIT,
            lambda: tx.save_with_outbox(expected_revision, snapshot, enqueue, lease=lease),
        )

    async def load(self, thread_id: str) -> tuple[Snapshot[S], int]:
        """``load`` of the wrapped checkpointer, failing at ``LOAD``."""
        fault = self.faults.take(Phase.LOAD)
        if fault is not None:
            raise fault.raise_error()
        return await self.inner.load(thread_id)

    async def get_history(self, thread_id: str, limit: int = 100) -> list[Snapshot[S]]:
        """``get_history`` of the wrapped checkpointer."""
        return await self.inner.get_history(thread_id, limit)

    async def prune(self, thread_id: str, retain: int) -> None:
        """``prune`` of the wrapped checkpointer, failing at ``PRUNE``."""
        fault = self.faults.take(Phase.PRUNE)
        if fault is not None:
            raise fault.raise_error()
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

    async def recent_threads(
        self, *, limit: int = 100, before: RecentCursor | None = None
    ) -> list[ThreadSummary]:
        """``recent_threads`` of the wrapped checkpointer (a scan of its
        ``list_threads`` if it has none)."""
        return await recent_threads(self.inner, limit=limit, before=before)


class FaultyOutbox:
    """A loose outbox whose ``enqueue_intent`` fails when armed (a store's: use
    :class:`FaultyBackend`)."""

    def __init__(self, inner: Outbox) -> None:
        self.inner = inner
        self.faults: ArmedFaults = ArmedFaults()

    def arm(
        self,
        *,
        times: int = 1,
        after_write: bool = False,
        error: Callable[[], BaseException] | None = None,
    ) -> None:
        """Make the next ``times`` enqueues fail; ``after_write``: the message is
        enqueued first (an unknown outcome)."""
        self.faults.arm(_armed(Phase.ENQUEUE, times, after_write, error))

    @property
    def transactional(self) -> bool:
        """True if the wrapped outbox is transactional."""
        return isinstance(self.inner, TransactionalOutbox)

    async def enqueue_intent(self, intent: HandoffIntent) -> None:
        """``enqueue_intent`` of the wrapped outbox, failing at ``ENQUEUE``."""
        fault = self.faults.take(Phase.ENQUEUE)
        if fault is not None and fault.kind is not FaultKind.UNKNOWN:
            raise fault.raise_error()
        await self.inner.enqueue_intent(intent)
        if fault is not None:
            raise fault.raise_error()

    async def enqueue_intent_tx(self, tx: object, intent: HandoffIntent) -> None:
        """``enqueue_intent_tx`` of the wrapped outbox, failing at ``ENQUEUE``."""
        inner = self.inner
        if not isinstance(inner, TransactionalOutbox):
            raise TypeError("the wrapped outbox is not transactional")
        fault = self.faults.take(Phase.ENQUEUE)
        if fault is not None:
            raise fault.raise_error()
        await inner.enqueue_intent_tx(tx, intent)
