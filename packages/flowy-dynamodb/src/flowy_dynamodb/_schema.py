"""Creating the table, checking its schema version, and upgrading a flowy-dynamodb 0.1
table (schema 1) to schema 2; plus :func:`make_client`.

Schema 2 keeps every item of schema 1 where it was and adds the ``by_thread``,
``outbox`` and ``dead_letters`` indexes; the upgrade gives each head its ``list_sort``
and moves each 0.1 outbox message (partitions ``outbox#<shard>`` / ``dead#<shard>``)
to its thread's partition. Stop the 0.1 clients of a table before upgrading it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from boto3.session import Session
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from flowy.errors import SchemaVersionError, StorageError, StorageUnavailableError
from flowy.storage import decode_intent

from ._store import (
    DEAD_INDEX,
    HEAD_SK,
    OUTBOX_INDEX,
    PK,
    SCHEMA_KEY,
    SK,
    SUMMARY,
    THREADS_INDEX,
    TTL,
    A,
    DynamoTable,
    Expression,
    Item,
    get_b,
    get_float,
    get_int,
    get_s,
    n,
    s,
    shard_of,
    sort_key,
    thread_key,
    translate_error,
)

if TYPE_CHECKING:
    from botocore.client import BaseClient

__all__ = ["SCHEMA_VERSION", "create_table", "make_client"]

SCHEMA_VERSION = 2
"""The table layout this version of flowy-dynamodb reads and writes."""

_KEYS = {
    PK: "S",
    SK: "S",
    A.LIST_KEY: "S",
    A.LIST_SORT: "S",
    A.LIVE: "S",
    A.VISIBLE: "N",
    A.DEAD: "S",
    A.DEAD_AT: "N",
}
_INDEXES: dict[str, tuple[str, str, list[str] | None]] = {
    THREADS_INDEX: (A.LIST_KEY, A.LIST_SORT, list(SUMMARY)),
    OUTBOX_INDEX: (A.LIVE, A.VISIBLE, None),
    DEAD_INDEX: (A.DEAD, A.DEAD_AT, [A.PAYLOAD, A.ATTEMPTS, A.ERROR]),
}
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
    """A boto3 DynamoDB client: credentials from boto3's usual chain (environment,
    ``profile``, instance role…), botocore's ``retry_mode`` retries with backoff
    (``retry_attempts`` counts the first), a pool of ``max_pool_connections``. One boto3
    session per profile is reused, so clients after the first are cheap to make."""
    config = Config(
        retries={"mode": cast(Any, retry_mode), "total_max_attempts": retry_attempts},
        max_pool_connections=max_pool_connections,
        connect_timeout=5,
        read_timeout=10,
    )
    with _sessions_lock:  # boto3 sessions are not thread-safe
        session = _sessions.get(profile)
        if session is None:
            session = _sessions[profile] = Session(profile_name=profile)
        return session.client(
            "dynamodb", region_name=region, endpoint_url=endpoint_url, config=config
        )


def _index(name: str) -> dict[str, Any]:
    hash_key, range_key, included = _INDEXES[name]
    projection: dict[str, Any] = {"ProjectionType": "KEYS_ONLY"}
    if included is not None:
        projection = {"ProjectionType": "INCLUDE", "NonKeyAttributes": included}
    return {
        "IndexName": name,
        "KeySchema": [
            {"AttributeName": hash_key, "KeyType": "HASH"},
            {"AttributeName": range_key, "KeyType": "RANGE"},
        ],
        "Projection": projection,
    }


def _definitions(names: list[str]) -> list[dict[str, str]]:
    return [{"AttributeName": a, "AttributeType": _KEYS[a]} for a in names]


def _describe(client: Any, table_name: str) -> Mapping[str, Any] | None:
    try:
        return cast(Mapping[str, Any], client.describe_table(TableName=table_name)["Table"])
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "ResourceNotFoundException":
            return None
        raise


def _wait_active(client: Any, table_name: str, timeout: float) -> Mapping[str, Any]:
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        table = _describe(client, table_name) or {}
        indexes = cast(list[Mapping[str, Any]], table.get("GlobalSecondaryIndexes") or [])
        if table.get("TableStatus") == "ACTIVE" and all(
            i.get("IndexStatus", "ACTIVE") == "ACTIVE" for i in indexes
        ):
            return table
        if time.monotonic() > deadline:
            raise StorageUnavailableError(
                f"DynamoDB table {table_name!r} did not become ACTIVE within {timeout:g}s; "
                "try again later"
            )
        time.sleep(delay)
        delay = min(delay * 2, 2.0)


def _missing_indexes(table: Mapping[str, Any]) -> list[str]:
    present = {
        str(i.get("IndexName"))
        for i in cast(list[Mapping[str, Any]], table.get("GlobalSecondaryIndexes") or [])
    }
    return [name for name in _INDEXES if name not in present]


def _ensure_ttl(client: Any, table_name: str) -> None:
    current = client.describe_time_to_live(TableName=table_name).get("TimeToLiveDescription", {})
    if current.get("TimeToLiveStatus") in ("ENABLED", "ENABLING"):
        if current.get("AttributeName") != TTL:
            raise StorageError(
                f"DynamoDB table {table_name!r} has time to live on "
                f"{current.get('AttributeName')!r}; flowy needs it on {TTL!r}"
            )
        return
    client.update_time_to_live(
        TableName=table_name, TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL}
    )


def create_table(
    client: BaseClient, table_name: str, *, timeout: float = 300.0, create: bool = True
) -> None:
    """Create flowy's table unless it exists, and wait until it is ``ACTIVE`` (blocking;
    idempotent). On-demand billing, string keys ``pk`` / ``sk``, the indexes of the
    package README, time to live on ``expires``, stamped with schema version 2. With
    ``create=False`` a missing table is a ``StorageError``.
    """
    raw: Any = client
    try:
        table = _describe(raw, table_name)
        created = table is None
        if table is None:
            if not create:
                raise StorageError(
                    f"DynamoDB table {table_name!r} does not exist; open it with "
                    "create_table=true or call flowy_dynamodb.create_table"
                )
            try:
                raw.create_table(
                    TableName=table_name,
                    BillingMode="PAY_PER_REQUEST",
                    AttributeDefinitions=_definitions(list(_KEYS)),
                    KeySchema=[
                        {"AttributeName": PK, "KeyType": "HASH"},
                        {"AttributeName": SK, "KeyType": "RANGE"},
                    ],
                    GlobalSecondaryIndexes=[_index(name) for name in _INDEXES],
                )
            except ClientError as exc:  # being created by another process: fine
                if exc.response.get("Error", {}).get("Code") != "ResourceInUseException":
                    raise
        if table is None or table.get("TableStatus") != "ACTIVE":
            _wait_active(raw, table_name, timeout)
        if created:
            _ensure_ttl(raw, table_name)
            try:
                raw.put_item(
                    TableName=table_name,
                    Item={**SCHEMA_KEY, "version": n(SCHEMA_VERSION)},
                    ConditionExpression="attribute_not_exists(#pk)",
                    ExpressionAttributeNames={"#pk": PK},
                )
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
                    raise
    except (ClientError, BotoCoreError) as exc:
        raise translate_error(exc, "CreateTable", table_name) from exc


async def schema_version(table: DynamoTable, *, create: bool) -> int:
    """The table's schema version (creating the table first, with ``create``)."""
    await asyncio.get_running_loop().run_in_executor(
        table.pool, lambda: create_table(table.client, table.name, create=create)
    )
    item = await table.get(SCHEMA_KEY, ["version"])
    return get_int(item, "version") or 1


