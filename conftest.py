"""The repository's root conftest: every async test runs on asyncio.

anyio runs ``@pytest.mark.anyio`` tests on every backend it finds installed; trio comes
with Selenium (the inspector's browser tests), and no flowy store runs on trio. A
conftest fixture takes precedence over the plugins' ``anyio_backend``.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """Asyncio only (see the module docstring)."""
    return "asyncio"
