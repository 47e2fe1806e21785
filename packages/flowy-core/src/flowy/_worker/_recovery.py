"""The worker's recovery part: every ``recovery_interval`` seconds, while this worker
holds the leader lease, it re-enqueues the stale pending and orphaned hand-offs (and,
with ``reenqueue_enqueued_after``, enqueued ones that never ran).

One leader at a time, elected with a system lease (:data:`RECOVERY_LEADER`) that it
renews on every scan and lets go of when the worker stops.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Generic, cast

from .._errors import HandoffPendingError, LeaseError, ThreadLeaseBusyError
from .._types import E, S
from ..storage import HandoffStatus, Lease
from ..storage.dialect import BaseLeaseManager
from ._options import RECOVERY_LEADER
from ._shared import Shared

__all__ = ["Recovery"]

logger = logging.getLogger("flowy.worker")


class Recovery(Generic[S, E]):
    """Scans for stuck hand-offs, as the leader of the workers sharing a store."""

    def __init__(self, shared: Shared[S, E]) -> None:
        self.shared = shared
        # What the leader election reads (the names ``_lead`` has always used).
        self.runner = shared.runner
        self.owner = shared.owner
        self.recovery_interval = shared.options.recovery_interval
        self._leader: Lease | None = None

    async def loop(self, interval: float) -> None:
        """Scan every ``interval`` seconds until the worker stops; a failed scan is
        logged."""
        shared = self.shared
        while not shared.stopping.is_set():
            try:
                await self.recover_once(limit=100)
            except Exception:
                logger.exception("flowy worker %r: recovery scan failed", shared.owner)
            await shared.pause(interval)

    async def recover_once(self, limit: int) -> int:
        """Recover up to ``limit`` stale hand-offs if this worker leads; how many were
        re-enqueued."""
        if not await self._lead():
            return 0
        shared = self.shared
        runner = shared.runner
        options = shared.options
        cp = runner.checkpointer
        if cp is None:
            return 0
        recovered = 0
        statuses = {HandoffStatus.PENDING, HandoffStatus.ORPHANED}
        if options.reenqueue_enqueued_after is not None:
            statuses.add(HandoffStatus.ENQUEUED)
        threads = await cp.list_threads(handoff_statuses=frozenset(statuses), limit=limit)
        now = runner.clock()
        for summary in threads:
            force = False
            if summary.handoff_status is HandoffStatus.ENQUEUED:
                age = now - summary.updated_at
                if (
                    options.reenqueue_enqueued_after is None
                    or age < options.reenqueue_enqueued_after
                ):
                    continue
                force = True
            try:
                await runner.recover_stale_handoff(
                    summary.thread_id, stale_after=options.stale_after, force_reenqueue=force
                )
            except HandoffPendingError:
                continue
            except Exception:
                logger.exception("flowy worker: recovering thread %r failed", summary.thread_id)
                continue
            recovered += 1
        shared.recovered += recovered
        return recovered

    async def _lead(self) -> bool:
        lm = self.runner.lease_manager
        if lm is None:
            return True
        ttl = max((self.recovery_interval or 30.0) * 3, 1.0)
        if self._leader is not None:
            try:
                self._leader = await lm.renew(self._leader, ttl)
                return True
            except LeaseError:
                self._leader = None
        try:
            if self.runner.system_leases:  # chosen when the runner was built
                system = cast(BaseLeaseManager, lm)
                self._leader = await system.acquire_system(RECOVERY_LEADER, self.owner, ttl)
            else:  # a lease manager without system leases: a reserved-looking thread id
                self._leader = await lm.acquire(f"flowy:{RECOVERY_LEADER}", self.owner, ttl)
            return True
        except ThreadLeaseBusyError:
            return False

    async def release_leader(self) -> None:
        """Let go of the leader lease, if held."""
        lm = self.runner.lease_manager
        if self._leader is not None and lm is not None:
            with contextlib.suppress(Exception):  # it expires on its own anyway
                await lm.release(self._leader)
            self._leader = None
