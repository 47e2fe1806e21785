"""Concurrency tests: many tasks (and, with ``open_peer``, two "processes") racing on one
revision, one lease or one outbox message; exactly one wins every race.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar, cast

from ..._errors import ConcurrencyConflictError, ThreadLeaseBusyError
from ...storage import (
    Backend,
    Checkpointer,
    Lease,
    LeaseManager,
    Outbox,
    OutboxConsumer,
    OutboxMessage,
    TransactionalCheckpointer,
    TransactionalOutbox,
)
from ._support import (
    Suite,
    history_revisions,
    make_intent,
    make_snapshot,
    new_thread_id,
    peer_of,
    require_consumer,
    require_leases,
    saved_chain,
)

__all__ = ["ConcurrencySuite"]

T = TypeVar("T")


class _NoError(Exception):
    """No racer is expected to fail (used where every outcome must be a result)."""


async def _race(calls: list[Awaitable[T]]) -> list[T | BaseException]:
    """Run every call at once; results or raised exceptions, in call order."""
    return await asyncio.gather(*calls, return_exceptions=True)


def _split(
    outcomes: list[T | BaseException], error: type[BaseException]
) -> tuple[list[T], list[BaseException]]:
    """Winners and expected losers; any other exception fails the test with its cause."""
    wins: list[T] = []
    losses: list[BaseException] = []
    for outcome in outcomes:
        if isinstance(outcome, error):
            losses.append(outcome)
        elif isinstance(outcome, BaseException):
            raise AssertionError(f"a racer failed with an unexpected error: {outcome!r}") from (
                outcome
            )
        else:
            wins.append(outcome)
    return wins, losses


class ConcurrencySuite(Suite):
    """Racing writers: strict OCC, exclusive leases and single delivery under contention."""

    racers: int = 50
    """How many tasks race on one revision."""

    lease_racers: int = 20
    """How many tasks race for one lease."""

    async def _save_race(self, cps: list[Checkpointer[Any]], expected: int, tid: str) -> None:
        snaps = [make_snapshot(tid, {"racer": i}) for i in range(self.racers)]
        outcomes = await _race(
            [cps[i % len(cps)].save(expected, snap) for i, snap in enumerate(snaps)]
        )
        wins, losses = _split(outcomes, ConcurrencyConflictError)
        assert wins == [expected + 1], f"{len(wins)} racers won: {wins!r}"
        assert len(losses) == self.racers - 1
        winner = snaps[outcomes.index(expected + 1)]
        loaded, revision = await cps[0].load(tid)
        assert revision == expected + 1
        assert loaded.write_id == winner.write_id
        assert loaded.state == winner.state
        history = await history_revisions(cps[0], tid)
        assert history[0] == expected + 1
        assert history.count(expected + 1) == 1

    async def test_racing_updates_have_one_winner(self, flowy_backend: Backend[Any]) -> None:
        cp = flowy_backend.checkpointer
        tid = new_thread_id("race-update")
        await saved_chain(cp, tid, 2)
        await self._save_race([cp], 2, tid)
        assert await history_revisions(cp, tid) == [3, 2, 1]

    async def test_racing_creates_have_one_winner(self, flowy_backend: Backend[Any]) -> None:
        cp = flowy_backend.checkpointer
        tid = new_thread_id("race-create")
        await self._save_race([cp], 0, tid)
        assert await history_revisions(cp, tid) == [1]

    async def test_racing_updates_across_peers(self, flowy_backend: Backend[Any]) -> None:
        async with peer_of(flowy_backend) as peer:
            cps = [flowy_backend.checkpointer, peer.checkpointer]
            tid = new_thread_id("race-peers")
            await saved_chain(cps[0], tid, 1)
            await self._save_race(cps, 1, tid)
            assert await history_revisions(cps[1], tid) == [2, 1]

    async def test_racing_transactional_saves_have_one_winner_and_one_message(
        self, flowy_backend: Backend[Any]
    ) -> None:
        async with peer_of(flowy_backend) as peer:
            stores = [flowy_backend, peer]
            tid = new_thread_id("race-tx")
            await saved_chain(flowy_backend.checkpointer, tid, 1)

            def save(i: int) -> Awaitable[int]:
                store = stores[i % 2]
                outbox = cast(TransactionalOutbox, store.outbox)

                async def enqueue(handle: object, revision: int) -> None:
                    await outbox.enqueue_intent_tx(handle, make_intent(tid, revision))

                cp = cast(TransactionalCheckpointer[Any], store.checkpointer)
                return cp.save_with_outbox(1, make_snapshot(tid, {"racer": i}), enqueue)

            outcomes = await _race([save(i) for i in range(self.racers)])
            wins, losses = _split(outcomes, ConcurrencyConflictError)
            assert wins == [2] and len(losses) == self.racers - 1
            assert await history_revisions(flowy_backend.checkpointer, tid) == [2, 1]
            claimed = await flowy_backend.consumer.claim(self.racers, self.long_ttl)
            assert [m.intent.snapshot_revision for m in claimed] == [2]

    async def test_racing_creates_across_peers(self, flowy_backend: Backend[Any]) -> None:
        async with peer_of(flowy_backend) as peer:
            cps = [flowy_backend.checkpointer, peer.checkpointer]
            tid = new_thread_id("race-peers-create")
            await self._save_race(cps, 0, tid)
            assert await history_revisions(cps[1], tid) == [1]

    async def test_peer_sees_writes(self, flowy_backend: Backend[Any]) -> None:
        async with peer_of(flowy_backend) as peer:
            tid = new_thread_id("peer-visible")
            [first] = await saved_chain(flowy_backend.checkpointer, tid, 1)
            assert await peer.checkpointer.load(tid) == (first, 1)
            second = make_snapshot(tid, {"by": "peer"})
            assert await peer.checkpointer.save(1, second) == 2
            assert await flowy_backend.checkpointer.load(tid) == (second.at_revision(2), 2)

    async def test_parallel_creates_of_distinct_threads(self, flowy_backend: Backend[Any]) -> None:
        cp = flowy_backend.checkpointer
        tids = [new_thread_id(f"parallel-{i}") for i in range(self.racers)]
        snaps = [make_snapshot(tid, {"own": tid}) for tid in tids]
        outcomes = await _race([cp.save(0, snap) for snap in snaps])
        wins, _ = _split(outcomes, ConcurrencyConflictError)
        assert wins == [1] * self.racers
        for snap in snaps:
            assert await cp.load(snap.thread_id) == (snap.at_revision(1), 1)
        # Each thread moves on independently.
        outcomes = await _race([cp.save(1, make_snapshot(tid)) for tid in tids])
        wins, _ = _split(outcomes, ConcurrencyConflictError)
        assert wins == [2] * self.racers

    async def _lease_race(self, managers: list[LeaseManager]) -> None:
        tid = new_thread_id("race-lease")
        outcomes = await _race(
            [
                managers[i % len(managers)].acquire(tid, f"owner-{i}", self.long_ttl)
                for i in range(self.lease_racers)
            ]
        )
        wins, losses = _split(outcomes, ThreadLeaseBusyError)
        assert len(wins) == 1, f"{len(wins)} owners hold the lease at once: {wins!r}"
        assert len(losses) == self.lease_racers - 1
        winner: Lease = wins[0]
        for manager in managers:
            holder = await manager.holder(tid)
            assert holder is not None
            assert (holder.owner, holder.fencing_token) == (winner.owner, winner.fencing_token)

    async def test_racing_acquires_have_one_winner(self, flowy_backend: Backend[Any]) -> None:
        await self._lease_race([require_leases(flowy_backend)])

    async def test_racing_acquires_across_peers(self, flowy_backend: Backend[Any]) -> None:
        leases = require_leases(flowy_backend)
        async with peer_of(flowy_backend) as peer:
            await self._lease_race([leases, require_leases(peer)])

    async def _claim_race(
        self, outbox: Outbox, consumers: list[OutboxConsumer], messages: int, limit: int
    ) -> None:
        intents = [make_intent(new_thread_id(f"claim-{i}"), 1) for i in range(messages)]
        for intent in intents:
            await outbox.enqueue_intent(intent)
        claimers = 10
        outcomes = await _race(
            [consumers[i % len(consumers)].claim(limit, self.long_ttl) for i in range(claimers)]
        )
        batches, _ = _split(outcomes, _NoError)
        delivered: list[OutboxMessage] = [m for batch in batches for m in batch]
        # Whatever a racer missed (a skipped lock) is still there for a later claim.
        while more := await consumers[0].claim(messages, self.long_ttl):
            delivered.extend(more)
        ids = [m.message_id for m in delivered]
        assert len(ids) == len(set(ids)), f"a message was delivered twice: {sorted(ids)!r}"
        assert sorted(m.intent.thread_id for m in delivered) == sorted(i.thread_id for i in intents)
        assert all(m.attempts == 1 for m in delivered)

    async def test_racing_claims_deliver_once(self, flowy_backend: Backend[Any]) -> None:
        outbox, consumer = require_consumer(flowy_backend)
        await self._claim_race(outbox, [consumer], messages=1, limit=1)

    async def test_racing_batch_claims_deliver_once(self, flowy_backend: Backend[Any]) -> None:
        outbox, consumer = require_consumer(flowy_backend)
        await self._claim_race(outbox, [consumer], messages=20, limit=5)

    async def test_racing_claims_across_peers(self, flowy_backend: Backend[Any]) -> None:
        outbox, consumer = require_consumer(flowy_backend)
        async with peer_of(flowy_backend) as peer:
            _, peer_consumer = require_consumer(peer)
            await self._claim_race(outbox, [consumer, peer_consumer], messages=1, limit=1)
