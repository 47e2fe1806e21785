"""pytest plugin of the conformance suite: enable with ``pytest_plugins``.

It provides the ``anyio_backend`` fixture (asyncio) and a default ``flowy_backend``
fixture that fails with instructions; an adapter's conftest overrides ``flowy_backend``.
"""

from __future__ import annotations

import pytest

__all__ = ["anyio_backend", "flowy_backend"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def flowy_backend() -> object:
    pytest.fail(
        "the flowy conformance suite needs a `flowy_backend` fixture yielding a "
        "flowy.testing.BackendBundle; define it in your conftest.py (see docs/adapters.md)"
    )
