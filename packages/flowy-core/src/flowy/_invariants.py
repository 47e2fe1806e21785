"""``@flowy.invariant``: a named property of a graph's state that must hold after every
step. A run checks one with ``invariant_validator=``; ``flowy.testing.check`` checks
every one it is given (or finds in the scenario's module) on every saved snapshot of
every faulty run."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Generic

from ._types import S

__all__ = ["Invariant", "invariant"]


class Invariant(Generic[S]):
    """A property of the state: calling it with a state raises ``AssertionError`` when
    the property is false (the function returned ``False`` or raised one itself)."""

    def __init__(self, check: Callable[[S], object]) -> None:
        self.check = check
        self.name: str = getattr(check, "__name__", None) or repr(check)
        functools.update_wrapper(self, check)

    def __call__(self, state: S) -> None:
        if self.check(state) is False:
            raise AssertionError(f"invariant {self.name} does not hold")

    def __repr__(self) -> str:
        return f"<flowy invariant {self.name}>"


def invariant(check: Callable[[S], object]) -> Invariant[S]:
    """Declare ``check(state)`` an invariant of a graph's state.

    The function returns ``False`` (or raises ``AssertionError``) when the property does
    not hold; anything else means it holds. The result is callable with a state, so it
    also serves as a run's ``invariant_validator``::

        @flowy.invariant
        def refunds_never_exceed_the_payment(state: dict) -> bool:
            return state.get("refunded", 0) <= state["paid"]

    Args:
        check: the property, over one state.

    Returns:
        The invariant (raises ``AssertionError`` when called with a state that breaks it).
    """
    if not callable(check):
        raise TypeError(f"flowy.invariant needs a function of the state, got {check!r:.100}")
    return Invariant(check)


def is_invariant(value: Any) -> bool:
    """Whether ``value`` was made by :func:`invariant`."""
    return isinstance(value, Invariant)
