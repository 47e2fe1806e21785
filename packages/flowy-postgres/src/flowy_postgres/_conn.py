"""Where connections come from: the backend's pool, or an application's own connection.

asyncpg ships no type information for its pool and connection methods; the protocols
here describe the calls this package makes so the rest of it type-checks strictly.

A :class:`Connector` hands out a connection for one operation: from the pool (with a
bounded acquire timeout, so an exhausted pool is an error naming its size rather than a
hang), or the connection an application bound with ``PostgresCheckpointer.bind`` (an
asyncpg connection, or a SQLAlchemy ``AsyncConnection`` on the asyncpg driver). Driver
errors raised inside are translated at this one boundary.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import urllib.parse
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

import asyncpg

from flowy.errors import BackendURLError, StorageUnavailableError

from ._errors import translate

if TYPE_CHECKING:
    from asyncpg.pool import PoolConnectionProxy
    from sqlalchemy.ext.asyncio import AsyncConnection

    from ._schema import TableNames

__all__ = ["Connector", "PgConnection", "PgPool", "Row", "atomic", "create_pool"]

T = TypeVar("T")

_log = logging.getLogger("flowy_postgres")
_driver: Any = asyncpg  # asyncpg's own signatures are untyped


class Row(Protocol):
    """A result row (``asyncpg.Record``)."""

    def __getitem__(self, key: int | str, /) -> Any: ...


class PgConnection(Protocol):
    """The part of ``asyncpg.Connection`` (or a pool's proxy of one) this package uses."""

    async def fetchrow(self, query: str, *args: object) -> Row | None: ...

    async def fetch(self, query: str, *args: object) -> list[Row]: ...

    async def fetchval(self, query: str, *args: object) -> Any: ...

    async def execute(self, query: str, *args: object) -> str: ...

    def transaction(self) -> AbstractAsyncContextManager[object]: ...

    def is_closed(self) -> bool: ...

    def is_in_transaction(self) -> bool: ...

    async def add_listener(
        self, channel: str, callback: Callable[[Any, int, str, str], object]
    ) -> None: ...

    async def remove_listener(
        self, channel: str, callback: Callable[[Any, int, str, str], object]
    ) -> None: ...

    def add_termination_listener(self, callback: Callable[[Any], object]) -> None: ...

    def remove_termination_listener(self, callback: Callable[[Any], object]) -> None: ...

    async def close(self) -> None: ...


class PgPool(Protocol):
    """The part of ``asyncpg.Pool`` this package uses."""

    def acquire(self) -> Awaitable[PgConnection]: ...

    async def release(self, connection: PgConnection) -> None: ...

    def get_max_size(self) -> int: ...

    def is_closing(self) -> bool: ...

    async def close(self) -> None: ...


def _is_asyncpg(target: object) -> bool:
    from asyncpg.pool import PoolConnectionProxy

    return isinstance(target, asyncpg.Connection | PoolConnectionProxy)


def _is_sqlalchemy(target: object) -> bool:
    try:
        from sqlalchemy.ext.asyncio import AsyncConnection
    except ImportError:  # the [sqlalchemy] extra is not installed
        return False
    return isinstance(target, AsyncConnection)


async def _resolve(target: object) -> PgConnection:
    """The asyncpg connection behind a bound target, joining its transaction."""
    if _is_asyncpg(target):
        return cast(PgConnection, target)
    sa = cast("AsyncConnection", target)
    if sa.dialect.driver != "asyncpg":
        raise TypeError(
            f"bind() needs a SQLAlchemy AsyncConnection on the asyncpg driver, got one on "
            f"{sa.dialect.driver!r}; create the engine with a 'postgresql+asyncpg://' URL"
        )
    raw = await sa.get_raw_connection()
    conn = cast(PgConnection, raw.driver_connection)
    if sa.in_transaction() and not conn.is_in_transaction():
        # SQLAlchemy begins the driver's transaction lazily, at its first statement: run
        # one, so that ours join the application's transaction instead of autocommitting.
        await sa.exec_driver_sql("SELECT 1")
    return conn


class Connector:
    """Connections for the components of one backend: pooled, or one bound application
    connection (:meth:`bind`). The pool is set when the backend opens."""

    def __init__(self, names: TableNames, *, acquire_timeout: float, domain: object) -> None:
        if not acquire_timeout > 0:  # also rejects NaN
            raise ValueError(f"acquire_timeout must be positive seconds, got {acquire_timeout!r}")
        self.names = names
        self.acquire_timeout = acquire_timeout
        self.domain = domain
        self.pool: asyncpg.Pool | None = None
        self.bound: object = None

    def bind(self, target: asyncpg.Connection | PoolConnectionProxy | AsyncConnection) -> Connector:
        """A connector that runs everything on ``target`` (same names and domain)."""
        if not (_is_asyncpg(target) or _is_sqlalchemy(target)):
            raise TypeError(
                "bind() needs an asyncpg connection or a SQLAlchemy AsyncConnection on the "
                f"asyncpg driver, got {type(target).__name__} {target!r:.80}"
            )
        view = Connector(self.names, acquire_timeout=self.acquire_timeout, domain=self.domain)
        view.pool, view.bound = self.pool, target
        return view

    def _pool(self, action: str) -> PgPool:
        pool = cast(PgPool | None, self.pool)
        if pool is None or pool.is_closing():
            state = "not open yet" if pool is None else "closed"
            raise StorageUnavailableError(
                f"could not {action}: the PostgreSQL backend is {state}; open it with "
                "flowy.connect(url) or `async with backend`, and use it before aclose()"
            )
        return pool

    async def acquire(self, action: str) -> PgConnection:
        """A pooled connection (give it back with :meth:`release`)."""
        return (await self._acquire(action))[1]

    async def release(self, conn: PgConnection) -> None:
        """Give a connection from :meth:`acquire` back to the pool."""
        await cast(PgPool, self.pool).release(conn)

    async def _acquire(self, action: str) -> tuple[PgPool, PgConnection]:
        pool = self._pool(action)
        try:
            # asyncio.timeout arms one timer; asyncpg's own acquire(timeout=) would run
            # the wait in an extra task and time the release too (a cost on every save).
            async with asyncio.timeout(self.acquire_timeout):
                conn = await pool.acquire()
                if conn.is_closed():  # the server closed it while idle: take a fresh one
                    await pool.release(conn)
                    conn = await pool.acquire()
        except TimeoutError as exc:
            raise StorageUnavailableError(
                f"could not {action}: no PostgreSQL connection became free within "
                f"{self.acquire_timeout}s (the pool holds at most {pool.get_max_size()} "
                "connections, all in use); raise pool_size, run fewer operations at once, "
                "or raise acquire_timeout"
            ) from exc
        except Exception as exc:
            err = translate(exc, action, may_have_written=False)
            if err is exc:
                raise
            raise err from exc
        return pool, conn

    @staticmethod
    def _release_soon(pool: PgPool, conn: PgConnection) -> None:
        # asyncpg returns a connection through a shielded task, which costs the caller
        # two turns of the event loop; after a successful operation that work can
        # overlap with whatever the caller does next.
        task = asyncio.get_running_loop().create_task(pool.release(conn))
        _releasing.add(task)
        task.add_done_callback(_released)

    @asynccontextmanager
    async def connection(self, action: str) -> AsyncGenerator[PgConnection]:
        """A connection for one operation; driver errors in the block are translated
        and a pooled connection goes back to the pool afterwards."""
        if self.bound is not None:
            conn: PgConnection | None = None
            try:
                conn = await _resolve(self.bound)
                yield conn
            except Exception as exc:
                err = translate(exc, action, conn)
                if err is exc:
                    raise
                raise err from exc
            return
        pool, conn = await self._acquire(action)
        try:
            yield conn
        except BaseException as exc:
            await pool.release(conn)
            if isinstance(exc, Exception):
                err = translate(exc, action, conn)
                if err is not exc:
                    raise err from exc
            raise
        self._release_soon(pool, conn)

    async def read(self, action: str, query: Callable[[PgConnection], Awaitable[T]]) -> T:
        """Run a read-only ``query``; a pooled connection found broken is replaced once
        (only for reads: repeating them is harmless, unlike a write that may have landed)."""
        if self.bound is None:
            pool, conn = await self._acquire(action)
            try:
                result = await query(conn)
            except Exception as exc:
                broken = conn.is_closed()
                await pool.release(conn)
                if not broken:
                    err = translate(exc, action)
                    if err is exc:
                        raise
                    raise err from exc
            except BaseException:
                await pool.release(conn)
                raise
            else:
                self._release_soon(pool, conn)
                return result
        async with self.connection(action) as conn:
            return await query(conn)


_releasing: set[asyncio.Task[None]] = set()
"""Background releases in flight (a task needs a strong reference until it is done)."""


def _released(task: asyncio.Task[None]) -> None:
    _releasing.discard(task)
    if not task.cancelled() and (error := task.exception()) is not None:
        _log.warning("flowy_postgres: returning a connection to the pool failed: %r", error)


@asynccontextmanager
async def atomic(conn: PgConnection) -> AsyncGenerator[None]:
    """Run the block in a transaction: its own, or a savepoint inside the caller's.

    Savepoints are issued as SQL so this works whoever began the outer transaction
    (asyncpg's ``transaction()``, SQLAlchemy, or a plain ``BEGIN``).
    """
    if not conn.is_in_transaction():
        async with conn.transaction():
            yield
        return
    await conn.execute("SAVEPOINT flowy_atomic")
    try:
        yield
    except BaseException:
        # If even this fails, the outer transaction is aborted and cannot commit; the
        # error worth reporting is the one that got us here.
        with contextlib.suppress(Exception):
            await conn.execute("ROLLBACK TO SAVEPOINT flowy_atomic")
            await conn.execute("RELEASE SAVEPOINT flowy_atomic")
        raise
    await conn.execute("RELEASE SAVEPOINT flowy_atomic")


async def _keep_session(connection: object) -> None:
    """A pool ``reset`` that sends nothing: flowy leaves no session state behind."""


async def create_pool(
    dsn: str,
    *,
    pooler_mode: bool = False,
    min_size: int = 1,
    max_size: int = 10,
    **options: Any,
) -> asyncpg.Pool:
    """``asyncpg.create_pool`` with flowy's settings.

    Connections go back to the pool without asyncpg's reset query (``RESET ALL``,
    ``UNLISTEN *``, ...): flowy leaves no session state on them, and that query costs one
    more round trip per operation. If your own code leaves session state on this pool
    (``SET``, session advisory locks, ``LISTEN``), pass ``reset=None`` for asyncpg's
    default. ``pooler_mode=True`` is for a transaction-mode pooler such as PgBouncer: it
    sets ``statement_cache_size=0``, so asyncpg uses only unnamed statements, which do not
    outlive a transaction. Other keyword arguments go to ``asyncpg.create_pool``. Errors
    never show the password.
    """
    create = cast(Callable[..., Awaitable[asyncpg.Pool]], _driver.create_pool)
    if options.get("reset", _keep_session) is None:
        del options["reset"]
    else:
        options.setdefault("reset", _keep_session)
    if pooler_mode:
        options["statement_cache_size"] = 0
    try:
        return await create(dsn, min_size=min_size, max_size=max_size, **options)
    except Exception as exc:
        try:
            secret = urllib.parse.urlsplit(dsn).password
        except ValueError:
            secret = None
        err = translate(exc, "connect to PostgreSQL", may_have_written=False, secret=secret)
        if err is not exc:
            raise err from exc
        if not isinstance(exc, ValueError):
            raise
        detail = str(exc).replace(secret, "***") if secret else str(exc)
        raise BackendURLError(f"cannot use this PostgreSQL URL: {detail}") from None
