"""The table's schema: creating it, checking its version, upgrading an older table to
schema 4; and :func:`make_client`.

Schema 2 keeps the heads and history entries of schema 1 (flowy-dynamodb 0.1) where they
were and adds the ``by_thread``, ``outbox`` and ``dead_letters`` indexes; the upgrade
from 1 gives each head its ``list_sort`` and moves each 0.1 message (partitions
``outbox#<shard>`` and ``dead#<shard>``) to its thread's partition.

Schema 3 (durable time) adds the ``timers`` index of wake-up times, and replaces
``by_thread`` with ``heads``: the same keys, with the head's ``wake_at`` and
``graph_version`` among the attributes it carries (an index's projection cannot change,
so it is a new index). The signals and journal entries of schema 3 are new items in the
threads' partitions, and no head of an older schema has a wake-up time or a graph
version, so no item changes. The upgrade creates the
new indexes one at a time, waiting until each is ``ACTIVE`` (DynamoDB backfills them),
then deletes ``by_thread``. Stop a table's older clients first.

Schema 4 (queues) adds the ``queues`` index (``queue_key``, ``queue_order``): each live
message carries its route and its place in it. The upgrade creates the index, then
gives each live message of an older schema the default route, in its enqueue order
(it lists them from the ``outbox`` index; dead letters get theirs when they come back).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from boto3.session import Session
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from flowy.errors import StorageError, StorageUnavailableError
from flowy.queues import DEFAULT_QUEUE
from flowy.storage.dialect import BaseBackend, decode_intent

from ._layout import (
    DEAD_INDEX,
    HEAD_SK,
    MESSAGE,
    OUTBOX_INDEX,
    PK,
    QUEUES_INDEX,
    SCHEMA_KEY,
    SHARDS,
    SK,
    THREADS_INDEX,
    TIMERS_INDEX,
    TTL,
    A,
    Expression,
    Item,
    entry_key,
    get_b,
    get_int,
    get_n,
    get_s,
    key_of,
    n,
    queue_key,
    queue_order,
    s,
    shard_of,
    sort_key,
)
from ._table import ConditionFailed, DynamoTable, translate_error

if TYPE_CHECKING:
    from botocore.client import BaseClient

__all__ = ["SCHEMA_VERSION", "create_table", "make_client"]

SCHEMA_VERSION = 4
"""The table layout this version of flowy-dynamodb reads and writes."""

_KEYS = {PK: "S", SK: "S", A.LIST_KEY: "S", A.LIST_SORT: "S", A.LIVE: "S", A.VISIBLE: "N"} | {
    A.DEAD: "S",
    A.DEAD_AT: "N",
    A.TIMER: "S",
    A.WAKE: "N",
    A.QUEUE_KEY: "S",
    A.QUEUE_ORDER: "S",
}
_INDEXES: dict[str, tuple[str, str, list[str] | None]] = {  # hash, range, included
    THREADS_INDEX: (A.LIST_KEY, A.LIST_SORT, list(A.SUMMARY)),
    OUTBOX_INDEX: (A.LIVE, A.VISIBLE, None),
    DEAD_INDEX: (A.DEAD, A.DEAD_AT, [A.PAYLOAD, A.ATTEMPTS, A.ERROR]),
    TIMERS_INDEX: (A.TIMER, A.WAKE, [A.THREAD_ID]),
    QUEUES_INDEX: (A.QUEUE_KEY, A.QUEUE_ORDER, [A.VISIBLE, A.PARTITION, A.IN_FLIGHT]),
}
_RETIRED = ("by_thread",)
"""Indexes of schema 2 that schema 3 replaced (``heads`` replaces ``by_thread``)."""
_sessions: dict[str | None, Session] = {}
_sessions_lock = threading.Lock()


def make_client(
    *,
    region: str | None = None,
    endpoint_url: str | None = None,
    profile: str | None = None,
    retry_mode: str = "standard",
    retry_attempts: int = 5,
    max_pool_connections: int = 16,
) -> BaseClient:
    """A boto3 DynamoDB client: credentials from boto3's chain (environment,
    ``profile``, instance role…), botocore's ``retry_mode`` retries with backoff
    (``retry_attempts`` counts the first), ``max_pool_connections`` connections. The
    boto3 session of a profile is made once, so later clients are cheap."""
    config = Config(
        retries={"mode": cast(Any, retry_mode), "total_max_attempts": retry_attempts},
        max_pool_connections=max_pool_connections,
        connect_timeout=5,
        read_timeout=10,
    )
    with _sessions_lock:  # boto3 sessions are not thread-safe
        session: Any = _sessions.get(profile) or _sessions.setdefault(
            profile, Session(profile_name=profile)
        )
        client: BaseClient = session.client(
            "dynamodb", region_name=region, endpoint_url=endpoint_url, config=config
        )
        return client


def _index(name: str) -> dict[str, Any]:
    hash_key, range_key, included = _INDEXES[name]
    projection: dict[str, Any] = {"ProjectionType": "KEYS_ONLY"}
    if included is not None:
        projection = {"ProjectionType": "INCLUDE", "NonKeyAttributes": included}
    keys = [
        {"AttributeName": hash_key, "KeyType": "HASH"},
        {"AttributeName": range_key, "KeyType": "RANGE"},
    ]
    return {"IndexName": name, "KeySchema": keys, "Projection": projection}


def _definitions(*names: str) -> list[dict[str, str]]:
    return [{"AttributeName": a, "AttributeType": _KEYS[a]} for a in names]


def _code(exc: ClientError) -> str:
    response = cast(Mapping[str, Any], exc.response)
    return str(cast(Mapping[str, Any], response.get("Error") or {}).get("Code", ""))


def _describe(client: Any, table_name: str, wait: float = 0.0) -> Mapping[str, Any] | None:
    """The table's description (``None`` if missing), after waiting up to ``wait``
    seconds for it and its indexes to be ``ACTIVE``."""
    deadline, delay = time.monotonic() + wait, 0.05
    while True:
        try:
            table = cast(Mapping[str, Any], client.describe_table(TableName=table_name)["Table"])
        except ClientError as exc:
            if _code(exc) == "ResourceNotFoundException":
                return None
            raise
        indexes = cast(list[Mapping[str, Any]], table.get("GlobalSecondaryIndexes") or [])
        statuses = {table.get("TableStatus"), *(i.get("IndexStatus", "ACTIVE") for i in indexes)}
        if statuses == {"ACTIVE"} or not wait:
            return table
        if time.monotonic() > deadline:
            raise StorageUnavailableError(
                f"DynamoDB table {table_name!r} is not ACTIVE after {wait:g}s"
            )
        time.sleep(delay)
        delay = min(delay * 2, 2.0)


def _index_names(table: Mapping[str, Any]) -> set[str]:
    indexes = cast(list[Mapping[str, Any]], table.get("GlobalSecondaryIndexes") or [])
    return {str(i.get("IndexName")) for i in indexes}


def _ensure_ttl(client: Any, table_name: str, again: bool = True) -> None:
    current = client.describe_time_to_live(TableName=table_name).get("TimeToLiveDescription", {})
    if current.get("TimeToLiveStatus") in ("ENABLED", "ENABLING"):
        if current.get("AttributeName") != TTL:
            raise StorageError(
                f"DynamoDB table {table_name!r} has time to live on "
                f"{current.get('AttributeName')!r}; flowy needs it on {TTL!r}"
            )
        return
    try:
        spec = {"Enabled": True, "AttributeName": TTL}
        client.update_time_to_live(TableName=table_name, TimeToLiveSpecification=spec)
    except ClientError:  # another process enabled it meanwhile: look again
        if not again:
            raise
        _ensure_ttl(client, table_name, again=False)


def create_table(
    client: BaseClient, table_name: str, *, wait: float = 300.0, create: bool = True
) -> None:
    """Create flowy's table unless it exists and wait until it is ``ACTIVE`` (blocking;
    idempotent): on-demand billing, string keys ``pk`` and ``sk``, the indexes of the
    package README, time to live on ``expires``, schema version 4. With
    ``create=False`` a missing table is a ``StorageError``."""
    raw: Any = client
    try:
        table = _describe(raw, table_name)
        if table is not None:
            if table.get("TableStatus") != "ACTIVE":
                _describe(raw, table_name, wait)
            return
        if not create:
            raise StorageError(
                f"DynamoDB table {table_name!r} does not exist; open it with create_table=true "
                "or run `await backend.setup()`"
            )
        try:
            raw.create_table(
                TableName=table_name,
                BillingMode="PAY_PER_REQUEST",
                AttributeDefinitions=_definitions(*_KEYS),
                KeySchema=[
                    {"AttributeName": PK, "KeyType": "HASH"},
                    {"AttributeName": SK, "KeyType": "RANGE"},
                ],
                GlobalSecondaryIndexes=[_index(name) for name in _INDEXES],
            )
        except ClientError as exc:  # being created by another process: fine
            if _code(exc) != "ResourceInUseException":
                raise
        _describe(raw, table_name, wait)
        _ensure_ttl(raw, table_name)
        try:
            raw.put_item(
                TableName=table_name,
                Item={**SCHEMA_KEY, "version": n(SCHEMA_VERSION)},
                ConditionExpression="attribute_not_exists(#pk)",
                ExpressionAttributeNames={"#pk": PK},
            )
        except ClientError as exc:
            if _code(exc) != "ConditionalCheckFailedException":
                raise
    except (ClientError, BotoCoreError) as exc:
        raise translate_error(exc, "CreateTable", table_name) from exc


async def schema_version(table: DynamoTable, *, create: bool) -> int:
    """The table's schema version (1: no version item), creating it with ``create``."""
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(
        table.pool, lambda: create_table(table.client, table.name, create=create)
    )
    return get_int(await table.get(SCHEMA_KEY, ["version"]), "version") or 1


