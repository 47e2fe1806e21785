"""Redis: a durable step (``RedisCheckpointer.save`` of a ~1 KiB state: fence check, OCC
check, head + history write, one EVALSHA) vs the raw driver's own conditional write (an
EVALSHA of a trivial compare-and-set script with a payload of the same size), measured in
interleaved rounds of the same run; then outbox throughput with 4 consumer tasks.

Budget: the durable step within 1.5x the raw compare-and-set. Uses FLOWY_REDIS_URL or
redis://127.0.0.1:6379/0; says so and exits 0 when no server answers.
"""

from __future__ import annotations

import sys
from pathlib import Path

# This script is named like the driver package it benchmarks: keep its own folder off the
# import path so ``import redis`` finds redis-py.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import asyncio  # noqa: E402
import hashlib  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from typing import Any  # noqa: E402

from redis.asyncio import Redis  # noqa: E402

from flowy.storage import (  # noqa: E402
    HandoffIntent,
    HandoffStatus,
    ResumeToken,
    Snapshot,
    encode_snapshot,
    new_write_id,
)
from flowy_redis import RedisBackend, purge_namespace  # noqa: E402

ROUNDS = 15
SAVES_PER_ROUND = 300
MESSAGES = 4_000
CONSUMERS = 4
BATCH = 16

_CAS = """
if (tonumber(redis.call('GET', KEYS[1])) or 0) ~= tonumber(ARGV[1]) then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1] + 1)
redis.call('SET', KEYS[2], ARGV[2])
return 1
"""


def _state(i: int) -> dict[str, Any]:
    return {"n": i, "text": "x" * 900, "tags": ["a", "b", "c"]}


async def _round(
    backend: RedisBackend[Any],
    raw: Any,
    sha: str,
    keys: tuple[bytes, bytes],
    thread_id: str,
    start: int,
    payload_size: int,
) -> tuple[list[float], list[float], list[float]]:
    """One round: durable saves and raw compare-and-sets, alternating op by op."""
    cp = backend.checkpointer
    durable: list[float] = []
    raw_cas: list[float] = []
    encode: list[float] = []
    for revision in range(start, start + SAVES_PER_ROUND):
        snap = Snapshot(thread_id, _state(revision), "step", write_id=new_write_id())
        began = time.perf_counter()
        await cp.save(revision, snap)
        durable.append(time.perf_counter() - began)
        payload = (str(revision).encode() * payload_size)[:payload_size]
        began = time.perf_counter()
        ok = await raw.evalsha(sha, 2, *keys, revision, payload)
        raw_cas.append(time.perf_counter() - began)
        assert ok == 1
        began = time.perf_counter()
        encode_snapshot(snap, revision + 1)
        encode.append(time.perf_counter() - began)
    return durable, raw_cas, encode


async def durable_vs_raw(url: str, namespace: str) -> None:
    backend = _backend(url, namespace)
    raw: Any = Redis.from_url(url)  # pyright: ignore[reportUnknownMemberType]
    keys = (f"{namespace}:raw:rev".encode(), f"{namespace}:raw:doc".encode())
    try:
        sha = await raw.script_load(_CAS)
        assert sha == hashlib.sha1(_CAS.encode()).hexdigest()
        thread_id = f"bench-{uuid.uuid4().hex[:8]}"
        big = Snapshot(thread_id, _state(10**6), "step", write_id=new_write_id())
        payload_size = len(encode_snapshot(big, 10**6))
        # Warm up both paths (connections, script cache, layout check).
        await _round(backend, raw, sha, keys, thread_id, 0, payload_size)
        durable: list[float] = []
        baseline: list[float] = []
        encode: list[float] = []
        done = SAVES_PER_ROUND
        for _ in range(ROUNDS):
            d, b, e = await _round(backend, raw, sha, keys, thread_id, done, payload_size)
            durable += d
            baseline += b
            encode += e
            done += SAVES_PER_ROUND
        d, b, e = statistics.median(durable), statistics.median(baseline), statistics.median(encode)
        print(
            f"durable step vs raw EVALSHA compare-and-set ({payload_size} B record, "
            f"{ROUNDS} rounds x {SAVES_PER_ROUND}, alternating op by op):\n"
            f"   RedisCheckpointer.save  median {d * 1e6:7.1f} us  "
            f"p90 {statistics.quantiles(durable, n=10)[-1] * 1e6:7.1f} us\n"
            f"   raw EVALSHA CAS         median {b * 1e6:7.1f} us  "
            f"p90 {statistics.quantiles(baseline, n=10)[-1] * 1e6:7.1f} us\n"
            f"   (of the save: encode_snapshot median {e * 1e6:.1f} us, in flowy-core)\n"
            f"   ratio {d / b:.2f}x (budget <= 1.5x)"
        )
    finally:
        await raw.delete(*keys)
        await raw.aclose()
        await backend.aclose()


def _backend(url: str, namespace: str, **options: Any) -> RedisBackend[Any]:
    client = Redis.from_url(url)  # pyright: ignore[reportUnknownMemberType]
    return RedisBackend(client, namespace=namespace, owns_client=True, **options)


def _intent(thread_id: str) -> HandoffIntent:
    return HandoffIntent(
        thread_id, 1, 1, 1, ResumeToken(thread_id, 1), HandoffStatus.ENQUEUED, "bench", "worker"
    )


async def outbox_throughput(url: str, namespace: str) -> None:
    producer = _backend(url, namespace)
    consumers = [_backend(url, namespace, consumer=f"bench-{i}") for i in range(CONSUMERS)]
    try:
        began = time.perf_counter()
        sem = asyncio.Semaphore(32)

        async def enqueue(i: int) -> None:
            async with sem:
                await producer.outbox.enqueue_intent(_intent(f"bench-{i}"))

        await asyncio.gather(*(enqueue(i) for i in range(MESSAGES)))
        enqueue_s = time.perf_counter() - began
        delivered = 0

        async def drain(backend: RedisBackend[Any]) -> None:
            nonlocal delivered
            consumer = backend.consumer
            while batch := await consumer.claim(BATCH, 60, wait=0.2):
                for message in batch:
                    await consumer.ack(message)
                delivered += len(batch)

        began = time.perf_counter()
        await asyncio.gather(*(drain(c) for c in consumers))
        drain_s = time.perf_counter() - began - 0.2  # the last empty wait
        assert delivered == MESSAGES, delivered
        print(
            f"outbox: {MESSAGES} intents enqueued in {enqueue_s:.2f}s "
            f"({MESSAGES / enqueue_s:,.0f}/s, 32 in flight); claimed + acked by "
            f"{CONSUMERS} consumer tasks (batch {BATCH}) in {drain_s:.2f}s "
            f"({MESSAGES / drain_s:,.0f} messages/s)"
        )
    finally:
        for consumer in consumers:
            await consumer.aclose()
        await producer.aclose()


async def main() -> int:
    url = os.environ.get("FLOWY_REDIS_URL", "redis://127.0.0.1:6379/0")
    probe: Any = Redis.from_url(url, socket_connect_timeout=1)  # pyright: ignore[reportUnknownMemberType]
    try:
        await probe.ping()
    except Exception as exc:  # noqa: BLE001 - any failure to reach the server means: skip
        print(f"redis: no server at {url} ({exc}); skipped")
        await probe.aclose()
        return 0
    namespace = f"flowy-bench-{uuid.uuid4().hex[:8]}"
    try:
        await durable_vs_raw(url, namespace)
        await outbox_throughput(url, namespace)
    finally:
        await purge_namespace(probe, namespace)
        await probe.aclose()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
