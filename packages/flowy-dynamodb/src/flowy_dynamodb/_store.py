"""The one table every component of a store shares: its layout, value marshalling, the
translation of botocore's errors, the clock check, and :class:`DynamoTable`.

Items, keyed by the string partition key ``pk`` and sort key ``sk``::

    pk                                  sk                  item
    thread#<id> or thread-sha256#<hex>  head                head of a thread (revision, record,
                                                            summary columns) and its lease
    (same)                              rev#<20 digits>     one history entry
    (same)                              outbox#<20 digits>  the hand-off message of that
                                                            committed revision (live or dead)
    flowy#schema                        version             the schema version

Three sparse global secondary indexes: ``by_thread`` (``list_key`` = hand-off status and
shard, ``list_sort`` = the thread id) lists heads in thread-id order; ``outbox``
(``live_key`` = shard, ``visible_at``) finds visible live messages oldest first;
``dead_letters`` (``dead_key``, ``dead_at``) lists dead letters oldest first.

Every blocking boto3 call runs on the table's bounded thread pool. Every answer's HTTP
``Date`` header feeds :class:`ClockWatch`, which keeps an estimate of how far this
client's clock is from DynamoDB's.
"""

from __future__ import annotations

import asyncio
import email.utils
import functools
import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any, cast

from botocore.exceptions import BotoCoreError, ClientError, ConnectionError, HTTPClientError

from flowy.errors import (
    LeaseLostError,
    SnapshotEnvelopeInvalidError,
    SnapshotTooLargeError,
    StorageError,
    StorageUnavailableError,
)
from flowy.storage import show_id

if TYPE_CHECKING:
    from botocore.client import BaseClient

__all__ = ["ClockSkewError", "DynamoTable", "thread_key"]

Item = dict[str, Any]
Clock = Callable[[], float]

PK, SK = "pk", "sk"
HEAD_SK = "head"
HISTORY_PREFIX = "rev#"
MESSAGE_PREFIX = "outbox#"
SCHEMA_KEY: Item = {PK: {"S": "flowy#schema"}, SK: {"S": "version"}}
TTL = "expires"
THREADS_INDEX, OUTBOX_INDEX, DEAD_INDEX = "by_thread", "outbox", "dead_letters"
SHARDS = 8
MAX_ITEM_BYTES = 400 * 1024
"""DynamoDB's item size limit (attribute names included)."""


class A:
    """Attribute names: of heads and history entries, leases, messages."""

    THREAD_ID, REVISION, RECORD, WRITE_TX = "thread_id", "revision", "record", "write_tx"
    POINTER, STATUS, REASON, UPDATED = "pointer", "status", "reason", "updated_at"
    HANDOFF, HANDOFF_AT = "handoff_status", "handoff_pending_at"
    LIST_KEY, LIST_SORT = "list_key", "list_sort"
    OWNER, EXPIRES, TOKEN = "lease_owner", "lease_expires_at", "lease_token"
    PAYLOAD, ATTEMPTS, ERROR = "payload", "attempts", "error"
    LIVE, VISIBLE, DEAD, DEAD_AT = "live_key", "visible_at", "dead_key", "dead_at"


SUMMARY = (
    A.THREAD_ID,
    A.REVISION,
    A.POINTER,
    A.STATUS,
    A.REASON,
    A.HANDOFF,
    A.HANDOFF_AT,
    A.UPDATED,
)
_VERBATIM_KEY_BYTES = 1024
_SORT_KEY_BYTES = 1024  # a GSI sort key holds at most 1 KiB
_UNAVAILABLE = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "RequestLimitExceeded",
        "InternalServerError",
        "InternalFailure",
        "ServiceUnavailable",
        "TransactionInProgressException",
        "LimitExceededException",
    }
)
_DRIFT = 1e-3  # seconds per second two clocks may drift apart between samples


