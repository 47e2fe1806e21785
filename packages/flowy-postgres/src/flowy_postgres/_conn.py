"""Where connections come from: the backend's pool (a bounded wait, then an error naming
its size), or an application's connection bound with ``PostgresCheckpointer.bind``
(asyncpg, or SQLAlchemy's ``AsyncConnection`` on asyncpg). Driver errors are translated
at this one boundary. The protocols type the asyncpg calls made (asyncpg has no types).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from flowy.errors import BackendURLError, StorageUnavailableError
from flowy.storage.dialect import StoreURL

from ._errors import translate
from ._names import TableNames

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

__all__ = ["Connector", "PgConnection", "PgPool", "Row", "create_pool"]

T = TypeVar("T")

_log = logging.getLogger("flowy_postgres")
_driver: Any = asyncpg  # asyncpg's own signatures are untyped
Listener = Callable[..., object]


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
    async def add_listener(self, channel: str, callback: Listener) -> None: ...
    async def remove_listener(self, channel: str, callback: Listener) -> None: ...
    def add_termination_listener(self, callback: Listener) -> None: ...
    def remove_termination_listener(self, callback: Listener) -> None: ...
    async def close(self) -> None: ...


class PgPool(Protocol):
    """The part of ``asyncpg.Pool`` this package uses."""

    def acquire(self) -> Awaitable[PgConnection]: ...
    async def release(self, connection: PgConnection) -> None: ...
    def get_max_size(self) -> int: ...
    def is_closing(self) -> bool: ...
    async def close(self) -> None: ...


def _sqlalchemy(target: object) -> AsyncConnection | None:
    try:
        from sqlalchemy.ext.asyncio import AsyncConnection
    except ImportError:  # the [sqlalchemy] extra is not installed
        return None
    return target if isinstance(target, AsyncConnection) else None


class Connector:
    """Connections for the components of one backend: pooled, or one bound application
    connection (:meth:`bind`). The backend sets ``pool`` when it opens."""

    def __init__(self, names: TableNames, *, acquire_timeout: float, domain: object) -> None:
        if not acquire_timeout > 0:  # also rejects NaN
            raise ValueError(f"acquire_timeout must be positive seconds, got {acquire_timeout!r}")
        self.names = names
        self.acquire_timeout = acquire_timeout
        self.domain = domain
        self.pool: asyncpg.Pool | None = None
        self.bound: asyncpg.Connection | PoolConnectionProxy | AsyncConnection | None = None
        self.keep: int = 0
        """How many connections to keep in hand between operations (a backend that owns
        its pool keeps up to half of it; the rest stays with the pool)."""
        self._idle: list[PgConnection] = []  # kept, free: taken without asking the pool
        self._waiting = 0  # operations waiting for the pool (a kept connection goes back)

    def bind(self, target: asyncpg.Connection | PoolConnectionProxy | AsyncConnection) -> Connector:
        """A connector that runs everything on ``target`` (same names and domain)."""
        sa = _sqlalchemy(target)
        if sa is None and not isinstance(target, asyncpg.Connection | PoolConnectionProxy):
            raise TypeError(
                "bind() needs an asyncpg connection or a SQLAlchemy AsyncConnection on the "
                f"asyncpg driver, got {type(target).__name__} {target!r:.80}"
            )
        if sa is not None and sa.dialect.driver != "asyncpg":
            raise TypeError(
                "bind() needs a SQLAlchemy AsyncConnection on the asyncpg driver, got one on "
                f"{sa.dialect.driver!r}; create the engine with a 'postgresql+asyncpg://' URL"
            )
        view = Connector(self.names, acquire_timeout=self.acquire_timeout, domain=self.domain)
        view.pool, view.bound = self.pool, target
        return view

    async def _bound(self) -> PgConnection:
        sa = _sqlalchemy(self.bound)
        if sa is None:
            return cast(PgConnection, self.bound)
        conn = cast(PgConnection, (await sa.get_raw_connection()).driver_connection)
        if sa.in_transaction() and not conn.is_in_transaction():
            # SQLAlchemy begins the driver's transaction lazily, at its first statement:
            # run one, so that ours join the application's transaction.
            await sa.exec_driver_sql("SELECT 1")
        return conn

    async def acquire(self, action: str) -> tuple[PgPool, PgConnection]:
        """A pooled connection and its pool (give it back with ``pool.release``)."""
        pool = cast(PgPool | None, self.pool)
        if pool is None or pool.is_closing():
            raise StorageUnavailableError(
                f"could not {action}: the PostgreSQL backend is not open (not yet, or "
                "closed); open it with flowy.connect(url) or `async with backend`"
            )
        while self._idle:
            conn = self._idle.pop()
            try:
                if not conn.is_closed():
                    return pool, conn
            except asyncpg.InterfaceError:  # asyncpg took it back when its session ended
                continue
            await pool.release(conn)  # the server closed it while idle: the pool renews it
        self._waiting += 1
        try:
            return await self._from_pool(pool, action)
        finally:
            self._waiting -= 1

    def give_back(self, pool: PgPool, conn: PgConnection) -> None:
        """Return a connection whose operation succeeded: kept for the next operation
        while fewer than :attr:`keep` are and nobody waits for the pool, else released."""
        if (
            len(self._idle) < self.keep
            and not self._waiting
            and pool is cast(PgPool | None, self.pool)
            and not pool.is_closing()
        ):
            self._idle.append(conn)
            return
        # asyncpg returns a connection through a shielded task, which costs the caller
        # two turns of the event loop: let that overlap with what follows.
        task = asyncio.get_running_loop().create_task(pool.release(conn))
        _releasing.add(task)
        task.add_done_callback(_released)

    async def release_kept(self) -> None:
        """Give every kept connection back to the pool (before the pool closes)."""
        pool = cast(PgPool | None, self.pool)
        idle, self._idle = self._idle, []
        for conn in idle:
            if pool is not None:
                await pool.release(conn)

    async def _from_pool(self, pool: PgPool, action: str) -> tuple[PgPool, PgConnection]:
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

    def connection(self, action: str) -> _Use:
        """``async with``: a connection for one operation; driver errors in the block are
        translated and a pooled connection goes back to the pool afterwards."""
        return _Use(self, action)

    async def run(
        self, action: str, call: Callable[[PgConnection], Awaitable[T]], *, read: bool = False
    ) -> T:
        """``await call(connection)`` for one operation. A ``read`` whose pooled
        connection broke is repeated once on a fresh one (only reads: repeating them is
        harmless, unlike a write whose first attempt may have landed)."""
        for retry in (read and self.bound is None, False):
            try:
                async with _Use(self, action) as conn:
                    return await call(conn)
            except StorageUnavailableError as exc:
                if not retry or isinstance(exc.__cause__, TimeoutError):
                    raise
        raise AssertionError("unreachable")

    async def fetch(self, action: str, sql: str, *args: object, read: bool = False) -> list[Row]:
        """The rows of one statement."""
        return await self.run(action, lambda conn: conn.fetch(sql, *args), read=read)

    async def fetchrow(
        self, action: str, sql: str, *args: object, read: bool = False
    ) -> Row | None:
        """The first row of one statement, or ``None``."""
        if read:
            return await self.run(action, lambda conn: conn.fetchrow(sql, *args), read=True)
        async with _Use(self, action) as conn:  # the path of every save: kept short
            return await conn.fetchrow(sql, *args)

    async def execute(self, action: str, sql: str, *args: object) -> None:
        """Run one statement."""
        async with _Use(self, action) as conn:
            await conn.execute(sql, *args)


class _Use:
    """``Connector.connection`` (a class, not a generator: it runs on every statement)."""

    __slots__ = ("action", "conn", "connector", "pool")

    connector: Connector
    action: str

    def __init__(self, connector: Connector, action: str) -> None:
        self.connector, self.action = connector, action
        self.pool: PgPool | None = None
        self.conn: PgConnection | None = None

    async def __aenter__(self) -> PgConnection:
        connector = self.connector
        if connector.bound is None:
            self.pool, self.conn = await connector.acquire(self.action)
            return self.conn
        try:
            self.conn = await connector._bound()  # pyright: ignore[reportPrivateUsage]
        except Exception as exc:
            err = translate(exc, self.action)
            if err is exc:
                raise
            raise err from exc
        return self.conn

    async def __aexit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        pool, conn = self.pool, self.conn
        assert conn is not None
        if exc is None:
            if pool is not None:
                self.connector.give_back(pool, conn)
            return
        err = translate(exc, self.action, conn) if isinstance(exc, Exception) else exc
        if pool is not None:  # after translate, which asks the connection
            await pool.release(conn)
        if err is not exc:
            raise err from exc


_releasing: set[asyncio.Task[None]] = set()
"""Background releases in flight (a task needs a strong reference until it is done)."""


def _released(task: asyncio.Task[None]) -> None:
    _releasing.discard(task)
    if not task.cancelled() and (error := task.exception()) is not None:
        _log.warning("flowy_postgres: returning a connection to the pool failed: %r", error)


async def _keep_session(connection: object) -> None:
    """A pool ``reset`` that sends nothing: flowy leaves no session state behind."""


class _OneLineWarnings(logging.Filter):
    """asyncpg's pool logs each failed attempt to reconnect its connection floor (the
    server restarting, say) as a warning with a traceback: keep the warning to one line
    naming the error, and log the traceback at debug level on ``flowy_postgres``."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if error is not None and record.levelno >= logging.WARNING:
            text = record.getMessage()
            _log.debug("asyncpg: %s", text, exc_info=record.exc_info)
            record.msg, record.args = f"{text} ({type(error).__name__}: {error})", None
            record.exc_info = record.exc_text = None
        return True


