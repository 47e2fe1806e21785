"""flowy-langgraph: a LangGraph checkpointer on every flowy store.

``FlowySaver(backend)`` is a LangGraph ``BaseCheckpointSaver`` built on a
``flowy.Backend`` (memory, SQLite, PostgreSQL, Redis, DynamoDB); ``fenced=True``
refuses a second concurrent writer on a thread instead of forking it; ``keep_last=N``
keeps a thread's newest checkpoints only. See ``docs/langgraph.md``.
"""

from __future__ import annotations

import importlib.metadata as _metadata

from ._saver import FlowySaver as FlowySaver
from ._saver import ThreadForkedError as ThreadForkedError

__all__ = ["FlowySaver", "ThreadForkedError"]
__version__: str = _metadata.version("flowy-langgraph")
