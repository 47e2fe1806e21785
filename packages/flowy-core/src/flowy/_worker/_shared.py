"""What the parts of a worker share: its runner, consumer and options, its stop flag,
one lock per thread, its counters, and the few calls more than one part makes.

The parts (``_consume``, ``_timers``, ``_recovery``, ``_sampling``) each hold one
``Shared`` and never each other; ``Worker`` composes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Generic, Protocol, runtime_checkable

from .._errors import StorageUnavailableError
from .._results import RunResult
from .._runner import Runner, default_owner
from .._types import E, S
from ..storage import HandoffIntent, OutboxConsumer, OutboxMessage, RunStatus
from ._options import Outcome, WorkerOptions, WorkerStats

__all__ = ["QueueConsumer", "Shared"]

logger = logging.getLogger("flowy.worker")


@runtime_checkable
class QueueConsumer(Protocol):
    """A consumer that claims from named queues (``BaseConsumer``, or a wrapper of one
    that passes ``queue`` and ``held`` on)."""

    @property
    def keeps_queues(self) -> bool:
        """True if its store keeps queues (else it claims from the default one only)."""
        ...

    async def claim(
        self,
        limit: int,
        visibility_timeout: float,
        wait: float = 0.0,
        *,
        queue: str = ...,
        held: int = 0,
    ) -> list[OutboxMessage]:
        """Claim up to ``limit`` messages of ``queue`` (``BaseConsumer.claim``)."""
        ...


class Shared(Generic[S, E]):
    """The state and helpers every part of one worker uses."""

    def __init__(
        self, runner: Runner[S, E], consumer: OutboxConsumer, options: WorkerOptions
    ) -> None:
        self.runner = runner
        self.consumer = consumer
        self.options = options
        self.owner: str = default_owner() if options.owner is None else options.owner
        self.visibility_timeout: float = options.visibility_timeout or options.lease_ttl * 4
        self.keeps_queues: bool = isinstance(consumer, QueueConsumer) and consumer.keeps_queues
        """Whether the consumer claims from named queues (else the default one only)."""
        self.stopping = asyncio.Event()
        self._threads: dict[str, asyncio.Lock] = {}  # one message per thread at a time
        self.outcomes: dict[str, int] = {o.value: 0 for o in Outcome}
        self.recovered = 0
        self.fired = 0

    @property
    def stats(self) -> WorkerStats:
        return WorkerStats(dict(self.outcomes), self.recovered, self.fired)

    def lock(self, thread_id: str) -> asyncio.Lock:
        """The lock that lets one message (or timer) of ``thread_id`` run at a time;
        give it back with :meth:`unlock` once done with it."""
        return self._threads.setdefault(thread_id, asyncio.Lock())

    def unlock(self, thread_id: str, lock: asyncio.Lock) -> None:
        """Forget ``lock`` once nobody holds or waits for it (the map stays small)."""
        if not lock.locked() and self._threads.get(thread_id) is lock:
            del self._threads[thread_id]

    async def pause(self, interval: float) -> None:
        """Wait ``interval`` seconds, or less if the worker is asked to stop."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), interval)

    def report(self, intent: HandoffIntent, result: RunResult[Any, Any]) -> None:
        """Call ``on_result``; what it raises is logged."""
        on_result = self.options.on_result
        if on_result is None:
            return
        try:
            on_result(intent, result)
        except Exception:
            logger.exception("flowy worker %r: on_result raised", self.owner)

    async def failure_saved(self, result: RunResult[S, E]) -> bool:
        """Whether a failed run's end is the thread's stored head (a node's failure,
        saved): then the message is done with. Unsure (the store failing) is no."""
        try:
            head, _ = await self.runner.head(result.thread_id)
        except Exception:  # noqa: BLE001 - unsure: the message comes back and decides again
            return False
        return head.status is RunStatus.FAILED

    def log_failure(self, what: str, exc: Exception) -> None:
        """Log a failed store call: while the store is unavailable (tried again every
        second or so), one warning line each time, with the traceback at debug level;
        anything else with its traceback."""
        if isinstance(exc, StorageUnavailableError):
            logger.warning("flowy worker %r: %s: %s", self.owner, what, exc)
            logger.debug("flowy worker %r: %s", self.owner, what, exc_info=exc)
        else:
            logger.error("flowy worker %r: %s", self.owner, what, exc_info=exc)
