"""The background worker: consumes hand-off intents and resumes their runs, fires the
timers of waiting runs, recovers stuck hand-offs, and samples the backlog.

``Worker`` (``_worker``) composes one part per loop, each in its own module and each
holding only the state the parts share (``_shared``):

- ``_consume``: claims messages, resumes their runs, acks or gives them back;
- ``_timers``: every ``timer_interval`` seconds, resumes the threads whose wake-up
  time has come;
- ``_recovery``: every ``recovery_interval`` seconds, as the elected leader,
  re-enqueues stale pending and orphaned hand-offs;
- ``_sampling``: every ``sample_interval`` seconds, while ``flowy.otel``
  instrumentation is in effect, reads the store's backlog for the gauges.

What it is told and tells back (``WorkerOptions``, the hooks, ``Outcome``,
``Failure``, ``WorkerStats``) is in ``_options``.
"""

from ._options import PERMANENT_ERRORS as PERMANENT_ERRORS
from ._options import RECOVERY_LEADER as RECOVERY_LEADER
from ._options import Failure as Failure
from ._options import FailureHook as FailureHook
from ._options import Outcome as Outcome
from ._options import ResultHook as ResultHook
from ._options import ResumeOptions as ResumeOptions
from ._options import WorkerKeywords as WorkerKeywords
from ._options import WorkerOptions as WorkerOptions
from ._options import WorkerStats as WorkerStats
from ._worker import Worker as Worker

__all__ = [
    "PERMANENT_ERRORS",
    "RECOVERY_LEADER",
    "Failure",
    "FailureHook",
    "Outcome",
    "ResultHook",
    "ResumeOptions",
    "Worker",
    "WorkerKeywords",
    "WorkerOptions",
    "WorkerStats",
]
