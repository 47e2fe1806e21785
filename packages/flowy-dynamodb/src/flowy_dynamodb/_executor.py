"""Running boto3's blocking calls off the event loop, and translating their errors.

boto3 clients block the calling thread for the whole HTTP round trip, so every call goes
through :class:`DynamoExecutor`: a bounded ``ThreadPoolExecutor`` driven with
``loop.run_in_executor``. :func:`translate_error` turns botocore's exceptions into the
flowy exception tree; the two conditional failures the adapters classify themselves
(a failed condition expression, a cancelled transaction) become :class:`ConditionFailed`
and :class:`TransactionCancelled`, internal exceptions that never leave this package.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionError,
    HTTPClientError,
    NoCredentialsError,
    PartialCredentialsError,
)

import flowy

__all__ = [
    "DEFAULT_MAX_WORKERS",
    "CancelReason",
    "ConditionFailed",
    "DynamoExecutor",
    "TransactionCancelled",
    "client_error_code",
    "is_size_error",
    "translate_error",
]

T = TypeVar("T")

DEFAULT_MAX_WORKERS = 8
"""Threads of a default :class:`DynamoExecutor` (botocore pools 10 connections by default)."""

Item = dict[str, Any]
"""A DynamoDB item in the low-level client's wire shape (``{"name": {"S": "..."}}``)."""

# Error codes that mean "the service is overloaded or briefly broken": botocore's retry
# mode has already retried them with backoff by the time they reach us.
_UNAVAILABLE_CODES = frozenset(
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


class ConditionFailed(Exception):
    """A single-item write's condition expression was false (nothing was written).

    ``item`` is the item as it was when the condition was evaluated (requested with
    ``ReturnValuesOnConditionCheckFailure=ALL_OLD``), or ``None`` if there was none.
    """

    def __init__(self, item: Item | None) -> None:
        super().__init__("the condition expression was not met")
        self.item = item


@dataclass(frozen=True, slots=True)
class CancelReason:
    """Why one action of a cancelled ``TransactWriteItems`` call failed (``code`` is
    ``"None"`` for the actions that would have succeeded)."""

    code: str
    message: str
    item: Item | None


class TransactionCancelled(Exception):
    """``TransactWriteItems`` was cancelled: nothing of it was written.

    ``reasons`` holds one :class:`CancelReason` per action, in request order.
    """

    def __init__(self, reasons: list[CancelReason]) -> None:
        codes = ", ".join(r.code for r in reasons)
        super().__init__(f"the transaction was cancelled ({codes})")
        self.reasons = reasons


def _response(exc: ClientError) -> Mapping[str, Any]:
    return cast(Mapping[str, Any], exc.response)


def client_error_code(exc: ClientError) -> str:
    """The error code of a botocore ``ClientError`` (``""`` if there is none)."""
    error = cast(Mapping[str, Any], _response(exc).get("Error") or {})
    return str(error.get("Code", ""))


def _client_error_message(exc: ClientError) -> str:
    error = cast(Mapping[str, Any], _response(exc).get("Error") or {})
    return str(error.get("Message", ""))


def _cancel_reasons(exc: ClientError) -> list[CancelReason]:
    raw = cast(list[Mapping[str, Any]], _response(exc).get("CancellationReasons") or [])
    reasons: list[CancelReason] = []
    for entry in raw:
        item = entry.get("Item")
        reasons.append(
            CancelReason(
                code=str(entry.get("Code") or "None"),
                message=str(entry.get("Message") or ""),
                item=cast(Item, item) if isinstance(item, dict) else None,
            )
        )
    return reasons


def is_size_error(message: str) -> bool:
    """True if a ``ValidationException`` message says an item is over the size limit."""
    lowered = message.lower()
    return "item size" in lowered and ("exceed" in lowered or "too large" in lowered)


def translate_error(exc: Exception, operation: str, table_name: str) -> Exception:
    """The exception to raise (``from exc``) for a failed botocore call.

    Conditional failures become :class:`ConditionFailed` / :class:`TransactionCancelled`;
    connection problems, timeouts and throttling that outlived botocore's retries become
    ``flowy.StorageUnavailableError`` (the outcome of a write may be unknown); an item
    over the size limit becomes ``flowy.SnapshotTooLargeError``; anything else a
    ``flowy.StorageError`` naming the operation and the table.
    """
    where = f"DynamoDB {operation} on table {table_name!r}"
    if isinstance(exc, ClientError):
        code = client_error_code(exc)
        message = _client_error_message(exc)
        if code == "ConditionalCheckFailedException":
            item = _response(exc).get("Item")
            return ConditionFailed(cast(Item, item) if isinstance(item, dict) else None)
        if code == "TransactionCanceledException":
            return TransactionCancelled(_cancel_reasons(exc))
        if code in _UNAVAILABLE_CODES:
            return flowy.StorageUnavailableError(
                f"{where} failed with {code} after botocore's retries ({message}); the "
                "table is throttled or the service is unavailable: retry later, or raise "
                "the client's retries (botocore Config retries max_attempts)"
            )
        if code == "ResourceNotFoundException":
            return flowy.StorageError(
                f"{where} failed: the table does not exist ({message}); create it with "
                "flowy_dynamodb.create_table(client, table_name)"
            )
        if code == "ValidationException" and is_size_error(message):
            return flowy.SnapshotTooLargeError(
                f"{where} was refused: an item exceeds DynamoDB's item size limit "
                f"({message}); nothing was written. Keep less in the state or store large "
                "payloads elsewhere (e.g. S3) and keep a reference in the state"
            )
        return flowy.StorageError(f"{where} failed with {code or 'an error'}: {message}")
    if isinstance(exc, HTTPClientError | ConnectionError):
        return flowy.StorageUnavailableError(
            f"{where} failed: the connection to DynamoDB broke or timed out ({exc}); the "
            "outcome of a write is unknown"
        )
    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        return flowy.StorageError(
            f"{where} failed: no usable AWS credentials ({exc}); configure credentials for "
            "boto3 (environment, profile or instance role)"
        )
    if isinstance(exc, BotoCoreError):
        return flowy.StorageError(f"{where} failed: {exc}")
    return exc


class DynamoExecutor:
    """A bounded pool of threads that runs boto3's blocking calls for the event loop.

    One executor can (and should) be shared by the checkpointer, lease manager, outbox
    and consumer of a process, so ``max_workers`` bounds the number of DynamoDB calls in
    flight. Keep ``max_workers`` at or below the client's ``max_pool_connections``
    (botocore's default is 10) or threads wait for a connection.
    """

    def __init__(self, max_workers: int = DEFAULT_MAX_WORKERS) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be at least 1, got {max_workers!r}")
        self.max_workers = max_workers
        self._pool = ThreadPoolExecutor(
            max_workers=max_workers, thread_name_prefix="flowy-dynamodb"
        )

    async def run(self, fn: Callable[..., T], /, **kwargs: Any) -> T:
        """Run ``fn(**kwargs)`` on a pool thread and return its result.

        If the awaiting task is cancelled the call still runs to completion on its
        thread: a write may land after the cancellation.
        """
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, **kwargs))

    def close(self, *, wait: bool = True) -> None:
        """Shut the pool down (calls already started finish first when ``wait``)."""
        self._pool.shutdown(wait=wait)

    def __repr__(self) -> str:
        return f"DynamoExecutor(max_workers={self.max_workers})"
