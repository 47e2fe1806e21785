"""Shared pieces of the suite modules: the base class with its timing knobs, builders of
thread ids, snapshots and intents, capability checks that skip with a reason, and the
peer helper. Nothing here is a test.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from ..._errors import ThreadNotFoundError
from ...storage import (
    Backend,
    Checkpointer,
    HandoffIntent,
    HandoffStatus,
    LeaseManager,
    Outbox,
    OutboxConsumer,
    ResumeToken,
    RunStatus,
    Snapshot,
    TransactionalCheckpointer,
    TransactionalOutbox,
    connect,
)
from ...storage._model import DEFAULT_ROUTE, Route
from ...storage.dialect import FencingCheckpointer, new_write_id
from ..backends import require_backends
from ..hooks import Corrupt

__all__ = [
    "Corrupt",
    "Suite",
    "Transactional",
    "fixed_time",
    "history_revisions",
    "make_intent",
    "make_snapshot",
    "max_attempts_of",
    "new_thread_id",
    "peer_of",
    "missing_capabilities",
    "require_capability",
    "require_consumer",
    "require_corrupt",
    "require_fencing",
    "require_leases",
    "require_transactional",
    "saved_chain",
    "skip_unless_capable",
    "try_load",
]

fixed_time = 1_700_000_000.25
"""A timestamp every backend stores exactly (a whole number of microseconds)."""


class Suite:
    """Base of every suite class.

    ``__test__ = True`` makes pytest collect the subclasses whatever their names and the
    project's ``python_classes`` setting. The timing knobs are class attributes: an
    adapter whose store has a coarse clock subclasses a suite class and raises them.
    """

    __test__ = True
    pytestmark: ClassVar[list[pytest.MarkDecorator]] = [pytest.mark.anyio]

    short_ttl: float = 0.3
    """Seconds: the lease ttl and visibility timeout of tests that wait for an expiry."""

    settle: float = 0.3
    """Seconds waited past ``short_ttl`` before expecting the expiry to have happened."""

    long_ttl: float = 30.0
    """Seconds: a lease ttl or visibility timeout that must not run out during a test."""

    clock_skew: float = 2.0
    """Seconds the store's clock may differ from this process's clock."""

    requires: ClassVar[tuple[str, ...]] = ()
    """The capabilities this class tests (names of ``flowy.storage.Capabilities``
    fields): on a store that lacks one, every test of the class is skipped, with the
    reason. A store that claims a capability runs the class, and fails it if the claim
    is false."""

    async def expire(self) -> None:
        """Sleep until something given ``short_ttl`` has certainly expired."""
        await asyncio.sleep(self.short_ttl + self.settle)

    @pytest.fixture(autouse=True)
    def _flowy_capabilities(self, flowy_backend: Backend[Any]) -> None:
        """Skip the test, with the reason, when the store lacks a capability of
        ``requires``."""
        skip_unless_capable(type(self), flowy_backend)


def missing_capabilities(suite: type[Suite], backend: Backend[Any]) -> list[str]:
    """The capabilities ``suite`` requires that ``backend`` does not have."""
    have = backend.capabilities
    return [name for name in suite.requires if not getattr(have, name)]


def skip_unless_capable(suite: type[Suite], backend: Backend[Any]) -> None:
    """Skip (``pytest.skip``) with the reason when ``backend`` lacks a capability that
    ``suite`` requires."""
    missing = missing_capabilities(suite, backend)
    if missing:
        pytest.skip(
            f"{suite.__name__} tests {', '.join(missing)}, which "
            f"{type(backend).__name__} does not have (Backend.capabilities: its store "
            "does not implement the primitives)"
        )


def require_capability(backend: Backend[Any], name: str) -> None:
    """Skip the test, with the reason, when ``backend`` lacks the capability ``name``
    (for a test of a class that tests more than that capability)."""
    if not getattr(backend.capabilities, name):
        pytest.skip(
            f"this test needs {name}, which {type(backend).__name__} does not have "
            "(Backend.capabilities: its store does not implement the primitives)"
        )


def new_thread_id(label: str = "t") -> str:
    """A thread id no other test uses (the label makes failures readable)."""
    return f"suite-{label}-{uuid.uuid4().hex[:12]}"


def make_snapshot(
    thread_id: str,
    state: Any = None,
    *,
    pointer: str = "start",
    status: RunStatus = RunStatus.RUNNING,
    reason: str = "",
    handoff_status: HandoffStatus = HandoffStatus.NONE,
    handoff_pending_at: float | None = None,
    updated_at: float = fixed_time,
    revision: int = 0,
) -> Snapshot[Any]:
    """A snapshot with a fresh ``write_id`` (so each save is distinguishable)."""
    return Snapshot(
        thread_id=thread_id,
        state={"n": 0} if state is None else state,
        execution_pointer=pointer,
        status=status,
        reason=reason,
        revision=revision,
        handoff_status=handoff_status,
        handoff_pending_at=handoff_pending_at,
        updated_at=updated_at,
        write_id=new_write_id(),
    )


async def saved_chain(cp: Checkpointer[Any], thread_id: str, count: int) -> list[Snapshot[Any]]:
    """Save revisions 1..``count`` of a new thread (state ``{"n": revision}``); return
    the saved snapshots, each stamped with its revision, oldest first."""
    saved: list[Snapshot[Any]] = []
    for revision in range(1, count + 1):
        snap = make_snapshot(thread_id, {"n": revision}, pointer=f"node-{revision}")
        got = await cp.save(revision - 1, snap)
        assert got == revision, f"save at expected {revision - 1} returned {got}"
        saved.append(snap.at_revision(revision))
    return saved


async def history_revisions(cp: Checkpointer[Any], thread_id: str, limit: int = 1000) -> list[int]:
    """The revisions ``get_history`` reports, in its order."""
    return [s.revision for s in await cp.get_history(thread_id, limit)]


async def try_load(cp: Checkpointer[Any], thread_id: str) -> tuple[Snapshot[Any], int] | None:
    """``load`` or ``None`` when the thread does not exist."""
    try:
        return await cp.load(thread_id)
    except ThreadNotFoundError:
        return None


def make_intent(
    thread_id: str,
    revision: int,
    *,
    pending_revision: int | None = None,
    reason: str = "handoff_requested",
    pointer: str = "worker",
    route: Route = DEFAULT_ROUTE,
) -> HandoffIntent:
    """An intent with every field set (``created_at`` fixed so a round trip is exact)."""
    return HandoffIntent(
        thread_id=thread_id,
        pending_snapshot_revision=revision if pending_revision is None else pending_revision,
        committed_snapshot_revision=revision,
        snapshot_revision=revision,
        resume_token=ResumeToken(thread_id, revision),
        handoff_status=HandoffStatus.ENQUEUED,
        reason=reason,
        execution_pointer=pointer,
        created_at=fixed_time,
        route=route,
    )


def require_leases(backend: Backend[Any]) -> LeaseManager:
    """The store's lease manager (skipped, with the reason, on a store without one)."""
    require_capability(backend, "run_leases")
    return backend.leases


