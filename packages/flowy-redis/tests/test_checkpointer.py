"""``RedisCheckpointer`` beyond the conformance suite: one script per save, expiry of
finished threads, listing in thread-id order across shards, history and prune in
batches, the recorded layout and its migration, fencing domains, resent saves and the
client checks."""

from __future__ import annotations

import asyncio
import base64
import socket
import time
import uuid
from typing import Any

import pytest
from redis.asyncio import Redis
from redis_support import BackendFactory, RedisTarget, corrupt_head, new_namespace, raw_client

import flowy
import flowy_redis._checkpointer as checkpointer_module
from flowy import ConcurrencyConflictError, ThreadNotFoundError
from flowy.errors import SchemaVersionError, SnapshotTooLargeError, StorageUnavailableError
from flowy.memory import MemoryLeaseManager
from flowy.storage import HandoffStatus, RunStatus, Snapshot
from flowy.storage.dialect import new_write_id
from flowy.testing.suite._support import make_intent
from flowy_redis import RedisBackend, purge_namespace
from flowy_redis._keys import STATUS_DIGITS
from flowy_redis._scripts import HEADS, LuaScript
from flowy_redis._store import Store

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
        async with RedisBackend[Any].from_client(client, namespace=namespace) as backend:
            cp, tid = backend.checkpointer, _tid()
            await cp.save(0, snap(tid))  # first use loads the scripts
            await cp.load(tid)
            _CountingRedis.sent = []
            for revision in range(1, 11):
                assert await cp.save(revision, snap(tid, {"n": revision})) == revision + 1
            lease = await backend.leases.acquire(tid, "owner", 30)

            async def enqueue(tx: object, revision: int) -> None:
                await backend.outbox.enqueue_intent_tx(tx, make_intent(tid, revision))

            await cp.save_with_outbox(11, snap(tid), enqueue, lease=lease)
            assert _CountingRedis.sent == ["EVALSHA"] * 12
            _CountingRedis.sent = []
            await cp.load(tid)
            assert _CountingRedis.sent == ["EVALSHA"]
        assert not client.connection_pool._in_use_connections  # pyright: ignore[reportPrivateUsage]
        assert await client.ping()  # pyright: ignore[reportUnknownMemberType]  # from_client: the application's client stays open
    finally:
        await purge_namespace(client, namespace)
        await client.aclose()


async def test_finished_threads_expire(make_backend: BackendFactory) -> None:
    backend = make_backend(completed_ttl=0.4)
    cp, client = backend.checkpointer, backend.client
    tid, kept = _tid(), _tid()
    await cp.save(0, snap(tid))
    await cp.save(0, snap(kept))
    keys = backend.store.layout.thread(tid)
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
    assert await client.zcard(keys.shard.exp) == 0


async def test_later_finished_saves_forget_expired_threads(make_backend: BackendFactory) -> None:
    """The index entries of expired threads do not accumulate: the next finished save
    of the shard removes them, whether or not anybody lists threads."""
    backend = make_backend(completed_ttl=0.2, shards=1)
    cp, client = backend.checkpointer, backend.client
    shard = backend.store.layout.shard(0)
    for tid in (f"{_tid()}-{i}" for i in range(5)):
        await cp.save(0, snap(tid, status=RunStatus.FAILED))
    assert await client.zcard(shard.threads) == 5
    await asyncio.sleep(0.4)
    await cp.save(0, snap(last := _tid(), status=RunStatus.COMPLETED))
    assert await client.zcard(shard.threads) == 1
    assert await client.zrange(shard.exp, 0, -1) == [last.encode()]  # pyright: ignore[reportUnknownMemberType]


async def test_a_thread_saved_again_after_finishing_stops_expiring(
    make_backend: BackendFactory,
) -> None:
    backend = make_backend(completed_ttl=30)
    cp, client = backend.checkpointer, backend.client
    tid = _tid()
    await cp.save(0, snap(tid, status=RunStatus.FAILED, reason="boom"))
    keys = backend.store.layout.thread(tid)
    assert await client.pttl(keys.head) > 0
    await cp.save(1, snap(tid, status=RunStatus.RUNNING))
    assert await client.pttl(keys.head) == -1
    assert await client.pttl(keys.hist) == -1
    assert await client.zcard(keys.shard.exp) == 0


