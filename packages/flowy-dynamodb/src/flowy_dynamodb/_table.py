"""The single-table layout every flowy_dynamodb component shares, and the table handle.

One table holds everything of a coordination domain, keyed by a string partition key
``pk`` and a string sort key ``sk``::

    pk                                   sk                    what
    thread#<id>  or thread-sha256#<hex>  head                  head of a thread: revision,
                                                               pointer, status, hand-off
                                                               columns, lease, record
    (same)                               rev#<20-digit rev>    one history entry
    outbox#<shard>                       <20-digit ns>#<hex>   a pending outbox message
    dead#<shard>                         (same as outbox)      a dead-lettered message

A sparse global secondary index ``threads`` (partition key ``list_key`` =
``<handoff status>#<shard>``) holds one entry per saved head so ``list_threads`` is a
query of summary attributes, never a decode of records.

This module owns the key derivation, the attribute names, value marshalling, the
conservative item-size estimate, :class:`DynamoTable` (client + table name + executor),
:class:`DynamoTransaction` (the handle ``save_with_outbox`` passes to ``enqueue``),
:func:`create_table` and :func:`make_client`.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Literal, cast

from boto3.session import Session
from botocore.config import Config
from botocore.exceptions import ClientError

import flowy

from ._executor import DynamoExecutor, Item, client_error_code, translate_error

if TYPE_CHECKING:
    from botocore.client import BaseClient

__all__ = [
    "HEAD_SK",
    "INDEX_NAME",
    "MAX_ITEM_BYTES",
    "MAX_TRANSACTION_ITEMS",
    "DynamoTable",
    "DynamoTransaction",
    "Item",
    "create_table",
    "get_b",
    "get_n",
    "get_s",
    "history_sk",
    "item_size",
    "make_client",
    "n",
    "thread_key",
]

PK = "pk"
SK = "sk"
HEAD_SK = "head"
HISTORY_PREFIX = "rev#"
INDEX_NAME = "threads"
INDEX_PK = "list_key"
TTL_ATTRIBUTE = "expires"

# Head / history attributes.
A_THREAD_ID = "thread_id"
A_REVISION = "revision"
A_POINTER = "pointer"
A_STATUS = "status"
A_REASON = "reason"
A_HANDOFF = "handoff_status"
A_HANDOFF_AT = "handoff_pending_at"
A_UPDATED = "updated_at"
A_RECORD = "record"
A_WRITE_TX = "write_tx"
A_OWNER = "lease_owner"
A_EXPIRES = "lease_expires_at"
A_TOKEN = "lease_token"

# Outbox attributes.
A_PAYLOAD = "payload"
A_ATTEMPTS = "attempts"
A_VISIBLE = "visible_at"
A_ERROR = "error"
A_ENQUEUED = "enqueued_at"
A_DEAD_AT = "dead_at"

SUMMARY_ATTRIBUTES = (
    A_THREAD_ID,
    A_REVISION,
    A_POINTER,
    A_STATUS,
    A_REASON,
    A_HANDOFF,
    A_HANDOFF_AT,
    A_UPDATED,
)

MAX_ITEM_BYTES = 400 * 1024
"""DynamoDB's item size limit (400 KB, attribute names included)."""

MAX_TRANSACTION_ITEMS = 100
"""The most actions one ``TransactWriteItems`` call may carry."""

_PLACEHOLDER_SAFE = re.compile(r"[A-Za-z0-9_]+")
_BATCH_SIZE = 25
_BATCH_ROUNDS = 8
_VERBATIM_KEY_BYTES = 1024
_NUMBER_BYTES = 21  # DynamoDB stores up to 38 digits in at most 21 bytes
_THREAD_PREFIX = "thread#"
_HASHED_PREFIX = "thread-sha256#"