class ClockSkewError(LeaseLostError):
    """This client's clock is further from DynamoDB's than ``clock_skew`` allows.

    Leases are judged by the clients' clocks, so a client whose clock runs ahead could
    take over live leases; it refuses to take or renew leases instead (a run holding
    one stops as if it lost it). Synchronise the clock (NTP, the Amazon Time Sync
    Service) or raise ``clock_skew`` on every client of the table.
    """


def thread_key(thread_id: str) -> str:
    """The partition key of a thread: ``thread#`` + the id up to 1 KiB of UTF-8, else
    ``thread-sha256#`` + the SHA-256 of the id (every item keeps the full id too)."""
    raw = thread_id.encode("utf-8")
    if len(raw) <= _VERBATIM_KEY_BYTES:
        return "thread#" + thread_id
    return "thread-sha256#" + hashlib.sha256(raw).hexdigest()


def sort_key(thread_id: str) -> str:
    """The thread id cut to 1 KiB of UTF-8 (UTF-8 order is code point order, and a cut
    never reorders two ids, so the index order is the thread-id order up to ties)."""
    return thread_id.encode("utf-8")[:_SORT_KEY_BYTES].decode("utf-8", "ignore")


def shard_of(text: str) -> int:
    """A stable shard in ``range(SHARDS)``."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:4], "big") % SHARDS


def head_key(thread_id: str) -> Item:
    """The key of a thread's head item."""
    return {PK: {"S": thread_key(thread_id)}, SK: {"S": HEAD_SK}}


def n(value: float | int) -> dict[str, str]:
    """A number attribute value (plain decimal notation)."""
    if isinstance(value, int):
        return {"N": str(value)}
    if not math.isfinite(value):
        raise ValueError(f"DynamoDB cannot store the number {value!r}")
    return {"N": format(Decimal(repr(value)), "f")}


def s(value: str) -> dict[str, str]:
    """A string attribute value."""
    return {"S": value}


def get_s(item: Mapping[str, Any] | None, name: str) -> str | None:
    """String attribute ``name``, or ``None``."""
    value = (item or {}).get(name)
    return (
        str(cast(Mapping[str, Any], value)["S"])
        if isinstance(value, dict) and "S" in value
        else None
    )


def get_n(item: Mapping[str, Any] | None, name: str) -> str | None:
    """Number attribute ``name`` as its decimal text, or ``None``."""
    value = (item or {}).get(name)
    return (
        str(cast(Mapping[str, Any], value)["N"])
        if isinstance(value, dict) and "N" in value
        else None
    )


def get_int(item: Mapping[str, Any] | None, name: str) -> int | None:
    """Number attribute ``name`` as an int, or ``None``."""
    raw = get_n(item, name)
    return None if raw is None else int(Decimal(raw))


def get_float(item: Mapping[str, Any] | None, name: str) -> float | None:
    """Number attribute ``name`` as a float, or ``None``."""
    raw = get_n(item, name)
    return None if raw is None else float(raw)


def get_b(item: Mapping[str, Any] | None, name: str) -> bytes | None:
    """Binary attribute ``name``, or ``None``."""
    value = (item or {}).get(name)
    if isinstance(value, dict) and "B" in value:
        return bytes(cast(bytes, cast(Mapping[str, Any], value)["B"]))
    return None


def item_size(item: Mapping[str, Any]) -> int:
    """A never smaller estimate of an item's size as DynamoDB counts it (names + values,
    every number at its 21-byte maximum)."""
    total = 0
    for name, value in item.items():
        total += len(name.encode("utf-8"))
        for kind, raw in cast(Mapping[str, Any], value).items():
            total += 21 if kind == "N" else len(raw if kind == "B" else str(raw).encode("utf-8"))
    return total


def check_stored_id(thread_id: str, item: Mapping[str, Any] | None) -> None:
    """``SnapshotEnvelopeInvalidError`` if ``item`` is stored for another thread id."""
    stored = get_s(item, A.THREAD_ID)
    if stored is not None and stored != thread_id:
        raise SnapshotEnvelopeInvalidError(
            f"the item for thread {show_id(thread_id)} names thread {show_id(stored)}: it "
            "does not match its key (written by something else, or corrupt)"
        )