def check_version(version: int, table_name: str) -> None:
    """``SchemaVersionError`` unless ``version`` is the one this code uses."""
    if version > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"DynamoDB table {table_name!r} has schema version {version}, newer than this "
            f"flowy-dynamodb ({SCHEMA_VERSION}); upgrade flowy-dynamodb"
        )
    if version < SCHEMA_VERSION:
        raise SchemaVersionError(
            f"DynamoDB table {table_name!r} has schema version {version} (flowy-dynamodb "
            f"0.1); stop its 0.1 clients, back it up, then run `await backend.migrate()` "
            f"to upgrade it to version {SCHEMA_VERSION}"
        )


def _add_indexes(client: Any, table_name: str, timeout: float) -> None:
    table = _wait_active(client, table_name, timeout)
    for name in _missing_indexes(table):  # DynamoDB adds one index per UpdateTable
        hash_key, range_key, _ = _INDEXES[name]
        client.update_table(
            TableName=table_name,
            AttributeDefinitions=_definitions([hash_key, range_key]),
            GlobalSecondaryIndexUpdates=[{"Create": _index(name)}],
        )
        _wait_active(client, table_name, timeout)
    _ensure_ttl(client, table_name)


async def migrate(table: DynamoTable, *, wait: float = 1800.0) -> int:
    """Upgrade the table to :data:`SCHEMA_VERSION` (idempotent); return the version."""
    version = await schema_version(table, create=True)
    if version >= SCHEMA_VERSION:
        check_version(version, table.name)
        return version
    try:
        await asyncio.get_running_loop().run_in_executor(
            table.pool, lambda: _add_indexes(table.client, table.name, wait)
        )
    except (ClientError, BotoCoreError) as exc:
        raise translate_error(exc, "UpdateTable", table.name) from exc
    start: Item | None = None
    while True:
        page = await table.call(
            "scan", TableName=table.name, **({"ExclusiveStartKey": start} if start else {})
        )
        for item in cast(list[Item], page.get("Items") or []):
            await _upgrade_item(table, item)
        start = cast("Item | None", page.get("LastEvaluatedKey"))
        if start is None:
            break
    await table.call("put_item", TableName=table.name, Item={**SCHEMA_KEY, "version": n(2)})
    return SCHEMA_VERSION


