"""The agent: a tool-calling loop over a chat model, one durable step per turn.

    turn -> turn -> ... -> (the model answers without a tool call) end

A turn asks the model for its next message, then runs the tools it called. Both are
activities: the model's reply is recorded in the thread's journal under
``model:<position>`` and each tool's result under ``tool:<call id>``, so when a turn runs
again — its process was killed, the machine rebooted — the model is not asked (nor
billed) again for a reply it already gave, and no tool runs again once its result is
recorded.

    python3 -m examples.llm_agent.agent --thread trip-1 "What's the weather in Lisbon?"
"""

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import flowy

from .chat import ChatModel, Message, OnToken

SYSTEM = "You are a travel assistant. Use the tools for facts; answer in one short paragraph."
MAX_TURNS = 8
FINISHED = (flowy.RunStatus.COMPLETED, flowy.RunStatus.FAILED)


@dataclass
class Conversation:
    """The thread's state: the messages so far and, once the model has answered, the answer."""

    messages: list[dict[str, Any]]
    turns: int = 0
    answer: str = ""


@dataclass(frozen=True)
class Tool:
    """A function the model may call: its name, what it does and its JSON-schema parameters.

    ``idempotent``: calling it twice is harmless (it reads, or the service it calls
    dedupes). A tool that is not, and whose call's outcome was lost in a crash, is not
    called again: the model is told the outcome is unknown.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Awaitable[Any]]
    idempotent: bool = True

    def schema(self) -> dict[str, Any]:
        function = {"name": self.name, "description": self.description}
        return {"type": "function", "function": function | {"parameters": self.parameters}}


@dataclass(frozen=True)
class Toolbox:
    tools: dict[str, Tool] = field(default_factory=lambda: {})

    def with_tool(self, tool: Tool) -> "Toolbox":
        return Toolbox({**self.tools, tool.name: tool})

    def schemas(self) -> list[dict[str, Any]]:
        return [tool.schema() for tool in self.tools.values()]


async def get_weather(city: str) -> dict[str, Any]:
    forecast = {"lisbon": (21, "sunny"), "oslo": (-3, "snow"), "lima": (18, "cloudy")}
    celsius, sky = forecast.get(city.lower(), (15, "unknown"))
    return {"city": city, "celsius": celsius, "sky": sky}


async def convert_currency(amount: float, source: str, target: str) -> dict[str, Any]:
    per_euro = {"EUR": 1.0, "USD": 1.08, "GBP": 0.86, "JPY": 162.0}
    if source not in per_euro or target not in per_euro:
        return {"error": f"unknown currency: pick from {sorted(per_euro)}"}
    return {"amount": round(amount / per_euro[source] * per_euro[target], 2), "currency": target}


def default_tools() -> Toolbox:
    text = {"type": "string"}
    return (
        Toolbox()
        .with_tool(
            Tool(
                "get_weather",
                "Today's weather in a city.",
                {"type": "object", "properties": {"city": text}, "required": ["city"]},
                get_weather,
            )
        )
        .with_tool(
            Tool(
                "convert_currency",
                "Convert an amount of money between currencies (ISO codes).",
                {
                    "type": "object",
                    "properties": {"amount": {"type": "number"}, "source": text, "target": text},
                    "required": ["amount", "source", "target"],
                },
                convert_currency,
            )
        )
    )


MODEL = flowy.BindingKey[ChatModel]("model")
TOOLS = flowy.BindingKey[Toolbox]("tools")
TOKENS = flowy.BindingKey[OnToken]("tokens")
Step = tuple[Conversation, flowy.Directive[flowy.NoEffect]]


def token_sink() -> OnToken | None:
    """Where this run's tokens go as the model streams them: the ``TOKENS`` binding, if
    the caller gave one. Tokens are never saved; a turn whose reply is in the journal
    streams nothing when it runs again (the reply is already in the state's messages)."""
    bindings = flowy.run_metadata().bindings
    return bindings.get(TOKENS) if TOKENS in bindings else None


async def call_tool(tools: Toolbox, call: dict[str, Any]) -> str:
    """Run one tool call; what the model is told (JSON), errors included."""
    name = call["function"]["name"]
    tool = tools.tools.get(name)
    if tool is None:
        return json.dumps({"error": f"no tool named {name!r}"})
    try:
        arguments = json.loads(call["function"]["arguments"] or "{}")
        result = await tool.fn(**arguments)
    except (ValueError, TypeError) as exc:  # arguments that are not JSON, or do not fit
        return json.dumps({"error": f"bad arguments for {name}: {exc}"})
    return json.dumps(result)


async def turn(state: Conversation) -> Step:
    model, tools = flowy.binding(MODEL), flowy.binding(TOOLS)
    position = len(state.messages)  # names this turn's model call, the same on every re-run
    reply: Message = await flowy.activity(
        model.reply,
        state.messages,
        tools.schemas(),
        token_sink(),
        key=f"model:{position}",
        idempotent=True,  # a completion cut off by a crash was never seen: ask again
    )
    messages = [*state.messages, reply]
    for call in reply.get("tool_calls", []):
        tool = tools.tools.get(call["function"]["name"])
        try:
            result = await flowy.activity(
                call_tool,
                tools,
                call,
                key=f"tool:{call['id']}",
                idempotent=tool is None or tool.idempotent,
            )
        except flowy.errors.ActivityOutcomeUnknownError:
            result = json.dumps({"error": "the call was interrupted; its outcome is unknown"})
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    state = replace(state, messages=messages, turns=state.turns + 1)
    if "tool_calls" in reply:
        return state, flowy.completed()  # the model reads the results in the next turn
    return replace(state, answer=reply.get("content") or ""), flowy.end()


builder = flowy.GraphBuilder[Conversation, flowy.NoEffect]()
builder.add_node("turn", turn).add_edge("turn", "turn")
graph = builder.compile(max_steps=MAX_TURNS)


def new_conversation(question: str) -> Conversation:
    return Conversation(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    )


async def converse(
    backend: flowy.Backend[Conversation],
    thread_id: str,
    question: str,
    model: ChatModel,
    *,
    tools: Toolbox | None = None,
    on_token: OnToken | None = None,
    on_turn: Callable[[Conversation], None] | None = None,
    lease_ttl: float = 30.0,
) -> flowy.RunResult[Conversation, flowy.NoEffect]:
    """Ask ``question`` in a new thread, or carry on ``thread_id`` where it stopped (a
    finished thread is not run again: its result is its last snapshot).

    A thread whose last process died is taken over once that process's lease runs out
    (``lease_ttl`` seconds at most). ``on_turn`` sees the state after each turn, from the
    run's event stream.
    """
    runner = flowy.Runner(graph, backend, run_lease=(f"agent-{os.getpid()}", lease_ttl))
    bindings = flowy.bind(flowy.RunBindings(), MODEL, model)
    flowy.bind(bindings, TOOLS, tools or default_tools())
    if on_token is not None:
        flowy.bind(bindings, TOKENS, on_token)
    deadline = asyncio.get_running_loop().time() + lease_ttl + 10
    while True:
        try:
            head = await runner.head(thread_id)
        except flowy.ThreadNotFoundError:
            head = None
        if head is not None and head[0].status in FINISHED:  # nothing to run: say how it ended
            done = head[0]
            return flowy.RunResult(
                thread_id, done.state, done.status, done.reason, done.execution_pointer
            )
        try:
            if head is None:
                start = runner.stream(thread_id, new_conversation(question), bindings=bindings)
            else:
                start = runner.resume_stream(head[1], bindings=bindings)
            async with start as handle:
                async for event in handle:
                    if event.type is flowy.EventType.NODE_COMPLETED and on_turn is not None:
                        assert event.state is not None
                        on_turn(event.state)
                return await handle.wait_result()
        except flowy.ThreadLeaseBusyError:  # a crashed process's lease: wait it out
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.25)


