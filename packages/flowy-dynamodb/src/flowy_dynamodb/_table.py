"""The one table every component of a store shares: its layout, value marshalling, the
translation of botocore's errors, the clock check, and :class:`DynamoTable`.

Items, keyed by the string partition key ``pk`` and sort key ``sk``::

    pk                                  sk                  item
    thread#<id> or thread-sha256#<hex>  head                a thread's head and its lease
    (same)                              rev#<20 digits>     one history entry
    (same)                              outbox#<20 digits>  the hand-off message of that
                                                            committed revision
    (same)                              sig#<20 digits>     one signal of the inbox
    (same)                              sigid#<signal id>   the number of the signal sent
                                                            with that id
    (same)                              act#<key>           one activity journal entry
    flowy#schema                        version             the schema version

A signal id or activity key whose sort key would pass 1 KiB is hashed instead:
``sigid-sha256#<hex>``, ``act-sha256#<hex>`` (the item keeps it in full).

Four sparse global secondary indexes: ``heads`` (``list_key``: hand-off status and
shard; ``list_sort``: the thread id) lists heads in thread-id order; ``outbox``
(``live_key``: shard; ``visible_at``) finds visible messages oldest first;
``dead_letters`` (``dead_key``, ``dead_at``) lists dead letters oldest first;
``timers`` (``timer_shard``: shard; ``wake_at``) finds the heads due to wake up.
"""

from __future__ import annotations

import asyncio
import email.utils
import functools
import hashlib
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
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
from flowy.storage.dialect import show_id

if TYPE_CHECKING:
    from botocore.client import BaseClient

__all__ = ["ClockSkewError", "DynamoTable", "thread_key"]

Item = dict[str, Any]
Clock = Callable[[], float]

PK, SK, HEAD_SK, HISTORY, MESSAGE = "pk", "sk", "head", "rev#", "outbox#"
SIGNAL, SIGNAL_IDS, ACTIVITIES = "sig#", "sigid", "act"
"""Sort key prefixes: a signal, and every signal id and journal entry (whose keys are
``sigid#<id>`` / ``sigid-sha256#<hex>`` and ``act#<key>`` / ``act-sha256#<hex>``)."""
SCHEMA_KEY: Item = {PK: {"S": "flowy#schema"}, SK: {"S": "version"}}
TTL = "expires"
THREADS_INDEX, OUTBOX_INDEX, DEAD_INDEX = "heads", "outbox", "dead_letters"
TIMERS_INDEX = "timers"
SHARDS = 8
MAX_ITEM_BYTES = 400 * 1024
"""DynamoDB's item size limit (attribute names included)."""
MAX_KEY_BYTES = 1024
"""DynamoDB's limit on a sort key (and on an index's sort key), in UTF-8 bytes."""
MAX_NUMBER, MIN_NUMBER = 1e38, 1e-129
"""The magnitudes of the floats :func:`n` writes as DynamoDB numbers exactly: zero, or at
least ``MIN_NUMBER`` (DynamoDB's smallest is 1E-130) and below ``MAX_NUMBER`` (in plain
notation a larger float has more than DynamoDB's 38 significant digits)."""
MAX_SEQ = 10**20 - 1
"""The largest signal number a 20-digit sort key holds."""


class A:
    """Attribute names: of heads and history entries, leases, messages."""

    THREAD_ID, REVISION, RECORD, WRITE_TX = "thread_id", "revision", "record", "write_tx"
    POINTER, STATUS, REASON, UPDATED = "pointer", "status", "reason", "updated_at"
    HANDOFF, HANDOFF_AT = "handoff_status", "handoff_pending_at"
    LIST_KEY, LIST_SORT = "list_key", "list_sort"
    OWNER, EXPIRES, TOKEN = "lease_owner", "lease_expires_at", "lease_token"
    PAYLOAD, ATTEMPTS, ERROR, ENQUEUED = "payload", "attempts", "error", "enqueued_at"
    LIVE, VISIBLE, DEAD, DEAD_AT = "live_key", "visible_at", "dead_key", "dead_at"
    TIMER, WAKE, GRAPH_VERSION = "timer_shard", "wake_at", "graph_version"
    SEQ, SIGNAL_ID, KEY, DATA = "seq", "signal_id", "activity_key", "data"
    SUMMARY = (
        *(THREAD_ID, REVISION, POINTER, STATUS, REASON, HANDOFF, HANDOFF_AT, UPDATED, WAKE),
        GRAPH_VERSION,
    )
    """The head attributes a listing reads (the ``heads`` index carries them), in the
    order of ``BaseCheckpointer.summary``'s arguments."""


_UNAVAILABLE = {
    "ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded",
    "InternalServerError", "InternalFailure", "ServiceUnavailable", "LimitExceededException",
    "TransactionInProgressException",
}  # fmt: skip


