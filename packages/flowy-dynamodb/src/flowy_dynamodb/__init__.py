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


# Reprs and tracebacks say flowy_dynamodb.X, not the private module.
_present_as_public(__name__, globals(), __all__, "flowy_dynamodb._")
