"""Typed views of asyncpg for the tests (asyncpg ships no type information), and small
builders shared by the test modules."""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Protocol, cast

import asyncpg

from flowy.storage import HandoffIntent, HandoffStatus, ResumeToken, Snapshot, new_write_id

FIXED_TIME = 1_700_000_000.25


class Sql(Protocol):
    """The query methods of an asyncpg pool or connection."""

    async def fetchval(self, query: str, *args: object) -> Any: ...

    async def fetch(self, query: str, *args: object) -> list[Any]: ...

    async def fetchrow(self, query: str, *args: object) -> Any: ...

    async def execute(self, query: str, *args: object) -> str: ...


class Conn(Sql, Protocol):
    """An asyncpg connection."""

    def transaction(self) -> AbstractAsyncContextManager[object]: ...

    async def close(self) -> None: ...


def sql(target: asyncpg.Pool | asyncpg.Connection | Conn | None) -> Sql:
    """``target`` seen through :class:`Sql`."""
    assert target is not None
    return cast(Sql, target)


def with_options(dsn: str, **options: object) -> str:
    """``dsn`` with flowy's URL options added to its query."""
    query = urllib.parse.urlencode({k: str(v) for k, v in options.items()})
    return dsn + ("&" if "?" in dsn else "?") + query


async def connect(dsn: str) -> Conn:
    """A new connection outside any pool."""
    driver: Any = asyncpg
    return cast(Conn, await driver.connect(dsn))


async def new_pool(dsn: str, **options: Any) -> asyncpg.Pool:
    """A plain asyncpg pool (asyncpg's defaults unless ``options`` say otherwise)."""
    driver: Any = asyncpg
    return cast(asyncpg.Pool, await driver.create_pool(dsn, **options))


@asynccontextmanager
async def acquired(pool: asyncpg.Pool | None) -> AsyncGenerator[Conn]:
    """A connection of ``pool`` for the block."""
    raw: Any = pool
    async with raw.acquire() as conn:
        yield cast(Conn, conn)


def as_asyncpg(conn: Conn) -> asyncpg.Connection:
    """The connection as what ``PostgresCheckpointer.bind`` accepts."""
    return cast(asyncpg.Connection, conn)


def snap(thread_id: str, n: int = 0) -> Snapshot[Any]:
    """A snapshot with a fresh write id."""
    return Snapshot(
        thread_id=thread_id, state={"n": n}, execution_pointer=f"step-{n}", write_id=new_write_id()
    )


def intent(thread_id: str, revision: int = 1) -> HandoffIntent:
    """A hand-off intent with every field set (fixed creation time)."""
    return HandoffIntent(
        thread_id=thread_id,
        pending_snapshot_revision=revision,
        committed_snapshot_revision=revision,
        snapshot_revision=revision,
        resume_token=ResumeToken(thread_id, revision),
        handoff_status=HandoffStatus.ENQUEUED,
        reason="handoff",
        execution_pointer="worker",
        created_at=FIXED_TIME,
    )


async def wait_until(predicate: Callable[[], Awaitable[bool]], within: float = 10.0) -> None:
    """Poll ``predicate`` until it holds; fail the test after ``within`` seconds."""
    deadline = time.monotonic() + within
    while not await predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)
