"""docs/first-app.md's shell commands, run in order as a reader runs them: in a clean
directory, with Debian's ``/usr/bin/python3`` (externally managed: everything goes into
virtual environments), on SQLite and then PostgreSQL.

One ``bash`` plays the reader's terminals: every ``$ `` line of the guide's shell blocks
runs in it, in order, so ``cd``, ``export`` and an activated venv carry over. What a
reader does by hand, the test does the same way each time:

- ``git clone <url>``: a copy of this checkout's files (tracked and new, not ignored)
  stands for the clone;
- a server (``uvicorn ...``, ``python3 -m examples.approval_app.worker``) runs in the
  background until the block shows ``^C`` (Ctrl-C: SIGINT) or another one of its kind
  starts in its place, as in a terminal;
- port 8000 and the database name ``approvals`` become a free port and a database of
  this test's own (dropped at the end), so the test can run next to others;
- the guide's sample ids (``req-767d08023a45``) stand for the ids the app returned, in
  the order its answers show them.

A command's printed output must match the guide's sample: JSON equal, other lines each
found in the output (host-pid owners and times may differ). A read-only command
(``curl`` without a body, ``flowy threads``/``history``) is tried again for a while when
it does not match yet: a worker in another terminal may still be paying.

It needs ``/usr/bin/python3`` with ``venv``, pip's package index (or the local mirror
pip is configured with), and PostgreSQL on 127.0.0.1:5432 with ``createdb``. It takes
about a minute.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from flowy.testing.backends import backend_missing, port_open

pytestmark = pytest.mark.backend

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "first-app.md"
DEBIAN_PYTHON = Path("/usr/bin/python3")
COMMAND_TIMEOUT = 150.0  # one pip install on a cold cache
RETRY_FOR = 20.0
THREAD_ID = re.compile(r"req-[0-9a-f]{12}")
SERVERS = ("uvicorn ", "python3 -m examples.approval_app.worker")


@dataclass
class Step:
    """A line of the guide: a command (``$ ...``) or ``^C``, and the output shown after it."""

    command: str
    expected: list[str] = field(default_factory=lambda: [])


def guide_steps(text: str) -> list[Step]:
    """Every command of the guide's shell blocks, in order, with its sample output."""
    steps: list[Step] = []
    for block in re.findall(r"^```text\n(.*?)^```$", text, re.M | re.S):
        lines = block.splitlines()
        if not any(line.startswith("$ ") or line == "^C" for line in lines):
            continue  # a file listing, not a terminal
        while lines:
            line = lines.pop(0)
            if line.startswith("$ ") or line == "^C":
                command = line.removeprefix("$ ")
                while command.endswith("\\"):
                    command = command[:-1] + " " + lines.pop(0).strip()
                steps.append(Step(command))
            else:
                assert steps, f"output before any command: {line!r}"
                steps[-1].expected.append(line)
    return steps


# -- the reader's terminal -----------------------------------------------------------------


class Shell:
    """One ``bash``: commands run in it one at a time, their output and status read back."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            ["/bin/bash", "--norc", "--noprofile"],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.count = 0

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def run(self, command: str, timeout: float = COMMAND_TIMEOUT) -> tuple[int, str]:
        """Run ``command``; its exit status and its output (stdout and stderr)."""
        assert self.proc.stdin is not None
        self.count += 1
        marker = f"__done_{self.count}_{uuid.uuid4().hex}__"
        self.proc.stdin.write(f"{command}\n__status=$?; echo; echo {marker}$__status\n")
        self.proc.stdin.flush()
        out: list[str] = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"`{command}` ran over {timeout}s:\n{''.join(out)}")
            if line is None:
                pytest.fail(f"the shell exited during `{command}`:\n{''.join(out)}")
            if line.startswith(marker):
                text = "".join(out)
                return int(line[len(marker) :]), text.rstrip("\n")
            out.append(line)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


@dataclass
class Server:
    """A command the guide leaves running in a terminal of its own."""

    kind: str
    pid: int
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def running(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        with contextlib.suppress(OSError, ValueError):  # a zombie has exited
            if Path(f"/proc/{self.pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
                return False
        return True

    def interrupt(self, timeout: float = 20.0) -> None:
        """Ctrl-C, and wait for it to exit (SIGKILL if it does not)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGINT)
        deadline = time.monotonic() + timeout
        while self.running() and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.running():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            pytest.fail(f"{self.kind} did not stop on Ctrl-C:\n{self.output()}")