def check_version(version: int, table_name: str) -> None:
    """``SchemaVersionError`` unless ``version`` is the one this code uses."""
    where = f"the DynamoDB table {table_name!r}"
    BaseBackend.check_schema_version(
        version, known=SCHEMA_VERSION, where=where, package="flowy-dynamodb"
    )


def _update_indexes(client: Any, table_name: str, wait: float) -> None:
    """Create the missing indexes, then delete the retired ones: one index per
    ``UpdateTable`` (DynamoDB's rule), each waited for until the table and every index
    are ``ACTIVE`` again (a created index backfilled, a deleted one gone)."""
    existing = _index_names(_describe(client, table_name, wait) or {})
    for name in (name for name in _INDEXES if name not in existing):
        client.update_table(
            TableName=table_name,
            AttributeDefinitions=_definitions(*_INDEXES[name][:2]),
            GlobalSecondaryIndexUpdates=[{"Create": _index(name)}],
        )
        _describe(client, table_name, wait)
    for name in (name for name in _RETIRED if name in existing):
        client.update_table(
            TableName=table_name, GlobalSecondaryIndexUpdates=[{"Delete": {"IndexName": name}}]
        )
        _describe(client, table_name, wait)
    _ensure_ttl(client, table_name)


async def migrate(table: DynamoTable, *, wait: float = 1800.0) -> int:
    """Upgrade the table to :data:`SCHEMA_VERSION` (idempotent); return the version."""
    version = await schema_version(table, create=True)
    if version >= SCHEMA_VERSION:
        check_version(version, table.name)
        return version
    try:
        await asyncio.get_running_loop().run_in_executor(
            table.pool, lambda: _update_indexes(table.client, table.name, wait)
        )
    except (ClientError, BotoCoreError) as exc:
        raise translate_error(exc, "UpdateTable", table.name) from exc
    if version == 1:  # schema 2 and 3 items are alike: only a 0.1 table is scanned
        async for page in table.pages("scan"):
            items: list[Item] = page.get("Items") or []
            for item in items:
                await _upgrade(table, item)
    await _route_messages(table)
    await table.call(
        "put_item", TableName=table.name, Item={**SCHEMA_KEY, "version": n(SCHEMA_VERSION)}
    )
    return SCHEMA_VERSION


