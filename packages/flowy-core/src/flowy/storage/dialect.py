"""What a store author subclasses and calls: the bases, the write and claim values of
their primitives, URL handling, registration, the record envelope and the limits every
store checks.

Applications never need this module: they open a store with ``flowy.connect(url)`` and
type against the protocols and values of :mod:`flowy.storage`. A new store subclasses
:class:`BaseCheckpointer`, :class:`BaseLeaseManager`, :class:`BaseOutbox`,
:class:`BaseConsumer` and :class:`BaseBackend`, implements their atomic primitives
(a conditional write, a head read, a lease compare-and-set, a batch claim, ...),
registers an opener in the ``flowy.backends`` entry-point group (:data:`ENTRY_POINT_GROUP`,
or :func:`register_backend` in a test), and runs the conformance suite of
:mod:`flowy.testing` (``docs/adapters.md``). The bases own validation, error diagnosis,
summaries, the claim/ack/release/dead-letter loop and resource ownership, so the same
bad input gives the same error on every store.

Stored bytes are made with :func:`encode_record` and read with :func:`decode_record` /
:func:`decode_snapshot`, which validate the envelope against its storage address and
raise ``SnapshotEnvelopeInvalidError`` on any mismatch or corruption; no pickle anywhere.
"""

from __future__ import annotations

from .._moved import deprecated_names as deprecated_names
from .._moved import present_as_public as present_as_public
from ._backend import BaseBackend as BaseBackend
from ._backend import StoreURL as StoreURL
from ._base import BACKLOG_STATUSES as BACKLOG_STATUSES
from ._base import BaseCheckpointer as BaseCheckpointer
from ._capabilities import RoundTrips as RoundTrips
from ._connect import ENTRY_POINT_GROUP as ENTRY_POINT_GROUP
from ._connect import Connecting as Connecting
from ._connect import register_backend as register_backend
from ._intents import decode_intent as decode_intent
from ._intents import encode_intent as encode_intent
from ._leases import BaseLeaseManager as BaseLeaseManager
from ._limits import MAX_DEPTH as MAX_DEPTH
from ._limits import MAX_TIMESTAMP as MAX_TIMESTAMP
from ._limits import MAX_VALUE_BYTES as MAX_VALUE_BYTES
from ._model import MAX_THREAD_ID_BYTES as MAX_THREAD_ID_BYTES
from ._model import SYSTEM_LEASE_PREFIX as SYSTEM_LEASE_PREFIX
from ._model import new_write_id as new_write_id
from ._model import next_fencing_token as next_fencing_token
from ._model import validate_thread_id as validate_thread_id
from ._outbox import BaseConsumer as BaseConsumer
from ._outbox import BaseOutbox as BaseOutbox
from ._outbox import RawMessage as RawMessage
from ._outbox import message_row_id as message_row_id
from ._protocols import EnqueueCallback as EnqueueCallback
from ._protocols import FencingCheckpointer as FencingCheckpointer
from ._queues import QueueCounts as QueueCounts
from ._recent import recent_second as recent_second
from ._recent import scan_recent as scan_recent
from ._records import FORMAT_VERSION as FORMAT_VERSION
from ._records import DecodeRecordOptions as DecodeRecordOptions
from ._records import Record as Record
from ._records import decode_record as decode_record
from ._records import decode_snapshot as decode_snapshot
from ._records import encode_record as encode_record
from ._records import encode_snapshot as encode_snapshot
from ._saving import confirm_save as confirm_save
from ._saving import confirmed_save as confirmed_save
from ._schedules import BaseScheduleStore as BaseScheduleStore
from ._schedules import validate_schedule_name as validate_schedule_name
from ._scratch import SCRATCH_PREFIX as SCRATCH_PREFIX
from ._scratch import open_scratch as open_scratch
from ._scratch import sibling_url as sibling_url
from ._wakeups import Wakeups as Wakeups
from ._watch import Inbox as Inbox
from ._watch import decode_message as decode_message
from ._writes import Busy as Busy
from ._writes import OutboxRow as OutboxRow
from ._writes import Refused as Refused
from ._writes import Write as Write
from ._writes import show_id as show_id

__all__ = [
    "BACKLOG_STATUSES",
    "ENTRY_POINT_GROUP",
    "FORMAT_VERSION",
    "MAX_DEPTH",
    "MAX_THREAD_ID_BYTES",
    "MAX_TIMESTAMP",
    "MAX_VALUE_BYTES",
    "SCRATCH_PREFIX",
    "SYSTEM_LEASE_PREFIX",
    "BaseBackend",
    "BaseCheckpointer",
    "BaseConsumer",
    "BaseLeaseManager",
    "BaseOutbox",
    "BaseScheduleStore",
    "Busy",
    "Connecting",
    "DecodeRecordOptions",
    "EnqueueCallback",
    "FencingCheckpointer",
    "Inbox",
    "OutboxRow",
    "QueueCounts",
    "RawMessage",
    "Record",
    "Refused",
    "RoundTrips",
    "StoreURL",
    "Wakeups",
    "Write",
    "confirm_save",
    "confirmed_save",
    "decode_intent",
    "decode_message",
    "decode_record",
    "decode_snapshot",
    "deprecated_names",
    "encode_intent",
    "encode_record",
    "encode_snapshot",
    "message_row_id",
    "new_write_id",
    "next_fencing_token",
    "open_scratch",
    "present_as_public",
    "recent_second",
    "register_backend",
    "scan_recent",
    "show_id",
    "sibling_url",
    "validate_schedule_name",
    "validate_thread_id",
]


# Reprs and tracebacks say flowy.storage.dialect.X, not the private module.
present_as_public(__name__, globals(), __all__, "flowy.storage._")
