"""Deprecated: the 0.1 name of :mod:`flowy.storage` (removed in 0.3).

``import flowy.checkpoint`` warns once; every name read from it warns and resolves to
the same object in ``flowy.storage``.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

_MESSAGE = "flowy.checkpoint moved to flowy.storage; the old name goes away in flowy 0.3"

warnings.warn(_MESSAGE, DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> Any:
    """Resolve ``flowy.checkpoint.<name>`` as ``flowy.storage.<name>``, with a warning."""
    target = importlib.import_module("flowy.storage")
    if name.startswith("__") or not hasattr(target, name):
        raise AttributeError(f"module 'flowy.checkpoint' has no attribute {name!r}")
    warnings.warn(_MESSAGE, DeprecationWarning, stacklevel=2)
    return getattr(target, name)
