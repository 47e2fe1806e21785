"""Fixtures of the toy store's conformance run: a fresh ``toy://`` store for each test.

The suite's plugin (``flowy.testing.plugin``) is loaded for every test by the root
pytest configuration (``-p flowy.testing.plugin``); a conftest below the root cannot
set ``pytest_plugins``.
"""

from __future__ import annotations

import copy
import urllib.parse
import uuid
from typing import Any

import pytest
from toy_store.toy import _STORES, ToyBackend, open_backend  # pyright: ignore[reportPrivateUsage]

from flowy.storage import Backend
from flowy.storage.dialect import register_backend
from flowy.testing import Corrupt, Dump

register_backend("toy", open_backend)


@pytest.fixture
def flowy_url() -> str:
    """A named toy store no other test uses (named, so the suite can open peers)."""
    return f"toy://suite-{uuid.uuid4().hex}?max_attempts=3"


async def corrupt_head(backend: Backend[Any], thread_id: str) -> None:
    """Flip one byte in the middle of the thread's head record, in place."""
    assert isinstance(backend, ToyBackend)
    store = backend.store
    async with store.atomic():
        revision = store.heads[thread_id].revision
        record = bytearray(store.history[thread_id][revision])
        record[len(record) // 2] ^= 0xFF
        store.history[thread_id][revision] = bytes(record)


@pytest.fixture
def flowy_corrupt() -> Corrupt:
    """Corrupts a head record of the toy store."""
    return corrupt_head


async def dump_store(url: str) -> object:
    """Everything the named toy store at ``url`` holds."""
    store = _STORES.get(urllib.parse.urlsplit(url).netloc)
    if store is None:
        return {}
    kept = ("heads", "history", "tokens", "leases", "messages", "message_ids", "inboxes")
    return {name: copy.deepcopy(getattr(store, name)) for name in (*kept, "journals")}


@pytest.fixture
def flowy_dump() -> Dump:
    """Everything a toy store holds."""
    return dump_store