class ClockSkewError(LeaseLostError):
    """This client's clock is further from DynamoDB's than ``clock_skew / 2``.

    Leases are judged by the clients' clocks, so a client whose clock runs ahead could
    take over live leases: it refuses to take or renew leases instead (a run holding one
    stops as if it lost it). Synchronise the clock (NTP, Amazon Time Sync Service) or
    raise ``clock_skew`` on every client of the table.
    """


def thread_key(thread_id: str) -> str:
    """The partition key of a thread: ``thread#`` + the id up to 1 KiB of UTF-8, else
    ``thread-sha256#`` + the SHA-256 of the id (every item keeps the full id too)."""
    raw = thread_id.encode("utf-8")
    if len(raw) <= 1024:
        return "thread#" + thread_id
    return "thread-sha256#" + hashlib.sha256(raw).hexdigest()


def sort_key(thread_id: str) -> str:
    """The id cut to the 1 KiB an index sort key holds. UTF-8 order is code point order
    and a cut never swaps two ids, so the index order is the id order up to ties."""
    return thread_id.encode("utf-8")[:1024].decode("utf-8", "ignore")


def shard_of(text: str) -> int:
    """A stable shard in ``range(SHARDS)``."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:4], "big") % SHARDS


def head_key(thread_id: str) -> Item:
    """The key of a thread's head item."""
    return {PK: {"S": thread_key(thread_id)}, SK: {"S": HEAD_SK}}


def entry_key(thread_id: str, prefix: str, revision: int) -> Item:
    """The key of a thread's history entry (``HISTORY``) or message (``MESSAGE``)."""
    return {PK: {"S": thread_key(thread_id)}, SK: {"S": f"{prefix}{revision:020d}"}}


def named_key(thread_id: str, prefix: str, name: str) -> Item:
    """The key of a thread's item named ``name`` (a signal id, an activity key):
    ``<prefix>#<name>`` when that fits a sort key, else ``<prefix>-sha256#`` + the SHA-256
    of the name (the item keeps the full name). The two forms never alias."""
    sk = f"{prefix}#{name}"
    if len(sk.encode("utf-8")) > MAX_KEY_BYTES:
        sk = f"{prefix}-sha256#{hashlib.sha256(name.encode('utf-8')).hexdigest()}"
    return {PK: {"S": thread_key(thread_id)}, SK: {"S": sk}}


def storable(value: float) -> bool:
    """True if :func:`n` writes ``value`` as a DynamoDB number exactly."""
    return math.isfinite(value) and (value == 0 or MIN_NUMBER <= abs(value) < MAX_NUMBER)


def n(value: float) -> dict[str, str]:
    """A number attribute value (plain decimal notation)."""
    if isinstance(value, int):
        return {"N": str(value)}
    if not math.isfinite(value):
        raise ValueError(f"DynamoDB cannot store the number {value!r}")
    return {"N": format(Decimal(repr(value)), "f")}


def s(value: str) -> dict[str, str]:
    """A string attribute value."""
    return {"S": value}


def _raw(item: Mapping[str, Any] | None, name: str, kind: str) -> Any:
    value = (item or {}).get(name)
    return cast(Mapping[str, Any], value).get(kind) if isinstance(value, dict) else None


def get_s(item: Mapping[str, Any] | None, name: str) -> str | None:
    """String attribute ``name``, or ``None``."""
    raw = _raw(item, name, "S")
    return None if raw is None else str(raw)


def get_text(item: Mapping[str, Any] | None, name: str) -> str | None:
    """String or number attribute ``name`` as text, or ``None``."""
    raw = _raw(item, name, "S")
    raw = _raw(item, name, "N") if raw is None else raw
    return None if raw is None else str(raw)


def get_n(item: Mapping[str, Any] | None, name: str) -> Decimal | None:
    """Number attribute ``name``, or ``None``."""
    raw = _raw(item, name, "N")
    return None if raw is None else Decimal(str(raw))


def get_int(item: Mapping[str, Any] | None, name: str) -> int | None:
    """Number attribute ``name`` as an int, or ``None``."""
    raw = get_n(item, name)
    return None if raw is None else int(raw)


def get_b(item: Mapping[str, Any] | None, name: str) -> bytes | None:
    """Binary attribute ``name``, or ``None``."""
    raw = _raw(item, name, "B")
    return None if raw is None else bytes(raw)


