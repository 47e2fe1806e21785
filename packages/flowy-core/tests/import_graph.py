"""The import graph of a package, read from its source with ``ast``, and its cycles.

One mechanism for every package of the workspace: ``test_public_api`` checks core's layers
with it and ``tests/test_import_cycles.py`` checks that no package has a cycle.

What counts as an edge ``a → b`` (``b`` a module of the same package):

- ``import pkg.b``, ``from pkg.b import x``, ``from .b import x``, ``from ..b import x``;
- ``from pkg import b`` / ``from . import b`` when ``b`` is a submodule: an edge to that
  submodule; ``from pkg.sub import name`` where ``name`` is not a module: an edge to
  ``pkg.sub`` (the longest prefix that is a module);
- imports under ``if TYPE_CHECKING:``: a type-only cycle still ties the two modules
  together, for a reader and for the type checker;
- imports inside functions: a lazy import only moves a cycle from import time to call
  time, so it is still one;
- ``importlib.import_module("pkg.b")`` with a literal name, for the same reason.

Not an edge: the implicit import of a parent package (``import pkg.sub.b`` runs
``pkg/sub/__init__.py`` first). A package's ``__init__`` re-exports its submodules, so
counting it would make every package a cycle of itself, and no module chooses it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path


def module_name(path: Path, src: Path) -> str:
    """``<src>/storage/_base.py`` → ``flowy.storage._base``; an ``__init__.py`` → its package.

    ``src`` is the package directory itself (``.../src/flowy``).
    """
    parts = [src.name, *path.relative_to(src).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(tree: ast.AST, package: str) -> Iterator[tuple[str, list[str]]]:
    """``(origin, names)`` for each import: ``from origin import names`` (relative origins
    resolved against ``package``); ``import x.y`` and ``import_module("x.y")`` give
    ``("x.y", [])``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join([*base, node.module] if node.module else base)
            else:
                origin = node.module or ""
            yield origin, [alias.name for alias in node.names]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
            == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.args[0].value, []


def imports_of(path: Path, src: Path, modules: set[str]) -> set[str]:
    """The modules among ``modules`` that the module at ``path`` imports."""
    me = module_name(path, src)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]

    def longest_module(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    found: set[str] = set()
    for origin, names in _imports(ast.parse(path.read_text(), str(path)), package):
        for name in names or [""]:
            submodule = f"{origin}.{name}"
            found.add(submodule if name and submodule in modules else longest_module(origin))
    found.discard("")
    return found


def module_graph(src: Path) -> dict[str, set[str]]:
    """Every module of the package at ``src`` → the modules of that package it imports."""
    paths = {module_name(p, src): p for p in sorted(src.rglob("*.py"))}
    modules = set(paths)
    return {name: imports_of(path, src, modules) for name, path in paths.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle of ``graph``: its strongly connected components of more than one module,
    and the modules that import themselves, each sorted, in a sorted list (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(cycles)
