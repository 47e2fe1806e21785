"""Fixtures of the core tests: the in-memory backends as a conformance-suite bundle.

The suite's plugin (``flowy.testing.plugin``) is loaded for every test by the root
pytest configuration (``-p flowy.testing.plugin``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from flowy import MemoryCheckpointer, MemoryLeaseManager, MemoryOutbox
from flowy.testing import BackendBundle


def memory_bundle(*, max_attempts: int = 3) -> BackendBundle:
    """A fresh set of memory backends: a fencing checkpointer over its lease manager, and
    one outbox that is also the consumer."""
    leases = MemoryLeaseManager()
    checkpointer = MemoryCheckpointer[Any](leases=leases)
    outbox = MemoryOutbox(max_attempts=max_attempts)

    async def corrupt(thread_id: str) -> None:
        checkpointer.corrupt(thread_id)

    return BackendBundle(
        checkpointer=checkpointer,
        leases=leases,
        outbox=outbox,
        consumer=outbox,
        corrupt=corrupt,
        name="memory",
    )


@pytest.fixture
async def flowy_backend() -> AsyncIterator[BackendBundle]:
    """The conformance suite's backend: in-memory, fresh for every test.

    Peers share the same memory objects (memory backends live in one process); the
    fixture checks that the suite closed every peer it opened.
    """
    bundle = memory_bundle()
    opened: list[BackendBundle] = []
    closed: list[BackendBundle] = []

    async def open_peer() -> BackendBundle:
        peer = BackendBundle(
            checkpointer=bundle.checkpointer,
            leases=bundle.leases,
            outbox=bundle.outbox,
            consumer=bundle.consumer,
            corrupt=bundle.corrupt,
            name="memory-peer",
        )

        async def close() -> None:
            closed.append(peer)

        peer.close = close
        opened.append(peer)
        return peer

    bundle.open_peer = open_peer
    yield bundle
    assert len(closed) == len(opened), f"{len(opened) - len(closed)} peer(s) left open"
