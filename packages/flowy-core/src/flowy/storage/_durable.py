"""The values of durable time, signals and activities, as stores keep them: timers (the
wake-up times of waiting heads), signals (a thread's inbox) and activity records (a
thread's journal), with their byte encodings and argument checks.

A signal and an activity record are stored as small JSON documents the base encodes and
decodes; a store only keeps the bytes under the keys it is given. Decoding validates
every field and never executes anything.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .._errors import SnapshotEnvelopeInvalidError
from .._types import JSON
from ._intents import loads_bounded
from ._limits import MAX_DEPTH, MAX_TIMESTAMP, MAX_VALUE_BYTES, check_depth, check_time, dump_json

__all__ = [
    "MAX_KEY_BYTES",
    "ActivityRecord",
    "ActivityStatus",
    "Signal",
    "Timer",
    "check_key",
    "decode_activity",
    "decode_signal",
    "encode_activity",
    "encode_signal",
]

MAX_KEY_BYTES = 1024
"""The longest signal name, signal id or activity key accepted, in UTF-8 bytes."""

_READ_BYTES = MAX_VALUE_BYTES + 64 * 1024
# A stored document wraps its value (a payload, a result) in one object: one level more.
_READ_DEPTH = MAX_DEPTH + 1


def check_key(value: object, what: str) -> str:
    """A signal name, signal id or activity key: a non-empty ``str`` without NUL, at most
    ``MAX_KEY_BYTES`` UTF-8 bytes (``TypeError`` / ``ValueError`` otherwise)."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__} {value!r:.80}")
    if not value:
        raise ValueError(f"{what} must not be empty")
    if "\x00" in value:
        raise ValueError(f"{what} must not contain NUL characters: {value!r:.80}")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ValueError(f"{what} is not valid Unicode text: {value!r:.80}") from exc
    if size > MAX_KEY_BYTES:
        raise ValueError(f"{what} is {size} bytes long; the limit is {MAX_KEY_BYTES} bytes")
    return value


@dataclass(frozen=True, slots=True)
class Timer:
    """A waiting thread's wake-up time, as ``Checkpointer.timers`` lists it."""

    thread_id: str
    """The waiting thread."""
    wake_at: float
    """When it is due, in seconds since the epoch."""


@dataclass(frozen=True, slots=True)
class Signal:
    """One message in a thread's inbox (``Runner.signal``).

    ``seq`` numbers a thread's signals 1, 2, 3, … in the order they were stored; a wait
    for ``name`` takes that name's signals in this order, each once.
    """

    thread_id: str
    """The thread it was sent to."""
    name: str
    """What the thread waits for (``flowy.wait_for(name)``)."""
    payload: JSON
    """The JSON value it carries."""
    signal_id: str
    """The sender's id: a second signal with the same id is the same signal."""
    seq: int = 0
    """Its place in the thread's inbox (0 before it is stored)."""
    sent_at: float = 0.0
    """When it was stored, in seconds since the epoch."""


class ActivityStatus(enum.StrEnum):
    """Where an activity call stands in the journal."""

    STARTED = "started"
    """Called, with no recorded outcome: after a crash, its outcome is unknown."""
    SUCCEEDED = "succeeded"
    """Returned; ``result`` is what it returned."""
    FAILED = "failed"
    """Raised on its last allowed attempt; ``error`` says what."""
    RETRYING = "retrying"
    """Raised; the next attempt is due at ``retry_at`` (a durable timer)."""


@dataclass(frozen=True, slots=True)
class ActivityRecord:
    """One entry of a thread's activity journal (``flowy.activity``)."""

    key: str
    """The call's key, unique in the thread."""
    status: ActivityStatus
    """Where the call stands."""
    name: str = ""
    """The function called (its qualified name)."""
    attempts: int = 0
    """Attempts started so far."""
    result: JSON = None
    """What the call returned (``SUCCEEDED``)."""
    error: str = ""
    """``Type: message`` of the last failure."""
    started_at: float = 0.0
    """When the first attempt started, in seconds since the epoch."""
    updated_at: float = 0.0
    """When this entry was last written."""
    retry_at: float | None = None
    """When the next attempt is due (``RETRYING``)."""

    def as_json(self) -> dict[str, JSON]:
        """The record as a JSON object: what the journal stores, and what ``flowy show
        --json`` prints."""
        return {
            "key": self.key,
            "status": self.status.value,
            "name": self.name,
            "attempts": self.attempts,
            "result": self.result,
            "error": self.error,
            "started_at": self.started_at,
            "updated_at": self.updated_at,
            "retry_at": self.retry_at,
        }


