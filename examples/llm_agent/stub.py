"""A stand-in for a model: a local chat-completions server that plays a script.

It speaks the part of the OpenAI chat-completions protocol the agent uses — ``POST
/v1/chat/completions`` with ``"stream": true``, answered with server-sent events, text
and tool calls in pieces — so the agent runs with no network and no key. It counts the
completions it serves (``calls``): what a real endpoint would bill.

Which reply it sends depends only on where the conversation is (how many assistant
messages the request already holds), as a deterministic model would; tool call ids are
random, as a real model's are, so a call made twice would not look the same.

    python3 -m examples.llm_agent.stub --port 8001
"""

import argparse
import json
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, cast


@dataclass(frozen=True)
class Reply:
    """One scripted completion: some text, or some tool calls ``(name, arguments)``."""

    text: str = ""
    tool_calls: Sequence[tuple[str, dict[str, Any]]] = ()


WEATHER_SCRIPT = (
    Reply(tool_calls=[("get_weather", {"city": "Lisbon"})]),
    Reply(tool_calls=[("convert_currency", {"amount": 20, "source": "EUR", "target": "USD"})]),
    Reply(text="It is 21 °C and sunny in Lisbon, and 20 EUR is 21.60 USD. Enjoy the trip!"),
)
"""Three completions: a tool call, another one, then the answer."""


@dataclass
class StubModel:
    """The server, on 127.0.0.1 and a free port, in a thread of this process.

    ``with StubModel() as stub:`` serves until the block ends; ``stub.base_url`` is what
    the agent is given. ``delay`` is the pause between two streamed pieces; the first
    ``busy`` requests are answered HTTP 503 (and not billed). The first reply at position
    ``stall`` (billed) stops after a few pieces, as if the model hung, until the server
    stops.
    """

    script: Sequence[Reply] = WEATHER_SCRIPT
    port: int = 0
    delay: float = 0.01
    busy: int = 0
    stall: int | None = None
    calls: int = 0
    """Completions served (billed)."""
    requests: list[dict[str, Any]] = field(default_factory=lambda: [])
    """The body of every request, in order."""

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self.stopping = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), _handler(self))
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> "StubModel":
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stopping.set()
        self._server.shutdown()
        self._server.server_close()

    def bill(self, body: dict[str, Any]) -> tuple[Reply | None, bool]:
        """Count the completion and pick its reply (``None``: busy, try again), and
        whether to stall in the middle of it."""
        position = sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")
        with self._lock:
            if self.busy > 0:
                self.busy -= 1
                return None, False
            self.calls += 1
            self.requests.append(body)
            stall = position == self.stall
            if stall:
                self.stall = None  # once
        return self.script[min(position, len(self.script) - 1)], stall


def chunks(reply: Reply, model: str) -> list[dict[str, Any]]:
    """The completion chunks of ``reply``, as an OpenAI-compatible server streams them."""
    head = {"id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion.chunk"}
    head |= {"created": int(time.time()), "model": model}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return head | {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    out = [chunk({"role": "assistant", "content": ""})]
    words = reply.text.split(" ")
    out += [chunk({"content": w if i == 0 else " " + w}) for i, w in enumerate(words) if reply.text]
    for index, (name, arguments) in enumerate(reply.tool_calls):
        call_id = f"call_{uuid.uuid4().hex[:16]}"
        first = {"index": index, "id": call_id, "type": "function"}
        out.append(chunk({"tool_calls": [first | {"function": {"name": name, "arguments": ""}}]}))
        text = json.dumps(arguments)
        for start in range(0, len(text), 8):  # the arguments arrive in pieces too
            piece = {"index": index, "function": {"arguments": text[start : start + 8]}}
            out.append(chunk({"tool_calls": [piece]}))
    out.append(chunk({}, "tool_calls" if reply.tool_calls else "stop"))
    return out


def _handler(stub: StubModel) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def do_POST(self) -> None:
            if self.path.rstrip("/") != "/v1/chat/completions":
                self._error(404, f"no such endpoint: {self.path}")
                return
            if not self.headers.get("Authorization", "").startswith("Bearer "):
                self._error(401, "missing API key")
                return
            try:
                body: Any = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            except ValueError:
                body = None
            if not isinstance(body, dict) or cast(dict[str, Any], body).get("stream") is not True:
                self._error(400, "send a JSON body with stream: true")
                return
            body = cast(dict[str, Any], body)
            reply, stall = stub.bill(body)
            if reply is None:
                self._error(503, "the model is overloaded: try again")
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            try:
                for i, piece in enumerate(chunks(reply, str(body.get("model", "stub")))):
                    if stall and i == 4:
                        stub.stopping.wait()
                        return
                    self.wfile.write(f"data: {json.dumps(piece)}\n\n".encode())
                    self.wfile.flush()
                    time.sleep(stub.delay)
                self.wfile.write(b"data: [DONE]\n\n")
            except (BrokenPipeError, ConnectionResetError):  # the client went away
                return

        def _error(self, code: int, message: str) -> None:
            data = json.dumps({"error": {"message": message}}).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python3 -m examples.llm_agent.stub")
    parser.add_argument("--port", type=int, default=8001)
    args = parser.parse_args(argv)
    with StubModel(port=args.port, delay=0.05) as stub:
        print(f"a stub model on {stub.base_url}: Ctrl-C stops it", flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            print(f"served {stub.calls} completion(s)")


if __name__ == "__main__":
    main()