async def _upgrade_item(table: DynamoTable, item: Item) -> None:
    pk, sk = get_s(item, PK) or "", get_s(item, SK) or ""
    thread_id = get_s(item, A.THREAD_ID)
    if sk == HEAD_SK and thread_id is not None and A.REVISION in item:
        expr = Expression()
        await table.update(
            {PK: item[PK], SK: item[SK]},
            expr,
            f"SET {expr.name(A.LIST_SORT)} = {expr.value('sort', s(sort_key(thread_id)))}",
            f"attribute_exists({expr.name(A.REVISION)})",
        )
        return
    dead = pk.startswith("dead#")
    if not (dead or pk.startswith("outbox#")):
        return
    payload = get_b(item, A.PAYLOAD) or b""
    try:
        intent = decode_intent(payload)
        moved: Item = {
            PK: s(thread_key(intent.thread_id)),
            SK: s(f"outbox#{intent.committed_snapshot_revision:020d}"),
            A.THREAD_ID: s(intent.thread_id),
        }
    except ValueError:  # a 0.1 poison message: kept as a dead letter under its own key
        moved, dead = {PK: s("legacy#" + pk), SK: s("outbox#" + sk)}, True
    moved[A.PAYLOAD] = {"B": payload}
    moved[A.ATTEMPTS] = n(get_int(item, A.ATTEMPTS) or 0)
    moved[A.ERROR] = s(get_s(item, A.ERROR) or "")
    if dead:
        moved.update({A.DEAD: s("dead"), A.DEAD_AT: n(get_float(item, "dead_at") or table.clock())})
    else:
        moved[A.LIVE] = s(f"live#{shard_of(moved[PK]['S'])}")
        moved[A.VISIBLE] = n(get_float(item, A.VISIBLE) or 0.0)
    await table.call(
        "transact_write_items",
        TransactItems=[
            {"Put": {"TableName": table.name, "Item": moved}},
            {"Delete": {"TableName": table.name, "Key": {PK: item[PK], SK: item[SK]}}},
        ],
    )
