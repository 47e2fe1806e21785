"""Where connections come from: the pool, or an application's own connection.

asyncpg ships no type information for its pool and connection methods; the protocols
here describe the calls this package makes so the rest of it type-checks strictly.

``Connector`` hands out a connection for one operation: from the pool (with a bounded
acquire timeout, so an exhausted pool is an error naming its size rather than a hang), or
the connection an application bound with ``PostgresCheckpointer.bind`` (an asyncpg
connection, or a SQLAlchemy ``AsyncConnection`` on the asyncpg driver). Driver errors
raised inside are translated at this one boundary. ``atomic`` runs a block in its own
transaction, or in a savepoint when the connection is already inside one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any, Protocol, Self, TypeVar, cast

import asyncpg

from flowy import StorageUnavailableError

from ._errors import translate, translated

if TYPE_CHECKING:
    from asyncpg.pool import PoolConnectionProxy
    from sqlalchemy.ext.asyncio import AsyncConnection

__all__ = [
    "Connector",
    "PgConnection",
    "PgComponent",
    "PgPool",
    "Row",
    "atomic",
    "create_pool",
]

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

    def acquire(self, *, timeout: float | None = None) -> Awaitable[PgConnection]: ...

    async def release(self, connection: PgConnection) -> None: ...

    def get_max_size(self) -> int: ...

    async def close(self) -> None: ...


class _Bound:
    """An application's connection; a SQLAlchemy one is resolved to its asyncpg
    connection at every use, joining whatever transaction it is in by then."""

    def __init__(self, target: asyncpg.Connection | PoolConnectionProxy | AsyncConnection) -> None:
        self._target: object = target
        self._asyncpg: PgConnection | None = None
        if _is_asyncpg(target):
            self._asyncpg = cast(PgConnection, target)
        elif not _is_sqlalchemy(target):
            raise TypeError(
                f"bind() needs an asyncpg connection or a SQLAlchemy AsyncConnection on the "
                f"asyncpg driver, got {type(target).__name__} {target!r}"
            )

    async def resolve(self) -> PgConnection:
        if self._asyncpg is not None:
            return self._asyncpg
        return await _resolve_sqlalchemy(cast("AsyncConnection", self._target))


def _is_asyncpg(target: object) -> bool:
    from asyncpg.pool import PoolConnectionProxy

    return isinstance(target, asyncpg.Connection | PoolConnectionProxy)


def _is_sqlalchemy(target: object) -> bool:
    try:
        from sqlalchemy.ext.asyncio import AsyncConnection
    except ImportError:  # the [sqlalchemy] extra is not installed
        return False
    return isinstance(target, AsyncConnection)


async def _resolve_sqlalchemy(target: AsyncConnection) -> PgConnection:
    driver = target.dialect.driver
    if driver != "asyncpg":
        raise TypeError(
            f"bind() needs a SQLAlchemy AsyncConnection on the asyncpg driver, got one on "
            f"{driver!r}; create the engine with a 'postgresql+asyncpg://' URL"
        )
    raw = await target.get_raw_connection()
    conn = cast(PgConnection, raw.driver_connection)
    if target.in_transaction() and not conn.is_in_transaction():
        # SQLAlchemy begins the driver's transaction lazily, at its first statement: run
        # one, so that ours join the application's transaction instead of autocommitting.
        await target.exec_driver_sql("SELECT 1")
    return conn


class Connector:
    """Connections for one adapter object: pooled, or one bound application connection."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        acquire_timeout: float,
        bound: _Bound | None = None,
    ) -> None:
        if not acquire_timeout > 0:  # also rejects NaN
            raise ValueError(f"acquire_timeout must be positive seconds, got {acquire_timeout!r}")
        self.pool = pool
        self.acquire_timeout = acquire_timeout
        self._pool = cast(PgPool, pool)
        self._bound = bound

    @property
    def is_bound(self) -> bool:
        """True when every operation runs on one application connection."""
        return self._bound is not None

    def bind(self, target: asyncpg.Connection | PoolConnectionProxy | AsyncConnection) -> Connector:
        """A connector that runs everything on ``target``."""
        return Connector(self.pool, acquire_timeout=self.acquire_timeout, bound=_Bound(target))

    async def acquire(self, action: str) -> PgConnection:
        """A pooled connection (release it with :meth:`release`)."""
        try:
            # asyncio.timeout arms one timer; asyncpg's own acquire(timeout=) would run
            # the wait in an extra task and time the release too (a cost on every save).
            async with asyncio.timeout(self.acquire_timeout):
                conn = await self._pool.acquire()
                if conn.is_closed():  # the server closed it while idle: take a fresh one
                    await self._pool.release(conn)
                    conn = await self._pool.acquire()
        except TimeoutError as exc:
            raise StorageUnavailableError(
                f"could not {action}: no PostgreSQL connection became free within "
                f"{self.acquire_timeout}s (the pool holds at most "
                f"{self._pool.get_max_size()} connections, all in use); raise the pool's "
                f"max_size, run fewer operations at once, or raise acquire_timeout"
            ) from exc
        except Exception as exc:
            err = translate(exc, action, may_have_written=False)
            if err is exc:
                raise
            raise err from exc
        return conn

    async def release(self, conn: PgConnection) -> None:
        """Give a connection from :meth:`acquire` back to the pool."""
        await self._pool.release(conn)

    def release_soon(self, conn: PgConnection) -> None:
        """Give a connection back to the pool without making the caller wait.

        asyncpg returns a connection through a shielded task, which costs the caller
        two turns of the event loop; after a successful operation that work can overlap
        with whatever the caller does next.
        """
        task = asyncio.get_running_loop().create_task(self._pool.release(conn))
        _releasing.add(task)
        task.add_done_callback(_released)

    def connection(self, action: str) -> _Use:
        """``async with``: a connection for one operation; driver errors in the block are
        translated and a pooled connection goes back to the pool afterwards."""
        return _Use(self, action)

    async def read(self, action: str, query: Callable[[PgConnection], Awaitable[T]]) -> T:
        """Run a read-only ``query``; a pooled connection found broken is replaced once.

        Only for reads: repeating them is harmless, unlike a write whose first attempt
        may have landed.
        """
        if self._bound is None:
            conn = await self.acquire(action)
            try:
                result = await query(conn)
            except Exception as exc:
                broken = conn.is_closed()
                await self._pool.release(conn)
                if not broken:
                    err = translate(exc, action)
                    if err is exc:
                        raise
                    raise err from exc
                # The connection broke: repeat the read once on a fresh one.
            except BaseException:
                await self._pool.release(conn)
                raise
            else:
                self.release_soon(conn)
                return result
        async with self.connection(action) as conn:
            return await query(conn)


