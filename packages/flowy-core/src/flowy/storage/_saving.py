"""Saves whose outcome may be unknown, confirmed.

A backend that loses its connection during a save raises ``StorageUnavailableError``: the
write may or may not have landed. ``confirmed_save`` resolves that by reloading the head
and comparing the write id every snapshot carries, so a write that landed is reported as
success (never as a conflict) and a write that did not land is retried, never applied
twice.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

from .._errors import StorageUnavailableError, ThreadNotFoundError
from .._types import S
from ._model import Lease, OutboxMessage, Snapshot, new_write_id
from ._protocols import Checkpointer

if TYPE_CHECKING:
    from ._base import BaseCheckpointer

__all__ = ["confirm_save", "confirmed_save"]


async def confirm_save(
    checkpointer: Checkpointer[Any], expected_revision: int, snapshot: Snapshot[Any]
) -> int | None:
    """Return the revision ``snapshot`` landed at, or ``None`` if it did not land.

    Call after a save of ``snapshot`` (with a non-empty ``write_id``) failed with an
    unknown outcome.

    Args:
        checkpointer: the store the save went to.
        expected_revision: the ``expected_revision`` the save was made with.
        snapshot: the snapshot saved (its ``write_id`` identifies the write).

    Raises:
        StorageUnavailableError: the backend is still unreachable.
    """
    try:
        head, revision = await checkpointer.load(snapshot.thread_id)
    except ThreadNotFoundError:
        return None
    if revision == expected_revision + 1 and head.write_id == snapshot.write_id:
        return revision
    return None


async def confirmed_save(
    checkpointer: Checkpointer[S],
    expected_revision: int,
    snapshot: Snapshot[S],
    *,
    lease: Lease | None = None,
    attempts: int = 3,
    backoff: float = 0.05,
    release: bool = False,
    ack: OutboxMessage | None = None,
) -> int:
    """Save ``snapshot`` at ``expected_revision + 1``, resolving unknown outcomes.

    A ``StorageUnavailableError`` is followed by a reload: if the head is this write, its
    revision is returned; if the head is still ``expected_revision`` the save is retried
    (up to ``attempts`` times); otherwise the next save attempt raises the backend's
    ``ConcurrencyConflictError``. Other errors propagate unchanged.

    Args:
        checkpointer: the store to save to.
        expected_revision: the thread's head revision the save requires (0: a new
            thread).
        snapshot: the snapshot to save; one without a ``write_id`` gets a fresh one.
        lease: the run lease the save is fenced by (``Checkpointer.save``).
        attempts: save attempts in all (at least one).
        backoff: seconds before the second attempt; it doubles for each later one.
        release: give ``lease`` up in the save's own atomic write (a checkpointer built
            on ``BaseCheckpointer`` whose store has ``Capabilities.release_on_save``);
            a write that landed released it, one that did not left it held.
        ack: with ``release``, the claimed hand-off message the write also
            acknowledges (``Capabilities.ack_on_save``); a write that landed
            acknowledged it, one that did not left it claimed.

    Returns:
        The revision the snapshot is stored at.

    Raises:
        StorageUnavailableError: the last attempt failed too and the write is not
            stored.
    """
    if not snapshot.write_id:
        snapshot = replace(snapshot, write_id=new_write_id())
    last: StorageUnavailableError | None = None
    for attempt in range(max(attempts, 1)):
        if attempt:
            await asyncio.sleep(backoff * (2 ** (attempt - 1)))
            try:
                landed = await confirm_save(checkpointer, expected_revision, snapshot)
            except StorageUnavailableError as exc:
                last = exc
                continue
            if landed is not None:
                return landed
        try:
            if release and lease is not None:
                base = cast("BaseCheckpointer[S]", checkpointer)
                return await base.save_and_release(
                    expected_revision, snapshot, lease=lease, ack=ack
                )
            return await checkpointer.save(expected_revision, snapshot, lease=lease)
        except StorageUnavailableError as exc:
            last = exc
    assert last is not None
    # One more look: the last attempt may have landed.
    try:
        landed = await confirm_save(checkpointer, expected_revision, snapshot)
    except StorageUnavailableError:
        landed = None
    if landed is not None:
        return landed
    raise last
