"""Translation of asyncpg and socket errors into flowy's exception tree.

Every statement this package runs is wrapped in :func:`translated`, so callers only ever
see flowy errors::

    connection lost, server shutting down, timeouts,   -> flowy.StorageUnavailableError
    too many connections, deadlock, lock/statement        (the outcome of a write may be
    timeouts                                               unknown: reload to find out)
    missing table or schema                            -> flowy.SchemaVersionError
                                                          (run migrate())
    any other PostgreSQL or driver error               -> flowy.StorageError

flowy's own errors and ``asyncio.CancelledError`` pass through unchanged, as do errors
that are not the driver's (a failing codec, a bug in an enqueue callback).
"""

from __future__ import annotations

from collections.abc import Generator
from contextlib import contextmanager
from typing import Protocol

import asyncpg
import asyncpg.exceptions as pg

from flowy import FlowyError, SchemaVersionError, StorageError, StorageUnavailableError

__all__ = ["show_id", "translate", "translated"]

_UNAVAILABLE: tuple[type[BaseException], ...] = (
    pg.PostgresConnectionError,  # class 08: connection exceptions
    pg.OperatorInterventionError,  # class 57: admin shutdown, crash, query canceled
    pg.InsufficientResourcesError,  # class 53: too many connections, out of memory
    pg.TransactionRollbackError,  # class 40: deadlock, serialization failure
    pg.LockNotAvailableError,  # 55P03: lock_timeout
    OSError,  # includes ConnectionError and socket errors
    TimeoutError,
)
_NOT_MIGRATED: tuple[type[BaseException], ...] = (
    pg.UndefinedTableError,
    pg.InvalidSchemaNameError,
)
_DRIVER: tuple[type[BaseException], ...] = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    pg.InternalClientError,
)
_MAX_SHOWN = 120


def show_id(thread_id: str) -> str:
    """``repr`` of a thread id for messages, shortened when it is very long."""
    if len(thread_id) <= _MAX_SHOWN:
        return repr(thread_id)
    return f"{thread_id[:_MAX_SHOWN]!r}... ({len(thread_id)} characters)"


class _Closable(Protocol):
    def is_closed(self) -> bool: ...


def translate(
    exc: Exception,
    action: str,
    connection: _Closable | None = None,
    *,
    may_have_written: bool = True,
) -> Exception:
    """The flowy error for ``exc`` raised while trying to ``action`` (or ``exc`` itself
    when it is not a driver error). ``may_have_written=False`` for steps that cannot
    have written anything (connecting, taking a pooled connection)."""
    if isinstance(exc, FlowyError):
        return exc
    detail = f"{type(exc).__name__}: {exc}"
    driver = isinstance(exc, _DRIVER)
    broken = driver and connection is not None and _closed(connection)
    if isinstance(exc, _UNAVAILABLE) or broken:
        if not may_have_written:
            return StorageUnavailableError(
                f"could not {action}: PostgreSQL is unavailable ({detail}); check that the "
                "server is running and that the DSN (host, port, user, database) is right"
            )
        return StorageUnavailableError(
            f"could not {action}: PostgreSQL is unavailable or the connection broke "
            f"({detail}); a write may or may not have been applied, so reload before "
            f"retrying (flowy.checkpoint.durable_save does this for saves)"
        )
    if isinstance(exc, _NOT_MIGRATED):
        return SchemaVersionError(
            f"could not {action}: the flowy tables are missing ({detail}); run "
            f"`await flowy_postgres.migrate(pool, schema=..., prefix=...)` with the same "
            f"schema and prefix first"
        )
    if driver:
        sqlstate = getattr(exc, "sqlstate", None)
        code = f" (SQLSTATE {sqlstate})" if sqlstate else ""
        return StorageError(f"could not {action}: PostgreSQL reported {detail}{code}")
    return exc


def _closed(connection: _Closable) -> bool:
    try:
        return connection.is_closed()
    except Exception:
        return True


@contextmanager
def translated(action: str, connection: _Closable | None = None) -> Generator[None]:
    """Re-raise driver errors of the block as flowy errors (``raise ... from exc``)."""
    try:
        yield
    except Exception as exc:
        err = translate(exc, action, connection)
        if err is exc:
            raise
        raise err from exc
