"""Deprecated: the 0.1 name of :mod:`flowy.cli.demo` (removed in 0.3).

``import flowy._demo`` warns once; every name read from it warns and resolves to the
same object in ``flowy.cli.demo``.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

_MESSAGE = "flowy._demo moved to flowy.cli.demo; the old name goes away in flowy 0.3"

warnings.warn(_MESSAGE, DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> Any:
    """Resolve ``flowy._demo.<name>`` as ``flowy.cli.demo.<name>``, with a warning."""
    target = importlib.import_module("flowy.cli.demo")
    if name.startswith("__") or not hasattr(target, name):
        raise AttributeError(f"module 'flowy._demo' has no attribute {name!r}")
    warnings.warn(_MESSAGE, DeprecationWarning, stacklevel=2)
    return getattr(target, name)
