"""A fork: a new thread whose first revision is a copy of a past revision of another
(``Runner.fork``); the parent is never touched."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ._errors import ThreadNotFoundError, UnknownNodeError
from ._preflight import RunPreparation, StateMerge
from ._types import E, ResumeToken, S
from .storage import HandoffStatus, RunStatus
from .storage.dialect import new_write_id

__all__ = ["fork_revision"]


async def fork_revision(
    prep: RunPreparation[S, E],
    thread_id: str,
    at_revision: int,
    new_thread_id: str,
    state_overlay: S | Mapping[str, Any] | None,
    merge: StateMerge[S] | None,
    resume_at: str | None,
) -> ResumeToken:
    """Save revision ``at_revision`` of ``thread_id`` (brought to ``prep``'s graph
    version, with ``state_overlay`` merged in) as the first, suspended revision of
    ``new_thread_id``, with its lineage; return the fork's token."""
    cp = prep.require_checkpointer("fork")
    _, head = await cp.load(thread_id)
    found = [
        snap
        for snap in await cp.get_history(thread_id, max(head - at_revision + 1, 1))
        if snap.revision == at_revision
    ]
    if not found:
        raise ThreadNotFoundError(
            f"revision {at_revision} of thread {thread_id!r:.200} is not in its history "
            f"(the head is revision {head}; older revisions may have been pruned)"
        )
    source = await prep.migrated(found[0])
    state = source.state
    if state_overlay is not None:
        state = prep.overlay(state, state_overlay, merge)
    pointer = resume_at or source.execution_pointer
    if not prep.graph.has_node(pointer):
        raise UnknownNodeError(
            f"the fork cannot resume at {pointer!r}: not a node of this graph "
            f"(known: {sorted(prep.graph.nodes)})"
        )
    fork = replace(
        source,
        thread_id=new_thread_id,
        state=state,
        execution_pointer=pointer,
        status=RunStatus.SUSPENDED,
        reason="forked",
        revision=0,
        step_count=0,
        handoff_status=HandoffStatus.NONE,
        handoff_pending_at=None,
        updated_at=prep.clock(),
        write_id=new_write_id(),
        wake_at=None,
        waiting_for="",
        on_timeout="",
        signal_cursors={},
        graph_version=prep.graph.version,
        parent_thread_id=thread_id,
        parent_revision=at_revision,
    )
    revision = await cp.save(0, fork)
    return ResumeToken(new_thread_id, revision)
