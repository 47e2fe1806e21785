r"""Terminal output of the ``flowy`` command and its demo.

Owns colour (ANSI only on a terminal, never with ``NO_COLOR``), symbols with an ASCII
fallback for streams that cannot encode them, aligned tables, time formatting, JSON and
the one-line renderings of run events and run results. Standard library only.

Nothing read from a store reaches the terminal raw: thread ids, reasons, pointers and
state values may hold escape sequences (ANSI, OSC), C1 controls or bidirectional
overrides, and every line is written with those shown escaped (``\x1b``, ``\u202e``).
JSON output escapes them the JSON way, so it still parses to the exact values.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TextIO, cast

from .._events import EventType, RunEvent
from .._graph import Graph
from .._results import RunResult
from ..storage import RunStatus
from ..storage._codecs import is_pydantic_model

__all__ = [
    "ColorMode",
    "Console",
    "EventPrinter",
    "clean",
    "color_enabled",
    "compact_json",
    "console",
    "effect_text",
    "fmt_time",
    "main_path",
    "pretty_json",
    "result_line",
    "safe_line",
    "set_console",
]

ColorMode = Literal["auto", "always", "never"]

_CODES = {
    "bold": "1",
    "dim": "2",
    "red": "31",
    "green": "32",
    "yellow": "33",
    "blue": "34",
    "magenta": "35",
    "cyan": "36",
}

_UNICODE = {
    "start": "▸",
    "ok": "✓",
    "fail": "✗",
    "pause": "⏸",
    "handoff": "⇢",
    "effect": "⚡",
    "claim": "⇣",
    "retry": "↺",
    "arrow": "→",
    "bar": "│",
    "dot": "·",
    "say": "›",
    "crash": "✸",
    "wait": "…",
}
_ASCII = {
    "start": ">",
    "ok": "+",
    "fail": "x",
    "pause": "||",
    "handoff": "=>",
    "effect": "*",
    "claim": "<=",
    "retry": "~",
    "arrow": "->",
    "bar": "|",
    "dot": "-",
    "say": ">",
    "crash": "!!",
    "wait": "...",
}

_STATUS_COLORS = {
    RunStatus.COMPLETED: "green",
    RunStatus.FAILED: "red",
    RunStatus.SUSPENDED: "yellow",
    RunStatus.WAITING: "yellow",
    RunStatus.HANDOFF: "cyan",
    RunStatus.RUNNING: "blue",
    RunStatus.CANCELED: "magenta",
}


def color_enabled(mode: ColorMode, stream: TextIO) -> bool:
    """Whether to write ANSI colour to ``stream``.

    ``always`` and ``never`` decide; ``auto`` colours only a terminal, and only when
    ``NO_COLOR`` is unset (or empty) and ``TERM`` is not ``dumb``.
    """
    if mode == "always":
        return True
    if mode == "never" or os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _can_encode(stream: TextIO, text: str) -> bool:
    encoding = getattr(stream, "encoding", None) or "ascii"
    try:
        text.encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def clean(text: str, limit: int | None = None) -> str:
    """``text`` made safe for one terminal line: control, format and other non-printable
    characters (escape sequences, C1 controls, bidi overrides, newlines) shown escaped,
    and cut to ``limit`` characters with an ellipsis."""
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    if limit is not None and len(text) > limit:
        text = text[: max(limit - 1, 1)] + "…"
    return text


_SGR = re.compile(r"\x1b\[[0-9;]*m")


def safe_line(text: str, *, allow_color: bool) -> str:
    """``text`` with every non-printable character escaped; with ``allow_color`` the
    colour sequences (SGR) this module paints are kept."""
    if text.isprintable():
        return text
    if not allow_color:
        return clean(text)
    parts: list[str] = []
    last = 0
    for match in _SGR.finditer(text):
        parts.append(clean(text[last : match.start()]))
        parts.append(match.group())
        last = match.end()
    parts.append(clean(text[last:]))
    return "".join(parts)


def fmt_time(timestamp: float | None) -> str:
    """Seconds since the epoch as local ``YYYY-MM-DD HH:MM:SS`` (``-`` when unset)."""
    if not timestamp:
        return "-"
    try:
        return dt.datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):
        return str(timestamp)


def _jsonable(value: object) -> object:
    if isinstance(value, enum.Enum):
        return cast(object, value.value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if is_pydantic_model(type(value)):
        return cast(Any, value).model_dump(mode="json", round_trip=True)
    if isinstance(value, set | frozenset | tuple):
        return list(cast(Any, value))
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return str(value)


def _json_escape(char: str) -> str:
    code = ord(char)
    if code > 0xFFFF:
        code -= 0x10000
        return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
    return f"\\u{code:04x}"


def _printable_json(text: str, keep: str = "") -> str:
    # Outside strings JSON text is structure and whitespace only, so every non-printable
    # character here sits inside a string, where a \u escape stands for it exactly.
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in keep else _json_escape(c) for c in text)


def compact_json(value: object, limit: int | None = None) -> str:
    """``value`` as one line of JSON (anything unknown as its ``str``), cut to ``limit``."""
    text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=_jsonable)
    return clean(_printable_json(text), limit)


def pretty_json(value: object) -> str:
    r"""``value`` as indented JSON (anything unknown as its ``str``); non-printable
    characters in strings are ``\u`` escapes, so the text is safe on a terminal and
    parses back to the same values."""
    text = json.dumps(value, ensure_ascii=False, indent=2, default=_jsonable)
    return _printable_json(text, keep="\n")


class Console:
    """Writes lines to a stream, with optional colour and Unicode symbols.

    Every line is flushed at once, so output read through a pipe arrives live.
    """

    def __init__(self, stream: TextIO | None = None, *, color: bool = False) -> None:
        self.stream: TextIO = stream if stream is not None else sys.stdout
        self.color = color
        self.unicode: bool = _can_encode(self.stream, "".join(_UNICODE.values()) + "…")

    @classmethod
    def for_stream(cls, stream: TextIO, mode: ColorMode = "auto") -> Console:
        """A console on ``stream`` with colour decided by ``mode``."""
        return cls(stream, color=color_enabled(mode, stream))

    def line(self, text: str = "") -> None:
        """Write ``text`` and a newline, and flush. Non-printable characters are shown
        escaped (the colour this console paints excepted)."""
        text = safe_line(text, allow_color=self.color)
        if not self.unicode:
            text = text.encode("ascii", "replace").decode("ascii")
        self.stream.write(text + "\n")
        self.stream.flush()

    def block(self, text: str) -> None:
        """Write each line of ``text`` with :meth:`line`."""
        for line in text.split("\n"):
            self.line(line)

    @property
    def interactive(self) -> bool:
        """True when the stream is a terminal (lines may be redrawn in place)."""
        try:
            return self.stream.isatty()
        except (AttributeError, ValueError):
            return False

    def redraw(self, text: str) -> None:
        """Replace the current terminal line with ``text`` (no newline); only for an
        :attr:`interactive` console."""
        text = safe_line(text, allow_color=self.color)
        if not self.unicode:
            text = text.encode("ascii", "replace").decode("ascii")
        self.stream.write("\r\x1b[2K" + text)
        self.stream.flush()

    def sym(self, name: str) -> str:
        """The symbol ``name`` (Unicode, or ASCII when the stream cannot encode it)."""
        return (_UNICODE if self.unicode else _ASCII)[name]

    def paint(self, text: str, *styles: str) -> str:
        """``text`` in the given styles (``bold``, ``dim``, ``red``, …) when colour is on."""
        if not self.color or not styles or not text:
            return text
        codes = ";".join(_CODES[s] for s in styles)
        return f"\x1b[{codes}m{text}\x1b[0m"

    def status(self, status: RunStatus | str, text: str | None = None) -> str:
        """``text`` (default: the status) in the colour of ``status``."""
        try:
            color = _STATUS_COLORS[RunStatus(status)]
        except ValueError:
            color = "bold"
        return self.paint(text if text is not None else str(status), color)

    def table(
        self,
        headers: Sequence[str],
        rows: Sequence[Sequence[str]],
        *,
        indent: str = "",
        styler: Callable[[int, str, str], str] | None = None,
    ) -> None:
        """Write an aligned table. ``styler(column, value, padded)`` may colour a cell."""
        widths = [len(h) for h in headers]
        for row in rows:
            for i, cell in enumerate(row):
                widths[i] = max(widths[i], len(cell))
        last = len(headers) - 1
        head = "  ".join(h if i == last else h.ljust(widths[i]) for i, h in enumerate(headers))
        self.line(indent + self.paint(head, "bold"))
        for row in rows:
            cells: list[str] = []
            for i, cell in enumerate(row):
                padded = cell if i == last else cell.ljust(widths[i])
                cells.append(styler(i, cell, padded) if styler is not None else padded)
            self.line(indent + "  ".join(cells).rstrip())


_current: list[Console] = []


def console() -> Console:
    """The console the command is writing to (standard output by default)."""
    if not _current:
        _current.append(Console.for_stream(sys.stdout))
    return _current[-1]


def set_console(value: Console) -> None:
    """Make ``value`` the console of :func:`console`."""
    _current[:] = [value]


def effect_text(out: Console, effect: object) -> str:
    """One effect: its ``kind`` in bold, then the rest as compact JSON."""
    if isinstance(effect, Mapping):
        items = dict(cast(Mapping[str, Any], effect))
        kind = items.pop("kind", None)
        rest = compact_json(items, 110) if items else ""
        if kind is not None:
            return f"{out.paint(str(kind), 'bold')} {rest}".rstrip()
        return rest
    return compact_json(effect, 120)


def main_path(graph: Graph[Any, Any]) -> list[str]:
    """The nodes reached from the entry by plain edges, in order (the graph's "happy
    path"; it stops at a router, a terminal node or a loop)."""
    path: list[str] = []
    node: str | None = graph.entry
    while node is not None and node not in path:
        path.append(node)
        node = graph.edges.get(node)
    return path


class EventPrinter:
    """Prints the events of a run as they stream: one line per node started (with its
    place on the graph's main path) and per effect. Terminal events are left to
    :func:`result_line`, which has the revision."""

    def __init__(
        self,
        out: Console,
        *,
        indent: str = "  ",
        label: str = "",
        path: Sequence[str] = (),
    ) -> None:
        self.out = out
        self.indent = indent
        self.label = label
        self.path = list(path)
        self.width = max((len(name) for name in self.path), default=0)

    def _progress(self, node: str) -> str:
        if node not in self.path:
            return ""
        done = self.path.index(node) + 1
        total = len(self.path)
        full, empty = ("■", "□") if self.out.unicode else ("#", "-")
        bar = full * done + empty * (total - done)
        return " " * (self.width - len(node) + 2) + self.out.paint(f"{bar} {done}/{total}", "dim")

    def event(self, event: RunEvent[Any, Any]) -> None:
        """Print ``event`` if it is a progress event."""
        out = self.out
        prefix = self.indent + (f"[{clean(self.label, 40)}] " if self.label else "")
        if event.type is EventType.NODE_STARTED:
            out.line(
                f"{prefix}{out.paint(out.sym('start'), 'cyan')} "
                f"{out.paint(f'step {event.step}', 'dim')}  {out.paint(clean(event.node), 'bold')}"
                + self._progress(event.node)
            )
        elif event.type is EventType.EFFECT:
            out.line(
                f"{prefix}    {out.paint(out.sym('effect'), 'magenta')} effect "
                f"{effect_text(out, event.effect)}"
            )
        elif event.type is EventType.CHECKPOINT_FAILED:
            out.line(
                f"{prefix}{out.paint('! checkpoint skipped', 'yellow')} ({clean(event.reason)}) "
                f"at {clean(event.execution_pointer)}"
            )


def result_line(out: Console, result: RunResult[Any, Any]) -> str:
    """One line saying how a run segment ended: status, reason, pointer, revision and
    the resume token when there is one."""
    status = result.status
    dot = out.paint(out.sym("dot"), "dim")
    symbol = {
        RunStatus.COMPLETED: "ok",
        RunStatus.FAILED: "fail",
        RunStatus.SUSPENDED: "pause",
        RunStatus.WAITING: "wait",
        RunStatus.HANDOFF: "handoff",
        RunStatus.CANCELED: "pause",
        RunStatus.RUNNING: "start",
    }[status]
    word = "handed off" if status is RunStatus.HANDOFF else status.value
    parts = [
        f"{out.status(status, out.sym(symbol) + ' ' + word)} ({clean(result.reason, 60)})",
        f"at {clean(result.execution_pointer, 40)}",
        f"revision {result.revision}",
    ]
    if status is RunStatus.HANDOFF:
        parts.append(f"hand-off {result.handoff_status.value}")
    if result.resume_token is not None:
        parts.append(f"resume token {out.paint(clean(str(result.resume_token), 60), 'bold')}")
    text = f" {dot} ".join(parts)
    if result.error is not None:
        text += f" {dot} {out.paint(type(result.error).__name__, 'red')}: " + clean(
            " ".join(str(result.error).split()), 160
        )
    return text
