"""Argument contract tests: the same bad input gives the same error, with the same
message, on every store (``TypeError`` for a wrong type, ``ValueError`` for a wrong
value), and writes nothing.
"""

from __future__ import annotations

import math
from typing import Any, cast

import pytest

from ..._errors import (
    ConcurrencyConflictError,
    InvalidThreadIdError,
    LeaseLostError,
    ThreadLeaseBusyError,
)
from ...storage import Backend, Lease, OutboxMessage, Snapshot, TransactionalCheckpointer
from ._support import Suite, make_intent, make_snapshot, new_thread_id, saved_chain, try_load

__all__ = ["ArgumentSuite"]

BAD_NUMBERS: tuple[tuple[object, type[Exception]], ...] = (
    ("1", TypeError),
    (None, TypeError),
    (True, TypeError),
    (math.nan, ValueError),
    (-1, ValueError),
    (0, ValueError),
    (math.inf, ValueError),
)
"""Bad ttls, visibility timeouts and delays (0 is fine for a delay and a wait)."""


async def _nothing(handle: object, revision: int) -> None:
    return None


class ArgumentSuite(Suite):
    """Bad arguments: one error type and message for one mistake, on every store."""

    async def test_bad_revisions(self, flowy_backend: Backend[Any]) -> None:
        cp = flowy_backend.checkpointer
        tid = new_thread_id("bad-revision")
        tx = cast(TransactionalCheckpointer[Any], cp)
        for bad, error in (
            ("0", TypeError),
            (1.0, TypeError),
            (True, TypeError),
            (None, TypeError),
            (-1, ValueError),
        ):
            with pytest.raises(error, match="expected_revision"):
                await cp.save(cast(int, bad), make_snapshot(tid))
            with pytest.raises(error, match="expected_revision"):
                await tx.save_with_outbox(cast(int, bad), make_snapshot(tid), _nothing)
        assert await try_load(cp, tid) is None

    async def test_bad_snapshots(self, flowy_backend: Backend[Any]) -> None:
        cp = flowy_backend.checkpointer
        tid = new_thread_id("bad-snapshot")
        with pytest.raises(TypeError, match="Snapshot"):
            await cp.save(0, cast(Snapshot[Any], {"thread_id": tid}))
        with pytest.raises(ValueError, match="empty execution pointer"):
            await cp.save(0, make_snapshot(tid, pointer=""))
        assert await try_load(cp, tid) is None

    async def test_bad_counts(self, flowy_backend: Backend[Any]) -> None:
        cp, consumer = flowy_backend.checkpointer, flowy_backend.consumer
        tid = new_thread_id("bad-count")
        await saved_chain(cp, tid, 2)
        for bad, error in (("1", TypeError), (1.5, TypeError), (-1, ValueError)):
            with pytest.raises(error, match="limit"):
                await cp.get_history(tid, cast(int, bad))
            with pytest.raises(error, match="limit"):
                await cp.list_threads(limit=cast(int, bad))
            with pytest.raises(error, match="retain"):
                await cp.prune(tid, cast(int, bad))
            with pytest.raises(error, match="limit"):
                await consumer.dead_letters(cast(int, bad))
            with pytest.raises(error, match="limit"):
                await consumer.claim(cast(int, bad), self.long_ttl)
        assert [s.revision for s in await cp.get_history(tid)] == [2, 1]

    async def test_bad_ttls(self, flowy_backend: Backend[Any]) -> None:
        leases = flowy_backend.leases
        tid = new_thread_id("bad-ttl")
        lease = await leases.acquire(tid, "owner-1", self.long_ttl)
        for bad, error in BAD_NUMBERS:
            with pytest.raises(error, match="ttl"):
                await leases.acquire(new_thread_id("bad-ttl-other"), "owner-1", cast(float, bad))
            with pytest.raises(error, match="ttl"):
                await leases.renew(lease, cast(float, bad))
        holder = await leases.holder(tid)
        assert holder is not None and holder.expires_at == lease.expires_at

    async def test_bad_owners(self, flowy_backend: Backend[Any]) -> None:
        leases = flowy_backend.leases
        tid = new_thread_id("bad-owner")
        for bad, error in (
            ("", ValueError),
            ("a\x00b", ValueError),
            ("x" * 1025, ValueError),
            (7, TypeError),
        ):
            with pytest.raises(error, match="owner"):
                await leases.acquire(tid, cast(str, bad), self.long_ttl)
        assert await leases.holder(tid) is None

    async def test_bad_lease_handles(self, flowy_backend: Backend[Any]) -> None:
        leases, cp = flowy_backend.leases, flowy_backend.checkpointer
        tid = new_thread_id("bad-handle")
        for bad in (None, "lease", {"thread_id": tid}):
            with pytest.raises(TypeError, match="Lease"):
                await leases.release(cast(Lease, bad))
            with pytest.raises(TypeError, match="Lease"):
                await leases.renew(cast(Lease, bad), self.long_ttl)
            if bad is not None:
                with pytest.raises(TypeError, match="Lease"):
                    await cp.save(0, make_snapshot(tid), lease=cast(Lease, bad))
        assert await try_load(cp, tid) is None

    async def test_bad_leases_given_to_save(self, flowy_backend: Backend[Any]) -> None:
        cp = flowy_backend.checkpointer
        tid = new_thread_id("bad-save-lease")
        other = new_thread_id("bad-save-lease-other")
        for bad, error, match in (
            (Lease("", "owner-1", 1, 1.0), InvalidThreadIdError, "empty"),
            (Lease("a\x00b", "owner-1", 1, 1.0), InvalidThreadIdError, "NUL"),
            (Lease(tid, "", 1, 1.0), ValueError, "owner"),
            (Lease(tid, "owner-1", cast(int, "1"), 1.0), TypeError, "fencing_token"),
            (Lease(other, "owner-1", 1, 1.0), LeaseLostError, f"is for thread {other!r}"),
        ):
            with pytest.raises(error, match=match):
                await cp.save(0, make_snapshot(tid), lease=bad)
        assert await try_load(cp, tid) is None

    async def test_bad_claim_and_release_arguments(self, flowy_backend: Backend[Any]) -> None:
        outbox, consumer = flowy_backend.outbox, flowy_backend.consumer
        await outbox.enqueue_intent(make_intent(new_thread_id("bad-claim"), 1))
        for bad, error in BAD_NUMBERS:
            with pytest.raises(error, match="visibility_timeout"):
                await consumer.claim(1, cast(float, bad))
            if bad != 0:
                with pytest.raises(error, match="wait"):
                    await consumer.claim(1, self.long_ttl, wait=cast(float, bad))
        [message] = await consumer.claim(1, self.long_ttl)
        for bad, error in BAD_NUMBERS:
            if bad != 0:
                with pytest.raises(error, match="delay"):
                    await consumer.release(message, delay=cast(float, bad))
        with pytest.raises(TypeError, match="error"):
            await consumer.release(message, error=cast(str, 5))
        for bad in ("id", None, message.intent):
            with pytest.raises(TypeError, match="OutboxMessage"):
                await consumer.ack(cast(OutboxMessage, bad))
            with pytest.raises(TypeError, match="OutboxMessage"):
                await consumer.release(cast(OutboxMessage, bad))
        with pytest.raises(TypeError, match="message_id"):
            await consumer.retry_dead_letter(cast(str, 5))
        with pytest.raises(TypeError, match="HandoffIntent"):
            await outbox.enqueue_intent(cast(Any, {"thread_id": "t"}))
        # None of it touched the claimed message.
        assert await consumer.claim(10, self.long_ttl) == []
        await consumer.ack(message)

    async def test_refusals_read_the_same_on_every_store(self, flowy_backend: Backend[Any]) -> None:
        cp, leases = flowy_backend.checkpointer, flowy_backend.leases
        tid = new_thread_id("messages")
        await saved_chain(cp, tid, 1)
        with pytest.raises(ConcurrencyConflictError) as conflict:
            await cp.save(0, make_snapshot(tid))
        assert str(conflict.value) == (
            f"thread {tid!r} is at revision 1, not 0; reload it and decide again"
        )
        lease = await leases.acquire(tid, "owner-1", self.long_ttl)
        with pytest.raises(ThreadLeaseBusyError) as busy:
            await cp.save(1, make_snapshot(tid))
        assert str(busy.value) == (
            f"thread {tid!r} is leased by 'owner-1' (fencing token {lease.fencing_token}); "
            "save with its lease, or wait for it to end"
        )
        await leases.release(lease)
        with pytest.raises(LeaseLostError) as lost:
            await leases.release(lease)
        assert str(lost.value) == (
            f"cannot release lease {lease.fencing_token} of 'owner-1' on thread {tid!r}: it "
            "expired or was taken over"
        )
