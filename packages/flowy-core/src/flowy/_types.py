"""Type variables and aliases shared by every module (imports nothing of ours)."""

from __future__ import annotations

from typing import TypeAlias, TypeVar

__all__ = ["JSON", "E", "S", "T"]

S = TypeVar("S")
"""The application's state type."""

E = TypeVar("E")
"""The application's effect type (``flowy.NoEffect`` when a graph has none)."""

T = TypeVar("T")

JSON: TypeAlias = "dict[str, JSON] | list[JSON] | str | int | float | bool | None"
"""A JSON value: what run metadata and stored headers may contain."""
