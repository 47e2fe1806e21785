"""Code shared by the flowy-redis tests (the fixtures are in conftest.py)."""

from __future__ import annotations

import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis, RedisCluster

from flowy_redis import RedisBackend, RedisClient


@dataclass(frozen=True)
class RedisTarget:
    """Where a test's Redis is: its URL (redis:// or rediss://) and whether it is a cluster."""

    url: str
    cluster: bool

    @property
    def name(self) -> str:
        return "redis-cluster" if self.cluster else "redis"

    def store_url(self, **options: Any) -> str:
        """The URL ``flowy.connect`` opens this target by, with flowy's ``options``."""
        parts = urllib.parse.urlsplit(self.url)
        scheme = parts.scheme + ("+cluster" if self.cluster else "")
        query = urllib.parse.urlencode(options)
        return urllib.parse.urlunsplit((scheme, parts.netloc, parts.path, query, ""))


def new_namespace() -> str:
    """A namespace no other test uses."""
    return f"flowy-test-{uuid.uuid4().hex[:12]}"


def client_for(target: RedisTarget, **options: Any) -> RedisClient:
    """A new client (bytes responses) for ``target``."""
    if target.cluster:
        return RedisCluster.from_url(target.url, **options)
    return Redis.from_url(target.url, **options)  # pyright: ignore[reportUnknownMemberType]


BackendFactory = Callable[..., RedisBackend[Any]]
"""``make_backend(**RedisBackend options, client_options={...})``: a backend with its own
client on the test's namespace."""


async def corrupt_head(backend: RedisBackend[Any], thread_id: str) -> None:
    """Flip one byte in the middle of the thread's head record (its history entry)."""
    keys = backend.store.layout.thread(thread_id)
    client: Any = backend.client
    revision = await client.hget(keys.head, "revision")
    data = bytearray(await client.hget(keys.hist, revision))
    data[len(data) // 2] ^= 0xFF
    await client.hset(keys.hist, revision, bytes(data))


def raw_client(url: str, **options: Any) -> Redis:
    """A plain ``redis.asyncio.Redis`` for ``url`` (bytes responses)."""
    return Redis.from_url(url, **options)  # pyright: ignore[reportUnknownMemberType]
