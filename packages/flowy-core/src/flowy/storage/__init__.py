"""What applications use of a store: ``connect(url)``, the ``Backend`` protocol and its
components' protocols, the values a store returns (snapshots, summaries, hand-off
intents, outbox messages, dead letters, leases, timers, signals, journal entries), the
state codecs and the limits a store checks.

Applications open a store with ``flowy.connect(url)`` and rarely import this module
except to type against it (``as_backend`` wraps components built one by one into a
backend). What a store author subclasses and calls (the bases, the
write and claim values of their primitives, URL handling, registration, the record
envelope) is in :mod:`flowy.storage.dialect` (``docs/adapters.md``).
"""

from __future__ import annotations

import importlib as _importlib
import warnings as _warnings
from typing import Any as _Any

from .._moved import present_as_public as _present_as_public
from .._types import ResumeToken as ResumeToken
from ._adapt import as_backend as as_backend
from ._backend import redact_url as redact_url
from ._capabilities import Capabilities as Capabilities
from ._codecs import JSONCodec as JSONCodec
from ._codecs import MsgspecCodec as MsgspecCodec
from ._codecs import PydanticCodec as PydanticCodec
from ._codecs import StateCodec as StateCodec
from ._connect import connect as connect
from ._connect import schemes as schemes
from ._durable import ActivityRecord as ActivityRecord
from ._durable import ActivityStatus as ActivityStatus
from ._durable import Signal as Signal
from ._durable import Timer as Timer
from ._guard import LeaseGuardCheckpointer as LeaseGuardCheckpointer
from ._limits import Limits as Limits
from ._model import DeadLetter as DeadLetter
from ._model import HandoffIntent as HandoffIntent
from ._model import HandoffStatus as HandoffStatus
from ._model import Lease as Lease
from ._model import OutboxMessage as OutboxMessage
from ._model import OutboxStats as OutboxStats
from ._model import Route as Route
from ._model import RunStatus as RunStatus
from ._model import Snapshot as Snapshot
from ._model import ThreadSummary as ThreadSummary
from ._protocols import Backend as Backend
from ._protocols import Checkpointer as Checkpointer
from ._protocols import DurableCheckpointer as DurableCheckpointer
from ._protocols import LeaseManager as LeaseManager
from ._protocols import Outbox as Outbox
from ._protocols import OutboxConsumer as OutboxConsumer
from ._protocols import TransactionalCheckpointer as TransactionalCheckpointer
from ._protocols import TransactionalOutbox as TransactionalOutbox
from ._queues import QueueLimits as QueueLimits
from ._queues import QueueStats as QueueStats
from ._recent import RecentCursor as RecentCursor
from ._recent import recent_key as recent_key
from ._recent import recent_threads as recent_threads
from ._schedules import Schedule as Schedule
from ._schedules import TickClaim as TickClaim
from ._writes import OutboxTransaction as OutboxTransaction

__all__ = [
    "ActivityRecord",
    "ActivityStatus",
    "Backend",
    "Capabilities",
    "Checkpointer",
    "DeadLetter",
    "DurableCheckpointer",
    "HandoffIntent",
    "HandoffStatus",
    "JSONCodec",
    "Lease",
    "LeaseGuardCheckpointer",
    "LeaseManager",
    "Limits",
    "MsgspecCodec",
    "Outbox",
    "OutboxConsumer",
    "OutboxMessage",
    "OutboxStats",
    "OutboxTransaction",
    "PydanticCodec",
    "QueueLimits",
    "QueueStats",
    "RecentCursor",
    "ResumeToken",
    "Route",
    "RunStatus",
    "Schedule",
    "Signal",
    "Snapshot",
    "StateCodec",
    "ThreadSummary",
    "TickClaim",
    "Timer",
    "TransactionalCheckpointer",
    "TransactionalOutbox",
    "as_backend",
    "connect",
    "recent_key",
    "recent_threads",
    "redact_url",
    "schemes",
]

# Names flowy 0.2 exported here for store authors; they live in flowy.storage.dialect
# now. Importing one from here still works, with a DeprecationWarning, until 0.4.
_MOVED_TO_DIALECT = frozenset(
    {
        "BACKLOG_STATUSES",
        "ENTRY_POINT_GROUP",
        "FORMAT_VERSION",
        "MAX_DEPTH",
        "MAX_THREAD_ID_BYTES",
        "MAX_TIMESTAMP",
        "SCRATCH_PREFIX",
        "SYSTEM_LEASE_PREFIX",
        "BaseBackend",
        "BaseCheckpointer",
        "BaseConsumer",
        "BaseLeaseManager",
        "BaseOutbox",
        "Busy",
        "Connecting",
        "DecodeRecordOptions",
        "EnqueueCallback",
        "FencingCheckpointer",
        "OutboxRow",
        "RawMessage",
        "Record",
        "Refused",
        "StoreURL",
        "Write",
        "confirm_save",
        "decode_intent",
        "decode_record",
        "decode_snapshot",
        "encode_intent",
        "encode_record",
        "encode_snapshot",
        "new_write_id",
        "next_fencing_token",
        "open_scratch",
        "register_backend",
        "show_id",
        "sibling_url",
        "validate_thread_id",
    }
)

# Old names of what is exported here; they resolve, with a DeprecationWarning, until 0.4.
_RENAMED = {
    "HandoffOutbox": "Outbox",
    "TransactionalHandoffOutbox": "TransactionalOutbox",
}

# Names of 0.2 that moved to flowy.storage.dialect under a new name ("durable" keeps one
# meaning: written to the store, so it survives a crash).
_RENAMED_IN_DIALECT = {"durable_save": "confirmed_save"}


def __getattr__(name: str) -> _Any:
    """Resolve a name this module exported before, with a DeprecationWarning."""
    if name in _RENAMED:
        new = _RENAMED[name]
        _warnings.warn(
            f"flowy.storage.{name} is renamed flowy.storage.{new}; the old name goes away "
            "in flowy 0.4",
            DeprecationWarning,
            stacklevel=2,
        )
        return globals()[new]
    if name in _RENAMED_IN_DIALECT:
        new = _RENAMED_IN_DIALECT[name]
        _warnings.warn(
            f"flowy.storage.{name} is renamed flowy.storage.dialect.{new}; the old name goes "
            "away in flowy 0.4",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(_importlib.import_module("flowy.storage.dialect"), new)
    if name in _MOVED_TO_DIALECT:
        _warnings.warn(
            f"flowy.storage.{name} moved to flowy.storage.dialect.{name}; the old name "
            "goes away in flowy 0.4",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(_importlib.import_module("flowy.storage.dialect"), name)
    raise AttributeError(f"module 'flowy.storage' has no attribute {name!r}")


# Reprs and tracebacks say flowy.storage.X, not the private module.
_present_as_public(__name__, globals(), __all__, "flowy.storage._")

from . import dialect as dialect  # noqa: E402  (its names say flowy.storage.dialect.X)
