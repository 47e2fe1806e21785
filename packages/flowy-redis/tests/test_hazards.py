"""The hazards of a Redis backend, each against the real server: a flushed script cache,
a connection lost in the middle of a save (the write landed, or did not), a driver that
resends a save, two OS processes racing on one thread, and hostile thread ids."""

from __future__ import annotations

import asyncio
import itertools
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio.retry import Retry
from redis.backoff import ConstantBackoff, NoBackoff
from redis.crc import key_slot
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis_support import BackendFactory, RedisTarget, raw_client

from flowy.errors import StorageUnavailableError
from flowy.storage import Snapshot
from flowy.storage.dialect import confirmed_save, new_write_id
from flowy.testing.suite._support import make_intent
from flowy_redis import RedisBackend, RedisCheckpointer
from flowy_redis._scripts import save_script

pytestmark = pytest.mark.anyio

_BUSY = """
local t = redis.call('TIME')
local start = tonumber(t[1]) * 1000000 + tonumber(t[2])
while true do
  t = redis.call('TIME')
  if tonumber(t[1]) * 1000000 + tonumber(t[2]) - start > tonumber(ARGV[1]) then break end
end
return 1
"""


def snap(thread_id: str, state: Any) -> Snapshot[Any]:
    return Snapshot(thread_id, state, "step", write_id=new_write_id())


def _tid() -> str:
    return f"hz-{uuid.uuid4().hex[:8]}"


async def _flush_scripts(client: Any) -> None:
    """SCRIPT FLUSH on every primary, and check the save script is gone."""
    await client.execute_command("SCRIPT FLUSH")
    exists = await client.execute_command("SCRIPT EXISTS", save_script(0).sha)
    assert not any(exists)


async def test_script_flush_between_calls(make_backend: BackendFactory) -> None:
    """NOSCRIPT (a flushed cache, a restarted server, a replica promoted without the
    scripts) is answered by loading the script and running it again."""
    backend = make_backend()
    cp, tid = backend.checkpointer, _tid()
    assert await cp.save(0, snap(tid, 1)) == 1
    await _flush_scripts(backend.client)
    assert await cp.save(1, snap(tid, 2)) == 2
    await _flush_scripts(backend.client)
    assert [s.revision for s in await cp.get_history(tid)] == [2, 1]
    await _flush_scripts(backend.client)
    lease = await backend.leases.acquire(tid, "owner", 30)
    await _flush_scripts(backend.client)
    assert await cp.save(2, snap(tid, 3), lease=lease) == 3
    await backend.outbox.enqueue_intent(make_intent(tid, 3))
    await _flush_scripts(backend.client)
    [message] = await backend.consumer.claim(1, 30)
    await _flush_scripts(backend.client)
    await backend.consumer.ack(message)
    assert (await cp.load(tid))[1] == 3


async def _busy(url: str, micros: int) -> None:
    """Keep the server busy in one script for ``micros`` µs (other clients queue)."""
    client = raw_client(url)
    try:
        await client.eval(_BUSY, 0, micros)
    finally:
        await client.aclose()


async def _while_busy(url: str, micros: int) -> asyncio.Task[None]:
    """Start ``_busy`` and return once the server is running it (a connected client's
    PING stops answering), so what comes next waits behind it however loaded the
    machine is."""
    probe = raw_client(url, socket_timeout=0.02, retry=Retry(NoBackoff(), 0))
    try:
        await probe.ping()  # connected while the server still answers
        busy = asyncio.create_task(_busy(url, micros))
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                await probe.ping()
            except RedisTimeoutError:
                return busy
            await asyncio.sleep(0.005)
        raise AssertionError("the busy script never started")
    finally:
        await probe.aclose()


class _Counting(RedisCheckpointer[Any]):
    """Counts the saves, and those that ended in StorageUnavailableError."""

    calls = 0
    unavailable = 0

    async def save(self, expected_revision: int, snapshot: Snapshot[Any], **kw: Any) -> int:
        type(self).calls += 1
        try:
            return await super().save(expected_revision, snapshot, **kw)
        except StorageUnavailableError:
            type(self).unavailable += 1
            raise


