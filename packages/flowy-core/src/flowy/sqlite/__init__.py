"""The embedded durable store: one SQLite file (standard library ``sqlite3`` only).

``flowy.connect("sqlite:///path/to/flowy.db")`` (or a bare path ending in ``.db``) opens
it. The file is one coordination domain: "revision matches AND lease is mine" and
"checkpoint + outbox message" are each one ``BEGIN IMMEDIATE`` transaction. Several
processes on one machine may share the file; SQLite's locks keep one history chain per
thread.
"""

from __future__ import annotations

import time
import urllib.parse
from pathlib import Path
from typing import Any, ClassVar, Generic, Literal

from .._errors import BackendURLError
from .._types import S
from ..storage import StateCodec
from ..storage.dialect import BaseBackend, RoundTrips, StoreURL
from ._db import APPLICATION_ID, SCHEMA_VERSION, Clock, SQLiteDatabase, StrPath
from ._store import (
    SQLiteCheckpointer,
    SQLiteConsumer,
    SQLiteLeaseManager,
    SQLiteOutbox,
    SQLiteScheduleStore,
)

__all__ = [
    "APPLICATION_ID",
    "OPTIONS",
    "SCHEMA_VERSION",
    "SQLiteBackend",
    "SQLiteCheckpointer",
    "SQLiteConsumer",
    "SQLiteDatabase",
    "SQLiteLeaseManager",
    "SQLiteOutbox",
    "SQLiteScheduleStore",
    "open_backend",
    "path_of",
]


class SQLiteBackend(BaseBackend[S], Generic[S]):
    """A SQLite file as one store: ``checkpointer``, ``leases``, ``outbox`` and
    ``consumer`` share one connection and worker thread.

    A new file gets the schema on first use. A file of an older flowy schema raises
    ``SchemaVersionError`` until ``await backend.setup()`` upgrades it (back it up
    first); a file of a newer schema always raises it. Leases use the local clock, so
    the processes sharing the file must run on one machine.

    Args:
        path: the database file (created if missing), or ``":memory:"``.
        codec: the state codec (JSON by default; a runner gives a typed graph's type).
        max_attempts: outbox deliveries without an ack before a message is dead-lettered.
        busy_timeout: seconds a write waits for another process's lock before it fails
            with ``StorageUnavailableError``.
        clock: time source of leases and outbox visibility (``time.time``).
        synchronous: ``"FULL"`` (default) or ``"NORMAL"``; see :class:`SQLiteDatabase`.
        poll_interval: seconds between looks at the outbox while ``claim`` waits.
    """

    round_trips: ClassVar[RoundTrips] = RoundTrips(segment=1, handoff=2)
    """A leased segment takes its lease and reads the head in one transaction, and its
    last save releases the lease in its own."""

    def __init__(
        self,
        path: StrPath,
        codec: StateCodec[S] | None = None,
        *,
        max_attempts: int = 5,
        busy_timeout: float = 5.0,
        clock: Clock = time.time,
        synchronous: Literal["FULL", "NORMAL"] = "FULL",
        poll_interval: float = 0.05,
    ) -> None:
        self.database: SQLiteDatabase = SQLiteDatabase(
            path, busy_timeout=busy_timeout, clock=clock, synchronous=synchronous
        )
        self.url: str = f"sqlite:///{self.database.path}"
        self.checkpointer: SQLiteCheckpointer[S] = SQLiteCheckpointer(self.database, codec=codec)
        self.leases: SQLiteLeaseManager = SQLiteLeaseManager(self.database)
        self.outbox: SQLiteOutbox = SQLiteOutbox(self.database)
        self.consumer: SQLiteConsumer = SQLiteConsumer(
            self.database, max_attempts=max_attempts, poll_interval=poll_interval
        )
        self.schedules: SQLiteScheduleStore = SQLiteScheduleStore(self.database)

    @property
    def path(self) -> str:
        """The database file."""
        return self.database.path

    async def _open(self) -> None:
        await self.database.open()

    async def _setup(self) -> int:
        return await self.database.setup()

    async def _close(self) -> None:
        await self.database.aclose()

    def scratch_url(self, name: str) -> str | None:
        """A file ``<stem>.<name>.db`` next to this store's file (a new in-memory
        database for ``:memory:``)."""
        if self.path == ":memory:":
            return "sqlite:///:memory:"
        here = Path(self.path)
        scratch = here.with_name(f"{here.stem}.{name}.db")
        return "sqlite:///" + urllib.parse.quote(str(scratch))

    async def _drop_scratch(self) -> None:
        await self.aclose()
        if self.path != ":memory:":
            for suffix in ("", "-wal", "-shm", "-journal"):
                Path(self.path + suffix).unlink(missing_ok=True)  # noqa: ASYNC240 - after close


OPTIONS = {
    "max_attempts": "deliveries before a hand-off is dead-lettered (default 5)",
    "busy_timeout": "seconds a write waits for another process's lock (default 5)",
    "synchronous": "FULL (default) or NORMAL",
    "poll_interval": "seconds between outbox polls while a consumer waits (default 0.05)",
}
"""The query options of a ``sqlite:`` URL, each with its one-line description."""


def path_of(url: StoreURL) -> str:
    """The file the ``sqlite:`` URL ``url`` names: ``sqlite:///relative.db``,
    ``sqlite:////abs.db``, or ``sqlite:///:memory:``; ``BackendURLError`` if it names a
    host or no file."""
    if url.netloc not in ("", "localhost"):
        raise BackendURLError(
            f"{url.redacted!r}: a SQLite URL names a local file, sqlite:///path/to/file.db "
            "(three slashes; four for an absolute path)"
        )
    path = urllib.parse.unquote(url.path)
    path = path[1:] if path.startswith("/") else path
    if not path:
        raise BackendURLError(f"{url.redacted!r} names no file; use sqlite:///path/to/file.db")
    return path


async def open_backend(url: StoreURL, *, codec: StateCodec[Any] | None) -> SQLiteBackend[Any]:
    """The opener of ``sqlite:`` URLs (``flowy.connect``): an unopened backend on the file
    ``url`` names, with its options (:data:`OPTIONS`) applied; ``codec`` encodes states
    (JSON when None)."""
    url.check_options(OPTIONS)
    synchronous = url.options.get("synchronous", "FULL").upper()
    if synchronous not in ("FULL", "NORMAL"):
        raise BackendURLError(f"option synchronous in {url.redacted!r} must be FULL or NORMAL")
    path = path_of(url)
    if path.startswith("~"):
        path = str(Path(path).expanduser())  # noqa: ASYNC240 - no I/O: reads $HOME only
    return SQLiteBackend(
        path,
        codec,
        max_attempts=url.count("max_attempts", 5),
        busy_timeout=url.seconds("busy_timeout", 5.0),
        synchronous="FULL" if synchronous == "FULL" else "NORMAL",
        poll_interval=url.seconds("poll_interval", 0.05),
    )
