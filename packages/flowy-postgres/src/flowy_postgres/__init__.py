"""flowy-postgres: flowy's store on PostgreSQL (asyncpg).

``flowy.connect`` opens a :class:`PostgresBackend`: fenced strict-OCC checkpoints,
leases on the database clock, and a hand-off outbox that commits with the checkpoint (or
the application's own transaction, through ``checkpointer.bind``)::

    async with flowy.connect("postgresql://app@db/app?schema=flowy") as backend:
        runner = flowy.Runner(graph, backend)
"""

from __future__ import annotations

import warnings
from importlib import metadata as _metadata

from ._backend import DRIVER_OPTIONS as DRIVER_OPTIONS
from ._backend import OPTIONS as OPTIONS
from ._backend import PostgresBackend as PostgresBackend
from ._backend import open_backend as open_backend
from ._checkpointer import PostgresCheckpointer as PostgresCheckpointer
from ._conn import create_pool as create_pool
from ._lease import PostgresLeaseManager as PostgresLeaseManager
from ._outbox import PostgresConsumer as PostgresConsumer
from ._outbox import PostgresOutbox as PostgresOutbox
from ._schedules import PostgresScheduleStore as PostgresScheduleStore
from ._schema import DEFAULT_PREFIX as DEFAULT_PREFIX
from ._schema import DEFAULT_SCHEMA as DEFAULT_SCHEMA
from ._schema import SCHEMA_VERSION as SCHEMA_VERSION
from ._schema import migrate as migrate
from ._schema import schema_sql as schema_sql
from ._schema import schema_version as schema_version

__version__: str = _metadata.version("flowy-postgres")
"""The installed version of flowy-postgres."""

__all__ = [
    "DEFAULT_PREFIX",
    "DEFAULT_SCHEMA",
    "DRIVER_OPTIONS",
    "OPTIONS",
    "PostgresBackend",
    "PostgresCheckpointer",
    "PostgresConsumer",
    "PostgresLeaseManager",
    "PostgresOutbox",
    "PostgresScheduleStore",
    "SCHEMA_VERSION",
    "create_pool",
    "open_backend",
    "schema_sql",
    "schema_version",
]


def __getattr__(name: str) -> object:
    if name == "PostgresOutboxConsumer":  # its 0.1 name, until 0.3
        warnings.warn("use PostgresConsumer", DeprecationWarning, stacklevel=2)
        return PostgresConsumer
    raise AttributeError(f"module 'flowy_postgres' has no attribute {name!r}")


def _present_as_public() -> None:
    for name in __all__:  # reprs and tracebacks say flowy_postgres.X, not a private module
        if getattr(obj := globals()[name], "__module__", "").startswith("flowy_postgres._"):
            obj.__module__ = __name__


_present_as_public()
del _present_as_public
