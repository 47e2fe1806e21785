"""Durable time on Redis beyond the conformance suite: the per-shard timer sets (exact
scores, merged across shards, written by the save script), the inbox and journal keys
(removed by delete, expiring with a finished thread under ``completed_ttl``), heads
written before there were timers, and lost connections."""

from __future__ import annotations

import asyncio
import contextlib
import urllib.parse
import uuid
from collections.abc import AsyncGenerator
from dataclasses import replace
from typing import Any

import pytest
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis_support import BackendFactory, RedisTarget, raw_client

from flowy.errors import StorageUnavailableError
from flowy.storage import ActivityRecord, ActivityStatus, Limits, RunStatus, Signal, Snapshot, Timer
from flowy.storage.dialect import new_write_id
from flowy.testing.suite._support import make_intent
from flowy_redis import RedisBackend

pytestmark = pytest.mark.anyio


def _tid(prefix: str = "dt") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def snap(thread_id: str, wake_at: float | None = None, **fields: Any) -> Snapshot[Any]:
    status = fields.pop("status", RunStatus.WAITING if wake_at is not None else RunStatus.RUNNING)
    return Snapshot(
        thread_id, {"n": 1}, "step", status=status, write_id=new_write_id(), wake_at=wake_at
    )


def signal(thread_id: str, signal_id: str, payload: Any = None) -> Signal:
    return Signal(thread_id, "approval", payload, signal_id, sent_at=1_700_000_000.0)


def record(key: str) -> ActivityRecord:
    return ActivityRecord(key, ActivityStatus.STARTED, "charge", 1, started_at=1.0)


@pytest.mark.parametrize(
    "wake_at",
    [
        1_700_000_000.25,
        1_700_000_000.1,
        0.1 + 0.2,
        253402300799.0,  # MAX_TIMESTAMP, the latest time stored
        253402300798.99997,
        12.5,
        5e-324,
    ],
)
async def test_wake_at_is_stored_exactly(make_backend: BackendFactory, wake_at: float) -> None:
    """Scores are IEEE doubles: the shortest exact spelling comes back as the same float,
    in the timer index and in the head's columns."""
    backend = make_backend()
    cp = backend.checkpointer
    tid = _tid()
    await cp.save(0, snap(tid, wake_at))
    assert await cp.timers(limit=10) == [Timer(tid, wake_at)]
    [summary] = await cp.list_threads()
    assert summary.wake_at == wake_at
    keys = backend.store.layout.thread(tid)
    client: Any = backend.client
    assert await client.zscore(keys.shard.timers, tid.encode()) == wake_at
    assert float(await client.hget(keys.head, "wake_at")) == wake_at


async def test_timers_merge_across_shards_by_time_then_id(make_backend: BackendFactory) -> None:
    cp = make_backend(shards=5).checkpointer
    at = 1_700_000_000.5
    expected: list[Timer] = []
    for index in range(30):
        tid = f"t-{index:02d}-{'é' if index % 2 else 'e'}"
        wake_at = at + index % 3  # three times, ten threads each, over every shard
        await cp.save(0, snap(tid, wake_at))
        expected.append(Timer(tid, wake_at))
    expected.sort(key=lambda t: (t.wake_at, t.thread_id))
    assert await cp.timers(limit=100) == expected
    assert await cp.timers(limit=7) == expected[:7]
    assert await cp.timers(before=at + 1, limit=100) == expected[:20]
    assert await cp.timers(before=at + 1, limit=13) == expected[:13]
    assert await cp.timers(before=at - 0.001) == []


async def test_the_timer_is_written_only_when_it_changes(make_backend: BackendFactory) -> None:
    backend = make_backend()
    cp, client = backend.checkpointer, backend.client
    tid = _tid()
    timers = backend.store.layout.thread(tid).shard.timers
    await cp.save(0, snap(tid))
    assert await client.exists(timers) == 0  # no wake-up time: no index write
    await cp.save(1, snap(tid, 50.0))
    await cp.save(2, snap(tid, 50.0))
    assert await cp.timers() == [Timer(tid, 50.0)]
    await cp.save(3, snap(tid, 40.0))
    assert await cp.timers() == [Timer(tid, 40.0)]
    await cp.save(4, snap(tid))
    assert await cp.timers() == []
    assert await client.exists(timers) == 0


async def test_delete_removes_every_key_of_the_thread(make_backend: BackendFactory) -> None:
    backend = make_backend()
    cp, client = backend.checkpointer, backend.client
    tid, other = _tid(), _tid()
    for thread_id in (tid, other):
        await cp.save(0, snap(thread_id, 10.0))
        await cp.append_signal(signal(thread_id, "s1"))
        await cp.put_activity(thread_id, record("k"))
    keys = backend.store.layout.thread(tid)
    owned = (keys.head, keys.hist, keys.inbox, keys.sigids, keys.journal)
    assert await client.exists(*owned) == len(owned)
    await cp.delete(tid)
    assert await client.exists(*owned) == 0
    assert await client.zscore(keys.shard.timers, tid.encode()) is None
    assert await cp.timers() == [Timer(other, 10.0)]
    assert [s.seq for s in await cp.signals(other)] == [1]
    assert len(await cp.journal(other)) == 1
    # The numbering starts again.
    assert (await cp.append_signal(signal(tid, "s2"))).seq == 1


