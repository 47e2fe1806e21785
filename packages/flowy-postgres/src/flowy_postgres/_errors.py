"""Translation of asyncpg and socket errors into flowy's exception tree.

It happens at the one boundary where statements run (the connector), so callers only
ever see flowy errors::

    connection lost, server shutting down, timeouts,  -> StorageUnavailableError (a write's
    too many connections, deadlock, lock timeout         outcome may be unknown: reload)
    missing table or schema                           -> SchemaVersionError
    missing database                                  -> StorageError naming createdb
    any other PostgreSQL or driver error              -> StorageError

flowy's own errors, ``asyncio.CancelledError`` and errors that are not the driver's pass
through unchanged.
"""

from __future__ import annotations

import re
from typing import Protocol

import asyncpg
import asyncpg.exceptions as pg

from flowy.errors import FlowyError, SchemaVersionError, StorageError, StorageUnavailableError
from flowy.storage.dialect import StoreURL

__all__ = ["translate"]

_UNAVAILABLE: tuple[type[BaseException], ...] = (
    pg.PostgresConnectionError,  # class 08: connection exceptions
    pg.OperatorInterventionError,  # class 57: admin shutdown, crash, query canceled
    pg.InsufficientResourcesError,  # class 53: too many connections, out of memory
    pg.TransactionRollbackError,  # class 40: deadlock, serialization failure
    pg.LockNotAvailableError,  # 55P03: lock_timeout
    OSError,  # includes ConnectionError and socket errors
    TimeoutError,
)
_NOT_MIGRATED: tuple[type[BaseException], ...] = (pg.UndefinedTableError, pg.InvalidSchemaNameError)
_DRIVER = (asyncpg.PostgresError, asyncpg.InterfaceError, pg.InternalClientError)


class _Closable(Protocol):
    def is_closed(self) -> bool: ...


def translate(
    exc: Exception,
    action: str,
    connection: _Closable | None = None,
    *,
    may_have_written: bool = True,
    url: str | None = None,
) -> Exception:
    """The flowy error for ``exc`` raised while trying to ``action`` (or ``exc`` itself
    when it is not a driver error). ``may_have_written=False`` for steps that cannot
    have written anything (connecting, taking a pooled connection); the password of
    ``url`` is masked should the driver's message contain it."""
    if isinstance(exc, FlowyError):
        return exc
    detail = f"{type(exc).__name__}: {exc}"
    if url is not None:
        detail = StoreURL.mask_password(detail, url)
    driver = isinstance(exc, _DRIVER)
    if isinstance(exc, _UNAVAILABLE) or (driver and connection is not None and _closed(connection)):
        if not may_have_written:
            return StorageUnavailableError(
                f"could not {action}: PostgreSQL is unavailable ({detail}); check that the "
                "server is running and that the URL (host, port, user, database) is right"
            )
        return StorageUnavailableError(
            f"could not {action}: PostgreSQL is unavailable or the connection broke "
            f"({detail}); a write may or may not have been applied, so reload before "
            "retrying (flowy.storage.dialect.confirmed_save does this for saves)"
        )
    if isinstance(exc, _NOT_MIGRATED):
        return SchemaVersionError(
            f"could not {action}: the flowy tables are missing ({detail}); run "
            "`await backend.setup()` with the same schema and prefix first"
        )
    if isinstance(exc, pg.InvalidCatalogNameError):
        found = re.search(r'database "(.+)" does not exist', str(exc))
        name = found.group(1) if found else "NAME"
        return StorageError(
            f"could not {action}: PostgreSQL reported {detail} (SQLSTATE 3D000); flowy "
            f"creates its schema and tables but not the database: create it first with "
            f"`createdb {name}` or `psql -c 'CREATE DATABASE \"{name}\"'`"
        )
    if driver:
        sqlstate = getattr(exc, "sqlstate", None)
        code = f" (SQLSTATE {sqlstate})" if sqlstate else ""
        return StorageError(f"could not {action}: PostgreSQL reported {detail}{code}")
    return exc


def _closed(connection: _Closable) -> bool:
    try:
        return connection.is_closed()
    except Exception:  # noqa: BLE001 - a connection that cannot say counts as closed
        return True
