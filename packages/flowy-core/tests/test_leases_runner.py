"""Runs under leases: required run_lease, renewal, release, fencing, the lease guard."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from core_graphs import State, approval_graph, linear_graph, merge

import flowy
from flowy import errors, storage
from flowy.memory import MemoryBackend, MemoryCheckpointer, MemoryLeaseManager
from flowy.storage import as_backend, dialect

pytestmark = pytest.mark.anyio


def sleeper(seconds: float) -> flowy.Graph[State, Any]:
    async def slow(s: State) -> tuple[State, flowy.Directive[Any]]:
        await asyncio.sleep(seconds)
        return {"slept": True}, flowy.completed()

    async def last(s: State) -> tuple[State, flowy.Directive[Any]]:
        return s, flowy.suspend("done_sleeping")

    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    b.add_node("slow", slow).add_node("last", last).add_edge("slow", "last")
    b.allow_no_outgoing_route("last")
    return b.compile()


async def test_run_lease_required_with_a_lease_manager() -> None:
    lm = MemoryLeaseManager()
    runner = flowy.Runner(linear_graph(), as_backend(MemoryCheckpointer(lm.store), leases=lm))
    with pytest.raises(errors.LeaseRequiredError, match="run_lease"):
        await runner.start("t", {})
    with pytest.raises(errors.LeaseRequiredError):
        await runner.start("t", {}, run_lease=("", 5))
    r = await runner.start("t", {}, run_lease=("w1", 5))
    assert r.status is flowy.RunStatus.COMPLETED
    assert await lm.holder("t") is None  # released after the terminal save


async def test_lease_renewed_while_run_is_alive() -> None:
    mem: MemoryBackend[State] = MemoryBackend()
    lm = mem.leases
    cp = mem.checkpointer
    runner = flowy.Runner(sleeper(0.5), as_backend(cp, leases=lm))
    r = await runner.start("t", {}, run_lease=("w1", 0.2))  # ttl shorter than the node
    assert r.status is flowy.RunStatus.SUSPENDED and r.error is None
    assert await lm.holder("t") is None


async def test_busy_thread_rejected_by_lease() -> None:
    mem: MemoryBackend[State] = MemoryBackend()
    lm = mem.leases
    cp = mem.checkpointer
    runner = flowy.Runner(approval_graph(), as_backend(cp, leases=lm))
    first = await runner.start("t", {}, run_lease=("w1", 5))
    assert first.resume_token is not None
    other = await lm.acquire("t", "intruder", 5)
    with pytest.raises(flowy.ThreadLeaseBusyError):
        await runner.resume(first.resume_token, run_lease=("w1", 5))
    await lm.release(other)
    r = await runner.resume(
        first.resume_token, run_lease=("w1", 5), state_overlay={"approved": True}
    )
    assert r.status is flowy.RunStatus.HANDOFF


async def test_lost_lease_stops_run_and_its_saves_are_fenced() -> None:
    mem: MemoryBackend[State] = MemoryBackend()
    lm = mem.leases
    cp = mem.checkpointer
    gate = asyncio.Event()

    async def wait(s: State) -> tuple[State, flowy.Directive[Any]]:
        await gate.wait()
        return {"old_owner_wrote": True}, flowy.suspend("x")

    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    b.add_node("start", linear_start).add_node("wait", wait).add_edge("start", "wait")
    b.allow_no_outgoing_route("wait")
    runner = flowy.Runner(b.compile(), as_backend(cp, leases=lm))
    task = asyncio.ensure_future(runner.start("t", {}, run_lease=("old", 0.15)))
    await asyncio.sleep(0.05)
    # the old owner stalls (e.g. a GC pause) past its TTL: simulate by stopping renewal
    ex_lease = await lm.holder("t")
    assert ex_lease is not None and ex_lease.owner == "old"
    lm.store.leases["t"] = ex_lease.__class__("t", "old", ex_lease.fencing_token, 0.0)  # expire
    new = await lm.acquire("t", "new", 5)
    snap_before, rev_before = await cp.load("t")
    gate.set()
    result = await asyncio.wait_for(task, 5)
    assert result.status is flowy.RunStatus.FAILED and result.reason == flowy.Reason.LEASE_LOST
    assert isinstance(result.error, flowy.LeaseLostError)
    snap_after, rev_after = await cp.load("t")
    assert rev_after == rev_before and snap_after == snap_before  # never overwritten
    assert (await lm.holder("t")) == new  # the new owner's lease is untouched


async def linear_start(s: State) -> tuple[State, flowy.Directive[Any]]:
    return {"started": True}, flowy.completed()


async def test_non_native_checkpointer_is_wrapped_in_lease_guard() -> None:
    lm = MemoryLeaseManager()
    plain: MemoryCheckpointer[State] = MemoryCheckpointer()  # knows no leases
    runner = flowy.Runner(approval_graph(), as_backend(plain, leases=lm))
    assert isinstance(runner.checkpointer, storage.LeaseGuardCheckpointer)
    native = flowy.Runner(approval_graph(), as_backend(MemoryCheckpointer(lm.store), leases=lm))
    assert isinstance(native.checkpointer, MemoryCheckpointer)
    r = await runner.start("t", {}, run_lease=("w", 5))
    assert r.status is flowy.RunStatus.SUSPENDED
    guard = runner.checkpointer
    lease = await lm.acquire("t", "someone", 5)
    with pytest.raises(flowy.ThreadLeaseBusyError):
        await guard.save(r.revision, (await guard.load("t"))[0])
    with pytest.raises(flowy.ThreadLeaseBusyError):
        await guard.delete_if_idle("t")
    stale = lease.__class__("t", "someone", lease.fencing_token - 1, lease.expires_at)
    with pytest.raises(flowy.LeaseLostError):
        await guard.save(r.revision, (await guard.load("t"))[0], lease=stale)
    await lm.release(lease)
    await guard.delete_if_idle("t")
    with pytest.raises(flowy.ThreadNotFoundError):
        await plain.load("t")


async def test_delete_on_success_runs_after_lease_release() -> None:
    mem: MemoryBackend[State] = MemoryBackend()
    lm = mem.leases
    cp = mem.checkpointer
    runner = flowy.Runner(linear_graph(2, delete_on_success=True), as_backend(cp, leases=lm))
    r = await runner.start("t", {}, run_lease=("w", 5))
    assert r.status is flowy.RunStatus.COMPLETED
    with pytest.raises(flowy.ThreadNotFoundError):
        await cp.load("t")


async def test_a_fenced_save_validates_its_thread_id_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # The lease names the thread the save already validated: it is not validated again.
    from flowy.storage import _base, _checks

    checked: list[object] = []

    def counting(thread_id: object) -> str:
        checked.append(thread_id)
        return dialect.validate_thread_id(thread_id)

    mem: MemoryBackend[State] = MemoryBackend()
    lease = await mem.leases.acquire("t", "w1", 30)
    snap: storage.Snapshot[State] = storage.Snapshot("t", {}, "a", updated_at=1.0)
    monkeypatch.setattr(_base, "validate_thread_id", counting)
    monkeypatch.setattr(_checks, "validate_thread_id", counting)
    assert await mem.checkpointer.save(0, snap, lease=lease) == 1
    assert checked == ["t"]
