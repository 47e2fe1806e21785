"""The files of ``flowy demo``: which ones it may replace, and the commands it prints.

The demo only ever replaces files it made itself: its database carries a marker table
(``flowy_demo``) and its payments ledger an application id of its own, and anything
else at those paths is refused before a byte changes. The commands it prints at the end
run as printed from the current directory: ``flowy …`` when the ``flowy`` on ``PATH`` is
this environment's, else the path to this environment's ``flowy``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import sys
import time
import urllib.parse
from pathlib import Path

from .._errors import FlowyError
from ..sqlite import APPLICATION_ID
from ._demo_state import GRAPH_SPEC, LEDGER_APPLICATION_ID, THREAD_ID
from ._demo_world import open_ledger, payments_path
from ._options import quote
from ._render import clean

__all__ = [
    "MARKER_TABLE",
    "DemoError",
    "DemoRefusedError",
    "describe_failure",
    "flowy_program",
    "fresh_files",
    "inspect_commands",
    "mark_as_demo",
]

MARKER_TABLE = "flowy_demo"
"""The table that marks a flowy database as one the demo created (and may replace)."""

_SIDECARS = ("-wal", "-shm", "-journal")


class DemoError(Exception):
    """The demo did not go as scripted."""


class DemoRefusedError(DemoError):
    """The demo was pointed at files it did not create (a usage error)."""


# ------------------------------------------------------------------------ its own files


def _read_only(path: Path) -> sqlite3.Connection:
    # immutable: no locks, no -wal or -shm files made next to a database that may not
    # be ours (a database in use may hide its latest pages from this look; the demo
    # then refuses it, which is the safe side).
    uri = "file:" + urllib.parse.quote(str(path.resolve())) + "?mode=ro&immutable=1"
    return sqlite3.connect(uri, uri=True, timeout=5.0)


def _made_by_demo(db: Path) -> bool:
    """True if ``db`` is a flowy database carrying the demo's marker table."""
    try:
        with contextlib.closing(_read_only(db)) as conn:
            app_id = int(conn.execute("PRAGMA application_id").fetchone()[0])
            marked = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (MARKER_TABLE,)
            ).fetchone()
    except sqlite3.Error:
        return False
    return app_id == APPLICATION_ID and marked is not None


def _is_ledger(path: Path) -> bool:
    """True if ``path`` is a payments ledger the demo wrote (its header says so)."""
    try:
        with path.open("rb") as f:
            header = f.read(100)
    except OSError:
        return False
    return (
        len(header) == 100
        and header.startswith(b"SQLite format 3\x00")
        and int.from_bytes(header[68:72], "big") == LEDGER_APPLICATION_ID
    )


def _refuse(path: Path, why: str) -> DemoRefusedError:
    return DemoRefusedError(
        f"refusing to replace {str(path)!r}: {why}; the demo only replaces files it created "
        "itself - choose another --db path"
    )


def _check_replaceable(db: Path) -> None:
    """Raise :class:`DemoRefusedError` unless every file the demo would delete is its own."""
    if db.is_dir():
        raise DemoRefusedError(f"--db {str(db)!r} is a directory; give the demo a file path")
    if db.exists():
        if not _made_by_demo(db):
            raise _refuse(db, "it is not a database the demo created")
    else:
        for suffix in _SIDECARS:
            stray = Path(str(db) + suffix)
            if stray.exists():
                raise _refuse(stray, f"it belongs to a database file {str(db)!r} that is gone")
    ledger = payments_path(db)
    if ledger.exists() and not _is_ledger(ledger):
        raise _refuse(ledger, "it is not the demo's payments ledger")


def fresh_files(db: Path) -> Path:
    """Remove the demo's earlier files at ``db`` (only those) and make a new ledger."""
    _check_replaceable(db)
    db.parent.mkdir(parents=True, exist_ok=True)
    ledger = payments_path(db)
    for path in (db, ledger):
        for suffix in ("", *_SIDECARS):
            with contextlib.suppress(FileNotFoundError):
                Path(str(path) + suffix).unlink()
    with contextlib.closing(open_ledger(str(ledger))):
        pass
    return ledger


def mark_as_demo(db: Path) -> None:
    """Put the demo's marker table into its (just created) database."""
    with contextlib.closing(sqlite3.connect(db, timeout=5.0, isolation_level=None)) as conn:
        conn.execute(f"CREATE TABLE IF NOT EXISTS {MARKER_TABLE} (created_at REAL NOT NULL)")
        conn.execute(f"INSERT INTO {MARKER_TABLE} VALUES (?)", (time.time(),))


# ----------------------------------------------------------------------- printed commands


def _shown_path(path: Path) -> str:
    """``path`` relative to the current directory when it lies below it, else absolute."""
    absolute = Path(os.path.abspath(path))
    try:
        return str(absolute.relative_to(Path.cwd()))
    except ValueError:
        return str(absolute)


def flowy_program() -> str:
    """How to type this environment's ``flowy`` from the current directory: ``flowy``
    when that is the one on ``PATH``, else a path to it (or to ``python -m flowy.cli``)."""
    bindir = Path(sys.executable).parent
    own = bindir / ("flowy.exe" if os.name == "nt" else "flowy")
    found = shutil.which("flowy")
    if found is not None and own.exists():
        with contextlib.suppress(OSError):
            if os.path.samefile(found, own):
                return "flowy"
    if own.exists():
        return quote(_shown_path(own))
    return f"{quote(_shown_path(Path(sys.executable)))} -m flowy.cli"


def inspect_commands(db: Path, program: str = "flowy") -> list[str]:
    """The commands that look inside the demo's database."""
    q = quote(db)
    return [
        f"{program} threads --db {q}",
        f"{program} show {THREAD_ID} --db {q}",
        f"{program} history {THREAD_ID} --db {q}",
        f"{program} graph {GRAPH_SPEC}",
    ]


def describe_failure(exc: BaseException) -> str:
    """One line for a demo that went wrong."""
    if isinstance(exc, DemoError | FlowyError):
        return clean(" ".join(str(exc).split()))
    return f"{type(exc).__name__}: {clean(' '.join(str(exc).split()))}"
