"""flowy-redis: the Redis store of flowy (``redis.asyncio``, standalone or Cluster).

``flowy.connect("redis://host:6379/0?namespace=app")`` (or ``rediss://``,
``redis+cluster://``, ``rediss+cluster://``) opens a :class:`RedisBackend`; so does
``RedisBackend.from_client(client)`` with the application's own client. Every save is
one Lua script that checks the revision and the lease (by the server's clock) and
writes the head, the history entry and the hand-off messages; every key of a thread
shares one hash tag with its outbox shard, so the same code runs on Redis Cluster.
"""

from __future__ import annotations

from importlib import metadata as _metadata

from flowy.storage.dialect import present_as_public as _present_as_public

from ._backend import CLIENT_OPTIONS as CLIENT_OPTIONS
from ._backend import OPTIONS as OPTIONS
from ._backend import RedisBackend as RedisBackend
from ._backend import open_backend as open_backend
from ._checkpointer import DEFAULT_MAX_RECORD_BYTES as DEFAULT_MAX_RECORD_BYTES
from ._checkpointer import RedisCheckpointer as RedisCheckpointer
from ._keys import DEFAULT_NAMESPACE as DEFAULT_NAMESPACE
from ._keys import DEFAULT_SHARDS as DEFAULT_SHARDS
from ._keys import KeyLayout as KeyLayout
from ._lease import RedisLeaseManager as RedisLeaseManager
from ._outbox import RedisConsumer as RedisConsumer
from ._outbox import RedisOutbox as RedisOutbox
from ._outbox import RedisQueueConsumer as RedisQueueConsumer
from ._schedules import RedisScheduleStore as RedisScheduleStore
from ._store import LAYOUT_VERSION as LAYOUT_VERSION
from ._store import RedisClient as RedisClient
from ._store import purge_namespace as purge_namespace

__version__: str = _metadata.version("flowy-redis")
"""The installed version of flowy-redis."""

__all__ = [
    "CLIENT_OPTIONS",
    "DEFAULT_MAX_RECORD_BYTES",
    "DEFAULT_NAMESPACE",
    "DEFAULT_SHARDS",
    "LAYOUT_VERSION",
    "OPTIONS",
    "KeyLayout",
    "RedisBackend",
    "RedisCheckpointer",
    "RedisClient",
    "RedisConsumer",
    "RedisLeaseManager",
    "RedisOutbox",
    "RedisQueueConsumer",
    "RedisScheduleStore",
    "open_backend",
    "purge_namespace",
]


# Reprs and tracebacks say flowy_redis.X, not the private module.
_present_as_public(__name__, globals(), __all__, "flowy_redis._")
