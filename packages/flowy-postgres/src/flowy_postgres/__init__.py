"""flowy-postgres: flowy's store on PostgreSQL (asyncpg).

``flowy.connect`` opens a :class:`PostgresBackend`: fenced strict-OCC checkpoints,
leases on the database clock, and a hand-off outbox that commits with the checkpoint (or
the application's own transaction, through ``checkpointer.bind``)::

    async with flowy.connect("postgresql://app@db/app?schema=flowy") as backend:
        runner = flowy.Runner(graph, backend)
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata as _metadata

from flowy.storage.dialect import deprecated_names as _deprecated_names
from flowy.storage.dialect import present_as_public as _present_as_public

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


# PostgresOutboxConsumer: PostgresConsumer's 0.1 name, until 0.3.
__getattr__: Callable[[str], object] = _deprecated_names(
    __name__,
    {"PostgresOutboxConsumer": ("flowy_postgres._outbox:PostgresConsumer", "use PostgresConsumer")},
)


# Reprs and tracebacks say flowy_postgres.X, not the private module.
_present_as_public(__name__, globals(), __all__, "flowy_postgres._")
