"""What every part of a run segment shares: its mutable state, the services it uses,
results and snapshots built from it, saves with their failure policy, events and the
lifecycle telemetry, terminal results. ``_execution`` builds on this class; the
collaborators of an ``Execution`` (``_routing``, ``_pauses``, ``_superstep``, ``_nested``,
``_handoff``) take the segment and use its methods without a leading underscore, their
shared surface.
"""

from __future__ import annotations

import enum
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Generic, NoReturn, TypeAlias

from . import _tracing
from ._cancel import is_canceled_from_outside, is_terminated
from ._context import RunMetadata
from ._errors import CheckpointSkippedError, ConcurrencyConflictError, LeaseLostError
from ._events import EventSink, EventType, InterruptKind, RunEvent
from ._graph import CheckpointPolicy, Graph
from ._observer import HandoffMetricStatus, LifecycleEvent, LifecycleEventType, Telemetry
from ._results import Reason, RunResult
from ._types import E, ResumeToken, S
from .storage import (
    Checkpointer,
    DurableCheckpointer,
    HandoffStatus,
    Lease,
    LeaseManager,
    Outbox,
    OutboxMessage,
    RunStatus,
    Snapshot,
)
from .storage._adapt import Binding, Merge
from .storage._model import DEFAULT_ROUTE, Route, built_snapshot
from .storage.dialect import confirmed_save, new_write_id

__all__ = [
    "InvariantValidator",
    "Segment",
    "Services",
    "Stop",
    "maybe_await",
    "register_run",
    "require_durable",
    "running_here",
    "unregister_run",
]

logger = logging.getLogger("flowy")

InvariantValidator = Callable[[S], "Awaitable[None] | None"]
"""Called with the state after every step; raising fails the run (invariant_violation)."""

# Threads running in this process, keyed by (store identity, thread id).
_running: set[tuple[object, str]] = set()


def register_run(key: tuple[object, str]) -> bool:
    """Mark a thread as running in this process; False if it already is."""
    if key in _running:
        return False
    _running.add(key)
    return True


def running_here(key: tuple[object, str]) -> bool:
    """Whether a run of that thread is in progress in this process."""
    return key in _running


def unregister_run(key: tuple[object, str]) -> None:
    """Forget a running thread (its run ended or never started)."""
    _running.discard(key)


async def maybe_await(value: Any) -> Any:
    """``await value`` if it is awaitable, else ``value`` (sync or async callbacks)."""
    if inspect.isawaitable(value):
        return await value
    return value


def require_durable(
    durable: DurableCheckpointer[Any] | None, store: str, what: str
) -> DurableCheckpointer[Any]:
    """``durable``; ``TypeError`` naming ``what`` and the ``store`` class if ``None``
    (the store keeps no timers, signals or journal)."""
    if durable is None:
        raise TypeError(
            f"{what} needs a store that keeps timers, signals and an activity journal "
            f"(flowy.storage.DurableCheckpointer); {store} does not"
        )
    return durable


class _Unread(enum.Enum):
    UNREAD = "unread"


UNREAD = _Unread.UNREAD
"""The head was not read with the lease: load it."""

Loaded: TypeAlias = tuple[Snapshot[S], int] | _Unread | None
"""The head read with a run's lease (``None``: no thread), or :data:`UNREAD`."""


@dataclass(slots=True)
class Held(Generic[S]):
    """A run lease a ``Worker`` took on ``thread_id`` with the head it read alongside
    (``Loaded``), to decide on a hand-off message without another read: the resume
    it then calls in the same context (:data:`held_run`) uses them instead of taking
    the lease and reading the head again. ``taken``: a resume took them over (its run
    releases the lease); until then the worker releases it. ``message``: the claimed
    message the run's last save acknowledges where the store can
    (``Capabilities.ack_on_save``); ``acked``: it did."""

    thread_id: str
    lease: Lease
    loaded: Loaded[S]
    taken: bool = False
    message: OutboxMessage | None = None
    acked: bool = False


held_run: ContextVar[Held[Any] | None] = ContextVar("flowy_held_run", default=None)
"""The lease and head a worker holds for the resume it is about to call."""