def thread_key(thread_id: str) -> str:
    """The partition key of a thread (the id must already be validated).

    Ids of up to 1 KiB of UTF-8 are used verbatim after ``thread#``; longer ids (a
    partition key holds at most 2 KiB) by the SHA-256 of their UTF-8 bytes after
    ``thread-sha256#``. The prefixes differ at a fixed position, so the mapping is
    injective for verbatim ids and collision-free for hashed ones; every item also
    stores the full id, checked on every read.
    """
    raw = thread_id.encode("utf-8")
    if len(raw) <= _VERBATIM_KEY_BYTES:
        return _THREAD_PREFIX + thread_id
    return _HASHED_PREFIX + hashlib.sha256(raw).hexdigest()


def history_sk(revision: int) -> str:
    """The sort key of a history entry: zero-padded so the string order is numeric."""
    return f"{HISTORY_PREFIX}{revision:020d}"


def n(value: float | int) -> dict[str, str]:
    """A DynamoDB number attribute value (plain decimal notation, no exponent)."""
    if isinstance(value, bool):
        raise TypeError(f"a DynamoDB number cannot be a bool: {value!r}")
    if isinstance(value, int):
        return {"N": str(value)}
    if not math.isfinite(value):
        raise ValueError(f"DynamoDB cannot store the number {value!r}; use a finite value")
    return {"N": format(Decimal(repr(value)), "f")}


def s(value: str) -> dict[str, str]:
    """A DynamoDB string attribute value."""
    return {"S": value}


def b(value: bytes) -> dict[str, bytes]:
    """A DynamoDB binary attribute value."""
    return {"B": value}


def get_s(item: Mapping[str, Any], name: str) -> str | None:
    """The string attribute ``name`` of ``item``, or ``None`` if it is absent."""
    value = item.get(name)
    if isinstance(value, dict) and "S" in value:
        return str(cast(Mapping[str, Any], value)["S"])
    return None


def get_n(item: Mapping[str, Any], name: str) -> str | None:
    """The number attribute ``name`` of ``item`` as its decimal string, or ``None``."""
    value = item.get(name)
    if isinstance(value, dict) and "N" in value:
        return str(cast(Mapping[str, Any], value)["N"])
    return None


def get_int(item: Mapping[str, Any], name: str) -> int | None:
    """The number attribute ``name`` as an int, or ``None`` if absent."""
    raw = get_n(item, name)
    return None if raw is None else int(Decimal(raw))


def get_float(item: Mapping[str, Any], name: str) -> float | None:
    """The number attribute ``name`` as a float, or ``None`` if absent."""
    raw = get_n(item, name)
    return None if raw is None else float(raw)


def get_b(item: Mapping[str, Any], name: str) -> bytes | None:
    """The binary attribute ``name`` of ``item``, or ``None`` if it is absent."""
    value = item.get(name)
    if isinstance(value, dict) and "B" in value:
        raw = cast(Mapping[str, Any], value)["B"]
        if isinstance(raw, bytes | bytearray | memoryview):
            return bytes(cast(bytes, raw))
    return None


def item_size(item: Mapping[str, Any]) -> int:
    """A conservative (never smaller) estimate of an item's size as DynamoDB counts it:
    UTF-8 attribute names plus values, every number counted at its 21-byte maximum."""
    total = 0
    for name, value in item.items():
        total += len(name.encode("utf-8"))
        for kind, raw in cast(Mapping[str, Any], value).items():
            if kind == "S":
                total += len(str(raw).encode("utf-8"))
            elif kind == "B":
                total += len(cast(bytes, raw))
            elif kind == "N":
                total += _NUMBER_BYTES
            else:
                total += len(repr(raw).encode("utf-8")) + 3
    return total


