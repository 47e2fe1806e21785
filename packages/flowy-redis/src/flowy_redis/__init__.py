"""flowy-redis: the Redis backend of flowy (``redis.asyncio``, standalone or Cluster).

``RedisCheckpointer`` (strict OCC, native lease fencing, transactional outbox),
``RedisLeaseManager`` (fenced leases on the server's clock), ``RedisOutbox`` and
``RedisOutboxConsumer`` (a sharded Redis Streams outbox with a consumer group and dead
letters), all from one client; ``RedisBackend`` builds the four at once. Every save is
one Lua script; every key of a thread shares one hash tag with its outbox shard.
"""

from __future__ import annotations

from ._backend import RedisBackend as RedisBackend
from ._checkpointer import DEFAULT_MAX_RECORD_BYTES as DEFAULT_MAX_RECORD_BYTES
from ._checkpointer import RedisCheckpointer as RedisCheckpointer
from ._keys import DEFAULT_NAMESPACE as DEFAULT_NAMESPACE
from ._keys import DEFAULT_SHARDS as DEFAULT_SHARDS
from ._keys import KeyLayout as KeyLayout
from ._lease import RedisLeaseManager as RedisLeaseManager
from ._outbox import RedisOutbox as RedisOutbox
from ._outbox import RedisOutboxConsumer as RedisOutboxConsumer
from ._outbox import RedisTransaction as RedisTransaction
from ._store import RedisClient as RedisClient
from ._store import purge_namespace as purge_namespace

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_MAX_RECORD_BYTES",
    "DEFAULT_NAMESPACE",
    "DEFAULT_SHARDS",
    "KeyLayout",
    "RedisBackend",
    "RedisCheckpointer",
    "RedisClient",
    "RedisLeaseManager",
    "RedisOutbox",
    "RedisOutboxConsumer",
    "RedisTransaction",
    "purge_namespace",
]


def _present_as_flowy_redis() -> None:
    """Make tracebacks and reprs say ``flowy_redis.X`` instead of ``flowy_redis._module.X``."""
    for name in __all__:
        obj = globals()[name]
        if getattr(obj, "__module__", "").startswith("flowy_redis._"):
            try:
                obj.__module__ = "flowy_redis"
            except (AttributeError, TypeError):
                pass


_present_as_flowy_redis()
