"""flowy-postgres: flowy's storage on PostgreSQL (asyncpg).

A native strict-OCC checkpointer whose saves are fenced by run leases in the same
statement, a lease manager on the database clock, a hand-off outbox that commits with the
checkpoint (or with the application's own transaction), and an outbox consumer with
visibility timeouts, LISTEN/NOTIFY wake-ups and dead letters::

    backend = await PostgresBackend.from_dsn("postgresql://localhost/app")
    await backend.migrate()
    # backend.checkpointer, backend.leases, backend.outbox, backend.consumer
"""

from __future__ import annotations

from ._backend import PostgresBackend as PostgresBackend
from ._checkpointer import PostgresCheckpointer as PostgresCheckpointer
from ._checkpointer import PostgresTransaction as PostgresTransaction
from ._conn import create_pool as create_pool
from ._lease import PostgresLeaseManager as PostgresLeaseManager
from ._outbox import PostgresOutbox as PostgresOutbox
from ._outbox import PostgresOutboxConsumer as PostgresOutboxConsumer
from ._schema import DEFAULT_PREFIX as DEFAULT_PREFIX
from ._schema import DEFAULT_SCHEMA as DEFAULT_SCHEMA
from ._schema import SCHEMA_VERSION as SCHEMA_VERSION
from ._schema import migrate as migrate
from ._schema import schema_sql as schema_sql
from ._schema import schema_version as schema_version

__all__ = [
    "DEFAULT_PREFIX",
    "DEFAULT_SCHEMA",
    "PostgresBackend",
    "PostgresCheckpointer",
    "PostgresLeaseManager",
    "PostgresOutbox",
    "PostgresOutboxConsumer",
    "PostgresTransaction",
    "SCHEMA_VERSION",
    "create_pool",
    "migrate",
    "schema_sql",
    "schema_version",
]


def _present_as_public() -> None:
    # Tracebacks and reprs say flowy_postgres.PostgresCheckpointer, not the private module.
    for name in __all__:
        obj = globals()[name]
        if getattr(obj, "__module__", "").startswith("flowy_postgres._"):
            try:
                obj.__module__ = "flowy_postgres"
            except (AttributeError, TypeError):
                pass


_present_as_public()
del _present_as_public
