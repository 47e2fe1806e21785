"""The lease guard: fencing for checkpointers that cannot check leases themselves.

``LeaseGuardCheckpointer`` checks the lease manager before delegating each write. The
check and the write are two steps, so it is only safe within one process (the runner
serialises runs of a thread there); across processes pair a native checkpointer with
the lease manager of its own coordination domain.
"""

from __future__ import annotations

from typing import Any, Generic

from .._errors import LeaseLostError, ThreadLeaseBusyError
from .._types import S
from ._codecs import StateCodec
from ._model import HandoffStatus, Lease, Snapshot, ThreadSummary
from ._protocols import Checkpointer, EnqueueCallback, LeaseManager, TransactionalCheckpointer
from ._recent import RecentCursor, recent_threads

__all__ = ["LeaseGuardCheckpointer"]


class LeaseGuardCheckpointer(Generic[S]):
    """Wraps ``inner`` so saves are fenced by ``leases`` (single process only)."""

    def __init__(self, inner: Checkpointer[S], leases: LeaseManager) -> None:
        self.inner = inner
        self.leases = leases

    @property
    def codec(self) -> StateCodec[S] | None:
        """The inner checkpointer's codec."""
        return self.inner.codec

    @property
    def transactional(self) -> bool:
        """True if the inner checkpointer is transactional (the guard then delegates
        ``save_with_outbox``; otherwise the runner uses the three-phase FSM)."""
        return isinstance(self.inner, TransactionalCheckpointer)

    def fences(self, leases: LeaseManager) -> bool:
        """True if ``leases`` is the lease manager this guard checks."""
        return leases is self.leases

    async def _check(self, thread_id: str, lease: Lease | None) -> None:
        live = await self.leases.holder(thread_id)
        if lease is None:
            if live is not None:
                raise ThreadLeaseBusyError(
                    f"thread {thread_id!r} is leased by {live.owner!r}; save with its lease"
                )
        elif (
            live is None
            or live.fencing_token != lease.fencing_token
            or live.owner != lease.owner
            or lease.thread_id != thread_id
        ):
            raise LeaseLostError(
                f"save refused: lease {lease.fencing_token} of {lease.owner!r} on thread "
                f"{thread_id!r} is no longer live (fenced)"
            )

    async def save(
        self, expected_revision: int, snapshot: Snapshot[S], *, lease: Lease | None = None
    ) -> int:
        """Check the lease, then save ``snapshot`` in the inner checkpointer.

        Args:
            expected_revision: the head revision the save requires (0: a new thread).
            snapshot: the snapshot to store at ``expected_revision + 1``.
            lease: the caller's lease; the save goes ahead only while it is the
                thread's live lease (else ``LeaseLostError``). Without one, a live lease
                on the thread refuses the save (``ThreadLeaseBusyError``).
        """
        await self._check(snapshot.thread_id, lease)
        return await self.inner.save(expected_revision, snapshot)

    async def save_with_outbox(
        self,
        expected_revision: int,
        snapshot: Snapshot[S],
        enqueue: EnqueueCallback,
        *,
        lease: Lease | None = None,
    ) -> int:
        """Check the lease, then the inner ``save_with_outbox``.

        Args:
            expected_revision: the head revision the save requires (0: a new thread).
            snapshot: the snapshot to store at ``expected_revision + 1``.
            enqueue: ``await enqueue(tx, new_revision)``, called inside the inner
                checkpointer's transaction.
            lease: checked as by :meth:`save`.

        Raises:
            TypeError: the inner checkpointer is not transactional.
        """
        inner = self.inner
        if not isinstance(inner, TransactionalCheckpointer):
            raise TypeError(
                f"{type(inner).__name__} is not transactional; the runner uses the "
                "three-phase hand-off instead"
            )
        await self._check(snapshot.thread_id, lease)
        tx_inner: TransactionalCheckpointer[Any] = inner
        return await tx_inner.save_with_outbox(expected_revision, snapshot, enqueue)

    async def load(self, thread_id: str) -> tuple[Snapshot[S], int]:
        """The head of ``thread_id`` and its revision, from the inner checkpointer."""
        return await self.inner.load(thread_id)

    async def get_history(self, thread_id: str, limit: int = 100) -> list[Snapshot[S]]:
        """Up to ``limit`` stored snapshots of ``thread_id``, newest first."""
        return await self.inner.get_history(thread_id, limit)

    async def prune(self, thread_id: str, retain: int) -> None:
        """Keep only the newest ``retain`` history entries of ``thread_id``."""
        await self.inner.prune(thread_id, retain)

    async def delete(self, thread_id: str) -> None:
        """Delete the head and history of ``thread_id`` (not checked against leases)."""
        await self.inner.delete(thread_id)

    async def delete_if_idle(self, thread_id: str) -> None:
        """Delete ``thread_id`` unless the lease manager has a live lease on it
        (``ThreadLeaseBusyError``)."""
        live = await self.leases.holder(thread_id)
        if live is not None:
            raise ThreadLeaseBusyError(
                f"thread {thread_id!r} is leased by {live.owner!r}; not deleting"
            )
        await self.inner.delete_if_idle(thread_id)

    async def list_threads(
        self,
        *,
        handoff_statuses: frozenset[HandoffStatus] | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> list[ThreadSummary]:
        """Up to ``limit`` thread heads ordered by thread id, past ``after`` if given,
        only those in ``handoff_statuses`` if given (the inner checkpointer's)."""
        return await self.inner.list_threads(
            handoff_statuses=handoff_statuses, limit=limit, after=after
        )

    async def recent_threads(
        self, *, limit: int = 100, before: RecentCursor | None = None
    ) -> list[ThreadSummary]:
        """Up to ``limit`` thread heads, most recently saved first (to the second), below
        ``before`` if given (the inner checkpointer's, or a scan of its
        ``list_threads``)."""
        return await recent_threads(self.inner, limit=limit, before=before)
