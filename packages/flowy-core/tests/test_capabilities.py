"""One store model: ``Backend.capabilities`` derived from the primitives a store
implements, loose components wrapped once by ``flowy.storage.as_backend`` (with a
``DeprecationWarning`` when a runner is given them), and the engine's paths chosen from
the capabilities when a runner is built (``storage/_capabilities.py``, ``_derive.py``,
``_adapt.py``)."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any

import pytest
from core_graphs import State, approval_graph, handoff_graph

import flowy
from flowy import storage
from flowy.memory import (
    MemoryBackend,
    MemoryCheckpointer,
    MemoryConsumer,
    MemoryLeaseManager,
    MemoryOutbox,
    MemoryStore,
)
from flowy.storage import Capabilities, as_backend
from flowy.storage.dialect import BaseCheckpointer, BaseConsumer
from flowy.testing.faults import FaultyCheckpointer, FaultyOutbox

pytestmark = pytest.mark.anyio

EVERYTHING = Capabilities(
    run_leases=True,
    fencing=True,
    system_leases=True,
    handoff_outbox=True,
    transactional_outbox=True,
    consumer=True,
    durable_timers_signals=True,
    journal=True,
    backlog=True,
    live_progress=True,
    schedules=True,
    queues=True,
    acquire_with_load=True,
    release_on_save=True,
    ack_on_save=True,
    recent_index=True,
)


_BASE: Any = BaseCheckpointer


class TimerlessCheckpointer(MemoryCheckpointer[Any]):
    """A store written for flowy 0.2.0: no timers, signals or journal (the base's
    defaults of those primitives)."""

    _timers = _BASE._timers
    _append_signal = _BASE._append_signal
    _read_signals = _BASE._read_signals
    _put_activity = _BASE._put_activity
    _get_activity = _BASE._get_activity
    _list_activities = _BASE._list_activities
    _write_release = _BASE._write_release
    _write_ack = _BASE._write_ack
    _acquire_head = _BASE._acquire_head
    _recent_heads = _BASE._recent_heads


class StatlessConsumer(MemoryConsumer):
    """A consumer that cannot report its backlog (``_stats`` left to the base)."""

    _stats = BaseConsumer._stats


async def test_the_memory_store_can_do_everything() -> None:
    async with await flowy.connect("memory://") as backend:
        assert backend.capabilities == EVERYTHING
        assert backend.capabilities.missing() == ()


async def test_the_sqlite_store_can_do_everything(tmp_path: Path) -> None:
    async with await flowy.connect(f"sqlite:///{tmp_path / 'caps.db'}") as backend:
        # A file has no channel: progress reaches watchers in the running process only.
        assert backend.capabilities == dataclasses.replace(EVERYTHING, live_progress=False)


async def test_capabilities_are_a_frozen_value() -> None:
    async with await flowy.connect("memory://") as backend:
        with pytest.raises(dataclasses.FrozenInstanceError):
            backend.capabilities.journal = False  # type: ignore[misc]


def test_a_primitive_left_to_the_base_is_a_missing_capability() -> None:
    store = MemoryStore()
    backend: MemoryBackend[Any] = MemoryBackend(store)
    backend.checkpointer = TimerlessCheckpointer(store)
    backend.consumer = StatlessConsumer(store)
    assert backend.capabilities.missing() == (
        "durable_timers_signals",
        "journal",
        "backlog",
        "acquire_with_load",
        "release_on_save",
        "ack_on_save",
        "recent_index",
    )


def test_components_of_two_stores_do_not_fence() -> None:
    backend = as_backend(MemoryCheckpointer[Any](), leases=MemoryLeaseManager(MemoryStore()))
    caps = backend.capabilities
    assert caps.run_leases and not caps.fencing
    assert not caps.release_on_save  # only a save that fences the lease can release it
    assert not caps.ack_on_save
    assert not caps.acquire_with_load
    assert not caps.handoff_outbox and not caps.transactional_outbox and not caps.consumer


def test_loose_components_have_what_they_implement() -> None:
    store = MemoryStore()
    cp: MemoryCheckpointer[Any] = MemoryCheckpointer(store)
    full = as_backend(
        cp,
        leases=MemoryLeaseManager(store),
        outbox=MemoryOutbox(store),
        consumer=MemoryConsumer(store),
    )
    # Loose components have no channel: progress reaches watchers in this process only;
    # and they keep no schedules.
    assert full.capabilities == dataclasses.replace(
        EVERYTHING, live_progress=False, schedules=False, queues=True
    )
    bare = as_backend(cp)
    assert bare.capabilities.missing() == (
        "run_leases",
        "fencing",
        "system_leases",
        "handoff_outbox",
        "transactional_outbox",
        "consumer",
        "backlog",
        "live_progress",
        "schedules",
        "queues",
        "acquire_with_load",
        "release_on_save",
        "ack_on_save",
    )
    with pytest.raises(TypeError, match="without a consumer"):
        _ = bare.consumer
    # A wrapper says whether what it wraps is transactional; it keeps no timers.
    wrapped = as_backend(FaultyCheckpointer(cp), outbox=FaultyOutbox(MemoryOutbox(store)))
    assert wrapped.capabilities.transactional_outbox
    assert not wrapped.capabilities.durable_timers_signals
    assert not wrapped.capabilities.journal
    assert not wrapped.capabilities.recent_index  # recent_threads scans its list_threads


async def test_a_runner_given_a_checkpointer_warns_once_and_still_runs() -> None:
    cp: MemoryCheckpointer[State] = MemoryCheckpointer()
    with pytest.warns(DeprecationWarning, match=r"as_backend") as caught:
        runner = flowy.Runner(approval_graph(), cp)
    assert len(caught) == 1
    assert caught[0].filename == __file__  # it points at the caller's line
    first = await runner.start("t", {})
    assert first.status is flowy.RunStatus.SUSPENDED
    assert first.resume_token is not None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # runs and resumes do not warn again
        then = await runner.resume(first.resume_token, state_overlay={"approved": True})
    # No outbox was given: the hand-off is saved, nothing is enqueued.
    assert then.status is flowy.RunStatus.HANDOFF
    assert then.handoff_status is storage.HandoffStatus.NONE
    head, revision = await cp.load("t")
    assert head.status is flowy.RunStatus.HANDOFF and revision == then.revision


async def test_a_runner_given_loose_leases_and_outbox_warns_and_hands_off() -> None:
    backend = await flowy.connect("memory://")
    with pytest.warns(DeprecationWarning, match=r"lease_manager") as caught:
        runner = flowy.Runner(
            handoff_graph(),
            backend.checkpointer,
            lease_manager=backend.leases,
            handoff_outbox=backend.outbox,
        )
    assert len(caught) == 1
    assert runner.backend is not None and runner.backend.capabilities == dataclasses.replace(
        EVERYTHING,
        consumer=False,
        backlog=False,
        live_progress=False,
        schedules=False,
        queues=False,
        ack_on_save=False,  # no consumer: no message to acknowledge
    )
    result = await runner.start("t", {}, run_lease=("me", 30.0))
    assert result.status is flowy.RunStatus.HANDOFF
    assert result.handoff_status is storage.HandoffStatus.ENQUEUED
    assert len(await backend.consumer.claim(10, 30.0)) == 1


async def test_a_runner_given_a_backend_or_as_backend_does_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        backend = await flowy.connect("memory://")
        flowy.Runner(approval_graph(), backend)
        runner = flowy.Runner(approval_graph(), as_backend(backend.checkpointer))
    result = await runner.start("t", {})
    assert result.status is flowy.RunStatus.SUSPENDED


async def test_a_store_without_timers_refuses_a_signal_naming_itself() -> None:
    store = MemoryStore()
    backend: MemoryBackend[Any] = MemoryBackend(store)
    backend.checkpointer = TimerlessCheckpointer(store)
    runner = flowy.Runner(approval_graph(), backend)
    await runner.start("t", {})
    with pytest.raises(TypeError, match="TimerlessCheckpointer does not"):
        await runner.signal("t", "approval", {"approved": True})


async def test_paths_are_chosen_when_the_runner_is_built() -> None:
    """A store whose parts change after the runner was built does not change the
    runner's paths: they were read from its capabilities once."""
    backend: MemoryBackend[Any] = MemoryBackend()
    runner = flowy.Runner(handoff_graph(), backend)
    failing = FaultyOutbox(backend.outbox)
    failing.arm(times=1)
    backend.outbox = failing  # pyright: ignore[reportAttributeAccessIssue]
    result = await runner.start("t", {})
    assert result.status is flowy.RunStatus.HANDOFF
    assert result.handoff_status is storage.HandoffStatus.ENQUEUED
    assert result.error is None
