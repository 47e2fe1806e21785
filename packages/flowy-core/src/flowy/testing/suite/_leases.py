"""Lease manager contract tests (exclusive, expiring, fenced leases) and native fencing:
a checkpointer that checks the lease atomically with the revision and the write.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import replace
from typing import Any, ClassVar

import pytest

from ..._errors import (
    ConcurrencyConflictError,
    InvalidThreadIdError,
    LeaseLostError,
    ThreadLeaseBusyError,
    ThreadNotFoundError,
)
from ...storage import Backend, Lease, LeaseManager, Snapshot
from ...storage.dialect import BaseLeaseManager
from ._support import (
    Suite,
    history_revisions,
    make_intent,
    make_snapshot,
    new_thread_id,
    require_fencing,
    require_leases,
    require_transactional,
    saved_chain,
    try_load,
)

__all__ = ["FencingSuite", "LeaseSuite"]


async def _assert_held_by(leases: LeaseManager, lease: Lease) -> None:
    holder = await leases.holder(lease.thread_id)
    assert holder is not None, f"thread {lease.thread_id!r} should be held by {lease!r}"
    assert (holder.thread_id, holder.owner, holder.fencing_token) == (
        lease.thread_id,
        lease.owner,
        lease.fencing_token,
    )


class LeaseSuite(Suite):
    """``acquire`` / ``renew`` / ``release`` / ``holder`` of the bundle's lease manager."""

    requires: ClassVar[tuple[str, ...]] = ("run_leases",)

    async def test_acquire_returns_a_live_lease(self, flowy_backend: Backend[Any]) -> None:
        leases = require_leases(flowy_backend)
        tid = new_thread_id("acquire")
        before = time.time()
        lease = await leases.acquire(tid, "owner-1", self.long_ttl)
        after = time.time()
        assert lease.thread_id == tid
        assert lease.owner == "owner-1"
        assert lease.fencing_token >= 1
        assert before + self.long_ttl - self.clock_skew <= lease.expires_at
        assert lease.expires_at <= after + self.long_ttl + self.clock_skew
        await _assert_held_by(leases, lease)

    async def test_second_owner_is_refused(self, flowy_backend: Backend[Any]) -> None:
        leases = require_leases(flowy_backend)
        tid = new_thread_id("busy")
        lease = await leases.acquire(tid, "owner-1", self.long_ttl)
        with pytest.raises(ThreadLeaseBusyError):
            await leases.acquire(tid, "owner-2", self.long_ttl)
        await _assert_held_by(leases, lease)

    async def test_same_owner_is_refused(self, flowy_backend: Backend[Any]) -> None:
        """Leases are not re-entrant: a second run of the same owner must not share it."""
        leases = require_leases(flowy_backend)
        tid = new_thread_id("reentrant")
        lease = await leases.acquire(tid, "owner-1", self.long_ttl)
        with pytest.raises(ThreadLeaseBusyError):
            await leases.acquire(tid, "owner-1", self.long_ttl)
        await _assert_held_by(leases, lease)

    async def test_holder_of_a_free_thread_is_none(self, flowy_backend: Backend[Any]) -> None:
        leases = require_leases(flowy_backend)
        tid = new_thread_id("free")
        assert await leases.holder(tid) is None
        await leases.acquire(new_thread_id("other"), "owner-1", self.long_ttl)
        assert await leases.holder(tid) is None

    async def test_holder_is_read_only(self, flowy_backend: Backend[Any]) -> None:
        leases = require_leases(flowy_backend)
        tid = new_thread_id("holder")
        lease = await leases.acquire(tid, "owner-1", self.short_ttl)
        for _ in range(5):
            holder = await leases.holder(tid)
            assert holder is not None
            assert (holder.owner, holder.fencing_token) == (lease.owner, lease.fencing_token)
            assert holder.expires_at == pytest.approx(lease.expires_at, abs=0.05)
        await self.expire()
        # holder() did not extend the lease: it expired on time.
        assert await leases.holder(tid) is None
        later = await leases.acquire(tid, "owner-2", self.long_ttl)
        assert later.fencing_token > lease.fencing_token

    async def test_expired_lease_can_be_taken_over(self, flowy_backend: Backend[Any]) -> None:
        leases = require_leases(flowy_backend)
        tid = new_thread_id("takeover")
        first = await leases.acquire(tid, "owner-1", self.short_ttl)
        await self.expire()
        assert await leases.holder(tid) is None
        second = await leases.acquire(tid, "owner-2", self.long_ttl)
        assert second.owner == "owner-2"
        assert second.fencing_token > first.fencing_token
        await _assert_held_by(leases, second)

    async def test_tokens_increase_across_release(self, flowy_backend: Backend[Any]) -> None:
        leases = require_leases(flowy_backend)
        tid = new_thread_id("tokens")
        tokens: list[int] = []
        for owner in ("owner-1", "owner-1", "owner-2", "owner-1"):
            lease = await leases.acquire(tid, owner, self.long_ttl)
            tokens.append(lease.fencing_token)
            await leases.release(lease)
        assert all(a < b for a, b in itertools.pairwise(tokens)), (
            f"fencing tokens must grow on every acquisition, got {tokens}"
        )

    async def test_tokens_increase_after_expiry(self, flowy_backend: Backend[Any]) -> None:
        leases = require_leases(flowy_backend)
        tid = new_thread_id("tokens-expiry")
        first = await leases.acquire(tid, "owner-1", self.short_ttl)
        await self.expire()
        second = await leases.acquire(tid, "owner-1", self.long_ttl)
        await leases.release(second)
        third = await leases.acquire(tid, "owner-2", self.long_ttl)
        assert first.fencing_token < second.fencing_token < third.fencing_token

    async def test_renew_extends_the_lease(self, flowy_backend: Backend[Any]) -> None:
        leases = require_leases(flowy_backend)
        tid = new_thread_id("renew")
        lease = await leases.acquire(tid, "owner-1", self.short_ttl)
        renewed = await leases.renew(lease, self.long_ttl)
        assert (renewed.thread_id, renewed.owner, renewed.fencing_token) == (
            tid,
            "owner-1",
            lease.fencing_token,
        )
        assert renewed.expires_at > lease.expires_at
        await self.expire()
        # Past the first expiry the renewed lease still holds the thread.
        await _assert_held_by(leases, renewed)
        with pytest.raises(ThreadLeaseBusyError):
            await leases.acquire(tid, "owner-2", self.long_ttl)
        await leases.release(renewed)
        assert await leases.holder(tid) is None

    async def test_stale_handle_after_takeover_is_lost(self, flowy_backend: Backend[Any]) -> None:
        leases = require_leases(flowy_backend)
        tid = new_thread_id("stale-takeover")
        old = await leases.acquire(tid, "owner-1", self.short_ttl)
        await self.expire()
        new = await leases.acquire(tid, "owner-2", self.long_ttl)
        with pytest.raises(LeaseLostError):
            await leases.renew(old, self.long_ttl)
        with pytest.raises(LeaseLostError):
            await leases.release(old)
        await _assert_held_by(leases, new)

    async def test_stale_handle_after_expiry_is_lost(self, flowy_backend: Backend[Any]) -> None:
        leases = require_leases(flowy_backend)
        tid = new_thread_id("stale-expired")
        old = await leases.acquire(tid, "owner-1", self.short_ttl)
        await self.expire()
        with pytest.raises(LeaseLostError):
            await leases.renew(old, self.long_ttl)
        assert await leases.holder(tid) is None

    async def test_stale_handle_after_release_is_lost(self, flowy_backend: Backend[Any]) -> None:
        leases = require_leases(flowy_backend)
        tid = new_thread_id("stale-released")
        lease = await leases.acquire(tid, "owner-1", self.long_ttl)
        await leases.release(lease)
        with pytest.raises(LeaseLostError):
            await leases.renew(lease, self.long_ttl)
        with pytest.raises(LeaseLostError):
            await leases.release(lease)
        assert await leases.holder(tid) is None

    async def test_forged_handle_is_lost(self, flowy_backend: Backend[Any]) -> None:
        leases = require_leases(flowy_backend)
        tid = new_thread_id("forged")
        lease = await leases.acquire(tid, "owner-1", self.long_ttl)
        forgeries = [
            replace(lease, fencing_token=lease.fencing_token + 1),
            replace(lease, fencing_token=lease.fencing_token + 1000),
            replace(lease, owner="owner-2"),
        ]
        if lease.fencing_token > 1:
            forgeries.append(replace(lease, fencing_token=lease.fencing_token - 1))
        for forged in forgeries:
            with pytest.raises(LeaseLostError):
                await leases.renew(forged, self.long_ttl)
            with pytest.raises(LeaseLostError):
                await leases.release(forged)
        # The real lease is untouched by the forgeries.
        await _assert_held_by(leases, lease)
        await leases.renew(lease, self.long_ttl)
        await leases.release(lease)

    async def test_release_of_an_expired_lease_is_lost(self, flowy_backend: Backend[Any]) -> None:
        leases = require_leases(flowy_backend)
        tid = new_thread_id("release-expired")
        lease = await leases.acquire(tid, "owner-1", self.short_ttl)
        await self.expire()
        with pytest.raises(LeaseLostError):
            await leases.release(lease)
        with pytest.raises(LeaseLostError):
            await leases.renew(lease, self.long_ttl)

    async def test_owners_compare_exactly(self, flowy_backend: Backend[Any]) -> None:
        leases = require_leases(flowy_backend)
        tid = new_thread_id("owner-case")
        lease = await leases.acquire(tid, "Worker-A", self.long_ttl)
        for other in ("worker-a", "WORKER-A", "Worker-A ", "Worker-\u0410"):
            with pytest.raises(LeaseLostError):
                await leases.renew(replace(lease, owner=other), self.long_ttl)
            with pytest.raises(LeaseLostError):
                await leases.release(replace(lease, owner=other))
        holder = await leases.holder(tid)
        assert holder is not None and holder.owner == "Worker-A"
        await leases.release(lease)

    async def test_tokens_increase_across_delete(self, flowy_backend: Backend[Any]) -> None:
        leases = require_leases(flowy_backend)
        cp = flowy_backend.checkpointer
        tid = new_thread_id("delete-token")
        lease = await leases.acquire(tid, "owner-1", self.long_ttl)
        await cp.save(0, make_snapshot(tid), lease=lease)
        await leases.release(lease)
        await cp.delete(tid)
        again = await leases.acquire(tid, "owner-2", self.long_ttl)
        assert again.fencing_token > lease.fencing_token
        await cp.save(0, make_snapshot(tid), lease=again)
        await leases.release(again)
        await cp.delete_if_idle(tid)
        third = await leases.acquire(tid, "owner-3", self.long_ttl)
        assert third.fencing_token > again.fencing_token

    async def test_system_leases_never_collide_with_threads(
        self, flowy_backend: Backend[Any]
    ) -> None:
        leases = require_leases(flowy_backend)
        if not isinstance(leases, BaseLeaseManager):
            pytest.skip(f"{type(leases).__name__} has no system leases (not a BaseLeaseManager)")
        name = new_thread_id("leader")
        system = await leases.acquire_system(name, "owner-1", self.long_ttl)
        thread = await leases.acquire(name, "owner-2", self.long_ttl)  # same name, a thread
        assert await leases.holder(name) == thread
        with pytest.raises(ThreadLeaseBusyError):
            await leases.acquire_system(name, "owner-3", self.long_ttl)
        renewed = await leases.renew(system, self.long_ttl)
        await leases.release(renewed)
        with pytest.raises(InvalidThreadIdError):
            await leases.acquire(system.thread_id, "owner-4", self.long_ttl)
        await leases.release(thread)

    async def test_release_frees_the_thread(self, flowy_backend: Backend[Any]) -> None:
        leases = require_leases(flowy_backend)
        tid = new_thread_id("release")
        lease = await leases.acquire(tid, "owner-1", self.long_ttl)
        await leases.release(lease)
        assert await leases.holder(tid) is None
        other = await leases.acquire(tid, "owner-2", self.long_ttl)
        assert other.fencing_token > lease.fencing_token
        await _assert_held_by(leases, other)


