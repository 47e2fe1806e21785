"""DynamoDB store for flowy (boto3): a strict-OCC checkpointer with native fencing, fenced
run leases and a transactional hand-off outbox with its consumer, all in one table.

Install with ``pip install "flowy-core[dynamodb]"`` and open a store with
``await flowy.connect("dynamodb://TABLE?region=eu-west-1")``, or build a
:class:`DynamoBackend` over your own boto3 client with :meth:`DynamoBackend.from_client`.
"""

from __future__ import annotations

import warnings
from importlib import metadata as _metadata
from typing import Any

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


def __getattr__(name: str) -> Any:
    if name == "create_table":  # until 0.4: one setup verb for every store
        warnings.warn(
            "flowy_dynamodb.create_table is deprecated; use `await backend.setup()`",
            DeprecationWarning,
            stacklevel=2,
        )
        from ._schema import create_table

        return create_table
    raise AttributeError(f"module 'flowy_dynamodb' has no attribute {name!r}")


def _present_as_public() -> None:
    """Make tracebacks and reprs say ``flowy_dynamodb.X`` rather than the private module."""
    for name in __all__:
        obj = globals()[name]
        if getattr(obj, "__module__", "").startswith("flowy_dynamodb."):
            obj.__module__ = __name__


_present_as_public()
del _present_as_public