class Expression:
    """The placeholders of one request: attribute names go through ``#name`` and values
    through ``:label``, never into the expression text."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.values: dict[str, Any] = {}

    def name(self, attribute: str) -> str:
        """The placeholder of ``attribute`` (all of ours are plain identifiers)."""
        self.names["#" + attribute] = attribute
        return "#" + attribute

    def value(self, label: str, value: Mapping[str, Any]) -> str:
        """The placeholder ``:label`` bound to ``value``."""
        self.values[":" + label] = dict(value)
        return ":" + label

    def params(self) -> dict[str, Any]:
        """``ExpressionAttributeNames`` / ``ExpressionAttributeValues``."""
        out: dict[str, Any] = {}
        if self.names:
            out["ExpressionAttributeNames"] = dict(self.names)
        if self.values:
            out["ExpressionAttributeValues"] = dict(self.values)
        return out


# -- errors ---------------------------------------------------------------------------


class ConditionFailed(Exception):
    """A single-item write's condition was false; ``item`` is the item as it was."""

    def __init__(self, item: Item | None) -> None:
        super().__init__("the condition expression was not met")
        self.item = item


@dataclass(frozen=True, slots=True)
class CancelReason:
    """Why one action of a cancelled transaction failed (``"None"``: it did not)."""

    code: str
    message: str
    item: Item | None


class TransactionCancelled(Exception):
    """``TransactWriteItems`` was cancelled (nothing written); one reason per action."""

    def __init__(self, reasons: list[CancelReason]) -> None:
        super().__init__("the transaction was cancelled")
        self.reasons = reasons


def is_size_error(message: str) -> bool:
    """True if a ``ValidationException`` message is about the item size limit."""
    lowered = message.lower()
    return "item size" in lowered and ("exceed" in lowered or "too large" in lowered)


def translate_error(exc: Exception, operation: str, table: str) -> Exception:
    """What to raise (``from exc``) for a failed botocore call: conditional failures
    become :class:`ConditionFailed` / :class:`TransactionCancelled`; broken connections,
    timeouts and throttling that outlived botocore's retries ``StorageUnavailableError``
    (a write's outcome is unknown); an oversized item ``SnapshotTooLargeError``; the
    rest ``StorageError`` naming the operation and the table."""
    where = f"DynamoDB {operation} on table {table!r}"
    if isinstance(exc, ClientError):
        response = cast(Mapping[str, Any], exc.response)
        error = cast(Mapping[str, Any], response.get("Error") or {})
        code, message = str(error.get("Code", "")), str(error.get("Message", ""))
        if code == "ConditionalCheckFailedException":
            item = response.get("Item")
            return ConditionFailed(cast(Item, item) if isinstance(item, dict) else None)
        if code == "TransactionCanceledException":
            raw = cast(list[Mapping[str, Any]], response.get("CancellationReasons") or [])
            return TransactionCancelled(
                [
                    CancelReason(
                        str(r.get("Code") or "None"),
                        str(r.get("Message") or ""),
                        cast(Item, r["Item"]) if isinstance(r.get("Item"), dict) else None,
                    )
                    for r in raw
                ]
            )
        if code in _UNAVAILABLE:
            return StorageUnavailableError(
                f"{where} failed with {code} after botocore's retries ({message}): the "
                "table is throttled or the service unavailable; retry later, or raise the "
                "retries (option retry_attempts)"
            )
        if code == "ValidationException" and is_size_error(message):
            return SnapshotTooLargeError(
                f"{where} was refused: an item exceeds DynamoDB's size limit ({message}); "
                "nothing was written. Keep large payloads out of the state (e.g. in S3)"
            )
        return StorageError(f"{where} failed with {code or 'an error'}: {message}")
    if isinstance(exc, HTTPClientError | ConnectionError):
        return StorageUnavailableError(
            f"{where} failed: the connection to DynamoDB broke or timed out ({exc}); the "
            "outcome of a write is unknown"
        )
    if isinstance(exc, BotoCoreError):
        return StorageError(f"{where} failed: {exc}")
    return exc