async def test_a_signal_to_a_missing_thread_is_kept(make_backend: BackendFactory) -> None:
    """Signals may arrive before the thread's first save; that save keeps them."""
    cp = make_backend().checkpointer
    tid = _tid()
    await cp.append_signal(signal(tid, "early"))
    await cp.save(0, snap(tid))
    assert [s.signal_id for s in await cp.signals(tid)] == ["early"]
    assert (await cp.append_signal(signal(tid, "later"))).seq == 2


async def test_long_inboxes_are_read_in_batches(make_backend: BackendFactory) -> None:
    backend = make_backend()
    backend.limits = Limits(max_pending_signals=2000)
    cp = backend.checkpointer
    tid = _tid()
    for index in range(1205):
        await cp.append_signal(signal(tid, f"s{index}", index))
    got = await cp.signals(tid, after=3, limit=10**12)
    assert [s.seq for s in got] == list(range(4, 1206))
    assert [s.payload for s in got[:3]] == [3, 4, 5]
    assert [s.seq for s in await cp.signals(tid, after=1000, limit=600)] == list(range(1001, 1206))
    assert await cp.signals(tid, after=10**20) == []


async def test_a_finished_thread_expires_with_its_inbox_journal_and_timer(
    make_backend: BackendFactory,
) -> None:
    backend = make_backend(completed_ttl=0.4)
    cp, client = backend.checkpointer, backend.client
    tid, kept = _tid(), _tid()
    keys = backend.store.layout.thread(tid)
    await cp.save(0, snap(kept, 5.0))
    await cp.save(0, snap(tid))
    await cp.save(1, snap(tid, 1.0, status=RunStatus.COMPLETED))  # a timer on a finished head
    for key in (keys.head, keys.hist):
        assert 0 < await client.pttl(key) <= 400
    # Created after the thread finished: they expire with it.
    await cp.put_activity(tid, record("late"))
    await cp.append_signal(signal(tid, "after"))
    for key in (keys.journal, keys.inbox, keys.sigids):
        assert 0 < await client.pttl(key) <= 400
    assert await cp.timers() == [Timer(tid, 1.0), Timer(kept, 5.0)]
    await asyncio.sleep(0.6)
    # The head is gone; its timer is no longer listed, and is removed from the index.
    assert await cp.timers() == [Timer(kept, 5.0)]
    assert await client.zscore(keys.shard.timers, tid.encode()) is None
    assert await cp.signals(tid) == []
    assert await cp.journal(tid) == []
    # The id starts over: a new thread, numbering from 1.
    assert await cp.save(0, snap(tid)) == 1
    assert (await cp.append_signal(signal(tid, "before"))).seq == 1
    assert await client.pttl(keys.inbox) == -1


async def test_later_finished_saves_forget_expired_timers(make_backend: BackendFactory) -> None:
    backend = make_backend(completed_ttl=0.2, shards=1)
    cp, client = backend.checkpointer, backend.client
    timers = backend.store.layout.shard(0).timers
    for tid in (_tid() for _ in range(3)):
        await cp.save(0, snap(tid, 7.0, status=RunStatus.FAILED))
    assert await client.zcard(timers) == 3
    await asyncio.sleep(0.4)
    await cp.save(0, snap(_tid(), status=RunStatus.COMPLETED))
    assert await client.zcard(timers) == 0


async def test_a_revived_thread_keeps_its_inbox_and_journal(make_backend: BackendFactory) -> None:
    backend = make_backend(completed_ttl=30)
    cp, client = backend.checkpointer, backend.client
    tid = _tid()
    keys = backend.store.layout.thread(tid)
    await cp.save(0, snap(tid))
    await cp.append_signal(signal(tid, "s"))
    await cp.put_activity(tid, record("k"))
    await cp.save(1, snap(tid, status=RunStatus.FAILED))
    for key in (keys.inbox, keys.sigids, keys.journal):  # they expire with the head
        assert await client.pttl(key) > 0
    await cp.save(2, snap(tid, 3.0))
    for key in (keys.head, keys.hist, keys.inbox, keys.sigids, keys.journal):
        assert await client.pttl(key) == -1
    assert await cp.timers() == [Timer(tid, 3.0)]


