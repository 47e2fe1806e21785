"""Argument checks every store shares, so the same bad input gives the same error
everywhere: ``TypeError`` for a wrong type, ``ValueError`` for a wrong value."""

from __future__ import annotations

import math

from ._model import SYSTEM_LEASE_PREFIX, Lease, validate_thread_id

__all__ = [
    "MAX_LEASE_TTL",
    "MAX_OWNER_CHARS",
    "check_count",
    "check_lease",
    "check_owner",
    "check_revision",
    "check_seconds",
    "check_system_name",
]

MAX_OWNER_CHARS = 1024
"""The longest lease owner name accepted."""

MAX_LEASE_TTL = 366 * 24 * 3600.0
"""The longest lease ttl (and visibility timeout, and delay) accepted, in seconds."""


def check_revision(value: object, name: str = "expected_revision") -> int:
    """An ``int`` revision >= 0 (``bool`` is not a revision)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r:.80}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return value


def check_count(value: object, name: str) -> int:
    """An ``int`` count >= 0 (a limit, a retain count)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r:.80}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return value


def check_seconds(value: object, name: str, *, allow_zero: bool = False) -> float:
    """A finite number of seconds, > 0 (or >= 0 with ``allow_zero``), at most a year."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__}")
    seconds = float(value)
    if math.isnan(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be {bound} seconds, got {value!r}")
    if seconds > MAX_LEASE_TTL:
        raise ValueError(f"{name} must be at most {MAX_LEASE_TTL:.0f} seconds, got {value!r}")
    return seconds


def check_owner(owner: object) -> str:
    """A lease owner: a non-empty ``str`` without NUL, at most ``MAX_OWNER_CHARS``."""
    if not isinstance(owner, str):
        raise TypeError(f"lease owner must be a str, got {type(owner).__name__}")
    if not owner or "\x00" in owner or len(owner) > MAX_OWNER_CHARS:
        raise ValueError(
            f"lease owner must be a non-empty str of at most {MAX_OWNER_CHARS} characters "
            f"without NUL, got {owner!r:.80}"
        )
    return owner


def check_system_name(name: object) -> str:
    """The key of a system lease named ``name`` (a valid thread id, prefixed)."""
    return SYSTEM_LEASE_PREFIX + validate_thread_id(name)


def check_lease(lease: object, *, thread_id: str | None = None) -> Lease:
    """A ``Lease`` (of a thread, or a system lease) whose fields have the right types.

    ``thread_id`` is a thread id the caller has already validated: a lease of that
    thread is not validated again."""
    if not isinstance(lease, Lease):
        raise TypeError(f"expected a flowy.storage.Lease, got {type(lease).__name__}")
    key = lease.thread_id
    if thread_id is None or key != thread_id:
        if isinstance(key, str) and key.startswith(SYSTEM_LEASE_PREFIX):  # pyright: ignore[reportUnnecessaryIsInstance]
            validate_thread_id(key[len(SYSTEM_LEASE_PREFIX) :])
        else:
            validate_thread_id(key)
    check_owner(lease.owner)
    token = lease.fencing_token
    if isinstance(token, bool) or not isinstance(token, int):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise TypeError(f"lease fencing_token must be an int, got {token!r:.80}")
    return lease
