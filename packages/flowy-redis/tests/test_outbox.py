"""``RedisOutbox`` / ``RedisOutboxConsumer`` beyond the conformance suite: a crashed
consumer's messages, every shard is read, delivery counts are the consumer group's,
dead letters keep their error, foreign entries, blocking waits and the Worker."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
from redis_support import BackendFactory, RedisTarget

from flowy.checkpoint import HandoffIntent, HandoffStatus, ResumeToken
from flowy_redis import RedisOutboxConsumer

pytestmark = pytest.mark.anyio


def intent(thread_id: str, revision: int = 1) -> HandoffIntent:
    return HandoffIntent(
        thread_id=thread_id,
        pending_snapshot_revision=revision,
        committed_snapshot_revision=revision,
        snapshot_revision=revision,
        resume_token=ResumeToken(thread_id, revision),
        handoff_status=HandoffStatus.ENQUEUED,
        reason="handoff_requested",
        execution_pointer="worker",
        created_at=1_700_000_000.0,
    )


def _tid() -> str:
    return f"ob-{uuid.uuid4().hex[:8]}"


async def test_a_crashed_consumers_message_goes_to_another(make_backend: BackendFactory) -> None:
    crashed = make_backend(consumer="crashed")
    survivor = make_backend(consumer="survivor")
    await crashed.outbox.enqueue_intent(intent(tid := _tid()))
    [first] = await crashed.consumer.claim(10, 0.3)
    await crashed.aclose()  # the process dies holding the message
    assert await survivor.consumer.claim(10, 30) == []
    await asyncio.sleep(0.5)
    [second] = await survivor.consumer.claim(10, 30)
    assert (second.message_id, second.intent.thread_id, second.attempts) == (
        first.message_id,
        tid,
        2,
    )
    await survivor.consumer.ack(second)
    assert await survivor.consumer.claim(10, 30, wait=0.2) == []


async def test_every_shard_is_read(make_backend: BackendFactory) -> None:
    backend = make_backend(shards=5)
    layout = backend.outbox.layout
    by_shard: dict[int, str] = {}
    index = 0
    while len(by_shard) < 5:
        tid = f"shard-{index}-{uuid.uuid4().hex[:4]}"
        by_shard.setdefault(layout.shard_of(tid), tid)
        index += 1
    for tid in by_shard.values():
        await backend.outbox.enqueue_intent(intent(tid))
    got = await backend.consumer.claim(100, 30)
    assert sorted(m.intent.thread_id for m in got) == sorted(by_shard.values())
    assert {m.message_id.split(":")[0] for m in got} == {str(s) for s in range(5)}


async def test_attempts_are_the_groups_delivery_count(make_backend: BackendFactory) -> None:
    backend = make_backend()
    consumer = backend.consumer
    await backend.outbox.enqueue_intent(intent(tid := _tid()))
    for expected in (1, 2, 3):
        [message] = await consumer.claim(1, 30)
        assert message.attempts == expected
        await consumer.release(message)
    stream = backend.outbox.layout.thread(tid).stream
    entry = message.message_id.split(":", 1)[1]
    [pending] = await backend.client.xpending_range(stream, consumer.group, entry, entry, 1)
    assert pending["times_delivered"] == 3


async def test_dead_letters_keep_the_last_error(make_backend: BackendFactory) -> None:
    backend = make_backend(max_attempts=2)
    consumer = backend.consumer
    await backend.outbox.enqueue_intent(intent(tid := _tid()))
    [message] = await consumer.claim(1, 30)
    await consumer.release(message, error="first failure")
    [message] = await consumer.claim(1, 30)
    await consumer.release(message, error="second failure")
    [dead] = await consumer.dead_letters()
    assert (dead.message_id, dead.attempts) == (message.message_id, 2)
    dead_key = backend.outbox.layout.shard(backend.outbox.layout.shard_of(tid)).dead
    client: Any = backend.client
    [(_, fields)] = await client.xrange(dead_key)
    assert fields[b"error"] == b"second failure"


async def test_timed_out_dead_letter_names_the_reason(make_backend: BackendFactory) -> None:
    backend = make_backend(max_attempts=1)
    await backend.outbox.enqueue_intent(intent(tid := _tid()))
    await backend.consumer.claim(1, 0.2)
    await asyncio.sleep(0.4)
    assert await backend.consumer.claim(1, 30) == []
    [dead] = await backend.consumer.dead_letters()
    assert dead.intent.thread_id == tid
    dead_key = backend.outbox.layout.shard(backend.outbox.layout.shard_of(tid)).dead
    client: Any = backend.client
    [(_, fields)] = await client.xrange(dead_key)
    assert b"visibility timeout" in fields[b"error"]


async def test_a_foreign_entry_is_dead_lettered_not_delivered(
    make_backend: BackendFactory,
) -> None:
    backend = make_backend()
    stream = backend.outbox.layout.shard(0).stream
    await backend.client.xadd(stream, {"intent": b"not json"})
    await backend.client.xadd(stream, {"other": b"field"})
    await backend.outbox.enqueue_intent(intent(tid := _tid()))
    got = await backend.consumer.claim(10, 30)
    assert [m.intent.thread_id for m in got] == [tid]
    assert await backend.client.xlen(backend.outbox.layout.shard(0).dead) == 2


async def test_ack_and_release_refuse_foreign_ids(make_backend: BackendFactory) -> None:
    from flowy.checkpoint import OutboxMessage

    consumer = make_backend().consumer
    forged = OutboxMessage("not-an-id", intent(_tid()), 1)
    with pytest.raises(ValueError, match="not a message id"):
        await consumer.ack(forged)
    with pytest.raises(ValueError, match="not a message id"):
        await consumer.release(forged)


async def test_a_waiting_claim_sees_a_release_from_another_consumer(
    make_backend: BackendFactory,
) -> None:
    holder = make_backend(consumer="holder")
    waiter = make_backend(consumer="waiter")
    await holder.outbox.enqueue_intent(intent(_tid()))
    [held] = await holder.consumer.claim(1, 30)

    async def release_later() -> None:
        await asyncio.sleep(0.2)
        await holder.consumer.release(held)

    task = asyncio.create_task(release_later())
    started = time.monotonic()
    got = await waiter.consumer.claim(1, 30, wait=3)
    await task
    assert [m.message_id for m in got] == [held.message_id]
    assert time.monotonic() - started < 1.5


async def test_waiting_claims_respect_a_short_socket_timeout(standalone: RedisTarget) -> None:
    from redis_support import new_namespace

    from flowy_redis import RedisBackend, purge_namespace

    namespace = new_namespace()
    backend = RedisBackend[Any].from_url(standalone.url, namespace=namespace, socket_timeout=0.3)
    try:
        started = time.monotonic()
        assert await backend.consumer.claim(1, 30, wait=1.0) == []
        assert time.monotonic() - started >= 0.9
    finally:
        await purge_namespace(backend.client, namespace)
        await backend.aclose()


async def test_consumer_options_are_checked(make_backend: BackendFactory) -> None:
    client = make_backend().client
    with pytest.raises(ValueError, match="max_attempts"):
        RedisOutboxConsumer(client, max_attempts=0)
    with pytest.raises(ValueError, match="poll_interval"):
        RedisOutboxConsumer(client, poll_interval=0)
    consumer = RedisOutboxConsumer(client)
    with pytest.raises(ValueError, match="visibility_timeout"):
        await consumer.claim(1, 0)
    assert await consumer.claim(0, 30) == []


async def test_outbox_throughput_smoke(make_backend: BackendFactory) -> None:
    """Four consumers drain 200 messages between them, each delivered once."""
    producer = make_backend()
    consumers = [make_backend(consumer=f"c{i}").consumer for i in range(4)]
    tids = [f"{_tid()}-{i}" for i in range(200)]
    for tid in tids:
        await producer.outbox.enqueue_intent(intent(tid))
    seen: list[str] = []

    async def drain(consumer: RedisOutboxConsumer) -> None:
        while batch := await consumer.claim(16, 30, wait=0.2):
            for message in batch:
                seen.append(message.intent.thread_id)
                await consumer.ack(message)

    await asyncio.gather(*(drain(c) for c in consumers))
    assert sorted(seen) == sorted(tids)
    assert await consumers[0].claim(10, 30) == []
    layout = producer.outbox.layout
    for shard in layout.all_shards():
        assert await producer.client.xlen(shard.stream) == 0
