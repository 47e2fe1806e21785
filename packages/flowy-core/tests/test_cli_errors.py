"""Mistakes and hostile input for the ``flowy`` command: every mistake is one line on
standard error with exit status 2 (usage) or 1 (the operation failed), never a
traceback; read-only commands never create or change a file; text read from a store
reaches the terminal escaped, and ``--json`` stays exact."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_support import GRAPH, assert_one_line_error, populate, run_flowy

import flowy
from flowy import storage
from flowy.sqlite import SQLiteBackend


@pytest.fixture
def db(tmp_path: Path) -> str:
    """A flowy database with the threads of ``cli_support.populate``."""
    path = tmp_path / "flowy.db"
    asyncio.run(populate(str(path)))
    return str(path)


def _files(directory: Path) -> dict[str, str]:
    """Every file below ``directory`` with a digest of its bytes."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


# ---------------------------------------------------------------- one-line mistakes

_HUGE = "9" * 5000
_OUT_OF_RANGE = [
    (_HUGE, ["--overlay holds a number out of range", "an integer of 5000 digits"]),
    ("Infinity", ["--overlay holds a number out of range", "Infinity"]),
    ("NaN", ["--overlay holds a number out of range", "NaN"]),
    ("1e999", ["--overlay holds a number out of range", "1e999"]),
]