class FencingSuite(Suite):
    """Native fencing: ``save`` checks the lease atomically with the revision.

    Runs when the checkpointer is a ``FencingCheckpointer`` whose ``fences(bundle.leases)``
    is true.
    """

    requires: ClassVar[tuple[str, ...]] = ("run_leases",)

    async def _assert_unchanged(
        self, flowy_backend: Backend[Any], before: tuple[Snapshot[Any], int]
    ) -> None:
        cp = flowy_backend.checkpointer
        tid = before[0].thread_id
        assert await cp.load(tid) == before
        assert (await history_revisions(cp, tid))[0] == before[1]

    async def test_save_with_the_live_lease(self, flowy_backend: Backend[Any]) -> None:
        cp, leases = require_fencing(flowy_backend)
        tid = new_thread_id("fenced-save")
        lease = await leases.acquire(tid, "owner-1", self.long_ttl)
        assert await cp.save(0, make_snapshot(tid), lease=lease) == 1
        snap = make_snapshot(tid, {"n": 2})
        assert await cp.save(1, snap, lease=lease) == 2
        assert await cp.load(tid) == (snap.at_revision(2), 2)

    async def test_save_with_a_renewed_lease(self, flowy_backend: Backend[Any]) -> None:
        cp, leases = require_fencing(flowy_backend)
        tid = new_thread_id("fenced-renewed")
        lease = await leases.acquire(tid, "owner-1", self.long_ttl)
        renewed = await leases.renew(lease, self.long_ttl)
        assert await cp.save(0, make_snapshot(tid), lease=renewed) == 1

    async def test_save_with_a_taken_over_lease_is_lost(self, flowy_backend: Backend[Any]) -> None:
        cp, leases = require_fencing(flowy_backend)
        tid = new_thread_id("fenced-takeover")
        old = await leases.acquire(tid, "owner-1", self.short_ttl)
        await cp.save(0, make_snapshot(tid), lease=old)
        before = await cp.load(tid)
        await self.expire()
        new = await leases.acquire(tid, "owner-2", self.long_ttl)
        with pytest.raises(LeaseLostError):
            await cp.save(1, make_snapshot(tid, {"n": "zombie"}), lease=old)
        await self._assert_unchanged(flowy_backend, before)
        assert await cp.save(1, make_snapshot(tid), lease=new) == 2

    async def test_save_with_an_expired_lease_is_lost(self, flowy_backend: Backend[Any]) -> None:
        cp, leases = require_fencing(flowy_backend)
        tid = new_thread_id("fenced-expired")
        lease = await leases.acquire(tid, "owner-1", self.short_ttl)
        await cp.save(0, make_snapshot(tid), lease=lease)
        before = await cp.load(tid)
        await self.expire()
        with pytest.raises(LeaseLostError):
            await cp.save(1, make_snapshot(tid), lease=lease)
        await self._assert_unchanged(flowy_backend, before)

    async def test_save_with_a_released_lease_is_lost(self, flowy_backend: Backend[Any]) -> None:
        cp, leases = require_fencing(flowy_backend)
        tid = new_thread_id("fenced-released")
        lease = await leases.acquire(tid, "owner-1", self.long_ttl)
        await leases.release(lease)
        with pytest.raises(LeaseLostError):
            await cp.save(0, make_snapshot(tid), lease=lease)
        assert await try_load(cp, tid) is None

    async def test_save_with_a_forged_lease_is_lost(self, flowy_backend: Backend[Any]) -> None:
        cp, leases = require_fencing(flowy_backend)
        tid = new_thread_id("fenced-forged")
        lease = await leases.acquire(tid, "owner-1", self.long_ttl)
        await cp.save(0, make_snapshot(tid), lease=lease)
        before = await cp.load(tid)
        for forged in (
            replace(lease, fencing_token=lease.fencing_token + 1),
            replace(lease, owner="owner-2"),
        ):
            with pytest.raises(LeaseLostError):
                await cp.save(1, make_snapshot(tid), lease=forged)
        await self._assert_unchanged(flowy_backend, before)

    async def test_save_without_lease_while_leased_is_busy(
        self, flowy_backend: Backend[Any]
    ) -> None:
        cp, leases = require_fencing(flowy_backend)
        tid = new_thread_id("fenced-busy")
        await saved_chain(cp, tid, 1)
        before = await cp.load(tid)
        await leases.acquire(tid, "owner-1", self.long_ttl)
        with pytest.raises(ThreadLeaseBusyError):
            await cp.save(1, make_snapshot(tid))
        await self._assert_unchanged(flowy_backend, before)
        fresh = new_thread_id("fenced-busy-create")
        await leases.acquire(fresh, "owner-1", self.long_ttl)
        with pytest.raises(ThreadLeaseBusyError):
            await cp.save(0, make_snapshot(fresh))
        assert await try_load(cp, fresh) is None

    async def test_save_without_lease_when_free(self, flowy_backend: Backend[Any]) -> None:
        cp, leases = require_fencing(flowy_backend)
        tid = new_thread_id("fenced-free")
        assert await cp.save(0, make_snapshot(tid)) == 1
        lease = await leases.acquire(tid, "owner-1", self.long_ttl)
        await leases.release(lease)
        assert await cp.save(1, make_snapshot(tid)) == 2
        await leases.acquire(tid, "owner-1", self.short_ttl)
        await self.expire()
        assert await cp.save(2, make_snapshot(tid)) == 3

    async def test_lease_on_another_thread_does_not_fence(
        self, flowy_backend: Backend[Any]
    ) -> None:
        cp, leases = require_fencing(flowy_backend)
        tid = new_thread_id("fenced-bystander")
        await leases.acquire(new_thread_id("fenced-leased"), "owner-1", self.long_ttl)
        assert await cp.save(0, make_snapshot(tid)) == 1

    async def test_conflict_is_still_checked_under_the_lease(
        self, flowy_backend: Backend[Any]
    ) -> None:
        cp, leases = require_fencing(flowy_backend)
        tid = new_thread_id("fenced-occ")
        lease = await leases.acquire(tid, "owner-1", self.long_ttl)
        await cp.save(0, make_snapshot(tid), lease=lease)
        before = await cp.load(tid)
        with pytest.raises(ConcurrencyConflictError):
            await cp.save(0, make_snapshot(tid), lease=lease)
        await self._assert_unchanged(flowy_backend, before)

    async def test_delete_if_idle_after_the_lease_expired(
        self, flowy_backend: Backend[Any]
    ) -> None:
        cp, leases = require_fencing(flowy_backend)
        tid = new_thread_id("delete-expired")
        lease = await leases.acquire(tid, "owner-1", self.short_ttl)
        await cp.save(0, make_snapshot(tid), lease=lease)
        await self.expire()
        await cp.delete_if_idle(tid)  # an expired lease holds nothing
        assert await try_load(cp, tid) is None

    async def test_lease_of_another_thread_is_refused(self, flowy_backend: Backend[Any]) -> None:
        cp, leases = require_fencing(flowy_backend)
        tid, other = new_thread_id("fenced"), new_thread_id("other")
        await cp.save(0, make_snapshot(tid))
        lease = await leases.acquire(other, "owner-1", self.long_ttl)
        forged = replace(lease, thread_id=tid)
        with pytest.raises(LeaseLostError):
            await cp.save(1, make_snapshot(tid), lease=forged)
        with pytest.raises(LeaseLostError):
            await cp.save(1, make_snapshot(tid), lease=lease)
        assert (await cp.load(tid))[1] == 1

    async def test_delete_if_idle_refuses_while_leased(self, flowy_backend: Backend[Any]) -> None:
        cp, leases = require_fencing(flowy_backend)
        tid = new_thread_id("fenced-delete")
        await saved_chain(cp, tid, 2)
        before = await cp.load(tid)
        lease = await leases.acquire(tid, "owner-1", self.long_ttl)
        with pytest.raises(ThreadLeaseBusyError):
            await cp.delete_if_idle(tid)
        await self._assert_unchanged(flowy_backend, before)
        await leases.release(lease)
        await cp.delete_if_idle(tid)
        with pytest.raises(ThreadNotFoundError):
            await cp.load(tid)

    async def test_save_with_outbox_is_fenced(self, flowy_backend: Backend[Any]) -> None:
        cp, leases = require_fencing(flowy_backend)
        tx = require_transactional(flowy_backend)
        tid = new_thread_id("fenced-outbox")

        async def enqueue(handle: object, revision: int) -> None:
            await tx.outbox.enqueue_intent_tx(handle, make_intent(tid, revision))

        old = await leases.acquire(tid, "owner-1", self.short_ttl)
        saved = await tx.checkpointer.save_with_outbox(0, make_snapshot(tid), enqueue, lease=old)
        assert saved == 1
        before = await cp.load(tid)
        consumer = tx.consumer
        [message] = await consumer.claim(10, self.long_ttl)
        await consumer.ack(message)
        await self.expire()
        new = await leases.acquire(tid, "owner-2", self.long_ttl)
        with pytest.raises(LeaseLostError):
            await tx.checkpointer.save_with_outbox(1, make_snapshot(tid), enqueue, lease=old)
        with pytest.raises(ThreadLeaseBusyError):
            await tx.checkpointer.save_with_outbox(1, make_snapshot(tid), enqueue)
        await self._assert_unchanged(flowy_backend, before)
        assert await consumer.claim(10, self.long_ttl) == []
        saved = await tx.checkpointer.save_with_outbox(1, make_snapshot(tid), enqueue, lease=new)
        assert saved == 2
