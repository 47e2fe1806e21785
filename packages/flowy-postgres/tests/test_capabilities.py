"""The PostgreSQL store has every capability (``Backend.capabilities``): no class of the
conformance suite is skipped on it for a missing one. Behind a transaction-mode pooler
(or without LISTEN) it lacks only live progress across processes: its last save still
releases the lease and acknowledges the message (one statement, no session state)."""

from __future__ import annotations

from typing import Any

import pytest
from pg_support import opened

from flowy.storage import Backend

pytestmark = pytest.mark.anyio


async def test_the_store_has_every_capability(flowy_backend: Backend[Any]) -> None:
    assert flowy_backend.capabilities.missing() == ()


@pytest.mark.parametrize("option", [{"pooler_mode": "true"}, {"listen": "false"}])
async def test_without_listen_only_live_progress_is_missing(
    flowy_url: str, option: dict[str, str]
) -> None:
    async with opened(flowy_url, **option) as backend:
        caps = backend.capabilities
        assert caps.missing() == ("live_progress",)
        assert caps.release_on_save and caps.ack_on_save and caps.acquire_with_load
