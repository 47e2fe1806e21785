"""Test hooks for the stores in core (they are not part of the stores themselves).

``corrupt_head(backend, thread_id)`` flips one byte of a thread's stored head record in
a memory or SQLite store: the ``flowy_corrupt`` hook of their conformance runs.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from typing import Any

from ..errors import ThreadNotFoundError
from ..memory import MemoryBackend
from ..sqlite import SQLiteBackend
from ..sqlite._db import immediate
from ..storage import Backend

__all__ = ["Corrupt", "corrupt_head", "flip"]

Corrupt = Callable[[Backend[Any], str], Awaitable[None]]
"""``await corrupt(backend, thread_id)``: flip one byte of the thread's stored head."""


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