class Expression:
    """Collects the placeholders of one request's expressions: attribute names always
    go through ``#name`` and values through ``:label`` (never spliced into the text)."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.values: dict[str, Any] = {}

    def name(self, attribute: str) -> str:
        """The placeholder of ``attribute``: ``#`` + its name when that is a valid
        placeholder, else a numbered one (``#n0``) for names such as ``my-ttl``."""
        for placeholder, known in self.names.items():
            if known == attribute:
                return placeholder
        if _PLACEHOLDER_SAFE.fullmatch(attribute) and not attribute.startswith("n_"):
            placeholder = "#" + attribute
        else:
            placeholder = f"#n_{len(self.names)}"
        self.names[placeholder] = attribute
        return placeholder

    def value(self, label: str, value: Mapping[str, Any]) -> str:
        """The placeholder ``:label`` bound to the attribute value ``value``."""
        placeholder = ":" + label
        self.values[placeholder] = dict(value)
        return placeholder

    def params(self) -> dict[str, Any]:
        """``ExpressionAttributeNames`` / ``ExpressionAttributeValues`` for the request."""
        out: dict[str, Any] = {}
        if self.names:
            out["ExpressionAttributeNames"] = dict(self.names)
        if self.values:
            out["ExpressionAttributeValues"] = dict(self.values)
        return out


def shard_of(text: str, shards: int) -> int:
    """A stable shard number in ``range(shards)`` for ``text``."""
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big") % shards


def show_id(thread_id: str, limit: int = 80) -> str:
    """``repr`` of a thread id for messages, shortened when it is very long."""
    if len(thread_id) <= limit:
        return repr(thread_id)
    size = len(thread_id.encode("utf-8"))
    return f"{thread_id[:limit]!r}… ({size} bytes)"


Clock = Callable[[], float]


class DynamoTable:
    """A DynamoDB table as the components use it: the client, the table's name, the
    executor that runs the blocking calls, and the clock.

    ``call`` runs one client operation on the executor and translates its errors (see
    :func:`flowy_dynamodb._executor.translate_error`).
    """

    def __init__(
        self,
        client: BaseClient,
        table_name: str,
        *,
        executor: DynamoExecutor | None = None,
        clock: Clock = time.time,
    ) -> None:
        if not table_name:
            raise ValueError("table_name must not be empty")
        self.client: Any = client
        self.name = table_name
        self.owns_executor = executor is None
        self.executor = executor if executor is not None else DynamoExecutor()
        self.clock = clock

    @property
    def domain(self) -> tuple[str, str, str]:
        """What identifies the coordination domain: endpoint, region and table name."""
        meta = self.client.meta
        return (str(meta.endpoint_url), str(meta.region_name), self.name)

    async def call(self, operation: str, **params: Any) -> dict[str, Any]:
        """Run the client's ``operation`` (e.g. ``"update_item"``) with ``params``."""
        method = getattr(self.client, operation)
        try:
            result = await self.executor.run(method, **params)
        except Exception as exc:
            translated = translate_error(exc, _operation_name(operation), self.name)
            if translated is exc:
                raise
            raise translated from exc
        return cast(dict[str, Any], result)

    async def query_all(self, limit: int | None = None, **params: Any) -> list[Item]:
        """Run a ``Query`` page by page until ``limit`` items (or all) are collected."""
        items: list[Item] = []
        start: Item | None = None
        while limit is None or len(items) < limit:
            page_params = dict(params)
            if start is not None:
                page_params["ExclusiveStartKey"] = start
            result = await self.call("query", **page_params)
            items.extend(cast(list[Item], result.get("Items") or []))
            start = cast("Item | None", result.get("LastEvaluatedKey"))
            if start is None:
                break
        return items if limit is None else items[:limit]

    async def batch_delete(self, keys: Sequence[Item]) -> None:
        """Delete items by key, 25 per request, retrying unprocessed ones with backoff."""
        for first in range(0, len(keys), _BATCH_SIZE):
            pending: list[Any] = [
                {"DeleteRequest": {"Key": dict(key)}} for key in keys[first : first + _BATCH_SIZE]
            ]
            delay = 0.02
            for _ in range(_BATCH_ROUNDS):
                result = await self.call("batch_write_item", RequestItems={self.name: pending})
                unprocessed = cast(
                    "dict[str, list[Any]]", result.get("UnprocessedItems") or {}
                ).get(self.name)
                if not unprocessed:
                    break
                pending = unprocessed
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
            else:
                raise flowy.StorageUnavailableError(
                    f"DynamoDB BatchWriteItem on table {self.name!r} left {len(pending)} "
                    f"deletes unprocessed after {_BATCH_ROUNDS} rounds (throttled); retry later"
                )

    def close(self) -> None:
        """Shut down the executor if this table handle created it."""
        if self.owns_executor:
            self.executor.close(wait=False)


def _operation_name(method: str) -> str:
    return "".join(part.capitalize() for part in method.split("_"))


class DynamoTransaction:
    """The transaction handle ``DynamoCheckpointer.save_with_outbox`` passes to its
    ``enqueue`` callback.

    Actions added here are committed by the same ``TransactWriteItems`` call as the
    checkpoint (head update and history entry): all or nothing. ``DynamoOutbox``'s
    ``enqueue_intent_tx`` adds its outbox item; an application may ``add`` its own
    actions (a domain item ``Put``, a ``ConditionCheck``) to commit them with the
    hand-off. A transaction carries at most 100 actions, two of them the checkpoint's.
    """

    def __init__(self, table_name: str, *, reserved: int = 2) -> None:
        self.table_name = table_name
        self._actions: list[dict[str, Any]] = []
        self._reserved = reserved
        self._sealed = False

    def add(self, action: Mapping[str, object]) -> None:
        """Add one ``TransactItems`` entry (``{"Put": {...}}``, ``{"Update": {...}}``,
        ``{"Delete": {...}}`` or ``{"ConditionCheck": {...}}``) in the client's shape."""
        if self._sealed:
            raise RuntimeError(
                "this DynamoTransaction was already committed or abandoned; add actions "
                "only inside the enqueue callback of save_with_outbox"
            )
        if len(action) != 1 or next(iter(action)) not in (
            "Put",
            "Update",
            "Delete",
            "ConditionCheck",
        ):
            raise ValueError(
                f"a transaction action is one of Put, Update, Delete or ConditionCheck, "
                f"got keys {sorted(action)!r}"
            )
        if len(self._actions) + self._reserved >= MAX_TRANSACTION_ITEMS:
            raise ValueError(
                f"a DynamoDB transaction holds at most {MAX_TRANSACTION_ITEMS} actions and "
                f"{self._reserved} of them are the checkpoint's; this one would be too many"
            )
        self._actions.append(dict(action))

    @property
    def actions(self) -> Sequence[Mapping[str, Any]]:
        """The actions added so far, in order."""
        return tuple(self._actions)

    def seal(self) -> list[dict[str, Any]]:
        """Close the handle to further actions and return them (used by the checkpointer)."""
        self._sealed = True
        return list(self._actions)


RetryMode = Literal["standard", "adaptive", "legacy"]


def make_client(
    *,
    endpoint_url: str | None = None,
    region_name: str | None = None,
    retry_mode: RetryMode = "standard",
    max_attempts: int = 5,
    max_pool_connections: int = 10,
    connect_timeout: float = 5.0,
    read_timeout: float = 10.0,
    session: Session | None = None,
    **client_kwargs: Any,
) -> BaseClient:
    """A boto3 DynamoDB client configured for flowy.

    Throttling and transient errors are retried by botocore with backoff
    (``retry_mode`` ``"standard"`` or ``"adaptive"``, which also rate-limits the client
    when throttled; ``max_attempts`` counts the first attempt). ``client_kwargs`` go to
    ``session.client`` (credentials, ``aws_session_token`` …).
    """
    config = Config(
        retries={"mode": retry_mode, "total_max_attempts": max_attempts},
        max_pool_connections=max_pool_connections,
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
    )
    factory: Any = session if session is not None else Session()
    return factory.client(
        "dynamodb",
        endpoint_url=endpoint_url,
        region_name=region_name,
        config=config,
        **client_kwargs,
    )


def create_table(
    client_or_resource: object,
    table_name: str,
    *,
    ttl_attribute: str = TTL_ATTRIBUTE,
    enable_ttl: bool = True,
    timeout: float = 300.0,
    tags: Mapping[str, str] | None = None,
) -> None:
    """Create the table flowy_dynamodb uses, if it does not exist yet, and wait until it
    is ``ACTIVE`` (idempotent: an existing table is only waited for).

    The table uses on-demand billing (``PAY_PER_REQUEST``), string keys ``pk`` / ``sk``
    and the sparse index ``threads`` on ``list_key``. With ``enable_ttl`` DynamoDB's
    time to live is enabled on ``ttl_attribute``: items carrying that attribute (heads
    and history entries of completed threads, when the checkpointer is given
    ``expire_after``) are deleted by DynamoDB some time after that epoch second.

    ``client_or_resource`` is a boto3 DynamoDB client or service resource. This call
    blocks; from async code run it in a thread.
    """
    client: Any = client_or_resource
    if not hasattr(client, "create_table") or not hasattr(client, "describe_table"):
        raise TypeError(
            f"create_table needs a boto3 DynamoDB client or resource, got "
            f"{type(client_or_resource).__name__}"
        )
    meta: Any = getattr(client, "meta", None)
    if meta is not None and hasattr(meta, "client"):
        client = meta.client  # a service resource: use its low-level client
    try:
        _create_if_missing(client, table_name, tags)
        _wait_active(client, table_name, timeout)
        if enable_ttl:
            _enable_ttl(client, table_name, ttl_attribute)
    except ClientError as exc:
        raise translate_error(exc, "CreateTable", table_name) from exc


def _create_if_missing(client: Any, table_name: str, tags: Mapping[str, str] | None) -> None:
    try:
        client.describe_table(TableName=table_name)
        return
    except ClientError as exc:
        if client_error_code(exc) != "ResourceNotFoundException":
            raise
    params: dict[str, Any] = {
        "TableName": table_name,
        "BillingMode": "PAY_PER_REQUEST",
        "AttributeDefinitions": [
            {"AttributeName": PK, "AttributeType": "S"},
            {"AttributeName": SK, "AttributeType": "S"},
            {"AttributeName": INDEX_PK, "AttributeType": "S"},
        ],
        "KeySchema": [
            {"AttributeName": PK, "KeyType": "HASH"},
            {"AttributeName": SK, "KeyType": "RANGE"},
        ],
        "GlobalSecondaryIndexes": [
            {
                "IndexName": INDEX_NAME,
                "KeySchema": [{"AttributeName": INDEX_PK, "KeyType": "HASH"}],
                "Projection": {
                    "ProjectionType": "INCLUDE",
                    "NonKeyAttributes": list(SUMMARY_ATTRIBUTES),
                },
            }
        ],
    }
    if tags:
        params["Tags"] = [{"Key": k, "Value": v} for k, v in tags.items()]
    try:
        client.create_table(**params)
    except ClientError as exc:
        # Another process created it between our describe and create: fine.
        if client_error_code(exc) != "ResourceInUseException":
            raise


def _wait_active(client: Any, table_name: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        table: Mapping[str, Any] = client.describe_table(TableName=table_name)["Table"]
        indexes: list[Mapping[str, Any]] = table.get("GlobalSecondaryIndexes") or []
        if table.get("TableStatus") == "ACTIVE" and all(
            ix.get("IndexStatus", "ACTIVE") == "ACTIVE" for ix in indexes
        ):
            return
        if time.monotonic() > deadline:
            raise flowy.StorageUnavailableError(
                f"DynamoDB table {table_name!r} did not become ACTIVE within {timeout}s "
                f"(status {table.get('TableStatus')!r}); try again later"
            )
        time.sleep(delay)
        delay = min(delay * 2, 2.0)


def _enable_ttl(client: Any, table_name: str, attribute: str) -> None:
    described = client.describe_time_to_live(TableName=table_name)
    current: Mapping[str, Any] = described.get("TimeToLiveDescription") or {}
    if current.get("TimeToLiveStatus") in ("ENABLED", "ENABLING"):
        if current.get("AttributeName") not in (None, attribute):
            raise flowy.StorageError(
                f"DynamoDB table {table_name!r} already has time to live on "
                f"{current.get('AttributeName')!r}, not {attribute!r}; pass "
                f"ttl_attribute={current.get('AttributeName')!r} or disable it first"
            )
        return
    client.update_time_to_live(
        TableName=table_name,
        TimeToLiveSpecification={"Enabled": True, "AttributeName": attribute},
    )
