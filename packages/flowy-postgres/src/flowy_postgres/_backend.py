"""``PostgresBackend``: the checkpointer, lease manager, outbox and consumer of one
schema and prefix over one pool, and ``open_backend``, the opener of ``postgresql://``
URLs for ``flowy.connect``."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import warnings
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar, Generic, TypeVar, cast

import asyncpg

from flowy.errors import BackendURLError
from flowy.storage import StateCodec, redact_url
from flowy.storage.dialect import (
    SCRATCH_PREFIX,
    BaseBackend,
    Inbox,
    RoundTrips,
    StoreURL,
    sibling_url,
)

from ._checkpointer import PostgresCheckpointer
from ._conn import Connector, PgConnection, PgPool, create_pool
from ._lease import PostgresLeaseManager
from ._outbox import ListenHooks, PostgresConsumer, PostgresOutbox
from ._schedules import PostgresScheduleStore
from ._schema import (
    DEFAULT_PREFIX,
    DEFAULT_SCHEMA,
    TableNames,
    prepare,
)

__all__ = ["DRIVER_OPTIONS", "OPTIONS", "PostgresBackend", "open_backend"]

S = TypeVar("S")
_driver: Any = asyncpg  # asyncpg's own signatures are untyped

OPTIONS = {
    "schema": "PostgreSQL schema of the tables (default public)",
    "prefix": "prefix of the table names (default flowy_)",
    "pool_size": "most connections in the pool; half stay in hand between operations (default 10)",
    "acquire_timeout": "seconds an operation waits for a pooled connection (default 10)",
    "pooler_mode": "true behind a transaction-mode pooler such as PgBouncer: no prepared "
    "statements, no LISTEN (default false)",
    "listen": "LISTEN/NOTIFY wakes waiting consumers, over one more connection (default "
    "true; false with pooler_mode)",
    "poll_interval": "seconds between outbox looks of a waiting consumer that does not "
    "listen (default 0.1)",
    "max_attempts": "deliveries before a hand-off is dead-lettered (default 5)",
}
"""flowy's options of a ``postgresql://`` URL (query parameters)."""

_PASSED = "host port user dbname database passfile application_name target_session_attrs"
DRIVER_OPTIONS = {
    n: "passed to asyncpg" for n in f"{_PASSED} sslmode sslrootcert sslcert sslkey sslcrl".split()
}
"""Connection parameters a URL passes to asyncpg unchanged. A password goes in the URL's
user part or a passfile, not in the query (where messages would show it)."""


_NOTIFY = "SELECT pg_notify($1, m) FROM unnest($2::text[]) AS m"


class _LiveChannels:
    """The backend's one LISTEN connection for watchers of its threads: a channel per
    watched thread (named from a hash of the schema, prefix and thread id), each fanned
    out to the inboxes of the watchers in this process."""

    def __init__(self, hooks: ListenHooks, names: TableNames) -> None:
        self._hooks = hooks
        self._names = names
        self._conn: PgConnection | None = None
        self._inboxes: dict[str, set[Inbox]] = {}
        self._lock = asyncio.Lock()

    def channel(self, thread_id: str) -> str:
        key = f"{self._names.schema}\x00{self._names.prefix}\x00{thread_id}"
        return "flowy_live_" + hashlib.sha256(key.encode()).hexdigest()[:40]

    def _deliver(self, _conn: object, _pid: int, channel: str, payload: str) -> None:
        for inbox in tuple(self._inboxes.get(channel, ())):
            inbox.put_threadsafe(payload.encode())

    async def _connection(self) -> PgConnection:
        conn = self._conn
        if conn is None or conn.is_closed():
            self._conn = None
            if conn is not None:
                with contextlib.suppress(Exception):
                    await self._hooks[1](conn)
            conn = self._conn = await self._hooks[0]()
            for channel in self._inboxes:
                await conn.add_listener(channel, self._deliver)
        return conn

    async def subscribe(self, channel: str, inbox: Inbox) -> Callable[[], Awaitable[None]]:
        async with self._lock:
            conn = await self._connection()
            inboxes = self._inboxes.setdefault(channel, set())
            if not inboxes:
                try:
                    await conn.add_listener(channel, self._deliver)
                except BaseException:
                    del self._inboxes[channel]
                    raise
            inboxes.add(inbox)
        inbox.sync = self._sync

        async def stop() -> None:
            async with self._lock:
                inboxes = self._inboxes.get(channel)
                if inboxes is None:
                    return
                inboxes.discard(inbox)
                if inboxes:
                    return
                del self._inboxes[channel]
                conn = self._conn
                if conn is not None and not conn.is_closed():
                    with contextlib.suppress(Exception):
                        await conn.remove_listener(channel, self._deliver)

        return stop

    async def _sync(self) -> None:
        # PostgreSQL sends a session its notifications before the answer to its next
        # statement; asyncpg calls the listeners soon after.
        async with self._lock:
            if not self._inboxes:
                return
            with contextlib.suppress(Exception):
                # A lost connection is made again here, its channels listened to again:
                # progress resumes from the next snapshot on (snapshots never stopped).
                conn = await self._connection()
                await conn.execute("SELECT 1")
        for _ in range(2):
            await asyncio.sleep(0)

    async def aclose(self) -> None:
        async with self._lock:
            conn, self._conn = self._conn, None
            self._inboxes.clear()
            if conn is not None:
                with contextlib.suppress(Exception):
                    await self._hooks[1](conn)