class Stop(Exception):
    """Ends the execution loop with a finished result."""

    def __init__(self, result: RunResult[Any, Any]) -> None:
        self.result = result


@dataclass(frozen=True, slots=True)
class Services(Generic[S, E]):
    """What a segment uses of its runner: the graph, the store as the runner bound it
    (its paths chosen once, from its capabilities; ``None``: nothing is saved), the
    lease manager, the clock and the telemetry."""

    graph: Graph[S, E]
    store: Binding[S] | None
    lease_manager: LeaseManager | None
    clock: Callable[[], float]
    telemetry: Telemetry
    checkpointer: Checkpointer[S] | None = field(init=False)
    outbox: Outbox | None = field(init=False)
    store_name: str = field(init=False)
    """The class of the store's checkpointer (spans and messages say it)."""
    acquire_with_load: bool = field(init=False)
    """A leased segment takes its lease and reads the head in one round trip
    (``Capabilities.acquire_with_load``)."""
    release_on_save: bool = field(init=False)
    """The save that ends a leased segment gives the lease up in its own write
    (``Capabilities.release_on_save``): no separate release."""
    ack_on_save: bool = field(init=False)
    """That save also acknowledges the hand-off message a worker resumed the segment
    for (``Capabilities.ack_on_save``): no separate ack."""

    def __post_init__(self) -> None:
        store = self.store
        set_ = object.__setattr__
        set_(self, "checkpointer", store.checkpointer if store is not None else None)
        set_(self, "outbox", store.outbox if store is not None else None)
        set_(
            self,
            "store_name",
            type(store.checkpointer).__name__ if store is not None else "none",
        )
        own_leases = (
            store is not None
            and self.lease_manager is not None
            and self.lease_manager is store.leases
        )
        caps = store.capabilities if store is not None else None
        set_(self, "release_on_save", own_leases and caps is not None and caps.release_on_save)
        set_(self, "acquire_with_load", own_leases and caps is not None and caps.acquire_with_load)
        set_(self, "ack_on_save", self.release_on_save and caps is not None and caps.ack_on_save)


