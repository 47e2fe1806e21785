"""Fixtures of the core tests: the conformance suite runs on a fresh in-memory store.

The suite's plugin (``flowy.testing.plugin``) is loaded for every test by the root
pytest configuration (``-p flowy.testing.plugin``).
"""

from __future__ import annotations

import uuid

import pytest

from flowy.testing import Corrupt, Dump, corrupt_head, dump_store


@pytest.fixture
def flowy_url() -> str:
    """A named memory store no other test uses (named, so the suite can open peers)."""
    return f"memory://suite-{uuid.uuid4().hex}?max_attempts=3"


@pytest.fixture
def flowy_corrupt() -> Corrupt:
    """Flips a byte of a thread's head record in the memory store."""
    return corrupt_head


@pytest.fixture
def flowy_dump() -> Dump:
    """Everything a memory store holds, as stored."""
    return dump_store
