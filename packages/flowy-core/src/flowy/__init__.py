"""flowy: durable, controlled agentic state machines."""

from __future__ import annotations

from ._checkpoint import Checkpointer as Checkpointer
from ._checkpoint import HandoffIntent as HandoffIntent
from ._checkpoint import HandoffStatus as HandoffStatus
from ._checkpoint import Lease as Lease
from ._checkpoint import LeaseManager as LeaseManager
from ._checkpoint import ResumeToken as ResumeToken
from ._checkpoint import RunStatus as RunStatus
from ._checkpoint import Snapshot as Snapshot
from ._errors import *  # noqa: F403
from ._errors import __all__ as _errors_all
from ._memory import MemoryCheckpointer as MemoryCheckpointer
from ._memory import MemoryLeaseManager as MemoryLeaseManager
from ._memory import MemoryOutbox as MemoryOutbox

__all__ = sorted(
    [
        *_errors_all,
        "Checkpointer",
        "HandoffIntent",
        "HandoffStatus",
        "Lease",
        "LeaseManager",
        "MemoryCheckpointer",
        "MemoryLeaseManager",
        "MemoryOutbox",
        "ResumeToken",
        "RunStatus",
        "Snapshot",
    ]
)
