"""The public facade: exported names, one-way imports (no cycles: tests/test_import_cycles.py),
a stdlib-only ``import flowy``, deprecated 0.1 names, full typing."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import import_graph
import pytest

import flowy
from flowy import errors, lifecycle, storage, stream_helpers
from flowy import types as ftypes
from flowy.storage import dialect

SRC = Path(flowy.__file__).parent

# Lower layers never import higher ones; a module of a subpackage has its package's
# layer. Same-layer imports are allowed as long as the module graph has no cycle.
RANK = {
    "_types": 0,
    "_results": 1,
    "_invariants": 1,
    "_errors": 2,
    "storage": 3,
    "_directives": 4,
    "_context": 4,
    "_plan": 4,
    "_cancel": 4,
    "_observer": 4,
    "_tracing": 0,
    "_cron": 0,
    "_moved": 0,
    "_version": 0,
    "memory": 4,
    "sqlite": 4,
    "_compiled": 5,
    "_graph": 5,
    "_events": 6,
    "_segment": 7,
    "_handoff": 8,
    "_waits": 8,
    "_activities": 8,
    "_fanout": 8,
    "_routing": 9,
    "_pauses": 9,
    "_superstep": 9,
    "_nested": 9,
    "_execution": 9,
    "_preflight": 10,
    "_fork": 10,
    "_runner": 10,
    "_worker": 11,
    "patterns": 11,
    "stream_helpers": 11,
    "live": 11,
    "errors": 11,
    "lifecycle": 11,
    "otel": 11,
    "schedules": 11,
    "queues": 11,
    "operations": 11,
    "types": 12,
    "cli": 13,
    "testing": 13,
    "__init__": 14,
    "checkpoint": 14,
    "_demo": 14,
}


def rank_of(module: str) -> int:
    top = module.split(".")[0]
    assert top in RANK, f"module {module!r} has no layer: add it to RANK"
    return RANK[top]


def module_graph() -> dict[str, set[str]]:
    """flowy's import graph with names relative to the package: ``storage._base``, and
    ``__init__`` for ``flowy`` itself (the cycle test checks the same graph)."""

    def short(name: str) -> str:
        return "__init__" if name == "flowy" else name.removeprefix("flowy.")

    return {short(m): {short(t) for t in ts} for m, ts in import_graph.module_graph(SRC).items()}


def test_imports_are_one_way() -> None:
    problems: list[str] = []
    for module, targets in module_graph().items():
        mine = rank_of(module)
        for target in targets:
            front_end = (module, target) == ("cli._check", "testing.checking")  # flowy check
            if target.startswith("testing") and not module.startswith("testing") and not front_end:
                problems.append(f"{module} imports the test tools {target}")
            elif module != "__init__" and rank_of(target) > mine:
                problems.append(f"{module} (layer {mine}) imports {target} ({rank_of(target)})")
    assert problems == []


def test_public_surface_is_small_sorted_and_presented_as_flowy() -> None:
    assert len(flowy.__all__) <= 60, len(flowy.__all__)
    assert flowy.__all__ == sorted(flowy.__all__)
    for name in flowy.__all__:
        obj = getattr(flowy, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert obj.__module__ in ("flowy", "flowy.errors", "flowy.storage"), name
            assert obj.__doc__, f"flowy.{name} has no docstring"
    public = {n for n in dir(flowy) if not n.startswith("_")}
    modules = {
        "annotations",
        "checkpoint",
        "cli",
        "errors",
        "lifecycle",
        "live",
        "memory",
        "operations",
        "otel",
        "patterns",
        "queues",
        "schedules",
        "sqlite",
        "storage",
        "stream_helpers",
        "testing",
        "types",
    }
    assert public - set(flowy.__all__) <= modules
    for module in (errors, lifecycle, storage, dialect, stream_helpers, ftypes):
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.{name}"


def test_every_error_is_in_flowy_errors_and_derives_from_flowy_error() -> None:
    tree = [getattr(errors, n) for n in errors.__all__]
    assert len(tree) > 25
    assert all(issubclass(e, flowy.FlowyError) and e.__module__ == "flowy.errors" for e in tree)
    top = [getattr(flowy, n) for n in flowy.__all__ if n.endswith("Error")]
    assert all(e is getattr(errors, e.__name__) for e in top)
    assert "ConcurrencyConflictError" in (errors.__doc__ or "")  # the tree is drawn there


def test_names_of_0_1_still_resolve_with_a_deprecation_warning() -> None:
    with pytest.warns(DeprecationWarning, match="flowy.memory.MemoryCheckpointer"):
        moved = flowy.MemoryCheckpointer  # pyright: ignore[reportAttributeAccessIssue]
    from flowy.memory import MemoryCheckpointer

    assert moved is MemoryCheckpointer
    with pytest.warns(DeprecationWarning, match="flowy.stream_helpers"):
        assert flowy.collect_events_and_wait is stream_helpers.collect_events_and_wait  # pyright: ignore[reportAttributeAccessIssue]
    with pytest.raises(AttributeError):
        _ = flowy.NoSuchName  # pyright: ignore[reportAttributeAccessIssue]
    lease = storage.Lease("t", "o", 3, 0.0)
    with pytest.warns(DeprecationWarning, match="fencing_token"):
        assert lease.token == 3


# Every rename the changelog promises (flowy-core 0.2, "Renamed and moved"): old name,
# new home.
NAMES_0_1: dict[str, str] = vars(flowy)["_MOVED"]
MODULES_0_1 = {"flowy.checkpoint": "flowy.storage", "flowy._demo": "flowy.cli.demo"}


@pytest.mark.parametrize("old", sorted(MODULES_0_1))
def test_modules_of_0_1_still_import_with_a_deprecation_warning(old: str) -> None:
    new = importlib.import_module(MODULES_0_1[old])
    sys.modules.pop(old, None)
    parent, _, name = old.rpartition(".")
    if name in vars(package := importlib.import_module(parent)):
        delattr(package, name)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {MODULES_0_1[old]}"):
        module = importlib.import_module(old)
    assert getattr(importlib.import_module(parent), name) is module
    public = [n for n in getattr(new, "__all__", []) if not n.startswith("_")]
    assert public
    for attr in public:
        with pytest.warns(DeprecationWarning, match=f"{old} moved to"):
            assert getattr(module, attr) is getattr(new, attr)
    with pytest.raises(AttributeError):
        _ = module.NoSuchName
    assert name not in flowy.__all__


def test_from_flowy_import_checkpoint() -> None:
    sys.modules.pop("flowy.checkpoint", None)
    if "checkpoint" in vars(flowy):
        delattr(flowy, "checkpoint")
    with pytest.warns(DeprecationWarning, match="flowy.checkpoint moved to flowy.storage"):
        from flowy import checkpoint
    with pytest.warns(DeprecationWarning, match="flowy.checkpoint moved to flowy.storage"):
        from flowy.checkpoint import JSONCodec, Snapshot
    assert (JSONCodec, Snapshot) == (storage.JSONCodec, storage.Snapshot)
    assert checkpoint.__name__ == "flowy.checkpoint"


@pytest.mark.parametrize("name", sorted(NAMES_0_1))
def test_every_moved_name_of_0_1_resolves_with_a_deprecation_warning(name: str) -> None:
    home = importlib.import_module(NAMES_0_1[name])
    new = vars(flowy)["_RENAMED_SINCE"].get(name, name)
    with pytest.warns(DeprecationWarning, match=f"flowy.{name} moved to {home.__name__}.{new}"):
        assert getattr(flowy, name) is getattr(home, new)
    assert name not in flowy.__all__


def test_names_moved_after_0_2_resolve_with_a_deprecation_warning() -> None:
    with pytest.warns(DeprecationWarning, match=r"flowy.HandoffError moved to flowy.errors.*0\.4"):
        assert flowy.HandoffError is errors.HandoffError
    assert "HandoffError" not in flowy.__all__
    assert "HandoffError" not in vars(flowy)


def test_every_error_name_ends_in_error_and_old_names_warn() -> None:
    assert [n for n in errors.__all__ if not n.endswith("Error")] == []
    with pytest.warns(
        DeprecationWarning,
        match=r"flowy.errors.ActivityOutcomeUnknown is renamed "
        r"flowy.errors.ActivityOutcomeUnknownError.*0\.4",
    ):
        old = errors.ActivityOutcomeUnknown  # pyright: ignore[reportAttributeAccessIssue]
    assert old is errors.ActivityOutcomeUnknownError
    with pytest.raises(AttributeError, match="no attribute 'Nowhere'"):
        _ = errors.Nowhere  # pyright: ignore[reportAttributeAccessIssue]


def test_durable_save_is_renamed_confirmed_save_and_warns() -> None:
    with pytest.warns(
        DeprecationWarning,
        match=r"flowy.storage.durable_save is renamed flowy.storage.dialect.confirmed_save.*0\.4",
    ):
        old = storage.durable_save  # pyright: ignore[reportAttributeAccessIssue]
    assert old is storage.dialect.confirmed_save
    assert "durable_save" not in storage.__all__ + storage.dialect.__all__
    with pytest.raises(AttributeError, match="no attribute 'nowhere'"):
        _ = storage.nowhere  # pyright: ignore[reportAttributeAccessIssue]


@pytest.mark.anyio
async def test_renamed_attributes_and_methods_of_0_1_warn() -> None:
    decision = flowy.ResumeDecision(
        flowy.ResumeDecisionKind.NOT_FOUND, "t", flowy.ResumeToken("t", 2), None
    )
    with pytest.warns(DeprecationWarning, match="resume_token"):
        assert decision.token == flowy.ResumeToken("t", 2)
    recovery = flowy.HandoffRecoveryResult(
        decision, None, 2, flowy.HandoffStatus.ENQUEUED, flowy.HandoffStatus.ORPHANED
    )
    with pytest.warns(DeprecationWarning, match="handoff_status"):
        assert recovery.recovered is True
    for url in ("memory://", "sqlite:///:memory:"):
        backend = await flowy.connect(url)
        assert isinstance(backend, dialect.BaseBackend)
        with pytest.warns(DeprecationWarning, match=r"close\(\) is deprecated; use aclose"):
            await backend.close()
        assert backend.closed


def test_version_comes_from_the_installed_metadata() -> None:
    assert flowy.__version__ == importlib.metadata.version("flowy-core")


def test_import_flowy_loads_only_the_standard_library() -> None:
    code = (
        "import sys; before = set(sys.modules); import flowy, flowy.storage, flowy.sqlite; "
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
    snap = storage.Snapshot[dict[str, int]]("t", {"a": 1}, "node")
    result = flowy.RunResult[dict[str, int], str]("t", {}, flowy.RunStatus.COMPLETED, "r", "n")
    event = flowy.RunEvent[dict[str, int], str](flowy.EventType.EFFECT, "t", effect="e")
    assert (snap.state, result.reason, event.effect) == ({"a": 1}, "r", "e")


@pytest.mark.parametrize(
    "package", ["flowy", "flowy_postgres", "flowy_redis", "flowy_dynamodb", "flowy_langgraph"]
)
def test_public_api_is_fully_typed(package: str) -> None:
    """``pyright --verifytypes`` finds no missing or partially unknown public types, in
    flowy and in each store adapter (type completeness score 100%).

    The JSON ``summary.errorCount`` does not count per-symbol diagnostics, so the symbol
    diagnostics and the exit status are checked as well.
    """
    pyright = Path(sys.executable).parent / "pyright"
    if not pyright.exists():
        pytest.skip(f"pyright is not installed next to the interpreter ({pyright}).")
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed in this environment.")
    repo = Path(__file__).resolve().parents[3]
    out = subprocess.run(
        [
            str(pyright),
            "--pythonpath",
            sys.executable,
            "--verifytypes",
            package,
            "--ignoreexternal",
            "--outputjson",
        ],
        capture_output=True,
        text=True,
        cwd=repo,
        timeout=300,
        check=False,
        # --verifytypes finds packages through the `python` on PATH: this one's.
        env={
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        },
    )
    report = json.loads(out.stdout)
    problems = [
        f"{symbol['name']}: {diag['message']}"
        for symbol in report["typeCompleteness"]["symbols"]
        for diag in symbol["diagnostics"]
        if diag["severity"] == "error"
    ]
    assert report["summary"]["errorCount"] == 0, report["summary"]
    assert problems == [], "\n".join(problems)
    score = report["typeCompleteness"]["completenessScore"]
    assert score == 1, f"{package}: type completeness score {score:.1%}"
    assert out.returncode == 0, out.stderr
