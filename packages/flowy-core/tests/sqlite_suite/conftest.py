"""The conformance suite's store for this folder: SQLite, on a fresh file per test.

Peers open the same file with their own connection and worker thread, standing for a
second process.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from flowy.testing import Corrupt, Dump, corrupt_head, dump_store
from flowy.testing.hooks import SetSchemaVersion, set_sqlite_schema_version


@pytest.fixture
def flowy_url(tmp_path: Path) -> str:
    """A new SQLite file in the test's own directory."""
    return f"sqlite:///{tmp_path / 'flowy.db'}?max_attempts=3"


@pytest.fixture
def flowy_corrupt() -> Corrupt:
    """Flips a byte of a thread's head record in the SQLite file."""
    return corrupt_head


@pytest.fixture
def flowy_dump() -> Dump:
    """Everything a SQLite store holds, as stored."""
    return dump_store


@pytest.fixture
def flowy_schema_version() -> SetSchemaVersion:
    """Records a schema version in a SQLite file."""
    return set_sqlite_schema_version