async def test_without_completed_ttl_nothing_expires(make_backend: BackendFactory) -> None:
    backend = make_backend()
    tid = _tid()
    await backend.checkpointer.save(0, snap(tid, status=RunStatus.COMPLETED))
    assert await backend.client.pttl(backend.store.layout.thread(tid).head) == -1


async def test_listing_is_in_thread_id_order_across_shards(make_backend: BackendFactory) -> None:
    cp = make_backend(shards=5).checkpointer
    ids = [f"list-{i:03d}-{'é' if i % 3 else 'e'}" for i in range(40)]
    statuses = list(HandoffStatus)
    for index, tid in enumerate(ids):
        await cp.save(0, snap(tid, handoff_status=statuses[index % 4]))
    listed = [s.thread_id for s in await cp.list_threads(limit=1000)]
    assert listed == sorted(ids)
    pages: list[str] = []
    after: str | None = None
    while page := await cp.list_threads(limit=7, after=after):
        pages += [s.thread_id for s in page]
        after = page[-1].thread_id
    assert pages == sorted(ids)
    pending = frozenset({HandoffStatus.PENDING, HandoffStatus.ORPHANED})
    wanted = sorted(t for i, t in enumerate(ids) if statuses[i % 4] in pending)
    got = await cp.list_threads(handoff_statuses=pending, limit=3, after=wanted[2])
    assert [s.thread_id for s in got] == wanted[3:6]