def _loads(data: bytes, what: str) -> dict[str, object]:
    try:
        document = loads_bounded(
            bytes(data), max_bytes=_READ_BYTES, max_depth=_READ_DEPTH, what=what
        )
    except ValueError as exc:
        raise SnapshotEnvelopeInvalidError(f"invalid stored {what}: {exc}") from None
    if not isinstance(document, dict):
        raise SnapshotEnvelopeInvalidError(f"invalid stored {what}: not a JSON object")
    return document  # pyright: ignore[reportUnknownVariableType]


def _time(document: dict[str, object], name: str, what: str) -> float:
    value = document.get(name)
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 <= value <= MAX_TIMESTAMP
    ):
        raise SnapshotEnvelopeInvalidError(
            f"invalid stored {what}: field {name!r} is not a time between 0 and "
            f"{MAX_TIMESTAMP:.0f} ({value!r:.80})"
        )
    return float(value)


def _get(
    document: dict[str, object], name: str, kind: type | tuple[type, ...], what: str
) -> object:
    value = document.get(name)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind in (int, (int, float))):
        raise SnapshotEnvelopeInvalidError(
            f"invalid stored {what}: field {name!r} is missing or has the wrong type "
            f"({value!r:.80})"
        )
    return value


def encode_signal(signal: Signal, max_bytes: int = MAX_VALUE_BYTES) -> bytes:
    """The bytes a store keeps for ``signal`` (its thread and seq are the store's keys).

    Raises ``TypeError`` if the payload is not JSON, :class:`flowy.errors.LimitError`
    if it is nested more than ``MAX_DEPTH`` levels, holds NaN, an infinity or an
    integer too long to read back, if ``sent_at`` is out of range, or if the encoded
    signal is over ``max_bytes``.
    """
    what = f"the payload of signal {signal.name!r:.80}"
    check_time("the signal's sent_at", signal.sent_at)
    check_depth(what, signal.payload)
    return dump_json(
        what,
        {
            "name": signal.name,
            "signal_id": signal.signal_id,
            "payload": signal.payload,
            "sent_at": signal.sent_at,
        },
        max_bytes,
    )


def decode_signal(thread_id: str, seq: int, data: bytes) -> Signal:
    """The signal stored as ``data`` at ``seq`` of ``thread_id``'s inbox;
    ``SnapshotEnvelopeInvalidError`` if the bytes are not one."""
    doc = _loads(data, "signal")
    return Signal(
        thread_id=thread_id,
        name=str(_get(doc, "name", str, "signal")),
        payload=doc.get("payload"),  # pyright: ignore[reportArgumentType]
        signal_id=str(_get(doc, "signal_id", str, "signal")),
        seq=seq,
        sent_at=_time(doc, "sent_at", "signal"),
    )


def encode_activity(record: ActivityRecord, max_bytes: int = MAX_VALUE_BYTES) -> bytes:
    """The bytes a store keeps for ``record`` under its thread and key.

    Raises ``TypeError`` if the result is not JSON, :class:`flowy.errors.LimitError`
    if it is nested more than ``MAX_DEPTH`` levels, holds NaN, an infinity or an
    integer too long to read back, if a time is out of range, or if the encoded record
    is over ``max_bytes``.
    """
    what = f"the result of activity {record.key!r:.80}"
    check_time("the activity's started_at", record.started_at)
    check_time("the activity's updated_at", record.updated_at)
    if record.retry_at is not None:
        check_time("the activity's retry_at", record.retry_at)
    check_depth(what, record.result)
    return dump_json(what, record.as_json(), max_bytes)


def decode_activity(data: bytes, *, key: str | None = None) -> ActivityRecord:
    """The activity record stored as ``data`` (checked against ``key`` if given);
    ``SnapshotEnvelopeInvalidError`` if the bytes are not one."""
    doc = _loads(data, "activity record")
    what = "activity record"
    stored_key = str(_get(doc, "key", str, what))
    if key is not None and stored_key != key:
        raise SnapshotEnvelopeInvalidError(
            f"invalid stored activity record: stored under key {key!r:.80} but names "
            f"{stored_key!r:.80}"
        )
    try:
        status = ActivityStatus(str(_get(doc, "status", str, what)))
    except ValueError as exc:
        raise SnapshotEnvelopeInvalidError(f"invalid stored activity record: {exc}") from None
    retry_at = None if doc.get("retry_at") is None else _time(doc, "retry_at", what)
    return ActivityRecord(
        key=stored_key,
        status=status,
        name=str(_get(doc, "name", str, what)),
        attempts=int(_get(doc, "attempts", int, what)),  # pyright: ignore[reportArgumentType]
        result=doc.get("result"),  # pyright: ignore[reportArgumentType]
        error=str(_get(doc, "error", str, what)),
        started_at=_time(doc, "started_at", what),
        updated_at=_time(doc, "updated_at", what),
        retry_at=retry_at,
    )
