"""Deprecated: the 0.1 name of :mod:`flowy.cli.demo` (removed in 0.3).

``import flowy._demo`` warns once; every name read from it warns and resolves to the
same object in ``flowy.cli.demo``.
"""

from collections.abc import Callable
from typing import Any

from ._moved import moved_module

__getattr__: Callable[[str], Any] = moved_module("flowy._demo", "flowy.cli.demo")
