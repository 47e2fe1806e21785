"""The table as the components of a store share it: :class:`DynamoTable` (the client,
its pool of threads, the clock and the store's settings), the translation of botocore's
errors, and the check of the clock against DynamoDB's.
"""

from __future__ import annotations

import asyncio
import email.utils
import functools
import math
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, cast

from botocore.exceptions import BotoCoreError, ClientError, ConnectionError, HTTPClientError

from flowy.errors import (
    LeaseLostError,
    SnapshotTooLargeError,
    StorageError,
    StorageUnavailableError,
)
from flowy.storage.dialect import Wakeups

from ._layout import MAX_ITEM_BYTES, PK, SK, A, Expression, Item, check_stored_id, s, thread_key

if TYPE_CHECKING:
    from botocore.client import BaseClient

__all__ = ["ClockSkewError", "ConditionFailed", "DynamoTable"]

Clock = Callable[[], float]

_UNAVAILABLE = {
    "ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded",
    "InternalServerError", "InternalFailure", "ServiceUnavailable", "LimitExceededException",
    "TransactionInProgressException",
}  # fmt: skip
_TRANSIENT = {"TransactionConflict", "ThrottlingError", "ProvisionedThroughputExceeded"}
"""Cancellation reasons of a transaction that sending it again may cure."""


class ClockSkewError(LeaseLostError):
    """This client's clock is further from DynamoDB's than ``clock_skew / 2``.

    Leases are judged by the clients' clocks, so a client whose clock runs ahead could
    take over live leases: it refuses to take or renew leases instead (a run holding one
    stops as if it lost it). Synchronise the clock (NTP, Amazon Time Sync Service) or
    raise ``clock_skew`` on every client of the table.
    """


class ConditionFailed(Exception):
    """A conditional write wrote nothing. ``reasons`` holds, per action of a transaction
    (one for a single write), its code (``"None"``: it was fine), message and the item as
    it was; ``item`` is the first action's item."""

    def __init__(self, reasons: list[tuple[str, str, Item | None]]) -> None:
        super().__init__("the condition expression was not met")
        self.reasons = reasons
        self.item = reasons[0][2] if reasons else None

    def failed(self) -> list[int]:
        """The actions whose condition failed."""
        return [i for i, r in enumerate(self.reasons) if r[0].startswith("ConditionalCheckFailed")]

    def transient(self) -> bool:
        """True if a concurrent transaction or throttling cancelled it: sending it again
        may succeed."""
        return any(code in _TRANSIENT for code, _, _ in self.reasons)

    def describe(self) -> str:
        """The actions that failed, with their codes and messages."""
        return "; ".join(
            f"action {i}: {c} {m}".strip()
            for i, (c, m, _) in enumerate(self.reasons)
            if c != "None"
        )


def is_size_error(message: str) -> bool:
    """True if a ``ValidationException`` message is about the item size limit."""
    lowered = message.lower()
    return "item size" in lowered and ("exceed" in lowered or "too large" in lowered)


def translate_error(exc: Exception, operation: str, table: str) -> Exception:
    """What to raise (``from exc``) for a failed botocore call: :class:`ConditionFailed`
    for a failed condition or cancelled transaction; ``StorageUnavailableError`` for a
    broken connection, a timeout or throttling that outlived botocore's retries (the
    outcome of a write is unknown); ``SnapshotTooLargeError`` for an oversized item;
    else ``StorageError`` naming the operation and the table."""
    where = f"DynamoDB {operation} on table {table!r}"
    if isinstance(exc, ClientError):
        response = cast(Mapping[str, Any], exc.response)  # pyright: ignore[reportUnknownMemberType]
        error = cast(Mapping[str, Any], response.get("Error") or {})
        code, message = str(error.get("Code", "")), str(error.get("Message", ""))
        if code == "ConditionalCheckFailedException":
            return ConditionFailed([(code, message, response.get("Item"))])
        if code == "TransactionCanceledException":
            raw = cast(list[Mapping[str, Any]], response.get("CancellationReasons") or [])
            return ConditionFailed(
                [
                    (str(r.get("Code") or "None"), str(r.get("Message") or ""), r.get("Item"))
                    for r in raw
                ]
            )
        if code in _UNAVAILABLE:
            return StorageUnavailableError(
                f"{where} failed with {code} after botocore's retries ({message}); retry "
                "later, or raise the retries (option retry_attempts)"
            )
        if code == "ValidationException" and is_size_error(message):
            return SnapshotTooLargeError(
                f"{where} was refused: an item exceeds DynamoDB's size limit ({message}); "
                "nothing was written. Keep large payloads out of the state (e.g. in S3)"
            )
        return StorageError(f"{where} failed with {code or 'an error'}: {message}")
    if isinstance(exc, HTTPClientError | ConnectionError):
        return StorageUnavailableError(
            f"{where} failed: the connection broke or timed out ({exc}); the outcome of a "
            "write is unknown"
        )
    return StorageError(f"{where} failed: {exc}")


