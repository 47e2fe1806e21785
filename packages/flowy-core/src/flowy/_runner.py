"""The Runner: the public entry point that starts, resumes, streams and recovers runs.

``Runner.start`` / ``Runner.resume`` run a segment to its end and return the
authoritative ``RunResult``; ``stream`` / ``resume_stream`` do the same in a task the
returned ``StreamHandle`` owns. ``evaluate_resume``, ``resume``, ``resume_stream`` and
recovery share one preflight (``_preflight``), in the specification's order: token
validation → load + OCC → graph-version migrations → after_load → the wake of a
waiting thread (its signal or timeout route) → overlay → segment reset (budget counts
kept) → run-metadata merge → resume-target policy → pointer validation → execute.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
import warnings
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Generic, cast

from ._cancel import StopOutcome, cancel_thread, terminate_thread
from ._context import RunBindings, RunMetadataInput
from ._errors import (
    ThreadNotFoundError,
)
from ._events import EventSink, StreamHandle, StreamStart
from ._execution import Execution
from ._fork import fork_revision
from ._graph import Graph
from ._handoff import recover_handoff
from ._observer import GLOBAL, LifecycleObserver, Telemetry
from ._plan import ResumeTargetPolicy
from ._preflight import AfterLoad, RunPreparation, StateMerge, check_run_lease
from ._results import HandoffRecoveryResult, ResumeDecision, RunResult
from ._segment import InvariantValidator, Services, require_durable
from ._types import JSON, E, ResumeToken, S
from ._waits import send_signal
from .storage import (
    Backend,
    Checkpointer,
    LeaseManager,
    Outbox,
    Signal,
    Snapshot,
)
from .storage._adapt import Binding, backend_of, bind, opened_backend
from .storage._model import DEFAULT_QUEUE
from .storage.dialect import validate_thread_id

__all__ = [
    "DEFAULT_HANDOFF_STALE_AFTER",
    "DEFAULT_LEASE_TTL",
    "Runner",
    "default_owner",
]

logger = logging.getLogger("flowy")

DEFAULT_HANDOFF_STALE_AFTER = 300.0
"""Seconds after which a pending hand-off counts as stale (5 minutes)."""

DEFAULT_LEASE_TTL = 30.0
"""Seconds of the run lease a runner built on a ``Backend`` takes by default."""


def default_owner() -> str:
    """A lease owner naming this process: ``host-pid``."""
    return f"{socket.gethostname()}-{os.getpid()}"


def _check_queues(graph: Graph[Any, Any], store: Binding[Any]) -> None:
    """Refuse a graph whose hand-offs go to other queues than the default one by default,
    on a store that would put their messages in the default queue."""
    if store.outbox is None or store.capabilities.queues:
        return
    others = sorted(graph.queues() - {DEFAULT_QUEUE})
    if others:
        raise TypeError(
            f"the graph hands off to queue {others[0]!r} (compile(queue=...) or "
            f"add_node(queue=...)), but {type(store.backend).__name__} keeps no queues "
            "(capabilities.queues is false): every message would wait in the default queue; "
            "use a store with queues, or drop the queue from the graph"
        )


class Runner(Generic[S, E]):
    """Runs a compiled graph against a store.

    The runner talks to one ``Backend``: it reads the backend's ``capabilities`` once,
    here, and chooses its paths from them. Every run holds a fenced lease from the
    backend's lease manager, renewed about every ttl/3 and released after the terminal
    save; a checkpointer that does not fence those leases itself (components of two
    stores) is wrapped in a ``LeaseGuardCheckpointer`` (safe within one process only).
    A hand-off is one write when the store's outbox is transactional, else the
    three-phase FSM. When the checkpointer has no codec and the graph knows its state
    type (``GraphBuilder(state=...)``), snapshots decode into that type.

    Args:
        graph: the compiled graph to run.
        store: a ``Backend`` (``await flowy.connect(url)``, or components wrapped with
            ``flowy.storage.as_backend``), or ``None`` to run without saving anything
            (results then carry no resume token). A bare checkpointer is deprecated:
            it is wrapped with ``as_backend``, with a ``DeprecationWarning``.
        lease_manager: deprecated (``as_backend(checkpointer, leases=...)``): a lease
            manager replacing the backend's. With one given this way, or with loose
            components, and no ``run_lease``, every start/resume/stream needs its own
            ``run_lease=(owner, ttl)``.
        handoff_outbox: deprecated (``as_backend(checkpointer, outbox=...)``): an
            outbox replacing the backend's.
        run_lease: ``(owner, ttl_seconds)`` of each run's lease. On a backend of its
            own (not loose components) the default is this process's ``host-pid`` for
            ``DEFAULT_LEASE_TTL`` seconds.
        after_load: ``after_load(state) -> state`` (sync or async), applied to every
            loaded state before a resume uses it.
        handoff_stale_after: seconds after which a pending hand-off counts as stale and
            may be recovered (the default of ``stale_after`` in the recovery methods).
        clock: the time source, in seconds since the epoch: snapshots' ``updated_at``,
            hand-off times and staleness.
        observer: this runner's lifecycle observer (``metrics()`` gives its counters;
            both also feed the process-wide ones).

    Raises:
        ValueError: ``run_lease`` was given without a lease manager.
        LeaseRequiredError: ``run_lease`` is not a non-empty owner and a positive ttl.
        TypeError: the graph has a state type, but the checkpointer has no codec and no
            ``with_codec`` to get one; or the graph names a queue other than the default
            one (``compile(queue=...)``, ``add_node(queue=...)``) and the store has an
            outbox but keeps no queues.
    """

    def __init__(
        self,
        graph: Graph[S, E],
        store: Backend[S] | Checkpointer[S] | None = None,
        *,
        lease_manager: LeaseManager | None = None,
        handoff_outbox: Outbox | None = None,
        run_lease: tuple[str, float] | None = None,
        after_load: AfterLoad[S] | None = None,
        handoff_stale_after: float = DEFAULT_HANDOFF_STALE_AFTER,
        clock: Callable[[], float] = time.time,
        observer: LifecycleObserver | None = None,
    ) -> None:
        self.graph = graph
        self.backend: Backend[S] | None = None
        """The store the runner talks to (``None``: it saves nothing)."""
        store_binding: Binding[S] | None = None
        if store is not None:
            backend = cast(Backend[S], backend_of(store, lease_manager, handoff_outbox))
            store_binding = bind(backend, graph.state_type)
            self.backend = backend
            _check_queues(graph, store_binding)
            lease_manager = store_binding.leases
            if run_lease is None and opened_backend(store):
                run_lease = (default_owner(), DEFAULT_LEASE_TTL)
        elif lease_manager is not None or handoff_outbox is not None:
            warnings.warn(
                "Runner(graph, None, lease_manager=..., handoff_outbox=...) is deprecated: "
                "a runner without a store saves nothing, so it hands nothing off",
                DeprecationWarning,
                stacklevel=2,
            )
        if run_lease is not None:
            check_run_lease(run_lease, lease_manager)
        self._store: Binding[S] | None = store_binding
        self._store_key: object = store_binding.domain if store_binding else id(self)
        self.checkpointer: Checkpointer[S] | None = (
            store_binding.checkpointer if store_binding else None
        )
        self.lease_manager = lease_manager
        self.system_leases: bool = store_binding is not None and (
            store_binding.capabilities.system_leases
        )
        """Whether the lease manager takes flowy's own leases (the recovery leader's)."""
        self.handoff_outbox: Outbox | None = store_binding.outbox if store_binding else None
        self.run_lease = run_lease
        self.after_load = after_load
        self.handoff_stale_after = handoff_stale_after
        self.clock = clock
        self.telemetry: Telemetry = Telemetry(observer, GLOBAL)
        self._services: Services[S, E] = Services(
            graph, store_binding, lease_manager, clock, self.telemetry
        )
        self._prep: RunPreparation[S, E] = RunPreparation(
            graph, self._services, self._store_key, run_lease, after_load, handoff_stale_after
        )
        self._tasks: set[asyncio.Task[Any]] = set()

    def metrics(self) -> dict[str, dict[str, int]]:
        """This runner's counters (the process-wide ones are ``flowy.lifecycle.metrics()``)."""
        return self.telemetry.metrics()

    # ------------------------------------------------------------------ public API
    async def start(
        self,
        thread_id: str,
        state: S,
        *,
        bindings: RunBindings | None = None,
        run_lease: tuple[str, float] | None = None,
        metadata: dict[str, Any] | None = None,
        invariant_validator: InvariantValidator[S] | None = None,
    ) -> RunResult[S, E]:
        """Run a new thread from the entry node until it finishes, suspends or hands off.

        Raises before running anything: ``InvalidThreadIdError``,
        ``ThreadAlreadyRunningError``, ``LeaseRequiredError``, ``ThreadLeaseBusyError``,
        ``ConcurrencyConflictError`` (the thread already exists: resume it instead).

        Args:
            thread_id: the new thread's id (``validate_thread_id`` says which are valid).
            state: the initial state.
            bindings: the values nodes read with ``binding(key)`` (never saved).
            run_lease: ``(owner, ttl_seconds)`` of this run's lease, instead of the
                runner's; required when the runner has a lease manager but no
                ``run_lease`` of its own.
            metadata: JSON run metadata, saved with every snapshot
                (``run_metadata().metadata``).
            invariant_validator: called with the state after every step (sync or
                async); raising fails the run with ``invariant_violation``.

        Returns:
            The terminal result of the run (the source of truth).
        """
        ex = await self._prep.prepare_start(
            thread_id, state, bindings, run_lease, metadata, invariant_validator, None
        )
        return await ex.run()

    def stream(
        self,
        thread_id: str,
        state: S,
        *,
        bindings: RunBindings | None = None,
        run_lease: tuple[str, float] | None = None,
        metadata: dict[str, Any] | None = None,
        invariant_validator: InvariantValidator[S] | None = None,
        max_buffer: int = 1024,
    ) -> StreamStart[S, E]:
        """Like ``start`` but run in a task; ``await`` it (or ``async with`` it) for the
        ``StreamHandle`` of its events.

        Args:
            thread_id: the new thread's id (``validate_thread_id`` says which are valid).
            state: the initial state.
            bindings: the values nodes read with ``binding(key)`` (never saved).
            run_lease: ``(owner, ttl_seconds)`` of this run's lease, instead of the
                runner's; required when the runner has a lease manager but no
                ``run_lease`` of its own.
            metadata: JSON run metadata, saved with every snapshot
                (``run_metadata().metadata``).
            invariant_validator: called with the state after every step (sync or
                async); raising fails the run with ``invariant_violation``.
            max_buffer: events buffered for a slow consumer; when full, the oldest
                progress event is dropped (never the terminal one).
        """

        async def opening() -> StreamHandle[S, E]:
            sink: EventSink[S, E] = EventSink(max_buffer)
            ex = await self._prep.prepare_start(
                thread_id, state, bindings, run_lease, metadata, invariant_validator, sink
            )
            return self._launch(ex, sink)

        return StreamStart(opening())

    async def resume(
        self,
        token: ResumeToken,
        *,
        state_overlay: S | Mapping[str, Any] | None = None,
        merge: StateMerge[S] | None = None,
        bindings: RunBindings | None = None,
        run_metadata: RunMetadataInput | None = None,
        resume_target_policy: ResumeTargetPolicy[S] | None = None,
        invariant_validator: InvariantValidator[S] | None = None,
        run_lease: tuple[str, float] | None = None,
    ) -> RunResult[S, E]:
        """Resume the snapshot ``token`` names, if it is still the thread's head.

        ``state_overlay`` is merged into the loaded state with ``merge``; without one, a
        mapping of fields is merged field by field into a dataclass, TypedDict, msgspec
        Struct or pydantic model state (each named field replaced) and the result
        validated by the store's codec (an unknown field or a value that does not fit is
        a ``ValueError`` naming it), anything else goes through the graph's reducer.
        Raises before running anything: ``InvalidResumeTokenError``,
        ``ConcurrencyConflictError`` (stale or zero revision: see ``evaluate_resume``),
        ``ThreadNotFoundError``, ``ThreadCompletedError``, ``HandoffPendingError``,
        ``HandoffOrphanedError``, ``InvalidResumePlanError``, ``UnknownNodeError``, lease
        errors, the overlay's ``ValueError``.

        Args:
            token: the resume token of the snapshot to continue from.
            state_overlay: values merged into the loaded state before the run.
            merge: ``merge(loaded_state, overlay) -> state`` for ``state_overlay``.
            bindings: the values nodes read with ``binding(key)`` (never saved).
            run_metadata: budget counts and metadata merged into the persisted ones;
                each given entry replaces the stored one.
            resume_target_policy: ``policy(state, current_pointer) -> (state, plan)``
                (sync or async): where to continue, ``resume_current()`` or
                ``resume_to(node)``. Without one, a completed thread or a pointer the
                graph no longer has is refused.
            invariant_validator: called with the state after every step (sync or
                async); raising fails the run with ``invariant_violation``.
            run_lease: ``(owner, ttl_seconds)`` of this run's lease, instead of the
                runner's.

        Returns:
            The terminal result of the resumed segment.
        """
        ex = await self._prep.prepare_resume(
            token,
            state_overlay,
            merge,
            bindings,
            run_metadata,
            resume_target_policy,
            invariant_validator,
            run_lease,
            None,
        )
        return await ex.run()

    def resume_stream(
        self,
        token: ResumeToken,
        *,
        state_overlay: S | Mapping[str, Any] | None = None,
        merge: StateMerge[S] | None = None,
        bindings: RunBindings | None = None,
        run_metadata: RunMetadataInput | None = None,
        resume_target_policy: ResumeTargetPolicy[S] | None = None,
        invariant_validator: InvariantValidator[S] | None = None,
        run_lease: tuple[str, float] | None = None,
        max_buffer: int = 1024,
    ) -> StreamStart[S, E]:
        """Like ``resume`` but run in a task; ``await`` it (or ``async with`` it) for the
        ``StreamHandle`` of its events.

        Args:
            token: the resume token of the snapshot to continue from.
            state_overlay: values merged into the loaded state before the run.
            merge: ``merge(loaded_state, overlay) -> state`` for ``state_overlay``.
            bindings: the values nodes read with ``binding(key)`` (never saved).
            run_metadata: budget counts and metadata merged into the persisted ones;
                each given entry replaces the stored one.
            resume_target_policy: ``policy(state, current_pointer) -> (state, plan)``
                (sync or async): where to continue, ``resume_current()`` or
                ``resume_to(node)``. Without one, a completed thread or a pointer the
                graph no longer has is refused.
            invariant_validator: called with the state after every step (sync or
                async); raising fails the run with ``invariant_violation``.
            run_lease: ``(owner, ttl_seconds)`` of this run's lease, instead of the
                runner's.
            max_buffer: events buffered for a slow consumer; when full, the oldest
                progress event is dropped (never the terminal one).
        """

        async def opening() -> StreamHandle[S, E]:
            sink: EventSink[S, E] = EventSink(max_buffer)
            ex = await self._prep.prepare_resume(
                token,
                state_overlay,
                merge,
                bindings,
                run_metadata,
                resume_target_policy,
                invariant_validator,
                run_lease,
                sink,
            )
            return self._launch(ex, sink)

        return StreamStart(opening())

    async def head(self, thread_id: str) -> tuple[Snapshot[S], ResumeToken]:
        """The latest snapshot of ``thread_id`` (its state decoded into the graph's state
        type) and the resume token that names it: what a page showing the thread needs.

        Raises ``ThreadNotFoundError``, ``InvalidThreadIdError``, and ``TypeError`` on a
        runner without a checkpointer.
        """
        if self.checkpointer is None:
            raise TypeError("this runner has no checkpointer: there is no stored thread to read")
        snapshot, revision = await self.checkpointer.load(validate_thread_id(thread_id))
        return snapshot, ResumeToken(thread_id, revision)

    async def signal(
        self,
        thread_id: str,
        name: str,
        payload: JSON = None,
        *,
        signal_id: str | None = None,
    ) -> Signal:
        """Send the signal ``name`` with ``payload`` to ``thread_id``.

        The signal is stored in the thread's inbox in the same store, once per
        ``signal_id`` (a repeat returns the first as stored: give the webhook's event id
        and retries are harmless; default: a random id). A thread waiting for ``name``
        (``flowy.wait_for``) is woken through the outbox: a ``flowy.Worker`` resumes it
        with the payload. Signals to a thread that is not waiting for them are kept in
        order, and its next ``wait_for(name)`` takes the first one.

        Raises ``ThreadNotFoundError`` (no such thread), ``ThreadCompletedError`` (it
        completed or failed), ``ValueError`` / ``TypeError`` for a bad name, id or
        payload (a JSON value of at most ``Limits.max_signal_bytes`` encoded, 256 KiB by
        default, and 100 levels deep), ``LimitError`` (a ``ValueError``) when the
        thread's inbox is full (``Limits.max_pending_signals``), ``TypeError`` when the
        store keeps no signals.

        Returns:
            The signal as stored, with its ``seq`` in the thread's inbox.
        """
        store = self._store
        durable = store.durable if store is not None else None
        kind = type(store.backend.checkpointer).__name__ if store is not None else "NoneType"
        return await send_signal(
            require_durable(durable, kind, "Runner.signal"),
            self.handoff_outbox,
            thread_id,
            name,
            payload,
            signal_id,
            self.clock(),
        )

    async def cancel(self, thread_id: str, *, reason: str | None = None) -> StopOutcome:
        """Cancel ``thread_id`` from this process, whichever process runs it, with
        ``reason`` kept in its head: the same as ``flowy.operations.cancel`` on this
        runner's store (its docstring has the contract)."""
        return await cancel_thread(
            self._stored("Runner.cancel"), self.lease_manager, thread_id, reason, clock=self.clock
        )

    async def terminate(self, thread_id: str, *, reason: str | None = None) -> StopOutcome:
        """Terminate ``thread_id``, with ``reason`` kept in its head: the same as
        ``flowy.operations.terminate`` on this runner's store (its docstring has the
        contract)."""
        return await terminate_thread(
            self._stored("Runner.terminate"),
            self.lease_manager,
            thread_id,
            reason,
            clock=self.clock,
        )

    def _stored(self, what: str) -> Checkpointer[S]:
        if self.checkpointer is None:
            raise TypeError(f"{what} needs a runner with a store: this one saves nothing")
        return self.checkpointer

    async def fork(
        self,
        thread_id: str,
        *,
        at_revision: int,
        new_thread_id: str,
        state_overlay: S | Mapping[str, Any] | None = None,
        merge: StateMerge[S] | None = None,
        resume_at: str | None = None,
    ) -> ResumeToken:
        """Start the new thread ``new_thread_id`` from revision ``at_revision`` of
        ``thread_id``; the parent is never touched.

        The fork's first revision is a copy of that snapshot (its state, budgets,
        metadata and step counts), brought to this graph's version by its declared
        migrations, with ``state_overlay`` merged in as a resume merges one and
        ``resume_at`` as its pointer (default: the snapshot's). It is saved suspended
        (reason ``forked``) with its lineage (``parent_thread_id``, ``parent_revision``);
        resume it with the returned token. It has an inbox and an activity journal of
        its own: its activities are called again.

        Raises ``ThreadNotFoundError`` (no such thread, or revision ``at_revision`` is
        not in its history: pruned, or never saved), ``ConcurrencyConflictError``
        (``new_thread_id`` exists), ``GraphVersionMismatchError``, ``UnknownNodeError``
        (``resume_at`` is not a node), ``InvalidThreadIdError``, ``ValueError`` (a
        revision below 1).

        Args:
            thread_id: the thread to fork (it is not touched).
            at_revision: the revision to copy.
            new_thread_id: the fork's thread id (it must not exist).
            state_overlay: values merged into the copied state, as ``resume`` merges
                them.
            merge: ``merge(state, overlay) -> state`` for ``state_overlay``.
            resume_at: the node the fork resumes at (default: the revision's pointer).
        """
        validate_thread_id(thread_id)
        validate_thread_id(new_thread_id)
        if isinstance(at_revision, bool) or not isinstance(at_revision, int) or at_revision < 1:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f"at_revision must be an int >= 1, got {at_revision!r:.40}")
        return await fork_revision(
            self._prep, thread_id, at_revision, new_thread_id, state_overlay, merge, resume_at
        )

    async def resume_from(
        self,
        thread_id: str,
        revision: int,
        *,
        new_thread_id: str | None = None,
        state_overlay: S | Mapping[str, Any] | None = None,
        merge: StateMerge[S] | None = None,
        resume_at: str | None = None,
        bindings: RunBindings | None = None,
        run_lease: tuple[str, float] | None = None,
    ) -> RunResult[S, E]:
        """Run a thread again from one of its past revisions: always as a fork
        (:meth:`fork`, to ``new_thread_id``, default ``<thread>~<8 hex digits>``),
        resumed at once. History is never rewritten: the parent stays as it is.

        Args:
            thread_id: the thread to run again (it is not touched).
            revision: the revision to run again from.
            new_thread_id: the fork's id (default: ``<thread>~<8 hex digits>``).
            state_overlay: values merged into that revision's state.
            merge: ``merge(state, overlay) -> state`` for ``state_overlay``.
            resume_at: the node to continue at (default: the revision's pointer).
            bindings: the values nodes read with ``binding(key)``.
            run_lease: ``(owner, ttl_seconds)`` of the run's lease.

        Returns:
            The fork's result (its ``thread_id`` names the fork).
        """
        new_id = new_thread_id or f"{thread_id}~{uuid.uuid4().hex[:8]}"
        token = await self.fork(
            thread_id,
            at_revision=revision,
            new_thread_id=new_id,
            state_overlay=state_overlay,
            merge=merge,
            resume_at=resume_at,
        )
        return await self.resume(token, bindings=bindings, run_lease=run_lease)

    async def evaluate_resume(self, token: ResumeToken) -> ResumeDecision:
        """The preflight decision for ``token``, with the current core-issued token.

        Never raises for stale, finished or hand-off states: they are decision kinds.
        ``RESUMABLE`` means ``resume(token)`` passes its preflight.
        """
        return (await self._prep.preflight(token)).decision

    async def evaluate_handoff_recovery(
        self,
        thread_id: str,
        *,
        stale_after: float | None = None,
        force_reenqueue: bool = False,
    ) -> ResumeDecision:
        """Decide whether ``thread_id``'s hand-off may be recovered now.

        Returns the decision for an orphaned hand-off, a stale pending one (an empty
        pending-at is stale), or an enqueued one with ``force_reenqueue``. Raises
        ``HandoffPendingError`` (fresh pending), ``HandoffAlreadyEnqueuedError``,
        ``HandoffNotRecoverableError`` (no hand-off), ``ThreadNotFoundError``.

        Args:
            thread_id: the thread whose hand-off to recover.
            stale_after: seconds after which a pending hand-off counts as stale
                (default: the runner's ``handoff_stale_after``).
            force_reenqueue: also recover a hand-off that is already enqueued (its
                outbox message is known to be lost).
        """
        validate_thread_id(thread_id)
        cp = self._prep.require_checkpointer("evaluate_handoff_recovery")
        snap, revision = await cp.load(thread_id)
        return self._prep.recovery_decision(snap, revision, stale_after, force_reenqueue)

    async def recover_stale_handoff(
        self,
        thread_id: str,
        *,
        stale_after: float | None = None,
        force_reenqueue: bool = False,
    ) -> HandoffRecoveryResult:
        """Re-enqueue an orphaned or stale pending hand-off (or, forced, an enqueued one).

        Always the three-phase path: patch enqueued → enqueue → on failure patch orphaned
        (then ``HandoffEnqueueFailedError`` with the retry token and ``result``). Does
        not take a run lease: run it from a single leader (``flowy.Worker`` does).
        Raises what ``evaluate_handoff_recovery`` raises, and ``TypeError`` when the
        runner has no outbox.

        Args:
            thread_id: the thread whose hand-off to recover.
            stale_after: seconds after which a pending hand-off counts as stale
                (default: the runner's ``handoff_stale_after``).
            force_reenqueue: also recover a hand-off that is already enqueued (its
                outbox message is known to be lost).
        """
        cp = self._prep.require_checkpointer("recover_stale_handoff")
        if self.handoff_outbox is None:
            raise TypeError("recover_stale_handoff needs Runner(handoff_outbox=...) or a Backend")
        validate_thread_id(thread_id)
        snap, revision = await cp.load(thread_id)
        decision = self._prep.recovery_decision(snap, revision, stale_after, force_reenqueue)
        return await recover_handoff(
            cp, self.handoff_outbox, snap, revision, decision, self.clock, self.telemetry
        )

    # ------------------------------------------------------------------ internals
    def _launch(self, ex: Execution[S, E], sink: EventSink[S, E]) -> StreamHandle[S, E]:
        task = asyncio.ensure_future(ex.run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return StreamHandle(ex.thread_id, sink, task, ex, self._head_loader(ex.thread_id))

    def _head_loader(self, thread_id: str) -> Callable[[], Awaitable[Snapshot[Any] | None]]:
        async def load() -> Snapshot[Any] | None:
            if self.checkpointer is None:
                return None
            try:
                snap, _ = await self.checkpointer.load(thread_id)
            except ThreadNotFoundError:
                return None
            return snap

        return load