class Segment(Generic[S, E]):
    """The state of one run segment (a start or a resume) and its shared machinery."""

    interrupt_kind: InterruptKind | None
    in_node: bool = False
    """A node of the run is being awaited (an interrupt cancels it)."""
    step_state: Any = None
    """The state before the current step (a paused superstep goes back to it)."""

    def __init__(
        self,
        services: Services[S, E],
        key: tuple[object, str],
        state: S,
        pointer: str,
        revision: int,
        meta: RunMetadata,
        lease: Lease | None,
        lease_ttl: float,
        invariant: InvariantValidator[S] | None,
        sink: EventSink[S, E] | None,
        signal_cursors: dict[str, int] | None = None,
        lineage: tuple[str, int] = ("", 0),
    ) -> None:
        self.services = services
        self.graph = services.graph
        self.cp = services.checkpointer
        self.store = services.store_name
        self.telemetry = services.telemetry
        self.clock = services.clock
        self.key = key
        self.thread_id = meta.thread_id
        self.state: S = state
        self.pointer = pointer
        self.revision = revision
        self.meta = meta
        self.lease: Lease | None = lease
        self.lease_ttl = lease_ttl
        self.released = False
        """The segment's last save gave its lease up (``Services.release_on_save``)."""
        self.held: Held[S] | None = None
        """The lease and head a worker took for this segment, with the message its last
        save acknowledges (``Services.ack_on_save``)."""
        self.invariant = invariant
        self.sink = sink
        self.effects: list[E] = []
        self.interrupt_kind = None
        self.cancels_sent = 0  # cancellations an interrupt sent to the run's own task
        self.attempts: dict[str, int] = meta.retry_counts
        self.signal_cursors: dict[str, int] = signal_cursors if signal_cursors is not None else {}
        self.lineage = lineage
        # Where the run is inside a subgraph (saved with every snapshot), and what a
        # resume of a wait inside one brought: its signal, or its deadline.
        self.nested: dict[str, Any] = {}
        self.nested_wake: tuple[Any, bool] | None = None
        self.skip_saves = self.graph.checkpoint_policy is CheckpointPolicy.SKIP_ON_SAVE_ERROR
        # Where the segment started, to notice one that hands off without progress.
        self.start_pointer = pointer
        self.start_state = state
        self.progress_sent = False  # progress went to the store since the last save

    # -- the store's optional parts (chosen when the runner was built) -----------------
    def durable(self, what: str) -> DurableCheckpointer[S]:
        """The store's timers and inbox; ``TypeError`` naming ``what`` if it keeps none."""
        store = self.services.store
        durable = store.durable if store is not None else None
        return require_durable(durable, self._store_class(), what)

    def _journal(self, what: str) -> DurableCheckpointer[S]:
        """The store's activity journal; ``TypeError`` naming ``what`` if it keeps none."""
        store = self.services.store
        journal = store.journal if store is not None else None
        return require_durable(journal, self._store_class(), what)

    def _store_class(self) -> str:
        store = self.services.store
        return type(store.backend.checkpointer).__name__ if store is not None else "NoneType"

    @property
    def merge(self) -> Merge | None:
        """The store codec's ``merge``, which validates merged fields (``None``: none)."""
        store = self.services.store
        return store.merge if store is not None else None

    # -- events and telemetry --------------------------------------------------------
    def emit(self, type_: EventType, **kw: Any) -> None:
        if self.sink is not None:
            self.sink.emit(RunEvent(type_, self.thread_id, **kw))

    def progress_sender(self) -> Callable[[Any], None]:
        """What ``flowy.live.progress`` calls in this run's nodes: the run's stream (if
        it is streamed) and the thread's watchers (through the store)."""
        sink, thread_id, meta = self.sink, self.thread_id, self.meta
        store = self.services.store
        publish = store.progress if store is not None else None

        def send(data: Any) -> None:
            if publish is not None:
                publish(thread_id, meta.node, self.revision, data)
                self.progress_sent = True
            if sink is not None:
                sink.emit(RunEvent(EventType.PROGRESS, thread_id, node=meta.node, data=data))

        return send

    def publish(
        self,
        type_: LifecycleEventType,
        *,
        reason: str = "",
        status: str = "",
        error: BaseException | str | None = None,
        revision: int | None = None,
    ) -> None:
        text = "" if error is None else error if isinstance(error, str) else _describe(error)
        self.telemetry.publish(
            LifecycleEvent(
                type_,
                self.thread_id,
                revision=self.revision if revision is None else revision,
                reason=reason,
                status=status,
                error=text,
            )
        )

    def count(
        self, status: HandoffMetricStatus, type_: LifecycleEventType, error: BaseException
    ) -> None:
        """Count a failed hand-off under its metric label and tell the observers."""
        self.telemetry.count_handoff(status)
        self.publish(type_, status=status.value, error=error)

    # -- results and snapshots -------------------------------------------------------
    def result(
        self,
        status: RunStatus,
        reason: str,
        *,
        token: bool = False,
        error: BaseException | None = None,
        handoff_status: HandoffStatus = HandoffStatus.NONE,
    ) -> RunResult[S, E]:
        return RunResult(
            thread_id=self.thread_id,
            state=self.state,
            status=status,
            reason=reason,
            execution_pointer=self.pointer,
            resume_token=ResumeToken(self.thread_id, self.revision) if token else None,
            effects=self.effects,
            step_count=self.meta.step_count,
            total_steps=self.meta.total_steps,
            segment=self.meta.segment,
            budget_counts=dict(self.meta.budget_counts),
            handoff_status=handoff_status,
            error=error,
            revision=self.revision,
        )

    def snapshot(
        self,
        status: RunStatus,
        reason: str,
        handoff_status: HandoffStatus = HandoffStatus.NONE,
        pending_at: float | None = None,
        *,
        wake_at: float | None = None,
        waiting_for: str = "",
        on_timeout: str = "",
        route: Route = DEFAULT_ROUTE,
    ) -> Snapshot[S]:
        meta = self.meta
        lineage = self.lineage
        return built_snapshot(
            {
                "thread_id": self.thread_id,
                "state": self.state,
                "execution_pointer": self.pointer,
                "status": status,
                "reason": reason,
                "revision": 0,
                "step_count": meta.step_count,
                "segment": meta.segment,
                "total_steps": meta.total_steps,
                "budget_counts": dict(meta.budget_counts),
                "metadata": dict(meta.metadata),
                "handoff_status": handoff_status,
                "handoff_pending_at": pending_at,
                "updated_at": self.clock(),
                "write_id": new_write_id(),
                "effects": tuple(self.effects),
                "retry_counts": dict(self.attempts),
                "wake_at": wake_at,
                "waiting_for": waiting_for,
                "on_timeout": on_timeout,
                "signal_cursors": dict(self.signal_cursors),
                "graph_version": self.graph.version,
                "parent_thread_id": lineage[0],
                "parent_revision": lineage[1],
                "route": route,
                "nested": dict(self.nested),
            }
        )

    # -- saves -----------------------------------------------------------------------
    async def flush_progress(self) -> None:
        """Let the progress sent since the last save leave before the next save (so a
        watcher hears it before that snapshot)."""
        self.progress_sent = False
        store = self.services.store
        if store is not None and store.flush_progress is not None:
            await store.flush_progress()

    async def save(self, snap: Snapshot[S], *, last: bool = False) -> None:
        """Save ``snap``; ``last``: the save that ends the segment, which gives the
        lease up in its own write where the store can (``Services.release_on_save``)."""
        assert self.cp is not None
        if self.progress_sent:
            await self.flush_progress()
        release = last and self.lease is not None and self.services.release_on_save
        held = self.held
        ack = held.message if release and held is not None and self.services.ack_on_save else None
        tracing = _tracing.active()
        if tracing is None:
            self.revision = await confirmed_save(
                self.cp, self.revision, snap, lease=self.lease, release=release, ack=ack
            )
            self.released = release
            if ack is not None:
                held.acked = True  # pyright: ignore[reportOptionalMemberAccess]
            return
        started, outcome = time.perf_counter(), "ok"
        try:
            self.revision = await confirmed_save(
                self.cp, self.revision, snap, lease=self.lease, release=release, ack=ack
            )
            self.released = release
            if ack is not None:
                held.acked = True  # pyright: ignore[reportOptionalMemberAccess]
        except ConcurrencyConflictError:
            outcome = "conflict"
            raise
        except LeaseLostError:
            outcome = "lease_lost"
            raise
        except BaseException:
            outcome = "error"
            raise
        finally:
            tracing.save(self.thread_id, self.store, time.perf_counter() - started, outcome)

    async def stopped_outside(self, exc: BaseException) -> Stop | None:
        """After a refused save: if a cancel or a terminate (``flowy.operations``) wrote
        the head, the run ends with that head's status and reason (a cancel's result
        carries the head's resume token); else ``None``. Only a refused save reads the
        head, so a step costs no extra read."""
        if self.cp is None:
            return None
        try:
            head, revision = await self.cp.load(self.thread_id)
        except Exception:  # noqa: BLE001 - unsure: the refusal is reported as it is
            return None
        canceled = is_canceled_from_outside(head.status, head.reason)
        if not canceled and not is_terminated(head.status, head.reason):
            return None
        self.revision = revision
        self.state = head.state
        self.pointer = head.execution_pointer
        if canceled:
            result = self.result(RunStatus.CANCELED, head.reason, token=True)
            self.emit(
                EventType.CONTEXT_CANCELED,
                reason=head.reason,
                execution_pointer=self.pointer,
                resume_token=result.resume_token,
            )
        else:
            if isinstance(exc, LeaseLostError):
                self.interrupt_kind = "lease_lost"  # not ours to release any more
            result = self.result(RunStatus.FAILED, head.reason, error=exc)
            self.emit(EventType.FAILED, reason=head.reason, execution_pointer=self.pointer)
        logger.info("flowy: thread %r was stopped from outside: %s", self.thread_id, head.reason)
        return Stop(result)

    def lease_lost(self, exc: BaseException) -> Stop:
        self.interrupt_kind = "lease_lost"
        tracing = _tracing.active()
        if tracing is not None:
            tracing.lease_lost(self.thread_id)
        self.publish(LifecycleEventType.LEASE_LOST, reason=Reason.LEASE_LOST, error=exc)
        result = self.result(RunStatus.FAILED, Reason.LEASE_LOST, error=exc)
        self.emit(EventType.FAILED, reason=result.reason, execution_pointer=self.pointer)
        return Stop(result)

    def skipped(self, kind: str, exc: BaseException) -> CheckpointSkippedError:
        """SKIP_ON_SAVE_ERROR skipped the ``kind`` checkpoint: event, observer, log."""
        reason = f"{kind}_checkpoint_skipped"
        self.emit(
            EventType.CHECKPOINT_FAILED,
            reason=reason,
            execution_pointer=self.pointer,
            node=self.pointer,
        )
        self.publish(LifecycleEventType.CHECKPOINT_SKIPPED, reason=reason, error=exc)
        logger.warning("flowy: %s checkpoint of %r skipped: %s", kind, self.thread_id, exc)
        skipped = CheckpointSkippedError(
            f"the {kind} checkpoint of thread {self.thread_id!r:.200} was skipped: {exc}"
        )
        skipped.__cause__ = exc
        return skipped

    def save_failed(self, kind: str, exc: BaseException) -> NoReturn:
        """A hard save failure (FAIL_ON_SAVE_ERROR): a failed result, the same reason on
        the result, the event and the observer."""
        reason = f"{kind}_save_failed"
        self.publish(LifecycleEventType.CHECKPOINT_FAILED, reason=reason, error=exc)
        result = self.result(RunStatus.FAILED, reason, error=exc)
        self.emit(EventType.FAILED, reason=reason, execution_pointer=self.pointer)
        raise Stop(result) from exc

    async def save_or_stop(
        self, snap: Snapshot[S], kind: str, *, last: bool = False
    ) -> BaseException | None:
        """Save ``snap``: ``None`` once persisted, the ``CheckpointSkippedError`` when the
        policy skipped it; a hard failure raises ``Stop`` (reason ``{kind}_save_failed``).
        ``last``: it ends the segment (see :meth:`save`)."""
        try:
            await self.save(snap, last=last)
            return None
        except LeaseLostError as exc:
            raise await self.stopped_outside(exc) or self.lease_lost(exc) from exc
        except Exception as exc:  # any store failure: the checkpoint policy decides
            if isinstance(exc, ConcurrencyConflictError):
                stop = await self.stopped_outside(exc)
                if stop is not None:
                    raise stop from exc
            if self.skip_saves:
                return self.skipped(kind, exc)
            self.save_failed(kind, exc)

    async def retention(self, base_reason: str, kind: str) -> tuple[str, BaseException | None]:
        """In-loop prune after a persisted suspend/handoff/cancel save."""
        limit = self.graph.retention_limit
        if limit is None or self.cp is None:
            return base_reason, None
        try:
            await self.cp.prune(self.thread_id, limit)
        except Exception as exc:  # noqa: BLE001 - reported on the result; the run is not failed
            self.publish(LifecycleEventType.RETENTION_FAILED, reason=kind, error=exc)
            return f"{kind}_retention_failed", exc
        return base_reason, None

    async def _terminal(self, status: RunStatus, reason: str, event: EventType) -> RunResult[S, E]:
        """Save a completed/failed snapshot and build the result."""
        kind = "completed" if status is RunStatus.COMPLETED else "failed"
        error: BaseException | None = None
        if self.cp is not None:
            error = await self.save_or_stop(self.snapshot(status, reason), kind, last=True)
            if error is not None:
                reason = f"{kind}_checkpoint_skipped"
        result = self.result(status, reason, error=error)
        self.emit(event, reason=reason, execution_pointer=self.pointer, state=self.state)
        return result

    async def fail(self, reason: str, error: BaseException | None = None) -> RunResult[S, E]:
        result = await self._terminal(RunStatus.FAILED, reason, EventType.FAILED)
        if error is not None and result.error is None:
            result.error = error
        return result

    def fail_unsaved(self, reason: str, error: BaseException) -> RunResult[S, E]:
        """A node/reducer/router exception: nothing is saved; the last checkpoint stays."""
        result = self.result(RunStatus.FAILED, reason, error=error)
        self.emit(EventType.FAILED, reason=reason, execution_pointer=self.pointer)
        return result


def _describe(error: BaseException) -> str:
    """``Type: message`` of an error (what observers and logs get)."""
    return f"{type(error).__name__}: {error}"
