"""Outbox contract tests: delivery, visibility timeout, ack, release, dead letters and
waiting claims; and the transactional path (``save_with_outbox`` + ``enqueue_intent_tx``)
that commits a snapshot and its hand-off intent together or not at all.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, ClassVar

import pytest

from ..._errors import ConcurrencyConflictError
from ...storage import (
    Backend,
    HandoffIntent,
    HandoffStatus,
    OutboxConsumer,
    OutboxMessage,
    ResumeToken,
)
from ...storage.dialect import BaseOutbox, OutboxRow, decode_intent, encode_intent
from ._support import (
    Suite,
    fixed_time,
    history_revisions,
    make_intent,
    make_snapshot,
    max_attempts_of,
    new_thread_id,
    peer_of,
    require_consumer,
    require_transactional,
    saved_chain,
    try_load,
)

__all__ = ["OutboxSuite", "TransactionalOutboxSuite"]

POISON: tuple[bytes, ...] = (
    b"not json at all",
    b"[" * 100_000,  # nested past any recursion limit
    b'{"v": 1, "thread_id": "t", "pending": 1' + b"9" * 5000 + b"}",  # a huge integer
    '{"v": 1, "thread_id": "\udcff"}'.encode("utf-8", "surrogatepass"),
    b'{"v": 2}',
)
"""Stored payloads no intent decodes from: a consumer must bury them, never stall."""


def _rich_intent(thread_id: str) -> HandoffIntent:
    """An intent whose fields all differ from one another and from the defaults."""
    return HandoffIntent(
        thread_id=thread_id,
        pending_snapshot_revision=3,
        committed_snapshot_revision=4,
        snapshot_revision=4,
        resume_token=ResumeToken(thread_id, 4),
        handoff_status=HandoffStatus.ENQUEUED,
        reason='handoff: review ✋ "quoted"',
        execution_pointer="review:β",
        created_at=fixed_time,
    )


async def _claim_one(consumer: OutboxConsumer, visibility_timeout: float) -> OutboxMessage:
    messages = await consumer.claim(10, visibility_timeout)
    assert len(messages) == 1, f"expected one message, claimed {messages!r}"
    return messages[0]


class OutboxSuite(Suite):
    """``enqueue_intent`` and the consumer: at-least-once delivery with dead letters."""

    requires: ClassVar[tuple[str, ...]] = ("handoff_outbox", "consumer")

    async def test_claim_returns_the_intent(self, flowy_backend: Backend[Any]) -> None:
        outbox, consumer = require_consumer(flowy_backend)
        intent = _rich_intent(new_thread_id("intent"))
        assert decode_intent(encode_intent(intent)) == intent
        await outbox.enqueue_intent(intent)
        message = await _claim_one(consumer, self.long_ttl)
        assert message.intent == intent
        assert message.attempts == 1
        assert message.message_id

    async def test_claim_of_an_empty_outbox(self, flowy_backend: Backend[Any]) -> None:
        _, consumer = require_consumer(flowy_backend)
        assert await consumer.claim(10, self.long_ttl) == []

    async def test_claimed_message_is_hidden(self, flowy_backend: Backend[Any]) -> None:
        outbox, consumer = require_consumer(flowy_backend)
        await outbox.enqueue_intent(make_intent(new_thread_id("hidden"), 1))
        await _claim_one(consumer, self.long_ttl)
        assert await consumer.claim(10, self.long_ttl) == []

    async def test_unacked_message_is_redelivered(self, flowy_backend: Backend[Any]) -> None:
        outbox, consumer = require_consumer(flowy_backend)
        intent = make_intent(new_thread_id("redeliver"), 2)
        await outbox.enqueue_intent(intent)
        first = await _claim_one(consumer, self.short_ttl)
        assert await consumer.claim(10, self.short_ttl) == []
        await self.expire()
        second = await _claim_one(consumer, self.long_ttl)
        assert second.message_id == first.message_id
        assert second.intent == intent
        assert second.attempts == 2

    async def test_ack_removes_for_good(self, flowy_backend: Backend[Any]) -> None:
        outbox, consumer = require_consumer(flowy_backend)
        await outbox.enqueue_intent(make_intent(new_thread_id("ack"), 1))
        message = await _claim_one(consumer, self.short_ttl)
        await consumer.ack(message)
        await self.expire()
        assert await consumer.claim(10, self.long_ttl) == []
        assert await consumer.dead_letters() == []

    async def test_release_makes_it_claimable_at_once(self, flowy_backend: Backend[Any]) -> None:
        outbox, consumer = require_consumer(flowy_backend)
        intent = make_intent(new_thread_id("release"), 1)
        await outbox.enqueue_intent(intent)
        if max_attempts_of(consumer) < 2:
            pytest.skip("the consumer dead-letters after one delivery (max_attempts == 1)")
        first = await _claim_one(consumer, self.long_ttl)
        await consumer.release(first, error="try again")
        second = await _claim_one(consumer, self.long_ttl)
        assert second.message_id == first.message_id
        assert second.intent == intent
        assert second.attempts == 2

    async def test_released_max_attempts_times_is_dead_lettered(
        self, flowy_backend: Backend[Any]
    ) -> None:
        outbox, consumer = require_consumer(flowy_backend)
        max_attempts = max_attempts_of(consumer)
        intent = make_intent(new_thread_id("dead"), 1)
        await outbox.enqueue_intent(intent)
        message_id = ""
        for attempt in range(1, max_attempts + 1):
            message = await _claim_one(consumer, self.long_ttl)
            assert message.attempts == attempt
            message_id = message.message_id
            assert await consumer.dead_letters() == []
            await consumer.release(message, error=f"failure {attempt}")
        assert await consumer.claim(10, self.long_ttl) == []
        [dead] = await consumer.dead_letters()
        assert dead.message_id == message_id
        assert dead.intent == intent
        assert dead.attempts == max_attempts

    async def test_timed_out_max_attempts_times_is_dead_lettered(
        self, flowy_backend: Backend[Any]
    ) -> None:
        outbox, consumer = require_consumer(flowy_backend)
        max_attempts = max_attempts_of(consumer)
        intent = make_intent(new_thread_id("dead-timeout"), 1)
        await outbox.enqueue_intent(intent)
        for _ in range(max_attempts - 1):
            await consumer.release(await _claim_one(consumer, self.long_ttl))
        last = await _claim_one(consumer, self.short_ttl)
        assert last.attempts == max_attempts
        await self.expire()
        assert await consumer.claim(10, self.long_ttl) == []
        [dead] = await consumer.dead_letters()
        assert (dead.message_id, dead.intent) == (last.message_id, intent)

    async def test_retry_dead_letter_resets_attempts(self, flowy_backend: Backend[Any]) -> None:
        outbox, consumer = require_consumer(flowy_backend)
        max_attempts = max_attempts_of(consumer)
        intent = make_intent(new_thread_id("retry"), 1)
        await outbox.enqueue_intent(intent)
        for _ in range(max_attempts):
            await consumer.release(await _claim_one(consumer, self.long_ttl), error="boom")
        [dead] = await consumer.dead_letters()
        await consumer.retry_dead_letter(dead.message_id)
        assert await consumer.dead_letters() == []
        again = await _claim_one(consumer, self.long_ttl)
        assert again.message_id == dead.message_id
        assert again.intent == intent
        assert again.attempts == 1
        await consumer.ack(again)
        assert await consumer.claim(10, self.long_ttl) == []

    async def test_retry_of_unknown_dead_letter_raises_key_error(
        self, flowy_backend: Backend[Any]
    ) -> None:
        outbox, consumer = require_consumer(flowy_backend)
        await outbox.enqueue_intent(make_intent(new_thread_id("not-dead"), 1))
        live = await _claim_one(consumer, self.long_ttl)
        await outbox.enqueue_intent(make_intent(new_thread_id("acked"), 1))
        acked = await _claim_one(consumer, self.long_ttl)
        await consumer.ack(acked)
        for message_id in ("no-such-message", live.message_id, acked.message_id):
            with pytest.raises(KeyError):
                await consumer.retry_dead_letter(message_id)
        # A failed retry changed nothing: the live message is still hidden.
        assert await consumer.claim(10, self.long_ttl) == []

    async def test_unknown_message_ids_are_left_alone(self, flowy_backend: Backend[Any]) -> None:
        """``ack``/``release`` of an id the store never issued (forged, out of range,
        another store's) does nothing; ``retry_dead_letter`` of one is a ``KeyError``."""
        outbox, consumer = require_consumer(flowy_backend)
        intent = make_intent(new_thread_id("live"), 1)
        await outbox.enqueue_intent(intent)
        live = await _claim_one(consumer, self.long_ttl)
        forged_ids = (
            "no-such-message",
            "9" * 40,  # past any 64-bit counter
            "-1",
            "0",
            f"0{live.message_id}",  # the live id, not in its canonical spelling
            f"{live.message_id} ",
            "1-0",
            "\x00",
        )
        for message_id in forged_ids:
            if message_id == live.message_id:
                continue
            forged = OutboxMessage(message_id, intent, 1)
            await consumer.ack(forged)
            await consumer.release(forged, error="forged")
            with pytest.raises(KeyError):
                await consumer.retry_dead_letter(message_id)
        # The live message is untouched: still hidden, then delivered again after release.
        assert await consumer.claim(10, self.long_ttl) == []
        if max_attempts_of(consumer) >= 2:
            await consumer.release(live)
            again = await _claim_one(consumer, self.long_ttl)
            assert (again.message_id, again.attempts) == (live.message_id, 2)

    async def test_ack_removes_only_that_message(self, flowy_backend: Backend[Any]) -> None:
        outbox, consumer = require_consumer(flowy_backend)
        tid = new_thread_id("ack-one")
        await outbox.enqueue_intent(make_intent(tid, 1))
        await outbox.enqueue_intent(make_intent(tid, 2))
        first, second = sorted(
            await consumer.claim(10, self.short_ttl), key=lambda m: m.intent.snapshot_revision
        )
        await consumer.ack(first)
        await self.expire()
        [again] = await consumer.claim(10, self.long_ttl)
        assert again.message_id == second.message_id and again.intent == make_intent(tid, 2)

    async def test_enqueue_again_leaves_a_live_message_as_it_is(
        self, flowy_backend: Backend[Any]
    ) -> None:
        outbox, consumer = require_consumer(flowy_backend)
        intent = make_intent(new_thread_id("re-enqueue"), 1)
        await outbox.enqueue_intent(intent)
        claimed = await _claim_one(consumer, self.short_ttl)
        await outbox.enqueue_intent(intent)  # a duplicate hand-off of the same revision
        assert await consumer.claim(10, self.long_ttl) == []  # still hidden by the claim
        await self.expire()
        again = await _claim_one(consumer, self.long_ttl)
        assert (again.message_id, again.attempts) == (claimed.message_id, 2)

    async def test_enqueue_again_revives_only_a_dead_letter(
        self, flowy_backend: Backend[Any]
    ) -> None:
        """A row written again for the same (thread, revision) leaves a live message as
        it is, payload included; a dead letter comes back under its message id, with the
        new payload, its attempts and error reset."""
        outbox, consumer = require_consumer(flowy_backend)
        tid = new_thread_id("revive")
        first, later = make_intent(tid, 1, reason="first"), make_intent(tid, 1, reason="later")
        await outbox.enqueue_intent(first)
        await outbox.enqueue_intent(later)  # live, not yet claimed
        message = await _claim_one(consumer, self.long_ttl)
        assert (message.intent, message.attempts) == (first, 1)
        await outbox.enqueue_intent(later)  # live and claimed
        assert await consumer.claim(10, self.long_ttl) == []
        for attempt in range(1, max_attempts_of(consumer)):
            await consumer.release(message, error=f"RuntimeError: attempt {attempt}")
            message = await _claim_one(consumer, self.long_ttl)
            assert (message.intent, message.attempts) == (first, attempt + 1)
        await consumer.release(message, error="RuntimeError: last")
        [dead] = await consumer.dead_letters()
        assert dead.intent == first
        await outbox.enqueue_intent(later)
        assert await consumer.dead_letters() == []
        back = await _claim_one(consumer, self.long_ttl)
        assert (back.intent, back.attempts, back.last_error) == (later, 1, "")
        assert back.message_id == dead.message_id

    async def test_an_ack_never_removes_a_dead_letter(self, flowy_backend: Backend[Any]) -> None:
        """An ack that comes after its message was dead-lettered (a late worker) deletes
        nothing: the dead letter stays, and can be retried."""
        outbox, consumer = require_consumer(flowy_backend)
        intent = make_intent(new_thread_id("late-ack"), 1)
        await outbox.enqueue_intent(intent)
        message = await _claim_one(consumer, self.long_ttl)
        for _ in range(max_attempts_of(consumer) - 1):
            await consumer.release(message, error="RuntimeError: gateway down")
            message = await _claim_one(consumer, self.long_ttl)
        await consumer.release(message, error="RuntimeError: gateway down")
        before = await consumer.dead_letters()
        assert [d.message_id for d in before] == [message.message_id]
        await consumer.ack(message)
        assert await consumer.dead_letters() == before
        await consumer.retry_dead_letter(message.message_id)
        again = await _claim_one(consumer, self.long_ttl)
        assert (again.message_id, again.intent) == (message.message_id, intent)

    async def test_a_release_of_a_dead_letter_changes_nothing(
        self, flowy_backend: Backend[Any]
    ) -> None:
        """A release that comes after its message was dead-lettered (a late worker, with
        a handle of any delivery) neither revives it nor rewrites its error."""
        outbox, consumer = require_consumer(flowy_backend)
        intent = make_intent(new_thread_id("late-release"), 1)
        await outbox.enqueue_intent(intent)
        handles: list[OutboxMessage] = []
        for attempt in range(max_attempts_of(consumer)):
            handles.append(await _claim_one(consumer, self.long_ttl))
            await consumer.release(handles[-1], error=f"RuntimeError: attempt {attempt + 1}")
        before = await consumer.dead_letters()
        assert [d.message_id for d in before] == [handles[0].message_id]
        for handle in (handles[0], handles[-1]):
            await consumer.release(handle, error="RuntimeError: late")
            await consumer.release(handle, error="RuntimeError: late", delay=self.short_ttl)
        assert await consumer.dead_letters() == before
        assert await consumer.claim(10, self.long_ttl) == []
        await self.expire()
        assert await consumer.claim(10, self.long_ttl) == []
        assert await consumer.dead_letters() == before

    async def test_release_keeps_the_error_and_waits_the_delay(
        self, flowy_backend: Backend[Any]
    ) -> None:
        outbox, consumer = require_consumer(flowy_backend)
        await outbox.enqueue_intent(make_intent(new_thread_id("delay"), 1))
        first = await _claim_one(consumer, self.long_ttl)
        assert first.last_error == ""
        await consumer.release(first, error="ValueError: bad input", delay=self.short_ttl)
        assert await consumer.claim(10, self.long_ttl) == []  # not before the delay
        await self.expire()
        second = await _claim_one(consumer, self.long_ttl)
        assert second.message_id == first.message_id and second.attempts == 2
        assert second.last_error == "ValueError: bad input"

    async def test_dead_letters_keep_the_last_error(self, flowy_backend: Backend[Any]) -> None:
        outbox, consumer = require_consumer(flowy_backend)
        intent = make_intent(new_thread_id("dead-error"), 1)
        await outbox.enqueue_intent(intent)
        for attempt in range(max_attempts_of(consumer)):
            message = await _claim_one(consumer, self.long_ttl)
            await consumer.release(message, error=f"RuntimeError: attempt {attempt + 1}")
        [dead] = await consumer.dead_letters()
        assert dead.intent == intent and dead.thread_id == intent.thread_id
        assert dead.error == f"RuntimeError: attempt {max_attempts_of(consumer)}"

    async def test_poison_payload_is_dead_lettered_and_the_rest_delivered(
        self, flowy_backend: Backend[Any]
    ) -> None:
        outbox, consumer = require_consumer(flowy_backend)
        if not isinstance(outbox, BaseOutbox):
            pytest.skip(f"{type(outbox).__name__} is not a BaseOutbox: no raw rows to plant")
        good = make_intent(new_thread_id("behind-poison"), 1)
        for index, payload in enumerate(POISON):
            await outbox._append(  # pyright: ignore[reportPrivateUsage]
                OutboxRow(new_thread_id(f"poison-{index}"), 1, payload)
            )
        await outbox.enqueue_intent(good)
        delivered = await consumer.claim(10, self.long_ttl)
        assert [m.intent for m in delivered] == [good]
        dead = await consumer.dead_letters()
        assert len(dead) == len(POISON)
        assert all(d.intent is None and "undecodable" in d.error for d in dead)
        assert sorted(d.payload for d in dead) == sorted(POISON)
        assert await consumer.claim(10, self.long_ttl) == []

    async def test_dead_letters_limit(self, flowy_backend: Backend[Any]) -> None:
        outbox, consumer = require_consumer(flowy_backend)
        max_attempts = max_attempts_of(consumer)
        for index in range(3):
            await outbox.enqueue_intent(make_intent(new_thread_id(f"dead-{index}"), 1))
        for _ in range(max_attempts):
            for message in await consumer.claim(10, self.long_ttl):
                await consumer.release(message)
        assert len(await consumer.dead_letters()) == 3
        assert len(await consumer.dead_letters(limit=2)) == 2

    async def test_claim_respects_limit(self, flowy_backend: Backend[Any]) -> None:
        outbox, consumer = require_consumer(flowy_backend)
        intents = [make_intent(new_thread_id(f"limit-{i}"), 1) for i in range(5)]
        for intent in intents:
            await outbox.enqueue_intent(intent)
        batches = [await consumer.claim(2, self.long_ttl) for _ in range(3)]
        assert [len(b) for b in batches] == [2, 2, 1]
        delivered = [m for batch in batches for m in batch]
        assert len({m.message_id for m in delivered}) == 5
        assert sorted(m.intent.thread_id for m in delivered) == sorted(i.thread_id for i in intents)
        assert await consumer.claim(10, self.long_ttl) == []

    async def test_waiting_claim_returns_when_a_message_arrives(
        self, flowy_backend: Backend[Any]
    ) -> None:
        outbox, consumer = require_consumer(flowy_backend)
        intent = make_intent(new_thread_id("wait"), 1)

        async def enqueue_later() -> None:
            await asyncio.sleep(0.2)
            await outbox.enqueue_intent(intent)

        producer = asyncio.create_task(enqueue_later())
        started = time.monotonic()
        try:
            messages = await consumer.claim(1, self.long_ttl, wait=3.0)
        finally:
            await producer
        elapsed = time.monotonic() - started
        assert [m.intent for m in messages] == [intent]
        assert elapsed < 1.5, f"claim(wait=3) took {elapsed:.2f}s to see a message"

    async def test_waiting_claim_times_out_empty(self, flowy_backend: Backend[Any]) -> None:
        _, consumer = require_consumer(flowy_backend)
        wait = 0.5
        started = time.monotonic()
        assert await consumer.claim(1, self.long_ttl, wait=wait) == []
        elapsed = time.monotonic() - started
        assert wait * 0.5 <= elapsed < wait + 2.0, f"claim(wait={wait}) took {elapsed:.2f}s"


class TransactionalOutboxSuite(Suite):
    """``save_with_outbox``: the snapshot and the intent commit together or not at all."""

    requires: ClassVar[tuple[str, ...]] = ("transactional_outbox", "consumer")

    async def test_commits_snapshot_and_intent(self, flowy_backend: Backend[Any]) -> None:
        tx = require_transactional(flowy_backend)
        tid = new_thread_id("tx-commit")
        seen: list[int] = []

        async def enqueue(handle: object, revision: int) -> None:
            seen.append(revision)
            await tx.outbox.enqueue_intent_tx(handle, make_intent(tid, revision))

        snap = make_snapshot(tid, handoff_status=HandoffStatus.ENQUEUED)
        revision = await tx.checkpointer.save_with_outbox(0, snap, enqueue)
        assert revision == 1
        assert seen == [1]
        assert await tx.checkpointer.load(tid) == (snap.at_revision(1), 1)
        message = await _claim_one(tx.consumer, self.long_ttl)
        assert message.intent == make_intent(tid, 1)
        assert message.intent.snapshot_revision == revision
        assert message.attempts == 1

    async def test_a_revision_enqueued_twice_in_one_save_is_one_message(
        self, flowy_backend: Backend[Any]
    ) -> None:
        tx = require_transactional(flowy_backend)
        tid = new_thread_id("tx-twice")
        first, second = make_intent(tid, 1), make_intent(tid, 1, reason="enqueued again")

        async def enqueue(handle: object, revision: int) -> None:
            await tx.outbox.enqueue_intent_tx(handle, first)
            await tx.outbox.enqueue_intent_tx(handle, second)

        assert await tx.checkpointer.save_with_outbox(0, make_snapshot(tid), enqueue) == 1
        messages = await tx.consumer.claim(10, self.long_ttl)
        assert [m.intent for m in messages] == [first]  # the first one enqueued

    async def test_callback_gets_the_new_revision(self, flowy_backend: Backend[Any]) -> None:
        tx = require_transactional(flowy_backend)
        tid = new_thread_id("tx-revision")
        await saved_chain(tx.checkpointer, tid, 2)
        seen: list[int] = []

        async def enqueue(handle: object, revision: int) -> None:
            seen.append(revision)
            await tx.outbox.enqueue_intent_tx(handle, make_intent(tid, revision))

        assert await tx.checkpointer.save_with_outbox(2, make_snapshot(tid), enqueue) == 3
        assert await tx.checkpointer.save_with_outbox(3, make_snapshot(tid), enqueue) == 4
        assert seen == [3, 4]
        claimed = await tx.consumer.claim(10, self.long_ttl)
        assert sorted(m.intent.snapshot_revision for m in claimed) == [3, 4]

    async def test_conflict_commits_nothing(self, flowy_backend: Backend[Any]) -> None:
        tx = require_transactional(flowy_backend)
        tid = new_thread_id("tx-conflict")
        await saved_chain(tx.checkpointer, tid, 1)
        before = await tx.checkpointer.load(tid)

        async def enqueue(handle: object, revision: int) -> None:
            await tx.outbox.enqueue_intent_tx(handle, make_intent(tid, revision))

        for expected in (0, 5):
            with pytest.raises(ConcurrencyConflictError):
                await tx.checkpointer.save_with_outbox(expected, make_snapshot(tid), enqueue)
        assert await tx.checkpointer.load(tid) == before
        assert await history_revisions(tx.checkpointer, tid) == [1]
        assert await tx.consumer.claim(10, self.long_ttl) == []

    async def test_failing_callback_commits_nothing(self, flowy_backend: Backend[Any]) -> None:
        tx = require_transactional(flowy_backend)
        tid = new_thread_id("tx-fails")

        class EnqueueFailed(Exception):
            pass

        async def enqueue(handle: object, revision: int) -> None:
            # The intent is written inside the transaction, then the callback fails.
            await tx.outbox.enqueue_intent_tx(handle, make_intent(tid, revision))
            raise EnqueueFailed(f"enqueue of revision {revision} failed")

        with pytest.raises(EnqueueFailed):
            await tx.checkpointer.save_with_outbox(0, make_snapshot(tid), enqueue)
        assert await try_load(tx.checkpointer, tid) is None
        await saved_chain(tx.checkpointer, tid, 1)
        before = await tx.checkpointer.load(tid)
        with pytest.raises(EnqueueFailed):
            await tx.checkpointer.save_with_outbox(1, make_snapshot(tid), enqueue)
        assert await tx.checkpointer.load(tid) == before
        assert await history_revisions(tx.checkpointer, tid) == [1]
        assert await tx.consumer.claim(10, self.long_ttl) == []

        # The failed attempts left no lock or reservation behind.
        async def enqueue_ok(handle: object, revision: int) -> None:
            await tx.outbox.enqueue_intent_tx(handle, make_intent(tid, revision))

        assert await tx.checkpointer.save_with_outbox(1, make_snapshot(tid), enqueue_ok) == 2

    async def test_cancelled_save_commits_nothing_and_frees_the_store(
        self, flowy_backend: Backend[Any]
    ) -> None:
        tx = require_transactional(flowy_backend)
        tid = new_thread_id("tx-cancel")
        inside = asyncio.Event()

        async def hang(handle: object, revision: int) -> None:
            await tx.outbox.enqueue_intent_tx(handle, make_intent(tid, revision))
            inside.set()
            await asyncio.Event().wait()

        saving = asyncio.ensure_future(
            tx.checkpointer.save_with_outbox(0, make_snapshot(tid), hang)
        )
        await asyncio.wait_for(inside.wait(), self.long_ttl)
        saving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await saving
        assert await try_load(tx.checkpointer, tid) is None
        assert await tx.consumer.claim(10, self.long_ttl) == []
        async with peer_of(flowy_backend) as peer:  # no transaction was left holding a lock
            assert await asyncio.wait_for(peer.checkpointer.save(0, make_snapshot(tid)), 10) == 1
