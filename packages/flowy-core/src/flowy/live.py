"""Live progress from inside a node, and following a thread from anywhere.

Inside a node, ``flowy.live.progress(data)`` sends ``data`` (a JSON value) to whoever
follows the run: the run's own stream (``Runner.stream``, as ``progress`` events) and the
watchers of its thread (``Backend.watch``, as ``"progress"`` events), in this process or,
on a store with a channel (PostgreSQL, Redis), in any process. Progress is never saved:
a consumer that falls behind loses the oldest, and when nobody listens it costs a lookup.

Anywhere, ``async for event in backend.watch(thread_id)`` follows a thread: each saved
snapshot in order, the progress events between them, until the run completes or fails.
"""

from __future__ import annotations

from ._context import current_progress
from ._errors import NoRunContextError
from .storage._watch import MAX_PROGRESS_BYTES, TERMINAL_STATUSES, WatchEvent

__all__ = ["MAX_PROGRESS_BYTES", "TERMINAL_STATUSES", "WatchEvent", "progress"]


def progress(data: object) -> None:
    """Send ``data`` to the listeners of the running node's thread; it never waits.

    ``data`` is any JSON value (a token, ``{"done": 3, "of": 10}``, …) up to
    :data:`MAX_PROGRESS_BYTES` as JSON. It is not saved: a resumed or replayed node sends
    it again, and listeners that fall behind drop the oldest events.

    Raises:
        NoRunContextError: called outside a running node.
        TypeError: ``data`` is not a JSON value (checked when someone may listen).
        ValueError: ``data`` is larger than :data:`MAX_PROGRESS_BYTES` as JSON.
    """
    send = current_progress.get()
    if send is None:
        raise NoRunContextError("flowy.live.progress() is only available inside a running node")
    send(data)
