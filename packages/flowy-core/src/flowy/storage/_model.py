"""The values stores keep and exchange: snapshots, thread summaries, leases, hand-off
intents, outbox messages and the outbox's backlog, with the validation of thread ids
every store shares."""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Generic, cast

from .._errors import InvalidThreadIdError
from .._types import JSON, HandoffStatus, ResumeToken, RunStatus, S

__all__ = [
    "MAX_THREAD_ID_BYTES",
    "SYSTEM_LEASE_PREFIX",
    "DeadLetter",
    "HandoffIntent",
    "HandoffStatus",
    "Lease",
    "DEFAULT_QUEUE",
    "DEFAULT_ROUTE",
    "OutboxMessage",
    "OutboxStats",
    "Route",
    "RunStatus",
    "Snapshot",
    "ThreadSummary",
    "new_write_id",
    "next_fencing_token",
    "validate_thread_id",
]

MAX_THREAD_ID_BYTES = 16 * 1024
"""The longest thread id accepted, in UTF-8 bytes."""

SYSTEM_LEASE_PREFIX = "\x1f"
"""Leases of flowy's own (the recovery leader's) are named with this first character,
which no thread id may start with, so no thread can collide with them."""


def validate_thread_id(thread_id: object) -> str:
    """Return ``thread_id`` if it is a usable thread id, else raise ``InvalidThreadIdError``.

    A thread id is a non-empty ``str`` of at most ``MAX_THREAD_ID_BYTES`` UTF-8 bytes with
    no NUL character, not starting with U+001F (reserved for flowy's own leases). Any
    other content (``{``, ``:``, newlines, non-ASCII) is allowed and stored exactly.
    """
    if not isinstance(thread_id, str):
        raise InvalidThreadIdError(
            f"thread id must be a str, got {type(thread_id).__name__} {thread_id!r:.200}"
        )
    if not thread_id:
        raise InvalidThreadIdError("thread id must not be empty")
    if thread_id.startswith(SYSTEM_LEASE_PREFIX):
        raise InvalidThreadIdError(
            f"thread id must not start with U+001F (reserved for flowy's own leases): "
            f"{thread_id!r:.200}"
        )
    if "\x00" in thread_id:
        raise InvalidThreadIdError(f"thread id must not contain NUL characters: {thread_id!r:.200}")
    try:
        size = len(thread_id.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidThreadIdError(
            f"thread id is not valid Unicode text (lone surrogate?): {thread_id!r:.200}"
        ) from exc
    if size > MAX_THREAD_ID_BYTES:
        raise InvalidThreadIdError(
            f"thread id is {size} bytes long; the limit is {MAX_THREAD_ID_BYTES} bytes"
        )
    return thread_id


def next_fencing_token(previous: int | None, now: float) -> int:
    """The fencing token of a new lease: above the thread's previous token (if its lease
    record still exists) and at least the store's clock in microseconds.

    The clock floor is what lets a store delete the lease record of a released, expired
    or deleted thread without tokens ever going back: a later lease is taken later, so
    its floor is above every token issued before (as long as the store's clock does not
    step back by more than the time a lease record is kept after it expired).

    Args:
        previous: the thread's last fencing token, or ``None`` when it has no lease
            record.
        now: the store's clock, in seconds since the epoch.
    """
    return max((previous or 0) + 1, int(now * 1_000_000))


DEFAULT_QUEUE = "default"
"""The queue of a hand-off that names none (and of a graph that sets no default)."""

MAX_PARTITION_KEY_BYTES = 256
"""The longest partition key accepted, in UTF-8 bytes."""

MAX_PRIORITY = 2**31 - 1
"""The highest priority number (the lowest priority) a hand-off may have."""

_QUEUE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")


def validate_queue_name(name: object) -> str:
    """Return ``name`` if it is a usable queue name, else raise ``ValueError`` (or
    ``TypeError`` for a non-str): 1 to 64 characters of ``A-Z a-z 0-9 _ . : -``,
    starting with a letter or digit."""
    if not isinstance(name, str):
        raise TypeError(f"a queue name must be a str, got {type(name).__name__} {name!r:.80}")
    if not _QUEUE_NAME.fullmatch(name):
        raise ValueError(
            f"queue name {name!r:.80} is not 1 to 64 characters of letters, digits, "
            "'_', '.', ':' and '-' starting with a letter or digit"
        )
    return name


@dataclass(frozen=True, slots=True)
class Route:
    """Where a hand-off's message waits until a worker starts it.

    ``queue`` names the queue (a ``flowy.Worker`` serves the queues of its
    ``WorkerOptions.queues``); ``partition_key`` puts it in a partition of that queue
    (a customer id, say; ``""``: none), which the queue's partition limits count apart;
    ``priority`` orders a queue's messages, lower first, first in first out within a
    priority. Every field is checked when the route is made (``ValueError``).
    """

    queue: str = DEFAULT_QUEUE
    partition_key: str = ""
    priority: int = 0

    def __post_init__(self) -> None:
        validate_queue_name(self.queue)
        key = self.partition_key
        if not isinstance(key, str):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"partition_key must be a str, got {type(key).__name__}")
        if "\x00" in key:
            raise ValueError("partition_key must not contain NUL characters")
        try:
            size = len(key.encode("utf-8"))
        except UnicodeEncodeError:
            raise ValueError(f"partition_key is not valid Unicode text: {key!r:.80}") from None
        if size > MAX_PARTITION_KEY_BYTES:
            raise ValueError(
                f"partition_key is {size} bytes long; the limit is {MAX_PARTITION_KEY_BYTES}"
            )
        priority = self.priority
        if isinstance(priority, bool) or not isinstance(priority, int):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"priority must be an int, got {priority!r:.80}")
        if not 0 <= priority <= MAX_PRIORITY:
            raise ValueError(f"priority must be within 0 .. {MAX_PRIORITY}, got {priority}")


