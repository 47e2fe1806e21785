"""A client for any OpenAI-compatible chat-completions endpoint, with streaming.

Standard library only: ``http.client`` posts the request with ``"stream": true`` and the
answer comes back as server-sent events, one ``data: {json}`` line per chunk, ending with
``data: [DONE]``. Each chunk carries a *delta*: a piece of the reply's text, or pieces of
its tool calls (the first piece of a call has its ``id`` and function ``name``, the next
ones more of its JSON ``arguments``, all under the call's ``index``). ``ChatModel.reply``
adds the pieces up into one assistant message, and hands each piece of text to
``on_token`` as it arrives.
"""

import asyncio
import http.client
import json
import os
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

Message = dict[str, Any]  # {"role": ..., "content": ..., "tool_calls"?: [...], ...}
OnToken = Callable[[str], None]


class ModelError(Exception):
    """The endpoint refused the request or sent something that is not a chat completion."""


class EndpointBusyError(ModelError):
    """No answer yet: the endpoint is unreachable, or busy (HTTP 429 or 5xx)."""


@dataclass(frozen=True)
class ChatModel:
    """An OpenAI-compatible endpoint: ``{base_url}/chat/completions``.

    ``from_env()`` reads ``OPENAI_BASE_URL`` (default ``https://api.openai.com/v1``),
    ``OPENAI_API_KEY`` and ``OPENAI_MODEL``. The key never reaches the store: the model
    is given to runs as a binding, which flowy never saves.
    """

    base_url: str
    api_key: str
    model: str
    timeout: float = 120.0
    attempts: int = 3
    """Tries of one reply while the endpoint is busy, a second apart, then two, ...; a reply
    that has begun to stream is never asked for again here."""

    @classmethod
    def from_env(
        cls, base_url: str | None = None, api_key: str | None = None, model: str | None = None
    ) -> "ChatModel":
        return cls(
            base_url=base_url or os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1"),
            api_key=api_key or os.environ.get("OPENAI_API_KEY", ""),
            model=model or os.environ.get("OPENAI_MODEL", "gpt-4o-mini"),
        )

    def __repr__(self) -> str:  # never print the key
        return f"ChatModel(base_url={self.base_url!r}, model={self.model!r})"

    async def reply(
        self, messages: list[Message], tools: list[dict[str, Any]], on_token: OnToken | None = None
    ) -> Message:
        """The assistant's next message for ``messages``, streamed.

        ``on_token`` is called with each piece of text as it arrives, on the event loop's
        thread (the HTTP call itself runs in a worker thread).
        """
        loop = asyncio.get_running_loop()

        def forward(text: str) -> None:
            if on_token is not None:
                loop.call_soon_threadsafe(on_token, text)

        for attempt in range(1, self.attempts):
            try:
                return await asyncio.to_thread(self._reply, messages, tools, forward)
            except EndpointBusyError:
                await asyncio.sleep(2 ** (attempt - 1))
        return await asyncio.to_thread(self._reply, messages, tools, forward)

    def _reply(
        self, messages: list[Message], tools: list[dict[str, Any]], on_token: OnToken
    ) -> Message:
        url = urllib.parse.urlsplit(self.base_url.rstrip("/") + "/chat/completions")
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ModelError(f"the base URL must be http(s)://host/..., got {self.base_url!r}")
        connection_type = (
            http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
        )
        conn = connection_type(url.hostname, url.port, timeout=self.timeout)
        body: dict[str, Any] = {"model": self.model, "messages": messages, "stream": True}
        if tools:
            body["tools"] = tools
        try:
            try:
                conn.request(
                    "POST",
                    url.path,
                    body=json.dumps(body),
                    headers={
                        "Authorization": f"Bearer {self.api_key}",
                        "Content-Type": "application/json",
                        "Accept": "text/event-stream",
                    },
                )
                response = conn.getresponse()
            except OSError as exc:  # refused, reset, timed out: nothing was streamed
                raise EndpointBusyError(f"{self.base_url} is unreachable: {exc}") from exc
            if response.status != 200:
                detail = response.read(500).decode(errors="replace")
                busy = response.status == 429 or response.status >= 500
                error = EndpointBusyError if busy else ModelError
                raise error(f"{self.base_url} answered HTTP {response.status}: {detail}")
            return assemble(events(response), on_token)
        finally:
            conn.close()


def events(lines: Iterable[bytes]) -> Iterator[dict[str, Any]]:
    """The JSON payloads of a server-sent-events stream (the lines of an HTTP response
    body), up to ``data: [DONE]``.

    An event is one or more ``data:`` lines ended by a blank line; other fields
    (``event:``, ``id:``, comments starting with ``:``) carry nothing we need.
    """
    data: list[str] = []
    for raw in lines:
        line = raw.decode().rstrip("\r\n")
        if line:
            if line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
            continue
        if not data:
            continue
        payload, data = "\n".join(data), []
        if payload == "[DONE]":
            return
        try:
            yield json.loads(payload)
        except ValueError:
            raise ModelError(
                f"the stream sent an event that is not JSON: {payload[:200]!r}"
            ) from None
    if data and "\n".join(data) != "[DONE]":
        raise ModelError("the stream ended in the middle of an event")


def assemble(chunks: Iterator[dict[str, Any]], on_token: OnToken) -> Message:
    """Add the deltas of a streamed completion up into one assistant message; a stream
    that ends before the reply says it is finished (``finish_reason``) is an error, never
    a shorter reply."""
    text: list[str] = []
    finished = False
    calls: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        if "error" in chunk:
            raise ModelError(f"the endpoint sent an error: {chunk['error']}")
        choices: list[dict[str, Any]] = chunk.get("choices") or []
        for choice in choices[:1]:
            finished = finished or bool(choice.get("finish_reason"))
            delta: dict[str, Any] = choice.get("delta") or {}
            if delta.get("content"):
                text.append(delta["content"])
                on_token(delta["content"])
            pieces: list[dict[str, Any]] = delta.get("tool_calls") or []
            for piece in pieces:
                call = calls.setdefault(
                    piece.get("index", len(calls)),
                    {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
                )
                call["id"] = piece.get("id") or call["id"]
                function: dict[str, Any] = piece.get("function") or {}
                call["function"]["name"] += function.get("name") or ""
                call["function"]["arguments"] += function.get("arguments") or ""
    if not finished:
        raise ModelError("the stream ended before the reply did (no finish_reason)")
    message: Message = {"role": "assistant", "content": "".join(text) or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message
