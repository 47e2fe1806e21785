"""The worker's sampling part: while ``flowy.otel`` instrumentation is in effect, it
reads the store's backlog every ``sample_interval`` seconds for the gauges
(``flowy.otel.sample``). A failed read is logged."""

from __future__ import annotations

import logging
from typing import Generic

from .. import _tracing
from .._types import E, S
from ..storage import Backend
from ._shared import Shared

__all__ = ["Sampling"]

logger = logging.getLogger("flowy.worker")


class Sampling(Generic[S, E]):
    """Samples one backend's backlog for the ``flowy.otel`` gauges."""

    def __init__(self, shared: Shared[S, E], backend: Backend[S]) -> None:
        self.shared = shared
        self.backend = backend

    async def loop(self, interval: float) -> None:
        """Sample every ``interval`` seconds until the worker stops."""
        shared = self.shared
        while not shared.stopping.is_set():
            tracing = _tracing.active()
            if tracing is not None:
                try:
                    await tracing.sample(self.backend)
                except Exception:
                    logger.exception("flowy worker %r: reading the backlog failed", shared.owner)
            await shared.pause(interval)