DEFAULT_ROUTE = Route()
"""The route of a hand-off that names no queue, partition or priority."""


def new_write_id() -> str:
    """A fresh random id stamped on every saved snapshot (resolves ambiguous saves)."""
    return os.urandom(16).hex()  # 128 random bits


@dataclass(frozen=True)
class Snapshot(Generic[S]):
    """One persisted point of a run.

    ``revision`` is the revision the snapshot is stored at (0 before the first save; a
    checkpointer's ``load`` fills it in). ``budget_counts`` survive segment resets;
    ``step_count`` counts the steps of the current segment only, ``total_steps`` those
    of every segment. ``effects`` are the effects the segment emitted up to this point
    and ``retry_counts`` the attempts each node has used (both as JSON values).
    """

    thread_id: str
    """The thread the snapshot belongs to."""
    state: S
    """The application's state at this point."""
    execution_pointer: str
    """The node a run resumed from here continues at."""
    status: RunStatus = RunStatus.RUNNING
    """Where the run stands."""
    reason: str = ""
    """Why the run stopped here (empty between steps)."""
    revision: int = 0
    step_count: int = 0
    segment: int = 0
    """The segment that saved it: 0 for the start, one more for each resume."""
    total_steps: int = 0
    budget_counts: Mapping[str, int] = field(default_factory=lambda: {})
    metadata: Mapping[str, JSON] = field(default_factory=lambda: {})
    """The run's metadata."""
    handoff_status: HandoffStatus = HandoffStatus.NONE
    """The state of its hand-off outbox message."""
    handoff_pending_at: float | None = None
    """When the hand-off began, in seconds since the epoch (``None`` without one); a
    pending hand-off's staleness counts from here."""
    updated_at: float = 0.0
    """When it was saved, in seconds since the epoch (the runner's clock)."""
    write_id: str = ""
    """A random id of this write, which resolves a save of unknown outcome
    (``confirmed_save``)."""
    effects: Sequence[JSON] = ()
    retry_counts: Mapping[str, int] = field(default_factory=lambda: {})
    wake_at: float | None = None
    """When a waiting run is due to wake up, in seconds since the epoch (``None``: no
    timer). Stores index it: ``Checkpointer.timers`` lists the due heads."""
    waiting_for: str = ""
    """The signal a waiting run waits for (``""``: none, a plain sleep)."""
    on_timeout: str = ""
    """The node a wait resumes at when ``wake_at`` passes first (``""``: the execution
    pointer)."""
    signal_cursors: Mapping[str, int] = field(default_factory=lambda: {})
    """For each signal name, the ``seq`` of the last signal of that name delivered to the
    run: the next wait takes the first one after it."""
    graph_version: str = ""
    """The version of the graph that saved it (``Graph.version``; ``""``: saved before
    graphs had versions)."""
    parent_thread_id: str = ""
    """The thread this one was forked from (``""``: not a fork)."""
    parent_revision: int = 0
    """The revision of ``parent_thread_id`` it was forked at (0: not a fork)."""
    route: Route = DEFAULT_ROUTE
    """Where its hand-off's message goes (queue, partition, priority): set on the
    snapshots of a hand-off, so a recovered hand-off is enqueued where it was meant to
    go; the default route otherwise."""
    nested: Mapping[str, JSON] = field(default_factory=lambda: {})
    """Where a run paused inside a subgraph: ``node`` (the subgraph's node in this
    graph), ``pointer`` (the node inside it), ``state`` (its state, as JSON) and
    ``on_timeout``; empty when the run is not inside one."""

    def at_revision(self, revision: int) -> Snapshot[S]:
        """A copy of this snapshot stored at ``revision``."""
        return replace(self, revision=revision)

    @property
    def resume_token(self) -> ResumeToken:
        """The token that resumes from this snapshot."""
        return ResumeToken(self.thread_id, self.revision)


SNAPSHOT_FIELDS: frozenset[str] = frozenset(f.name for f in fields(Snapshot))
"""The names of every field of a :class:`Snapshot`."""


