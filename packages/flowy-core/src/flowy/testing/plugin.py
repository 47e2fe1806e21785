"""pytest plugin of the conformance suite: enable it with ``pytest_plugins``.

A store's tests define one fixture, ``flowy_url``: a URL of a fresh, isolated store
(its own table, key prefix or file) for each test. The plugin opens it with
``flowy.connect`` as ``flowy_backend``, closes it after the test, and the suite's test
classes do the rest. ``flowy_corrupt`` (optional, ``None`` by default) flips a byte of a
thread's stored head record, for the corruption tests.

Loading the plugin also registers :mod:`flowy.testing.suite` for pytest's assertion
rewriting, so a failing suite assertion reports the compared values.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import pytest

from ..storage import Backend, connect
from .hooks import Corrupt, Dump, SetSchemaVersion

__all__ = [
    "anyio_backend",
    "flowy_backend",
    "flowy_corrupt",
    "flowy_schema_version",
    "flowy_url",
]

# Must run before the suite is imported (the plugin is loaded first, by ``-p`` or
# ``pytest_plugins``); otherwise a failed ``assert`` in the suite reports no values.
pytest.register_assert_rewrite("flowy.testing.suite")


@pytest.fixture
def anyio_backend() -> str:
    """Run ``@pytest.mark.anyio`` tests on asyncio (every flowy store is asyncio-based)."""
    return "asyncio"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Drop the copies anyio makes of a test for backends other than asyncio (it runs a
    test on every backend installed, trio included, unless a conftest pins
    ``anyio_backend``): no flowy store runs on them."""
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        backend = callspec.params.get("anyio_backend", "asyncio") if callspec else "asyncio"
        (keep if backend == "asyncio" else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


@pytest.fixture
def flowy_url() -> str:
    """Placeholder: a store's conftest defines the real ``flowy_url`` fixture."""
    pytest.fail(
        "the flowy conformance suite needs a `flowy_url` fixture returning the URL of a "
        "fresh, isolated store for each test; define it in your conftest.py "
        "(see docs/adapters.md)"
    )


@pytest.fixture
async def flowy_backend(flowy_url: str) -> AsyncGenerator[Backend[Any]]:
    """The store at ``flowy_url``, opened with ``flowy.connect`` and closed afterwards."""
    async with connect(flowy_url) as backend:
        yield backend


@pytest.fixture
def flowy_dump() -> Dump | None:
    """Override to return ``async def dump(url)``: everything the store at ``url`` holds
    in its namespace, as stored (see ``flowy.testing.Dump``); the scratch tests skip
    without it."""
    return None


@pytest.fixture
def flowy_corrupt() -> Corrupt | None:
    """Override to return ``async def corrupt(backend, thread_id)`` flipping one byte of
    the thread's stored head record (the corruption tests skip without it)."""
    return None


@pytest.fixture
def flowy_schema_version() -> SetSchemaVersion | None:
    """Override to return ``async def set_schema_version(url, version)`` recording
    ``version`` as the schema version of the store at ``url`` (the schema-version test
    skips without it: a store without a schema, like ``memory://``, has none)."""
    return None
