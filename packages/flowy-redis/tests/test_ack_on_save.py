"""The acking save (``RedisCheckpointer._write_ack``) beyond ``AckingSaveSuite``: it is
one script, the saves that acknowledge nothing run the scripts they ran before, and the
message leaves the store as the consumer's ack leaves it: out of its queue's in-flight
sets, its key free for a new message, a dead letter left as it is. An id that names no
message is no refusal; a message of another shard, or a checkpointer without its
consumer, is refused before anything is written."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import pytest
from redis.asyncio import Redis
from redis_support import BackendFactory, RedisTarget, new_namespace

from flowy import ConcurrencyConflictError, LeaseLostError
from flowy.storage import Lease, OutboxMessage, Route
from flowy.testing.suite._support import make_intent, make_snapshot
from flowy_redis import RedisBackend, RedisCheckpointer, purge_namespace
from flowy_redis._scripts import save_script

pytestmark = pytest.mark.anyio

TTL = 60.0


def _tid(label: str = "as") -> str:
    return f"{label}-{uuid.uuid4().hex[:8]}"


async def _claimed(
    backend: RedisBackend[Any], tid: str, route: Route | None = None
) -> OutboxMessage:
    """Thread ``tid`` at revision 1 with its hand-off message claimed (from ``route``'s
    queue)."""
    intent = make_intent(tid, 1) if route is None else make_intent(tid, 1, route=route)

    async def enqueue(tx: object, revision: int) -> None:
        await backend.outbox.enqueue_intent_tx(tx, intent)

    assert await backend.checkpointer.save_with_outbox(0, make_snapshot(tid), enqueue) == 1
    consumer = backend.consumer
    if route is None:
        claimed = await consumer.claim(10, TTL)
    else:
        claimed = await consumer.claim(10, TTL, queue=route.queue)
    mine = [m for m in claimed if m.intent.thread_id == tid]
    assert len(mine) == 1, claimed
    return mine[0]


async def _acking_save(backend: RedisBackend[Any], tid: str, message: OutboxMessage) -> int:
    lease = await backend.leases.acquire(tid, "as-owner", TTL)
    return await backend.checkpointer.save_and_release(
        1, make_snapshot(tid), lease=lease, ack=message
    )


def test_only_the_acking_save_script_acknowledges() -> None:
    for ttl in (0, 5000):
        assert "acknowledge(" not in save_script(ttl).source
        assert "acknowledge(" not in save_script(ttl, release=True).source
        assert "acknowledge(" in save_script(ttl, release=True, ack=True).source
    with pytest.raises(ValueError, match="release=True"):
        save_script(0, ack=True)


class _CountingRedis(Redis):
    """A Redis client that records the commands it sends and the scripts it runs."""

    sent: list[Any] = []  # noqa: RUF012 - reset by the test

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        self.sent.append(args[:2] if args[0] == "EVALSHA" else args[:1])
        return await super().execute_command(*args, **options)  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]


async def test_each_save_is_one_script_and_only_the_acking_one_acknowledges(
    standalone: RedisTarget,
) -> None:
    client = _CountingRedis.from_url(standalone.url)  # pyright: ignore[reportUnknownMemberType]
    namespace = new_namespace()
    try:
        async with RedisBackend[Any].from_client(client, namespace=namespace) as backend:
            tid, cp = _tid(), backend.checkpointer
            message = await _claimed(backend, tid)
            lease = await backend.leases.acquire(tid, "as-owner", TTL)
            scripts = [  # a standalone server's: with the recency index
                save_script(0, recent=True),
                save_script(0, release=True, recent=True),
                save_script(0, release=True, ack=True, recent=True),
            ]
            for script in scripts:  # known to the server: no NOSCRIPT and reload below
                await client.script_load(script.source)  # pyright: ignore[reportUnknownMemberType]
            _CountingRedis.sent = []
            assert await cp.save(1, make_snapshot(tid), lease=lease) == 2
            assert await cp.save_and_release(2, make_snapshot(tid), lease=lease) == 3
            lease = await backend.leases.acquire(tid, "as-owner", TTL)
            del _CountingRedis.sent[-1]  # the acquisition
            assert await cp.save_and_release(3, make_snapshot(tid), lease=lease, ack=message) == 4
            assert _CountingRedis.sent == [("EVALSHA", script.sha) for script in scripts]
            assert (await backend.consumer.stats()).pending == 0
    finally:
        await purge_namespace(client, namespace)
        await client.aclose()


async def test_an_acking_save_ends_the_messages_flight_in_its_queue(
    make_standalone_backend: BackendFactory,
) -> None:
    backend = make_standalone_backend()
    queue = f"as-{uuid.uuid4().hex[:8]}"
    await backend.queues.configure(queue, global_concurrency=1, partition_concurrency=1)
    route = Route(queue, "customer-1")
    tid = _tid()
    message = await _claimed(backend, tid, route)
    waiting = _tid()
    await backend.outbox.enqueue_intent(make_intent(waiting, 1, route=route))
    assert await backend.consumer.claim(5, TTL, queue=queue) == []  # both limits are full
    client: Any = backend.client
    prefix = backend.store.layout.queues
    flights = [prefix + f"fly:{queue}".encode(), prefix + f"pfly:{queue}\0customer-1".encode()]
    assert [await client.zcard(key) for key in flights] == [1, 1]
    assert await _acking_save(backend, tid, message) == 2
    assert [await client.zcard(key) for key in flights] == [0, 0]
    stats = {s.queue: s for s in await backend.queues.list()}[queue]
    assert (stats.in_flight, stats.pending) == (0, 1)
    [next_one] = await backend.consumer.claim(5, TTL, queue=queue)
    assert next_one.intent.thread_id == waiting


async def test_an_acking_save_leaves_the_store_as_an_ack_does(
    make_backend: BackendFactory,
) -> None:
    backend = make_backend()
    acked, saved = _tid("acked"), _tid("saved")
    by_ack = await _claimed(backend, acked)
    await backend.consumer.ack(by_ack)
    by_save = await _claimed(backend, saved)
    assert await _acking_save(backend, saved, by_save) == 2
    assert (await backend.consumer.stats()).pending == 0
    # Either way the (thread, revision) key no longer names a message: the same hand-off
    # enqueued again is a new message.
    for tid in (acked, saved):
        await backend.outbox.enqueue_intent(make_intent(tid, 1))
    again = await backend.consumer.claim(10, TTL)
    assert sorted(m.intent.thread_id for m in again) == sorted([acked, saved])
    assert {m.message_id for m in again}.isdisjoint({by_ack.message_id, by_save.message_id})
    assert [m.attempts for m in again] == [1, 1]


async def test_an_acking_save_leaves_a_dead_letter_as_it_is(make_backend: BackendFactory) -> None:
    backend = make_backend()
    tid = _tid()
    message = await _claimed(backend, tid)
    await backend.consumer.release(message, error="poison", dead=True)
    assert await _acking_save(backend, tid, message) == 2
    [dead] = await backend.consumer.dead_letters()
    assert (dead.message_id, dead.error) == (message.message_id, "poison")
    await backend.consumer.retry_dead_letter(message.message_id)
    [back] = await backend.consumer.claim(10, TTL)
    assert back.message_id == message.message_id


@pytest.mark.parametrize("message_id", ["not-an-id", "99999:1-1", "0:99999999999999-0"])
async def test_an_id_that_names_no_message_is_no_refusal(
    make_backend: BackendFactory, message_id: str
) -> None:
    backend = make_backend()
    tid, other = _tid(), _tid("other")
    message = await _claimed(backend, tid)
    other_message = await _claimed(backend, other)
    shard = backend.store.layout.shard_of(tid)
    if message_id.startswith("0:"):
        message_id = f"{shard}:{message_id[2:]}"  # the saved thread's shard, no such entry
    nothing = dataclasses.replace(message, message_id=message_id)
    assert await _acking_save(backend, tid, nothing) == 2
    assert await backend.leases.holder(tid) is None
    assert (await backend.consumer.stats()).pending == 2
    for claimed in (message, other_message):
        await backend.consumer.release(claimed, error="given back")
    again = await backend.consumer.claim(10, TTL)
    assert sorted(m.message_id for m in again) == sorted(
        [message.message_id, other_message.message_id]
    )


async def test_a_refused_acking_save_keeps_the_message_and_the_lease(
    make_backend: BackendFactory,
) -> None:
    backend = make_backend()
    cp = backend.checkpointer
    tid = _tid()
    message = await _claimed(backend, tid)
    lease = await backend.leases.acquire(tid, "as-owner", TTL)
    stale = Lease(tid, "as-stale", lease.fencing_token - 1, lease.expires_at)
    with pytest.raises(LeaseLostError):
        await cp.save_and_release(1, make_snapshot(tid), lease=stale, ack=message)
    with pytest.raises(ConcurrencyConflictError):
        await cp.save_and_release(4, make_snapshot(tid), lease=lease, ack=message)
    holder = await backend.leases.holder(tid)
    assert holder is not None and holder.fencing_token == lease.fencing_token
    assert (await cp.load(tid))[1] == 1
    await backend.consumer.release(message, error="given back")
    [again] = await backend.consumer.claim(10, TTL)
    assert (again.message_id, again.attempts) == (message.message_id, 2)


async def test_a_message_of_another_shard_is_refused_before_writing(
    make_backend: BackendFactory,
) -> None:
    backend = make_backend()
    layout = backend.store.layout
    tid = _tid()
    elsewhere = next(
        f"{tid}-{i}" for i in range(1000) if layout.shard_of(f"{tid}-{i}") != layout.shard_of(tid)
    )
    await backend.checkpointer.save(0, make_snapshot(tid))
    foreign = await _claimed(backend, elsewhere)
    lease = await backend.leases.acquire(tid, "as-owner", TTL)
    with pytest.raises(ValueError, match="shard"):
        await backend.checkpointer.save_and_release(1, make_snapshot(tid), lease=lease, ack=foreign)
    assert (await backend.checkpointer.load(tid))[1] == 1
    holder = await backend.leases.holder(tid)
    assert holder is not None and holder.fencing_token == lease.fencing_token
    assert (await backend.consumer.stats()).pending == 1


async def test_a_checkpointer_without_its_consumer_cannot_acknowledge(
    make_backend: BackendFactory,
) -> None:
    backend = make_backend()
    tid = _tid()
    message = await _claimed(backend, tid)
    lone: RedisCheckpointer[Any] = RedisCheckpointer(backend.store)
    lease = await backend.leases.acquire(tid, "as-owner", TTL)
    with pytest.raises(TypeError, match="without its consumer"):
        await lone.save_and_release(1, make_snapshot(tid), lease=lease, ack=message)
    assert (await lone.load(tid))[1] == 1
    assert await lone.save_and_release(1, make_snapshot(tid), lease=lease) == 2
    assert (await backend.consumer.stats()).pending == 1