@pytest.mark.parametrize(
    ("args", "code", "needles"),
    [
        (["show", "nope"], 1, ["flowy show: error:", "no thread 'nope'"]),
        (["history", "nope"], 1, ["flowy history: error:", "no thread 'nope'"]),
        (["resume", "nope", "--revision", "1", "--graph", GRAPH], 1, ["no thread 'nope'"]),
        (
            ["resume", "susp", "--revision", "1", "--graph", GRAPH],
            1,
            ["revision 1 of thread 'susp' is stale", "then resume susp@2 (or --revision 2)"],
        ),
        (["resume", "ho@1", "--graph", GRAPH, "--json"], 1, ["is stale", "--revision 4"]),
        (["recover", "--thread", "nope"], 1, ["no thread 'nope'"]),
        (["resume", "susp@2", "--graph", "x"], 2, ["'package.module:attribute'"]),
        (["worker", "--graph", "no_such_module:g"], 2, ["no module named 'no_such_module'"]),
        (["worker", "--graph", "core_graphs:nope"], 2, ["has no attribute 'nope'"]),
        (["worker", "--graph", "core_graphs:State"], 2, ["not a flowy.Graph"]),
        (["threads", "--limit", "x"], 2, ["--limit", "expected a whole number"]),
        (["threads", "--limit", "99999999999999999999"], 2, ["--limit", "from 1 to 1000000"]),
        (["threads", "--limit", "0"], 2, ["--limit", "from 1 to 1000000"]),
        (["history", "ho", "--limit", "-3"], 2, ["--limit"]),
        (["threads", "--after", ""], 2, ["--after", "must not be empty"]),
        (
            ["dead-letters", "--retry", "99999999999999999999"],
            1,
            ["no dead letter with id '99999999999999999999'"],
        ),
        (["resume", "susp", "--revision", "99999999999999999999", "--graph", GRAPH], 2, ["from 1"]),
        (["resume", "susp@99999999999999999999", "--graph", GRAPH], 2, ["positive integer"]),
        (["resume", "susp", "--revision", "0", "--graph", GRAPH], 2, ["--revision"]),
        (
            ["resume", "susp@2", "--graph", GRAPH, "--overlay", "{"],
            2,
            ["--overlay is not valid JSON"],
        ),
        (
            ["resume", "susp@2", "--graph", GRAPH, "--overlay", "[" * 100_000],
            2,
            ["--overlay nests too deeply"],
        ),
        (
            ["resume", "susp@2", "--graph", GRAPH, "--overlay", "[" * 500 + "]" * 500],
            2,
            ["--overlay nests too deeply"],
        ),
        (["resume", "susp@2", "--graph", GRAPH, "--lease-ttl", "nan"], 2, ["--lease-ttl"]),
        (["resume", "susp@2", "--graph", GRAPH, "--lease-ttl", "-1"], 2, ["--lease-ttl"]),
        (["worker", "--graph", GRAPH, "--once", "--lease-ttl", "inf"], 2, ["at most"]),
        (["worker", "--graph", GRAPH, "--once", "--idle-wait", "-0.5"], 2, ["--idle-wait"]),
        (["worker", "--graph", GRAPH, "--poll-interval", "0"], 2, ["--poll-interval"]),
        (["worker", "--graph", GRAPH, "--concurrency", "1e3"], 2, ["--concurrency"]),
        (["recover", "--stale-after", "NaN"], 2, ["--stale-after"]),
        *[
            (["resume", "susp@2", "--graph", GRAPH, "--overlay", f'{{"n": {number}}}'], 2, needles)
            for number, needles in _OUT_OF_RANGE
        ],
        *[
            (["signal", "susp", "go", "--json", f"[{number}]"], 2, ["--json", *needles[1:]])
            for number, needles in _OUT_OF_RANGE
        ],
        (
            [
                *("fork", "susp", "--revision", "2", "--new-thread", "f", "--graph", GRAPH),
                *("--overlay", f'{{"n": -{_HUGE}}}'),
            ],
            2,
            ["--overlay holds a number out of range", "5000 digits"],
        ),
        (["threads", "--limit", _HUGE], 2, ["--limit", "from 1 to 1000000"]),
        (["history", "susp", "--limit", "-" + _HUGE], 2, ["--limit", "from 1 to 1000000"]),
        (["worker", "--graph", GRAPH, "--concurrency", _HUGE], 2, ["--concurrency", "1 to 1000"]),
        (["worker", "--graph", GRAPH, "--idle-wait", _HUGE], 2, ["--idle-wait", "at most"]),
        (["worker", "--graph", GRAPH, "--lease-ttl", "1e400"], 2, ["--lease-ttl", "at most"]),
        (["resume", "susp", "--revision", _HUGE, "--graph", GRAPH], 2, ["--revision", "from 1"]),
        (["ui", "--port", _HUGE], 2, ["--port"]),
        (["ui", "--port", "99999"], 2, ["--port", "from 0 to 65535"]),
        (["check", GRAPH, "--seed", _HUGE], 2, ["--seed", "from 0 to 1000000"]),
        (["show", "susp", "--codec", "core_graphs:merge"], 2, ["--codec"]),
        (["show", "susp", "--codec", "json:dumps"], 2, ["--codec"]),
        (["queues", "set", "a b", "--rate-limit", "3"], 2, ["NAME", "queue name 'a b'"]),
        (["queues", "set", "llm", "--global-concurrency", "-1"], 2, ["--global-concurrency"]),
        (["queues", "set", "llm", "--rate-limit", _HUGE], 2, ["--rate-limit", "from 0"]),
        (["queues", "set", "llm", "--rate-period", "0"], 2, ["--rate-period", "from 0.001"]),
        (["queues", "set", "llm"], 2, ["at least one limit"]),
        (["queues", "reset"], 2, ["needs the queue's NAME"]),
        (["queues", "reset", "llm", "--rate-limit", "3"], 2, ["go with `flowy queues set"]),
        (["queues", "llm"], 2, ["invalid choice: 'llm'"]),
        (["threads", "--queue", "a/b"], 2, ["--queue", "queue name 'a/b'"]),
        (["threads", "--queue", "llm", "--after", "x"], 2, ["do not go with --queue"]),
        (["worker", "--graph", GRAPH, "--queue", ""], 2, ["--queue", "queue name ''"]),
    ],
)
def test_user_mistakes_are_one_line(
    db: str, args: list[str], code: int, needles: list[str]
) -> None:
    assert_one_line_error(run_flowy(*args, "--db", db), code, *needles)


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["graph", "nocolon"], ["must look like 'package.module:attribute'"]),
        (["graph", "no_such_module:g"], ["no module named 'no_such_module'"]),
        (["graph", "core_graphs:missing"], ["has no attribute 'missing'"]),
        (["graph", "core_graphs:merge"], ["calling it failed: TypeError"]),
        (["graph", "flowy:GraphBuilder"], ["returned a GraphBuilder, not a flowy.Graph"]),
        (["threads"], ["no store given: pass --backend URL (or set FLOWY_BACKEND)"]),
        (["threads", "--db", "a.db", "--backend", "b.db"], ["not allowed with argument"]),
        ([], ["the following arguments are required: COMMAND"]),
        (["nonsense"], ["invalid choice: 'nonsense'"]),
    ],
)
def test_usage_errors_are_one_line(args: list[str], needles: list[str]) -> None:
    assert_one_line_error(run_flowy(*args), 2, *needles)


