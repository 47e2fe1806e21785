"""The worker's consuming part: claims hand-off messages, resumes their runs, acks.

Delivery is at-least-once, so every message starts with the resume decision on the
thread's head, read with the run's lease where the runner takes one (the resume then
reads nothing again): a token that is no longer the head of an enqueued hand-off means
the segment already ran, and the message is acknowledged without running anything. A
message is acknowledged only with or after the resumed run's last save (in that save's
own write where the store can, ``Capabilities.ack_on_save``); a crash before that means
redelivery. A signal to a waiting thread arrives as an outbox message like a hand-off.

A message that fails is released with its error after a backoff, or dead-lettered on
its last delivery (at once when no delivery can cure it, :data:`PERMANENT_ERRORS`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Generic, cast

from .. import _tracing
from .._cancel import is_canceled_from_outside, is_terminated
from .._errors import (
    ConcurrencyConflictError,
    HandoffPendingError,
    StorageUnavailableError,
    ThreadAlreadyRunningError,
    ThreadLeaseBusyError,
    ThreadNotFoundError,
)
from .._results import ResumeDecision, ResumeDecisionKind, RunResult
from .._segment import Held, held_run, running_here
from .._types import E, ResumeToken, S
from .._waits import wake
from ..storage import HandoffStatus, OutboxMessage, RunStatus
from ..storage._model import DEFAULT_QUEUE
from ._options import PERMANENT_ERRORS, Failure, Outcome
from ._shared import QueueConsumer, Shared

__all__ = ["Consume"]

logger = logging.getLogger("flowy.worker")


def _acks_in_save(shared: Shared[Any, Any]) -> bool:
    """Whether a resumed run's last save may acknowledge the worker's message: the
    runner's store can (``Capabilities.ack_on_save``) and the worker claims from that
    store's own consumer, directly or through wrappers (``inner``) that each take an
    ``acked_in_save(message)`` call for the acks they do not see."""
    backend = shared.runner.backend
    if backend is None or not backend.capabilities.ack_on_save:
        return False
    own = backend.consumer
    consumer: object = shared.consumer
    while consumer is not own:
        if not callable(getattr(consumer, "acked_in_save", None)):
            return False
        consumer = getattr(consumer, "inner", None)
        if consumer is None:
            return False
    return True


class Consume(Generic[S, E]):
    """Claims messages from one worker's consumer and sees each one through."""

    def __init__(self, shared: Shared[S, E]) -> None:
        self.shared = shared
        self._inflight: set[asyncio.Task[Outcome]] = set()
        self._held: dict[str, int] = dict.fromkeys(shared.options.queues, 0)
        """Messages of each served queue in flight here (``held`` of the next claim)."""
        self._turn = 0
        self._ack_in_save = _acks_in_save(shared)
        """The run's last save may acknowledge the message (``Capabilities.ack_on_save``):
        the consumer is the runner's store's own, or a wrapper of it that says it is
        told of such acks (``acked_in_save``)."""

    async def loop(self) -> None:
        """Claim and process messages, ``concurrency`` at a time across the served
        queues, until the worker stops (the runs in flight are left to :meth:`drain`)."""
        shared = self.shared
        concurrency, poll = shared.options.concurrency, shared.options.poll_interval
        while not shared.stopping.is_set():
            free = concurrency - len(self._inflight)
            if free <= 0:
                await asyncio.wait(self._inflight, return_when=asyncio.FIRST_COMPLETED)
                continue
            for queue, message in await self.claim_round(free, poll):
                self._held[queue] += 1
                task = asyncio.ensure_future(self.process(message))
                self._inflight.add(task)
                task.add_done_callback(self._inflight.discard)
                task.add_done_callback(lambda _, q=queue: self._let_go(q))

    def _let_go(self, queue: str) -> None:
        self._held[queue] -= 1

    async def claim_round(self, limit: int, wait: float) -> list[tuple[str, OutboxMessage]]:
        """Up to ``limit`` messages of the served queues, with the queue of each.

        Each round starts at the next queue in turn and claims from each in that order
        while there is room, so a queue with a backlog never starves the others. A
        round that finds none waits up to ``wait / len(queues)`` seconds on the queue
        whose turn it was, so each queue is looked at within about ``wait`` seconds
        (one queue: the claim itself waits ``wait``)."""
        queues = self.shared.options.queues
        first = self._turn % len(queues)
        self._turn = first + 1
        order = queues[first:] + queues[:first]
        if len(order) == 1:
            return [(order[0], m) for m in await self.claim(limit, wait, order[0])]
        out: list[tuple[str, OutboxMessage]] = []
        for queue in order:
            if len(out) >= limit:
                break
            out.extend((queue, m) for m in await self.claim(limit - len(out), 0.0, queue))
        if not out and wait > 0:
            queue = order[0]
            out.extend((queue, m) for m in await self.claim(limit, wait / len(order), queue))
        return out

    async def drain(self) -> None:
        """Wait for the runs in flight; if the calling task is being cancelled, cancel
        them instead (each saves its cancel snapshot and gives its message back)."""
        if self._inflight:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                for task in self._inflight:
                    task.cancel()
            # Cancelled while draining, the gather cancels them all the same.
            await asyncio.gather(*self._inflight, return_exceptions=True)

    async def claim(
        self, limit: int, wait: float, queue: str = DEFAULT_QUEUE
    ) -> list[OutboxMessage]:
        """Up to ``limit`` messages of ``queue``, waiting up to ``wait`` seconds; a
        failed claim is logged and gives none (after a pause, so a down store is not
        hammered)."""
        shared = self.shared
        consumer = shared.consumer
        try:
            if shared.keeps_queues:
                return await cast(QueueConsumer, consumer).claim(
                    limit,
                    shared.visibility_timeout,
                    wait,
                    queue=queue,
                    held=self._held.get(queue, 0),
                )
            return await consumer.claim(limit, shared.visibility_timeout, wait)
        except Exception as exc:  # noqa: BLE001 - logged; the next claim tries again
            shared.log_failure("claim failed", exc)
            await asyncio.sleep(min(wait, 1.0) or 0.1)
            return []

    async def process(self, message: OutboxMessage) -> Outcome:
        """Handle one claimed ``message`` (see ``Worker.process``)."""
        shared = self.shared
        thread_id = message.intent.thread_id
        lock = shared.lock(thread_id)
        try:
            async with lock:
                return await self._process(message)
        except asyncio.CancelledError:
            # Stopped mid-run (the run saved its cancel snapshot): give the message back
            # now, so the next delivery continues the thread without waiting out the
            # visibility timeout.
            with contextlib.suppress(Exception):
                await asyncio.shield(
                    shared.consumer.release(message, error="the worker stopped during the run")
                )
            raise
        finally:
            shared.unlock(thread_id, lock)

    async def _process(self, message: OutboxMessage) -> Outcome:
        intent = message.intent
        try:
            held, decision = await self._hold(intent.resume_token)
        except Exception as exc:  # noqa: BLE001 - retried, logged and stored on the message
            return await self._retry(message, "evaluate_resume failed", exc)
        try:
            return await self._decide(message, decision, held)
        finally:
            if held is not None:
                await self._give_back(held)

    async def _hold(self, token: ResumeToken) -> tuple[Held[S] | None, ResumeDecision]:
        """The decision on ``token``. Where the runner leases its runs, the worker takes
        the lease first and decides on the head it read with it (one round trip where the
        store reads the head with the lease), and the resume then reads nothing again
        (:class:`Held`); when another run holds the thread, or the runner takes no lease,
        the decision is read without one (``None``)."""
        shared = self.shared
        runner = shared.runner
        if runner.lease_manager is None:
            return None, await runner.evaluate_resume(token)
        prep = runner._prep  # pyright: ignore[reportPrivateUsage]
        try:
            return await prep.hold(token, (shared.owner, shared.options.lease_ttl))
        except ThreadLeaseBusyError:
            return None, await runner.evaluate_resume(token)

    async def _give_back(self, held: Held[S]) -> None:
        """Release ``held``'s lease unless the resume took it over (a failure is logged:
        the lease then runs out by itself)."""
        prep = self.shared.runner._prep  # pyright: ignore[reportPrivateUsage]
        try:
            await asyncio.shield(prep.let_go(held))
        except Exception as exc:  # noqa: BLE001 - the lease expires by itself
            self.shared.log_failure("releasing the lease failed", exc)

    async def _decide(
        self, message: OutboxMessage, decision: ResumeDecision, held: Held[S] | None
    ) -> Outcome:
        shared = self.shared
        intent = message.intent
        kind = decision.kind
        if kind is ResumeDecisionKind.NOT_FOUND:
            logger.info("flowy worker: thread %r is gone; dropping its message", intent.thread_id)
            return await self._ack(message, Outcome.GONE)
        if kind in (ResumeDecisionKind.HANDOFF_PENDING, ResumeDecisionKind.HANDOFF_ORPHANED):
            if held is not None:
                await self._give_back(held)  # recovery takes the thread's lease itself
            return await self._recover(message)
        if is_canceled_from_outside(decision.status, decision.reason) or is_terminated(
            decision.status, decision.reason
        ):
            logger.info(
                "flowy worker: thread %r was stopped from outside (%s); dropping its message",
                intent.thread_id,
                decision.reason,
            )
            return await self._ack(message, Outcome.CANCELED)
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
        resume_options = shared.options.resume_options
        extra = dict(resume_options(intent)) if resume_options else {}
        joined = _tracing.incoming.set(intent.trace or None)  # the run joins the hand-off's trace
        if held is not None and self._ack_in_save:
            held.message = message  # the run's last save acknowledges it where it can
        handed = held_run.set(held)  # the resume goes on with the lease and head held here
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
            held_run.reset(handed)
            _tracing.incoming.reset(joined)
        shared.report(intent, result)
        if held is not None and held.acked:  # the run's last save acknowledged it
            told = getattr(shared.consumer, "acked_in_save", None)
            if told is not None:
                told(message)
            return self._count(Outcome.RESUMED)
        if result.status is RunStatus.FAILED and not await shared.failure_saved(result):
            # The run stopped without saving its end (the lease was lost, the store
            # failed…): the thread is still mid-run, so the message must come back.
            return await self._retry(message, f"run failed ({result.reason})", result.error)
        return await self._ack(message, Outcome.RESUMED)

    async def _resume_when_free(self, token: ResumeToken, extra: dict[str, Any]) -> RunResult[S, E]:
        """``runner.resume(token)``, tried again for up to ``busy_grace`` seconds while
        another run holds the thread: the run that handed off usually lets go of it a
        moment after its hand-off committed."""
        shared = self.shared
        runner = shared.runner
        options = shared.options
        lease = (shared.owner, options.lease_ttl) if runner.lease_manager is not None else None
        deadline = asyncio.get_running_loop().time() + options.busy_grace
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
        shared = self.shared
        leases = shared.runner.lease_manager
        if leases is None:
            return False
        try:
            holder = await leases.holder(thread_id)
            store = shared.runner._store_key  # pyright: ignore[reportPrivateUsage]
            if holder is None or holder.owner != shared.owner or running_here((store, thread_id)):
                return False
            await leases.release(holder)
        except Exception:  # noqa: BLE001 - then it is busy as before: wait for it to expire
            return False
        logger.info(
            "flowy worker %r: released its own lease on thread %r, left by a run that "
            "lost its store mid-call",
            shared.owner,
            thread_id,
        )
        return True

    async def _lease_remaining(self, thread_id: str) -> float:
        """Seconds until the lease now holding ``thread_id`` runs out unless renewed
        (0 if it is gone or unknown), at most twice this worker's lease TTL."""
        shared = self.shared
        leases = shared.runner.lease_manager
        if leases is None:
            return 0.0
        try:
            holder = await leases.holder(thread_id)
        except Exception:  # noqa: BLE001 - only a delay estimate: fall back to the backoff
            return 0.0
        if holder is None:
            return 0.0
        return max(0.0, min(holder.expires_at - time.time(), 2 * shared.options.lease_ttl))

    async def _wait_is_over(self, thread_id: str) -> bool:
        """Whether the waiting head of ``thread_id`` has its signal or is past its
        deadline (a resume now would not be an early one)."""
        runner = self.shared.runner
        head, _ = await runner.head(thread_id)
        if head.status is not RunStatus.WAITING:
            return False
        woke = await wake(runner.checkpointer, runner.graph, head, runner.clock())
        return woke.signal is not None or woke.timed_out

    async def _recover(self, message: OutboxMessage) -> Outcome:
        shared = self.shared
        try:
            await shared.runner.recover_stale_handoff(
                message.intent.thread_id, stale_after=shared.options.stale_after
            )
        except HandoffPendingError as exc:
            return await self._retry(message, "hand-off still pending", exc)
        except Exception as exc:  # noqa: BLE001 - retried, logged and stored on the message
            return await self._retry(message, "recovery failed", exc)
        shared.recovered += 1
        return await self._ack(message, Outcome.RECOVERED)

    def _count(self, outcome: Outcome) -> Outcome:
        self.shared.outcomes[outcome.value] += 1
        return outcome

    async def _ack(self, message: OutboxMessage, outcome: Outcome) -> Outcome:
        consumer = self.shared.consumer
        await self._settle("acknowledging", message, lambda: consumer.ack(message))
        return self._count(outcome)

    async def _settle(
        self, what: str, message: OutboxMessage, call: Callable[[], Awaitable[None]]
    ) -> None:
        """``call()`` (the ack or release of ``message``), tried again with a backoff while
        the store is unavailable, for as long as the message stays hidden: once the store
        answers again it goes through, instead of the message waiting out its visibility
        timeout. Any other failure is raised at once."""
        owner = self.shared.owner
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.shared.visibility_timeout
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
                        owner,
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
                    owner,
                    what,
                    message.intent.thread_id,
                    failures,
                )
            return

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
        shared = self.shared
        consumer = shared.consumer
        error = f"{what}: {type(exc).__name__}: {exc}" if exc is not None else what
        permanent = isinstance(exc, PERMANENT_ERRORS)
        dead = permanent or message.attempts >= consumer.max_attempts
        delay = 0.0 if dead else max(shared.options.backoff(message.attempts), at_least)
        thread = message.intent.thread_id
        level = logging.ERROR if dead else logging.WARNING
        logger.log(
            level,
            "flowy worker %r: thread %r (delivery %d of %d) %s: %s",
            shared.owner,
            thread,
            message.attempts,
            consumer.max_attempts,
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
                    lambda: consumer.release(message, error=error, dead=True),
                )
            else:
                await self._settle(
                    "releasing",
                    message,
                    lambda: consumer.release(message, error=error, delay=delay),
                )
        except Exception:
            logger.exception("flowy worker %r: releasing thread %r failed", shared.owner, thread)
        self._notify(Failure(message, error, exc, dead, delay))
        if dead and (tracing := _tracing.active()) is not None:
            tracing.dead_letter(thread)
        return self._count(Outcome.DEAD_LETTERED if dead else Outcome.RETRY)

    def _notify(self, failure: Failure) -> None:
        on_failure = self.shared.options.on_failure
        if on_failure is None:
            return
        try:
            on_failure(failure)
        except Exception:
            logger.exception("flowy worker %r: on_failure raised", self.shared.owner)
