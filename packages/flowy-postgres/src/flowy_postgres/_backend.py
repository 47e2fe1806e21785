"""``PostgresBackend``: the checkpointer, lease manager, outbox and consumer of one
schema and prefix over one pool, and ``open_backend``, the opener of ``postgresql://``
URLs for ``flowy.connect``."""

from __future__ import annotations

import urllib.parse
import warnings
from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

import asyncpg

from flowy.errors import BackendURLError, SchemaVersionError
from flowy.storage import BaseBackend, StateCodec, StoreURL, redact_url

from ._checkpointer import PostgresCheckpointer
from ._conn import Connector, PgConnection, PgPool, create_pool
from ._lease import PostgresLeaseManager
from ._outbox import ListenHooks, PostgresConsumer, PostgresOutbox
from ._schema import (
    DEFAULT_PREFIX,
    DEFAULT_SCHEMA,
    MAX_PREFIX,
    SCHEMA_VERSION,
    TableNames,
    check_identifier,
    migrate,
    schema_version,
)

__all__ = ["DRIVER_OPTIONS", "OPTIONS", "PostgresBackend", "open_backend"]

S = TypeVar("S")
_driver: Any = asyncpg  # asyncpg's own signatures are untyped

OPTIONS = {
    "schema": "PostgreSQL schema of the tables (default public)",
    "prefix": "prefix of the table names (default flowy_)",
    "pool_size": "most connections in the pool (default 10)",
    "acquire_timeout": "seconds an operation waits for a free pooled connection (default 10)",
    "pooler_mode": "true behind a transaction-mode pooler such as PgBouncer: no prepared "
    "statements, no LISTEN (default false)",
    "listen": "wake waiting consumers with LISTEN/NOTIFY over one more connection "
    "(default true, false with pooler_mode)",
    "poll_interval": "seconds between outbox looks of a waiting consumer that does not "
    "listen (default 0.1)",
    "max_attempts": "deliveries before a hand-off is dead-lettered (default 5)",
}
"""flowy's options of a ``postgresql://`` URL (query parameters)."""

DRIVER_OPTIONS = {
    name: "passed to asyncpg"
    for name in (
        "host",
        "port",
        "user",
        "dbname",
        "database",
        "passfile",
        "application_name",
        "sslmode",
        "sslrootcert",
        "sslcert",
        "sslkey",
        "sslcrl",
        "target_session_attrs",
    )
}
"""Connection parameters a ``postgresql://`` URL passes to asyncpg unchanged (a password
goes in the URL's user part or a passfile, never in the query: it would show in
messages)."""


