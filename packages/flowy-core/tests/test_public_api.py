"""The public facade: exported names, one-way imports, a stdlib-only ``import flowy``."""

from __future__ import annotations

import ast
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

import flowy
import flowy.checkpoint

SRC = Path(flowy.__file__).parent

# Lower layers never import higher ones. A module may import modules of a lower rank.
RANK = {
    "_types": 0,
    "_errors": 1,
    "_checkpoint": 2,
    "_codecs": 2,
    "_directives": 2,
    "_context": 2,
    "_plan": 2,
    "_observer": 2,
    "_records": 3,
    "_graph": 3,
    "_results": 3,
    "_saving": 4,
    "_memory": 4,
    "_guard": 4,
    "_sqlite": 5,
    "_events": 5,
    "_handoff": 5,
    "_execution": 6,
    "_runner": 7,
    "_worker": 8,
    "patterns": 8,
    "checkpoint": 8,
    "_demo": 9,
    "_term": 8,
    "cli": 10,
    "testing": 10,
    "__init__": 11,
}


def rank_of(module: str) -> int:
    name = module.split(".")[0]
    if name.startswith("_sqlite"):
        name = "_sqlite"
    assert name in RANK, f"module {module!r} has no layer: add it to RANK"
    return RANK[name]


def flowy_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level >= 1 and node.module:
            found.add(node.module)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("flowy."):
            found.add(node.module.removeprefix("flowy."))
    return found


def test_imports_are_one_way() -> None:
    problems: list[str] = []
    for path in SRC.glob("*.py"):
        mine = rank_of(path.stem)
        for imported in flowy_imports(path):
            if imported.startswith("testing"):
                problems.append(f"{path.name} imports the test suite {imported}")
            elif imported.startswith("_sqlite") and path.stem.startswith("_sqlite"):
                continue  # the SQLite backend's own modules (one family)
            elif path.stem != "__init__" and rank_of(imported) >= mine:
                problems.append(f"{path.name} (layer {mine}) imports {imported}")
    assert problems == []


def test_all_is_sorted_complete_and_presented_as_flowy() -> None:
    assert flowy.__all__ == sorted(flowy.__all__)
    for name in flowy.__all__:
        obj = getattr(flowy, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert obj.__module__ == "flowy", name
            assert obj.__doc__, f"flowy.{name} has no docstring"
    public = {n for n in dir(flowy) if not n.startswith("_")}
    helpers = {"annotations", "checkpoint", "patterns", "testing", "cli"}
    assert public - set(flowy.__all__) <= helpers
    assert flowy.ConcurrencyConflictError.__module__ == "flowy"
    for name in flowy.checkpoint.__all__:
        assert hasattr(flowy.checkpoint, name)


def test_every_error_derives_from_flowy_error() -> None:
    errors = [getattr(flowy, n) for n in flowy.__all__ if n.endswith("Error")]
    assert len(errors) > 20
    assert all(issubclass(e, flowy.FlowyError) for e in errors)


def test_import_flowy_loads_only_the_standard_library() -> None:
    code = (
        "import sys; before = set(sys.modules); import flowy, flowy.checkpoint; "
        "new = {m.split('.')[0] for m in set(sys.modules) - before}; "
        "print(sorted(m for m in new if m not in sys.stdlib_module_names and m != 'flowy'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_no_pickle_anywhere() -> None:
    for path in SRC.rglob("*.py"):
        text = path.read_text()
        assert "import pickle" not in text and "from pickle" not in text, path
        assert "marshal.loads" not in text, path


def test_generic_dataclasses_accept_type_arguments() -> None:
    snap = flowy.Snapshot[dict[str, int]]("t", {"a": 1}, "node")
    result = flowy.RunResult[dict[str, int], str]("t", {}, flowy.RunStatus.COMPLETED, "r", "n")
    event = flowy.RunEvent[dict[str, int], str](flowy.EventType.EFFECT, "t", effect="e")
    assert (snap.state, result.reason, event.effect) == ({"a": 1}, "r", "e")


def test_public_api_is_fully_typed() -> None:
    """``pyright --verifytypes`` finds no missing or partially unknown public types.

    The JSON ``summary.errorCount`` does not count per-symbol diagnostics, so the symbol
    diagnostics and the exit status are checked as well.
    """
    pyright = Path(sys.executable).parent / "pyright"
    if not pyright.exists():
        pytest.skip(f"pyright is not installed next to the interpreter ({pyright}).")
    repo = Path(__file__).resolve().parents[3]
    out = subprocess.run(
        [
            str(pyright),
            "--pythonpath",
            sys.executable,
            "--verifytypes",
            "flowy",
            "--ignoreexternal",
            "--outputjson",
        ],
        capture_output=True,
        text=True,
        cwd=repo,
        timeout=300,
        check=False,
    )
    report = json.loads(out.stdout)
    errors = [
        f"{symbol['name']}: {diag['message']}"
        for symbol in report["typeCompleteness"]["symbols"]
        for diag in symbol["diagnostics"]
        if diag["severity"] == "error"
    ]
    assert report["summary"]["errorCount"] == 0, report["summary"]
    assert errors == [], "\n".join(errors)
    assert out.returncode == 0, out.stderr
