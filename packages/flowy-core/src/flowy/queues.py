"""Queues of hand-off messages, with limits enforced across every worker of a fleet.

A hand-off names where its message waits — ``flowy.handoff("call the model",
queue="llm", partition_key=customer_id, priority=1)`` — or takes its node's or its
graph's default queue. A ``flowy.Worker`` serves the queues of ``WorkerOptions.queues``;
the messages of a queue no worker serves wait, and are kept.

Each queue's limits live in the store, and every claim counts them in its own atomic
operation, so no race between workers exceeds them; change them at run time and the
next claim of every worker obeys::

    await backend.queues.configure("llm", global_concurrency=20, rate_limit=60)

See ``docs/queues.md`` for the recipes (a model quota, one run per customer, paid users
first, raising a limit during a deploy).
"""

from __future__ import annotations

from .storage._model import DEFAULT_QUEUE as DEFAULT_QUEUE
from .storage._model import Route as Route
from .storage._queue_admin import Queues as Queues
from .storage._queue_admin import queues_of as queues_of
from .storage._queues import DEFAULT_RATE_PERIOD as DEFAULT_RATE_PERIOD
from .storage._queues import QueueLimits as QueueLimits
from .storage._queues import QueueMessage as QueueMessage
from .storage._queues import QueueStats as QueueStats

__all__ = [
    "DEFAULT_QUEUE",
    "DEFAULT_RATE_PERIOD",
    "QueueLimits",
    "QueueMessage",
    "QueueStats",
    "Queues",
    "Route",
    "queues_of",
]