def _one_line_driver_warnings() -> None:
    pool_log = logging.getLogger("asyncpg.pool")
    if not any(isinstance(f, _OneLineWarnings) for f in pool_log.filters):
        pool_log.addFilter(_OneLineWarnings())


async def create_pool(
    dsn: str, *, pooler_mode: bool = False, min_size: int = 1, max_size: int = 10, **options: Any
) -> asyncpg.Pool:
    """``asyncpg.create_pool`` with flowy's settings (other options go to asyncpg).

    Connections go back to the pool without asyncpg's reset query (``RESET ALL``,
    ``UNLISTEN *``, ...): flowy leaves no session state on them, and that query costs a
    round trip per operation (pass ``reset=None`` for asyncpg's default if your own code
    leaves session state on this pool). ``pooler_mode=True`` is for a transaction-mode
    pooler such as PgBouncer: ``statement_cache_size=0``, so asyncpg uses only unnamed
    statements, which do not outlive a transaction. Errors never show the password.
    asyncpg's warnings about reconnecting the pool are one line each (the traceback at
    debug level on the ``flowy_postgres`` logger).
    """
    if options.get("reset", _keep_session) is None:
        del options["reset"]
    else:
        options.setdefault("reset", _keep_session)
    if pooler_mode:
        options["statement_cache_size"] = 0
    _one_line_driver_warnings()
    try:
        return await _driver.create_pool(dsn, min_size=min_size, max_size=max_size, **options)
    except Exception as exc:
        err = translate(exc, "connect to PostgreSQL", may_have_written=False, url=dsn)
        if err is not exc:
            raise err from exc
        if not isinstance(exc, ValueError):
            raise
        detail = StoreURL.mask_password(str(exc), dsn)
        raise BackendURLError(f"cannot use this PostgreSQL URL: {detail}") from None