def _counting(client: Any, namespace: str) -> _Counting:
    """A counting checkpointer on ``client`` (closed by the caller)."""
    backend = RedisBackend[Any].from_client(client, namespace=namespace)
    return _Counting(backend.store)


async def test_connection_lost_after_the_save_landed(
    make_standalone_backend: BackendFactory, standalone: RedisTarget
) -> None:
    """The client gives up (socket timeout) while its save waits behind a busy script;
    the save then runs. confirmed_save learns it landed: no conflict, no second write."""
    backend = make_standalone_backend()
    tid = _tid()
    assert await backend.checkpointer.save(0, snap(tid, ["first"])) == 1
    impatient = raw_client(standalone.url, socket_timeout=0.1, retry=Retry(NoBackoff(), 0))
    try:
        cp = _counting(impatient, backend.namespace)
        await cp.load(tid)  # connects and checks the layout before the server is busy
        _Counting.calls = _Counting.unavailable = 0
        busy = await _while_busy(standalone.url, 600_000)
        mine = snap(tid, ["first", "mine"])
        revision = await confirmed_save(cp, 1, mine, attempts=6, backoff=0.2)
        await busy
    finally:
        await impatient.aclose()
    assert revision == 2
    # One save, which timed out; confirmed_save then found it had landed.
    assert (_Counting.calls, _Counting.unavailable) == (1, 1)
    history = await backend.checkpointer.get_history(tid)
    assert [s.revision for s in history] == [2, 1]
    assert history[0].write_id == mine.write_id


async def test_connection_killed_before_the_save_ran(
    make_standalone_backend: BackendFactory, standalone: RedisTarget
) -> None:
    """CLIENT KILL of the saving connection while its save is held by CLIENT PAUSE: the
    save never runs; confirmed_save finds the head unchanged and saves once."""
    backend = make_standalone_backend()
    admin: Any = backend.client
    tid = _tid()
    assert await backend.checkpointer.save(0, snap(tid, ["first"])) == 1
    name = f"flowy-saver-{uuid.uuid4().hex[:8]}"
    saver = raw_client(standalone.url, client_name=name, retry=Retry(NoBackoff(), 0))
    try:
        cp = _counting(saver, backend.namespace)
        await cp.load(tid)
        _Counting.calls = _Counting.unavailable = 0
        await admin.execute_command("CLIENT", "PAUSE", 2000, "WRITE")
        try:
            mine = snap(tid, ["first", "mine"])
            saving = asyncio.create_task(confirmed_save(cp, 1, mine, attempts=4, backoff=0.1))
            await asyncio.sleep(0.2)
            clients = await admin.client_list()
            [victim] = [c for c in clients if c.get("name") == name]
            assert await admin.client_kill_filter(_id=victim["id"]) == 1
            await asyncio.sleep(0.05)
        finally:
            await admin.execute_command("CLIENT", "UNPAUSE")
        revision = await saving
    finally:
        await saver.aclose()
    assert revision == 2
    # The killed save did not run, so confirmed_save saved a second time.
    assert (_Counting.calls, _Counting.unavailable) == (2, 1)
    history = await backend.checkpointer.get_history(tid)
    assert [s.revision for s in history] == [2, 1]
    assert history[0].write_id == mine.write_id


