"""``Worker``: the background worker, composed of its parts.

The parts are chosen once, when the worker is built: the consuming part always; the
timer part unless ``timer_interval`` is ``None``; the schedule part unless
``schedule_interval`` is ``None`` or the store keeps no schedules; the recovery part's loop when
``recovery_interval`` is set; the sampling part when ``sample_interval`` is set and the
runner is built on a ``Backend``. ``run()`` runs their loops side by side.
"""

from __future__ import annotations

import asyncio
import warnings
from dataclasses import fields, replace
from typing import TYPE_CHECKING, Generic, Unpack

from .._runner import Runner
from .._types import E, S
from ..storage import OutboxConsumer, OutboxMessage
from ..storage._model import DEFAULT_QUEUE
from ._consume import Consume
from ._options import Outcome, WorkerKeywords, WorkerOptions, WorkerStats
from ._recovery import Recovery
from ._sampling import Sampling
from ._schedules import Schedules
from ._shared import Shared
from ._timers import Timers

__all__ = ["Worker"]

_OPTION_NAMES = frozenset(f.name for f in fields(WorkerOptions))


class Worker(Generic[S, E]):
    """Resumes handed-off runs with ``runner``, from ``consumer``; fires the timers of
    waiting runs; recovers stuck hand-offs; samples the backlog.

    ``Worker(runner, options=WorkerOptions(...))`` is the documented form; the fields of
    :class:`~flowy.types.WorkerOptions` may also be given as keyword arguments
    (``Worker(runner, owner="w1")``), alone or on top of ``options``.

    A message that fails (a node raised, the thread is busy, the store failed) is logged
    with its traceback on the ``flowy.worker`` logger, released with ``"Type: message"``
    as its error, and redelivered after an exponential backoff with jitter; after the
    consumer's ``max_attempts`` deliveries it is dead-lettered. A failure no delivery can
    cure (a thread record that does not decode, a resume at a node this graph does not
    have) is dead-lettered at once, with the reason. A thread another run
    holds is tried again for ``busy_grace`` seconds (the run that handed off lets go of
    it a moment after its hand-off committed); if it is still held, the message comes
    back once the holder's lease would have run out (a dead worker's lease lasts its
    TTL). A run that failed without saving its end (its lease was lost, the store failed)
    is retried and resumes where it stopped; a failure it saved (a node raised) is
    acknowledged. An ack or release that fails because the store is unavailable is
    tried again with a backoff (up to a second apart) while the message stays hidden, so
    it goes through once the store answers again instead of waiting out the visibility
    timeout.

    Args:
        runner: the runner that resumes the runs.
        consumer: where the hand-off messages come from (default: the consumer of the
            runner's ``Backend``).
        options: how the worker claims, retries, recovers and fires timers (default:
            ``WorkerOptions()``).
        **keywords: fields of ``WorkerOptions``, replacing those of ``options``.

    Raises:
        TypeError: no ``consumer`` was given and the runner is not built on a backend,
            or a keyword is not a field of ``WorkerOptions``.
        ValueError: an option out of range (see ``WorkerOptions``), or ``queues``
            other than ``("default",)`` with a consumer that keeps no queues.
    """

    def __init__(
        self,
        runner: Runner[S, E],
        consumer: OutboxConsumer | None = None,
        *,
        options: WorkerOptions | None = None,
        **keywords: Unpack[WorkerKeywords],
    ) -> None:
        if consumer is None:
            if runner.backend is None:
                raise TypeError(
                    "Worker needs a consumer: build the Runner on a Backend, or pass "
                    "Worker(runner, backend.consumer)"
                )
            consumer = runner.backend.consumer
        unknown = sorted(set(keywords) - _OPTION_NAMES)
        if unknown:
            raise TypeError(
                f"Worker() got unknown option(s) {', '.join(map(repr, unknown))}; its options "
                f"are the fields of flowy.types.WorkerOptions: {', '.join(sorted(_OPTION_NAMES))}"
            )
        options = WorkerOptions() if options is None else options
        if keywords:
            options = replace(options, **keywords)
        shared = Shared(runner, consumer, options)
        if not shared.keeps_queues and options.queues != (DEFAULT_QUEUE,):
            raise ValueError(
                f"WorkerOptions.queues is {options.queues!r}, but {type(consumer).__name__} "
                "keeps no queues (capabilities.queues is false): it serves the default "
                "queue only, queues=('default',)"
            )
        self.runner = runner
        self.consumer = consumer
        self.options = options
        """The options this worker was built with."""
        self.owner: str = shared.owner
        """This worker's name in leases (``options.owner``, or ``host-pid``)."""
        self._shared = shared
        self._consume = Consume(shared)
        self._timers = Timers(shared)
        self._recovery = Recovery(shared)
        sampling = None
        backend = runner.backend
        store = getattr(backend, "schedules", None) if backend else None
        self._schedules = Schedules(
            shared, store if backend is not None and backend.capabilities.schedules else None
        )
        if options.sample_interval is not None and backend and backend.capabilities.backlog:
            sampling = Sampling(shared, backend)
        self._sampling = sampling

    @property
    def stats(self) -> WorkerStats:
        """Outcome counters and recovered hand-offs."""
        return self._shared.stats

    def stop(self) -> None:
        """Ask ``run()`` to stop claiming; in-flight runs are drained before it returns."""
        self._shared.stopping.set()

    async def run(self) -> None:
        """Claim and process messages until ``stop()``; then drain in-flight runs.

        Cancelled, it cancels the runs in flight instead of draining them: each saves
        its cancel snapshot and lets go of its lease, and its message is given back at
        once for the next delivery to continue it.
        """
        options = self.options
        loops: list[asyncio.Task[None]] = []
        if options.recovery_interval is not None:
            loops.append(asyncio.ensure_future(self._recovery.loop(options.recovery_interval)))
        if options.timer_interval is not None:
            loops.append(asyncio.ensure_future(self._timers.loop(options.timer_interval)))
        if options.schedule_interval is not None and self._schedules.store is not None:
            loops.append(asyncio.ensure_future(self._schedules.loop(options.schedule_interval)))
        if self._sampling is not None and options.sample_interval is not None:
            loops.append(asyncio.ensure_future(self._sampling.loop(options.sample_interval)))
        try:
            await self._consume.loop()
        finally:
            for loop in loops:
                loop.cancel()
            if loops:
                await asyncio.wait(loops)  # unlike awaiting them, never hides our own cancel
            try:
                await self._consume.drain()
            finally:
                await self._recovery.release_leader()

    async def run_until_idle(self, idle_wait: float = 0.2) -> int:
        """Process messages (and fire due timers, unless ``timer_interval`` is ``None``)
        until a claim waiting ``idle_wait`` seconds finds no message and no timer is due.

        Returns the number of messages processed and timers fired (for scripts and tests).
        """
        timers = self.options.timer_interval is not None
        done = 0
        while True:
            fired = await self.fire_timers() if timers else 0
            claimed = await self._consume.claim_round(self.options.concurrency, idle_wait)
            if not claimed and not fired:
                return done
            messages = [message for _, message in claimed]
            await asyncio.gather(*(self.process(m) for m in messages))
            done += len(messages) + fired

    async def process(self, message: OutboxMessage) -> Outcome:
        """Handle one claimed ``message``: evaluate, resume (or recover / drop a
        duplicate), ack; a failure gives it back (or dead-letters it). Returns what
        happened.

        Messages of one thread are handled one at a time: a second delivery of a thread
        this worker is running (its visibility timeout ran out, or a recovery
        re-enqueued it) waits for the first to end, then finds it already resumed.
        Cancelled, it gives the message back for another delivery at once.
        """
        return await self._consume.process(message)

    async def fire_timers(self, limit: int = 100) -> int:
        """Resume the waiting threads whose wake-up time has come (up to ``limit``,
        ``concurrency`` at a time); returns how many this worker resumed.

        A thread another worker is resuming, or that moved on, is left alone; a resume
        that fails is logged with its traceback and tried again after a backoff.
        """
        return await self._timers.fire(limit)

    async def fire_schedules(self) -> int:
        """Claim the due ticks of the store's schedules at the runner's ``clock`` and
        start a thread for each tick this worker claimed (by each schedule's catch-up
        policy); returns how many threads it started.

        Of any number of workers firing at once, one claims each tick; the thread id
        is the schedule's name and the tick (``Schedule.thread_id``). A graph that
        cannot be loaded or a start that fails is logged, and that tick is not tried
        again. A store without schedules has none: 0.
        """
        return await self._schedules.fire()

    async def recover_once(self, limit: int = 100) -> int:
        """Recover stale pending and orphaned hand-offs (if this worker is the leader).

        Looks at up to ``limit`` threads with a hand-off and returns how many were
        re-enqueued. Without a lease manager on the runner it runs unconditionally
        (single-process deployments).
        """
        return await self._recovery.recover_once(limit)

    def backoff(self, attempts: int) -> float:
        """Seconds before the next delivery of a message that failed ``attempts`` times."""
        return self.options.backoff(attempts)

    if not TYPE_CHECKING:

        def __getattr__(self, name: str) -> object:
            # The options were attributes of the worker before WorkerOptions.
            if name in _OPTION_NAMES:
                warnings.warn(
                    f"Worker.{name} is deprecated: read worker.options.{name}",
                    DeprecationWarning,
                    stacklevel=2,
                )
                if name == "visibility_timeout":
                    return self._shared.visibility_timeout
                return getattr(self.options, name)
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
