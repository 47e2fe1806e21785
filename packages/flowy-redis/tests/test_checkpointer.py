"""``RedisCheckpointer`` beyond the conformance suite: one script per save, expiry of
completed threads, history and prune in batches, the layout check, fencing domains,
replayed saves and the client checks."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis_support import BackendFactory, RedisTarget, corrupt_head, new_namespace, raw_client

import flowy_redis._checkpointer as checkpointer_module
from flowy import (
    ConcurrencyConflictError,
    MemoryLeaseManager,
    SchemaVersionError,
    SnapshotTooLargeError,
    StorageUnavailableError,
    ThreadNotFoundError,
)
from flowy.checkpoint import HandoffStatus, RunStatus, Snapshot, new_write_id
from flowy_redis import (
    RedisBackend,
    RedisCheckpointer,
    RedisLeaseManager,
    RedisOutbox,
    RedisTransaction,
    purge_namespace,
)

pytestmark = pytest.mark.anyio


def snap(thread_id: str, state: Any = None, **fields: Any) -> Snapshot[Any]:
    return Snapshot(
        thread_id=thread_id,
        state={"n": 0} if state is None else state,
        execution_pointer=fields.pop("pointer", "start"),
        write_id=new_write_id(),
        **fields,
    )


def _tid() -> str:
    return f"cp-{uuid.uuid4().hex[:8]}"


class _CountingRedis(Redis):
    """A Redis client that records the commands it sends."""

    sent: list[bytes | str] = []  # noqa: RUF012 - reset by the test

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        self.sent.append(args[0])
        return await super().execute_command(*args, **options)  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]


async def test_a_save_is_one_round_trip(standalone: RedisTarget) -> None:
    client = _CountingRedis.from_url(standalone.url)  # pyright: ignore[reportUnknownMemberType]
    namespace = new_namespace()
    try:
        cp = RedisCheckpointer[Any](client, namespace=namespace)
        tid = _tid()
        # First use records the namespace layout and may load the scripts.
        await cp.save(0, snap(tid))
        await cp.load(tid)
        _CountingRedis.sent = []
        for revision in range(1, 11):
            assert await cp.save(revision, snap(tid, {"n": revision})) == revision + 1
        assert _CountingRedis.sent == ["EVALSHA"] * 10
        _CountingRedis.sent = []
        await cp.load(tid)
        assert _CountingRedis.sent == ["EVALSHA"]
    finally:
        await purge_namespace(client, namespace)
        await client.aclose()


async def test_completed_threads_expire(make_backend: BackendFactory) -> None:
    backend = make_backend(completed_ttl=0.4)
    cp, client = backend.checkpointer, backend.client
    tid, kept = _tid(), _tid()
    await cp.save(0, snap(tid))
    await cp.save(0, snap(kept))
    keys = cp.layout.thread(tid)
    assert await client.pttl(keys.head) == -1
    await cp.save(1, snap(tid, status=RunStatus.COMPLETED, handoff_status=HandoffStatus.ENQUEUED))
    assert 0 < await client.pttl(keys.head) <= 400
    assert 0 < await client.pttl(keys.hist) <= 400
    assert tid in {s.thread_id for s in await cp.list_threads()}
    await asyncio.sleep(0.6)
    with pytest.raises(ThreadNotFoundError):
        await cp.load(tid)
    assert await cp.get_history(tid) == []
    assert {s.thread_id for s in await cp.list_threads()} == {kept}
    assert await cp.list_threads(handoff_statuses=frozenset({HandoffStatus.ENQUEUED})) == []
    # An expired thread starts over at revision 1 and is listed once.
    assert await cp.save(0, snap(tid)) == 1
    assert sorted(s.thread_id for s in await cp.list_threads()) == sorted([tid, kept])


async def test_a_thread_saved_again_after_completing_stops_expiring(
    make_backend: BackendFactory,
) -> None:
    backend = make_backend(completed_ttl=30)
    cp, client = backend.checkpointer, backend.client
    tid = _tid()
    await cp.save(0, snap(tid, status=RunStatus.FAILED, reason="boom"))
    keys = cp.layout.thread(tid)
    assert await client.pttl(keys.head) > 0
    await cp.save(1, snap(tid, status=RunStatus.RUNNING))
    assert await client.pttl(keys.head) == -1
    assert await client.pttl(keys.hist) == -1


async def test_without_completed_ttl_nothing_expires(make_backend: BackendFactory) -> None:
    backend = make_backend()
    cp = backend.checkpointer
    tid = _tid()
    await cp.save(0, snap(tid, status=RunStatus.COMPLETED))
    assert await backend.client.pttl(cp.layout.thread(tid).head) == -1


async def test_long_history_and_batched_prune(
    make_standalone_backend: BackendFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    cp = make_standalone_backend().checkpointer
    tid = _tid()
    for revision in range(1100):
        await cp.save(revision, snap(tid, {"n": revision + 1}))
    history = await cp.get_history(tid, 1050)
    assert [s.revision for s in history] == list(range(1100, 50, -1))
    assert [s.state["n"] for s in history[:3]] == [1100, 1099, 1098]
    monkeypatch.setattr(checkpointer_module, "_PRUNE_BATCH", 300)
    await cp.prune(tid, 7)
    assert [s.revision for s in await cp.get_history(tid, 2000)] == list(range(1100, 1093, -1))
    assert await cp.save(1100, snap(tid)) == 1101


async def test_a_resent_save_is_not_a_conflict(make_backend: BackendFactory) -> None:
    """A driver that resends a save whose answer it lost gets the landed revision back,
    not a conflict; a different snapshot at the same revision still conflicts."""
    cp = make_backend().checkpointer
    tid = _tid()
    first = snap(tid)
    assert await cp.save(0, first) == 1
    assert await cp.save(0, first) == 1
    assert [s.revision for s in await cp.get_history(tid)] == [1]
    with pytest.raises(ConcurrencyConflictError):
        await cp.save(0, snap(tid))
    anonymous = Snapshot(tid, {"n": 1}, "start")  # no write id: no replay detection
    assert await cp.save(1, anonymous) == 2
    with pytest.raises(ConcurrencyConflictError):
        await cp.save(1, anonymous)


async def test_list_threads_reads_columns_not_records(make_backend: BackendFactory) -> None:
    backend = make_backend()
    cp = backend.checkpointer
    tid = _tid()
    await cp.save(0, snap(tid, pointer="here", handoff_status=HandoffStatus.PENDING))
    await corrupt_head(backend, tid)
    [summary] = await cp.list_threads()
    assert (summary.thread_id, summary.execution_pointer) == (tid, "here")


async def test_oversized_snapshots_are_refused(make_backend: BackendFactory) -> None:
    backend = make_backend()
    cp = RedisCheckpointer[Any](backend.client, namespace=backend.namespace, max_record_bytes=4096)
    tid = _tid()
    with pytest.raises(SnapshotTooLargeError, match="4096"):
        await cp.save(0, snap(tid, {"blob": "x" * 5000}))
    assert await cp.save(0, snap(tid, {"blob": "x" * 100})) == 1


async def test_a_namespace_keeps_its_shard_count(
    make_backend: BackendFactory, redis_target: RedisTarget
) -> None:
    backend = make_backend()
    await backend.checkpointer.save(0, snap(_tid()))
    other = make_backend(shards=8)
    with pytest.raises(SchemaVersionError, match="shards=16"):
        await other.checkpointer.load(_tid())
    with pytest.raises(SchemaVersionError):
        await other.leases.acquire(_tid(), "owner", 5)
    assert redis_target.url  # the check is the same on a cluster


async def test_fences_the_lease_manager_of_its_own_domain(make_backend: BackendFactory) -> None:
    backend = make_backend()
    peer = make_backend()  # another client, same server and namespace
    elsewhere = make_backend(namespace=f"flowy-test-other-{uuid.uuid4().hex[:6]}")
    cp = backend.checkpointer
    assert cp.fences(backend.leases)
    assert cp.fences(peer.leases)
    assert not cp.fences(elsewhere.leases)
    assert not cp.fences(MemoryLeaseManager())


async def test_enqueue_inside_save_with_outbox_is_checked(make_backend: BackendFactory) -> None:
    backend: RedisBackend[Any] = make_backend()
    cp, outbox = backend.checkpointer, backend.outbox
    tid = _tid()
    intent_thread = next(
        f"{tid}-{i}"
        for i in range(1000)
        if cp.layout.shard_of(f"{tid}-{i}") != cp.layout.shard_of(tid)
    )
    from flowy.testing.suite._support import make_intent

    async def other_shard(tx: object, revision: int) -> None:
        await outbox.enqueue_intent_tx(tx, make_intent(intent_thread, revision))

    with pytest.raises(ValueError, match="shard"):
        await cp.save_with_outbox(0, snap(tid), other_shard)

    async def not_a_tx(tx: object, revision: int) -> None:
        await outbox.enqueue_intent_tx(object(), make_intent(tid, revision))

    with pytest.raises(TypeError, match="save_with_outbox"):
        await cp.save_with_outbox(0, snap(tid), not_a_tx)

    foreign = RedisOutbox(backend.client, namespace=backend.namespace, shards=4)

    async def other_layout(tx: object, revision: int) -> None:
        await foreign.enqueue_intent_tx(tx, make_intent(tid, revision))

    with pytest.raises(ValueError, match="namespace"):
        await cp.save_with_outbox(0, snap(tid), other_layout)

    kept: list[object] = []

    async def keep(tx: object, revision: int) -> None:
        kept.append(tx)
        await outbox.enqueue_intent_tx(tx, make_intent(tid, revision))

    assert await cp.save_with_outbox(0, snap(tid), keep) == 1
    assert isinstance(kept[0], RedisTransaction)
    with pytest.raises(RuntimeError, match="closed"):
        await outbox.enqueue_intent_tx(kept[0], make_intent(tid, 2))
    [message] = await backend.consumer.claim(10, 30)
    assert message.intent == make_intent(tid, 1)


async def test_clients_that_decode_responses_are_refused(standalone: RedisTarget) -> None:
    client = raw_client(standalone.url, decode_responses=True)
    try:
        with pytest.raises(ValueError, match="decode_responses"):
            RedisCheckpointer[Any](client)
        with pytest.raises(ValueError, match="decode_responses"):
            RedisLeaseManager(client)
    finally:
        await client.aclose()
    with pytest.raises(TypeError, match=r"redis\.asyncio"):
        RedisCheckpointer[Any](object())  # type: ignore[arg-type]


async def test_an_unreachable_server_is_storage_unavailable() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cp = RedisCheckpointer[Any].from_url(
        f"redis://127.0.0.1:{port}/0", socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0)
    )
    try:
        with pytest.raises(StorageUnavailableError, match="was unavailable"):
            await cp.save(0, snap(_tid()))
        with pytest.raises(StorageUnavailableError):
            await cp.load(_tid())
    finally:
        await cp.aclose()


async def test_from_url_makes_working_objects(redis_target: RedisTarget) -> None:
    namespace = f"flowy-test-{uuid.uuid4().hex[:12]}"
    backend = RedisBackend[Any].from_url(
        redis_target.url, cluster=redis_target.cluster, namespace=namespace
    )
    cp = RedisCheckpointer[Any].from_url(
        redis_target.url, cluster=redis_target.cluster, namespace=namespace
    )
    try:
        tid = _tid()
        assert await backend.checkpointer.save(0, snap(tid)) == 1
        assert (await cp.load(tid))[1] == 1
        assert await backend.purge() > 0
    finally:
        await cp.aclose()
        await backend.aclose()
