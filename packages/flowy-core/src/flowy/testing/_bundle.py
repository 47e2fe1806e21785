"""``BackendBundle``: what an adapter's ``flowy_backend`` fixture yields to the suite."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from .._checkpoint import Checkpointer, HandoffOutbox, LeaseManager, OutboxConsumer

__all__ = ["BackendBundle"]


@dataclass
class BackendBundle:
    """One isolated backend instance (its own table / key prefix) for one test.

    ``checkpointer``, ``leases``, ``outbox`` and ``consumer`` share one coordination
    domain. Optional capabilities: ``corrupt(thread_id)`` damages the stored head record
    (corruption tests skip without it); ``open_peer()`` returns another bundle over the
    same store with its own connections, standing for a second process (write-ownership
    tests use the same bundle twice without it); ``close()`` is awaited by the suite on
    every bundle that ``open_peer`` returned.
    """

    checkpointer: Checkpointer[Any]
    leases: LeaseManager | None = None
    outbox: HandoffOutbox | None = None
    consumer: OutboxConsumer | None = None
    corrupt: Callable[[str], Awaitable[None]] | None = None
    open_peer: Callable[[], Awaitable[BackendBundle]] | None = None
    close: Callable[[], Awaitable[None]] | None = None
    name: str = "backend"
