"""The LLM agent example (examples/llm_agent, docs/llm-agent.md) against the local stub
model: a conversation with tool calls, its tokens streamed, and a process killed in the
middle of a conversation that, carried on by another process, bills no completion twice.
"""

from __future__ import annotations

import asyncio
import difflib
import importlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from redis.asyncio import Redis

import flowy
from examples.llm_agent import agent
from examples.llm_agent.chat import ChatModel, ModelError, assemble, events
from examples.llm_agent.stub import WEATHER_SCRIPT, Reply, StubModel
from flowy.storage import ActivityRecord, ActivityStatus, DurableCheckpointer
from flowy.testing.backends import backend_missing, port_open
from flowy_redis import purge_namespace

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[1]
POSTGRES_DSN = "postgresql://postgres@127.0.0.1:5432/test"
ANSWER = WEATHER_SCRIPT[-1].text
DEADLINE = 30.0


@pytest.fixture
def stub() -> Iterator[StubModel]:
    with StubModel(delay=0.002) as model:
        yield model


async def journal_of(backend: flowy.Backend[Any], thread_id: str) -> list[ActivityRecord]:
    return await cast(DurableCheckpointer[Any], backend.checkpointer).journal(thread_id)


def model_of(stub: StubModel) -> ChatModel:
    return ChatModel(stub.base_url, api_key="sk-test", model="stub-1")


# -- one process ---------------------------------------------------------------------


async def test_a_conversation_calls_tools_and_streams_the_answer(stub: StubModel) -> None:
    tokens: list[str] = []
    turns: list[int] = []
    async with flowy.connect("memory://") as backend:
        result = await agent.converse(
            backend,
            "trip-1",
            "What's the weather in Lisbon, and 20 EUR in USD?",
            model_of(stub),
            on_token=tokens.append,
            on_turn=lambda state: turns.append(state.turns),
        )
        journal = {e.key: e for e in await journal_of(backend, "trip-1")}

    assert result.status is flowy.RunStatus.COMPLETED and result.reason == "end"
    assert result.state.answer == ANSWER and result.state.turns == 3
    assert turns == [1, 2, 3]  # one NODE_COMPLETED event per turn, from the run's stream
    assert stub.calls == 3
    # The answer arrived a word at a time, as streamed; tool calls stream no text.
    assert len(tokens) == len(ANSWER.split(" ")) and "".join(tokens) == ANSWER

    # What the model was sent: the tools, then each tool's result under its call's id.
    first, second, third = stub.requests
    assert [t["function"]["name"] for t in first["tools"]] == ["get_weather", "convert_currency"]
    assert first["model"] == "stub-1" and first["stream"] is True
    assert [m["role"] for m in third["messages"]] == [
        *("system", "user", "assistant", "tool", "assistant", "tool"),
    ]
    call = second["messages"][2]["tool_calls"][0]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Lisbon"}'}
    assert second["messages"][3] == {
        "role": "tool",
        "tool_call_id": call["id"],
        "content": json.dumps({"city": "Lisbon", "celsius": 21, "sky": "sunny"}),
    }
    assert json.loads(third["messages"][5]["content"]) == {"amount": 21.6, "currency": "USD"}

    # The journal: each completion and each tool call once, under its key.
    assert sorted(journal) == sorted(
        ["model:2", "model:4", "model:6", f"tool:{call['id']}", f"tool:{tool_call_id(third)}"]
    )
    assert all(e.status is ActivityStatus.SUCCEEDED and e.attempts == 1 for e in journal.values())


def tool_call_id(request: dict[str, Any]) -> str:
    return request["messages"][4]["tool_calls"][0]["id"]


async def test_a_bad_tool_call_is_told_to_the_model_not_raised() -> None:
    script = (
        Reply(tool_calls=[("book_flight", {"to": "Lisbon"}), ("get_weather", {"town": "x"})]),
        Reply(text="I cannot do that."),
    )
    with StubModel(script, delay=0) as stub:
        async with flowy.connect("memory://") as backend:
            result = await agent.converse(backend, "t", "book it", model_of(stub))
    assert result.state.answer == "I cannot do that." and stub.calls == 2
    told = [m["content"] for m in stub.requests[1]["messages"] if m["role"] == "tool"]
    assert json.loads(told[0]) == {"error": "no tool named 'book_flight'"}
    assert "bad arguments for get_weather" in json.loads(told[1])["error"]


