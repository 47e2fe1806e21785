"""The SQLite file behind the embedded backend: one connection per file and process, run
on a dedicated worker thread, plus the schema (creation, version check, ``setup()``),
write transactions and the translation of ``sqlite3`` errors into flowy errors.

Every blocking ``sqlite3`` call runs on the database's single worker thread (a
connection is bound to the thread that made it), so the event loop never waits on disk
or on another process's lock. Each write is one job on that thread, wrapped in
``BEGIN IMMEDIATE`` … ``COMMIT`` (:func:`immediate`): nothing else runs on the
connection in between, and a cancelled caller cannot leave a transaction open.

Several processes may open the same file: SQLite's file locks serialise writers
(``BEGIN IMMEDIATE`` takes the write lock up front and waits up to ``busy_timeout``),
and WAL mode lets readers proceed while one process writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import time
import warnings
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from typing import Literal, TypeVar

from .._errors import (
    SnapshotTooLargeError,
    SQLiteFileError,
    StorageError,
    StorageUnavailableError,
)
from ..storage._backend import BaseBackend
from ..storage._wakeups import Wakeups

__all__ = [
    "APPLICATION_ID",
    "Clock",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "SQLiteDatabase",
    "StrPath",
    "immediate",
    "snapshot",
]

T = TypeVar("T")
StrPath = str | os.PathLike[str]
Clock = Callable[[], float]
Job = Callable[[sqlite3.Connection], T]

APPLICATION_ID = 0x464C5759
"""``PRAGMA application_id`` of a flowy database (the bytes ``FLWY``)."""

MIGRATIONS: list[tuple[str, ...]] = [
    # 0 -> 1: the initial schema.
    (
        """CREATE TABLE IF NOT EXISTS flowy_threads (
            thread_id TEXT PRIMARY KEY,
            revision INTEGER NOT NULL,
            pointer TEXT NOT NULL,
            status TEXT NOT NULL,
            reason TEXT NOT NULL,
            handoff_status TEXT NOT NULL,
            handoff_pending_at REAL,
            updated_at REAL NOT NULL,
            record BLOB NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS flowy_threads_handoff ON flowy_threads (handoff_status)",
        """CREATE TABLE IF NOT EXISTS flowy_history (
            thread_id TEXT NOT NULL,
            revision INTEGER NOT NULL,
            record BLOB NOT NULL,
            PRIMARY KEY (thread_id, revision)
        )""",
        """CREATE TABLE IF NOT EXISTS flowy_leases (
            thread_id TEXT PRIMARY KEY,
            owner TEXT,
            token INTEGER NOT NULL,
            expires_at REAL NOT NULL
        )""",
        """CREATE TABLE IF NOT EXISTS flowy_outbox (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            thread_id TEXT NOT NULL,
            committed_revision INTEGER NOT NULL,
            payload BLOB NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0,
            visible_at REAL NOT NULL DEFAULT 0,
            dead INTEGER NOT NULL DEFAULT 0,
            error TEXT NOT NULL DEFAULT '',
            created_at REAL NOT NULL,
            UNIQUE (thread_id, committed_revision)
        )""",
        "CREATE INDEX IF NOT EXISTS flowy_outbox_ready ON flowy_outbox (dead, visible_at)",
    ),
    # 1 -> 2: durable time (the wake-up index, the signal inbox, the activity journal),
    # the version of the graph that saved each head, and an index of the heads parked in
    # suspended or waiting (the oldest of each is a backlog gauge).
    (
        "ALTER TABLE flowy_threads ADD COLUMN wake_at REAL",
        "ALTER TABLE flowy_threads ADD COLUMN graph_version TEXT NOT NULL DEFAULT ''",
        "CREATE INDEX IF NOT EXISTS flowy_threads_wake ON flowy_threads (wake_at, thread_id) "
        "WHERE wake_at IS NOT NULL",
        "CREATE INDEX IF NOT EXISTS flowy_threads_parked ON flowy_threads (status, updated_at) "
        "WHERE status IN ('suspended', 'waiting')",
        """CREATE TABLE IF NOT EXISTS flowy_signals (
            thread_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            signal_id TEXT NOT NULL,
            data BLOB NOT NULL,
            PRIMARY KEY (thread_id, seq),
            UNIQUE (thread_id, signal_id)
        )""",
        """CREATE TABLE IF NOT EXISTS flowy_journal (
            thread_id TEXT NOT NULL,
            key TEXT NOT NULL,
            data BLOB NOT NULL,
            PRIMARY KEY (thread_id, key)
        )""",
    ),
    # 2 -> 3: durable schedules.
    (
        """CREATE TABLE IF NOT EXISTS flowy_schedules (
            name TEXT PRIMARY KEY,
            version INTEGER NOT NULL,
            record BLOB NOT NULL
        )""",
    ),
    # 3 -> 4: queues. Each message's route (messages stored before are in the default
    # queue) and when its claim stops holding a slot (NULL: not in flight); indexes of
    # the live messages in claim order, of the visible ones (the look before a claim)
    # and of those in flight; each queue's limits, and the starts of rate-limited
    # queues. The ready index of version 1 is replaced by the one per queue.
    (
        "ALTER TABLE flowy_outbox ADD COLUMN queue TEXT NOT NULL DEFAULT 'default'",
        "ALTER TABLE flowy_outbox ADD COLUMN partition_key TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE flowy_outbox ADD COLUMN priority INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE flowy_outbox ADD COLUMN claimed_until REAL",
        "DROP INDEX IF EXISTS flowy_outbox_ready",
        "CREATE INDEX IF NOT EXISTS flowy_outbox_order ON flowy_outbox (queue, priority, id) "
        "WHERE dead = 0",
        "CREATE INDEX IF NOT EXISTS flowy_outbox_visible ON flowy_outbox (queue, visible_at) "
        "WHERE dead = 0",
        "CREATE INDEX IF NOT EXISTS flowy_outbox_flight "
        "ON flowy_outbox (queue, claimed_until, partition_key) WHERE claimed_until IS NOT NULL",
        "CREATE INDEX IF NOT EXISTS flowy_outbox_dead ON flowy_outbox (id) WHERE dead = 1",
        """CREATE TABLE IF NOT EXISTS flowy_queues (
            queue TEXT PRIMARY KEY,
            limits TEXT NOT NULL
        )""",
        """CREATE TABLE IF NOT EXISTS flowy_queue_starts (
            queue TEXT NOT NULL,
            at REAL NOT NULL,
            partition_key TEXT NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS flowy_queue_starts_at ON flowy_queue_starts (queue, at)",
    ),
    # 4 -> 5: the recency index: each head's save second (floor of updated_at, which is
    # never negative), written only by a save in another second than the head's before.
    (
        "ALTER TABLE flowy_threads ADD COLUMN recent_second INTEGER",
        "UPDATE flowy_threads SET recent_second = CAST(updated_at AS INTEGER)",
        "CREATE INDEX IF NOT EXISTS flowy_threads_recent "
        "ON flowy_threads (recent_second DESC, thread_id DESC)",
    ),
]
"""Schema steps: ``MIGRATIONS[n]`` upgrades a file from version ``n`` to ``n + 1``."""

SCHEMA_VERSION = len(MIGRATIONS)
"""The schema version this code writes (``PRAGMA user_version`` of the file)."""

_CLOSED_HINT = "open a new SQLiteBackend (or component) to use the file again"


def immediate(conn: sqlite3.Connection, body: Callable[[], T]) -> T:
    """Run ``body`` in a ``BEGIN IMMEDIATE`` transaction: commit if it returns, roll
    back if it raises. Runs on the worker thread."""
    return _transaction(conn, "BEGIN IMMEDIATE", body)


def snapshot(conn: sqlite3.Connection, body: Callable[[], T]) -> T:
    """Run ``body``'s reads in one read transaction (``BEGIN DEFERRED``): they see one
    state of the file. Runs on the worker thread."""
    return _transaction(conn, "BEGIN DEFERRED", body)


def _transaction(conn: sqlite3.Connection, begin: str, body: Callable[[], T]) -> T:
    conn.execute(begin)
    try:
        result = body()
        conn.execute("COMMIT")
    except BaseException:
        _rollback(conn)
        raise
    return result


def _rollback(conn: sqlite3.Connection | None) -> None:
    if conn is not None and conn.in_transaction:
        # The original error matters more than a failed rollback; SQLite rolls back a
        # transaction whose connection closes anyway.
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


class SQLiteDatabase:
    """One SQLite file opened by this process: a connection on a dedicated worker thread.

    The file is opened lazily by the first operation (or by :meth:`open`). A new or empty
    file gets the flowy schema; a flowy file with an older schema raises
    ``SchemaVersionError`` until :meth:`setup` upgrades it; a newer one always raises
    it; any other file raises :class:`SQLiteFileError`.

    Args:
        path: the database file (created if missing), or ``":memory:"`` for a private
            in-memory database (one connection, so one process only).
        busy_timeout: seconds a write waits for another connection's lock before it
            fails with ``StorageUnavailableError``.
        clock: the time source of leases and outbox visibility. Leases use the local
            clock of each process (``time.time``), so the processes sharing a file must
            run on one machine (or have synchronised clocks).
        synchronous: ``"FULL"`` (default) syncs every commit to disk; ``"NORMAL"`` is
            faster and survives a crash of the application, but a power loss may lose
            the latest commits.
    """

    def __init__(
        self,
        path: StrPath,
        *,
        busy_timeout: float = 5.0,
        clock: Clock = time.time,
        synchronous: Literal["FULL", "NORMAL"] = "FULL",
    ) -> None:
        if busy_timeout < 0:
            raise ValueError(f"busy_timeout must be >= 0 seconds, got {busy_timeout!r}")
        if synchronous not in ("FULL", "NORMAL"):
            raise ValueError(f"synchronous must be 'FULL' or 'NORMAL', got {synchronous!r}")
        self.path: str = os.fspath(path)
        self.busy_timeout: float = busy_timeout
        self.clock: Clock = clock
        self.synchronous: Literal["FULL", "NORMAL"] = synchronous
        in_memory = self.path in ("", ":memory:")
        self._domain = None if in_memory else os.path.realpath(self.path)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flowy-sqlite")
        self._conn: sqlite3.Connection | None = None  # used on the worker thread only
        self._ready = False  # the schema check passed (worker thread only)
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = asyncio.Lock()
        self.wakeups: Wakeups = Wakeups()
        """The tasks of this process waiting in ``claim(wait=...)``."""

    def __repr__(self) -> str:
        return f"SQLiteDatabase({self.path!r})"

    # -- identity -------------------------------------------------------------------

    @property
    def domain(self) -> Hashable:
        """The coordination domain: the file's real path (this object for ``:memory:``)."""
        return self._domain if self._domain is not None else self

    @property
    def closed(self) -> bool:
        """True once :meth:`aclose` was called."""
        return self._closed

    # -- event-loop side ------------------------------------------------------------

    def _primitives(self) -> asyncio.Lock:
        # An asyncio lock belongs to one loop; a database reused under a new loop (a
        # second asyncio.run) gets a fresh one.
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._loop is not None:
                self._lock = asyncio.Lock()
            self._loop = loop
        return self._lock

    def _check_usable(self) -> None:
        if self._closed:
            raise StorageUnavailableError(
                f"the SQLite database {self.path!r} is closed (aclose() was called); {_CLOSED_HINT}"
            )

    async def _submit(self, job: Job[T], action: str, *, check_schema: bool = True) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._call, job, action, check_schema)

    async def run(self, job: Job[T], action: str) -> T:
        """Run ``job`` as ``job(connection)`` on the worker thread; ``action`` names it in
        errors.

        ``sqlite3`` errors come back as flowy errors. A job that writes wraps its work
        in :func:`immediate`.
        """
        self._check_usable()
        lock = self._primitives()
        async with lock:
            self._check_usable()
            return await self._submit(job, action)

    async def open(self) -> None:
        """Open the file now and check its schema (operations do this lazily)."""
        await self.run(lambda conn: None, "open the database")

    async def setup(self) -> int:
        """Create the schema in a new file or upgrade an older flowy file to
        ``SCHEMA_VERSION``; return the version now in the file. Idempotent.

        Back the file up first: an upgrade cannot be undone by older code. A file
        written by newer code raises ``SchemaVersionError``.
        """
        self._check_usable()
        lock = self._primitives()
        async with lock:
            self._check_usable()
            return await self._submit(self._setup_job, "set up the schema", check_schema=False)

    async def migrate(self) -> int:
        """Deprecated alias of :meth:`setup` (removed in 0.4)."""
        warnings.warn("SQLiteDatabase.migrate() is deprecated; use setup()", DeprecationWarning, 2)
        return await self.setup()

    async def aclose(self) -> None:
        """Close the connection and stop the worker thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        lock = self._primitives()
        async with lock:
            await asyncio.shield(asyncio.wrap_future(self._executor.submit(self._close_connection)))
        self._executor.shutdown(wait=False)

    # -- worker-thread side -----------------------------------------------------------

    def _call(self, job: Job[T], action: str, check_schema: bool) -> T:
        try:
            conn = self._conn
            if conn is None:
                conn = self._conn = self._connect()
            if check_schema and not self._ready:
                self._check_schema(conn, upgrade=False)
                self._ready = True
            return job(conn)
        except sqlite3.Error as exc:
            raise self._translate(exc, action) from exc

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=self.busy_timeout, isolation_level=None)
        try:
            conn.execute(f"PRAGMA synchronous = {self.synchronous}")
        except BaseException:
            conn.close()
            raise
        return conn

    def _enable_wal(self, conn: sqlite3.Connection) -> None:
        if self._domain is None or conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal":
            return
        # Switching a new file to WAL needs a moment of exclusive access; the busy
        # handler does not cover it, so retry while another process holds the file.
        deadline = time.monotonic() + self.busy_timeout
        while True:
            try:
                conn.execute("PRAGMA journal_mode = WAL").fetchone()
                return
            except sqlite3.OperationalError as exc:
                code = exc.sqlite_errorcode & 0xFF
                if code not in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                    raise
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.01)

    def _setup_job(self, conn: sqlite3.Connection) -> int:
        self._check_schema(conn, upgrade=True)
        self._ready = True
        return len(MIGRATIONS)

    def _check_schema(self, conn: sqlite3.Connection, *, upgrade: bool) -> None:
        # Classify first: a file that is not ours is refused before anything changes.
        pending = self._pending_steps(conn, upgrade=upgrade)
        self._enable_wal(conn)
        if pending is None:
            return

        def create_or_upgrade() -> None:
            start = self._pending_steps(conn, upgrade=upgrade)  # re-check under the lock
            if start is None:
                return
            for step in MIGRATIONS[start:]:
                for statement in step:
                    conn.execute(statement)
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            conn.execute(f"PRAGMA user_version = {len(MIGRATIONS)}")

        immediate(conn, create_or_upgrade)

    def _pending_steps(self, conn: sqlite3.Connection, *, upgrade: bool) -> int | None:
        """The version to upgrade from, ``None`` if the schema is current; raise if the
        file is not ours or needs an explicit upgrade (``setup``)."""
        # One statement, so one consistent read while another process may be creating
        # the schema.
        row = conn.execute(
            "SELECT (SELECT application_id FROM pragma_application_id), "
            "(SELECT user_version FROM pragma_user_version), "
            "(SELECT group_concat(name, ', ') FROM sqlite_master WHERE type = 'table')"
        ).fetchone()
        app_id, version, tables = int(row[0]), int(row[1]), str(row[2] or "")
        if app_id != APPLICATION_ID:
            if tables or version or app_id:
                raise SQLiteFileError(
                    f"{self.path!r} is a SQLite database but not a flowy one "
                    f"(application_id {app_id}, user_version {version}, tables: "
                    f"{tables[:200]}); give flowy a new file or a flowy database",
                    path=self.path,
                )
            return 0
        where = f"the flowy database {self.path!r}"
        known = len(MIGRATIONS)
        if not BaseBackend.check_schema_version(
            version, known=known, where=where, package="flowy-core", upgrade=upgrade
        ):
            return None
        return version

    def _close_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            _rollback(conn)
            conn.close()

    def _translate(self, exc: sqlite3.Error, action: str) -> StorageError:
        raw_code: object = getattr(exc, "sqlite_errorcode", None)
        code = raw_code & 0xFF if isinstance(raw_code, int) else None
        where = f"the SQLite database {self.path!r}"
        if isinstance(exc, sqlite3.ProgrammingError) and self._closed:
            return StorageUnavailableError(f"{where} is closed; {_CLOSED_HINT}")
        if code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
            return StorageUnavailableError(
                f"{where} stayed locked by another connection past the busy timeout "
                f"({self.busy_timeout}s) while trying to {action}; nothing was written. "
                "Retry, or raise busy_timeout"
            )
        if code in (sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT):
            return SQLiteFileError(
                f"{where} is not a flowy database or is damaged ({exc}) - failed to "
                f"{action}; give flowy a new file or restore the database from a backup",
                path=self.path,
            )
        if code in (
            sqlite3.SQLITE_CANTOPEN,
            sqlite3.SQLITE_PERM,
            sqlite3.SQLITE_READONLY,
            sqlite3.SQLITE_AUTH,
        ):
            return SQLiteFileError(
                f"cannot open or write {where} ({exc}) - failed to {action}; check that the "
                "path names a file in an existing, writable directory",
                path=self.path,
            )
        if code == sqlite3.SQLITE_TOOBIG:
            return SnapshotTooLargeError(
                f"{where} refused a value as too big while trying to {action} ({exc}); "
                "nothing was written"
            )
        if code in (sqlite3.SQLITE_IOERR, sqlite3.SQLITE_FULL, sqlite3.SQLITE_INTERRUPT):
            return StorageUnavailableError(
                f"{where} failed to {action} ({exc}); the outcome may be unknown - reload "
                "before retrying"
            )
        return StorageError(f"{where} failed to {action}: {exc}")
