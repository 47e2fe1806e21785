"""The bases of an outbox and its consumer: everything but the atomic primitives.

:class:`BaseOutbox` turns intents into rows; :class:`BaseConsumer` owns the claim loop
(waiting, decoding, burying poison messages and messages delivered too often), ack,
release with a delay, the dead letters and the checks of the backlog a store reports
(``stats``). A store implements the ``_``-prefixed primitives; see ``docs/adapters.md``.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass

from .._errors import StorageError
from ._checks import check_count, check_seconds
from ._intents import decode_intent
from ._model import (
    DEFAULT_QUEUE,
    DeadLetter,
    HandoffIntent,
    OutboxMessage,
    OutboxStats,
    validate_queue_name,
)
from ._queues import QueueCounts, QueueLimits
from ._writes import OutboxRow, OutboxTransaction

__all__ = ["MAX_ERROR_CHARS", "BaseConsumer", "BaseOutbox", "RawMessage", "message_row_id"]

MAX_ERROR_CHARS = 4000
"""The longest error text kept on a message."""

_LISTEN_POLL = 1.0  # seconds between looks while listening, in case a notification is lost
_RETRY_LISTEN = 5.0  # seconds of polling after listening failed, before trying it again
_log = logging.getLogger("flowy.storage")

Stop = Callable[[], Awaitable[None]]
"""What :meth:`BaseConsumer._listen` returns: stops the listening."""


@dataclass(frozen=True, slots=True)
class RawMessage:
    """A stored message as a consumer primitive returns it (payload not yet decoded).

    ``attempts`` counts deliveries, this one included for a claim; ``error`` is the last
    error recorded on it.
    """

    message_id: str
    """The store's id of the message."""
    payload: bytes
    """The stored intent bytes."""
    attempts: int
    error: str = ""


def message_row_id(message_id: str) -> int | None:
    """The row id a message id names, for a store whose message ids are the decimal
    ids of its outbox rows: ``None`` (no such message) unless ``message_id`` is one as
    such a store spells them (no sign, no leading zero, no blank, 1 to 2**63 - 1)."""
    if not (message_id.isascii() and message_id.isdigit() and len(message_id) <= 19):
        return None
    row_id = int(message_id)
    return row_id if 0 < row_id < 2**63 and str(row_id) == message_id else None


def _clip(error: str) -> str:
    return error if len(error) <= MAX_ERROR_CHARS else error[: MAX_ERROR_CHARS - 1] + "…"


