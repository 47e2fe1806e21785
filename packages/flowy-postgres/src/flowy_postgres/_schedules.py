"""``PostgresScheduleStore``: durable schedules in the schedules table, one statement per
primitive; a claim is an ``UPDATE ... WHERE version = $n``, so of any number of workers
one wins. ``create`` and ``resume`` read this process's clock; ticks are the worker's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable

from flowy.storage.dialect import BaseScheduleStore

from ._conn import Connector

__all__ = ["PostgresScheduleStore"]


class PostgresScheduleStore(BaseScheduleStore):
    """The schedules of a :class:`~flowy_postgres.PostgresBackend`."""

    def __init__(self, connector: Connector, clock: Callable[[], float] = time.time) -> None:
        self.connector = connector
        self.domain: Hashable = connector.domain
        self.clock: Callable[[], float] = clock
        table = connector.names.schedules
        self._insert_sql = (
            f"INSERT INTO {table} (name, version, record) VALUES ($1, 1, $2) "
            "ON CONFLICT (name) DO NOTHING RETURNING version"
        )
        self._read_sql = f"SELECT version, record FROM {table} WHERE name = $1"
        self._read_all_sql = f"SELECT name, version, record FROM {table}"
        self._replace_sql = (
            f"UPDATE {table} SET version = version + 1, record = $3 "
            "WHERE name = $1 AND version = $2 RETURNING version"
        )
        self._delete_sql = f"DELETE FROM {table} WHERE name = $1 RETURNING version"

    async def _insert(self, name: str, data: bytes) -> bool:
        row = await self.connector.fetchrow(
            f"create schedule {name!r}", self._insert_sql, name, data
        )
        return row is not None

    async def _read(self, name: str) -> tuple[int, bytes] | None:
        row = await self.connector.fetchrow(
            f"read schedule {name!r}", self._read_sql, name, read=True
        )
        return None if row is None else (int(row["version"]), bytes(row["record"]))

    async def _read_all(self) -> list[tuple[str, int, bytes]]:
        rows = await self.connector.fetch("list schedules", self._read_all_sql, read=True)
        return [(str(r["name"]), int(r["version"]), bytes(r["record"])) for r in rows]

    async def _replace(self, name: str, version: int, data: bytes) -> bool:
        row = await self.connector.fetchrow(
            f"update schedule {name!r}", self._replace_sql, name, version, data
        )
        return row is not None

    async def _delete(self, name: str) -> bool:
        row = await self.connector.fetchrow(f"delete schedule {name!r}", self._delete_sql, name)
        return row is not None
