"""``PostgresBackend``: the checkpointer, lease manager, outbox and consumer of one
schema, built over one pool."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Self, TypeVar

import asyncpg

from flowy.checkpoint import StateCodec

from ._checkpointer import PostgresCheckpointer
from ._conn import create_pool
from ._lease import PostgresLeaseManager
from ._outbox import PostgresOutbox, PostgresOutboxConsumer
from ._schema import DEFAULT_PREFIX, DEFAULT_SCHEMA, migrate

__all__ = ["PostgresBackend"]

S = TypeVar("S")


@dataclass(eq=False)
class PostgresBackend(Generic[S]):
    """Everything flowy stores in one PostgreSQL schema, sharing one asyncpg pool.

    The checkpointer fences its saves with ``leases`` and commits hand-offs into
    ``outbox`` transactionally; ``consumer`` feeds ``flowy.Worker``. Build it with
    :meth:`from_pool` or :meth:`from_dsn`, run :meth:`migrate` once, :meth:`close` at
    the end (or use ``async with``).
    """

    pool: asyncpg.Pool
    checkpointer: PostgresCheckpointer[S]
    leases: PostgresLeaseManager
    outbox: PostgresOutbox
    consumer: PostgresOutboxConsumer
    owns_pool: bool = False

    @classmethod
    def from_pool(
        cls,
        pool: asyncpg.Pool,
        *,
        schema: str = DEFAULT_SCHEMA,
        prefix: str = DEFAULT_PREFIX,
        codec: StateCodec[S] | None = None,
        max_attempts: int = 5,
        consumer_id: str | None = None,
        listen: bool = True,
        acquire_timeout: float = 10.0,
    ) -> PostgresBackend[S]:
        """The four objects over ``pool`` (which stays yours to close)."""
        return cls(
            pool=pool,
            checkpointer=PostgresCheckpointer(
                pool, schema=schema, prefix=prefix, codec=codec, acquire_timeout=acquire_timeout
            ),
            leases=PostgresLeaseManager(
                pool, schema=schema, prefix=prefix, acquire_timeout=acquire_timeout
            ),
            outbox=PostgresOutbox(
                pool, schema=schema, prefix=prefix, acquire_timeout=acquire_timeout
            ),
            consumer=PostgresOutboxConsumer(
                pool,
                schema=schema,
                prefix=prefix,
                max_attempts=max_attempts,
                consumer_id=consumer_id,
                listen=listen,
                acquire_timeout=acquire_timeout,
            ),
        )

    @classmethod
    async def from_dsn(
        cls,
        dsn: str,
        *,
        schema: str = DEFAULT_SCHEMA,
        prefix: str = DEFAULT_PREFIX,
        codec: StateCodec[S] | None = None,
        max_attempts: int = 5,
        consumer_id: str | None = None,
        acquire_timeout: float = 10.0,
        pooler_mode: bool = False,
        min_size: int = 1,
        max_size: int = 10,
    ) -> PostgresBackend[S]:
        """The four objects over a new pool for ``dsn``, closed by :meth:`close`.

        ``pooler_mode=True`` is for a transaction-mode pooler (PgBouncer and the like):
        no server-side prepared statements, no LISTEN (consumers poll).
        """
        pool = await create_pool(dsn, pooler_mode=pooler_mode, min_size=min_size, max_size=max_size)
        backend = cls.from_pool(
            pool,
            schema=schema,
            prefix=prefix,
            codec=codec,
            max_attempts=max_attempts,
            consumer_id=consumer_id,
            listen=not pooler_mode,
            acquire_timeout=acquire_timeout,
        )
        backend.owns_pool = True
        return backend

    async def migrate(self) -> int:
        """Create or upgrade this backend's tables (see :func:`flowy_postgres.migrate`)."""
        names = self.checkpointer.names
        return await migrate(self.pool, schema=names.schema, prefix=names.prefix)

    async def close(self) -> None:
        """Stop the consumer's listening; close the pool if :meth:`from_dsn` made it."""
        await self.consumer.close()
        if self.owns_pool:
            await self.pool.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
