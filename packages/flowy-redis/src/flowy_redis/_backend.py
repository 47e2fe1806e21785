"""``RedisBackend``: one client and the four storage objects of one namespace built on it."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from flowy.checkpoint import StateCodec

from ._checkpointer import RedisCheckpointer
from ._keys import DEFAULT_NAMESPACE, DEFAULT_SHARDS
from ._lease import RedisLeaseManager
from ._outbox import RedisOutbox, RedisOutboxConsumer
from ._store import RedisClient, connect, purge_namespace

__all__ = ["RedisBackend"]

S = TypeVar("S")


class RedisBackend(Generic[S]):
    """A checkpointer, lease manager, outbox and consumer sharing one client and namespace.

    Pass ``backend.checkpointer``, ``backend.leases`` and ``backend.outbox`` to a
    ``flowy.Runner`` and ``backend.consumer`` to a ``flowy.Worker``. The checkpointer
    fences with the lease manager and commits hand-offs with the outbox atomically.

    Args:
        client: a ``redis.asyncio.Redis`` or ``redis.asyncio.RedisCluster`` client.
        namespace: the prefix of every key (no ``{`` or ``}``).
        shards: the number of outbox shards; the same for every client of a namespace.
        codec: the state codec (JSON by default).
        completed_ttl: seconds after which completed or failed threads expire.
        group: the consumer group of the outbox.
        consumer: this process's consumer name (unique by default).
        max_attempts: deliveries after which an outbox message is dead-lettered.
    """

    def __init__(
        self,
        client: RedisClient,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        shards: int = DEFAULT_SHARDS,
        codec: StateCodec[S] | None = None,
        completed_ttl: float | None = None,
        group: str = "flowy",
        consumer: str | None = None,
        max_attempts: int = 5,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.owns_client = False
        self.checkpointer: RedisCheckpointer[S] = RedisCheckpointer(
            client, namespace=namespace, shards=shards, codec=codec, completed_ttl=completed_ttl
        )
        self.leases = RedisLeaseManager(client, namespace=namespace, shards=shards)
        self.outbox = RedisOutbox(client, namespace=namespace, shards=shards)
        self.consumer = RedisOutboxConsumer(
            client,
            namespace=namespace,
            shards=shards,
            group=group,
            consumer=consumer,
            max_attempts=max_attempts,
        )

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        cluster: bool = False,
        namespace: str = DEFAULT_NAMESPACE,
        shards: int = DEFAULT_SHARDS,
        codec: StateCodec[S] | None = None,
        completed_ttl: float | None = None,
        group: str = "flowy",
        consumer: str | None = None,
        max_attempts: int = 5,
        **client_options: Any,
    ) -> RedisBackend[S]:
        """A backend with its own client for ``url`` (``cluster=True`` for Redis Cluster;
        other keyword arguments go to the client); ``aclose()`` closes it."""
        backend = cls(
            connect(url, cluster=cluster, **client_options),
            namespace=namespace,
            shards=shards,
            codec=codec,
            completed_ttl=completed_ttl,
            group=group,
            consumer=consumer,
            max_attempts=max_attempts,
        )
        backend.owns_client = True
        return backend

    async def purge(self) -> int:
        """Delete every key of the namespace (tests, decommissioning); returns the count."""
        return await purge_namespace(self.client, self.namespace)

    async def aclose(self) -> None:
        """Close the client if ``from_url`` created it."""
        if self.owns_client:
            await self.client.aclose()
