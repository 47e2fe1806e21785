"""``FaultyBackend``: a store whose primitives fail where a plan says."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Mapping
from dataclasses import replace
from types import TracebackType
from typing import Any, Generic, Self

from ..._types import S
from ...storage import Backend, Capabilities, HandoffIntent, Limits, Outbox
from ...storage._watch import WatchEvent
from ...storage.dialect import (
    BaseCheckpointer,
    BaseConsumer,
    BaseLeaseManager,
    BaseOutbox,
    BaseScheduleStore,
    Write,
)
from ._model import (
    ArmedFaults,
    Fault,
    FaultKind,
    FaultPlan,
    Operation,
    Phase,
    SimulatedCrash,
    save_phase,
)

__all__ = ["PRIMITIVES", "FaultyBackend"]


# The primitives of each base and their phase (``None``: a write, by what it writes).
# A primitive added to a base is added here (a test checks every one is).
PRIMITIVES: Mapping[type, Mapping[str, Phase | None]] = {
    BaseCheckpointer: {
        "_write": None,
        "_write_release": None,
        "_write_ack": None,
        "_acquire_head": Phase.ACQUIRE,
        "_read_head": Phase.LOAD,
        "_read_history": Phase.READ,
        "_prune": Phase.PRUNE,
        "_delete": Phase.DELETE,
        "_list_heads": Phase.READ,
        "_timers": Phase.READ,
        "_append_signal": Phase.SIGNAL,
        "_read_signals": Phase.READ,
        "_put_activity": Phase.JOURNAL,
        "_get_activity": Phase.READ,
        "_list_activities": Phase.READ,
        "_oldest_heads": Phase.READ,
        "_recent_heads": Phase.READ,
        "_diagnose": Phase.READ,
    },
    BaseLeaseManager: {
        "_acquire": Phase.ACQUIRE,
        "_renew": Phase.RENEW,
        "_release": Phase.RELEASE_LEASE,
        "_holder": Phase.READ,
    },
    BaseOutbox: {"_append": Phase.ENQUEUE},
    BaseConsumer: {
        "_claim": Phase.CLAIM,
        "_claim_queue": Phase.CLAIM,
        "_ack": Phase.ACK,
        "_release": Phase.RELEASE,
        "_dead_letters": Phase.READ,
        "_retry_dead_letter": Phase.RETRY_DEAD_LETTER,
        "_stats": Phase.READ,
        "_listen": Phase.READ,
        "_next_visible": Phase.READ,
        "_set_limits": Phase.CONFIGURE,
        "_read_limits": Phase.READ,
        "_queue_counts": Phase.READ,
        "_queue_messages": Phase.READ,
    },
}
"""Every primitive a :class:`FaultyBackend` intercepts, by the base that declares it."""


def _write_phase(write: Write) -> Phase:
    if write.outbox:
        return Phase.COMMIT
    return save_phase(write.summary.status, write.summary.handoff_status)


class _ThreePhaseOutbox:
    """An outbox without its transactional side: hand-offs take the three-phase path."""

    def __init__(self, inner: BaseOutbox) -> None:
        self.inner = inner

    async def enqueue_intent(self, intent: HandoffIntent) -> None:
        """``enqueue_intent`` of the wrapped outbox."""
        await self.inner.enqueue_intent(intent)


class FaultyBackend(Generic[S]):
    """A ``Backend`` whose store operations fail where its plan says (module doc).

    Its ``checkpointer``, ``leases``, ``outbox`` and ``consumer`` are copies of
    ``inner``'s (same store, same connections) whose primitives go through ``plan`` (a
    :class:`FaultPlan`; default: none strikes) and the faults :meth:`arm` added.
    ``domain`` sets the coordination domain the copies report (default: the store's;
    a simulated process of its own gets one of its own). With ``three_phase``,
    ``outbox`` hides its transactional side, so hand-offs take the three-phase path.
    The wrapper owns nothing: close ``inner``.

    Raises:
        TypeError: a component of ``inner`` is not built on its store base.
    """

    def __init__(
        self,
        inner: Backend[S],
        plan: FaultPlan | None = None,
        *,
        domain: Hashable = None,
        three_phase: bool = False,
    ) -> None:
        self._three_phase = three_phase
        self.inner: Backend[S] = inner
        self.url: str = inner.url
        self.plan: FaultPlan = plan if plan is not None else FaultPlan()
        self.armed: ArmedFaults = ArmedFaults()
        self.struck: list[Fault] = []
        """The faults that struck, in order (each with its operation's phase)."""
        self.dead: bool = False
        """True once a crash fault struck: every later operation raises
        :class:`SimulatedCrash`."""
        self.checkpointer: BaseCheckpointer[S] = self._wrap(
            inner.checkpointer, BaseCheckpointer, domain
        )
        self.leases: BaseLeaseManager = self._wrap(inner.leases, BaseLeaseManager, domain)
        self.faulty_outbox: BaseOutbox = self._wrap(inner.outbox, BaseOutbox, domain)
        self.outbox: Outbox = (
            _ThreePhaseOutbox(self.faulty_outbox) if three_phase else self.faulty_outbox
        )
        self.consumer: BaseConsumer = self._wrap(inner.consumer, BaseConsumer, domain)
        found: object = getattr(inner, "schedules", None)  # a store of flowy 0.3 keeps none
        self.schedules: BaseScheduleStore | None = (
            found if isinstance(found, BaseScheduleStore) else None
        )
        """The wrapped store's schedules, as they are: no fault strikes them."""

    @property
    def limits(self) -> Limits:
        """The limits of the wrapped store (its checkpointer's)."""
        return self.checkpointer.limits

    @property
    def capabilities(self) -> Capabilities:
        """The wrapped store's, without a transactional outbox when ``three_phase``."""
        inner = self.inner.capabilities
        return replace(
            inner,
            transactional_outbox=inner.transactional_outbox and not self._three_phase,
            schedules=inner.schedules and self.schedules is not None,
        )

    async def setup(self) -> int:
        """``setup`` of the wrapped store."""
        return await self.inner.setup()

    def watch(
        self, thread_id: str, *, after: int | None = None, poll: float = 0.2
    ) -> AsyncIterator[WatchEvent[S]]:
        """The wrapped store's ``watch`` of ``thread_id`` from ``after``, reading every
        ``poll`` seconds (no faults: it only reads)."""
        return self.inner.watch(thread_id, after=after, poll=poll)

    def publish_progress(self, thread_id: str, node: str, revision: int, data: object) -> None:
        """The wrapped store's ``publish_progress``: ``data`` from ``node`` of
        ``thread_id`` at ``revision`` goes where that store sends it."""
        publish = getattr(self.inner, "publish_progress", None)
        if callable(publish):
            publish(thread_id, node, revision, data)

    async def aclose(self) -> None:
        """Nothing to release: the wrapper owns nothing (close the wrapped store)."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def arm(
        self,
        phase: Phase,
        kind: FaultKind = FaultKind.UNAVAILABLE,
        *,
        times: int = 1,
        error: Callable[[], BaseException] | None = None,
    ) -> Fault:
        """Make the next ``times`` operations of ``phase`` fail with ``kind`` (before the
        plan is asked); ``error`` makes the exception it raises (default: a
        ``StorageUnavailableError``). Returns the fault."""
        fault = Fault(kind=kind, phase=phase, times=times, error=error)
        self.armed.arm(fault)
        return fault

    def crash(self) -> SimulatedCrash:
        """Mark the process dead; returns the crash to raise."""
        self.dead = True
        return SimulatedCrash("injected fault: the process crashed")

    def _wrap(self, component: Any, base: type, domain: Hashable) -> Any:
        if not isinstance(component, base):
            raise TypeError(
                f"FaultyBackend injects faults at the primitives of the store bases; "
                f"{type(component).__name__} is not a {base.__name__}"
            )
        view = copy.copy(component)
        if domain is not None:
            view.domain = domain
        for name, phase in PRIMITIVES[base].items():
            setattr(view, name, self._intercept(getattr(view, name), name, phase))
        return view

    def _intercept(
        self, call: Callable[..., Awaitable[Any]], name: str, phase: Phase | None
    ) -> Callable[..., Awaitable[Any]]:
        async def operate(*args: Any, **kwargs: Any) -> Any:
            if self.dead:
                raise SimulatedCrash("injected fault: the process is dead")
            op = Operation(phase or _write_phase(args[0]), name, args, kwargs)
            fault = self.armed.take(op.phase) or await self.plan.decide(op)
            kind = None if fault is None else fault.kind
            if fault is not None and kind in _STORE_KINDS:
                self.struck.append(replace(fault, phase=op.phase))
            if kind is FaultKind.CRASH_BEFORE:
                raise self.crash()
            if kind is FaultKind.UNAVAILABLE:
                assert fault is not None
                raise fault.raise_error()
            if kind is FaultKind.REDELIVER:
                if op.phase is not Phase.ACK:
                    raise ValueError(f"a {kind.value} fault strikes an ack, not a {op.phase}")
                return None
            result = await call(*args, **kwargs)
            self.plan.landed(op, result)
            if kind is FaultKind.CRASH_AFTER:
                raise self.crash()
            if kind is FaultKind.UNKNOWN:
                assert fault is not None
                raise fault.raise_error()
            return result

        return operate

    def __repr__(self) -> str:
        return f"FaultyBackend({self.inner!r})"


_STORE_KINDS = frozenset(
    {
        FaultKind.CRASH_BEFORE,
        FaultKind.CRASH_AFTER,
        FaultKind.UNAVAILABLE,
        FaultKind.UNKNOWN,
        FaultKind.REDELIVER,
    }
)
"""The kinds a ``FaultyBackend`` plays itself; the others are its plan's to play."""
