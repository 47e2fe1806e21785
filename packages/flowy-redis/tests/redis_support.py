"""Helpers shared by the flowy-redis tests (the fixtures are in conftest.py)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from flowy_redis import RedisBackend


@dataclass(frozen=True)
class RedisTarget:
    """Where a test's Redis is: its URL and whether it is a cluster."""

    url: str
    cluster: bool

    @property
    def name(self) -> str:
        return "redis-cluster" if self.cluster else "redis"


def new_namespace() -> str:
    """A namespace no other test uses."""
    return f"flowy-test-{uuid.uuid4().hex[:12]}"


BackendFactory = Callable[..., RedisBackend[Any]]
"""``make_backend(**RedisBackend options)``: a backend on the test's namespace."""


async def corrupt_head(backend: RedisBackend[Any], thread_id: str) -> None:
    """Flip one byte in the middle of the thread's head record (its history entry)."""
    keys = backend.checkpointer.layout.thread(thread_id)
    client: Any = backend.client
    revision = await client.hget(keys.head, "revision")
    data = bytearray(await client.hget(keys.hist, revision))
    data[len(data) // 2] ^= 0xFF
    await client.hset(keys.hist, revision, bytes(data))


def raw_client(url: str, **options: Any) -> Redis:
    """A plain ``redis.asyncio.Redis`` for ``url`` (bytes responses)."""
    return Redis.from_url(url, **options)  # pyright: ignore[reportUnknownMemberType]
