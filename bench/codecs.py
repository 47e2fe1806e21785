"""State codecs: the time to encode and then decode a state of about 1 KiB, the same
agent state (a task, a list of chat messages, a few flags) as a dataclass with the JSON
codec (``JSONCodec``), a ``msgspec.Struct`` with ``MsgspecCodec`` and a pydantic
``BaseModel`` with ``PydanticCodec``; and the same state as a plain dict with the JSON
codec, the baseline. Interleaved rounds in one process; shown for information (no
budget): the codec is the application's choice.

    uv run --frozen --all-packages python bench/codecs.py [--quick]
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import _common as c
import msgspec
import pydantic

from flowy.storage import JSONCodec, MsgspecCodec, PydanticCodec

MESSAGES = 8
"""Chat messages in the state: with the rest, about 1 KiB of JSON."""


@dataclasses.dataclass
class Message:
    role: str
    content: str


@dataclasses.dataclass
class AgentState:
    task: str
    messages: list[Message]
    approved: bool = False
    attempts: int = 0


class MessageStruct(msgspec.Struct):
    role: str
    content: str


class AgentStruct(msgspec.Struct):
    task: str
    messages: list[MessageStruct]
    approved: bool = False
    attempts: int = 0


class MessageModel(pydantic.BaseModel):
    role: str
    content: str


class AgentModel(pydantic.BaseModel):
    task: str
    messages: list[MessageModel]
    approved: bool = False
    attempts: int = 0


def _plain() -> dict[str, Any]:
    return {
        "task": "refund order 1234 if the customer is eligible",
        "messages": [
            {"role": "user" if i % 2 else "assistant", "content": f"message {i}: " + "x" * 100}
            for i in range(MESSAGES)
        ],
        "approved": False,
        "attempts": 1,
    }


def variants() -> dict[str, tuple[Any, Any]]:
    """Each variant's codec and state."""
    plain = _plain()
    messages = plain["messages"]
    return {
        "dict (JSON)": (JSONCodec(), plain),
        "dataclass (JSON)": (
            JSONCodec(AgentState),
            AgentState(plain["task"], [Message(**m) for m in messages], False, 1),
        ),
        "msgspec Struct": (
            MsgspecCodec(AgentStruct),
            AgentStruct(plain["task"], [MessageStruct(**m) for m in messages], False, 1),
        ),
        "pydantic model": (
            PydanticCodec(AgentModel),
            AgentModel(task=plain["task"], messages=[MessageModel(**m) for m in messages]),
        ),
    }


def measure(rounds: int, per: int) -> tuple[dict[str, list[float]], dict[str, int]]:
    """Seconds per encode+decode of each variant's state, by rounds (rotating order)."""
    chosen = variants()
    sizes = {name: len(codec.encode(state)) for name, (codec, state) in chosen.items()}
    for name, (codec, state) in chosen.items():
        assert codec.decode(codec.encode(state)) == state, name  # a real round trip
    samples: dict[str, list[float]] = {name: [] for name in chosen}
    names = list(chosen)
    for r in range(rounds + 2):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            codec, state = chosen[name]
            started = time.perf_counter()
            for _ in range(per):
                codec.decode(codec.encode(state))
            if r >= 2:  # warm-up rounds dropped
                samples[name].append((time.perf_counter() - started) / per)
    return samples, sizes


def main() -> None:
    args = c.arguments(__doc__ or "")
    samples, sizes = measure(5 if args.quick else 31, 200 if args.quick else 2_000)
    medians = {name: c.median(values) for name, values in samples.items()}
    base = medians["dict (JSON)"]
    rows = []
    for name, value in medians.items():
        print(f"{name:18} {sizes[name]:5} bytes  encode+decode {value * 1e6:7.1f} µs")
        key = "codec." + name.split()[0].lower()
        rows.append(
            c.info(
                key,
                f"encode+decode of a ~1 KiB state: {name} (vs a dict with the JSON codec)",
                value,
                base,
                bytes=float(sizes[name]),
            )
        )
    c.report(rows, args)


if __name__ == "__main__":
    main()
