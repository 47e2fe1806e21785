"""DynamoDB backend for flowy (boto3): a strict-OCC checkpointer with native fencing,
fenced run leases and a transactional hand-off outbox, all in one table.

Install with ``pip install "flowy-core[dynamodb]"``. Create the table once with
:func:`create_table`, then build the components (or a :class:`DynamoBackend`) over a
boto3 client.
"""

from __future__ import annotations

from ._backend import DynamoBackend as DynamoBackend
from ._checkpointer import DEFAULT_INDEX_SHARDS as DEFAULT_INDEX_SHARDS
from ._checkpointer import DynamoCheckpointer as DynamoCheckpointer
from ._executor import DEFAULT_MAX_WORKERS as DEFAULT_MAX_WORKERS
from ._executor import DynamoExecutor as DynamoExecutor
from ._lease import DEFAULT_CLOCK_SKEW as DEFAULT_CLOCK_SKEW
from ._lease import DynamoLeaseManager as DynamoLeaseManager
from ._outbox import DEFAULT_OUTBOX_SHARDS as DEFAULT_OUTBOX_SHARDS
from ._outbox import DynamoOutbox as DynamoOutbox
from ._outbox import DynamoOutboxConsumer as DynamoOutboxConsumer
from ._table import INDEX_NAME as INDEX_NAME
from ._table import MAX_ITEM_BYTES as MAX_ITEM_BYTES
from ._table import TTL_ATTRIBUTE as TTL_ATTRIBUTE
from ._table import DynamoTransaction as DynamoTransaction
from ._table import create_table as create_table
from ._table import make_client as make_client
from ._table import thread_key as thread_key

__all__ = [
    "DEFAULT_CLOCK_SKEW",
    "DEFAULT_INDEX_SHARDS",
    "DEFAULT_MAX_WORKERS",
    "DEFAULT_OUTBOX_SHARDS",
    "INDEX_NAME",
    "MAX_ITEM_BYTES",
    "TTL_ATTRIBUTE",
    "DynamoBackend",
    "DynamoCheckpointer",
    "DynamoExecutor",
    "DynamoLeaseManager",
    "DynamoOutbox",
    "DynamoOutboxConsumer",
    "DynamoTransaction",
    "create_table",
    "make_client",
    "thread_key",
]


def _public_module() -> None:
    # Tracebacks and reprs name flowy_dynamodb.X, not the private module X lives in.
    for name in __all__:
        obj = globals()[name]
        if callable(obj) and getattr(obj, "__module__", "").startswith("flowy_dynamodb."):
            obj.__module__ = "flowy_dynamodb"


_public_module()
del _public_module