async def test_a_page_of_list_threads_is_two_scripts(standalone: RedisTarget) -> None:
    """One script merges the index of every shard, one reads the heads: a page costs the
    same two round trips over 30 threads as over 300."""
    client = _CountingRedis.from_url(standalone.url)  # pyright: ignore[reportUnknownMemberType]
    namespace = new_namespace()
    try:
        async with RedisBackend[Any].from_client(client, namespace=namespace) as backend:
            cp = backend.checkpointer
            ids = [f"page-{i:04d}" for i in range(300)]
            saved = 0
            for count in (30, 300):
                for tid in ids[saved:count]:
                    await cp.save(0, snap(tid))
                saved = count
                _CountingRedis.sent = []
                page = await cp.list_threads(limit=20, after=ids[count // 4])
                assert [s.thread_id for s in page] == ids[count // 4 + 1 : count // 4 + 21]
                assert _CountingRedis.sent == ["EVALSHA", "EVALSHA"]
    finally:
        await purge_namespace(client, namespace)
        await client.aclose()


async def test_listing_skips_and_forgets_threads_expired_a_while_ago(
    make_backend: BackendFactory,
) -> None:
    """Expired threads the saves have not forgotten yet are skipped and forgotten by the
    script that merges the index: they leave the thread index and the expiry index."""
    backend = make_backend(completed_ttl=0.1, shards=2)
    cp, client = backend.checkpointer, backend.client
    for i in range(40):
        await cp.save(0, snap(f"a-{i:02d}", status=RunStatus.COMPLETED))
    live = [f"b-{i}" for i in range(3)]
    for tid in live:
        await cp.save(0, snap(tid))
    await asyncio.sleep(1.4)  # the script forgets a thread a second after its expiry
    got = await cp.list_threads(limit=2)
    assert [s.thread_id for s in got] == live[:2]
    shards = backend.store.layout.all_shards()
    assert sum([await client.zcard(s.threads) for s in shards]) == len(live)
    assert sum([await client.zcard(s.exp) for s in shards]) == 0
    assert [s.thread_id for s in await cp.list_threads()] == live


async def test_a_stale_index_member_neither_repeats_nor_misplaces_a_thread(
    make_backend: BackendFactory,
) -> None:
    """A thread whose old index member is still there (a save moved it between the two
    scripts of a listing) is listed once, under the status of its head, and the stale
    member is removed."""
    backend = make_backend(shards=1)
    cp, client = backend.checkpointer, backend.client
    ids = ["s-1", "s-2", "s-3"]
    for tid in ids:
        await cp.save(0, snap(tid, handoff_status=HandoffStatus.ENQUEUED))
    threads = backend.store.layout.shard(0).threads
    digit = STATUS_DIGITS[HandoffStatus.PENDING]
    await client.zadd(threads, {digit + b"s-2": 0})
    listed = await cp.list_threads(limit=3)  # a page holding both members of s-2
    assert [(s.thread_id, s.handoff_status) for s in listed] == [
        (tid, HandoffStatus.ENQUEUED) for tid in ids
    ]
    assert await client.zscore(threads, digit + b"s-2") is None
    await client.zadd(threads, {digit + b"s-2": 0})
    pending = frozenset({HandoffStatus.PENDING})
    assert await cp.list_threads(handoff_statuses=pending) == []
    assert await client.zscore(threads, digit + b"s-2") is None
    assert [s.thread_id for s in await cp.list_threads()] == ids


async def test_a_thread_saved_between_the_two_scripts_is_listed_as_saved(
    make_backend: BackendFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A save that moves a thread to another hand-off status between the script that
    merges the index and the one that reads the heads: the listing reports the head as
    saved, or leaves it out when the filter no longer takes it."""
    backend = make_backend(shards=1)
    cp = backend.checkpointer
    ids = ["m-1", "m-2", "m-3"]
    for tid in ids:
        await cp.save(0, snap(tid))
    moves: list[str] = []
    run = Store.run

    async def save_between(
        store: Store, script: LuaScript, keys: Any, args: Any, action: Any
    ) -> Any:
        if script is HEADS and moves:
            await cp.save(1, snap(moves.pop(), handoff_status=HandoffStatus.ENQUEUED))
        return await run(store, script, keys, args, action)

    monkeypatch.setattr(Store, "run", save_between)
    moves.append("m-2")
    listed = await cp.list_threads()
    assert [(s.thread_id, s.revision, s.handoff_status) for s in listed] == [
        ("m-1", 1, HandoffStatus.NONE),
        ("m-2", 2, HandoffStatus.ENQUEUED),
        ("m-3", 1, HandoffStatus.NONE),
    ]
    moves.append("m-3")
    none = frozenset({HandoffStatus.NONE})
    assert [s.thread_id for s in await cp.list_threads(handoff_statuses=none)] == ["m-1"]
    assert not moves


async def test_listed_columns_keep_any_text(make_backend: BackendFactory) -> None:
    """The heads' columns cross the listing as JSON: quotes, backslashes, control
    characters, NUL and characters beyond the BMP come back as saved."""
    cp = make_backend().checkpointer
    text = 'a"b\\c/d\ne\x00f\x1fg\x7fé😀\u2028'
    tid = _tid()
    saved = Snapshot(
        tid,
        {"n": 0},
        text,
        reason=text,
        graph_version=text,
        updated_at=1.25,
        wake_at=2.5,
        handoff_status=HandoffStatus.PENDING,
        handoff_pending_at=1.5,
        write_id=new_write_id(),
    )
    await cp.save(0, saved)
    [summary] = await cp.list_threads()
    assert (summary.thread_id, summary.revision, summary.handoff_status) == (
        tid,
        1,
        HandoffStatus.PENDING,
    )
    assert (summary.execution_pointer, summary.reason, summary.graph_version) == (text,) * 3
    assert (summary.updated_at, summary.wake_at, summary.handoff_pending_at) == (1.25, 2.5, 1.5)


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
    anonymous = Snapshot(tid, {"n": 1}, "start")  # no write id: no resend detection
    assert await cp.save(1, anonymous) == 2
    with pytest.raises(ConcurrencyConflictError):
        await cp.save(1, anonymous)


async def test_list_threads_reads_columns_not_records(make_backend: BackendFactory) -> None:
    backend = make_backend()
    tid = _tid()
    await backend.checkpointer.save(
        0, snap(tid, pointer="here", handoff_status=HandoffStatus.PENDING)
    )
    await corrupt_head(backend, tid)
    [summary] = await backend.checkpointer.list_threads()
    assert (summary.thread_id, summary.execution_pointer) == (tid, "here")


async def test_oversized_snapshots_are_refused(make_backend: BackendFactory) -> None:
    cp = make_backend(max_record_bytes=4096).checkpointer
    tid = _tid()
    with pytest.raises(SnapshotTooLargeError, match="4096"):
        await cp.save(0, snap(tid, {"blob": "x" * 5000}))
    assert await cp.save(0, snap(tid, {"blob": "x" * 100})) == 1


async def test_a_namespace_keeps_its_shard_count(make_backend: BackendFactory) -> None:
    backend = make_backend()
    await backend.checkpointer.save(0, snap(_tid()))
    with pytest.raises(SchemaVersionError, match="shards=16"):
        await make_backend(shards=8).open()
    with pytest.raises(SchemaVersionError, match="shards=16"):  # unopened: on first use
        await make_backend(shards=8).leases.acquire(_tid(), "owner", 5)


async def test_a_layout_1_namespace_is_migrated(make_backend: BackendFactory) -> None:
    """A namespace written by flowy-redis 0.1 is refused until ``setup()`` rebuilds
    its thread index and gives its lease records an expiry."""
    backend = make_backend()
    client: Any = backend.client
    layout = backend.store.layout
    await client.hset(layout.meta, mapping={"shards": 16, "layout": 1})
    never = 2**48 - 1
    # c finished and expires in an hour: its expiry moves to the shard's expiry index.
    expiry = int(time.time() * 1000) + 3_600_000
    threads = {"a": (0, never), "b": (2, never), "c": (3, expiry)}
    for tid, (position, expiry) in threads.items():
        keys = layout.thread(tid)
        await client.zadd(
            keys.shard.threads[: -len(b"threads")] + b"ix",
            {base64.urlsafe_b64encode(tid.encode()): position * 2**48 + expiry},
        )
        await client.hset(keys.head, mapping={"revision": 1, "pointer": "p", "status": "running",
            "reason": "", "handoff_status": list(HandoffStatus)[position].value,
            "handoff_pending_at": "", "updated_at": "1.0", "oldest": 1})  # fmt: skip
    live, released = layout.thread("a").lease, layout.thread("b").lease
    await client.hset(live, mapping={"owner": "o", "token": 7, "exp": 2**62})
    await client.hset(released, mapping={"owner": "o", "token": 3, "exp": 0})
    with pytest.raises(SchemaVersionError, match=r"schema version 1, older .*backend.setup\(\)"):
        await make_backend().open()  # a failed open closes the backend
    assert await backend.setup() == 2
    assert await backend.setup() == 2
    await backend.open()
    listed = await backend.checkpointer.list_threads()
    assert [(s.thread_id, s.handoff_status) for s in listed] == [
        ("a", HandoffStatus.NONE),
        ("b", HandoffStatus.ENQUEUED),
        ("c", HandoffStatus.ORPHANED),
    ]
    assert await client.zscore(layout.thread("c").shard.exp, "c") == expiry
    assert await client.pttl(live) > 0
    assert await client.exists(released) == 0
    holder = await backend.leases.holder("a")
    assert holder is not None and holder.fencing_token == 7
    assert await backend.checkpointer.save(1, snap("b")) == 2
    [moved] = await backend.checkpointer.list_threads(after="a", limit=1)
    assert (moved.thread_id, moved.handoff_status) == ("b", HandoffStatus.NONE)


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
    backend = make_backend()
    cp, outbox = backend.checkpointer, backend.outbox
    layout = backend.store.layout
    tid = _tid()
    elsewhere = next(
        f"{tid}-{i}" for i in range(1000) if layout.shard_of(f"{tid}-{i}") != layout.shard_of(tid)
    )

    async def other_shard(tx: object, revision: int) -> None:
        await outbox.enqueue_intent_tx(tx, make_intent(elsewhere, revision))

    with pytest.raises(ValueError, match="shard"):
        await cp.save_with_outbox(0, snap(tid), other_shard)

    foreign = make_backend(namespace=f"flowy-test-other-{uuid.uuid4().hex[:6]}").outbox

    async def other_store(tx: object, revision: int) -> None:
        await foreign.enqueue_intent_tx(tx, make_intent(tid, revision))

    with pytest.raises(ValueError, match="not in one store"):
        await cp.save_with_outbox(0, snap(tid), other_store)
    assert await backend.consumer.claim(10, 30) == []
    assert await cp.list_threads() == []


async def test_clients_that_decode_responses_are_refused(standalone: RedisTarget) -> None:
    client = raw_client(standalone.url, decode_responses=True)
    try:
        with pytest.raises(ValueError, match="decode_responses"):
            RedisBackend.from_client(client)
    finally:
        await client.aclose()
    with pytest.raises(TypeError, match=r"redis\.asyncio"):
        RedisBackend.from_client(object())  # type: ignore[arg-type]


async def test_an_unreachable_server_is_storage_unavailable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"redis://:s3cret@127.0.0.1:{port}/0?socket_connect_timeout=0.2"
    with pytest.raises(StorageUnavailableError, match="was unavailable") as info:
        await flowy.connect(url)
    assert "s3cret" not in str(info.value)
    backend = RedisBackend[Any].from_client(raw_client(url), owns_client=True)
    try:
        with pytest.raises(StorageUnavailableError):
            await backend.checkpointer.load(_tid())
    finally:
        await backend.aclose()


# -- the recency index (standalone) ---------------------------------------------------

_SECOND = 1_700_000_000


def _at(thread_id: str, offset: float, **fields: Any) -> Snapshot[Any]:
    return snap(thread_id, updated_at=_SECOND + offset, **fields)


async def test_the_recency_index_is_written_only_in_a_new_second(
    make_standalone_backend: BackendFactory,
) -> None:
    """A save in the same second as the head's leaves the thread's member alone (a
    score set by hand survives it); the first save in a new second moves it."""
    backend = make_standalone_backend()
    cp, client, recent = backend.checkpointer, backend.client, backend.store.layout.recent
    tid = _tid()
    await cp.save(0, _at(tid, 0.1))
    assert await client.zscore(recent, tid) == _SECOND
    await client.zadd(recent, {tid: 7})  # a marker: rewritten only by a write
    await cp.save(1, _at(tid, 0.9))
    assert await client.zscore(recent, tid) == 7
    await cp.save(2, _at(tid, 1.0))
    assert await client.zscore(recent, tid) == _SECOND + 1
    await cp.delete(tid)
    assert await client.zscore(recent, tid) is None


async def test_threads_saved_before_the_index_are_filled_once(
    make_standalone_backend: BackendFactory,
) -> None:
    """A namespace whose threads were saved before the recency index existed (no
    members, no ``recent`` mark in its meta hash) is filled by the first
    ``recent_threads`` of a process; a save in the same second as such a head adds
    nothing itself, so the fill is what lists it."""
    first = make_standalone_backend()
    cp, client, layout = first.checkpointer, first.client, first.store.layout
    ids = [f"old-{i:03d}" for i in range(1_203)]  # more than two pages of the fill
    for i, tid in enumerate(ids):
        await cp.save(0, _at(tid, i % 7 + 0.5))
    await client.delete(layout.recent)
    await client.hdel(layout.meta, "recent")
    await cp.save(1, _at(ids[0], 0.75))  # the same second: no member written
    await cp.delete(ids[1])
    assert await client.zcard(layout.recent) == 0
    later = make_standalone_backend(namespace=first.namespace)
    listed = await later.checkpointer.recent_threads(limit=2_000)
    kept = [tid for tid in ids if tid != ids[1]]
    want = sorted(((i % 7, tid) for i, tid in enumerate(ids) if tid != ids[1]), reverse=True)
    assert [s.thread_id for s in listed] == [tid for _, tid in want]
    assert len(listed) == len(kept)
    assert await client.hget(layout.meta, "recent") == b"1"
    assert await client.zcard(layout.recent) == len(kept)


async def test_expired_threads_leave_the_recent_listing(
    make_standalone_backend: BackendFactory,
) -> None:
    backend = make_standalone_backend(completed_ttl=0.2)
    cp, client, recent = backend.checkpointer, backend.client, backend.store.layout.recent
    done, live = _tid(), _tid()
    await cp.save(0, _at(done, 2, status=RunStatus.COMPLETED))
    await cp.save(0, _at(live, 1))
    assert [s.thread_id for s in await cp.recent_threads()] == [done, live]
    await asyncio.sleep(0.4)
    assert [s.thread_id for s in await cp.recent_threads()] == [live]
    assert await client.zscore(recent, done) is None  # forgotten by the listing


async def test_a_cluster_keeps_no_recency_index(cluster_namespace: str, cluster_url: str) -> None:
    url = RedisTarget(cluster_url, True).store_url(namespace=cluster_namespace)
    async with flowy.connect(url) as backend:
        assert not backend.capabilities.recent_index
        cp = backend.checkpointer
        await cp.save(0, _at("c-1", 1))
        await cp.save(0, _at("c-2", 2))
        assert [s.thread_id for s in await flowy.storage.recent_threads(cp)] == ["c-2", "c-1"]
