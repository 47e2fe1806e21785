"""The store-facing API of flowy: protocols, values, the record envelope, codecs and the
bases a store is built on.

Applications open a store with ``flowy.connect(url)`` and rarely import this module
(:func:`as_backend` wraps components built one by one into a backend). A new store
subclasses :class:`BaseCheckpointer`, :class:`BaseLeaseManager`,
:class:`BaseOutbox`, :class:`BaseConsumer` and :class:`BaseBackend`, implements their
atomic primitives, registers an opener in the ``flowy.backends`` entry-point group, and
runs the conformance suite of :mod:`flowy.testing` (``docs/adapters.md``).

Stored bytes are read with :func:`decode_record` / :func:`decode_snapshot`, which
validate the envelope against its storage address and raise
``SnapshotEnvelopeInvalidError`` on any mismatch or corruption; no pickle anywhere.
"""

from __future__ import annotations

import warnings as _warnings
from typing import Any as _Any

from .._types import ResumeToken as ResumeToken
from ._adapt import as_backend as as_backend
from ._backend import BaseBackend as BaseBackend
from ._backend import StoreURL as StoreURL
from ._backend import redact_url as redact_url
from ._base import BACKLOG_STATUSES as BACKLOG_STATUSES
from ._base import BaseCheckpointer as BaseCheckpointer
from ._base import BaseLeaseManager as BaseLeaseManager
from ._base import Busy as Busy
from ._base import OutboxRow as OutboxRow
from ._base import OutboxTransaction as OutboxTransaction
from ._base import Refused as Refused
from ._base import Write as Write
from ._base import show_id as show_id
from ._capabilities import Capabilities as Capabilities
from ._codecs import JSONCodec as JSONCodec
from ._codecs import MsgspecCodec as MsgspecCodec
from ._codecs import PydanticCodec as PydanticCodec
from ._codecs import StateCodec as StateCodec
from ._connect import ENTRY_POINT_GROUP as ENTRY_POINT_GROUP
from ._connect import Connecting as Connecting
from ._connect import connect as connect
from ._connect import register_backend as register_backend
from ._connect import schemes as schemes
from ._durable import ActivityRecord as ActivityRecord
from ._durable import ActivityStatus as ActivityStatus
from ._durable import Signal as Signal
from ._durable import Timer as Timer
from ._guard import LeaseGuardCheckpointer as LeaseGuardCheckpointer
from ._intents import decode_intent as decode_intent
from ._intents import encode_intent as encode_intent
from ._limits import MAX_DEPTH as MAX_DEPTH
from ._limits import MAX_TIMESTAMP as MAX_TIMESTAMP
from ._limits import Limits as Limits
from ._model import MAX_THREAD_ID_BYTES as MAX_THREAD_ID_BYTES
from ._model import SYSTEM_LEASE_PREFIX as SYSTEM_LEASE_PREFIX
from ._model import DeadLetter as DeadLetter
from ._model import HandoffIntent as HandoffIntent
from ._model import HandoffStatus as HandoffStatus
from ._model import Lease as Lease
from ._model import OutboxMessage as OutboxMessage
from ._model import OutboxStats as OutboxStats
from ._model import RunStatus as RunStatus
from ._model import Snapshot as Snapshot
from ._model import ThreadSummary as ThreadSummary
from ._model import new_write_id as new_write_id
from ._model import next_fencing_token as next_fencing_token
from ._model import validate_thread_id as validate_thread_id
from ._outbox import BaseConsumer as BaseConsumer
from ._outbox import BaseOutbox as BaseOutbox
from ._outbox import RawMessage as RawMessage
from ._protocols import Backend as Backend
from ._protocols import Checkpointer as Checkpointer
from ._protocols import DurableCheckpointer as DurableCheckpointer
from ._protocols import EnqueueCallback as EnqueueCallback
from ._protocols import FencingCheckpointer as FencingCheckpointer
from ._protocols import HandoffOutbox as HandoffOutbox
from ._protocols import LeaseManager as LeaseManager
from ._protocols import OutboxConsumer as OutboxConsumer
from ._protocols import TransactionalCheckpointer as TransactionalCheckpointer
from ._protocols import TransactionalHandoffOutbox as TransactionalHandoffOutbox
from ._records import FORMAT_VERSION as FORMAT_VERSION
from ._records import DecodeRecordOptions as DecodeRecordOptions
from ._records import Record as Record
from ._records import decode_record as decode_record
from ._records import decode_snapshot as decode_snapshot
from ._records import encode_record as encode_record
from ._records import encode_snapshot as encode_snapshot
from ._saving import confirm_save as confirm_save
from ._saving import confirmed_save as confirmed_save
from ._scratch import SCRATCH_PREFIX as SCRATCH_PREFIX
from ._scratch import open_scratch as open_scratch
from ._scratch import sibling_url as sibling_url