class PgComponent:
    """What the checkpointer, lease manager, outbox and consumer share: a
    :class:`Connector` over the pool, and whether :meth:`close` closes that pool (only
    when the object's ``from_dsn`` created it)."""

    def __init__(self, pool: asyncpg.Pool, *, acquire_timeout: float) -> None:
        self._connector = Connector(pool, acquire_timeout=acquire_timeout)
        self._owns_pool = False

    def _owning_pool(self) -> Self:
        """This object, now responsible for closing its pool (for ``from_dsn``)."""
        self._owns_pool = True
        return self

    @property
    def pool(self) -> asyncpg.Pool:
        """The asyncpg pool this object uses."""
        return self._connector.pool

    async def close(self) -> None:
        """Close the pool if :meth:`from_dsn` created it (a pool you passed in stays open)."""
        if self._owns_pool and not self._connector.is_bound:
            await self._connector.pool.close()


class _Use:
    """The context manager of ``Connector.connection`` (a class: it runs on every save)."""

    __slots__ = ("_action", "_conn", "_connector", "_pooled")

    def __init__(self, connector: Connector, action: str) -> None:
        self._connector = connector
        self._action = action
        self._conn: PgConnection | None = None
        self._pooled = False

    async def __aenter__(self) -> PgConnection:
        bound = self._connector._bound  # pyright: ignore[reportPrivateUsage]
        if bound is None:
            self._conn = await self._connector.acquire(self._action)
            self._pooled = True
        else:
            with translated(self._action):
                self._conn = await bound.resolve()
        return self._conn

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        conn = self._conn
        assert conn is not None
        try:
            if exc is not None:
                if isinstance(exc, Exception):
                    err = translate(exc, self._action, conn)
                    if err is not exc:
                        raise err from exc
                return
            if self._pooled:
                self._connector.release_soon(conn)
                self._pooled = False
        finally:
            if self._pooled:
                await self._connector.release(conn)


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
    outlive a transaction. Other keyword arguments go to ``asyncpg.create_pool``.
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
        err = translate(exc, "connect to PostgreSQL", may_have_written=False)
        if err is exc:
            raise
        raise err from exc