class PostgresBackend(BaseBackend[S], Generic[S]):
    """Everything flowy stores in one PostgreSQL schema and prefix, over one pool.

    ``flowy.connect("postgresql://user@host/db?schema=flowy")`` opens one (options:
    :data:`OPTIONS`, also the keyword arguments here). ``PostgresBackend(dsn, ...)``
    creates its pool on open and closes it on ``aclose``; :meth:`from_pool` uses the
    application's pool and leaves it open. Opening creates a new schema; an older one
    raises ``SchemaVersionError`` until :meth:`setup` (which needs no open) upgrades
    it. ``url`` is what reprs show (password masked) and what reaches this store again.
    """

    round_trips: ClassVar[RoundTrips] = RoundTrips(segment=1, handoff=2)
    """A leased segment takes its lease and reads the head in one statement, and its
    last save releases the lease in the save's own statement; the last save of a run a
    worker resumed also acknowledges the worker's message in that statement."""

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
            raise TypeError("PostgresBackend needs a dsn or (from_pool) a pool, not both")
        if listen is None:
            listen = not pooler_mode
        elif listen and pooler_mode:
            raise ValueError(
                "listen and pooler_mode exclude each other: LISTEN needs a session of its "
                "own, which a transaction-mode pooler does not keep (consumers poll instead)"
            )
        self._listen = listen
        names = {"schema": schema, "prefix": prefix}
        self.url: str = url or sibling_url(dsn or "postgresql://", options=names)
        self._dsn, self._pooler_mode, self._pool_size = dsn, pooler_mode, pool_size
        identity = pool if dsn is None else redact_url(dsn)
        names, domain = TableNames(schema, prefix), ("postgresql", identity, schema, prefix)
        self.connector: Connector = Connector(names, acquire_timeout=acquire_timeout, domain=domain)
        self.connector.pool = pool
        # A pool of its own: up to half of its connections stay in hand between
        # operations, the rest with the pool (the application's pool gets each back).
        self.connector.keep = pool_size // 2 if dsn is not None else 0
        self.checkpointer: PostgresCheckpointer[S] = PostgresCheckpointer[S](
            self.connector, codec=codec
        )
        self.leases: PostgresLeaseManager = PostgresLeaseManager(self.connector)
        self.outbox: PostgresOutbox = PostgresOutbox(self.connector)
        hooks = self._listen_hooks(pool) if listen else None
        self.consumer: PostgresConsumer = PostgresConsumer(
            self.connector, max_attempts=max_attempts, poll_interval=poll_interval, listen=hooks
        )
        self._live = _LiveChannels(self._listen_hooks(pool), self.names)
        self.schedules: PostgresScheduleStore = PostgresScheduleStore(self.connector)

    @classmethod
    def from_pool(cls, pool: asyncpg.Pool, **options: Any) -> PostgresBackend[S]:
        """A backend over the application's ``pool``, which :meth:`aclose` leaves open
        (options as for the constructor; with ``listen``, a waiting consumer holds one of
        the pool's connections)."""
        return cls(pool=pool, **options)

    @classmethod
    async def from_dsn(cls, dsn: str, **options: Any) -> PostgresBackend[S]:
        """An opened backend on a pool of its own (options as for the constructor; until
        0.3, 0.1's ``max_size`` means ``pool_size`` and ``min_size`` and ``consumer_id``
        are ignored, with a ``DeprecationWarning``)."""
        for old in ("max_size", "min_size", "consumer_id"):
            if old in options:
                warnings.warn(f"from_dsn({old}=...) is deprecated", DeprecationWarning, 2)
                if (value := options.pop(old)) and old == "max_size":
                    options["pool_size"] = value
        return await cls(dsn, **options).open()

    @property
    def names(self) -> TableNames:
        """The schema, prefix and quoted table names."""
        return self.connector.names

    @property
    def pool(self) -> asyncpg.Pool | None:
        """The asyncpg pool (``None`` while a DSN backend is not open). A pool the
        backend created keeps up to half its connections (``pool_size // 2``) in hand
        between operations; the others serve your own statements, if any. To share every
        connection with your code, give the backend your pool (:meth:`from_pool`)."""
        return self.connector.pool

    def _listen_hooks(self, given: asyncpg.Pool | None) -> ListenHooks:
        if given is not None:  # the application's pool: hold one of its connections
            pool = cast(PgPool, given)

            async def acquire() -> PgConnection:
                return (await self.connector.acquire("listen for outbox messages"))[1]

            return acquire, pool.release
        dsn = self._dsn

        async def connect() -> PgConnection:
            return cast(PgConnection, await _driver.connect(dsn, statement_cache_size=0))

        async def disconnect(conn: PgConnection) -> None:
            await conn.close()

        return connect, disconnect

    async def _pool(self) -> asyncpg.Pool:
        if self.connector.pool is None:
            assert self._dsn is not None
            self.connector.pool = await create_pool(
                self._dsn, pooler_mode=self._pooler_mode, max_size=self._pool_size
            )
        return self.connector.pool

    def scratch_url(self, name: str) -> str | None:
        """The same database and options with ``schema=name`` (``None`` for a backend
        on the application's pool: no URL reaches it)."""
        if self._dsn is None:
            return None
        return sibling_url(self.url, options={"schema": name})

    async def _drop_scratch(self) -> None:
        schema = self.names.schema
        if not schema.startswith(SCRATCH_PREFIX):  # never a schema an application uses
            raise RuntimeError(f"schema {schema!r} is not a scratch schema")
        pool: Any = await self._pool()  # asyncpg's own signatures are untyped
        await pool.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

    async def _open(self) -> None:
        await self._pool()
        await prepare(self.connector, upgrade=False)

    async def _setup(self) -> int:
        await self._pool()
        return await prepare(self.connector, upgrade=True)

    def _has_channel(self) -> bool:
        # Without LISTEN (behind a transaction-mode pooler, or listen=false) progress
        # reaches watchers in this process only, as on a store without a channel.
        return self._listen and super()._has_channel()

    async def _publish(self, thread_id: str, messages: Sequence[bytes]) -> None:
        channel = self._live.channel(thread_id)
        texts = [message.decode() for message in messages]
        await self.connector.execute("send progress", _NOTIFY, channel, texts)

    async def _subscribe(self, thread_id: str, inbox: Inbox) -> Callable[[], Awaitable[None]]:
        return await self._live.subscribe(self._live.channel(thread_id), inbox)

    async def _close(self) -> None:
        await self._live.aclose()
        await self.consumer.aclose()
        await self.connector.release_kept()
        pool, self.connector.pool = self.connector.pool, None
        if pool is not None and self._dsn is not None:
            await cast(PgPool, pool).close()


async def open_backend(url: StoreURL, *, codec: StateCodec[Any] | None) -> PostgresBackend[Any]:
    """The opener of ``postgresql://`` and ``postgres://`` URLs (``flowy.connect``)."""
    url.check_options({**OPTIONS, **DRIVER_OPTIONS})
    pooler_mode = url.flag("pooler_mode", False)
    options: dict[str, Any] = {
        "schema": url.options.get("schema", DEFAULT_SCHEMA),
        "prefix": url.options.get("prefix", DEFAULT_PREFIX),
        "pooler_mode": pooler_mode,
        "max_attempts": url.count("max_attempts", 5),
        "pool_size": url.count("pool_size", 10, maximum=1000),
        "acquire_timeout": url.seconds("acquire_timeout", 10.0),
        "listen": url.flag("listen", not pooler_mode),
        "poll_interval": url.seconds("poll_interval", 0.1),
    }
    dsn = url.driver_url(DRIVER_OPTIONS)
    try:  # a schema or prefix that is no identifier, or listen with pooler_mode: ValueError
        return PostgresBackend(dsn, codec=codec, url=url.raw, **options)
    except ValueError as exc:
        raise BackendURLError(f"{url.redacted!r}: {exc}") from None