__all__ = [
    "BACKLOG_STATUSES",
    "ENTRY_POINT_GROUP",
    "FORMAT_VERSION",
    "MAX_DEPTH",
    "MAX_THREAD_ID_BYTES",
    "MAX_TIMESTAMP",
    "SCRATCH_PREFIX",
    "SYSTEM_LEASE_PREFIX",
    "ActivityRecord",
    "ActivityStatus",
    "Backend",
    "BaseBackend",
    "BaseCheckpointer",
    "BaseConsumer",
    "BaseLeaseManager",
    "BaseOutbox",
    "Busy",
    "Capabilities",
    "Checkpointer",
    "Connecting",
    "DeadLetter",
    "DecodeRecordOptions",
    "DurableCheckpointer",
    "EnqueueCallback",
    "FencingCheckpointer",
    "HandoffIntent",
    "HandoffOutbox",
    "HandoffStatus",
    "JSONCodec",
    "Lease",
    "LeaseGuardCheckpointer",
    "Limits",
    "LeaseManager",
    "MsgspecCodec",
    "OutboxConsumer",
    "OutboxMessage",
    "OutboxRow",
    "OutboxStats",
    "OutboxTransaction",
    "PydanticCodec",
    "RawMessage",
    "Record",
    "Refused",
    "ResumeToken",
    "RunStatus",
    "Signal",
    "Snapshot",
    "StateCodec",
    "StoreURL",
    "ThreadSummary",
    "Timer",
    "TransactionalCheckpointer",
    "TransactionalHandoffOutbox",
    "Write",
    "as_backend",
    "confirm_save",
    "confirmed_save",
    "connect",
    "decode_intent",
    "decode_record",
    "decode_snapshot",
    "encode_intent",
    "encode_record",
    "encode_snapshot",
    "new_write_id",
    "next_fencing_token",
    "open_scratch",
    "redact_url",
    "register_backend",
    "schemes",
    "show_id",
    "sibling_url",
    "validate_thread_id",
]


# Names renamed after 0.2 ("durable" keeps one meaning: written to the store, so it
# survives a crash). The old name still resolves, with a DeprecationWarning, until 0.4.
_RENAMED = {"durable_save": "confirmed_save"}


def __getattr__(name: str) -> _Any:
    """Resolve a renamed name, with a DeprecationWarning."""
    new = _RENAMED.get(name)
    if new is None:
        raise AttributeError(f"module 'flowy.storage' has no attribute {name!r}")
    _warnings.warn(
        f"flowy.storage.{name} is renamed flowy.storage.{new}; the old name goes away in flowy 0.4",
        DeprecationWarning,
        stacklevel=2,
    )
    return globals()[new]


def _present_as_public() -> None:
    """Make reprs and tracebacks say ``flowy.storage.X`` rather than the private module."""
    for name in __all__:
        obj = globals()[name]
        if getattr(obj, "__module__", "").startswith("flowy.storage._"):
            try:
                obj.__module__ = __name__
            except (AttributeError, TypeError):
                pass


_present_as_public()
del _present_as_public
