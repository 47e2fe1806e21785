"""``DynamoScheduleStore``: durable schedules as items of the shared table, in one
partition (``pk`` ``flowy#schedules``, ``sk`` ``sched#<name>``) with a ``version`` and a
``record`` attribute. Create and claim are conditional updates on the version; listing is
one strongly consistent query of the partition.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

from flowy.storage.dialect import BaseScheduleStore

from ._layout import PK, SK, Expression, Item, get_b, get_int, get_s, n, s
from ._table import ConditionFailed, DynamoTable

__all__ = ["SCHEDULES_PK", "DynamoScheduleStore"]

SCHEDULES_PK = "flowy#schedules"
"""The partition key of every schedule item."""
_VERSION, _RECORD, _NAME = "version", "record", "schedule_name"


def _key(name: str) -> Item:
    return {PK: s(SCHEDULES_PK), SK: s(f"sched#{name}")}


class DynamoScheduleStore(BaseScheduleStore):
    """The schedules of a :class:`~flowy_dynamodb.DynamoBackend`."""

    def __init__(self, table: DynamoTable) -> None:
        self.table = table
        self.domain: Hashable = table.domain
        self.clock: Callable[[], float] = table.clock

    async def _insert(self, name: str, data: bytes) -> bool:
        expr = Expression()
        update = expr.sets({_NAME: s(name), _VERSION: n(1), _RECORD: {"B": data}})
        try:
            await self.table.update(_key(name), expr, update, f"attribute_not_exists({expr(PK)})")
        except ConditionFailed:
            return False
        return True

    async def _read(self, name: str) -> tuple[int, bytes] | None:
        item = await self.table.get(_key(name), (_VERSION, _RECORD))
        version, record = get_int(item, _VERSION), get_b(item, _RECORD)
        return None if version is None or record is None else (version, record)

    async def _read_all(self) -> list[tuple[str, int, bytes]]:
        expr = Expression()
        items = await self.table.query(
            None,
            KeyConditionExpression=f"{expr(PK)} = {expr.v(s(SCHEDULES_PK))}",
            ConsistentRead=True,
            **expr.params(),
        )
        out: list[tuple[str, int, bytes]] = []
        for item in items:
            name, version, record = (
                get_s(item, _NAME),
                get_int(item, _VERSION),
                get_b(item, _RECORD),
            )
            if name is not None and version is not None and record is not None:
                out.append((name, version, record))
        return out

    async def _replace(self, name: str, version: int, data: bytes) -> bool:
        expr = Expression()
        update = expr.sets({_VERSION: n(version + 1), _RECORD: {"B": data}})
        condition = f"{expr(_VERSION)} = {expr.v(n(version))}"
        try:
            await self.table.update(_key(name), expr, update, condition)
        except ConditionFailed:
            return False
        return True

    async def _delete(self, name: str) -> bool:
        expr = Expression()
        try:
            await self.table.delete(_key(name), expr, f"attribute_exists({expr(PK)})")
        except ConditionFailed:
            return False
        return True
