"""Reading the command line: the value types of options, ``MODULE:ATTR`` objects (graphs,
codecs), resume targets and ``--overlay`` JSON.

Every problem becomes a :class:`CliError` carrying its exit status: 2 when the command
line is wrong, 1 when the operation failed. Numbers are bounded here, so an absurd value
is a usage error instead of an overflow deep inside a store.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import shlex
import sys
import typing
from typing import Any, cast

from .._errors import GraphValidationError
from .._graph import Graph
from ..storage import ResumeToken, StateCodec
from ..storage._codecs import codec_for_type
from ._render import clean

__all__ = [
    "MAX_COUNT",
    "MAX_REVISION",
    "MAX_SECONDS",
    "CliError",
    "concurrency",
    "count",
    "load_codec",
    "load_graph",
    "load_object",
    "one_line",
    "parse_overlay",
    "positive_seconds",
    "seed",
    "quote",
    "resume_token",
    "revision",
    "seconds",
]

MAX_COUNT = 1_000_000
"""The largest ``--limit`` (threads, revisions, dead letters) a command accepts."""

MAX_REVISION = 2**63 - 1
"""The largest revision any store can hold (a signed 64-bit integer)."""

MAX_SECONDS = 366 * 24 * 3600.0
"""The longest duration an option accepts (the stores' own bound on ttl and delays)."""

MAX_CONCURRENCY = 1000
"""The most runs one ``flowy worker`` keeps in flight."""

MAX_OVERLAY_DEPTH = 100
"""How deeply an ``--overlay`` JSON value may nest."""


class CliError(Exception):
    """A user-facing failure: printed as one line; ``code`` is the exit status (2 for a
    usage error, 1 for an operational one)."""

    def __init__(self, message: str, code: int = 1, *, prog: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.prog = prog


def one_line(text: str) -> str:
    """``text`` on one line, safe for a terminal."""
    return clean(" ".join(text.split()))


def quote(value: object) -> str:
    """``value`` quoted for a POSIX shell (so a printed command can be pasted)."""
    return shlex.quote(str(value))


# ------------------------------------------------------------------- option values


def _whole(text: str, low: int, high: int, what: str) -> int:
    digits = text.strip().removeprefix("-").removeprefix("+")
    if digits.isdecimal() and len(digits) > len(str(high)):  # too long to convert, too
        raise argparse.ArgumentTypeError(
            f"expected {what} from {low} to {high}, got {clean(text, 40)!r}"
        )
    try:
        value = int(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a whole number, got {clean(text, 40)!r}"
        ) from None
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(
            f"expected {what} from {low} to {high}, got {clean(text, 40)!r}"
        )
    return value


def count(text: str) -> int:
    """A ``--limit``: a whole number from 1 to ``MAX_COUNT``."""
    return _whole(text, 1, MAX_COUNT, "a whole number")


def seed(text: str) -> int:
    """``--seed``: a whole number from 0 to ``MAX_COUNT``."""
    return _whole(text, 0, MAX_COUNT, "a whole number")


def concurrency(text: str) -> int:
    """``--concurrency``: 1 to ``MAX_CONCURRENCY`` runs in flight."""
    return _whole(text, 1, MAX_CONCURRENCY, "a whole number")


def revision(text: str) -> int:
    """``--revision``: a revision a store can hold (1 to 2**63 - 1)."""
    return _whole(text, 1, MAX_REVISION, "a revision")


def after_revision(text: str) -> int:
    """``--after``: a revision to start after (0 to 2**63 - 1; 0: from the first)."""
    return _whole(text, 0, MAX_REVISION, "a revision")


def _seconds(text: str, *, allow_zero: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number of seconds, got {clean(text, 40)!r}"
        ) from None
    low_ok = value >= 0 if allow_zero else value > 0
    if math.isnan(value) or not low_ok or value > MAX_SECONDS:
        bound = ">= 0" if allow_zero else "> 0"
        raise argparse.ArgumentTypeError(
            f"expected seconds {bound} and at most {MAX_SECONDS:.0f} (a year), "
            f"got {clean(text, 40)!r}"
        )
    return value


def seconds(text: str) -> float:
    """A duration in seconds, 0 allowed."""
    return _seconds(text, allow_zero=True)


def positive_seconds(text: str) -> float:
    """A duration in seconds, more than 0."""
    return _seconds(text, allow_zero=False)


def resume_token(thread: str, revision: int | None) -> ResumeToken:
    """The token ``flowy resume`` resumes: ``THREAD --revision N``, or ``THREAD`` printed
    as a resume token (``THREAD@N``)."""
    if revision is not None:
        return ResumeToken(thread, revision)
    try:
        token = ResumeToken.parse(thread)
    except ValueError as exc:
        if "@" not in thread:
            raise CliError(
                f"give the revision to resume: {clean(thread, 80)!r} --revision N, or the "
                "resume token `flowy show` prints (THREAD@N)",
                2,
            ) from None
        raise CliError(f"{exc}; give THREAD@N, or THREAD --revision N", 2) from None
    if token.snapshot_revision > MAX_REVISION:
        raise CliError(f"the revision of {clean(thread, 80)!r} is out of range", 2)
    return token


def _depth(value: object, limit: int) -> int:
    """How deeply ``value`` nests (iteratively, so any depth is measured safely)."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if deepest > limit:
            break
        if isinstance(item, dict):
            stack.extend((v, level + 1) for v in cast(dict[str, object], item).values())
        elif isinstance(item, list):
            stack.extend((v, level + 1) for v in cast(list[object], item))
    return deepest


def _json_int(text: str) -> int:
    limit = sys.get_int_max_str_digits() or None
    digits = len(text.lstrip("-"))
    if limit is not None and digits > limit:
        raise _OutOfRange(f"an integer of {digits} digits (at most {limit})")
    return int(text)


def _json_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _OutOfRange(f"the number {clean(text, 40)} (too large for a float)")
    return value


def _json_constant(name: str) -> Any:
    raise _OutOfRange(f"{name} (not a JSON number)")


class _OutOfRange(ValueError):
    """A number JSON allows but no store can hold: refused while parsing."""


def parse_json(text: str, option: str) -> Any:
    """The JSON value of a command-line ``option`` (a usage error if it is not one, or
    if it holds a number out of range: NaN, an infinity, a float too large, an integer
    of more digits than Python converts)."""
    try:
        value = json.loads(
            text, parse_int=_json_int, parse_float=_json_float, parse_constant=_json_constant
        )
    except json.JSONDecodeError as exc:
        raise CliError(f"{option} is not valid JSON ({exc}): {clean(text, 60)!r}", 2) from None
    except _OutOfRange as exc:
        raise CliError(f"{option} holds a number out of range: {exc}", 2) from None
    except RecursionError:
        raise CliError(
            f"{option} nests too deeply (at most {MAX_OVERLAY_DEPTH} levels)", 2
        ) from None
    if _depth(value, MAX_OVERLAY_DEPTH) > MAX_OVERLAY_DEPTH:
        raise CliError(f"{option} nests too deeply (at most {MAX_OVERLAY_DEPTH} levels)", 2)
    return value


def parse_overlay(text: str | None, codec: StateCodec[Any] | None = None) -> Any:
    """The ``--overlay`` JSON value (``None`` when not given). A JSON object names fields:
    the runner merges them into the stored state one by one and validates the result. Any
    other value is decoded by ``codec`` when states are typed (so the graph's reducer gets
    a value of its state type)."""
    if text is None:
        return None
    value = parse_json(text, "--overlay")
    if codec is None:
        return value
    if isinstance(value, dict):  # fields: merged into the stored state by the runner
        return cast(dict[str, Any], value)
    try:
        return codec.decode(text.encode("utf-8", "surrogatepass"))
    except (TypeError, ValueError) as exc:
        raise CliError(
            f"--overlay does not fit the state type ({one_line(str(exc))}): {clean(text, 60)!r}",
            2,
        ) from None


# ---------------------------------------------------------------- loading objects


def load_object(spec: str, option: str) -> object:
    """Import ``package.module:attribute`` (the current directory is importable).

    Raises a usage ``CliError`` naming ``option`` when it cannot be loaded.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name.strip() or not attr.strip():
        raise CliError(f"{option} {spec!r} must look like 'package.module:attribute'", 2)
    cwd = os.getcwd()
    if "" not in sys.path and cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or module_name
        if module_name == missing or module_name.startswith(missing + "."):
            raise CliError(
                f"{option} {spec!r}: no module named {missing!r} (is it installed, or in "
                "the current directory?)",
                2,
            ) from exc
        raise CliError(
            f"{option} {spec!r}: importing {module_name!r} failed: {one_line(str(exc))}", 2
        ) from exc
    except Exception as exc:
        raise CliError(
            f"{option} {spec!r}: importing {module_name!r} failed: "
            f"{type(exc).__name__}: {one_line(str(exc))}",
            2,
        ) from exc
    obj: object = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise CliError(
                f"{option} {spec!r}: module {module_name!r} has no attribute {attr!r}", 2
            ) from None
    return obj


def _call(obj: object, spec: str, option: str) -> object:
    if not callable(obj):
        return obj
    try:
        return obj()
    except GraphValidationError as exc:
        raise CliError(
            f"{option} {spec!r}: the graph is invalid: " + "; ".join(exc.problems), 2
        ) from exc
    except Exception as exc:
        raise CliError(
            f"{option} {spec!r}: calling it failed: {type(exc).__name__}: {one_line(str(exc))}",
            2,
        ) from exc


def load_graph(spec: str) -> Graph[Any, Any]:
    """The ``flowy.Graph`` named by ``spec``: a graph object, or a function called with
    no arguments that returns one."""
    obj = load_object(spec, "--graph")
    called = False
    if not isinstance(obj, Graph) and callable(obj):
        called = True
        obj = _call(obj, spec, "--graph")
    if not isinstance(obj, Graph):
        what = "returned" if called else "is"
        raise CliError(
            f"--graph {spec!r} {what} a {type(obj).__name__}, not a flowy.Graph (give a "
            "graph, or a function that takes no arguments and returns one)",
            2,
        )
    return cast(Graph[Any, Any], obj)


def _is_state_type(obj: object) -> bool:
    """A class (or typed alias such as ``list[Item]``) that states decode into, rather
    than a codec class."""
    if typing.get_origin(obj) is not None:
        return True
    return isinstance(obj, type) and not isinstance(obj, StateCodec)


def load_codec(spec: str) -> StateCodec[Any]:
    """The state codec named by ``spec``: a codec object, a codec class or factory, or a
    state class (a dataclass, a TypedDict, …) that ``JSONCodec`` decodes states into
    (``PydanticCodec`` for a pydantic model)."""
    obj = load_object(spec, "--codec")
    if _is_state_type(obj):
        return codec_for_type(obj)
    if isinstance(obj, type) or not isinstance(obj, StateCodec):
        obj = _call(obj, spec, "--codec")
    if isinstance(obj, type) or not isinstance(obj, StateCodec):
        raise CliError(
            f"--codec {spec!r} gave a {type(obj).__name__}, not a state codec (give a "
            "codec with name, encode and decode, a function or class making one, or the "
            "state class to decode into)",
            2,
        )
    return cast(StateCodec[Any], obj)
