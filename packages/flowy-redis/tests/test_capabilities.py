"""The Redis store has every capability (``Backend.capabilities``) on a standalone
server, and every one but queues and the recency index on a cluster (whose shards live
in different hash slots, so no one script can count a queue across them, and no save
can write one sorted set of every thread): no other class of the conformance suite is
skipped on it for a missing one."""

from __future__ import annotations

from typing import Any

import pytest

from flowy.storage import Backend

pytestmark = pytest.mark.anyio


async def test_the_store_has_every_capability(flowy_backend: Backend[Any]) -> None:
    cluster = "+cluster" in flowy_backend.url.split("://", 1)[0]
    assert flowy_backend.capabilities.missing() == (("queues", "recent_index") if cluster else ())
