"""The installed version of flowy-core, read once from its distribution's metadata.

A module of its own, on the ground floor, so that ``flowy.otel`` and the command line
can name the version without importing the ``flowy`` facade above them.
"""

from __future__ import annotations

import importlib.metadata

__all__ = ["__version__"]

__version__: str = importlib.metadata.version("flowy-core")
