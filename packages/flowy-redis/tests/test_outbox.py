"""``RedisOutbox`` / ``RedisConsumer`` beyond the conformance suite: a crashed consumer's
messages, every shard is read, delivery counts are the consumer group's, delays kept in
the shard's visibility set, one message per (thread, revision), dead letters, foreign
entries and ids, blocking waits and throughput."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
from redis_support import BackendFactory, RedisTarget, client_for

from flowy.storage import HandoffIntent, HandoffStatus, OutboxMessage, ResumeToken
from flowy.storage.dialect import encode_intent
from flowy_redis import RedisBackend, RedisConsumer

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
    visibility = 2.0  # long enough that a loaded machine reaches the next claim within it
    claimed_at = time.monotonic()
    [first] = await crashed.consumer.claim(10, visibility)
    await crashed.aclose()  # the process dies holding the message
    hidden = await survivor.consumer.claim(10, 30)
    if time.monotonic() - claimed_at < visibility:
        assert hidden == []
    await asyncio.sleep(max(0.0, claimed_at + visibility + 0.2 - time.monotonic()))
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
    layout = backend.store.layout
    by_shard: dict[int, str] = {}
    while len(by_shard) < 5:
        tid = _tid()
        by_shard.setdefault(layout.shard_of(tid), tid)
    for tid in by_shard.values():
        await backend.outbox.enqueue_intent(intent(tid))
    got = await backend.consumer.claim(100, 30)
    assert sorted(m.intent.thread_id for m in got) == sorted(by_shard.values())
    assert {m.message_id.split(":")[0] for m in got} == {str(s) for s in range(5)}


async def test_attempts_are_the_groups_delivery_count(make_backend: BackendFactory) -> None:
    backend = make_backend()
    consumer = backend.consumer
    await backend.outbox.enqueue_intent(intent(tid := _tid()))
    message: OutboxMessage | None = None
    for expected in (1, 2, 3):
        [message] = await consumer.claim(1, 30)
        assert message.attempts == expected
        await consumer.release(message)
    assert message is not None
    stream = backend.store.layout.thread(tid).shard.stream
    entry = message.message_id.split(":", 1)[1]
    [pending] = await backend.client.xpending_range(stream, consumer.group, entry, entry, 1)
    assert pending["times_delivered"] == 3


async def test_a_release_delay_is_the_messages_visibility(make_backend: BackendFactory) -> None:
    backend = make_backend()
    client: Any = backend.client
    await backend.outbox.enqueue_intent(intent(tid := _tid()))
    [message] = await backend.consumer.claim(1, 30)
    await backend.consumer.release(message, error="later", delay=60)
    vis = backend.store.layout.thread(tid).shard.outbox[1]
    entry = message.message_id.split(":", 1)[1]
    seconds, micros = await client.time(**_node_of(backend, vis))
    visible_at = await client.zscore(vis, entry)
    assert 59_000 <= visible_at - (seconds * 1000 + micros // 1000) <= 60_000
    assert await backend.consumer.claim(1, 30) == []


def _node_of(backend: RedisBackend[Any], key: bytes) -> dict[str, Any]:
    client: Any = backend.client
    return {"target_nodes": client.get_node_from_key(key)} if backend.store.cluster else {}


async def test_one_message_per_thread_and_revision(make_backend: BackendFactory) -> None:
    """Enqueueing a hand-off again adds nothing while its message lives (claimed or
    not); an acked one may be enqueued again; a dead one comes back, attempts reset."""
    backend = make_backend(max_attempts=1)
    outbox, consumer = backend.outbox, backend.consumer
    tid = _tid()
    for _ in range(3):
        await outbox.enqueue_intent(intent(tid))
    [message] = await consumer.claim(10, 30)
    await outbox.enqueue_intent(intent(tid))
    assert await consumer.claim(10, 30) == []
    await consumer.ack(message)
    assert await backend.client.hlen(backend.store.layout.thread(tid).shard.outbox[6]) == 0
    await outbox.enqueue_intent(intent(tid))
    [again] = await consumer.claim(10, 30)
    assert again.message_id != message.message_id and again.attempts == 1
    await consumer.release(again, error="boom")  # max_attempts=1: dead
    [dead] = await consumer.dead_letters()
    await outbox.enqueue_intent(intent(tid))
    assert await consumer.dead_letters() == []
    [revived] = await consumer.claim(10, 30)
    assert (revived.message_id, revived.attempts, revived.last_error) == (dead.message_id, 1, "")


async def test_dead_letters_keep_their_error_and_order(make_backend: BackendFactory) -> None:
    backend = make_backend(max_attempts=2)
    consumer = backend.consumer
    tids = [_tid() for _ in range(4)]
    for tid in tids:
        await backend.outbox.enqueue_intent(intent(tid))
    for attempt in (1, 2):
        for message in await consumer.claim(10, 30):
            await consumer.release(message, error=f"{message.intent.thread_id} #{attempt}")
    dead = await consumer.dead_letters()
    assert sorted(d.thread_id for d in dead) == sorted(tids)
    assert all(d.error == f"{d.thread_id} #2" and d.attempts == 2 for d in dead)
    assert [d.message_id for d in await consumer.dead_letters(limit=2)] == [
        d.message_id for d in dead[:2]
    ]


async def test_timed_out_dead_letter_names_the_reason(make_backend: BackendFactory) -> None:
    backend = make_backend(max_attempts=1)
    await backend.outbox.enqueue_intent(intent(tid := _tid()))
    await backend.consumer.claim(1, 0.2)
    await asyncio.sleep(0.4)
    assert await backend.consumer.claim(1, 30) == []
    [dead] = await backend.consumer.dead_letters()
    assert dead.thread_id == tid
    assert dead.error == "not acked after 1 deliveries"


async def test_a_foreign_entry_is_dead_lettered_not_delivered(
    make_backend: BackendFactory,
) -> None:
    backend = make_backend(shards=1)
    stream = backend.store.layout.shard(0).stream
    await backend.client.xadd(stream, {"intent": b"not json"})
    await backend.client.xadd(stream, {"other": b"field"})
    await backend.outbox.enqueue_intent(intent(tid := _tid()))
    got = await backend.consumer.claim(10, 30)
    assert [m.intent.thread_id for m in got] == [tid]
    dead = await backend.consumer.dead_letters()
    assert [(d.intent, d.payload) for d in dead] == [(None, b"not json"), (None, b"")]
    await backend.consumer.retry_dead_letter(dead[0].message_id)
    assert await backend.consumer.claim(10, 30) == []  # buried again at once
    assert len(await backend.consumer.dead_letters()) == 2


async def test_foreign_ids_are_no_message(make_backend: BackendFactory) -> None:
    backend = make_backend()
    consumer = backend.consumer
    await backend.outbox.enqueue_intent(intent(_tid()))
    [held] = await consumer.claim(1, 30)
    for forged_id in ("not-an-id", "99:1-0", "0:1-0", held.message_id + "0"):
        forged = OutboxMessage(forged_id, held.intent, 1)
        await consumer.ack(forged)
        await consumer.release(forged)
        with pytest.raises(KeyError):
            await consumer.retry_dead_letter(forged_id)
    assert await consumer.claim(1, 30) == []  # the held message is untouched
    await consumer.release(held)
    assert [m.message_id for m in await consumer.claim(1, 30)] == [held.message_id]


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


async def test_waiting_claims_respect_a_short_socket_timeout(
    make_standalone_backend: BackendFactory,
) -> None:
    backend = make_standalone_backend(client_options={"socket_timeout": 0.3}, poll_interval=1)
    started = time.monotonic()
    assert await backend.consumer.claim(1, 30, wait=1.0) == []
    assert time.monotonic() - started >= 0.9


async def test_a_consumer_group_needs_a_name(make_backend: BackendFactory) -> None:
    with pytest.raises(ValueError, match="group"):
        RedisConsumer(make_backend().store, group="")


async def test_outbox_throughput_smoke(
    make_backend: BackendFactory, redis_target: RedisTarget
) -> None:
    """Four consumers drain 200 messages between them, each delivered once."""
    producer = make_backend()
    consumers = [make_backend(consumer=f"c{i}").consumer for i in range(4)]
    tids = [f"{_tid()}-{i}" for i in range(200)]
    for tid in tids:
        await producer.outbox.enqueue_intent(intent(tid))
    seen: list[str] = []

    async def drain(consumer: RedisConsumer) -> None:
        while batch := await consumer.claim(16, 30, wait=0.2):
            for message in batch:
                seen.append(message.intent.thread_id)
                await consumer.ack(message)

    await asyncio.gather(*(drain(c) for c in consumers))
    assert sorted(seen) == sorted(tids)
    assert await consumers[0].claim(10, 30) == []
    client = client_for(redis_target)
    try:
        for shard in producer.store.layout.all_shards():
            assert await client.xlen(shard.stream) == 0
            assert await client.hlen(shard.outbox[6]) == 0  # the (thread, revision) index
    finally:
        await client.aclose()


async def test_messages_written_before_queues_are_the_default_queues(
    make_backend: BackendFactory,
) -> None:
    """Entries as an earlier version wrote them (no route fields, in no ready set) are
    claimed from the default queue, in enqueue order before a message added after them
    (shard by shard on a cluster); a delivered one waits out its visibility first."""
    backend = make_backend()
    client: Any = backend.client
    group = backend.consumer.group
    old = [_tid() for _ in range(3)]
    entries: list[bytes] = []
    for tid in old:
        shard = backend.store.layout.thread(tid).shard
        key = f"1:{tid}"
        entry = await client.xadd(shard.stream, {"intent": encode_intent(intent(tid)), "key": key})
        await client.hset(shard.outbox[6], key, entry)
        entries.append(entry)
        await asyncio.sleep(0.005)  # entry ids order by the millisecond across shards
    # The third was delivered once and is hidden until long after now.
    hidden = backend.store.layout.thread(old[2]).shard
    await client.xgroup_create(hidden.stream, group, "0", mkstream=True)
    await client.xclaim(hidden.stream, group, "gone", 0, [entries[2]], force=True, retrycount=1)
    await client.zadd(hidden.outbox[1], {entries[2]: 2**50})
    await backend.outbox.enqueue_intent(intent(new := _tid()))
    got = [m.intent.thread_id for m in await backend.consumer.claim(10, 30)]
    if backend.store.cluster:
        got.sort(key=[old[0], old[1], new].index)
    assert got == [old[0], old[1], new]
    assert (await backend.consumer.stats()).pending == 4
