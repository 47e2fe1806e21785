"""The DynamoDB store has every capability (``Backend.capabilities``) but a progress
channel: DynamoDB has no publish/subscribe, so ``watch`` hears the progress of runs in its
own process only (``WatchSuite`` skips its one test of another connection's progress)."""

from __future__ import annotations

from typing import Any

import pytest

from flowy.storage import Backend

pytestmark = pytest.mark.anyio


async def test_the_store_has_every_capability_but_a_progress_channel(
    flowy_backend: Backend[Any],
) -> None:
    assert flowy_backend.capabilities.missing() == ("live_progress",)
