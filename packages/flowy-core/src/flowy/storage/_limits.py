"""The limits of what flowy stores, in one place.

Every value a store keeps (a state, a signal's payload, an activity's result, effects,
run metadata, a timer's time) is checked against them when it is written, and the same
ceilings are applied when it is read back: so whatever was accepted can be read again,
on every store. Fixed ceilings are module constants; what an application may tune is a
:class:`Limits`, given to ``flowy.connect(url, limits=...)``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import cast

from .._errors import LimitError

__all__ = [
    "MAX_DEPTH",
    "MAX_TIMESTAMP",
    "MAX_VALUE_BYTES",
    "STRICT_JSON",
    "Limits",
    "check_depth",
    "check_time",
    "dump_json",
    "value_depth",
]

MAX_DEPTH = 100
"""The deepest nesting of lists and objects a stored value may have (``[[1]]`` is 2
deep; a scalar 0). Checked at write, and the same ceiling (plus the stored document's
own levels) at read."""

MAX_TIMESTAMP = 253402300799.0
"""The latest time stored (9999-12-31 23:59:59 UTC, in seconds since the epoch); the
earliest is 0. Any wake-up, retry or save time outside is refused."""

MAX_VALUE_BYTES = 16 * 1024 * 1024
"""The largest signal or activity record read back, and so the most a :class:`Limits`
size may allow."""

STRICT_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
"""Compact JSON that refuses NaN and infinities (which ``json`` would write as
non-standard text): what is stored must load back as it was given."""

_DAY = 86400.0


@dataclass(frozen=True, slots=True)
class Limits:
    """The limits an application may tune, checked by the store's bases at write.

    Past a limit the write raises :class:`flowy.errors.LimitError` naming the field,
    and nothing is stored.

    Attributes:
        max_sleep: the longest ``sleep``, ``sleep_until`` or ``wait_for`` timeout, in
            seconds from when the wait is saved (default 366 days). A longer one fails
            the run.
        max_pending_signals: the most signals a thread's inbox holds past the newest
            one the thread has taken (default 1000). Another one is refused.
        max_signal_bytes: the largest encoded signal, its payload included (default
            256 KiB).
        max_activity_bytes: the largest encoded activity journal entry, its result
            included (default 256 KiB).
    """

    max_sleep: float = 366 * _DAY
    max_pending_signals: int = 1000
    max_signal_bytes: int = 256 * 1024
    max_activity_bytes: int = 256 * 1024

    def __post_init__(self) -> None:
        sleep = self.max_sleep
        if isinstance(sleep, bool) or not isinstance(sleep, int | float):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"Limits(max_sleep=...) must be seconds, got {sleep!r:.80}")
        if not 0 < sleep <= MAX_TIMESTAMP:
            raise ValueError(
                f"Limits(max_sleep=...) must be > 0 and at most {MAX_TIMESTAMP:.0f} seconds, "
                f"got {sleep!r}"
            )
        for name, ceiling in (
            ("max_pending_signals", 2**53),
            ("max_signal_bytes", MAX_VALUE_BYTES),
            ("max_activity_bytes", MAX_VALUE_BYTES),
        ):
            value: object = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"Limits({name}=...) must be an int, got {value!r:.80}")
            if not 0 < value <= ceiling:
                raise ValueError(f"Limits({name}=...) must be in 1..{ceiling}, got {value!r}")


def value_depth(value: object, limit: int = MAX_DEPTH) -> int:
    """How deeply lists and objects nest in the JSON value ``value`` (a scalar is 0),
    counted up to ``limit + 1`` at most; iterative, so any depth is safe to measure."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children = cast(dict[object, object], item).values()
        elif isinstance(item, list | tuple):
            children = cast(list[object], item)
        else:
            continue
        level += 1
        if level > deepest:
            deepest = level
            if deepest > limit:
                return deepest
        stack.extend((child, level) for child in children)
    return deepest


def check_depth(field: str, value: object) -> None:
    """Raise :class:`LimitError` if ``field``'s ``value`` nests more than
    ``MAX_DEPTH`` levels deep."""
    if value_depth(value) > MAX_DEPTH:
        raise LimitError(
            f"{field} is nested more than {MAX_DEPTH} levels deep; flowy stores at most "
            f"{MAX_DEPTH} (flatten it, or keep the deep part outside and send a reference)"
        )


def check_time(field: str, value: object) -> float:
    """``value`` as seconds since the epoch: ``TypeError`` if it is not a number,
    :class:`LimitError` unless it is finite and within 0 .. ``MAX_TIMESTAMP``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{field} must be seconds since the epoch, got {type(value).__name__}")
    if not 0 <= value <= MAX_TIMESTAMP:  # NaN fails both comparisons
        raise LimitError(
            f"{field} is {value!r}; a stored time must be seconds since the epoch between 0 "
            f"and {MAX_TIMESTAMP:.0f} (9999-12-31)"
        )
    return float(value)


def dump_json(field: str, value: object, max_bytes: int | None = None) -> bytes:
    """``value`` as compact UTF-8 JSON that loads back as it was: ``TypeError`` if it is
    not JSON, :class:`LimitError` for NaN, infinities, integers too long to read back,
    or more than ``max_bytes``. Check the depth of what ``value`` carries first, with
    :func:`check_depth`: the envelope around it adds its own levels."""
    try:
        data = STRICT_JSON.encode(value).encode("utf-8")
    except ValueError as exc:  # NaN / inf, an int past the digit limit, a lone surrogate
        raise LimitError(f"{field} cannot be stored as JSON: {exc}") from None
    except (TypeError, RecursionError) as exc:
        raise TypeError(f"{field} is not JSON-encodable: {exc}") from exc
    if max_bytes is not None and len(data) > max_bytes:
        raise LimitError(
            f"{field} is {len(data)} bytes encoded; the limit is {max_bytes} bytes "
            "(keep large data outside and send a reference)"
        )
    return data