def require_fencing(backend: Backend[Any]) -> tuple[FencingCheckpointer[Any], LeaseManager]:
    """The store's checkpointer as a native fencing one with its lease manager; every
    store must fence its own leases."""
    leases = backend.leases
    cp = backend.checkpointer
    if not isinstance(cp, FencingCheckpointer) or not cp.fences(leases):
        pytest.fail(
            f"{type(cp).__name__} must fence the leases of its own store: "
            "checkpointer.fences(backend.leases) must be True (same domain)"
        )
    return cp, leases


def require_consumer(backend: Backend[Any]) -> tuple[Outbox, OutboxConsumer]:
    """The store's outbox and consumer (skipped, with the reason, on a store without
    them)."""
    require_capability(backend, "handoff_outbox")
    require_capability(backend, "consumer")
    return backend.outbox, backend.consumer


@dataclass(frozen=True)
class Transactional:
    """The pieces of the transactional hand-off path of one store."""

    checkpointer: TransactionalCheckpointer[Any]
    outbox: TransactionalOutbox
    consumer: OutboxConsumer


def require_transactional(backend: Backend[Any]) -> Transactional:
    """The store's transactional checkpointer and outbox (skipped, with the reason, on a
    store whose hand-offs are not one write; every store built on the bases has them)."""
    require_capability(backend, "transactional_outbox")
    cp = backend.checkpointer
    outbox = backend.outbox
    if not isinstance(cp, TransactionalCheckpointer) or not isinstance(outbox, TransactionalOutbox):
        pytest.fail(
            f"{type(cp).__name__} / {type(outbox).__name__} must implement the "
            "transactional outbox (save_with_outbox / enqueue_intent_tx)"
        )
    return Transactional(cp, outbox, backend.consumer)


def require_corrupt(corrupt: Corrupt | None, backend: Backend[Any]) -> Corrupt:
    """The ``flowy_corrupt`` fixture's hook, or skip (fail under
    ``FLOWY_REQUIRE_BACKENDS=1``: every store's tests provide one)."""
    if corrupt is None:
        reason = (
            f"no flowy_corrupt fixture for {type(backend).__name__}: define one that flips a "
            "byte of a thread's stored head record"
        )
        if require_backends():
            pytest.fail(reason)
        pytest.skip(reason)
    return corrupt


def max_attempts_of(consumer: OutboxConsumer) -> int:
    """The consumer's ``max_attempts``; the suite requires consumers to expose it."""
    value = getattr(consumer, "max_attempts", None)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        pytest.fail(
            f"the suite needs the consumer {type(consumer).__name__} to expose "
            f"`max_attempts: int` (>= 1), the number of deliveries before a message is "
            f"dead-lettered; got {value!r}"
        )
    return value


@asynccontextmanager
async def peer_of(backend: Backend[Any]) -> AsyncGenerator[Backend[Any]]:
    """A second backend over the same store, with its own connections (a stand-in for
    a second process), opened from ``backend.url`` and closed on exit."""
    async with connect(backend.url) as peer:
        yield peer
