"""pytest plugin of the conformance suite: enable with ``pytest_plugins``.

It provides the ``anyio_backend`` fixture (asyncio) and a default ``flowy_backend``
fixture that fails with instructions; an adapter's conftest overrides ``flowy_backend``.
Loading it also registers :mod:`flowy.testing.suite` for pytest's assertion rewriting, so
a failing suite assertion reports the compared values.
"""

from __future__ import annotations

import pytest

__all__ = ["anyio_backend", "flowy_backend"]

# Must run before the suite is imported (the plugin is loaded first, by ``-p`` or
# ``pytest_plugins``); otherwise a failed ``assert`` in the suite reports no values.
pytest.register_assert_rewrite("flowy.testing.suite")


@pytest.fixture
def anyio_backend() -> str:
    """Run ``@pytest.mark.anyio`` tests on asyncio (every flowy backend is asyncio-based)."""
    return "asyncio"


@pytest.fixture
def flowy_backend() -> object:
    """Placeholder: an adapter's conftest defines the real ``flowy_backend`` fixture."""
    pytest.fail(
        "the flowy conformance suite needs a `flowy_backend` fixture yielding a "
        "flowy.testing.BackendBundle; define it in your conftest.py (see docs/adapters.md)"
    )
