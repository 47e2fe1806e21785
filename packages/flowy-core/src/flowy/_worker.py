"""The background worker: consumes hand-off intents and resumes their runs, and fires
the timers of waiting runs.

Delivery is at-least-once, so every message starts with ``Runner.evaluate_resume``: a
token that is no longer the head of an enqueued hand-off means the segment already ran,
and the message is acknowledged without running anything. A message is acknowledged
only after the resumed run's terminal save; a crash before that means redelivery.

Timers: every ``timer_interval`` seconds the worker lists the due wake-up times from the
store's index and resumes those threads. Any number of workers may fire the same timer:
the run lease and strict OCC let one resume run, the others find the thread taken or
moved on. A signal to a waiting thread arrives as an outbox message like a hand-off.

Backlog: while ``flowy.otel`` instrumentation is in effect, the worker reads its store's
backlog every ``sample_interval`` seconds for the gauges (``flowy.otel.sample``).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, cast

from . import _tracing
from ._errors import (
    ConcurrencyConflictError,
    HandoffPendingError,
    LeaseError,
    SnapshotEnvelopeInvalidError,
    StorageUnavailableError,
    ThreadAlreadyRunningError,
    ThreadLeaseBusyError,
    ThreadNotFoundError,
    UnknownNodeError,
)
from ._results import ResumeDecisionKind, RunResult
from ._runner import Runner, default_owner
from ._segment import running_here
from ._types import E, ResumeToken, S
from ._waits import durable_of, wake
from .storage import (
    BaseLeaseManager,
    HandoffIntent,
    HandoffStatus,
    Lease,
    OutboxConsumer,
    OutboxMessage,
    RunStatus,
    Timer,
)

__all__ = ["PERMANENT_ERRORS", "RECOVERY_LEADER", "Failure", "Outcome", "Worker", "WorkerStats"]

logger = logging.getLogger("flowy.worker")

RECOVERY_LEADER = "recovery-leader"
"""The system lease the recovery loop's leader election uses (a namespace no thread id
can reach: ``BaseLeaseManager.acquire_system``)."""

PERMANENT_ERRORS: tuple[type[Exception], ...] = (SnapshotEnvelopeInvalidError, UnknownNodeError)
"""Failures no later delivery can cure: the thread's stored record does not decode, or
it resumes at a node this graph does not have. A message that fails with one is
dead-lettered at once, with the reason. (A ``GraphVersionMismatchError`` is not one of
them: a worker of the thread's own version can run it, so a rolling deploy gives the
message back for that worker to take.)"""


class Outcome(enum.StrEnum):
    """What the worker did with one message."""

    RESUMED = "resumed"
    """The run was resumed and its terminal save happened; the message was acked."""
    DUPLICATE = "duplicate"
    """The segment had already run (stale token); acked without running anything."""
    RECOVERED = "recovered"
    """The hand-off was pending/orphaned and was re-enqueued; acked."""
    GONE = "gone"
    """The thread no longer exists; acked."""
    RETRY = "retry"
    """Released for another delivery after a backoff (lease busy, transient error, node
    error)."""
    DEAD_LETTERED = "dead_lettered"
    """Failed on its last allowed delivery, or with an error no delivery can cure
    (:data:`PERMANENT_ERRORS`): moved to the dead letters."""


@dataclass(frozen=True, slots=True)
class WorkerStats:
    """Counters of a worker since it was created."""

    outcomes: Mapping[str, int]
    """How many messages ended with each :class:`Outcome` (by its value)."""
    recovered: int
    """Hand-offs re-enqueued by recovery (scans and pending/orphaned messages)."""
    timers_fired: int = 0
    """Waiting runs this worker resumed because their wake-up time came."""


@dataclass(frozen=True, slots=True)
class Failure:
    """What ``on_failure`` gets: a message the worker could not finish.

    ``error`` is ``"Type: message"`` (what is stored on the message and shown by
    ``flowy dead-letters``); ``exception`` the exception itself when there was one;
    ``dead`` tells whether the message went to the dead letters (else it is retried
    after ``retry_in`` seconds).
    """

    message: OutboxMessage
    """The delivery that failed."""
    error: str
    exception: BaseException | None
    dead: bool
    retry_in: float


ResumeOptions = Callable[[HandoffIntent], Mapping[str, Any]]
ResultHook = Callable[[HandoffIntent, RunResult[Any, Any]], Any]
FailureHook = Callable[[Failure], Any]


class Worker(Generic[S, E]):
    """Resumes handed-off runs with ``runner``, from ``consumer``.

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
        owner: this worker's name in leases (default: ``host-pid``).
        lease_ttl: seconds of the run lease each resumed run holds.
        concurrency: the most runs in flight at once.
        visibility_timeout: seconds a claimed message stays hidden from other consumers
            (default: 4 × ``lease_ttl``).
        poll_interval: seconds each claim of ``run()`` waits for a message to arrive.
        resume_options: ``resume_options(intent)`` returns extra keyword arguments for
            ``Runner.resume`` (bindings, overlay, …).
        recovery_interval: seconds between scans that run ``recover_stale_handoff`` over
            pending and orphaned threads, only while this worker holds the leader lease
            (``None``: no scans).
        stale_after: seconds after which a pending hand-off counts as stale in recovery
            (default: the runner's ``handoff_stale_after``).
        reenqueue_enqueued_after: seconds (``None``: never) after which a scan also
            force-re-enqueues hand-offs that are still *enqueued*: the runbook's worst
            case (enqueue and orphan patch both failed) leaves such rows without a
            message. A duplicate message this may create is harmless:
            ``evaluate_resume`` drops it.
        on_result: ``on_result(intent, result)`` is called with the result of every run
            this worker resumes.
        on_failure: ``on_failure(failure)`` is called with a :class:`Failure` for every
            message the worker gives back or dead-letters. Exceptions either hook raises
            are logged and ignored.
        retry_delay: seconds before the next delivery after a message's first failure;
            each further failure doubles it.
        max_retry_delay: the longest delay before a redelivery, in seconds.
        retry_jitter: the fraction of the delay (0 to 1) added at random, so failed
            messages do not come back all at once.
        busy_grace: seconds a resume is tried again while another run holds the
            thread, before the message is given back.
        timer_interval: seconds between looks at the store's due timers (``None``: this
            worker fires no timers). A timer whose resume fails is tried again after the
            same backoff as a message.
        sample_interval: seconds between reads of the store's backlog (outbox depth,
            dead letters, the oldest suspended and waiting threads) for ``flowy.otel``'s
            gauges, made only while its instrumentation is in effect and the runner is
            built on a ``Backend`` (``None``: never). A failed read is logged.

    Raises:
        TypeError: no ``consumer`` was given and the runner is not built on a backend.
        ValueError: an empty ``owner``, ``concurrency`` below 1, a negative
            ``busy_grace``, or retry delays or jitter out of range.
    """

    def __init__(
        self,
        runner: Runner[S, E],
        consumer: OutboxConsumer | None = None,
        *,
        owner: str | None = None,
        lease_ttl: float = 30.0,
        concurrency: int = 4,
        visibility_timeout: float | None = None,
        poll_interval: float = 1.0,
        resume_options: ResumeOptions | None = None,
        recovery_interval: float | None = None,
        stale_after: float | None = None,
        reenqueue_enqueued_after: float | None = None,
        on_result: ResultHook | None = None,
        on_failure: FailureHook | None = None,
        retry_delay: float = 1.0,
        max_retry_delay: float = 300.0,
        retry_jitter: float = 0.25,
        busy_grace: float = 1.0,
        timer_interval: float | None = 1.0,
        sample_interval: float | None = 15.0,
    ) -> None:
        if consumer is None:
            if runner.backend is None:
                raise TypeError(
                    "Worker needs a consumer: build the Runner on a Backend, or pass "
                    "Worker(runner, backend.consumer)"
                )
            consumer = runner.backend.consumer
        owner = default_owner() if owner is None else owner
        if not owner:
            raise ValueError("Worker needs a non-empty owner name")
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency!r}")
        if not busy_grace >= 0:
            raise ValueError(f"busy_grace must be >= 0 seconds, got {busy_grace!r}")
        if not 0 <= retry_delay <= max_retry_delay or not 0 <= retry_jitter <= 1:
            raise ValueError(
                "need 0 <= retry_delay <= max_retry_delay and 0 <= retry_jitter <= 1, got "
                f"{retry_delay!r}, {max_retry_delay!r}, {retry_jitter!r}"
            )
        self.runner = runner
        self.consumer = consumer
        self.owner = owner
        self.lease_ttl = lease_ttl
        self.concurrency = concurrency
        self.visibility_timeout: float = visibility_timeout or lease_ttl * 4
        self.poll_interval = poll_interval
        self.resume_options = resume_options
        self.recovery_interval = recovery_interval
        self.stale_after = stale_after
        self.reenqueue_enqueued_after = reenqueue_enqueued_after
        self._stopping = asyncio.Event()
        self._inflight: set[asyncio.Task[Outcome]] = set()
        self._threads: dict[str, asyncio.Lock] = {}  # one message per thread at a time
        self._outcomes: dict[str, int] = {o.value: 0 for o in Outcome}
        self._recovered = 0
        self._leader: Lease | None = None
        self.on_result = on_result
        self.on_failure = on_failure
        self.retry_delay = retry_delay
        self.max_retry_delay = max_retry_delay
        self.retry_jitter = retry_jitter
        self.busy_grace = busy_grace
        self.timer_interval = timer_interval
        self.sample_interval = sample_interval
        self._fired = 0
        self._timer_failures: dict[str, tuple[int, float]] = {}  # thread -> (failures, next try)

    @property
    def stats(self) -> WorkerStats:
        """Outcome counters and recovered hand-offs."""
        return WorkerStats(dict(self._outcomes), self._recovered, self._fired)

    def stop(self) -> None:
        """Ask ``run()`` to stop claiming; in-flight runs are drained before it returns."""
        self._stopping.set()

    async def run(self) -> None:
        """Claim and process messages until ``stop()``; then drain in-flight runs.

        Cancelled, it cancels the runs in flight instead of draining them: each saves
        its cancel snapshot and lets go of its lease, and its message is given back at
        once for the next delivery to continue it.
        """
        loops: list[asyncio.Task[None]] = []
        if self.recovery_interval is not None:
            loops.append(asyncio.ensure_future(self._recovery_loop(self.recovery_interval)))
        if self.timer_interval is not None:
            loops.append(asyncio.ensure_future(self._timer_loop(self.timer_interval)))
        if self.sample_interval is not None and self.runner.backend is not None:
            loops.append(asyncio.ensure_future(self._sample_loop(self.sample_interval)))
        try:
            while not self._stopping.is_set():
                free = self.concurrency - len(self._inflight)
                if free <= 0:
                    await asyncio.wait(self._inflight, return_when=asyncio.FIRST_COMPLETED)
                    continue
                messages = await self._claim(free, self.poll_interval)
                for message in messages:
                    task = asyncio.ensure_future(self.process(message))
                    self._inflight.add(task)
                    task.add_done_callback(self._inflight.discard)
        finally:
            for loop in loops:
                loop.cancel()
            if loops:
                await asyncio.wait(loops)  # unlike awaiting them, never hides our own cancel
            try:
                if self._inflight:
                    current = asyncio.current_task()
                    if current is not None and current.cancelling():
                        for task in self._inflight:
                            task.cancel()
                    # Cancelled while draining, the gather cancels them all the same.
                    await asyncio.gather(*self._inflight, return_exceptions=True)
            finally:
                await self._release_leader()

    async def run_until_idle(self, idle_wait: float = 0.2) -> int:
        """Process messages (and fire due timers, unless ``timer_interval`` is ``None``)
        until a claim waiting ``idle_wait`` seconds finds no message and no timer is due.

        Returns the number of messages processed and timers fired (for scripts and tests).
        """
        done = 0
        while True:
            fired = await self.fire_timers() if self.timer_interval is not None else 0
            messages = await self._claim(self.concurrency, idle_wait)
            if not messages and not fired:
                return done
            await asyncio.gather(*(self.process(m) for m in messages))
            done += len(messages) + fired

    async def _claim(self, limit: int, wait: float) -> list[OutboxMessage]:
        try:
            return await self.consumer.claim(limit, self.visibility_timeout, wait)
        except Exception as exc:  # noqa: BLE001 - logged; the next claim tries again
            self._log_failure("claim failed", exc)
            await asyncio.sleep(min(wait, 1.0) or 0.1)
            return []

    def _log_failure(self, what: str, exc: Exception) -> None:
        """Log a failed store call: while the store is unavailable (tried again every
        second or so), one warning line each time, with the traceback at debug level;
        anything else with its traceback."""
        if isinstance(exc, StorageUnavailableError):
            logger.warning("flowy worker %r: %s: %s", self.owner, what, exc)
            logger.debug("flowy worker %r: %s", self.owner, what, exc_info=exc)
        else:
            logger.error("flowy worker %r: %s", self.owner, what, exc_info=exc)

    def _count(self, outcome: Outcome) -> Outcome:
        self._outcomes[outcome.value] += 1
        return outcome

    async def _ack(self, message: OutboxMessage, outcome: Outcome) -> Outcome:
        await self._settle("acknowledging", message, lambda: self.consumer.ack(message))
        return self._count(outcome)

    async def _settle(
        self, what: str, message: OutboxMessage, call: Callable[[], Awaitable[None]]
    ) -> None:
        """``call()`` (the ack or release of ``message``), tried again with a backoff while
        the store is unavailable, for as long as the message stays hidden: once the store
        answers again it goes through, instead of the message waiting out its visibility
        timeout. Any other failure is raised at once."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.visibility_timeout
        pause, failures = 0.05, 0
        while True:
            try:
                await call()
            except StorageUnavailableError as exc:
                failures += 1
                if loop.time() + pause > deadline:
                    raise
                if failures == 1:
                    logger.warning(
                        "flowy worker %r: %s thread %r failed, the store is unavailable; "
                        "trying again until it answers (%s)",
                        self.owner,
                        what,
                        message.intent.thread_id,
                        exc,
                    )
                await asyncio.sleep(pause)
                pause = min(pause * 2, 1.0)
                continue
            if failures:
                logger.info(
                    "flowy worker %r: %s thread %r went through after %d failed attempt(s)",
                    self.owner,
                    what,
                    message.intent.thread_id,
                    failures,
                )
            return

    def backoff(self, attempts: int) -> float:
        """Seconds before the next delivery of a message that failed ``attempts`` times."""
        base = min(self.max_retry_delay, self.retry_delay * 2 ** max(attempts - 1, 0))
        return min(self.max_retry_delay, base * (1 + self.retry_jitter * random.random()))

    async def _retry(
        self,
        message: OutboxMessage,
        what: str,
        exc: BaseException | None = None,
        *,
        at_least: float = 0.0,
    ) -> Outcome:
        """Give ``message`` back after a backoff of at least ``at_least`` seconds (or
        dead-letter it on its last delivery, or at once if ``exc`` is permanent), with the
        error stored on it, logged with its traceback, and reported."""
        error = f"{what}: {type(exc).__name__}: {exc}" if exc is not None else what
        permanent = isinstance(exc, PERMANENT_ERRORS)
        dead = permanent or message.attempts >= self.consumer.max_attempts
        delay = 0.0 if dead else max(self.backoff(message.attempts), at_least)
        thread = message.intent.thread_id
        level = logging.ERROR if dead else logging.WARNING
        logger.log(
            level,
            "flowy worker %r: thread %r (delivery %d of %d) %s: %s",
            self.owner,
            thread,
            message.attempts,
            self.consumer.max_attempts,
            ("dead-lettered (no delivery can cure it)" if permanent else "dead-lettered")
            if dead
            else f"retried in {delay:.1f}s",
            error,
            exc_info=exc,
        )
        try:
            if permanent:
                await self._settle(
                    "dead-lettering",
                    message,
                    lambda: self.consumer.release(message, error=error, dead=True),
                )
            else:
                await self._settle(
                    "releasing",
                    message,
                    lambda: self.consumer.release(message, error=error, delay=delay),
                )
        except Exception:
            logger.exception("flowy worker %r: releasing thread %r failed", self.owner, thread)
        self._notify(Failure(message, error, exc, dead, delay))
        if dead and (tracing := _tracing.active()) is not None:
            tracing.dead_letter(thread)
        return self._count(Outcome.DEAD_LETTERED if dead else Outcome.RETRY)

    def _notify(self, failure: Failure) -> None:
        if self.on_failure is None:
            return
        try:
            self.on_failure(failure)
        except Exception:
            logger.exception("flowy worker %r: on_failure raised", self.owner)

    async def process(self, message: OutboxMessage) -> Outcome:
        """Handle one claimed ``message``: evaluate, resume (or recover / drop a
        duplicate), ack; a failure gives it back (or dead-letters it). Returns what
        happened.

        Messages of one thread are handled one at a time: a second delivery of a thread
        this worker is running (its visibility timeout ran out, or a recovery
        re-enqueued it) waits for the first to end, then finds it already resumed.
        Cancelled, it gives the message back for another delivery at once.
        """
        thread_id = message.intent.thread_id
        lock = self._threads.setdefault(thread_id, asyncio.Lock())
        try:
            async with lock:
                return await self._process(message)
        except asyncio.CancelledError:
            # Stopped mid-run (the run saved its cancel snapshot): give the message back
            # now, so the next delivery continues the thread without waiting out the
            # visibility timeout.
            with contextlib.suppress(Exception):
                await asyncio.shield(
                    self.consumer.release(message, error="the worker stopped during the run")
                )
            raise
        finally:
            if not lock.locked() and self._threads.get(thread_id) is lock:
                del self._threads[thread_id]

    async def _process(self, message: OutboxMessage) -> Outcome:
        intent = message.intent
        runner = self.runner
        try:
            decision = await runner.evaluate_resume(intent.resume_token)
        except Exception as exc:  # noqa: BLE001 - retried, logged and stored on the message
            return await self._retry(message, "evaluate_resume failed", exc)
        kind = decision.kind
        if kind is ResumeDecisionKind.NOT_FOUND:
            logger.info("flowy worker: thread %r is gone; dropping its message", intent.thread_id)
            return await self._ack(message, Outcome.GONE)
        if kind in (ResumeDecisionKind.HANDOFF_PENDING, ResumeDecisionKind.HANDOFF_ORPHANED):
            return await self._recover(message)
        token: ResumeToken | None = intent.resume_token
        interrupted = decision.status in (RunStatus.RUNNING, RunStatus.CANCELED)
        if decision.status is RunStatus.WAITING and kind is ResumeDecisionKind.RESUMABLE:
            # A signal's wake-up message: resume only if the wait is over.
            try:
                over = await self._wait_is_over(intent.thread_id)
            except Exception as exc:  # noqa: BLE001 - retried, logged and stored on the message
                return await self._retry(message, "reading the waiting thread failed", exc)
            if not over:
                return await self._ack(message, Outcome.DUPLICATE)
        elif not interrupted and (
            decision.status is not RunStatus.HANDOFF
            or decision.handoff_status not in (HandoffStatus.ENQUEUED, HandoffStatus.NONE)
        ):
            logger.info(
                "flowy worker: thread %r revision %d was already resumed (the thread is at "
                "revision %s, status %s); acknowledging the duplicate delivery",
                intent.thread_id,
                intent.resume_token.snapshot_revision,
                decision.resume_token.snapshot_revision if decision.resume_token else "?",
                decision.status,
            )
            return await self._ack(message, Outcome.DUPLICATE)
        if kind is ResumeDecisionKind.STALE_TOKEN:
            # Either the hand-off was re-enqueued at a newer revision, or a worker died
            # (or was cancelled) in the middle of the resumed segment after saving steps:
            # continue from the head. The lease keeps a live run from being doubled.
            token = decision.resume_token
        assert token is not None
        extra = dict(self.resume_options(intent)) if self.resume_options else {}
        joined = _tracing.incoming.set(intent.trace or None)  # the run joins the hand-off's trace
        try:
            result = await self._resume_when_free(token, extra)
        except (ThreadLeaseBusyError, ThreadAlreadyRunningError) as exc:
            # Still held after the grace period: a long run, or the lease of a worker that
            # died. Come back when that lease would have run out, not sooner: quick
            # retries would use up the deliveries while a dead worker's lease lasts.
            remaining = await self._lease_remaining(intent.thread_id)
            return await self._retry(message, "thread busy", exc, at_least=remaining)
        except ConcurrencyConflictError as exc:
            return await self._retry(message, "thread moved on", exc)
        except ThreadNotFoundError:
            return await self._ack(message, Outcome.GONE)
        except Exception as exc:  # noqa: BLE001 - retried, logged and stored on the message
            return await self._retry(message, "resume failed", exc)
        finally:
            _tracing.incoming.reset(joined)
        self._report(intent, result)
        if result.status is RunStatus.FAILED and not await self._failure_saved(result):
            # The run stopped without saving its end (the lease was lost, the store
            # failed…): the thread is still mid-run, so the message must come back.
            return await self._retry(message, f"run failed ({result.reason})", result.error)
        return await self._ack(message, Outcome.RESUMED)

    async def _resume_when_free(self, token: ResumeToken, extra: dict[str, Any]) -> RunResult[S, E]:
        """``runner.resume(token)``, tried again for up to ``busy_grace`` seconds while
        another run holds the thread: the run that handed off usually lets go of it a
        moment after its hand-off committed."""
        runner = self.runner
        lease = (self.owner, self.lease_ttl) if runner.lease_manager is not None else None
        deadline = asyncio.get_running_loop().time() + self.busy_grace
        pause = 0.01
        stale_released = False
        while True:
            try:
                return await runner.resume(token, run_lease=lease, **extra)
            except ThreadLeaseBusyError:
                if not stale_released and await self._release_stale_own_lease(token.thread_id):
                    stale_released = True
                    continue
                if asyncio.get_running_loop().time() + pause > deadline:
                    raise
            except ThreadAlreadyRunningError:
                if asyncio.get_running_loop().time() + pause > deadline:
                    raise
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.2)

    async def _release_stale_own_lease(self, thread_id: str) -> bool:
        """Release a lease on ``thread_id`` in this worker's own name that no run of this
        process holds: left by a run whose store went away mid-call (an acquire whose
        reply was lost, a release that failed). Whether one was released."""
        leases = self.runner.lease_manager
        if leases is None:
            return False
        try:
            holder = await leases.holder(thread_id)
            store = self.runner._store_key  # pyright: ignore[reportPrivateUsage]
            if holder is None or holder.owner != self.owner or running_here((store, thread_id)):
                return False
            await leases.release(holder)
        except Exception:  # noqa: BLE001 - then it is busy as before: wait for it to expire
            return False
        logger.info(
            "flowy worker %r: released its own lease on thread %r, left by a run that "
            "lost its store mid-call",
            self.owner,
            thread_id,
        )
        return True

    async def _lease_remaining(self, thread_id: str) -> float:
        """Seconds until the lease now holding ``thread_id`` runs out unless renewed
        (0 if it is gone or unknown), at most twice this worker's lease TTL."""
        leases = self.runner.lease_manager
        if leases is None:
            return 0.0
        try:
            holder = await leases.holder(thread_id)
        except Exception:  # noqa: BLE001 - only a delay estimate: fall back to the backoff
            return 0.0
        if holder is None:
            return 0.0
        return max(0.0, min(holder.expires_at - time.time(), 2 * self.lease_ttl))

    async def _failure_saved(self, result: RunResult[S, E]) -> bool:
        """Whether a failed run's end is the thread's stored head (a node's failure,
        saved): then the message is done with. Unsure (the store failing) is no."""
        try:
            head, _ = await self.runner.head(result.thread_id)
        except Exception:  # noqa: BLE001 - unsure: the message comes back and decides again
            return False
        return head.status is RunStatus.FAILED

    def _report(self, intent: HandoffIntent, result: RunResult[S, E]) -> None:
        if self.on_result is None:
            return
        try:
            self.on_result(intent, result)
        except Exception:
            logger.exception("flowy worker %r: on_result raised", self.owner)

    async def _wait_is_over(self, thread_id: str) -> bool:
        """Whether the waiting head of ``thread_id`` has its signal or is past its
        deadline (a resume now would not be an early one)."""
        runner = self.runner
        head, _ = await runner.head(thread_id)
        if head.status is not RunStatus.WAITING:
            return False
        woke = await wake(runner.checkpointer, runner.graph, head, runner.clock())
        return woke.signal is not None or woke.timed_out

    async def fire_timers(self, limit: int = 100) -> int:
        """Resume the waiting threads whose wake-up time has come (up to ``limit``,
        ``concurrency`` at a time); returns how many this worker resumed.

        A thread another worker is resuming, or that moved on, is left alone; a resume
        that fails is logged with its traceback and tried again after a backoff.
        """
        runner = self.runner
        if runner.checkpointer is None:
            return 0
        try:
            durable = durable_of(runner.checkpointer, "firing timers")
            due = await durable.timers(before=runner.clock(), limit=limit)
        except Exception as exc:  # noqa: BLE001 - logged; the next look tries again
            self._log_failure("listing due timers failed", exc)
            return 0
        now = time.monotonic()
        listed = {t.thread_id for t in due}
        # Forget the failures of threads that are no longer due (they moved on).
        self._timer_failures = {
            k: v for k, v in self._timer_failures.items() if k in listed or v[1] > now
        }
        due = [t for t in due if self._timer_failures.get(t.thread_id, (0, 0.0))[1] <= now]
        gate = asyncio.Semaphore(self.concurrency)

        async def fire(timer: Timer) -> bool:
            async with gate:
                lock = self._threads.setdefault(timer.thread_id, asyncio.Lock())
                try:
                    async with lock:
                        return await self._fire(timer)
                finally:
                    if not lock.locked() and self._threads.get(timer.thread_id) is lock:
                        del self._threads[timer.thread_id]

        fired = sum(await asyncio.gather(*(fire(t) for t in due)))
        self._fired += fired
        return fired

    async def _fire(self, timer: Timer) -> bool:
        runner = self.runner
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
            )
            extra = dict(self.resume_options(intent)) if self.resume_options else {}
            lease = (self.owner, self.lease_ttl) if runner.lease_manager is not None else None
            result = await runner.resume(token, run_lease=lease, **extra)
        except (
            ThreadLeaseBusyError,
            ThreadAlreadyRunningError,
            ConcurrencyConflictError,
            ThreadNotFoundError,
        ):
            return False  # another worker fired it, or the thread moved on
        except Exception as exc:  # noqa: BLE001 - logged; the timer is tried again later
            self._timer_failed(thread_id, "resuming it failed", exc)
            return False
        self._report(intent, result)
        if result.status is RunStatus.FAILED and not await self._failure_saved(result):
            # Nothing was saved (a node raised, the lease was lost): still due.
            self._timer_failed(thread_id, f"its run failed ({result.reason})", result.error)
            return False
        self._timer_failures.pop(thread_id, None)
        return True

    def _timer_failed(self, thread_id: str, what: str, exc: BaseException | None) -> None:
        failures = self._timer_failures.get(thread_id, (0, 0.0))[0] + 1
        delay = self.backoff(failures)
        self._timer_failures[thread_id] = (failures, time.monotonic() + delay)
        logger.error(
            "flowy worker %r: thread %r woken by its timer: %s (failure %d); tried again in %.1fs",
            self.owner,
            thread_id,
            what,
            failures,
            delay,
            exc_info=exc,
        )

    async def _timer_loop(self, interval: float) -> None:
        while not self._stopping.is_set():
            await self.fire_timers()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), interval)

    async def _sample_loop(self, interval: float) -> None:
        backend = self.runner.backend
        while not self._stopping.is_set():
            tracing = _tracing.active()
            if tracing is not None and backend is not None:
                try:
                    await tracing.sample(backend)
                except Exception:
                    logger.exception("flowy worker %r: reading the backlog failed", self.owner)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), interval)

    async def _recover(self, message: OutboxMessage) -> Outcome:
        try:
            await self.runner.recover_stale_handoff(
                message.intent.thread_id, stale_after=self.stale_after
            )
        except HandoffPendingError as exc:
            return await self._retry(message, "hand-off still pending", exc)
        except Exception as exc:  # noqa: BLE001 - retried, logged and stored on the message
            return await self._retry(message, "recovery failed", exc)
        self._recovered += 1
        return await self._ack(message, Outcome.RECOVERED)

    async def recover_once(self, limit: int = 100) -> int:
        """Recover stale pending and orphaned hand-offs (if this worker is the leader).

        Looks at up to ``limit`` threads with a hand-off and returns how many were
        re-enqueued. Without a lease manager on the runner it runs unconditionally
        (single-process deployments).
        """
        if not await self._lead():
            return 0
        cp = self.runner.checkpointer
        if cp is None:
            return 0
        recovered = 0
        statuses = {HandoffStatus.PENDING, HandoffStatus.ORPHANED}
        if self.reenqueue_enqueued_after is not None:
            statuses.add(HandoffStatus.ENQUEUED)
        threads = await cp.list_threads(handoff_statuses=frozenset(statuses), limit=limit)
        now = self.runner.clock()
        for summary in threads:
            force = False
            if summary.handoff_status is HandoffStatus.ENQUEUED:
                age = now - summary.updated_at
                if self.reenqueue_enqueued_after is None or age < self.reenqueue_enqueued_after:
                    continue
                force = True
            try:
                await self.runner.recover_stale_handoff(
                    summary.thread_id, stale_after=self.stale_after, force_reenqueue=force
                )
            except HandoffPendingError:
                continue
            except Exception:
                logger.exception("flowy worker: recovering thread %r failed", summary.thread_id)
                continue
            recovered += 1
        self._recovered += recovered
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

    async def _release_leader(self) -> None:
        lm = self.runner.lease_manager
        if self._leader is not None and lm is not None:
            with contextlib.suppress(Exception):  # it expires on its own anyway
                await lm.release(self._leader)
            self._leader = None

    async def _recovery_loop(self, interval: float) -> None:
        while not self._stopping.is_set():
            try:
                await self.recover_once()
            except Exception:
                logger.exception("flowy worker %r: recovery scan failed", self.owner)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), interval)