# -- matching the guide's samples ------------------------------------------------------------

VARYING = {  # words of a sample that differ from run to run, and what they may be
    re.compile(r"laptop-\d+"): r"\S+",  # a worker's default owner: host-pid
    re.compile(r"\d{4}-\d\d-\d\d"): r"\d{4}-\d\d-\d\d",
    re.compile(r"\d\d:\d\d:\d\d"): r"\d\d:\d\d:\d\d",
}


def line_pattern(line: str) -> re.Pattern[str]:
    """A sample line as a pattern: runs of spaces are any spaces, owners and times any."""
    words = [
        next((p for v, p in VARYING.items() if v.fullmatch(word)), re.escape(word))
        for word in line.split()
    ]
    return re.compile(r"^\s*" + r"\s+".join(words) + r"\s*$")


@dataclass
class Ids:
    """The guide's sample thread ids and the ids the app actually returned."""

    known: dict[str, str] = field(default_factory=lambda: {})

    def learn(self, expected: str, actual: str) -> None:
        for sample, real in zip(
            THREAD_ID.findall(expected), THREAD_ID.findall(actual), strict=False
        ):
            self.known.setdefault(sample, real)

    def apply(self, text: str) -> str:
        return THREAD_ID.sub(lambda m: self.known.get(m.group(0), m.group(0)), text)


def mismatch(expected: list[str], output: str, ids: Ids) -> str | None:
    """Why ``output`` is not what the guide shows, or None when it is."""
    if not expected:
        return None
    sample = "\n".join(expected)
    if sample.lstrip().startswith("{"):
        try:
            actual: Any = json.loads(output)
        except ValueError:
            return f"not JSON:\n{output}"
        ids.learn(sample, json.dumps(actual))
        shown: Any = json.loads(ids.apply(sample))
        return None if shown == actual else f"the guide shows {shown}\nthe app said {actual}"
    lines = output.splitlines()
    for line in expected:
        pattern = line_pattern(ids.apply(line))
        if not any(pattern.match(out) for out in lines):
            return f"no line like {line!r} in:\n{output}"
    return None


def read_only(command: str) -> bool:
    return (command.startswith("curl ") and " -d " not in command) or bool(
        re.match(r"flowy (threads|history|show) ", command)
    )


# -- the walk ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def checkout_copy(dest: Path) -> None:
    """This checkout's files as a fresh clone has them (plus files not yet committed)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)


def reader_env() -> dict[str, str]:
    """A login's environment: Debian's python3 first on PATH, no venv, no uv; the
    machine's network settings (pip's and uv's index, certificates, proxies) kept."""
    settings = ("PIP_", "UV_", "SSL_CERT_", "REQUESTS_CA_", "CURL_CA_", "LC_", "LANG")
    keep = {
        k: v
        for k, v in os.environ.items()
        if k.startswith(settings) or k.lower() in ("http_proxy", "https_proxy", "no_proxy")
    }
    return {**keep, "HOME": os.environ.get("HOME", "/root"), "PATH": "/usr/bin:/bin"} | {
        "NO_COLOR": "1",
        "TERM": "dumb",
    }


@pytest.fixture
def database() -> Iterator[str]:
    """A PostgreSQL database name of this test's own; it is dropped afterwards."""
    if not port_open("127.0.0.1", 5432) or shutil.which("createdb", path="/usr/bin") is None:
        backend_missing("PostgreSQL (127.0.0.1:5432, createdb) is needed by the guide")
    name = f"approvals_{uuid.uuid4().hex[:10]}"
    yield name
    subprocess.run(
        [
            *("/usr/bin/psql", "-h", "127.0.0.1", "-U", "postgres", "-q", "-c"),
            f"DROP DATABASE IF EXISTS {name} WITH (FORCE)",
        ],
        capture_output=True,
        check=False,
    )


