"""What the flowy-langgraph tests share: the stores they run on, and checkpoints made
by hand."""

from __future__ import annotations

from typing import Any

from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.base.id import uuid6

from flowy_langgraph import FlowySaver

STORES = ("memory", "sqlite", "postgres", "redis", "dynamodb")
"""Every store flowy ships, as the ``store_url`` fixture takes them."""


def config(thread: str, checkpoint_id: str | None = None, ns: str = "") -> Any:
    configurable: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ns}
    if checkpoint_id:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


def checkpoint(step: int) -> Any:
    made: Any = empty_checkpoint()
    return {**made, "id": str(uuid6(clock_seq=step)), "channel_values": {"n": step}}


async def chain(saver: FlowySaver, thread: str, n: int, *, writes: bool = False) -> list[str]:
    ids: list[str] = []
    parent: str | None = None
    for step in range(n):
        stored = await saver.aput(config(thread, parent), checkpoint(step), {"step": step}, {})
        if writes:
            await saver.aput_writes(stored, [("ch", step), ("other", "x")], f"task-{step}")
        parent = stored["configurable"]["checkpoint_id"]
        ids.append(parent)
    return ids