def built_snapshot(values: dict[str, Any]) -> Snapshot[Any]:
    """A :class:`Snapshot` of ``values`` (every field named exactly once), built without
    the frozen dataclass's per-field ``__init__`` (the engine builds one per step).

    The caller gives every field; a test compares the names with ``SNAPSHOT_FIELDS``.
    """
    snap = cast("Snapshot[Any]", object.__new__(Snapshot))
    snap.__dict__.update(values)
    return snap


@dataclass(frozen=True, slots=True)
class ThreadSummary:
    """One row of ``Checkpointer.list_threads``: the head of a thread without its state."""

    thread_id: str
    """The thread."""
    revision: int
    """The head's revision."""
    execution_pointer: str
    """The node the head resumes at."""
    status: RunStatus
    """The head's run status."""
    reason: str
    """The head's reason."""
    handoff_status: HandoffStatus
    """The head's hand-off status."""
    handoff_pending_at: float | None
    """When the head's hand-off began, in seconds since the epoch (``None`` without one)."""
    updated_at: float
    """When the head was saved, in seconds since the epoch."""
    wake_at: float | None = None
    """When the head, a waiting run, is due to wake up (``None``: no timer)."""
    graph_version: str = ""
    """The version of the graph that saved the head (``""``: before graph versions)."""


@dataclass(frozen=True, slots=True)
class Lease:
    """A run lease on one thread.

    ``fencing_token`` grows on every acquisition of the thread and never goes back, even
    after release or delete. ``expires_at`` is in seconds since the epoch by the
    store's clock.
    """

    thread_id: str
    """The thread leased (a system lease's key starts with ``SYSTEM_LEASE_PREFIX``)."""
    owner: str
    """Who holds it (compared exactly)."""
    fencing_token: int
    expires_at: float

    @property
    def token(self) -> int:
        """Deprecated alias of :attr:`fencing_token` (removed in 0.3)."""
        warnings.warn("Lease.token is deprecated; use Lease.fencing_token", DeprecationWarning, 2)
        return self.fencing_token


@dataclass(frozen=True, slots=True)
class HandoffIntent:
    """The canonical message a hand-off puts in the outbox.

    ``pending_snapshot_revision`` is the revision saved with status pending (equal to the
    committed one on the transactional path); ``committed_snapshot_revision`` is the
    revision saved with status enqueued; ``snapshot_revision`` is the revision of
    ``resume_token``, the one a consumer resumes. Consumers never do revision arithmetic.
    """

    thread_id: str
    """The thread handed off."""
    pending_snapshot_revision: int
    committed_snapshot_revision: int
    snapshot_revision: int
    resume_token: ResumeToken
    handoff_status: HandoffStatus
    """The snapshot's hand-off status when the intent was made (``ENQUEUED``)."""
    reason: str
    """The hand-off's reason."""
    execution_pointer: str
    """The node the worker resumes the run at."""
    created_at: float = 0.0
    """When the intent was made, in seconds since the epoch (0: when it is encoded)."""
    trace: Mapping[str, str] = field(default_factory=lambda: {})
    """String entries carried with the message unchanged (tracing context, say); flowy
    sets none itself."""
    route: Route = DEFAULT_ROUTE
    """The queue, partition and priority of the message."""

    @property
    def intent_id(self) -> str:
        """A stable id: one intent per thread and committed revision."""
        return f"{self.committed_snapshot_revision}:{self.thread_id}"


@dataclass(frozen=True, slots=True)
class OutboxMessage:
    """One claimed outbox delivery.

    ``attempts`` counts deliveries including this one; ``last_error`` is what the
    previous delivery's ``release`` recorded (empty on the first).
    """

    message_id: str
    """The store's id of the message."""
    intent: HandoffIntent
    """The hand-off to resume."""
    attempts: int
    last_error: str = ""


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message the consumer gave up on.

    ``intent`` is ``None`` when the stored payload does not decode (a poison message);
    ``payload`` keeps its bytes for inspection and ``error`` says why it was buried.
    """

    message_id: str
    """The store's id of the message (what ``retry_dead_letter`` takes)."""
    intent: HandoffIntent | None
    attempts: int
    """How many deliveries it had."""
    error: str
    payload: bytes = b""

    @property
    def thread_id(self) -> str:
        """The intent's thread id, or ``""`` for an undecodable payload."""
        return self.intent.thread_id if self.intent is not None else ""


@dataclass(frozen=True, slots=True)
class OutboxStats:
    """The backlog of an outbox, as ``BaseConsumer.stats`` reads it.

    ``oldest_pending_at`` is ``None`` exactly when ``pending`` is 0. A dead letter put
    back (``retry_dead_letter``, or the same intent enqueued again) counts as enqueued
    when it came back.
    """

    pending: int
    """Messages not yet acked, claimed or not (dead letters excluded)."""
    oldest_pending_at: float | None
    """When the oldest of them was enqueued, in seconds since the epoch by the store's
    clock (``None``: nothing pending)."""
    dead_letters: int
    """Messages held in the dead letters."""