def test_broken_graph_module_and_invalid_graph(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("raise RuntimeError('boom\\nsecond line')\n")
    (tmp_path / "invalid.py").write_text(
        "import flowy\n"
        "async def a(s):\n    return s, flowy.completed()\n"
        "def build():\n"
        "    return flowy.GraphBuilder().add_node('a', a).add_edge('a', 'x').compile()\n",
        encoding="utf-8",
    )
    proc = run_flowy("graph", "broken:g", cwd=tmp_path)
    assert_one_line_error(proc, 2, "importing 'broken' failed: RuntimeError: boom second line")
    proc = run_flowy("graph", "invalid:build", cwd=tmp_path)
    assert_one_line_error(proc, 2, "the graph is invalid", "unknown node 'x'")


# ---------------------------------------------------------------- stores and URLs


@pytest.mark.parametrize(
    ("url", "needles"),
    [
        ("postgresql://app:s3cr3t-pw@db.example/app", ["flowy-postgres", "pip install"]),
        ("redis://:s3cr3t-pw@cache:6379/0", ["flowy-redis", 'pip install "flowy-core[redis]"']),
        ("dynamodb://jobs?region=eu-west-1", ["flowy-dynamodb", "pip install"]),
    ],
)
def test_a_missing_adapter_names_its_install(url: str, needles: list[str]) -> None:
    # The adapters may be installed here: hide them, as on a machine without them.
    code = (
        "import importlib.metadata as m, sys\n"
        "real = m.entry_points\n"
        "m.entry_points = lambda **kw: [] if kw.get('group') == 'flowy.backends' else real(**kw)\n"
        "from flowy.cli import main\n"
        f"sys.exit(main(['threads', '--backend', {url!r}]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONIOENCODING": "utf-8"},
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=60,
        check=False,
    )
    assert_one_line_error(proc, 2, *needles)
    assert "s3cr3t-pw" not in proc.stderr


@pytest.mark.parametrize(
    ("url", "needles"),
    [
        ("post%gres://u:s3cr3t-pw@[::1", ["is not a store URL"]),
        ("postgresql://u:s3cr3t-pw@[::1/db", ["cannot parse the store URL"]),
        ("nosuch://u:s3cr3t-pw@host/x", ["unknown store scheme 'nosuch'"]),
        ("sqlite://u:s3cr3t-pw@host/x.db", ["a SQLite URL names a local file"]),
        ("memory://?max_attempts=0&x=1", ["unknown option(s) x"]),
        ("redis:6379", ["'redis:6379' is not a store URL", "redis: needs //"]),
        ("localhost", ["'localhost' is not a store URL"]),
        ("postgresql://u:s3cr3t-pw@127.0.0.1:99999/db", ["port '99999'", "from 1 to 65535"]),
        ("redis://:s3cr3t-pw@127.0.0.1:70000/0", ["port '70000'", "from 1 to 65535"]),
        ("memory://?max_attempts=" + "9" * 5000, ["max_attempts", "from 1 to 2147483647"]),
    ],
)
def test_a_malformed_backend_url_is_a_usage_error(url: str, needles: list[str]) -> None:
    for env, args in (({}, ["--backend", url]), ({"FLOWY_BACKEND": url}, [])):
        proc = run_flowy("threads", *args, env=env)
        assert_one_line_error(proc, 2, *needles)
        assert "s3cr3t-pw" not in proc.stderr


