"""The DynamoDB store has every capability (``Backend.capabilities``) but a progress
channel and an acknowledging save.

DynamoDB has no publish/subscribe, so ``watch`` hears the progress of runs in its own
process only (``WatchSuite`` skips its one test of another connection's progress). An
ack (``DynamoConsumer._ack``) deletes the message item and, from the item it deleted
(``ReturnValues=ALL_OLD``), learns the queue whose in-flight entry it then removes; a
``TransactWriteItems`` returns no item it wrote, so the save cannot fold that ack in
(``AckingSaveSuite`` skips) and a worker acknowledges after the run's last save. It
keeps no recency index either (a global secondary index on the save second would be
written on every save that changes it, and read with a scan of partitions):
``recent_threads`` is the base's sort of every head (``RecentThreadsSuite`` runs it)."""

from __future__ import annotations

from typing import Any

import pytest

from flowy.storage import Backend

pytestmark = pytest.mark.anyio


async def test_the_store_has_every_capability_but_a_progress_channel_an_acking_save_and_recency(
    flowy_backend: Backend[Any],
) -> None:
    assert flowy_backend.capabilities.missing() == ("live_progress", "ack_on_save", "recent_index")
