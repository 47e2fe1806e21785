"""``flowy.testing.faults.FaultyBackend``: faults at the primitives every store shares."""

from __future__ import annotations

import inspect
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import flowy
from flowy.errors import StorageUnavailableError, ThreadNotFoundError
from flowy.memory import MemoryBackend
from flowy.storage import Backend, HandoffStatus, RunStatus
from flowy.storage.dialect import BaseCheckpointer
from flowy.testing.faults import (
    PRIMITIVES,
    Fault,
    FaultKind,
    FaultPlan,
    FaultyBackend,
    Operation,
    Phase,
    RandomFaults,
    SimulatedCrash,
)
from flowy.testing.suite._support import (  # pyright: ignore[reportPrivateUsage]
    make_intent,
    make_snapshot,
)

pytestmark = pytest.mark.anyio

# Methods of the bases that are ``_``-prefixed and async but are not primitives: they
# call primitives (``_commit``, ``_accept``, ``_start_listening``) or only wait
# (``_wait``, ``_wait_for_news``).
_NOT_PRIMITIVES = {"_commit", "_accept", "_wait", "_start_listening", "_wait_for_news"}


def test_every_primitive_of_the_bases_is_intercepted() -> None:
    for base, primitives in PRIMITIVES.items():
        found = {
            name
            for name, member in vars(base).items()
            if name.startswith("_")
            and not name.startswith("__")
            and inspect.iscoroutinefunction(member)
        }
        assert found - _NOT_PRIMITIVES == set(primitives), base.__name__


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend[Any]]:
    if request.param == "memory":
        backend: Backend[Any] = MemoryBackend()
    else:
        backend = await flowy.connect(f"sqlite:///{tmp_path / 'faults.db'}")
    async with backend:
        yield backend


async def _head(store: Backend[Any], thread_id: str) -> int:
    try:
        return (await store.checkpointer.load(thread_id))[1]
    except ThreadNotFoundError:
        return 0


async def test_unavailable_refuses_and_unknown_lands_then_raises(store: Backend[Any]) -> None:
    faulty = FaultyBackend(store)
    faulty.arm(Phase.SAVE_STEP)
    with pytest.raises(StorageUnavailableError, match="store is unavailable"):
        await faulty.checkpointer.save(0, make_snapshot("t"))
    assert await _head(store, "t") == 0  # nothing written
    faulty.arm(Phase.SAVE_STEP, FaultKind.UNKNOWN, error=lambda: ConnectionError("gone"))
    with pytest.raises(ConnectionError, match="gone"):
        await faulty.checkpointer.save(0, make_snapshot("t"))
    assert await _head(store, "t") == 1  # written, and the caller was told it failed
    assert await faulty.checkpointer.save(1, make_snapshot("t")) == 2  # disarmed
    assert [(f.phase, f.kind) for f in faulty.struck] == [
        (Phase.SAVE_STEP, FaultKind.UNAVAILABLE),
        (Phase.SAVE_STEP, FaultKind.UNKNOWN),
    ]


async def test_a_crash_kills_the_process_before_or_after_the_write(store: Backend[Any]) -> None:
    before = FaultyBackend(store)
    before.arm(Phase.SAVE_STEP, FaultKind.CRASH_BEFORE)
    with pytest.raises(SimulatedCrash):
        await before.checkpointer.save(0, make_snapshot("t"))
    assert before.dead and await _head(store, "t") == 0
    with pytest.raises(SimulatedCrash):  # a dead process reads nothing either
        await before.checkpointer.load("t")
    after = FaultyBackend(store)
    after.arm(Phase.ACQUIRE, FaultKind.CRASH_AFTER)
    with pytest.raises(SimulatedCrash):
        await after.leases.acquire("t", "me", 30)
    holder = await store.leases.holder("t")
    assert holder is not None and holder.owner == "me"  # it landed before the crash


async def test_phases_are_read_from_what_a_write_writes(store: Backend[Any]) -> None:
    seen: list[Phase] = []

    class Spy(FaultPlan):
        async def decide(self, operation: Operation) -> Fault | None:
            seen.append(operation.phase)
            return None

    faulty = FaultyBackend(store, Spy())
    pending = make_snapshot(
        "t",
        status=RunStatus.HANDOFF,
        handoff_status=HandoffStatus.PENDING,
        handoff_pending_at=1.0,
    )
    await faulty.checkpointer.save(0, pending)
    intent = make_intent("t", 2, pending_revision=1)

    async def enqueue(tx: object, revision: int) -> None:
        await faulty.faulty_outbox.enqueue_intent_tx(tx, intent)

    await faulty.checkpointer.save_with_outbox(1, make_snapshot("t"), enqueue)
    await faulty.checkpointer.load("t")
    assert seen == [Phase.SAVE_PENDING, Phase.COMMIT, Phase.LOAD]


async def test_a_lost_ack_leaves_the_message_to_come_back(store: Backend[Any]) -> None:
    faulty = FaultyBackend(store)
    await faulty.outbox.enqueue_intent(make_intent("t", 1))
    [message] = await faulty.consumer.claim(1, 0.05)
    faulty.arm(Phase.ACK, FaultKind.REDELIVER)
    await faulty.consumer.ack(message)
    again = await faulty.consumer.claim(1, 0.05, wait=2.0)
    assert [m.message_id for m in again] == [message.message_id]


async def test_the_copies_share_a_domain_of_their_own_and_leave_the_store_alone(
    store: Backend[Any],
) -> None:
    faulty = FaultyBackend(store, domain=("process", 1))
    checkpointer = faulty.checkpointer
    assert isinstance(checkpointer, BaseCheckpointer)
    assert checkpointer.domain == ("process", 1) and checkpointer.fences(faulty.leases)
    assert not checkpointer.fences(store.leases)
    faulty.arm(Phase.LOAD, times=5)
    with pytest.raises(ThreadNotFoundError):
        await store.checkpointer.load("t")  # the store itself is not wrapped
    assert faulty.struck == []


async def test_three_phase_hides_the_transactional_outbox(store: Backend[Any]) -> None:
    faulty = FaultyBackend(store, three_phase=True)
    assert not hasattr(faulty.outbox, "enqueue_intent_tx")
    await faulty.outbox.enqueue_intent(make_intent("t", 1))
    assert len(await store.consumer.claim(5, 30)) == 1


async def test_random_faults_strike_only_their_phases() -> None:
    plan = RandomFaults(random.Random(1), 1.0, {Phase.SAVE_TERMINAL: (FaultKind.UNKNOWN,)})
    store: MemoryBackend[Any] = MemoryBackend()
    faulty = FaultyBackend(store, plan)
    assert await faulty.checkpointer.save(0, make_snapshot("t")) == 1  # a step: untouched
    with pytest.raises(StorageUnavailableError, match="outcome is unknown"):
        await faulty.checkpointer.save(1, make_snapshot("t", status=RunStatus.COMPLETED))
    assert await _head(store, "t") == 2
    assert [(f.phase, f.kind) for f in plan.struck] == [(Phase.SAVE_TERMINAL, FaultKind.UNKNOWN)]


def test_a_store_not_built_on_the_bases_is_refused() -> None:
    store: Any = type("Loose", (), {"url": "x://", "checkpointer": object()})()
    with pytest.raises(TypeError, match="is not a BaseCheckpointer"):
        FaultyBackend(store)