async def test_an_endpoint_that_refuses_fails_the_run_with_its_answer(stub: StubModel) -> None:
    wrong = ChatModel(stub.base_url.removesuffix("/v1") + "/v2", "sk-test", "stub-1")
    async with flowy.connect("memory://") as backend:
        result = await agent.converse(backend, "t", "hi", wrong)
        [entry] = await journal_of(backend, "t")
    assert result.status is flowy.RunStatus.FAILED
    assert entry.status is ActivityStatus.FAILED and "HTTP 404" in (entry.error or "")
    assert stub.calls == 0
    with pytest.raises(ModelError, match="must be http"):
        await ChatModel("ftp://x", "k", "m").reply([], [])


async def test_a_busy_endpoint_is_asked_again_without_failing_the_turn() -> None:
    with StubModel(busy=2, delay=0) as stub:
        model = ChatModel(stub.base_url, "sk-test", "stub-1", attempts=3)
        async with flowy.connect("memory://") as backend:
            result = await agent.converse(backend, "t", "weather?", model)
            journal = await journal_of(backend, "t")
    assert result.status is flowy.RunStatus.COMPLETED and result.state.answer == ANSWER
    assert stub.calls == 3 and stub.busy == 0  # two 503s, then three completions
    assert all(e.attempts == 1 for e in journal)  # retried inside one activity attempt

    with StubModel(busy=5, delay=0) as stub:
        model = ChatModel(stub.base_url, "sk-test", "stub-1", attempts=2)
        async with flowy.connect("memory://") as backend:
            result = await agent.converse(backend, "t", "weather?", model)
            [entry] = await journal_of(backend, "t")
    assert result.status is flowy.RunStatus.FAILED and stub.calls == 0 and stub.busy == 3
    assert entry.status is ActivityStatus.FAILED and "HTTP 503" in (entry.error or "")


def sse(*events: str) -> list[bytes]:
    """The lines of an event stream whose events are ``events`` (each maybe several lines)."""
    return [f"{line}\r\n".encode() for event in events for line in [*event.split("\n"), ""]]


def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
    return "data: " + json.dumps({"choices": [{"delta": delta, "finish_reason": finish}]})