def print_turn(state: Conversation) -> None:
    for message in reversed(state.messages):
        if message["role"] != "tool":
            break
        print(f"\n  [tool {message['tool_call_id']}] {message['content']}", flush=True)


async def run(args: argparse.Namespace, tools: Toolbox | None = None) -> int:
    model = ChatModel.from_env(args.base_url, None, args.model)
    try:
        backend = await flowy.connect(args.backend)
    except (flowy.BackendURLError, flowy.StorageError) as exc:  # a bad URL, a store down
        print(f"error: {exc}", file=sys.stderr)
        return 2
    async with backend:
        result = await converse(
            backend,
            args.thread,
            args.question,
            model,
            tools=tools,
            on_token=lambda text: print(text, end="", flush=True),
            on_turn=print_turn,
            lease_ttl=args.lease_ttl,
        )
    print(f"\n{args.thread}: {result.status} after {result.state.turns} turn(s)", flush=True)
    if result.status is flowy.RunStatus.COMPLETED:
        return 0
    cause = f": {result.error}" if result.error is not None else ""
    print(f"error: {args.thread} {result.status} ({result.reason}){cause}", file=sys.stderr)
    return 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python3 -m examples.llm_agent.agent")
    parser.add_argument("question", nargs="?", default="What's the weather in Lisbon?")
    parser.add_argument("--thread", required=True, help="the conversation's id; again to resume")
    parser.add_argument(
        "--backend",
        default=os.environ.get("APP_BACKEND", "sqlite:///chats.db"),
        help="store URL ($APP_BACKEND)",
    )
    parser.add_argument(
        "--base-url", default=None, help="$OPENAI_BASE_URL (the key: $OPENAI_API_KEY)"
    )
    parser.add_argument("--model", default=None, help="$OPENAI_MODEL")
    parser.add_argument("--lease-ttl", type=float, default=30.0, help="seconds (default 30)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, tools: Toolbox | None = None) -> None:
    raise SystemExit(asyncio.run(run(parse_args(argv), tools)))


if __name__ == "__main__":
    main()
