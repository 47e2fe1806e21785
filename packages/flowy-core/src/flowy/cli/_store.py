"""Which store a command works on, and opening it through ``flowy.connect``.

``--backend URL`` (or the ``FLOWY_BACKEND`` environment variable) names any store
``flowy.connect`` opens; ``--db FILE`` is the shortcut for ``sqlite:///FILE``. The
command line wins over the environment. Commands never create a store: a SQLite file
must already be a flowy database before anything opens it, so a typo in a path is an
error instead of a new empty database (``flowy demo`` alone creates its own file).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import urllib.parse
from collections.abc import AsyncGenerator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._errors import BackendURLError
from .._graph import Graph
from ..sqlite import APPLICATION_ID, path_of
from ..storage import (
    Backend,
    DeadLetter,
    OutboxConsumer,
    StateCodec,
    connect,
    redact_url,
)
from ..storage._codecs import codec_for_type
from ..storage._connect import parse_url
from ._options import CliError, load_codec, quote

__all__ = [
    "DEAD_LETTER_SCAN",
    "ENV_VAR",
    "Store",
    "codec_for",
    "dead_letters_by_thread",
    "locate",
    "open_store",
    "scrub",
]

ENV_VAR = "FLOWY_BACKEND"
"""The environment variable naming the store when neither ``--backend`` nor ``--db`` does."""

DEAD_LETTER_SCAN = 10_000
"""How many dead letters a command reads to find those of its threads."""

DEMO_DB = ".flowy-demo/demo.db"

_SQLITE_MAGIC = b"SQLite format 3\x00"


@dataclass(frozen=True, slots=True)
class Store:
    """The store of one command.

    ``url`` is what ``flowy.connect`` opens (it may hold a password); ``label`` names
    the store in messages (password masked); ``option`` is how a printed command names
    it (``--db FILE``, ``--backend URL``, or nothing when ``FLOWY_BACKEND`` does).
    """

    url: str
    label: str
    option: str

    def command(self, *words: str) -> str:
        """``flowy WORDS...`` naming this store, ready to paste."""
        return " ".join(["flowy", *words, *([self.option] if self.option else [])])


def locate(backend: str | None, db: Path | None) -> Store:
    """The store named by ``--backend``, ``--db`` or ``FLOWY_BACKEND``; a usage error
    when none is given or a SQLite file is missing or not a flowy database."""
    if backend is not None and db is not None:
        raise CliError("give either --backend URL or --db FILE, not both", 2)
    if db is not None:
        path = str(db)
        _check_sqlite_file(path, "--db")
        return Store(_sqlite_url(path), path, f"--db {quote(path)}")
    if backend is not None:
        store = Store(backend, redact_url(backend), f"--backend {quote(redact_url(backend))}")
        source = "--backend"
    else:
        env = os.environ.get(ENV_VAR, "").strip()
        if not env:
            raise CliError(
                f"no store given: pass --backend URL (or set {ENV_VAR}), or --db FILE for "
                "a SQLite file",
                2,
            )
        store = Store(env, redact_url(env), "")
        source = ENV_VAR
    path = _sqlite_path(store.url, source)
    if path is not None:
        _check_sqlite_file(path, source)
    return store


def _sqlite_url(path: str) -> str:
    return "sqlite:///" + urllib.parse.quote(path)


def _sqlite_path(url: str, source: str) -> str | None:
    """The file of a SQLite URL (or bare path), ``None`` for other stores."""
    if not url.strip():
        return None
    try:
        parsed = parse_url(url)
        path = path_of(parsed) if parsed.scheme == "sqlite" else None
    except BackendURLError as exc:
        raise CliError(f"{source}: {scrub(str(exc), [url])}", 2) from None
    if path is not None and path.startswith("~"):
        path = str(Path(path).expanduser())
    return path


def _check_sqlite_file(path: str, source: str) -> None:
    """Refuse a path that is not an existing flowy database, before anything opens it
    (opening would create the file, or write a schema into an empty one)."""
    if path in ("", ":memory:"):
        return
    where = f"{source} {path!r}"
    file = Path(path)
    if not file.exists():
        raise CliError(
            f"no database file at {path!r}; check {source} (`flowy demo` creates one at "
            f"{DEMO_DB!r})",
            2,
        )
    if not file.is_file():
        raise CliError(f"{where} is not a file; give a flowy SQLite database", 2)
    try:
        with file.open("rb") as f:
            header = f.read(100)
    except OSError as exc:
        raise CliError(f"cannot read {where}: {exc.strerror or exc}", 2) from None
    wal = Path(path + "-wal")
    live = wal.is_file() and wal.stat().st_size > 0
    if not header and not live:
        raise CliError(f"{where} is an empty file, not a flowy database", 2)
    if header and not header.startswith(_SQLITE_MAGIC):
        raise CliError(f"{where} is not a flowy database (not a SQLite file at all)", 2)
    # A database in use may keep its header in the write-ahead log until a checkpoint:
    # then ask SQLite itself, read-only.
    app_id = _read_application_id(path) if live else int.from_bytes(header[68:72], "big")
    if app_id is not None and app_id != APPLICATION_ID:
        raise CliError(
            f"{where} is a SQLite database but not a flowy one (application_id {app_id})", 2
        )


def _read_application_id(path: str) -> int | None:
    uri = "file:" + urllib.parse.quote(os.path.abspath(path)) + "?mode=ro"
    try:
        with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=1.0)) as conn:
            return int(conn.execute("PRAGMA application_id").fetchone()[0])
    except sqlite3.Error:
        return None  # let the store itself report what is wrong with the file


def codec_for(spec: str | None, graph: Graph[Any, Any] | None) -> StateCodec[Any] | None:
    """The codec states are read with: ``--codec``, else the one the state type of a
    typed ``--graph`` gets (``PydanticCodec`` for a pydantic model), else ``None`` (plain
    JSON values)."""
    if spec:
        return load_codec(spec)
    if graph is not None and graph.state_type is not None:
        return codec_for_type(graph.state_type)
    return None


@contextlib.asynccontextmanager
async def open_store(store: Store, codec: StateCodec[Any] | None) -> AsyncGenerator[Backend[Any]]:
    """The opened backend of ``store``, closed on exit. A bad URL, an unknown option or
    a missing adapter is a usage error (its message masks the password)."""
    try:
        backend = await connect(store.url, codec=codec)
    except BackendURLError as exc:
        raise CliError(scrub(str(exc), [store.url]), 2) from None
    try:
        yield backend
    finally:
        await backend.aclose()


def _passwords(url: str) -> set[str]:
    found: set[str] = set()
    with contextlib.suppress(ValueError):
        password = urllib.parse.urlsplit(url).password
        if password:
            found.add(password)
    # What urlsplit cannot take apart (a malformed scheme or host) may still carry
    # credentials: user:password@ right after the "//".
    _, slashes, rest = url.partition("//")
    credentials, at, _ = rest.rpartition("@")
    if slashes and at and ":" in credentials:
        found.add(credentials.split(":", 1)[1])
    return found | {urllib.parse.unquote(p) for p in found}


def scrub(text: str, urls: Iterable[str]) -> str:
    """``text`` with the password of each of ``urls`` (plain or %-encoded) masked."""
    for url in urls:
        for secret in sorted(_passwords(url), key=len, reverse=True):
            if len(secret) >= 3:
                text = text.replace(secret, "***")
    return text


async def dead_letters_by_thread(consumer: OutboxConsumer) -> dict[str, list[DeadLetter]]:
    """The consumer's dead letters (up to ``DEAD_LETTER_SCAN``) by thread id; those whose
    payload does not decode are under ``""``."""
    found: dict[str, list[DeadLetter]] = {}
    for letter in await consumer.dead_letters(DEAD_LETTER_SCAN):
        found.setdefault(letter.thread_id, []).append(letter)
    return found
