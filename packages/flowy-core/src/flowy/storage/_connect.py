"""``flowy.connect(url)``: open any store by URL.

Core knows ``memory://`` and ``sqlite:`` itself; every other scheme comes from an
installed adapter that registers an opener in the ``flowy.backends`` entry-point group
(core never imports an adapter). An opener is ``async def open_backend(url: StoreURL,
*, codec) -> BaseBackend`` returning an unopened backend; ``connect`` opens it.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
from collections.abc import Awaitable, Callable, Generator
from types import TracebackType
from typing import Any, cast

from .._errors import BackendURLError
from ._backend import BaseBackend, StoreURL, redact_url
from ._codecs import StateCodec
from ._limits import Limits
from ._protocols import Backend

__all__ = [
    "ENTRY_POINT_GROUP",
    "SQLITE_SUFFIXES",
    "Connecting",
    "connect",
    "parse_url",
    "register_backend",
    "schemes",
]

ENTRY_POINT_GROUP = "flowy.backends"
"""The entry-point group adapters register their openers in (name: the URL scheme)."""

Opener = Callable[..., Awaitable[BaseBackend[Any]]]

_BUILTIN = {
    "memory": "flowy.memory:open_backend",
    "sqlite": "flowy.sqlite:open_backend",
}

_EXTRAS = {
    "postgresql": "postgres",
    "postgres": "postgres",
    "redis": "redis",
    "rediss": "redis",
    "redis+cluster": "redis",
    "rediss+cluster": "redis",
    "dynamodb": "dynamodb",
}


def _load(spec: str) -> Opener:
    module, _, attr = spec.partition(":")
    return cast(Opener, getattr(importlib.import_module(module), attr))


def _registered() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def schemes() -> list[str]:
    """The URL schemes ``connect`` can open here (built in, installed, registered)."""
    return sorted(set(_BUILTIN) | set(_registered()) | set(_registered_here))


_registered_here: dict[str, Opener] = {}


def register_backend(scheme: str, opener: Opener) -> None:
    """Make ``flowy.connect`` open ``scheme://`` URLs with ``opener`` in this process.

    Installed adapters register through the ``flowy.backends`` entry-point group
    instead; this is for a store that lives in an application or a test suite.

    Args:
        scheme: the URL scheme: lowercase letters, digits and ``+``. Registering it
            again replaces the earlier opener.
        opener: ``async def open_backend(url: StoreURL, *, codec) -> BaseBackend``,
            returning an unopened backend.

    Raises:
        ValueError: a malformed scheme, or one of flowy's own (``memory``, ``sqlite``).
    """
    if not scheme or not scheme.replace("+", "").isalnum() or scheme != scheme.lower():
        raise ValueError(f"a scheme is lowercase letters, digits and '+', got {scheme!r}")
    if scheme in _BUILTIN:
        raise ValueError(f"{scheme}:// is flowy's own store and cannot be replaced")
    _registered_here[scheme] = opener


def _opener(url: StoreURL) -> Opener:
    if url.scheme in _registered_here:
        return _registered_here[url.scheme]
    if url.scheme in _BUILTIN:
        return _load(_BUILTIN[url.scheme])
    entry = _registered().get(url.scheme)
    if entry is not None:
        try:
            return cast(Opener, entry.load())
        except ImportError as exc:
            raise BackendURLError(
                f"the adapter for {url.scheme}:// is registered but does not import ({exc}); "
                f'reinstall it: pip install "flowy-core[{_EXTRAS.get(url.scheme, url.scheme)}]"'
            ) from exc
    extra = _EXTRAS.get(url.scheme)
    if extra is not None:
        raise BackendURLError(
            f"{url.redacted!r} needs the flowy-{extra} adapter, which is not installed: "
            f'pip install "flowy-core[{extra}]"'
        )
    raise BackendURLError(
        f"unknown store scheme {url.scheme!r} in {url.redacted!r}; known here: "
        f"{', '.join(s + '://' for s in schemes())}"
    )


SQLITE_SUFFIXES = (".db", ".sqlite")
"""The endings that make a bare path (no ``scheme://``) a SQLite file for ``connect``."""

_SCHEME_PREFIX = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")


def parse_url(url: str) -> StoreURL:
    """``url`` parsed as :func:`connect` reads it: ``scheme://…``, or a bare path ending
    in ``.db`` or ``.sqlite`` (a SQLite file).

    Raises:
        BackendURLError: anything else (``redis:6379``, ``localhost``, an out-of-range
            port, …); the message masks the password.
    """
    if isinstance(url, str) and "://" not in url and url.strip():  # pyright: ignore[reportUnnecessaryIsInstance]
        prefix = _SCHEME_PREFIX.match(url)
        scheme = prefix.group(1).lower() if prefix and len(prefix.group(1)) > 1 else None
        if scheme is None and url.lower().endswith(SQLITE_SUFFIXES):
            return StoreURL("sqlite:///" + url, "sqlite", "", "/" + url, {})
        hint = (
            f"{scheme}: needs // ({scheme}://...); "
            if scheme in set(_BUILTIN) | set(_EXTRAS) | set(_registered_here)
            else ""
        )
        raise BackendURLError(
            f"{redact_url(url)!r} is not a store URL: {hint}give scheme://... (memory://, "
            "sqlite:///flowy.db, postgresql://host/db, redis://host:6379, "
            "dynamodb://TABLE?region=...) or a SQLite file path ending in .db or .sqlite"
        )
    return StoreURL.parse(url)


async def _open(url: str, codec: StateCodec[Any] | None, limits: Limits | None) -> Backend[Any]:
    parsed = parse_url(url)
    backend = await _opener(parsed)(parsed, codec=codec)
    if limits is not None:
        backend.limits = limits
    await backend.open()
    return cast(Backend[Any], backend)


class Connecting:
    """What :func:`connect` returns: await it for the backend, or use it as
    ``async with`` to close the backend on exit.

    Args:
        url: the store URL (see :func:`connect`).
        codec: the state codec the backend is opened with.
        limits: the limits of what the backend stores (``None``: the defaults).
    """

    def __init__(
        self, url: str, codec: StateCodec[Any] | None, limits: Limits | None = None
    ) -> None:
        if limits is not None and not isinstance(limits, Limits):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"limits must be a flowy.storage.Limits, got {limits!r:.80}")
        self._url = url
        self._codec = codec
        self._limits = limits
        self._backend: Backend[Any] | None = None

    def __await__(self) -> Generator[Any, None, Backend[Any]]:
        return _open(self._url, self._codec, self._limits).__await__()

    async def __aenter__(self) -> Backend[Any]:
        self._backend = await _open(self._url, self._codec, self._limits)
        return self._backend

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._backend is not None:
            await self._backend.aclose()


