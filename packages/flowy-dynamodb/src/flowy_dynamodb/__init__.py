"""DynamoDB store for flowy (boto3): a strict-OCC checkpointer with native fencing, fenced
run leases and a transactional hand-off outbox with its consumer, all in one table.

Install with ``pip install "flowy-core[dynamodb]"`` and open a store with
``await flowy.connect("dynamodb://TABLE?region=eu-west-1")``, or build a
:class:`DynamoBackend` over your own boto3 client with :meth:`DynamoBackend.from_client`.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata as _metadata
from typing import Any

from flowy.storage.dialect import deprecated_names as _deprecated_names
from flowy.storage.dialect import present_as_public as _present_as_public

from ._backend import OPTIONS as OPTIONS
from ._backend import DynamoBackend as DynamoBackend
from ._backend import open_backend as open_backend
from ._checkpointer import DynamoCheckpointer as DynamoCheckpointer
from ._layout import MAX_ITEM_BYTES as MAX_ITEM_BYTES
from ._layout import thread_key as thread_key
from ._leases import DynamoLeaseManager as DynamoLeaseManager
from ._outbox import DynamoConsumer as DynamoConsumer
from ._outbox import DynamoOutbox as DynamoOutbox
from ._schedules import DynamoScheduleStore as DynamoScheduleStore
from ._schema import SCHEMA_VERSION as SCHEMA_VERSION
from ._schema import make_client as make_client
from ._table import ClockSkewError as ClockSkewError
from ._table import DynamoTable as DynamoTable

__version__: str = _metadata.version("flowy-dynamodb")
"""The installed version of flowy-dynamodb."""

__all__ = [
    "MAX_ITEM_BYTES",
    "OPTIONS",
    "SCHEMA_VERSION",
    "ClockSkewError",
    "DynamoBackend",
    "DynamoCheckpointer",
    "DynamoConsumer",
    "DynamoLeaseManager",
    "DynamoOutbox",
    "DynamoScheduleStore",
    "DynamoTable",
    "make_client",
    "open_backend",
    "thread_key",
]


# Until 0.4: one setup verb for every store.
__getattr__: Callable[[str], Any] = _deprecated_names(
    __name__,
    {"create_table": ("flowy_dynamodb._schema:create_table", "use `await backend.setup()`")},
)


# Reprs and tracebacks say flowy_dynamodb.X, not the private module.
_present_as_public(__name__, globals(), __all__, "flowy_dynamodb._")
