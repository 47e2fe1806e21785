"""Operating a fleet of threads from any process: cancel and terminate.

Both take the ``flowy.Backend`` the threads are stored in (``flowy.connect(url)``) and
work on every store; ``Runner.cancel`` and ``Runner.terminate`` do the same through a
runner's store. ``docs/operations.md`` has the runbook.
"""

from __future__ import annotations

import time
from typing import Any

from ._cancel import MAX_STOP_REASON as MAX_STOP_REASON
from ._cancel import StopOutcome as StopOutcome
from ._cancel import cancel_thread, terminate_thread
from .storage import Backend
from .storage._adapt import backend_of, bind

__all__ = ["MAX_STOP_REASON", "StopOutcome", "cancel", "terminate"]

StopOutcome.__module__ = __name__


async def cancel(
    backend: Backend[Any], thread_id: str, *, reason: str | None = None
) -> StopOutcome:
    """Cancel ``thread_id``: its head becomes ``canceled`` with reason ``canceled`` (or
    ``canceled: <reason>``), whatever it was doing.

    - Suspended, waiting or handed off: at once. Its timers go (a worker will not wake
      it), the signals in its inbox stay, and the message of a queued hand-off is
      acknowledged by the worker that receives it without running anything.
    - Running in a worker: the run stops at its next save (every step with
      ``save_every_step``; a step costs no extra read), ends with a ``canceled`` result
      and releases its lease. A save of that run and the cancel race on the thread's
      revision: exactly one writes it, and the history shows which came first.
    - Canceled already (by a cancel): nothing is written (``changed`` is False).

    A canceled thread stays as it is until someone resumes it on purpose (with the
    token of its head, e.g. ``flowy resume``) or forks it.

    Args:
        backend: the store of the thread.
        thread_id: the thread to cancel.
        reason: why, kept in the head's reason (at most ``MAX_STOP_REASON``
            characters; whitespace is collapsed).

    Returns:
        What was done: the thread's revision and status now, and before.

    Raises:
        ThreadNotFoundError: there is no such thread.
        ThreadFinishedError: it completed or failed already (nothing is written).
        InvalidThreadIdError: ``thread_id`` is not a thread id.
        ValueError: ``reason`` is too long.
        ConcurrencyConflictError: the thread moved on at each of many attempts.
    """
    store = bind(backend_of(backend, None, None), None)
    return await cancel_thread(store.checkpointer, store.leases, thread_id, reason, clock=time.time)


async def terminate(
    backend: Backend[Any], thread_id: str, *, reason: str | None = None
) -> StopOutcome:
    """Terminate ``thread_id`` at once: its head becomes ``failed`` with reason
    ``terminated`` (or ``terminated: <reason>``), and the lease of the run holding it,
    if one does, is taken away.

    That run's next save and its next lease renewal are refused, so even a node that
    never returns is interrupted when the run renews its lease (within a third of its
    lease ttl); it ends with a ``failed`` result of the same reason. Use it for a run
    that a cancel cannot stop; the thread cannot be resumed, only forked. Terminating a
    terminated thread changes nothing; a canceled one can be terminated.

    Args:
        backend: the store of the thread.
        thread_id: the thread to terminate.
        reason: why (as for :func:`cancel`).

    Returns:
        What was done; ``fenced`` is the lease taken away, if there was one.

    Raises:
        ThreadNotFoundError: there is no such thread.
        ThreadFinishedError: it completed, or failed otherwise, already.
        InvalidThreadIdError: ``thread_id`` is not a thread id.
        ValueError: ``reason`` is too long.
        ConcurrencyConflictError: the thread moved on at each of many attempts.
    """
    store = bind(backend_of(backend, None, None), None)
    return await terminate_thread(
        store.checkpointer, store.leases, thread_id, reason, clock=time.time
    )