def test_the_guides_commands_run_as_written(tmp_path: Path, database: str) -> None:
    if not DEBIAN_PYTHON.exists():
        backend_missing("the guide is run with Debian's /usr/bin/python3, which is missing")
    check = subprocess.run([str(DEBIAN_PYTHON), "-c", "import venv, ensurepip"], check=False)
    if check.returncode != 0:
        backend_missing("/usr/bin/python3 has no venv/ensurepip (apt install python3-venv)")
    version = subprocess.run(
        [str(DEBIAN_PYTHON), "-c", "import sys; print(sys.version_info >= (3, 11))"],
        capture_output=True,
        text=True,
        check=True,
    )
    if version.stdout.strip() != "True":
        backend_missing("the guide needs Python 3.11 or later as /usr/bin/python3")

    started = time.monotonic()
    port = str(free_port())
    steps = guide_steps(GUIDE.read_text())
    shell = Shell(tmp_path, reader_env())
    servers: list[Server] = []
    ids = Ids()
    done: list[str] = []
    try:
        assert shell.run("python3 -c 'import sys; print(sys.executable)'")[1] == str(DEBIAN_PYTHON)
        for step in steps:
            command = step.command.replace("8000", port)
            command = re.sub(r"\bapprovals(?=\s|$|\?)", database, command)
            command = re.sub(r"5432/approvals\?", f"5432/{database}?", command)
            command = ids.apply(command)
            expected = [
                re.sub(r"5432/approvals\?", f"5432/{database}?", line) for line in step.expected
            ]
            context = "\n".join(f"$ {c}" for c in done[-3:])
            if command == "^C":
                assert servers, "^C with nothing running"
                server = servers.pop()
                server.interrupt()
                why = mismatch(expected, server.output(), ids)
                assert why is None, f"{server.kind} after ^C: {why}"
                done.append(command)
                continue
            clone = re.match(r"git clone (\S+) && cd (\S+)$", command)
            if clone:
                (tmp_path / clone.group(2)).mkdir()
                checkout_copy(tmp_path / clone.group(2))
                command = f"cd {clone.group(2)}"
            kind = next((k for k in SERVERS if command.startswith(k)), None)
            if kind is not None:
                for earlier in [s for s in servers if s.kind == kind]:
                    earlier.interrupt()  # its terminal runs the new one instead
                    servers.remove(earlier)
                log = tmp_path / f"server-{len(done)}.log"
                code, out = shell.run(f"{command} > {log} 2>&1 &\necho $!")
                assert code == 0, out
                server = Server(kind, int(out.split()[-1]), log)
                servers.append(server)
                wait_until_ready(server, command, expected, ids)
                done.append(command)
                continue
            deadline = time.monotonic() + (RETRY_FOR if read_only(command) else 0)
            while True:
                code, out = shell.run(command)
                why = f"exit status {code}:\n{out}" if code != 0 else mismatch(expected, out, ids)
                if why is None or time.monotonic() > deadline:
                    break
                time.sleep(0.25)
            running = "".join(f"\n-- {s.kind}:\n{s.output()}" for s in servers)
            assert why is None, f"after\n{context}\n`$ {command}`: {why}{running}"
            done.append(command)
            print(f"{time.monotonic() - started:6.1f}s  $ {command}")
    finally:
        for server in reversed(servers):
            with contextlib.suppress(BaseException):
                server.interrupt(timeout=5)
        shell.close()
    # The whole guide ran: the clone, both installs, SQLite, then PostgreSQL.
    assert any(c.startswith("createdb ") for c in done) and done[-1].startswith("flowy history")


def wait_until_ready(server: Server, command: str, expected: list[str], ids: Ids) -> None:
    """Until the server prints what the guide shows it print, or answers on its port."""
    port = re.search(r"--port (\d+)", command)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if not server.running():
            pytest.fail(f"`{command}` exited:\n{server.output()}")
        if port is not None and port_open("127.0.0.1", int(port.group(1))):
            return
        if port is None and mismatch(expected, server.output(), ids) is None:
            return
        time.sleep(0.1)
    pytest.fail(f"`{command}` did not get ready: {mismatch(expected, server.output(), ids)}")