class PostgresBackend(BaseBackend[S], Generic[S]):
    """Everything flowy stores in one PostgreSQL schema, over one asyncpg pool.

    Open one with ``flowy.connect("postgresql://user@host/db?schema=flowy")`` (the
    options are in :data:`OPTIONS`), or build one over a DSN (the backend creates its
    pool on :meth:`open` and closes it on :meth:`aclose`) or over the application's own
    pool with :meth:`from_pool` (left open). A new schema is created on open; a schema
    of an older flowy-postgres raises ``SchemaVersionError`` until :meth:`migrate`
    upgrades it (this works on a backend that is not open).

    The checkpointer fences its saves with ``leases`` and commits hand-offs into
    ``outbox`` in the same statement; ``consumer`` feeds ``flowy.Worker``. Leases
    expire by the database clock.
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        pool: asyncpg.Pool | None = None,
        schema: str = DEFAULT_SCHEMA,
        prefix: str = DEFAULT_PREFIX,
        codec: StateCodec[S] | None = None,
        max_attempts: int = 5,
        pool_size: int = 10,
        acquire_timeout: float = 10.0,
        pooler_mode: bool = False,
        listen: bool | None = None,
        poll_interval: float = 0.1,
        url: str | None = None,
    ) -> None:
        if (dsn is None) == (pool is None):
            raise TypeError("PostgresBackend needs either a dsn or a pool (use from_pool)")
        if listen is None:
            listen = not pooler_mode
        elif listen and pooler_mode:
            raise ValueError(
                "listen and pooler_mode exclude each other: LISTEN needs a session of its "
                "own, which a transaction-mode pooler does not keep (consumers poll instead)"
            )
        names = TableNames(schema, prefix)
        query = urllib.parse.urlencode({"schema": schema, "prefix": prefix})
        if dsn is not None:
            self.url = url or dsn + ("&" if "?" in dsn else "?") + query
            identity: object = redact_url(dsn)
        else:
            self.url = url or f"postgresql://?{query}"
            identity = pool
        self._dsn = dsn
        self._pooler_mode = pooler_mode
        self._pool_size = pool_size
        self.connector = Connector(
            names, acquire_timeout=acquire_timeout, domain=("postgresql", identity, schema, prefix)
        )
        self.connector.pool = pool
        self.checkpointer: PostgresCheckpointer[S] = PostgresCheckpointer(
            self.connector, codec=codec
        )
        self.leases = PostgresLeaseManager(self.connector)
        self.outbox = PostgresOutbox(self.connector)
        self.consumer = PostgresConsumer(
            self.connector,
            max_attempts=max_attempts,
            poll_interval=poll_interval,
            listen=self._listen_hooks() if listen else None,
        )

    @classmethod
    def from_pool(
        cls,
        pool: asyncpg.Pool,
        *,
        schema: str = DEFAULT_SCHEMA,
        prefix: str = DEFAULT_PREFIX,
        codec: StateCodec[S] | None = None,
        max_attempts: int = 5,
        acquire_timeout: float = 10.0,
        listen: bool = True,
        poll_interval: float = 0.1,
        url: str | None = None,
    ) -> PostgresBackend[S]:
        """A backend over the application's ``pool`` (which :meth:`aclose` leaves open;
        with ``listen`` a waiting consumer holds one of its connections). ``url`` is what
        reprs show and what ``flowy.connect`` needs to open a peer of this store."""
        return cls(
            pool=pool,
            schema=schema,
            prefix=prefix,
            codec=codec,
            max_attempts=max_attempts,
            acquire_timeout=acquire_timeout,
            listen=listen,
            poll_interval=poll_interval,
            url=url,
        )

    @classmethod
    async def from_dsn(cls, dsn: str, **options: Any) -> PostgresBackend[S]:
        """An opened backend on a pool of its own for ``dsn`` (options as for the
        constructor); ``flowy.connect(url)`` does the same from a URL."""
        return await cls(dsn, **options).open()

    @property
    def names(self) -> TableNames:
        """The schema, prefix and quoted table names."""
        return self.connector.names

    @property
    def pool(self) -> asyncpg.Pool | None:
        """The asyncpg pool (``None`` before a DSN backend opens)."""
        return self.connector.pool

    def _listen_hooks(self) -> ListenHooks:
        connector = self.connector
        if self._dsn is None:  # the application's pool: hold one of its connections
            return (lambda: connector.acquire("listen for outbox messages"), connector.release)
        dsn = self._dsn

        async def connect() -> PgConnection:
            return cast(PgConnection, await _driver.connect(dsn, statement_cache_size=0))

        async def disconnect(conn: PgConnection) -> None:
            await conn.close()

        return connect, disconnect

    async def _ensure_pool(self) -> asyncpg.Pool:
        if self.connector.pool is None:
            assert self._dsn is not None
            self.connector.pool = await create_pool(
                self._dsn, pooler_mode=self._pooler_mode, max_size=self._pool_size
            )
        return self.connector.pool

    async def _open(self) -> None:
        pool = await self._ensure_pool()
        names = self.names
        version = await schema_version(pool, schema=names.schema, prefix=names.prefix)
        if version == 0:
            await migrate(pool, schema=names.schema, prefix=names.prefix)
        elif version != SCHEMA_VERSION:
            where = f"schema {names.schema!r} (prefix {names.prefix!r})"
            if version > SCHEMA_VERSION:
                raise SchemaVersionError(
                    f"the flowy tables in {where} are at schema version {version}, but this "
                    f"flowy-postgres knows versions up to {SCHEMA_VERSION}; upgrade it"
                )
            raise SchemaVersionError(
                f"the flowy tables in {where} are at schema version {version}; this "
                f"flowy-postgres needs {SCHEMA_VERSION}. Back the database up, then upgrade "
                "with `await PostgresBackend(dsn, schema=..., prefix=...).migrate()` or "
                "flowy_postgres.migrate(pool, schema=..., prefix=...)"
            )

    async def _migrate(self) -> int:
        names = self.names
        return await migrate(await self._ensure_pool(), schema=names.schema, prefix=names.prefix)

    async def _close(self) -> None:
        await self.consumer.aclose()
        pool, self.connector.pool = self.connector.pool, None
        if pool is not None and self._dsn is not None:
            await cast(PgPool, pool).close()

    async def close(self) -> None:
        """Deprecated alias of :meth:`aclose` (flowy-postgres 0.1); removed in 0.3."""
        warnings.warn(
            "PostgresBackend.close() is deprecated; use aclose()", DeprecationWarning, stacklevel=2
        )
        await self.aclose()


def _identifier(what: str, *, empty: bool = False, longest: int = 63) -> Callable[[str], str]:
    def convert(text: str) -> str:
        return check_identifier(text, what, empty=empty, longest=longest)

    return convert


async def open_backend(url: StoreURL, *, codec: StateCodec[Any] | None) -> PostgresBackend[Any]:
    """The opener of ``postgresql://`` and ``postgres://`` URLs (``flowy.connect``)."""
    url.check_options({**OPTIONS, **DRIVER_OPTIONS})
    schema = url.option("schema", _identifier("schema name"), DEFAULT_SCHEMA)
    prefix = url.option(
        "prefix", _identifier("table prefix", empty=True, longest=MAX_PREFIX), DEFAULT_PREFIX
    )
    driver = {k: v for k, v in url.options.items() if k in DRIVER_OPTIONS}
    parts = urllib.parse.urlsplit(url.raw)
    dsn = urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(driver)))
    pooler_mode = url.flag("pooler_mode", False)
    try:
        return PostgresBackend(
            dsn,
            schema=schema,
            prefix=prefix,
            codec=codec,
            max_attempts=url.count("max_attempts", 5),
            pool_size=url.count("pool_size", 10),
            acquire_timeout=url.seconds("acquire_timeout", 10.0),
            pooler_mode=pooler_mode,
            listen=url.flag("listen", not pooler_mode),
            poll_interval=url.seconds("poll_interval", 0.1),
            url=url.raw,
        )
    except ValueError as exc:
        raise BackendURLError(f"{url.redacted!r}: {exc}") from None