@pytest.mark.parametrize(
    "args", [["threads"], ["show", "t"], ["history", "t"], ["timers"], ["dead-letters"]]
)
def test_an_unreachable_store_on_a_read_speaks_of_reading(args: list[str]) -> None:
    # Nothing listens on port 1: the read fails, and its message says nothing of saves.
    proc = run_flowy(*args, "--backend", "redis://127.0.0.1:1/0", timeout=120)
    assert_one_line_error(proc, 1, "Redis was unavailable", "nothing was read")
    for wrong in ("save", "confirmed_save", "outcome may be unknown"):
        assert wrong not in proc.stderr, proc.stderr


def test_sqlite_options_in_the_url(db: str) -> None:
    proc = run_flowy("threads", "--backend", f"sqlite:///{db}?busy_timeout=2&max_attempts=3")
    assert proc.returncode == 0, proc.stderr
    bad = run_flowy("threads", "--backend", f"sqlite:///{db}?busy_timeout=-1")
    assert_one_line_error(bad, 2, "option busy_timeout")


READ_ONLY = [
    ["threads"],
    ["threads", "--json"],
    ["show", "t"],
    ["history", "t"],
    ["recover"],
    ["dead-letters"],
]
ALL_STORE_COMMANDS = [
    *READ_ONLY,
    ["resume", "t@1", "--graph", GRAPH],
    ["worker", "--graph", GRAPH, "--once"],
    ["dead-letters", "--retry", "1"],
]


WAYS_TO_NAME = [
    *((args, "--db") for args in ALL_STORE_COMMANDS),
    *((args, how) for args in (["threads"], ["worker", "--graph", GRAPH, "--once"])
      for how in ("--backend", "FLOWY_BACKEND")),
]  # fmt: skip


@pytest.mark.parametrize(("args", "how"), WAYS_TO_NAME)
def test_a_missing_database_is_an_error_and_is_not_created(
    tmp_path: Path, args: list[str], how: str
) -> None:
    missing = tmp_path / "missing.db"
    if how == "--db":
        proc = run_flowy(*args, "--db", str(missing))
    elif how == "--backend":
        proc = run_flowy(*args, "--backend", f"sqlite:///{missing}")
    else:
        proc = run_flowy(*args, env={"FLOWY_BACKEND": str(missing)})
    assert_one_line_error(proc, 2, "no database file at", str(missing))
    assert list(tmp_path.iterdir()) == []


NOT_FLOWY = [
    (b"", "is an empty file, not a flowy database"),
    (b"hello\n" * 50, "not a SQLite file at all"),
    ("sqlite", "a SQLite database but not a flowy one"),
]
FOREIGN_FILES = [
    *((args, *NOT_FLOWY[0]) for args in ALL_STORE_COMMANDS),
    *((args, *kind) for args in (["threads"], ["resume", "t@1", "--graph", GRAPH])
      for kind in NOT_FLOWY[1:]),
]  # fmt: skip


@pytest.mark.parametrize(("args", "content", "needle"), FOREIGN_FILES)
def test_a_file_that_is_not_a_flowy_database_is_left_alone(
    tmp_path: Path, args: list[str], content: bytes | str, needle: str
) -> None:
    path = tmp_path / "other.db"
    if content == "sqlite":
        with contextlib.closing(sqlite3.connect(path)) as conn:
            conn.execute("CREATE TABLE notes (body TEXT)")
            conn.commit()
    else:
        assert isinstance(content, bytes)
        path.write_bytes(content)
    before = _files(tmp_path)
    assert_one_line_error(run_flowy(*args, "--db", str(path)), 2, needle)
    assert _files(tmp_path) == before


@pytest.mark.parametrize("args", READ_ONLY)
def test_read_only_commands_change_nothing(db: str, tmp_path: Path, args: list[str]) -> None:
    before = _files(tmp_path)
    proc = run_flowy(*args, "--db", db)
    assert proc.returncode in (0, 1), proc.stderr
    assert _files(tmp_path) == before