def connect(
    url: str, *, codec: StateCodec[Any] | None = None, limits: Limits | None = None
) -> Connecting:
    """Open the store at ``url``.

    ::

        backend = await flowy.connect("sqlite:///flowy.db")
        async with flowy.connect("postgresql://app@db/app?schema=flowy") as backend:
            runner = flowy.Runner(graph, backend)

    Schemes: ``memory://`` (``memory://NAME`` shares a store by name in this process),
    ``sqlite:///path.db`` or a bare path ending in ``.db`` or ``.sqlite``,
    ``postgresql://…`` / ``postgres://…`` (flowy-postgres), ``redis://…``,
    ``rediss://…``, ``redis+cluster://…`` (flowy-redis), ``dynamodb://TABLE?region=…``
    (flowy-dynamodb). Store options are query parameters, documented per store in
    ``docs/storage.md``; an unknown one is an error. ``codec`` encodes states (by
    default the runner uses a typed graph's state type); ``limits`` sets the limits of
    what it stores (``flowy.storage.Limits``: the longest sleep, pending signals per
    thread, the size of a signal and of an activity result). A new store gets its
    schema; an older schema needs ``await backend.setup()``.

    Raises ``BackendURLError`` for a malformed URL (a string that is neither
    ``scheme://…`` nor a ``.db``/``.sqlite`` path, a port outside 1-65535), an unknown
    scheme, an unknown or out-of-range option, or an adapter that is not installed
    (naming the ``pip install`` to run); passwords never appear in its message.
    """
    return Connecting(url, codec, limits)