async def _route_messages(table: DynamoTable) -> None:
    """Give each live message without a route the default one (schema 4)."""
    lives = [f"live#{shard}" for shard in range(SHARDS)]
    listed = await table.query_index(OUTBOX_INDEX, A.LIVE, lives, None)
    fields = (A.QUEUE_KEY, A.ENQUEUED, A.VISIBLE)
    for item in await table.get_keys([key_of(i) for i in listed], fields, consistent=True):
        if A.QUEUE_KEY in item:
            continue
        at = float(get_n(item, A.ENQUEUED) or get_n(item, A.VISIBLE) or 0)
        expr = Expression()
        update = expr.sets(
            {
                A.QUEUE: s(DEFAULT_QUEUE),
                A.PARTITION: s(""),
                A.PRIORITY: n(0),
                A.QUEUE_KEY: s(queue_key(DEFAULT_QUEUE, item[PK]["S"])),
                A.QUEUE_ORDER: s(queue_order(0, at)),
            }
        )
        condition = (
            f"attribute_exists({expr(A.LIVE)}) AND attribute_not_exists({expr(A.QUEUE_KEY)})"
        )
        with contextlib.suppress(ConditionFailed):  # acked, dead or routed meanwhile
            await table.update(key_of(item), expr, update, condition)


async def _upgrade(table: DynamoTable, item: Item) -> None:
    """Bring one item of schema 1 to schema 2."""
    pk, sk, thread_id = get_s(item, PK) or "", get_s(item, SK) or "", get_s(item, A.THREAD_ID)
    key = {PK: item[PK], SK: item[SK]}
    if sk == HEAD_SK and thread_id is not None and A.REVISION in item:
        expr = Expression()
        update = expr.sets({A.LIST_SORT: s(sort_key(thread_id))})
        condition = f"attribute_exists({expr(A.REVISION)})"
        await table.update(key, expr, update, condition)
        return
    dead = pk.startswith("dead#")
    if not (dead or pk.startswith("outbox#")):
        return
    payload = get_b(item, A.PAYLOAD) or b""
    try:
        intent = decode_intent(payload)
        moved = entry_key(intent.thread_id, MESSAGE, intent.committed_snapshot_revision)
        moved[A.THREAD_ID] = s(intent.thread_id)
    except ValueError:  # a 0.1 poison message: kept as a dead letter under its own key
        moved, dead = {PK: s("legacy#" + pk), SK: s(MESSAGE + sk)}, True
    moved |= {A.PAYLOAD: {"B": payload}, A.ATTEMPTS: n(get_int(item, A.ATTEMPTS) or 0)}
    moved[A.ERROR] = s(get_s(item, A.ERROR) or "")
    if dead:
        moved |= {A.DEAD: s("dead"), A.DEAD_AT: n(float(get_n(item, "dead_at") or table.clock()))}
    else:
        moved |= {
            A.LIVE: s(f"live#{shard_of(moved[PK]['S'])}"),
            A.VISIBLE: n(float(get_n(item, A.VISIBLE) or 0)),
        }
    put, delete = {"TableName": table.name, "Item": moved}, {"TableName": table.name, "Key": key}
    await table.call("transact_write_items", TransactItems=[{"Put": put}, {"Delete": delete}])