def test_a_database_in_use_is_recognised(tmp_path: Path) -> None:
    """A flowy file whose schema still sits in the write-ahead log is a flowy file."""

    async def while_open() -> subprocess.CompletedProcess[str]:
        async with SQLiteBackend[Any](tmp_path / "live.db") as backend:
            await backend.checkpointer.save(0, storage.Snapshot("t", {}, "n"))
            header = (tmp_path / "live.db").read_bytes()[:100]
            assert int.from_bytes(header[68:72], "big") == 0  # not checkpointed yet
            return await asyncio.to_thread(run_flowy, "threads", "--db", str(tmp_path / "live.db"))

    proc = asyncio.run(while_open())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[1].split()[0] == "t"


# ------------------------------------------------------------------- hostile output


HOSTILE = "evil\x1b]8;;http://x\x07\x1b[2J\u202e\x9b31m"
HOSTILE_SHOWN = "evil\\x1b]8;;http://x\\x07\\x1b[2J\\u202e\\x9b31m"


async def _hostile(path: Path) -> None:
    async with SQLiteBackend[Any](path, max_attempts=1) as backend:
        snap = storage.Snapshot(
            HOSTILE,
            {"note": HOSTILE, HOSTILE: [1, "\u2067x"]},
            f"node{HOSTILE}",
            status=flowy.RunStatus.SUSPENDED,
            reason=f"why{HOSTILE}",
            metadata={"m": HOSTILE},
            budget_counts={HOSTILE: 1},
        )
        await backend.checkpointer.save(0, snap)
        intent = storage.HandoffIntent(
            HOSTILE, 1, 1, 1, flowy.ResumeToken(HOSTILE, 1), flowy.HandoffStatus.ENQUEUED,
            f"r{HOSTILE}", f"p{HOSTILE}",
        )  # fmt: skip
        await backend.outbox.enqueue_intent(intent)
        (message,) = await backend.consumer.claim(1, 30)
        await backend.consumer.release(message, error=f"failed {HOSTILE}")
        await backend.leases.acquire(HOSTILE, f"owner{HOSTILE}", 60)


@pytest.mark.parametrize(
    "args",
    [
        ["threads"],
        ["show", HOSTILE],
        ["history", HOSTILE],
        ["dead-letters"],
        ["recover", "--force", "--thread", HOSTILE],
        ["show", "no\x1b[31mthread"],
    ],
)
@pytest.mark.parametrize("color", ["never", "always"])
def test_control_characters_from_a_store_are_shown_escaped(
    tmp_path: Path, args: list[str], color: str
) -> None:
    path = tmp_path / "hostile.db"
    asyncio.run(_hostile(path))
    proc = run_flowy(*args, "--db", str(path), "--color", color)
    text = proc.stdout + proc.stderr
    for bad in ("\x07", "\x1b]", "\x1b[2J", "\x1b[31m", "\u202e", "\x9b", "\u2067"):
        assert bad not in text, (bad, text)
    assert "Traceback" not in text
    if args[0] != "show" or args[1] == HOSTILE:
        assert proc.returncode == 0, proc.stderr
        assert HOSTILE_SHOWN in text or "\\x1b" in text


def test_json_output_stays_exact(tmp_path: Path) -> None:
    path = tmp_path / "hostile.db"
    asyncio.run(_hostile(path))
    for args in (["threads"], ["show", HOSTILE], ["history", HOSTILE], ["dead-letters"]):
        proc = run_flowy(*args, "--db", str(path), "--json")
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.isascii() or all(c.isprintable() or c == "\n" for c in proc.stdout), args
        data = json.loads(proc.stdout)
        text = json.dumps(data)
        assert json.dumps(HOSTILE)[1:-1] in text, args
    show = json.loads(run_flowy("show", HOSTILE, "--db", str(path), "--json").stdout)
    assert show["thread_id"] == HOSTILE
    assert show["state"] == {"note": HOSTILE, HOSTILE: [1, "\u2067x"]}
    assert show["lease"]["owner"] == f"owner{HOSTILE}"
    assert show["dead_letters"][0]["error"] == f"failed {HOSTILE}"
