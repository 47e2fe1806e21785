"""The conformance suite's backend for this folder: the embedded SQLite backend on a fresh
file per test; ``open_peer`` opens a second ``SQLiteBackend`` (its own connection and
worker thread) on the same file, standing for a second process.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest

from flowy._sqlite import SQLiteBackend
from flowy.testing import BackendBundle


def sqlite_bundle(backend: SQLiteBackend[Any], path: Path) -> BackendBundle:
    """A suite bundle over ``backend``; its peers are new backends on ``path``."""

    async def open_peer() -> BackendBundle:
        return sqlite_bundle(SQLiteBackend(path, max_attempts=3), path)

    return BackendBundle(
        checkpointer=backend.checkpointer,
        leases=backend.leases,
        outbox=backend.outbox,
        consumer=backend.outbox,
        corrupt=backend.corrupt,
        open_peer=open_peer,
        close=backend.aclose,
        name="sqlite",
    )


@pytest.fixture
async def flowy_backend(tmp_path: Path) -> AsyncGenerator[BackendBundle]:
    """A SQLite backend on a new file in ``tmp_path``, closed after the test."""
    path = tmp_path / "flowy.db"
    backend = SQLiteBackend[Any](path, max_attempts=3)
    try:
        yield sqlite_bundle(backend, path)
    finally:
        await backend.aclose()
