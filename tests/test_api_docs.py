"""Docs for every public option: each parameter, field and enum member of the public
modules is documented, and ``docs/api.md`` (``scripts/api_reference.py``) is current.

What counts as documented (``api_reference.find_gaps``):

- a parameter (not ``self``/``cls``, not ``_private``, not a Protocol method's
  ``*args``/``**kwargs``) is named in its function's docstring, as an ``Args:`` item or
  in double backticks; for a class, in the class or ``__init__`` docstring; for a method,
  in its own docstring or that of the method it overrides anywhere up the MRO;
- a field of a dataclass, NamedTuple, TypedDict or msgspec Struct, and a member of an
  enum, has an attribute docstring (a string literal right after it) or is named in the
  class docstring the same way;
- every public name, method and property has a docstring (constants and type aliases
  an attribute docstring).
"""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "api_reference.py"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("api_reference", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while building
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


api = load_script()


def test_every_public_parameter_field_and_member_is_documented() -> None:
    gaps: list[str] = api.find_gaps(api.load())
    assert not gaps, (
        f"{len(gaps)} public names have undocumented parameters, fields or members "
        "(name them in the docstring: an Args: item or ``name``; fields and enum members "
        "may have an attribute docstring instead):\n" + "\n".join(gaps)
    )


def test_api_reference_is_up_to_date() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


FAKE = '''
"""A package to check the checker with."""

from __future__ import annotations

import dataclasses
import enum
from typing import Protocol

__all__ = [
    "LIMIT",
    "SIZE",
    "Base",
    "Child",
    "Color",
    "Plain",
    "Record",
    "Shape",
    "documented",
    "undocumented",
]

LIMIT = 10
"""The largest size."""

SIZE = 3


def documented(first: int, second: int, *, _private: int = 0) -> int:
    """Add.

    Args:
        first: a number.
        second: another.
    """
    return first + second


def undocumented(first: int, second: int, *rest: int, **options: int) -> None:
    """Use ``first`` only."""


@dataclasses.dataclass(frozen=True)
class Record:
    """A record with a ``named`` field."""

    named: int
    described: str = ""
    """Has an attribute docstring."""
    bare: float = 0.0


class Color(enum.Enum):
    """Colors; ``GREEN`` is named here."""

    RED = 1
    """Has an attribute docstring."""
    GREEN = 2
    BLUE = 3


class Plain:
    """Built from ``size``."""

    def __init__(self, size: int, depth: int) -> None:
        self.size = size

    @property
    def area(self) -> int:
        return self.size


class Base:
    """A base."""

    def run(self, steps: int) -> None:
        """Run ``steps`` steps."""


class Child(Base):
    """Overrides ``run`` without a docstring of its own."""

    def run(self, steps: int, extra: int = 0) -> None:
        pass


class Shape(Protocol):
    """What a shape has."""

    def scale(self, *args: float, **kwargs: float) -> None:
        """Scale it."""
'''


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[ModuleType]]:
    package = tmp_path / "apidocs_fake"
    package.mkdir()
    (package / "__init__.py").write_text(textwrap.dedent(FAKE))
    (package / "again.py").write_text(
        '"""Re-exports."""\n\nfrom . import Record as Record\n\n__all__ = ["Record"]\n'
    )
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    importlib.invalidate_caches()
    try:
        yield [importlib.import_module(name) for name in ("apidocs_fake", "apidocs_fake.again")]
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] == "apidocs_fake"]:
            del sys.modules[name]


def test_the_checker_reports_every_gap_at_once(fake: list[ModuleType]) -> None:
    assert api.find_gaps(fake) == [
        "apidocs_fake.SIZE: no docstring",
        "apidocs_fake.Child.run: extra",
        "apidocs_fake.Color: BLUE",
        "apidocs_fake.Plain: depth",
        "apidocs_fake.Plain.area: no docstring",
        "apidocs_fake.Record: bare",
        "apidocs_fake.undocumented: second, rest, options",
    ]


def test_the_reference_renders_attribute_docstrings_and_links_reexports(
    fake: list[ModuleType],
) -> None:
    text: str = api.render(fake)
    assert "- `described: str`: Has an attribute docstring." in text
    assert "- `RED = 1`: Has an attribute docstring." in text
    assert "LIMIT = 10\n```\n\nThe largest size." in text
    assert "- `first`: a number." in text  # an Args: item becomes a list item
    assert "### apidocs_fake.again.Record\n\nThe same object as [`apidocs_fake.Record`]" in text
    assert "0x" not in text and api.render(fake) == text


def test_check_fails_on_a_stale_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stale = tmp_path / "api.md"
    stale.write_text("# API reference\n")
    monkeypatch.setattr(api, "ROOT", tmp_path)
    monkeypatch.setattr(api, "OUTPUT", stale)
    assert api.main(["--check"]) == 1
    assert api.main([]) == 0
    assert api.main(["--check"]) == 0