# -- the clock ----------------------------------------------------------------------------


class ClockWatch:
    """An estimate of ``DynamoDB's clock - this client's clock``, as an interval.

    A response sent at ``sent`` and received at ``received`` (local clock) with
    ``Date: D`` (whole seconds, rounded down) was dated by a server clock in ``[D,
    D + 1)`` at a moment in ``[sent, received]``, so the offset lies in ``[D - received,
    D + 1 - sent]``. Intersecting successive intervals (widened for drift) narrows the
    estimate to about a round trip; an empty intersection (a clock was stepped) starts
    over from the newest sample.
    """

    def __init__(self) -> None:
        self.low = -math.inf
        self.high = math.inf
        self._at: float | None = None
        self._date = ("", 0.0)

    def sample(self, sent: float, received: float, date: object) -> None:
        """Account one response's ``Date`` header (ignored if missing or unparsable)."""
        if not isinstance(date, str) or not date:
            return
        if date != self._date[0]:
            try:
                self._date = (date, email.utils.parsedate_to_datetime(date).timestamp())
            except (TypeError, ValueError):
                return
        low, high = self._date[1] - received, self._date[1] + 1.0 - sent
        if self._at is not None:
            slack = abs(received - self._at) * _DRIFT
            merged = max(low, self.low - slack), min(high, self.high + slack)
            if merged[0] <= merged[1]:
                low, high = merged
        self.low, self.high, self._at = low, high, received

    @property
    def skew(self) -> float:
        """The least offset consistent with every sample (0 while it may be 0)."""
        return max(self.low, -self.high, 0.0)


# -- the table ----------------------------------------------------------------------------