async def test_heads_saved_before_timers_existed(make_backend: BackendFactory) -> None:
    """A head written by flowy-redis 0.2.0 has no wake_at column: it has no timer, and
    the next save indexes the new head's."""
    backend = make_backend()
    cp, client = backend.checkpointer, backend.client
    tid = _tid()
    await cp.save(0, snap(tid))
    await client.hdel(backend.store.layout.thread(tid).head, "wake_at")
    [summary] = await cp.list_threads()
    assert summary.wake_at is None
    assert await cp.timers() == []
    await cp.save(1, snap(tid, 9.5))
    assert await cp.timers() == [Timer(tid, 9.5)]
    [summary] = await cp.list_threads()
    assert summary.wake_at == 9.5


async def test_heads_saved_before_graph_versions_existed(make_backend: BackendFactory) -> None:
    """A head written by flowy-redis 0.2.0 has no graph_version field: it lists with
    none, and the next save writes the new head's."""
    backend = make_backend()
    cp, client = backend.checkpointer, backend.client
    tid = _tid()
    await cp.save(0, replace(snap(tid), graph_version="v1"))
    head = backend.store.layout.thread(tid).head
    assert await client.hget(head, "graph_version") == b"v1"
    await client.hdel(head, "graph_version")
    [summary] = await cp.list_threads()
    assert summary.graph_version == ""
    await cp.save(1, replace(snap(tid), graph_version="v2 \u00fc"))
    [summary] = await cp.list_threads()
    assert summary.graph_version == "v2 \u00fc"


async def test_save_with_outbox_writes_the_timer_too(make_backend: BackendFactory) -> None:
    backend = make_backend()
    cp = backend.checkpointer
    tid = _tid()

    async def enqueue(tx: object, revision: int) -> None:
        await backend.outbox.enqueue_intent_tx(tx, make_intent(tid, revision))

    await cp.save_with_outbox(0, snap(tid, 4.0), enqueue)
    assert await cp.timers() == [Timer(tid, 4.0)]
    [message] = await backend.consumer.claim(10, 30)
    assert message.intent.thread_id == tid


@contextlib.asynccontextmanager
async def _proxy(url: str) -> AsyncGenerator[tuple[str, asyncio.Event]]:
    """A TCP proxy to the Redis at ``url``: yields the proxy's URL and an event that,
    once set, cuts every connection and refuses new ones."""
    target = urllib.parse.urlsplit(url)
    cut = asyncio.Event()
    writers: list[asyncio.StreamWriter] = []

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if cut.is_set():
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection(target.hostname, target.port)
        writers.extend((writer, up_writer))
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]

    async def cutter() -> None:
        await cut.wait()
        server.close()
        for writer in writers:
            writer.close()

    task = asyncio.create_task(cutter())
    try:
        yield f"redis://127.0.0.1:{port}{target.path}", cut
    finally:
        cut.set()
        await task
        await server.wait_closed()


async def test_a_lost_connection_is_storage_unavailable(
    make_standalone_backend: BackendFactory, standalone: RedisTarget
) -> None:
    namespace = make_standalone_backend().namespace
    async with _proxy(standalone.url) as (url, cut):
        client = raw_client(url, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
        backend = RedisBackend[Any].from_client(client, namespace=namespace, owns_client=True)
        try:
            cp, tid = backend.checkpointer, _tid()
            await cp.save(0, snap(tid, 1.0))  # the layout is checked, the scripts loaded
            await cp.append_signal(signal(tid, "s"))
            await cp.put_activity(tid, record("k"))
            cut.set()
            await asyncio.sleep(0.05)
            calls = {
                "timers": lambda: cp.timers(),
                "append_signal": lambda: cp.append_signal(signal(tid, "t")),
                "signals": lambda: cp.signals(tid),
                "put_activity": lambda: cp.put_activity(tid, record("k")),
                "get_activity": lambda: cp.get_activity(tid, "k"),
                "journal": lambda: cp.journal(tid),
            }
            for name, call in calls.items():
                with pytest.raises(StorageUnavailableError, match="was unavailable") as info:
                    await call()
                assert info.value.__cause__ is not None, name
        finally:
            await backend.aclose()


async def test_every_durable_key_is_in_the_thread_slot(
    make_backend: BackendFactory, redis_target: RedisTarget
) -> None:
    backend = make_backend()
    cp, layout = backend.checkpointer, backend.store.layout
    hostile = ["{x}", "a}:b{c", "🦜" * 300, "x\ny", _tid()]
    for tid in hostile:
        await cp.save(0, snap(tid, 2.0))
        await cp.append_signal(signal(tid, "s", tid))
        await cp.put_activity(tid, replace(record("k"), name=tid))
        assert [s.payload for s in await cp.signals(tid)] == [tid]
        assert [r.name for r in await cp.journal(tid)] == [tid]
        keys = layout.thread(tid)
        if redis_target.cluster:
            client: Any = backend.client
            slots = {await client.cluster_keyslot(k) for k in keys.checkpoint}
            assert len(slots) == 1
    assert await cp.timers() == [Timer(tid, 2.0) for tid in sorted(hostile)]
