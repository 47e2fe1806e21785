"""The Redis store, standalone and on a cluster, has every capability
(``Backend.capabilities``): no class of the conformance suite is skipped on it for a
missing one."""

from __future__ import annotations

from typing import Any

import pytest

from flowy.storage import Backend

pytestmark = pytest.mark.anyio


async def test_the_store_has_every_capability(flowy_backend: Backend[Any]) -> None:
    assert flowy_backend.capabilities.missing() == ()
