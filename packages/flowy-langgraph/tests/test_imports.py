"""The saver is built on flowy's public store interface only: no adapter, no store
module, no private flowy module, no driver. A new flowy store gets it for free."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import flowy_langgraph

SRC = Path(flowy_langgraph.__file__).resolve().parent
ALLOWED_FLOWY = {"flowy", "flowy.errors", "flowy.storage"}
ALLOWED_OTHERS = ("langgraph.checkpoint.", "langchain_core.runnables", "__future__")


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_only_flowys_public_store_interface_and_langgraphs_base_are_imported() -> None:
    stdlib = sys.stdlib_module_names
    for path in SRC.glob("*.py"):
        for name in imported(path):
            top = name.split(".")[0]
            if top == "flowy":
                assert name in ALLOWED_FLOWY, (path.name, name)
            else:
                assert top in stdlib or name.startswith(ALLOWED_OTHERS), (path.name, name)
