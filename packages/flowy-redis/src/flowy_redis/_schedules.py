"""``RedisScheduleStore``: durable schedules in one hash of the namespace,
``<ns>:{<ns>:schedules}:schedules``, with two fields per schedule: ``v:<name>`` (its
version) and ``r:<name>`` (its record). Insert and replace are Lua scripts that compare
the version and write both fields at once; read, list and delete are single commands.
``create`` and ``resume`` read this process's clock; ticks are the worker's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import cast

from flowy.storage.dialect import BaseScheduleStore

from ._lua import LuaScript
from ._store import Store

__all__ = ["RedisScheduleStore"]

_INSERT = LuaScript("""
-- KEYS: the schedules hash.  ARGV: version field, record field, record.
if redis.call('HSETNX', KEYS[1], ARGV[1], '1') == 0 then return 0 end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
return 1
""")

_REPLACE = LuaScript("""
-- KEYS: the schedules hash.  ARGV: version field, record field, expected version, record.
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[3] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], tostring(tonumber(ARGV[3]) + 1), ARGV[2], ARGV[4])
return 1
""")


class RedisScheduleStore(BaseScheduleStore):
    """The schedules of a :class:`~flowy_redis.RedisBackend` (standalone or Cluster:
    one hash, so one slot)."""

    def __init__(self, store: Store, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.domain: Hashable = store.domain
        self.clock: Callable[[], float] = clock
        namespace = store.layout.namespace.encode("utf-8")
        self.key: bytes = namespace + b":{" + namespace + b":schedules}:schedules"

    @staticmethod
    def _fields(name: str) -> tuple[bytes, bytes]:
        encoded = name.encode("utf-8")
        return b"v:" + encoded, b"r:" + encoded

    async def _insert(self, name: str, data: bytes) -> bool:
        version, record = self._fields(name)
        args = (version, record, data)
        return bool(await self.store.run(_INSERT, (self.key,), args, f"creating schedule {name!r}"))

    async def _read(self, name: str) -> tuple[int, bytes] | None:
        version, record = self._fields(name)
        found = await self.store.execute(
            f"reading schedule {name!r}", "HMGET", self.key, version, record
        )
        if found[0] is None or found[1] is None:
            return None
        return int(found[0]), bytes(found[1])

    async def _read_all(self) -> list[tuple[str, int, bytes]]:
        reply = await self.store.execute("listing schedules", "HGETALL", self.key)
        fields: dict[bytes, bytes] = {}
        if isinstance(reply, dict):
            fields.update(cast(dict[bytes, bytes], reply))
        else:
            items = cast(list[bytes], reply)
            fields.update(zip(items[::2], items[1::2], strict=True))
        out: list[tuple[str, int, bytes]] = []
        for field, value in fields.items():
            if field.startswith(b"v:") and (record := fields.get(b"r:" + field[2:])) is not None:
                out.append((field[2:].decode("utf-8"), int(value), bytes(record)))
        return out

    async def _replace(self, name: str, version: int, data: bytes) -> bool:
        fields = self._fields(name)
        args = (*fields, str(version), data)
        return bool(
            await self.store.run(_REPLACE, (self.key,), args, f"updating schedule {name!r}")
        )

    async def _delete(self, name: str) -> bool:
        removed = await self.store.execute(
            f"deleting schedule {name!r}", "HDEL", self.key, *self._fields(name)
        )
        return int(removed) > 0