def item_size(item: Mapping[str, Any]) -> int:
    """A never smaller estimate of an item's size as DynamoDB counts it (names and
    values, every number at its 21-byte maximum)."""
    total = 0
    for name, value in item.items():
        ((kind, raw),) = cast(Mapping[str, Any], value).items()
        size = 21 if kind == "N" else len(raw) if kind == "B" else len(str(raw).encode())
        total += len(name.encode()) + size
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
    """The placeholders of one request: names as ``#name``, values as ``:v0``, ``:v1``…;
    nothing is spliced into the expression text."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.values: dict[str, Any] = {}

    def __call__(self, attribute: str) -> str:
        """The placeholder of an attribute name (all of ours are identifiers)."""
        self.names["#" + attribute] = attribute
        return "#" + attribute

    def v(self, value: Mapping[str, Any]) -> str:
        """A new placeholder bound to the attribute value ``value``."""
        label = f":v{len(self.values)}"
        self.values[label] = dict(value)
        return label

    def sets(self, fields: Mapping[str, Mapping[str, Any]]) -> str:
        """``SET #a = :v…, …`` of ``fields``."""
        return "SET " + ", ".join(f"{self(k)} = {self.v(v)}" for k, v in fields.items())

    def removes(self, attributes: Iterable[str]) -> str:
        """`` REMOVE #a, …`` of ``attributes`` (empty when there are none)."""
        names = [self(a) for a in attributes]
        return f" REMOVE {', '.join(names)}" if names else ""

    def all_absent(self, *attributes: str) -> str:
        """Condition: none of ``attributes`` exists."""
        return " AND ".join(f"attribute_not_exists({self(a)})" for a in attributes)

    def params(self) -> dict[str, Any]:
        """``ExpressionAttributeNames`` and ``ExpressionAttributeValues``."""
        out: dict[str, Any] = {"ExpressionAttributeNames": dict(self.names)}
        if self.values:
            out["ExpressionAttributeValues"] = dict(self.values)
        return out


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
        self._waiters: set[asyncio.Future[None]] = set()

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

    async def update(self, key: Item, expr: Expression, update: str, condition: str) -> Item:
        """One conditional ``UpdateItem`` of ``key``; returns the item as it is after it.
        A false ``condition`` raises :class:`ConditionFailed` with the item as it was."""
        result = await self.call(
            "update_item",
            TableName=self.name,
            Key=key,
            UpdateExpression=update,
            ConditionExpression=condition,
            ReturnValues="ALL_NEW",
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

    async def query(self, limit: int | None, **params: Any) -> list[Item]:
        """A ``Query``, page by page, until ``limit`` items (or all) are read."""
        items: list[Item] = []
        start: Item | None = None
        while limit is None or len(items) < limit:
            page = await self.call(
                "query",
                TableName=self.name,
                **params,
                **({"ExclusiveStartKey": start} if start else {}),
            )
            items.extend(page.get("Items") or [])
            start = page.get("LastEvaluatedKey")
            if start is None:
                break
        return items[:limit]

    async def get_keys(self, keys: Sequence[Item], attributes: Sequence[str]) -> list[Item]:
        """The items of ``keys`` that exist, with ``attributes`` (and their keys), 100 per
        ``BatchGetItem`` (eventually consistent), asking again for unprocessed keys."""
        expr = Expression()
        projection = ", ".join(map(expr, (PK, SK, *attributes)))
        found: list[Item] = []
        for first in range(0, len(keys), 100):
            pending: list[Item] = list(keys[first : first + 100])
            for attempt in range(8):
                request: dict[str, Any] = {"Keys": pending, "ProjectionExpression": projection}
                request.update(expr.params())
                result = await self.call("batch_get_item", RequestItems={self.name: request})
                responses: dict[str, list[Item]] = result.get("Responses") or {}
                found += responses.get(self.name) or []
                unprocessed: dict[str, dict[str, list[Item]]] = result.get("UnprocessedKeys") or {}
                pending = (unprocessed.get(self.name) or {}).get("Keys") or []
                if not pending:
                    break
                await asyncio.sleep(0.02 * 2**attempt)
            else:
                raise StorageUnavailableError(
                    f"DynamoDB left {len(pending)} reads on table {self.name!r} unprocessed "
                    "(throttled); retry later"
                )
        return found

    async def count(self, **params: Any) -> int:
        """How many items a ``Query`` matches (``Select=COUNT``, page by page)."""
        total = 0
        start: Item | None = None
        while True:
            page = await self.call(
                "query",
                TableName=self.name,
                Select="COUNT",
                **params,
                **({"ExclusiveStartKey": start} if start else {}),
            )
            total += int(page.get("Count") or 0)
            start = page.get("LastEvaluatedKey")
            if start is None:
                return total

    async def delete_keys(self, keys: Sequence[Item]) -> None:
        """Delete items by key, 25 per ``BatchWriteItem``, resending unprocessed ones."""
        for first in range(0, len(keys), 25):
            pending: list[Any] = [{"DeleteRequest": {"Key": k}} for k in keys[first : first + 25]]
            for attempt in range(8):
                result = await self.call("batch_write_item", RequestItems={self.name: pending})
                unprocessed: dict[str, list[Any]] = result.get("UnprocessedItems") or {}
                pending = unprocessed.get(self.name) or []
                if not pending:
                    break
                await asyncio.sleep(0.02 * 2**attempt)
            else:
                raise StorageUnavailableError(
                    f"DynamoDB left {len(pending)} deletes on table {self.name!r} unprocessed "
                    "(throttled); retry later"
                )

    def notify(self) -> None:
        """Wake this store's consumers waiting in ``claim``: a message was added."""
        for waiter in list(self._waiters):
            if not waiter.get_loop().is_closed():
                waiter.get_loop().call_soon_threadsafe(
                    lambda w=waiter: None if w.done() else w.set_result(None)
                )

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
