"""What a store can do, declared once: :class:`Capabilities`, derived from the primitives
its components implement.

Like a SQLAlchemy dialect's ``supports_*`` flags, the engine reads them when a runner is
built and chooses its paths then; the conformance suite skips a class, with the reason,
exactly when a capability it tests is absent. ``_derive`` computes them from a store's
components.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["Capabilities", "RoundTrips"]


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a store can do (``Backend.capabilities``); each flag is derived from the
    primitives its components implement, never set by hand."""

    run_leases: bool
    """It has a lease manager: runs hold fenced, expiring leases on their threads."""
    fencing: bool
    """Its checkpointer checks its own leases atomically with each write (else the
    engine wraps it in a ``LeaseGuardCheckpointer``, safe within one process only)."""
    system_leases: bool
    """Its lease manager takes flowy's own leases (``acquire_system``: the recovery
    leader's) in a namespace no thread id reaches."""
    handoff_outbox: bool
    """It has an outbox: ``handoff()`` puts an intent there for a worker."""
    transactional_outbox: bool
    """A hand-off is one write: snapshot and outbox message commit together
    (``save_with_outbox`` + ``enqueue_intent_tx``), else the three-phase FSM."""
    consumer: bool
    """It has a consumer: a ``flowy.Worker`` claims hand-offs from it."""
    durable_timers_signals: bool
    """It keeps an index of wake-up times and each thread's inbox of signals
    (``sleep``, ``wait_for``, ``Runner.signal``)."""
    journal: bool
    """It keeps each thread's activity journal (``flowy.activity``)."""
    backlog: bool
    """It reports its backlog: the outbox's depth and dead letters, the oldest parked
    threads (``flowy.otel`` gauges)."""
    live_progress: bool
    """Progress events travel on the store's own channel (PostgreSQL ``NOTIFY``, Redis
    pub/sub), so ``Backend.watch`` hears them from any process; without it, only from
    runs in the watcher's process."""
    schedules: bool = False
    """It keeps durable schedules (``backend.schedules``) that workers fire."""
    queues: bool = False
    """It keeps named queues of hand-off messages with limits enforced across workers
    (``backend.queues``); without, every message is in the default queue."""
    acquire_with_load: bool = False
    """Its fencing checkpointer takes a run lease and reads the head in one round trip
    (``BaseCheckpointer.acquire_and_load`` over ``_acquire_head``): a leased segment
    starts with one call instead of two."""
    release_on_save: bool = False
    """Its fencing checkpointer gives a run lease up in the same atomic write as the
    save that ends a leased segment (``BaseCheckpointer.save_and_release`` over
    ``_write_release``), so the
    engine makes no separate release call."""
    ack_on_save: bool = False
    """That releasing save also acknowledges the hand-off message the run was resumed
    for (``BaseCheckpointer.save_and_release(ack=...)`` over ``_write_ack``), so a
    ``Worker`` makes no separate ack call after the run."""
    recent_index: bool = False
    """Its checkpointer keeps an index of each head's save second, so
    ``recent_threads`` reads one page of it (``_recent_heads``); without, it reads every
    head and sorts them (same answer, O(threads))."""

    def missing(self) -> tuple[str, ...]:
        """The names of the capabilities this store does not have."""
        return tuple(f.name for f in fields(self) if not getattr(self, f.name))


@dataclass(frozen=True, slots=True)
class RoundTrips:
    """How many store primitives the engine calls for each operation on a store
    (``BaseBackend.round_trips``), counted by ``RoundTripSuite`` through
    ``flowy.testing.faults.FaultyBackend`` on every store: one primitive call is one
    round trip to the server. A store whose primitive makes more than one declares more
    (and its bench rows show what that costs).
    """

    save: int = 1
    """``Checkpointer.save``, with or without a lease: one conditional write."""
    segment: int = 3
    """What a leased start or resume of N steps costs beyond its N saves: acquire the
    lease, read the head, release the lease (one less where the last save releases it,
    ``Capabilities.release_on_save``, and one less where the acquisition reads the
    head, ``Capabilities.acquire_with_load``)."""
    handoff: int = 5
    """What a hand-off a ``Worker`` claims and continues for N steps costs beyond its N
    saves: the claim, the lease the worker takes and the head it reads with it (its
    decision; the resumed run reads nothing again), the release of the lease, and the
    ack (one less for each of the capabilities ``segment`` names, and one less where
    the last save acknowledges the message, ``Capabilities.ack_on_save``)."""
