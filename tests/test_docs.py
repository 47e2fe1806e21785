"""Every code block of the README and docs/ runs: python blocks are executed (a page's
blocks in order, in one process), ``$ flowy ...`` lines of console blocks are run as
commands, and the README quick start prints what the README says it prints."""

from __future__ import annotations

import importlib
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
# api.md is generated from the docstrings (its signatures are text; tests/test_api_docs.py).
DOCS = sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "api.md")
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


def blocks(path: Path, lang: str) -> list[str]:
    return [body for kind, body in FENCE.findall(path.read_text()) if kind == lang]


def run_python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # A page's blocks run as one program; checking.md's search of 10,000 schedules takes
    # about a minute on an idle machine and several on a busy one.
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "NO_COLOR": "1"},
    )


def test_readme_quick_start_runs_verbatim(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Quick start") :]
    code = FENCE.search(section)
    assert code is not None and code.group(1) == "python"
    expected = FENCE.search(section, code.end())
    assert expected is not None and expected.group(1) == "text"
    proc = run_python(code.group(2), tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == expected.group(2)


def test_readme_names_both_commands_first() -> None:
    readme = (ROOT / "README.md").read_text()
    first_block = FENCE.search(readme)
    assert first_block is not None
    assert "make demo" in first_block.group(2) and "make test" in first_block.group(2)


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_doc_page_code_runs(page: Path, tmp_path: Path) -> None:
    python = blocks(page, "python")
    console = [
        line[2:]
        for body in blocks(page, "console")
        for line in body.splitlines()
        if line.startswith("$ ")
    ]
    assert python or console, f"{page.name} has no executable blocks"
    if python:
        proc = run_python("\n\n".join(python), tmp_path)
        assert proc.returncode == 0, f"{page.name}:\n{proc.stderr}"
    bindir = Path(sys.executable).parent
    for command in console:
        argv = shlex.split(command)
        if argv[0] == "flowy":
            argv[0] = str(bindir / "flowy")
        proc = subprocess.run(
            argv,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "NO_COLOR": "1"},
        )
        assert proc.returncode == 0, f"{page.name}: `{command}` failed:\n{proc.stderr}"


def test_every_store_option_is_documented() -> None:
    """Each store's URL options (its ``OPTIONS``) have a row in its section of storage.md."""
    import flowy.memory
    import flowy.sqlite

    stores: dict[str, Any] = {"Memory": flowy.memory, "SQLite": flowy.sqlite}
    for heading, module in (
        ("PostgreSQL", "flowy_postgres"),
        ("Redis", "flowy_redis"),
        ("DynamoDB", "flowy_dynamodb"),
    ):
        stores[heading] = importlib.import_module(module)
    text = (ROOT / "docs" / "storage.md").read_text()
    sections = dict(re.findall(r"^## (\S+)\n(.*?)(?=^## |\Z)", text, re.S | re.M))
    missing = [
        f"{heading}: {name}"
        for heading, module in stores.items()
        for name in module.OPTIONS
        if f"| `{name}` |" not in sections.get(heading, "")
    ]
    assert not missing, f"options without a row in docs/storage.md: {missing}"


def test_every_suite_class_has_a_row_in_the_store_authors_guide() -> None:
    """docs/adapters.md gives each class of ``flowy.testing.suite`` a row saying what it
    pins, and names no suite class that does not exist."""
    from flowy.testing import suite

    text = (ROOT / "docs" / "adapters.md").read_text()
    rows = set(re.findall(r"^\| `(\w+Suite)` \|", text, re.M))
    named = set(re.findall(r"`(\w+Suite)\b", text))
    assert set(suite.__all__) - rows == set(), "suite classes without a row in docs/adapters.md"
    assert named - set(suite.__all__) == set(), "docs/adapters.md names unknown suite classes"


def test_the_readme_map_names_modules_and_functions_that_exist() -> None:
    """Every path in the README's "Where things are" exists (core paths are relative to
    the ``flowy`` package, an adapter's to its package), and every ``Class.method`` it
    names, or any name on the lines that say where something happens, is defined there."""
    readme = (ROOT / "README.md").read_text()
    start = readme.index("\n## Where things are\n")
    section = readme[start : readme.index("\n## ", start + 1)]
    core = ROOT / "packages" / "flowy-core" / "src" / "flowy"
    sources = {
        p: p.read_text() for p in (ROOT / "packages").glob("*/src/**/*.py") if ".venv" not in str(p)
    }
    lines = [line for line in section.splitlines() if line.startswith("- ")]
    assert len(lines) >= 15, "the map lost its lines"
    anchors = [line for line in lines if "**where " in line]
    assert len(anchors) == 4, anchors  # a resume decision, a hand-off, a timer, an action
    missing: list[str] = []
    for line in lines:
        names = [n for n in re.findall(r"`([^`]+)`", line) if "://" not in n]
        base = ROOT / names[0] if names[0].startswith("packages/") else core
        for name in names:
            if name.endswith((".py", "/")):
                if not (ROOT / name if name.startswith("packages/") else base / name).exists():
                    missing.append(name)
            elif re.fullmatch(r"[A-Z_]\w*\.\w+", name):
                cls, method = name.split(".")
                homes = [t for t in sources.values() if re.search(rf"^class {cls}\b", t, re.M)]
                if not any(re.search(rf"^    (async )?def {method}\(", t, re.M) for t in homes):
                    missing.append(name)
            elif (
                line in anchors
                and re.fullmatch(r"[a-z]+(_[a-z]+)+", name)
                and not any(
                    re.search(rf"^ *(async )?def {name}\(", t, re.M) for t in sources.values()
                )
            ):
                missing.append(name)
    assert not missing, f"README 'Where things are' names what does not exist: {missing}"