async def test_a_driver_resend_of_a_landed_save_is_not_a_conflict(
    make_standalone_backend: BackendFactory, standalone: RedisTarget
) -> None:
    """redis-py resends a command after a timeout (its Retry): the first send ran, so
    the resend finds its own record at the head and answers ok."""
    backend = make_standalone_backend()
    tid = _tid()
    assert await backend.checkpointer.save(0, snap(tid, ["first"])) == 1
    retrying = raw_client(
        standalone.url, socket_timeout=0.1, retry=Retry(ConstantBackoff(0.05), 20)
    )
    try:
        cp = RedisBackend[Any].from_client(retrying, namespace=backend.namespace).checkpointer
        await cp.load(tid)
        before = await _evalsha_calls(backend.client)
        busy = await _while_busy(standalone.url, 500_000)
        mine = snap(tid, ["first", "mine"])
        assert await cp.save(1, mine) == 2
        await busy
        # The driver sent the save more than once; every copy after the first found
        # its own record at the head.
        assert await _evalsha_calls(backend.client) - before >= 2
    finally:
        await retrying.aclose()
    history = await backend.checkpointer.get_history(tid)
    assert [s.revision for s in history] == [2, 1]
    assert history[0].write_id == mine.write_id


async def _evalsha_calls(client: Any) -> int:
    stats = await client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


async def test_two_processes_race_on_one_thread(
    make_backend: BackendFactory, redis_target: RedisTarget
) -> None:
    """Two OS processes append to one thread, half the time under a lease: the history
    is one chain (every revision extends the one before by exactly one entry)."""
    backend = make_backend()
    tid = f"race:{{{uuid.uuid4().hex[:6]}}}\n"
    rounds = 40
    script = Path(__file__).with_name("racer.py")
    start_at = time.time() + 1.5
    store_url = redis_target.store_url(namespace=backend.namespace)
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            str(script),
            store_url,
            tid,
            worker,
            str(rounds),
            repr(start_at),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for worker in ("alpha", "beta")
    ]
    for proc in procs:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
        assert proc.returncode == 0, err.decode()
        assert out.decode().strip() == str(rounds)
    history = list(reversed(await backend.checkpointer.get_history(tid, 1000)))
    assert [s.revision for s in history] == list(range(1, 2 * rounds + 1))
    for before, after in itertools.pairwise(history):
        assert after.state[:-1] == before.state
    final = history[-1].state
    assert final.count("alpha") == final.count("beta") == rounds
    assert await backend.leases.holder(tid) is None


_HOSTILE = [
    "{",
    "}",
    "{tag}",
    "a}:b{c",
    ":head:",
    "x\ny",
    "\r\n",
    "k" * 10_240,
    "k" * 10_239 + "a",
    "🦜" * 2_560,
]


async def test_hostile_ids_stay_in_one_slot_and_isolated(
    make_backend: BackendFactory, redis_target: RedisTarget
) -> None:
    backend: RedisBackend[Any] = make_backend()
    cp, layout = backend.checkpointer, backend.store.layout
    for index, tid in enumerate(_HOSTILE):
        lease = await backend.leases.acquire(tid, f"owner-{index}", 30)

        async def enqueue(tx: object, revision: int, tid: str = tid) -> None:
            await backend.outbox.enqueue_intent_tx(tx, make_intent(tid, revision))

        assert await cp.save_with_outbox(0, snap(tid, {"id": tid}), enqueue, lease=lease) == 1
        await backend.leases.release(lease)
    for tid in _HOSTILE:
        loaded, revision = await cp.load(tid)
        assert (loaded.thread_id, loaded.state, revision) == (tid, {"id": tid}, 1)
        keys = layout.thread(tid)
        slots = {key_slot(k) for k in (*keys.checkpoint, *keys.shard.outbox)}
        assert len(slots) == 1
        if redis_target.cluster:
            client: Any = backend.client
            [slot] = slots
            assert await client.cluster_keyslot(keys.head) == slot
    delivered = await backend.consumer.claim(100, 30)
    assert sorted(m.intent.thread_id for m in delivered) == sorted(_HOSTILE)
    listed = await cp.list_threads(limit=100)
    assert [s.thread_id for s in listed] == sorted(_HOSTILE)
    for tid in _HOSTILE:
        await cp.delete(tid)
        assert await backend.client.exists(*layout.thread(tid).checkpoint[:3]) == 0
