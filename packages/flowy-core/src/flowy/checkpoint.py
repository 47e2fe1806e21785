"""Storage-facing API: the record envelope, state codecs and the backend protocols.

Adapters build on this module: they store ``encode_snapshot`` / ``encode_record`` bytes
and read them back with ``decode_snapshot`` / ``decode_record``, which validate the
envelope against the storage address and raise ``SnapshotEnvelopeInvalidError`` on any
mismatch or corruption.
"""

from __future__ import annotations

from ._checkpoint import MAX_THREAD_ID_BYTES as MAX_THREAD_ID_BYTES
from ._checkpoint import Checkpointer as Checkpointer
from ._checkpoint import EnqueueCallback as EnqueueCallback
from ._checkpoint import FencingCheckpointer as FencingCheckpointer
from ._checkpoint import HandoffIntent as HandoffIntent
from ._checkpoint import HandoffOutbox as HandoffOutbox
from ._checkpoint import HandoffStatus as HandoffStatus
from ._checkpoint import Lease as Lease
from ._checkpoint import LeaseManager as LeaseManager
from ._checkpoint import OutboxConsumer as OutboxConsumer
from ._checkpoint import OutboxMessage as OutboxMessage
from ._checkpoint import ResumeToken as ResumeToken
from ._checkpoint import RunStatus as RunStatus
from ._checkpoint import Snapshot as Snapshot
from ._checkpoint import ThreadSummary as ThreadSummary
from ._checkpoint import TransactionalCheckpointer as TransactionalCheckpointer
from ._checkpoint import TransactionalHandoffOutbox as TransactionalHandoffOutbox
from ._checkpoint import decode_intent as decode_intent
from ._checkpoint import encode_intent as encode_intent
from ._checkpoint import new_write_id as new_write_id
from ._checkpoint import validate_thread_id as validate_thread_id
from ._codecs import JSONCodec as JSONCodec
from ._codecs import MsgspecCodec as MsgspecCodec
from ._codecs import StateCodec as StateCodec
from ._records import FORMAT_VERSION as FORMAT_VERSION
from ._records import DecodeRecordOptions as DecodeRecordOptions
from ._records import Record as Record
from ._records import decode_record as decode_record
from ._records import decode_snapshot as decode_snapshot
from ._records import encode_record as encode_record
from ._records import encode_snapshot as encode_snapshot

__all__ = [
    "FORMAT_VERSION",
    "MAX_THREAD_ID_BYTES",
    "Checkpointer",
    "DecodeRecordOptions",
    "EnqueueCallback",
    "FencingCheckpointer",
    "HandoffIntent",
    "HandoffOutbox",
    "HandoffStatus",
    "JSONCodec",
    "Lease",
    "LeaseManager",
    "MsgspecCodec",
    "OutboxConsumer",
    "OutboxMessage",
    "Record",
    "ResumeToken",
    "RunStatus",
    "Snapshot",
    "StateCodec",
    "ThreadSummary",
    "TransactionalCheckpointer",
    "TransactionalHandoffOutbox",
    "decode_intent",
    "decode_record",
    "decode_snapshot",
    "encode_intent",
    "encode_record",
    "encode_snapshot",
    "new_write_id",
    "validate_thread_id",
]

from ._saving import confirm_save as confirm_save
from ._saving import durable_save as durable_save

__all__ += ["confirm_save", "durable_save"]
