"""Scratch stores: a namespace of its own next to a real store, for tools that write test
data (``flowy check --backend``), removed afterwards.

``open_scratch(url)`` asks the store's backend for a sibling URL
(``BaseBackend.scratch_url``: a PostgreSQL schema, a Redis key namespace, a DynamoDB
table, a SQLite file, a private memory store) under a name drawn from a random run id,
without connecting to the store ``url`` names, and opens that; ``drop_scratch()`` removes
it. A store that cannot be namespaced is refused: nothing is written to it.
"""

from __future__ import annotations

import contextlib
import urllib.parse
import uuid
from collections.abc import Mapping
from typing import Any, cast

from .._errors import BackendURLError
from ._backend import BaseBackend
from ._codecs import StateCodec
from ._connect import _opener as opener_of  # pyright: ignore[reportPrivateUsage]
from ._connect import connect, parse_url

__all__ = ["SCRATCH_PREFIX", "open_scratch", "sibling_url"]

SCRATCH_PREFIX = "flowy_scratch_"
"""Every scratch namespace's name starts with this (a crashed tool's leftovers are
found by it)."""


def sibling_url(
    url: str,
    *,
    path: str | None = None,
    netloc: str | None = None,
    options: Mapping[str, str] = {},
) -> str:
    """``url`` with its ``path`` and its ``netloc`` (user, host and port) replaced, if
    given, and ``options`` set in its query (other options kept): how a backend's
    ``scratch_url`` names its sibling."""
    parts = urllib.parse.urlsplit(url)
    query = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    query.update(options)
    return urllib.parse.urlunsplit(
        parts._replace(
            path=parts.path if path is None else path,
            netloc=parts.netloc if netloc is None else netloc,
            query=urllib.parse.urlencode(query),
        )
    )


async def open_scratch(
    url: str, *, codec: StateCodec[Any] | None = None, name: str | None = None
) -> BaseBackend[Any]:
    """Open a new, empty scratch store next to the store ``url`` names.

    Call ``await backend.drop_scratch()`` when done (also on failure): it removes the
    scratch namespace and closes the backend. The store ``url`` names is not connected
    to, let alone written.

    Args:
        url: the store URL (as :func:`flowy.connect` takes it).
        codec: the state codec of the scratch backend.
        name: the namespace's name (default ``flowy_scratch_`` and a random run id).

    Raises:
        BackendURLError: the URL is malformed, or its store cannot be namespaced.
    """
    name = name or f"{SCRATCH_PREFIX}{uuid.uuid4().hex[:12]}"
    parsed = parse_url(url)
    live = await opener_of(parsed)(parsed, codec=codec)
    try:
        scratch = live.scratch_url(name)
    finally:
        with contextlib.suppress(Exception):  # never opened: only its client objects
            await live.aclose()
    if scratch is None:
        raise BackendURLError(
            f"{parsed.redacted!r} cannot be namespaced ({type(live).__name__} has no "
            "scratch stores), so nothing of a check can be kept apart from its data; "
            "give a store that can (memory, sqlite, postgresql, redis, dynamodb)"
        )
    backend = cast(BaseBackend[Any], await connect(scratch, codec=codec))
    backend._scratch = True  # pyright: ignore[reportPrivateUsage]
    return backend
