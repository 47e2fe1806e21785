"""Deprecated: the 0.1 name of :mod:`flowy.storage` (removed in 0.3).

``import flowy.checkpoint`` warns once; every name read from it warns and resolves to
the same object in ``flowy.storage``.
"""

from collections.abc import Callable
from typing import Any

from ._moved import moved_module

__getattr__: Callable[[str], Any] = moved_module("flowy.checkpoint", "flowy.storage")