class BaseOutbox(abc.ABC):
    """The producing side of an outbox over one primitive, transactional with the
    checkpointer of the same store (same ``domain``)."""

    domain: Hashable = None

    @abc.abstractmethod
    async def _append(self, row: OutboxRow) -> None:
        """Durably add ``row`` (in ``row.route``'s queue, for a store that keeps
        queues) unless a message of the same (thread, committed revision) exists: a
        live one is left exactly as it is (payload, claims, attempts and all); a
        dead-lettered one comes back to life under its message id and route, with
        ``row``'s payload, its attempts and error reset, visible now."""

    async def enqueue_intent(self, intent: HandoffIntent) -> None:
        """Durably enqueue ``intent`` (``Outbox.enqueue_intent``)."""
        if not isinstance(intent, HandoffIntent):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"expected a flowy.storage.HandoffIntent, got {type(intent).__name__}")
        await self._append(OutboxRow.of(intent))

    async def enqueue_intent_tx(self, tx: object, intent: HandoffIntent) -> None:
        """Enqueue ``intent`` in the ``save_with_outbox`` transaction ``tx``."""
        if not isinstance(tx, OutboxTransaction):
            raise TypeError(
                f"{type(self).__name__}.enqueue_intent_tx needs the handle that "
                f"save_with_outbox passes to its callback, got {type(tx).__name__}"
            )
        if not isinstance(intent, HandoffIntent):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"expected a flowy.storage.HandoffIntent, got {type(intent).__name__}")
        tx.add(self.domain, OutboxRow.of(intent))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class BaseConsumer(abc.ABC):
    """The consuming side of an outbox over six primitives, and ``_stats``.

    ``max_attempts`` deliveries without an ack dead-letter a message; ``poll_interval``
    is how often ``claim(wait=...)`` looks again when the store has no wake-up of its own.
    """

    domain: Hashable = None
    _stop_listening: Stop | None = None
    _notified: int = 0

    def __init__(self, *, max_attempts: int = 5, poll_interval: float = 0.05) -> None:
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"max_attempts must be an int, got {max_attempts!r}")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts!r}")
        self.max_attempts: int = max_attempts
        self.poll_interval: float = check_seconds(poll_interval, "poll_interval")
        self._stop_listening: Stop | None = None
        self._notified = 0  # notifications (and losses of the listening) seen so far
        self._news = asyncio.Event()
        self._listen_lock = asyncio.Lock()
        self._listen_failed_at = -math.inf

    # -- the primitives a store implements ---------------------------------------------
    @abc.abstractmethod
    async def _claim(self, limit: int, visibility_timeout: float) -> list[RawMessage]:
        """Atomically take up to ``limit`` (> 0) visible live messages, oldest first:
        count one more delivery on each and hide it for ``visibility_timeout`` seconds.
        Two consumers never take the same message while it is hidden. A store that
        keeps queues takes those of the default queue only (see ``_claim_queue``)."""

    @abc.abstractmethod
    async def _ack(self, message_id: str) -> None:
        """Delete that live message, and no other: never a dead letter of that id (an
        unknown id is no error)."""

    @abc.abstractmethod
    async def _release(self, message_id: str, *, error: str, delay: float, dead: bool) -> None:
        """Record ``error`` on that live message and make it visible again after
        ``delay`` seconds (no longer in flight, for a store that keeps queues); with
        ``dead``, move it to the dead letters instead. A dead letter of that id is left
        exactly as it is."""

    @abc.abstractmethod
    async def _dead_letters(self, limit: int) -> list[RawMessage]:
        """Up to ``limit`` (> 0) dead-lettered messages, oldest first."""

    @abc.abstractmethod
    async def _retry_dead_letter(self, message_id: str) -> bool:
        """Move that dead letter back to the live messages under the same id and route,
        visible now, attempts and error reset; ``False`` if there is no such dead
        letter."""

    async def _wait(self, seconds: float) -> None:
        """Wait up to ``seconds`` for new messages (default: a poll interval's sleep).
        Not called for a store that implements :meth:`_listen`."""
        await asyncio.sleep(min(seconds, self.poll_interval))

    # A store with notifications of new messages (PostgreSQL's LISTEN) implements these.
    async def _listen(self) -> Stop | None:
        """Start listening for the store's notifications of new messages: call
        :meth:`_notify` on each one, and :meth:`_listen_lost` should the listening end
        on its own (a lost connection). Return the coroutine function that stops it, or
        ``None`` when this consumer does not listen; on failure, leave nothing set up
        and raise (the consumer polls, and tries again after a few seconds).

        A waiting claim starts listening at its first wait, then waits for a
        notification, looking again every second in case one is lost, and when
        :meth:`_next_visible` says a hidden message becomes visible."""
        return None

    async def _next_visible(self) -> float | None:
        """Seconds until the next hidden live message becomes visible, if any (read
        by a waiting claim of a store that implements :meth:`_listen`)."""
        return None

    def _notify(self, *_: object) -> None:
        """Wake the claims waiting for news (a notification arrived)."""
        self._notified += 1
        event, self._news = self._news, asyncio.Event()
        event.set()

    def _listen_lost(self, *_: object) -> None:
        """The listening ended on its own: waiting claims poll until it starts again."""
        self._stop_listening = None
        self._notify()

    @property
    def listening(self) -> bool:
        """True while the consumer listens for notifications (waiting claims wake on
        them rather than poll)."""
        return self._stop_listening is not None

    async def _start_listening(self) -> bool:
        """Listen unless listening already, or it failed a moment ago; True if it now
        listens (a failure is logged: the consumer polls instead)."""
        loop = asyncio.get_running_loop()
        if loop.time() - self._listen_failed_at < _RETRY_LISTEN:
            return False
        async with self._listen_lock:
            if self.listening:
                return False
            try:
                stop = await self._listen()
            except Exception as exc:  # noqa: BLE001 - polling is the fallback
                self._listen_failed_at = loop.time()
                _log.warning("%s cannot listen (%r); polling instead", type(self).__name__, exc)
                return False
            if stop is None:  # this consumer does not listen
                self._listen_failed_at = math.inf
                return False
            self._stop_listening = stop
            return True

    async def _wait_for_news(self, seconds: float, seen: int | None) -> None:
        """Wait up to ``seconds`` for new messages; ``seen`` is the notification count
        before the claim that found none (``None`` if not listening then)."""
        if type(self)._listen is BaseConsumer._listen:  # the store sends no notifications
            await self._wait(seconds)
            return
        if seen is None and await self._start_listening():
            return  # listening from now on: look once more, then wait for news
        listening = seen is not None and self.listening
        pause = min(seconds, _LISTEN_POLL if listening else self.poll_interval)
        due = await self._next_visible()
        if due is not None:  # a hidden message becomes visible then
            pause = min(pause, max(due, 0.0) + 0.005)
        if not listening:
            await asyncio.sleep(pause)
        elif self._notified == seen:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._news.wait(), pause)

    async def aclose(self) -> None:
        """Stop listening (a backend closes its consumer). Idempotent."""
        self._listen_failed_at = math.inf  # never listen again
        async with self._listen_lock:
            stop, self._stop_listening = self._stop_listening, None
            if stop is not None:
                await stop()
        self._notify()

    # -- queues (optional): a store that keeps them implements all five -------------------
    async def _claim_queue(
        self, queue: str, limit: int, visibility_timeout: float, held: int
    ) -> list[RawMessage]:
        """Take messages of ``queue`` as :meth:`_claim` does, within its stored limits.

        In ONE atomic operation, by the store's clock ``now``:

        - ``n`` = ``limit`` (> 0), at most ``worker_concurrency - held`` (``held``: how
          many of the queue's messages this consumer has in flight), at most
          ``global_concurrency`` minus the queue's messages in flight, and at most
          ``rate_limit`` minus the queue's starts in ``(now - rate_period, now]``;
        - then the queue's visible live messages in claim order (``priority``
          ascending, then enqueue order), skipping each whose partition (a non-empty
          ``partition_key``) is at ``partition_concurrency`` in flight or at
          ``partition_rate_limit`` starts in the window (counting what this claim took),
          until ``n`` are taken. A full partition never hides the messages behind it.
        - Each taken message: one more delivery, hidden and in flight until
          ``now + visibility_timeout``; while the queue has a rate limit, a start
          (queue, partition, ``now``) is recorded.

        A message is in flight from its claim until :meth:`_ack`, :meth:`_release` or
        the end of its visibility timeout. Messages of other queues are never taken."""
        raise NotImplementedError(
            f"{type(self).__name__} keeps no queues (_claim_queue); it claims from the "
            "default queue only"
        )

    async def _set_limits(self, queue: str, limits: QueueLimits | None) -> None:
        """Store ``limits`` as ``queue``'s (replacing any), or forget them (``None``)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no queues (_set_limits)")

    async def _read_limits(self) -> dict[str, QueueLimits]:
        """The stored limits of every queue that has some."""
        raise NotImplementedError(f"{type(self).__name__} keeps no queues (_read_limits)")

    async def _queue_counts(self) -> dict[str, QueueCounts]:
        """The counts of every queue with live messages or recorded starts (see
        :class:`QueueCounts`), from one consistent read where the store can."""
        raise NotImplementedError(f"{type(self).__name__} keeps no queues (_queue_counts)")

    async def _queue_messages(self, queue: str, limit: int) -> list[RawMessage]:
        """Up to ``limit`` (> 0) live messages of ``queue`` in claim order, unchanged
        (in flight or not)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no queues (_queue_messages)")

    # Every store of flowy-core and its adapters implements it; a store written for
    # flowy 0.2.0 that does not still delivers messages, and says what is missing when
    # its backlog is read.
    async def _stats(self) -> OutboxStats:
        """The outbox's backlog, from one consistent read where the store can: how many
        live messages there are (claimed or not, released with a delay or not), when the
        oldest of them was enqueued (by the store's clock; a dead letter that came back
        counts from its return; ``None`` when there is none), and how many dead letters.
        Count from the store's indexes or counters where it has them."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot report its backlog: its store does not "
            "implement _stats (docs/adapters.md)"
        )

    # -- the protocol ----------------------------------------------------------------------
    @property
    def keeps_queues(self) -> bool:
        """True if the store keeps queues (implements the queue primitives)."""
        return type(self)._claim_queue is not BaseConsumer._claim_queue

    async def claim(
        self,
        limit: int,
        visibility_timeout: float,
        wait: float = 0.0,
        *,
        queue: str = DEFAULT_QUEUE,
        held: int = 0,
    ) -> list[OutboxMessage]:
        """Claim up to ``limit`` messages of ``queue``, hidden for ``visibility_timeout``
        seconds, waiting up to ``wait`` seconds for one (``OutboxConsumer.claim``),
        within the queue's limits; ``held``: how many of the queue's messages the
        caller has in flight (counted against ``worker_concurrency``).

        Raises:
            ValueError: a bad queue name, or a queue other than the default one on a
                store that keeps no queues.
        """
        check_count(limit, "limit")
        hide = check_seconds(visibility_timeout, "visibility_timeout")
        wait = check_seconds(wait, "wait", allow_zero=True)
        validate_queue_name(queue)
        check_count(held, "held")
        queues = self.keeps_queues
        if not queues and queue != DEFAULT_QUEUE:
            raise ValueError(
                f"{type(self).__name__} keeps no queues: it claims from the default queue "
                f"only, not {queue!r}"
            )
        if limit == 0:
            return []
        deadline = time.monotonic() + wait
        while True:
            # A notification that arrives between this claim and the wait counts.
            seen = self._notified if self.listening else None
            if queues:
                raws = await self._claim_queue(queue, limit, hide, held)
            else:
                raws = await self._claim(limit, hide)
            out: list[OutboxMessage] = []
            for raw in raws:
                message = await self._accept(raw)
                if message is not None:
                    out.append(message)
            remaining = deadline - time.monotonic()
            if out or remaining <= 0:
                return out
            if not raws:
                await self._wait_for_news(remaining, seen)

    async def _accept(self, raw: RawMessage) -> OutboxMessage | None:
        """The message to deliver, or ``None`` after burying it (poison or over-delivered)."""
        if raw.attempts > self.max_attempts:
            await self._release(
                raw.message_id,
                error=raw.error or f"not acked after {self.max_attempts} deliveries",
                delay=0.0,
                dead=True,
            )
            return None
        try:
            intent = decode_intent(raw.payload)
        except ValueError as exc:
            await self._release(
                raw.message_id, error=_clip(f"undecodable payload: {exc}"), delay=0.0, dead=True
            )
            return None
        return OutboxMessage(raw.message_id, intent, raw.attempts, raw.error)

    async def ack(self, message: OutboxMessage) -> None:
        """Remove the delivered ``message`` for good."""
        await self._ack(self._message_id(message))

    async def release(
        self, message: OutboxMessage, *, error: str = "", delay: float = 0.0, dead: bool = False
    ) -> None:
        """Give ``message`` back for another delivery after ``delay`` seconds, recording
        ``error``; dead-letter it once it was delivered ``max_attempts`` times, or at once
        with ``dead`` (a failure no delivery can cure)."""
        message_id = self._message_id(message)
        if not isinstance(error, str):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"error must be a str, got {type(error).__name__}")
        seconds = check_seconds(delay, "delay", allow_zero=True)
        await self._release(
            message_id,
            error=_clip(error),
            delay=seconds,
            dead=dead or message.attempts >= self.max_attempts,
        )

    async def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """Up to ``limit`` dead-lettered messages, oldest first, undecodable ones
        included."""
        if check_count(limit, "limit") == 0:
            return []
        out: list[DeadLetter] = []
        for raw in await self._dead_letters(limit):
            try:
                intent: HandoffIntent | None = decode_intent(raw.payload)
            except ValueError:
                intent = None
            out.append(DeadLetter(raw.message_id, intent, raw.attempts, raw.error, raw.payload))
        return out

    async def stats(self) -> OutboxStats:
        """The backlog: messages pending delivery, when the oldest was enqueued, and the
        dead letters held (what ``flowy.otel``'s gauges report).

        Raises:
            StorageError: the store reported an impossible backlog (a negative count, or
                pending messages without an enqueue time).
        """
        stats = await self._stats()
        pending, oldest, dead = stats.pending, stats.oldest_pending_at, stats.dead_letters
        where = f"{type(self).__name__}._stats reported"
        if pending < 0 or dead < 0:
            raise StorageError(f"{where} {pending} pending messages and {dead} dead letters")
        if (oldest is None) != (pending == 0):
            raise StorageError(
                f"{where} {pending} pending messages, the oldest enqueued at {oldest!r}: "
                "an enqueue time goes with pending messages, and only with them"
            )
        if oldest is not None and not math.isfinite(oldest):
            raise StorageError(f"{where} an oldest enqueue time of {oldest!r}")
        return stats

    async def retry_dead_letter(self, message_id: str) -> None:
        """Move the dead letter ``message_id`` back to the outbox with its attempts reset;
        ``KeyError`` if there is none with that id."""
        if not isinstance(message_id, str):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"message_id must be a str, got {type(message_id).__name__}")
        if not message_id or not await self._retry_dead_letter(message_id):
            raise KeyError(f"no dead letter with id {message_id!r}")

    @staticmethod
    def _message_id(message: object) -> str:
        if not isinstance(message, OutboxMessage):
            raise TypeError(f"expected a flowy.storage.OutboxMessage, got {type(message).__name__}")
        return message.message_id

    def __repr__(self) -> str:
        return f"{type(self).__name__}(max_attempts={self.max_attempts})"