class DynamoTable:
    """One DynamoDB table as the components share it: the boto3 client, a bounded thread
    pool for its blocking calls, the clock (and its check against DynamoDB's), and the
    store's settings.

    Args:
        client: a boto3 DynamoDB client.
        name: the table.
        max_workers: threads running boto3 calls (at most this many calls in flight).
        clock_skew: seconds two clients' clocks may differ (see the package README).
        expire_after: seconds a completed thread lives before DynamoDB's time to live
            deletes it (``None``: forever).
        clock: epoch seconds, for leases, visibility and time to live.
    """

    def __init__(
        self,
        client: BaseClient,
        name: str,
        *,
        max_workers: int,
        clock_skew: float,
        expire_after: float | None,
        clock: Clock,
    ) -> None:
        self.client: Any = client
        self.name = name
        self.clock = clock
        self.clock_skew = clock_skew
        self.expire_after = expire_after
        self.max_item_bytes = MAX_ITEM_BYTES
        self.watch = ClockWatch()
        self.pool = ThreadPoolExecutor(max_workers, thread_name_prefix="flowy-dynamodb")
        self._waiters: set[asyncio.Future[None]] = set()
        meta = self.client.meta
        self.domain = ("dynamodb", str(meta.endpoint_url), str(meta.region_name), name)

    async def call(self, operation: str, **params: Any) -> dict[str, Any]:
        """Run the client's ``operation`` (``"update_item"``…) on the pool; translate
        its errors; sample the clock from the answer."""
        sent = self.clock()
        try:
            future = asyncio.get_running_loop().run_in_executor(
                self.pool, functools.partial(getattr(self.client, operation), **params)
            )
        except RuntimeError as exc:  # the pool was shut down
            raise StorageError(f"the DynamoDB store of table {self.name!r} is closed") from exc
        name = "".join(part.capitalize() for part in operation.split("_"))
        try:
            result = cast(dict[str, Any], await future)
        except ClientError as exc:
            self._sample(sent, cast(Mapping[str, Any], exc.response))
            raise translate_error(exc, name, self.name) from exc
        except (BotoCoreError, OSError) as exc:
            translated = translate_error(exc, name, self.name)
            if translated is exc:
                raise
            raise translated from exc
        self._sample(sent, result)
        return result

    def _sample(self, sent: float, response: Mapping[str, Any]) -> None:
        meta = cast(Mapping[str, Any], response.get("ResponseMetadata") or {})
        headers = cast(Mapping[str, Any], meta.get("HTTPHeaders") or {})
        self.watch.sample(sent, self.clock(), headers.get("date"))

    def check_clock(self, action: str) -> None:
        """``ClockSkewError`` if this clock is certainly more than ``clock_skew / 2`` from
        DynamoDB's (so two clients that pass differ by at most ``clock_skew``)."""
        skew = self.watch.skew
        if skew > self.clock_skew / 2:
            raise ClockSkewError(
                f"cannot {action} a lease on table {self.name!r}: this client's clock is at "
                f"least {skew:.2f}s off DynamoDB's (measured from response Date headers), "
                f"more than clock_skew/2 = {self.clock_skew / 2:g}s; synchronise the clock "
                "or raise clock_skew on every client of the table"
            )

    async def get(self, key: Item, attributes: Sequence[str]) -> Item | None:
        """One strongly consistent ``GetItem`` of ``attributes``."""
        expr = Expression()
        result = await self.call(
            "get_item",
            TableName=self.name,
            Key=key,
            ConsistentRead=True,
            ProjectionExpression=", ".join(expr.name(a) for a in attributes),
            **expr.params(),
        )
        return cast("Item | None", result.get("Item"))

    async def update(
        self, key: Item, expr: Expression, update: str, condition: str, **options: Any
    ) -> dict[str, Any]:
        """One conditional ``UpdateItem`` (``ConditionFailed`` with the old item)."""
        return await self.call(
            "update_item",
            TableName=self.name,
            Key=key,
            UpdateExpression=update,
            ConditionExpression=condition,
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
            **options,
            **expr.params(),
        )

    async def query(self, limit: int | None, **params: Any) -> list[Item]:
        """A ``Query``, page by page, until ``limit`` items (or all) are read."""
        items: list[Item] = []
        start: Item | None = None
        while limit is None or len(items) < limit:
            result = await self.call(
                "query",
                TableName=self.name,
                **params,
                **({"ExclusiveStartKey": start} if start else {}),
            )
            items.extend(cast(list[Item], result.get("Items") or []))
            start = cast("Item | None", result.get("LastEvaluatedKey"))
            if start is None:
                break
        return items if limit is None else items[:limit]

    async def delete_keys(self, keys: Sequence[Item]) -> None:
        """Delete items by key, 25 per ``BatchWriteItem``, resending unprocessed ones."""
        for first in range(0, len(keys), 25):
            pending: list[Any] = [{"DeleteRequest": {"Key": k}} for k in keys[first : first + 25]]
            for attempt in range(8):
                result = await self.call("batch_write_item", RequestItems={self.name: pending})
                pending = cast(dict[str, Any], result.get("UnprocessedItems") or {}).get(
                    self.name, []
                )
                if not pending:
                    break
                await asyncio.sleep(min(0.02 * 2**attempt, 1.0))
            else:
                raise StorageUnavailableError(
                    f"DynamoDB left {len(pending)} deletes on table {self.name!r} "
                    "unprocessed (throttled); retry later"
                )

    def notify(self) -> None:
        """Wake this store's consumers waiting in ``claim`` (a message was added)."""
        for waiter in list(self._waiters):
            loop = waiter.get_loop()
            if not loop.is_closed():
                loop.call_soon_threadsafe(_wake, waiter)

    async def wait_notified(self, seconds: float) -> None:
        """Wait up to ``seconds`` for :meth:`notify`."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.add(waiter)
        try:
            await asyncio.wait_for(waiter, seconds)
        except TimeoutError:
            pass
        finally:
            self._waiters.discard(waiter)

    def close(self) -> None:
        """Shut the pool down (calls in flight finish on their threads)."""
        self.pool.shutdown(wait=False)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