def test_the_event_stream_parser_takes_what_servers_send() -> None:
    lines = sse(
        ": keep-alive",  # a comment
        "event: message\nid: 1\n" + chunk({"content": "Hel"}),
        'data: {"choices": [{"delta":\ndata: {"content": "lo"}}]}',  # one event, two lines
        chunk({"tool_calls": [{"index": 1, "id": "b", "function": {"name": "g"}}]}),
        chunk({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f"}}]}),
        chunk({"tool_calls": [{"index": 1, "function": {"arguments": '{"x":'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}),
        chunk({"tool_calls": [{"index": 1, "function": {"arguments": " 1}"}}]}),
        chunk({}, "tool_calls"),
        "data: [DONE]",
        chunk({"content": "after the end"}),
    )
    tokens: list[str] = []
    message = assemble(events(lines), tokens.append)
    assert tokens == ["Hel", "lo"] and message["content"] == "Hello"
    assert [(c["id"], c["function"]) for c in message["tool_calls"]] == [
        ("a", {"name": "f", "arguments": "{}"}),
        ("b", {"name": "g", "arguments": '{"x": 1}'}),
    ]


@pytest.mark.parametrize(
    ("lines", "error"),
    [
        (sse(chunk({"content": "cut"})), "ended before the reply did"),
        (sse(chunk({"content": "cut"}))[:-1], "ended in the middle of an event"),
        (sse("data: {not json"), "not JSON"),
        (sse('data: {"error": {"message": "overloaded"}}'), "sent an error"),
    ],
)
def test_a_stream_that_is_cut_or_garbled_is_an_error_not_a_reply(
    lines: list[bytes], error: str
) -> None:
    with pytest.raises(ModelError, match=error):
        assemble(events(lines), lambda text: None)


def test_the_command_says_what_is_wrong_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "OPENAI_BASE_URL": "http://127.0.0.1:9/v1", "OPENAI_API_KEY": "k"}
    command = [sys.executable, "-m", "examples.llm_agent.agent", "--thread", "t"]
    bad_url = subprocess.run(
        [*command, "--backend", "nope://x"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert bad_url.returncode == 2 and bad_url.stdout == "", bad_url
    assert bad_url.stderr.startswith("error: unknown store scheme 'nope'"), bad_url.stderr
    assert len(bad_url.stderr.splitlines()) == 1, bad_url.stderr
    # Nothing answers on the endpoint: the run fails, and says why.
    url = f"sqlite:///{tmp_path / 'chats.db'}"
    down = subprocess.run(
        [*command, "--backend", url], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert down.returncode == 1 and "Traceback" not in down.stderr, down
    assert "t: failed after 0 turn(s)" in down.stdout, down.stdout
    assert "is unreachable" in down.stderr and len(down.stderr.splitlines()) == 1, down.stderr


def test_the_model_never_shows_its_key() -> None:
    assert "sk-secret" not in repr(ChatModel("http://x/v1", "sk-secret", "m"))


# -- a process killed mid-conversation ---------------------------------------------------

STUCK_AGENT = """
import asyncio, dataclasses, sys
from examples.llm_agent import agent

async def stuck(**arguments):
    print("\\nconvert_currency started", flush=True)
    await asyncio.sleep(3600)  # until SIGKILL

tools = agent.default_tools()
tools = tools.with_tool(dataclasses.replace(tools.tools["convert_currency"], fn=stuck))
agent.main(sys.argv[1:], tools)
"""


@pytest.fixture(params=["sqlite", "postgresql", "redis", "dynamodb"])
async def store_url(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[str]:
    """A fresh store every process can open."""
    kind = request.param
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path / 'chats.db'}"
    elif kind == "postgresql":
        if not port_open("127.0.0.1", 5432):
            backend_missing("PostgreSQL is not on 127.0.0.1:5432")
        schema = f"chats_{uuid.uuid4().hex[:12]}"
        yield f"{POSTGRES_DSN}?schema={schema}"
        conn: Any = await __import__("asyncpg").connect(POSTGRES_DSN)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()
    elif kind == "redis":
        if not port_open("127.0.0.1", 6379):
            backend_missing("Redis is not on 127.0.0.1:6379")
        namespace = f"chats-{uuid.uuid4().hex[:12]}"
        yield f"redis://127.0.0.1:6379/0?namespace={namespace}"
        client = Redis(host="127.0.0.1", port=6379)
        try:
            await purge_namespace(client, namespace)
        finally:
            await client.aclose()
    else:
        moto_server: Any = importlib.import_module("moto_server")  # flowy-dynamodb's tests
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")  # moto takes any credentials
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        server = moto_server.SerializedMotoServer()
        endpoint = server.start()
        try:
            yield f"dynamodb://chats?region=us-east-1&endpoint_url={endpoint}"
        finally:
            server.stop()


def agent_command(code: str | None, url: str, thread: str, lease_ttl: float) -> list[str]:
    runner = ["-c", code] if code else ["-m", "examples.llm_agent.agent"]
    options = ("--backend", url, "--thread", thread, "--lease-ttl", str(lease_ttl))
    return [sys.executable, *runner, *options]


def agent_env(stub: StubModel) -> dict[str, str]:
    return {**os.environ, "OPENAI_BASE_URL": stub.base_url, "OPENAI_API_KEY": "sk-test"}


async def kill_when(
    code: str | None, url: str, thread: str, stub: StubModel, printed: str, tmp_path: Path
) -> None:
    """Run the agent (``code``, else the module) until it prints ``printed``: SIGKILL."""
    log = tmp_path / "killed.log"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            *agent_command(code, url, thread, lease_ttl=3),  # soon taken over
            cwd=ROOT,
            env=agent_env(stub),
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + DEADLINE
        while printed not in log.read_text():
            assert proc.returncode is None, log.read_text()
            assert time.monotonic() < deadline, f"never printed {printed!r}:\n{log.read_text()}"
            await asyncio.sleep(0.05)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGKILL)
        await proc.wait()
    assert proc.returncode == -signal.SIGKILL


async def carry_on(url: str, thread: str, stub: StubModel) -> str:
    """The agent's command for ``thread`` again, in a new process, to its end: its output."""
    proc = await asyncio.create_subprocess_exec(
        *agent_command(None, url, thread, lease_ttl=30),
        cwd=ROOT,
        env=agent_env(stub),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), DEADLINE)
    output = out.decode()
    assert proc.returncode == 0, output
    assert f"{thread}: completed after 3 turn(s)" in output, output
    return output


async def test_a_conversation_killed_mid_turn_is_carried_on_without_billing_again(
    stub: StubModel, store_url: str, tmp_path: Path
) -> None:
    thread = "trip-crash"
    # 1. A process asks; in turn 2, after the model's reply, its tool call hangs: SIGKILL.
    await kill_when(STUCK_AGENT, store_url, thread, stub, "convert_currency started", tmp_path)
    assert stub.calls == 2  # turn 1's completion and turn 2's, both billed once

    async with flowy.connect(store_url) as backend:
        runner = flowy.Runner(agent.graph, backend)
        snapshot, _ = await runner.head(thread)
        assert snapshot.status is flowy.RunStatus.RUNNING and snapshot.state.turns == 1
        journal = {e.key: e.status for e in await journal_of(backend, thread)}
    # Turn 2's reply is in the journal though its step was never saved; its tool started.
    assert journal["model:4"] is ActivityStatus.SUCCEEDED
    [stuck] = [k for k, s in journal.items() if s is ActivityStatus.STARTED]

    # 2. Another process carries the conversation on (once the dead one's lease is out).
    output = await carry_on(store_url, thread, stub)
    assert ANSWER in output, output

    # Three completions in all: turn 2 ran again from the journal's copy of its reply.
    assert stub.calls == 3, [len(r["messages"]) for r in stub.requests]
    assert [len(r["messages"]) for r in stub.requests] == [2, 4, 6]
    async with flowy.connect(store_url) as backend:
        entries = {e.key: e for e in await journal_of(backend, thread)}
        snapshot, _ = await flowy.Runner(agent.graph, backend).head(thread)
    assert snapshot.status is flowy.RunStatus.COMPLETED and snapshot.state.answer == ANSWER
    assert all(e.status is ActivityStatus.SUCCEEDED for e in entries.values())
    assert {k: e.attempts for k, e in entries.items() if k.startswith("model:")} == {
        "model:2": 1,
        "model:4": 1,
        "model:6": 1,
    }
    assert entries[stuck].attempts == 2  # the hung tool (idempotent) was called again


# -- the page is the example ---------------------------------------------------------------

PAGE = ROOT / "docs" / "llm-agent.md"
EXAMPLE = ROOT / "examples" / "llm_agent"
SECTION_OR_BLOCK = re.compile(r"^(##[^#\n][^\n]*)$|^```(\w*)\n(.*?)^```$", re.M | re.S)
MODULE_IN_HEADING = re.compile(r"examples/llm_agent/(\w+\.py)")
# What a module of a package needs but a page run as one script cannot have: imports of
# a sibling module and the __main__ guard. The page names them in its text instead.
PACKAGE_ONLY = re.compile(
    r'^from \.\w+ import [^\n]*\n|^if __name__ == "__main__":\n    \w+\(\)\n', re.M
)


def shown_modules() -> dict[str, str]:
    """The page's python blocks, joined by the module the heading of their section names."""
    modules: dict[str, list[str]] = {}
    current: str | None = None
    for match in SECTION_OR_BLOCK.finditer(PAGE.read_text()):
        heading, lang, body = match.groups()
        if heading is not None:
            named = MODULE_IN_HEADING.search(heading)
            current = named.group(1) if named else None
        elif lang == "python" and current is not None:
            modules.setdefault(current, []).append(body.strip("\n"))
    return {name: "\n\n\n".join(blocks) for name, blocks in modules.items()}


def normalised(code: str) -> str:
    return re.sub(r"\n{3,}", "\n\n\n", code.strip("\n")) + "\n"


def test_the_page_shows_every_module_of_the_example_line_for_line() -> None:
    shown = shown_modules()
    on_disk = sorted(p.name for p in EXAMPLE.glob("*.py") if p.name != "__init__.py")
    assert sorted(shown) == on_disk
    text = " ".join(PAGE.read_text().split())
    for name in on_disk:
        source = (EXAMPLE / name).read_text()
        for line in PACKAGE_ONLY.findall(source):
            assert f"`{' '.join(line.split())}`" in text, f"{name}: name {line.strip()!r}"
        diff = "".join(
            difflib.unified_diff(
                normalised(PACKAGE_ONLY.sub("", source)).splitlines(keepends=True),
                normalised(shown[name]).splitlines(keepends=True),
                f"examples/llm_agent/{name}",
                f"docs/llm-agent.md ({name})",
            )
        )
        assert not diff, f"the page and the example differ (edit both):\n{diff}"


async def test_a_reply_cut_off_by_a_crash_is_asked_for_again_and_only_that_one(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'chats.db'}"
    thread = "trip-cut"
    # The answer (third completion) stalls after a few words; the process dies meanwhile.
    with StubModel(delay=0.002, stall=2) as stub:
        await kill_when(None, url, thread, stub, "It is 21", tmp_path)
        assert stub.calls == 3
        output = await carry_on(url, thread, stub)
        positions = [len(r["messages"]) for r in stub.requests]
    assert output.count(ANSWER) == 1, output  # streamed again, whole, by the new process
    # Billed: the two tool-call completions once, the answer twice (it was cut off).
    assert positions == [2, 4, 6, 6], positions
    async with flowy.connect(url) as backend:
        entries = {e.key: e for e in await journal_of(backend, thread)}
    assert {k: e.attempts for k, e in entries.items() if k.startswith("model:")} == {
        "model:2": 1,
        "model:4": 1,
        "model:6": 2,
    }
    assert all(e.status is ActivityStatus.SUCCEEDED for e in entries.values())
