"""Test hooks for the stores in core (they are not part of the stores themselves).

``corrupt_head(backend, thread_id)`` flips one byte of a thread's stored head record in
a memory or SQLite store: the ``flowy_corrupt`` hook of their conformance runs.
``dump_store(url)`` reads everything a memory or SQLite store holds, as stored: their
``flowy_dump`` hook.
"""

from __future__ import annotations

import copy
import os
import sqlite3
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

from ..errors import ThreadNotFoundError
from ..memory import MemoryBackend
from ..memory import _named as named_memory_stores  # pyright: ignore[reportPrivateUsage]
from ..sqlite import SQLiteBackend, path_of
from ..sqlite._db import immediate
from ..storage import Backend
from ..storage.dialect import StoreURL

__all__ = [
    "Corrupt",
    "Dump",
    "SetSchemaVersion",
    "corrupt_head",
    "dump_store",
    "flip",
    "set_sqlite_schema_version",
]

Corrupt = Callable[[Backend[Any], str], Awaitable[None]]
"""``await corrupt(backend, thread_id)``: flip one byte of the thread's stored head."""

SetSchemaVersion = Callable[[str, int], Awaitable[None]]
"""``await set_schema_version(url, version)``: record ``version`` as the schema version of
the (set up, closed) store at ``url``, as older or newer code would have."""

Dump = Callable[[str], Awaitable[object]]
"""``await dump(url)``: everything the store at ``url`` holds in its namespace, as
stored (rows, keys, items), comparable with ``==``; empty (falsy) when the namespace
does not exist, which reading it never creates."""


async def dump_store(url: str) -> object:
    """Everything the memory (``memory://NAME``) or SQLite store at ``url`` holds, as
    stored: a private ``memory://`` and a missing file are empty."""
    parsed = StoreURL.parse(url)
    if parsed.scheme == "memory":
        store = named_memory_stores.get(parsed.netloc + parsed.path.rstrip("/"))
        if store is None:
            return {}
        fields = ("threads", "leases", "timers", "inboxes", "journals", "messages", "dead")
        return {name: copy.deepcopy(getattr(store, name)) for name in fields}
    if parsed.scheme == "sqlite":
        path = path_of(parsed)
        if path == ":memory:" or not os.path.exists(path):  # noqa: ASYNC240 - a test hook
            return {}
        conn = sqlite3.connect(f"file:{urllib.parse.quote(path)}?mode=ro", uri=True)
        try:
            tables = [
                row[0]
                for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            ]
            return {
                table: sorted(map(repr, conn.execute(f'SELECT * FROM "{table}"')))
                for table in sorted(tables)
            }
        finally:
            conn.close()
    raise TypeError(f"dump_store knows memory and SQLite stores, not {parsed.scheme}://")


def flip(data: bytes) -> bytes:
    """``data`` with its middle byte inverted."""
    damaged = bytearray(data)
    damaged[len(damaged) // 2] ^= 0xFF
    return bytes(damaged)


async def corrupt_head(backend: Backend[Any], thread_id: str) -> None:
    """Flip one byte of the head record of ``thread_id`` in ``backend`` (a memory or
    SQLite store; ``TypeError`` for another, ``ThreadNotFoundError`` without a head)."""
    if isinstance(backend, MemoryBackend):
        thread = backend.store.threads.get(thread_id)
        if thread is None or thread.head == 0:
            raise ThreadNotFoundError(f"no checkpoint for thread {thread_id!r}")
        thread.history[thread.head] = flip(thread.history[thread.head])
        return
    if isinstance(backend, SQLiteBackend):

        def body(conn: sqlite3.Connection) -> None:
            row = conn.execute(
                "SELECT revision, record FROM flowy_threads WHERE thread_id = ?", (thread_id,)
            ).fetchone()
            if row is None:
                raise ThreadNotFoundError(f"no checkpoint for thread {thread_id!r}")
            data = flip(bytes(row[1]))
            conn.execute(
                "UPDATE flowy_threads SET record = ? WHERE thread_id = ?", (data, thread_id)
            )
            conn.execute(
                "UPDATE flowy_history SET record = ? WHERE thread_id = ? AND revision = ?",
                (data, thread_id, row[0]),
            )

        await backend.database.run(lambda conn: immediate(conn, lambda: body(conn)), "corrupt")
        return
    raise TypeError(f"corrupt_head knows memory and SQLite stores, not {type(backend).__name__}")


async def set_sqlite_schema_version(url: str, version: int) -> None:
    """Record ``version`` as the schema version of the SQLite file at ``url``."""
    conn = sqlite3.connect(path_of(StoreURL.parse(url)))
    try:
        conn.execute(f"PRAGMA user_version = {int(version)}")
    finally:
        conn.close()
