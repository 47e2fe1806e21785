"""The public surface of ``flowy_postgres``."""

from __future__ import annotations

import subprocess
import sys

import flowy_postgres


def test_exports() -> None:
    assert flowy_postgres.__all__ == sorted(flowy_postgres.__all__)
    for name in flowy_postgres.__all__:
        obj = getattr(flowy_postgres, name)
        if isinstance(obj, type) or callable(obj):
            assert obj.__module__ == "flowy_postgres", name
            assert obj.__doc__, f"{name} has no docstring"


def test_import_does_not_load_sqlalchemy() -> None:
    code = "import sys, flowy_postgres; print('sqlalchemy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