class ClockWatch:
    """An estimate of DynamoDB's clock minus this client's, as an interval.

    An answer sent at ``sent`` and received at ``received`` (local clock) with ``Date:
    D`` (whole seconds, rounded down) was dated by a server clock in ``[D, D + 1)`` at a
    moment in ``[sent, received]``: the offset lies in ``[D - received, D + 1 - sent]``.
    Intersecting successive intervals (widened by 1 ms/s for drift) narrows it to about a
    round trip; an empty intersection (a clock was stepped) starts over.
    """

    low: float
    high: float
    at: float

    def __init__(self) -> None:
        self.low, self.high, self.at = -math.inf, math.inf, 0.0
        self._date = ("", 0.0)

    def sample(self, sent: float, received: float, date: object) -> None:
        """Account one answer's ``Date`` header (ignored if missing or unparsable)."""
        if not isinstance(date, str):
            return
        if date != self._date[0]:
            try:
                self._date = (date, email.utils.parsedate_to_datetime(date).timestamp())
            except (TypeError, ValueError):
                return
        low, high = self._date[1] - received, self._date[1] + 1.0 - sent
        slack = abs(received - self.at) * 1e-3
        if max(low, self.low - slack) <= min(high, self.high + slack):
            low, high = max(low, self.low - slack), min(high, self.high + slack)
        self.low, self.high, self.at = low, high, received

    @property
    def skew(self) -> float:
        """The smallest offset consistent with every sample (0 while it may be 0)."""
        return max(self.low, -self.high, 0.0)


