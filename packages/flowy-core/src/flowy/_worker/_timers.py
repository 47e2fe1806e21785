"""The worker's timer part: every ``timer_interval`` seconds it lists the due wake-up
times from the store's index and resumes those threads.

Any number of workers may fire the same timer: the run lease and strict OCC let one
resume run, the others find the thread taken or moved on. A resume that fails is
logged and tried again after the same backoff as a message.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Generic

from .._errors import (
    ConcurrencyConflictError,
    ThreadAlreadyRunningError,
    ThreadLeaseBusyError,
    ThreadNotFoundError,
)
from .._types import E, S
from .._waits import durable_of
from ..storage import HandoffIntent, HandoffStatus, Route, RunStatus, Timer
from ._shared import Shared

__all__ = ["Timers"]

logger = logging.getLogger("flowy.worker")


class Timers(Generic[S, E]):
    """Fires the due timers of one worker's store."""

    def __init__(self, shared: Shared[S, E]) -> None:
        self.shared = shared
        self._failures: dict[str, tuple[int, float]] = {}  # thread -> (failures, next try)

    async def loop(self, interval: float) -> None:
        """Fire the due timers every ``interval`` seconds until the worker stops."""
        shared = self.shared
        while not shared.stopping.is_set():
            await self.fire(limit=100)
            await shared.pause(interval)

    async def fire(self, limit: int) -> int:
        """Resume the waiting threads whose wake-up time has come (up to ``limit``,
        ``concurrency`` at a time); returns how many this worker resumed."""
        shared = self.shared
        runner = shared.runner
        if runner.checkpointer is None:
            return 0
        try:
            durable = durable_of(runner.checkpointer, "firing timers")
            due = await durable.timers(before=runner.clock(), limit=limit)
        except Exception as exc:  # noqa: BLE001 - logged; the next look tries again
            shared.log_failure("listing due timers failed", exc)
            return 0
        now = time.monotonic()
        listed = {t.thread_id for t in due}
        # Forget the failures of threads that are no longer due (they moved on).
        self._failures = {k: v for k, v in self._failures.items() if k in listed or v[1] > now}
        due = [t for t in due if self._failures.get(t.thread_id, (0, 0.0))[1] <= now]
        gate = asyncio.Semaphore(shared.options.concurrency)

        async def fire(timer: Timer) -> bool:
            async with gate:
                lock = shared.lock(timer.thread_id)
                try:
                    async with lock:
                        return await self._fire(timer)
                finally:
                    shared.unlock(timer.thread_id, lock)

        fired = sum(await asyncio.gather(*(fire(t) for t in due)))
        shared.fired += fired
        return fired

    async def _fire(self, timer: Timer) -> bool:
        shared = self.shared
        runner = shared.runner
        options = shared.options
        thread_id = timer.thread_id
        try:
            head, token = await runner.head(thread_id)
            if (
                head.status is not RunStatus.WAITING
                or head.wake_at is None
                or head.wake_at > runner.clock()
            ):
                return False  # it moved on, or its time changed
            intent = HandoffIntent(
                thread_id=thread_id,
                pending_snapshot_revision=token.snapshot_revision,
                committed_snapshot_revision=token.snapshot_revision,
                snapshot_revision=token.snapshot_revision,
                resume_token=token,
                handoff_status=HandoffStatus.NONE,
                reason="timer",
                execution_pointer=head.execution_pointer,
                created_at=timer.wake_at,
                route=Route(head.route.queue),
            )
            extra = dict(options.resume_options(intent)) if options.resume_options else {}
            lease = (shared.owner, options.lease_ttl) if runner.lease_manager is not None else None
            result = await runner.resume(token, run_lease=lease, **extra)
        except (
            ThreadLeaseBusyError,
            ThreadAlreadyRunningError,
            ConcurrencyConflictError,
            ThreadNotFoundError,
        ):
            return False  # another worker fired it, or the thread moved on
        except Exception as exc:  # noqa: BLE001 - logged; the timer is tried again later
            self._failed(thread_id, "resuming it failed", exc)
            return False
        shared.report(intent, result)
        if result.status is RunStatus.FAILED and not await shared.failure_saved(result):
            # Nothing was saved (a node raised, the lease was lost): still due.
            self._failed(thread_id, f"its run failed ({result.reason})", result.error)
            return False
        self._failures.pop(thread_id, None)
        return True

    def _failed(self, thread_id: str, what: str, exc: BaseException | None) -> None:
        failures = self._failures.get(thread_id, (0, 0.0))[0] + 1
        delay = self.shared.options.backoff(failures)
        self._failures[thread_id] = (failures, time.monotonic() + delay)
        logger.error(
            "flowy worker %r: thread %r woken by its timer: %s (failure %d); tried again in %.1fs",
            self.shared.owner,
            thread_id,
            what,
            failures,
            delay,
            exc_info=exc,
        )
