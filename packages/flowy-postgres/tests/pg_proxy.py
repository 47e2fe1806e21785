"""A TCP proxy between asyncpg and PostgreSQL for fault and round-trip tests.

It forwards bytes unchanged, counts the protocol round trips clients start (``Sync``,
``Flush`` and simple ``Query`` messages: after each the client waits for the server), and
on request swallows the server's next reply and cuts the connection: the statement ran
and committed on the server, the client never hears back.
Clients must connect without TLS (``?sslmode=disable``) so the stream can be read.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import Coroutine
from typing import Any
from urllib.parse import urlsplit, urlunsplit

_RAN = {b"D", b"C", b"s"}  # DataRow, CommandComplete, PortalSuspended


class PgProxy:
    """``async with PgProxy(dsn) as proxy: asyncpg.connect(proxy.dsn)``."""

    def __init__(self, dsn: str) -> None:
        parts = urlsplit(dsn)
        self._target_host = parts.hostname or "127.0.0.1"
        self._target_port = parts.port or 5432
        self._parts = parts
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.round_trips = 0
        self._cut_next_reply = False
        self._cut_after_command = False
        self.cuts = 0

    @property
    def dsn(self) -> str:
        """The DSN that reaches the server through this proxy (TLS off)."""
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        netloc = self._parts.netloc.rsplit("@", 1)
        userinfo = netloc[0] + "@" if len(netloc) == 2 else ""
        query = self._parts.query
        query = (query + "&" if query else "") + "sslmode=disable"
        return urlunsplit(
            (self._parts.scheme, f"{userinfo}127.0.0.1:{port}", self._parts.path, query, "")
        )

    def cut_next_reply(self, *, after_command: bool = False) -> None:
        """Swallow the server's next reply on any connection and close that connection.

        With ``after_command``, the next reply that says a statement ran (it carries a
        ``DataRow``, ``CommandComplete`` or ``PortalSuspended``): with unnamed statements
        (a pooler) a statement's first reply only describes it; that one comes after.
        """
        self._cut_next_reply = True
        self._cut_after_command = after_command

    async def __aenter__(self) -> PgProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        await self._server.wait_closed()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(self._target_host, self._target_port)
        except OSError:
            client_w.close()
            return
        writers = (client_w, server_w)
        self._spawn(self._client_to_server(client_r, server_w, writers))
        self._spawn(self._server_to_client(server_r, client_w, writers))

    @staticmethod
    def _close(writers: tuple[asyncio.StreamWriter, ...]) -> None:
        for writer in writers:
            with contextlib.suppress(Exception):
                writer.close()

    async def _client_to_server(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        writers: tuple[asyncio.StreamWriter, ...],
    ) -> None:
        buffer = b""
        started = False  # the first message (StartupMessage) has no type byte
        try:
            while data := await reader.read(65536):
                buffer += data
                while True:
                    if not started:
                        if len(buffer) < 4:
                            break
                        (size,) = struct.unpack_from(">I", buffer, 0)
                        if len(buffer) < size:
                            break
                        buffer, started = buffer[size:], True
                        continue
                    if len(buffer) < 5:
                        break
                    kind = buffer[:1]
                    (size,) = struct.unpack_from(">I", buffer, 1)
                    if len(buffer) < 1 + size:
                        break
                    if kind in (b"S", b"Q", b"H"):  # Sync, Query, Flush
                        self.round_trips += 1
                    buffer = buffer[1 + size :]
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._close(writers)

    async def _server_to_client(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        writers: tuple[asyncio.StreamWriter, ...],
    ) -> None:
        pending = b""  # the bytes of a server message not complete yet
        first = True
        try:
            while data := await reader.read(65536):
                kinds: set[bytes] = set()
                pending += data
                if first and pending[:1] in (b"N", b"S"):
                    pending = pending[1:]  # the one-byte answer to an SSLRequest
                first = False
                while len(pending) >= 5:
                    (size,) = struct.unpack_from(">I", pending, 1)
                    if len(pending) < 1 + size:
                        break
                    kinds.add(pending[:1])
                    pending = pending[1 + size :]
                if self._cut_next_reply and (not self._cut_after_command or kinds & _RAN):
                    self._cut_next_reply = False
                    self.cuts += 1
                    break
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            self._close(writers)