class DynamoTable:
    """One DynamoDB table as the components of a store share it: the boto3 client, a
    bounded pool of threads for its blocking calls, the clock (checked against
    DynamoDB's from every answer's ``Date`` header) and the store's settings.

    Args:
        client: a boto3 DynamoDB client.
        name: the table.
        max_workers: threads running boto3 calls (at most this many calls in flight).
        clock_skew: seconds two clients' clocks may differ.
        expire_after: seconds a completed thread lives (``None``: forever).
        clock: epoch seconds, for leases, visibility and time to live.
    """

    name: str
    clock: Clock
    clock_skew: float
    watch: ClockWatch
    pool: ThreadPoolExecutor
    domain: tuple[str, str, str, str]

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
        self.name, self.clock, self.clock_skew = name, clock, clock_skew
        self.expire_after = expire_after
        self.max_item_bytes = MAX_ITEM_BYTES
        self.watch = ClockWatch()
        self.pool = ThreadPoolExecutor(max_workers, thread_name_prefix="flowy-dynamodb")
        meta = self.client.meta
        self.domain = ("dynamodb", str(meta.endpoint_url), str(meta.region_name), name)
        self.wakeups: Wakeups = Wakeups()
        """This store's consumers waiting in ``claim``: woken when a message is added."""

    async def call(self, operation: str, **params: Any) -> dict[str, Any]:
        """Run the client's ``operation`` (``"update_item"``…) on the pool, translate its
        errors, and sample the clock from the answer."""
        sent = self.clock()
        method = functools.partial(getattr(self.client, operation), **params)
        try:
            future = asyncio.get_running_loop().run_in_executor(self.pool, method)
        except RuntimeError as exc:  # the pool was shut down
            raise StorageError(f"the store of DynamoDB table {self.name!r} is closed") from exc
        try:
            result = cast(dict[str, Any], await future)
        except (BotoCoreError, ClientError) as exc:
            if isinstance(exc, ClientError):
                self._sample(sent, cast(Mapping[str, Any], exc.response))
            name = operation.title().replace("_", "")
            raise translate_error(exc, name, self.name) from exc
        self._sample(sent, result)
        return result

    def _sample(self, sent: float, response: Mapping[str, Any]) -> None:
        headers = response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
        self.watch.sample(sent, self.clock(), cast(Mapping[str, Any], headers).get("date"))

    def check_clock(self, action: str) -> None:
        """``ClockSkewError`` if this clock is certainly more than ``clock_skew / 2`` off
        DynamoDB's (then two clients that pass differ by at most ``clock_skew``)."""
        skew = self.watch.skew
        if skew > self.clock_skew / 2:
            raise ClockSkewError(
                f"cannot {action} a lease on DynamoDB table {self.name!r}: this client's "
                f"clock is at least {skew:.2f}s off DynamoDB's (from the Date of its "
                f"answers), more than clock_skew/2 = {self.clock_skew / 2:g}s; synchronise "
                "the clock, or raise clock_skew on every client of the table"
            )

    async def get(self, key: Item, attributes: Sequence[str]) -> Item | None:
        """One strongly consistent ``GetItem`` of ``attributes``."""
        expr = Expression()
        result = await self.call(
            "get_item",
            TableName=self.name,
            Key=key,
            ConsistentRead=True,
            ProjectionExpression=", ".join(map(expr, attributes)),
            **expr.params(),
        )
        return result.get("Item")

    async def update(
        self, key: Item, expr: Expression, update: str, condition: str, returns: str = "ALL_NEW"
    ) -> Item:
        """One conditional ``UpdateItem`` of ``key``; returns the item as it is after it
        (or as it was before, with ``returns="ALL_OLD"``). A false ``condition`` raises
        :class:`ConditionFailed` with the item as it was."""
        result = await self.call(
            "update_item",
            TableName=self.name,
            Key=key,
            UpdateExpression=update,
            ConditionExpression=condition,
            ReturnValues=returns,
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
            **expr.params(),
        )
        return result.get("Attributes") or {}

    async def delete(self, key: Item, expr: Expression, condition: str) -> None:
        """One conditional ``DeleteItem`` of ``key`` (``ConditionFailed`` as above)."""
        await self.call(
            "delete_item",
            TableName=self.name,
            Key=key,
            ConditionExpression=condition,
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
            **expr.params(),
        )

    def put_new(self, item: Item) -> Item:
        """A ``Put`` action of a transaction that adds ``item`` only if its key is new
        (a failed condition returns the item that is there)."""
        return {
            "Put": {
                "TableName": self.name,
                "Item": item,
                "ConditionExpression": "attribute_not_exists(#pk)",
                "ExpressionAttributeNames": {"#pk": PK},
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }

    async def pages(self, operation: str = "query", **params: Any) -> AsyncIterator[dict[str, Any]]:
        """The pages of a ``Query`` (or a ``Scan``), each request going on from the last
        one's ``LastEvaluatedKey``."""
        start: Item | None = None
        while True:
            extra = {"ExclusiveStartKey": start} if start else {}
            page = await self.call(operation, TableName=self.name, **params, **extra)
            yield page
            start = page.get("LastEvaluatedKey")
            if start is None:
                return

    async def query(self, limit: int | None, **params: Any) -> list[Item]:
        """A ``Query``, page by page, until ``limit`` items (or all) are read."""
        items: list[Item] = []
        async for page in self.pages(**params):
            items.extend(page.get("Items") or [])
            if limit is not None and len(items) >= limit:
                break
        return items[:limit]

    async def count(self, **params: Any) -> int:
        """How many items a ``Query`` matches (``Select=COUNT``, page by page)."""
        pages = self.pages(Select="COUNT", **params)
        return sum([int(page.get("Count") or 0) async for page in pages])

    async def query_index(
        self,
        index: str,
        attribute: str,
        values: Iterable[str],
        limit: int | None,
        sort: Callable[[Expression], str] | None = None,
    ) -> list[Item]:
        """The items of the partitions of ``index`` whose key ``attribute`` is one of
        ``values``, queried at once: up to ``limit`` of each (``None``: all), with
        ``sort``'s condition on the index's sort key if given."""

        async def partition(value: str) -> list[Item]:
            expr = Expression()
            condition = f"{expr(attribute)} = {expr.v(s(value))}"
            if sort is not None:
                condition += f" AND {sort(expr)}"
            extra = {"Limit": limit} if limit is not None else {}
            return await self.query(
                limit, IndexName=index, KeyConditionExpression=condition, **extra, **expr.params()
            )

        parts = await asyncio.gather(*(partition(value) for value in values))
        return [item for part in parts for item in part]

    async def thread_items(
        self,
        thread_id: str,
        sort: str | tuple[str, str],
        limit: int | None,
        *attributes: str,
        newest_first: bool = False,
    ) -> list[Item]:
        """Up to ``limit`` (or all) items of the thread whose sort key begins with
        ``sort`` (or lies between its two bounds), in sort key order; strongly
        consistent, each checked to be the thread's."""
        expr = Expression()
        condition = f"{expr(PK)} = {expr.v(s(thread_key(thread_id)))} AND "
        if isinstance(sort, str):
            condition += f"begins_with({expr(SK)}, {expr.v(s(sort))})"
        else:
            condition += f"{expr(SK)} BETWEEN {expr.v(s(sort[0]))} AND {expr.v(s(sort[1]))}"
        items = await self.query(
            limit,
            KeyConditionExpression=condition,
            ProjectionExpression=", ".join(map(expr, (PK, SK, A.THREAD_ID, *attributes))),
            ScanIndexForward=not newest_first,
            ConsistentRead=True,
            **({"Limit": limit} if limit is not None else {}),
            **expr.params(),
        )
        for item in items:
            check_stored_id(thread_id, item)
        return items

    async def get_keys(
        self, keys: Sequence[Item], attributes: Sequence[str], *, consistent: bool = False
    ) -> list[Item]:
        """The items of ``keys`` that exist, with ``attributes`` (and their keys), 100 per
        ``BatchGetItem`` (eventually consistent unless ``consistent``), asking again for
        unprocessed keys; in no particular order."""
        expr = Expression()
        request: dict[str, Any] = {
            "ProjectionExpression": ", ".join(map(expr, (PK, SK, *attributes)))
        }
        if consistent:
            request["ConsistentRead"] = True
        request.update(expr.params())
        return await self._batch("batch_get_item", keys, 100, lambda k: {"Keys": k, **request})

    async def delete_keys(self, keys: Sequence[Item]) -> None:
        """Delete items by key, 25 per ``BatchWriteItem``, resending unprocessed ones."""
        deletes = [{"DeleteRequest": {"Key": key}} for key in keys]
        await self._batch("batch_write_item", deletes, 25, lambda requests: requests)

    async def _batch(
        self, operation: str, requests: Sequence[Any], size: int, wrap: Callable[[list[Any]], Any]
    ) -> list[Item]:
        """Send ``requests`` ``size`` at a time (``wrap`` makes the table's part of the
        request of a batch), sending again with a growing pause what DynamoDB left
        unprocessed; the items read."""
        found: list[Item] = []
        for first in range(0, len(requests), size):
            pending: list[Any] = list(requests[first : first + size])
            for attempt in range(8):
                answer = await self.call(operation, RequestItems={self.name: wrap(pending)})
                read: Any = answer.get("Responses") or {}
                found += read.get(self.name) or []
                left: Any = answer.get("UnprocessedKeys") or answer.get("UnprocessedItems") or {}
                part: Any = left.get(self.name) or []
                # BatchGetItem leaves {"Keys": [...], ...} per table, BatchWriteItem a list
                pending = cast(list[Any], part.get("Keys") if isinstance(part, dict) else part)
                if not pending:
                    break
                await asyncio.sleep(0.02 * 2**attempt)
            else:
                raise StorageUnavailableError(
                    f"DynamoDB left {len(pending)} requests of {operation} on table "
                    f"{self.name!r} unprocessed (throttled); retry later"
                )
        return found

    def close(self) -> None:
        """Shut the pool down (calls in flight finish on their threads)."""
        self.pool.shutdown(wait=False)
