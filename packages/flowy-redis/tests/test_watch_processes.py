"""A watcher in this process follows a thread that a worker in another process runs:
every snapshot, and the progress the worker's node sends, through Redis pub/sub
(``RedisBackend._publish`` / ``_subscribe``), standalone and Cluster."""

from __future__ import annotations

from pathlib import Path

import pytest
from watch_support import follow_a_worker_process

pytestmark = pytest.mark.anyio


async def test_progress_of_a_worker_process_reaches_a_watcher(
    flowy_url: str, tmp_path: Path
) -> None:
    await follow_a_worker_process(flowy_url, tmp_path)
