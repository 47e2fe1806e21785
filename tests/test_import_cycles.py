"""No package of the workspace has an import cycle, type-only and lazy imports included.

The graph is read from the source by ``import_graph`` (``packages/flowy-core/tests``), which
says what counts as an import. Every package under ``packages/*/src`` is checked; there is
no list of exceptions.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from import_graph import import_cycles, module_graph

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(init.parent for init in ROOT.glob("packages/*/src/*/__init__.py"))


def test_every_package_is_checked() -> None:
    names = {src.name for src in PACKAGES}
    assert names == {"flowy", "flowy_postgres", "flowy_redis", "flowy_dynamodb", "flowy_langgraph"}


def describe(cycles: list[list[str]], graph: dict[str, set[str]]) -> list[str]:
    """Each cycle as its imports: ``a → b, b → a``, to say which import to move."""
    return [
        ", ".join(f"{a} → {b}" for a in cycle for b in sorted(graph[a]) if b in cycle)
        for cycle in cycles
    ]


@pytest.mark.parametrize("src", PACKAGES, ids=lambda src: src.name)
def test_no_import_cycles(src: Path) -> None:
    graph = module_graph(src)
    cycles = describe(import_cycles(graph), graph)
    assert not cycles, "import cycles (move a type or a helper down):\n" + "\n".join(cycles)


def test_the_graph_of_flowy_has_its_type_only_and_subpackage_imports() -> None:
    graph = module_graph(ROOT / "packages/flowy-core/src/flowy")
    assert "flowy._results" in graph["flowy._errors"]  # imported only under TYPE_CHECKING
    assert "flowy.storage._model" in graph["flowy.storage._base"]
    assert "flowy.storage" in graph["flowy.sqlite._store"]
    assert "flowy._moved" in graph["flowy._demo"]


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_every_kind_of_import_is_an_edge(tmp_path: Path) -> None:
    src = write(
        tmp_path / "pkg",
        {
            "__init__.py": "from ._a import A as A\n",
            "_a.py": (
                "from typing import TYPE_CHECKING\n"
                "import os\n"
                "if TYPE_CHECKING:\n"
                "    from ._b import B\n"
            ),
            "_b.py": "def f():\n    from . import _c\n",
            "_c.py": "from .sub import _d\nfrom .sub import D\n",
            "_e.py": "import pkg.sub._d\nfrom pkg import _a, __version__\n",
            "_f.py": "import importlib\nimportlib.import_module('pkg._e')\n",
            "sub/__init__.py": "from ._d import D as D\n",
            "sub/_d.py": "from .. import _a\nfrom ..sub import _d\nfrom .._b import f\n",
        },
    )
    graph = module_graph(src)
    assert graph == {
        "pkg": {"pkg._a"},
        "pkg._a": {"pkg._b"},  # type-only
        "pkg._b": {"pkg._c"},  # inside a function
        "pkg._c": {"pkg.sub._d", "pkg.sub"},  # a submodule by name; a name of the package
        "pkg._e": {"pkg.sub._d", "pkg._a", "pkg"},  # absolute; ``__version__`` is no module
        "pkg._f": {"pkg._e"},  # importlib with a literal name
        "pkg.sub": {"pkg.sub._d"},
        "pkg.sub._d": {"pkg._a", "pkg.sub._d", "pkg._b"},  # ``..``; itself through ``..sub``
    }
    # _a → _b → _c → sub._d → _a, and sub._d → _b: one cycle of five, pkg.sub included
    assert import_cycles(graph) == [["pkg._a", "pkg._b", "pkg._c", "pkg.sub", "pkg.sub._d"]]


def test_every_cycle_is_reported() -> None:
    graph = {
        "p": {"p.a"},
        "p.a": {"p.b"},
        "p.b": {"p.a", "p.c"},
        "p.c": {"p.d"},
        "p.d": {"p.e"},
        "p.e": {"p.c"},
        "p.f": {"p.f"},
        "p.g": {"p.a"},
    }
    cycles = import_cycles(graph)
    assert cycles == [["p.a", "p.b"], ["p.c", "p.d", "p.e"], ["p.f"]]
    assert describe(cycles, graph) == [
        "p.a → p.b, p.b → p.a",
        "p.c → p.d, p.d → p.e, p.e → p.c",
        "p.f → p.f",
    ]
    assert import_cycles({k: v for k, v in graph.items() if k in ("p", "p.g")}) == []
