"""How a store's :class:`~flowy.storage.Capabilities` are derived from its components.

A component built on the bases of :mod:`flowy.storage` says what it can do by which
optional primitives it overrides (a primitive left as the base's default ⇒ the
capability is ``False``); a component that is not built on the bases says it through
the protocols of :mod:`flowy.storage`.
"""

from __future__ import annotations

from typing import Any, Protocol, cast, runtime_checkable

from ._base import BaseCheckpointer
from ._capabilities import Capabilities
from ._guard import LeaseGuardCheckpointer
from ._leases import BaseLeaseManager
from ._model import Lease
from ._outbox import BaseConsumer, BaseOutbox
from ._protocols import (
    DurableCheckpointer,
    FencingCheckpointer,
    LeaseManager,
    TransactionalCheckpointer,
    TransactionalOutbox,
)
from ._schedules import BaseScheduleStore

__all__ = ["derive_capabilities", "overrides"]


@runtime_checkable
class _SystemLeases(Protocol):
    """A lease manager that takes flowy's own leases (``BaseLeaseManager`` does)."""

    async def acquire_system(self, name: str, owner: str, ttl: float) -> Lease: ...


def overrides(obj: object, base: type, *names: str) -> bool:
    """True if ``type(obj)`` replaces every one of the primitives ``names`` of ``base``
    (a class below ``base`` defines it as something other than the base's default)."""
    return all(_implements(type(obj), base, name) for name in names)


def _implements(cls: type, base: type, name: str) -> bool:
    default = base.__dict__[name]
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass.__dict__[name] is not default
    return False


_SIGNALS = ("_timers", "_append_signal", "_read_signals")
_JOURNAL = ("_put_activity", "_get_activity", "_list_activities")
_QUEUES = ("_claim_queue", "_set_limits", "_read_limits", "_queue_counts", "_queue_messages")


def _durable(checkpointer: Any, primitives: tuple[str, ...]) -> bool:
    inner: Any = checkpointer
    if isinstance(inner, LeaseGuardCheckpointer):
        inner = cast(LeaseGuardCheckpointer[Any], inner).inner
    if isinstance(inner, BaseCheckpointer):
        return overrides(cast(object, inner), BaseCheckpointer, *primitives)
    return isinstance(inner, DurableCheckpointer)


def _native_recent(checkpointer: Any) -> bool:
    inner: Any = checkpointer
    if isinstance(inner, LeaseGuardCheckpointer):
        inner = cast(LeaseGuardCheckpointer[Any], inner).inner
    return isinstance(inner, BaseCheckpointer) and overrides(
        cast(object, inner), BaseCheckpointer, "_recent_heads"
    )


def _transactional(component: object, protocol: type) -> bool:
    if isinstance(component, BaseCheckpointer | BaseOutbox):
        return True  # the bases commit outbox rows in the checkpointer's one write
    if isinstance(component, LeaseGuardCheckpointer):
        return component.transactional
    # A wrapper that forwards to a component it wraps declares whether that one is
    # transactional (``transactional: bool``); read once, when the store is wrapped.
    declared = getattr(component, "transactional", None)
    if isinstance(declared, bool):
        return declared
    return isinstance(component, protocol)


def derive_capabilities(
    checkpointer: object,
    leases: object | None,
    outbox: object | None,
    consumer: object | None,
    *,
    live_progress: bool = False,
    schedules: object | None = None,
) -> Capabilities:
    """The capabilities of a store made of these components (``None``: absent);
    ``live_progress``: the backend implements ``_publish`` and ``_subscribe``."""
    cp: Any = checkpointer
    fencing = (
        leases is not None
        and isinstance(cp, FencingCheckpointer)
        and bool(cast(FencingCheckpointer[Any], cp).fences(cast(LeaseManager, leases)))
    )
    return Capabilities(
        run_leases=leases is not None,
        fencing=fencing,
        system_leases=isinstance(leases, BaseLeaseManager | _SystemLeases),
        handoff_outbox=outbox is not None,
        transactional_outbox=outbox is not None
        and _transactional(cast(object, cp), TransactionalCheckpointer)
        and _transactional(outbox, TransactionalOutbox),
        consumer=consumer is not None,
        durable_timers_signals=_durable(cp, _SIGNALS),
        journal=_durable(cp, _JOURNAL),
        backlog=isinstance(consumer, BaseConsumer)
        and overrides(consumer, BaseConsumer, "_stats")
        and isinstance(cp, BaseCheckpointer),
        live_progress=live_progress,
        schedules=isinstance(schedules, BaseScheduleStore),
        queues=isinstance(consumer, BaseConsumer) and overrides(consumer, BaseConsumer, *_QUEUES),
        acquire_with_load=fencing
        and isinstance(cp, BaseCheckpointer)
        and overrides(cast(object, cp), BaseCheckpointer, "_acquire_head"),
        release_on_save=fencing
        and isinstance(cp, BaseCheckpointer)
        and overrides(cast(object, cp), BaseCheckpointer, "_write_release"),
        ack_on_save=fencing
        and consumer is not None
        and isinstance(cp, BaseCheckpointer)
        and overrides(cast(object, cp), BaseCheckpointer, "_write_release", "_write_ack"),
        recent_index=_native_recent(cp),
    )
