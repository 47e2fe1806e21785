"""Where public names are presented, and module names that moved (the old module keeps
importing, with a warning, until 0.3)."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from typing import Any


def moved_module(old: str, new: str) -> Callable[[str], Any]:
    """Warn that module ``old`` moved to ``new`` (called from ``old``'s body, so the
    warning comes with its import) and return the module ``__getattr__`` that resolves
    every name of ``old`` in ``new``, warning each time."""
    message = f"{old} moved to {new}; the old name goes away in flowy 0.3"
    warnings.warn(message, DeprecationWarning, stacklevel=3)

    def __getattr__(name: str) -> Any:
        target = importlib.import_module(new)
        if name.startswith("__") or not hasattr(target, name):
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        warnings.warn(message, DeprecationWarning, stacklevel=2)
        return getattr(target, name)

    return __getattr__


def present_as_public(
    module: str, namespace: MutableMapping[str, Any], names: Iterable[str], private: str
) -> None:
    """Make reprs and tracebacks of ``names`` say ``module.X`` instead of the private
    module (``__module__`` starting with ``private``) they are defined in.

    A package's ``__init__`` calls it last:
    ``present_as_public(__name__, globals(), __all__, "mypackage._")``.

    Args:
        module: the public module's name.
        namespace: the public module's globals, where ``names`` are found.
        names: the public names (its ``__all__``).
        private: the prefix of the private modules' names.
    """
    for name in names:
        obj = namespace[name]
        if getattr(obj, "__module__", "").startswith(private):
            try:
                obj.__module__ = module
            except (AttributeError, TypeError):
                pass


def deprecated_names(module: str, names: Mapping[str, tuple[str, str]]) -> Callable[[str], Any]:
    """The module ``__getattr__`` that still resolves names ``module`` no longer
    exports, each with a ``DeprecationWarning`` saying what to use instead.

    A package's ``__init__`` sets ``__getattr__ = deprecated_names(__name__, {...})``.

    Args:
        module: the module's name (``__name__``).
        names: for each old name, where it is now (``"package.module:attribute"``) and
            what to do instead (``"use PostgresConsumer"``).
    """

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        target, instead = names[name]
        warnings.warn(f"{module}.{name} is deprecated; {instead}", DeprecationWarning, 2)
        where, _, attribute = target.partition(":")
        return getattr(importlib.import_module(where), attribute)

    return __getattr__
