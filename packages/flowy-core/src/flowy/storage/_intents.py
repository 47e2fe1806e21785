"""The outbox wire format of hand-off intents, shared by every store.

Decoding is defensive: stored payloads are bytes from outside this process, so any
malformed, oversized or deeply nested payload raises ``ValueError`` (never
``RecursionError`` or a half-built intent), and a consumer dead-letters it.
"""

from __future__ import annotations

import json
import time
from typing import Any, cast

from .._types import ResumeToken
from ._limits import value_depth
from ._model import DEFAULT_QUEUE, DEFAULT_ROUTE, HandoffIntent, HandoffStatus, Route

__all__ = [
    "MAX_INTENT_BYTES",
    "decode_intent",
    "encode_intent",
    "json_depth",
    "loads_bounded",
    "route_json",
    "route_of",
]

MAX_INTENT_BYTES = 64 * 1024
"""The largest intent payload decoded (an intent is a few hundred bytes; a thread id at
most 16 KiB)."""

_MAX_DEPTH = 32


_STRUCTURE = bytes(range(256)).translate(None, b'[]{}"\\')


def json_depth(data: bytes, limit: int) -> int:
    """The nesting depth of JSON text ``data``, counted up to ``limit + 1`` at most.

    Cheap for the common case: text with no more than ``limit`` brackets cannot be
    nested deeper, and is not scanned; otherwise only brackets, quotes and backslashes
    are looked at (strings skipped).
    """
    if data.count(b"[") + data.count(b"{") <= limit:
        return 0
    depth = deepest = 0
    in_string = escaped = False
    for char in data.translate(None, _STRUCTURE):
        if in_string:
            if escaped:
                escaped = False
            elif char == 0x5C:  # backslash
                escaped = True
            elif char == 0x22:  # quote
                in_string = False
        elif char == 0x22:
            in_string = True
        elif char in (0x5B, 0x7B):
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    return deepest
        elif char in (0x5D, 0x7D):
            depth -= 1
    return deepest


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number")


def loads_bounded(data: bytes | str, *, max_bytes: int, max_depth: int, what: str) -> Any:
    """``json.loads`` for untrusted bytes: size and nesting bounded (``max_depth`` levels
    of lists and objects), ``NaN`` and ``Infinity`` refused, every failure a
    ``ValueError`` naming ``what``."""
    if len(data) > max_bytes:
        raise ValueError(f"{what} is {len(data)} bytes; at most {max_bytes} are read")
    try:
        value = json.loads(data, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError(f"{what} is nested too deeply") from None
    except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError, int digit limit
        raise ValueError(f"{what} is not valid JSON: {exc}") from None
    # Nesting needs an opening bracket per level: with few of them (any header flowy
    # writes), the walk over the value is skipped.
    if isinstance(data, bytes):
        brackets = data.count(b"[") + data.count(b"{")
    else:
        brackets = data.count("[") + data.count("{")
    if brackets > max_depth and value_depth(value, max_depth) > max_depth:
        raise ValueError(f"{what} is nested more than {max_depth} levels deep")
    return value


def encode_intent(intent: HandoffIntent) -> bytes:
    """Encode ``intent`` as JSON bytes (the outbox wire format of every store)."""
    body: dict[str, object] = {
        "v": 1,
        "thread_id": intent.thread_id,
        "pending": intent.pending_snapshot_revision,
        "committed": intent.committed_snapshot_revision,
        "revision": intent.snapshot_revision,
        "token_revision": intent.resume_token.snapshot_revision,
        "handoff_status": intent.handoff_status.value,
        "reason": intent.reason,
        "pointer": intent.execution_pointer,
        "created_at": intent.created_at or time.time(),
    }
    if intent.trace:
        body["trace"] = dict(intent.trace)
    route = intent.route
    if route is not DEFAULT_ROUTE and route != DEFAULT_ROUTE:
        body["route"] = route_json(route)
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _int(raw: dict[str, Any], name: str) -> int:
    value = raw[name]
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"field {name!r} is not a non-negative integer: {value!r:.80}")
    return value


def _str(raw: dict[str, Any], name: str) -> str:
    value = raw[name]
    if not isinstance(value, str):
        raise ValueError(f"field {name!r} is not a string: {value!r:.80}")
    return value


def decode_intent(data: bytes | str) -> HandoffIntent:
    """Decode ``data`` made by :func:`encode_intent`.

    Raises ``ValueError`` for anything else: not JSON, another format version, a
    missing or mistyped field, a payload over ``MAX_INTENT_BYTES`` or nested deeper than
    an intent ever is.
    """
    raw_any = loads_bounded(
        data, max_bytes=MAX_INTENT_BYTES, max_depth=_MAX_DEPTH, what="hand-off intent"
    )
    if not isinstance(raw_any, dict):
        raise ValueError("malformed hand-off intent: not a JSON object")
    raw = cast(dict[str, Any], raw_any)
    if raw.get("v") != 1:
        raise ValueError(f"malformed hand-off intent: unknown format {raw.get('v')!r:.40}")
    try:
        thread_id = _str(raw, "thread_id")
        created_at = raw["created_at"]
        if isinstance(created_at, bool) or not isinstance(created_at, int | float):
            raise ValueError(f"field 'created_at' is not a number: {created_at!r:.80}")
        trace_raw = raw.get("trace", {})
        if not isinstance(trace_raw, dict) or not all(
            isinstance(k, str) and isinstance(v, str)
            for k, v in cast(dict[object, object], trace_raw).items()
        ):
            raise ValueError("field 'trace' is not an object of strings")
        return HandoffIntent(
            thread_id=thread_id,
            pending_snapshot_revision=_int(raw, "pending"),
            committed_snapshot_revision=_int(raw, "committed"),
            snapshot_revision=_int(raw, "revision"),
            resume_token=ResumeToken(thread_id, _int(raw, "token_revision")),
            handoff_status=HandoffStatus(_str(raw, "handoff_status")),
            reason=_str(raw, "reason"),
            execution_pointer=_str(raw, "pointer"),
            created_at=float(created_at),
            trace=cast(dict[str, str], trace_raw),
            route=route_of(raw.get("route")),
        )
    except KeyError as exc:
        raise ValueError(f"malformed hand-off intent: missing field {exc}") from None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"malformed hand-off intent: {exc}") from None


def route_json(route: Route) -> dict[str, object]:
    """The JSON object of ``route``: only the fields that differ from the default."""
    out: dict[str, object] = {}
    if route.queue != DEFAULT_QUEUE:
        out["queue"] = route.queue
    if route.partition_key:
        out["partition_key"] = route.partition_key
    if route.priority:
        out["priority"] = route.priority
    return out


def route_of(raw: object) -> Route:
    """The route :func:`route_json` wrote (``None``: the default route); ``ValueError``
    or ``TypeError`` for anything else."""
    if raw is None:
        return DEFAULT_ROUTE
    if not isinstance(raw, dict):
        raise ValueError(f"field 'route' is not an object: {raw!r:.80}")
    fields = cast(dict[str, Any], raw)
    unknown = set(fields) - {"queue", "partition_key", "priority"}
    if unknown:
        raise ValueError(f"field 'route' has unknown fields {sorted(unknown)!r:.80}")
    return Route(
        fields.get("queue", DEFAULT_QUEUE),
        fields.get("partition_key", ""),
        fields.get("priority", 0),
    )
