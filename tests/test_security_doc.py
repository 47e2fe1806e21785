"""SECURITY.md states defaults and limits; each number it gives is the code's.

A limit changed in the code without the page (or the other way round) fails here.
"""

# pyright: reportPrivateUsage=false, reportUnknownMemberType=false, reportUnknownArgumentType=false

from __future__ import annotations

import inspect
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import flowy
from flowy.storage import (
    _checks,
    _intents,
    _outbox,
    _records,
)
from flowy.storage._limits import MAX_DEPTH, MAX_TIMESTAMP, MAX_VALUE_BYTES, Limits
from flowy.storage._model import MAX_THREAD_ID_BYTES
from flowy_dynamodb import MAX_ITEM_BYTES, DynamoBackend
from flowy_dynamodb._backend import open_backend

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "SECURITY.md").read_text(encoding="utf-8")


def _row(first_cell: str) -> str:
    """The table row of SECURITY.md whose first cell starts with ``first_cell``."""
    rows = [line for line in PAGE.splitlines() if line.startswith(f"| {first_cell}")]
    assert len(rows) == 1, (first_cell, rows)
    return rows[0]


def _default(function: object, parameter: str) -> Any:
    """The default of ``parameter`` of ``function`` (a class: of its constructor)."""
    return inspect.signature(cast(Callable[..., object], function)).parameters[parameter].default


def _size(n: int) -> str:
    for unit, size in (("MiB", 1024 * 1024), ("KiB", 1024)):
        if n % size == 0:
            return f"{n // size} {unit}"
    return f"{n:,} bytes"


def test_the_dynamodb_clock_skew_default_is_the_codes() -> None:
    default = _default(DynamoBackend, "clock_skew")
    # The URL option's default, as the opener reads it.
    assert f'url.option("clock_skew", _skew, {default!r})' in inspect.getsource(open_backend)
    assert f"`clock_skew` margin (default {default:g} s)" in _row("DynamoDB")


def test_every_limit_in_the_table_is_the_codes() -> None:
    steps = _default(flowy.GraphBuilder.compile, "max_total_steps")
    expected = {
        "thread id": [_size(MAX_THREAD_ID_BYTES)],
        "lease owner": [f"{_checks.MAX_OWNER_CHARS:,} characters"],
        "lease time to live": [f"at most {_checks.MAX_LEASE_TTL / 86400:g} days"],
        "nesting of a state": [f"{MAX_DEPTH} levels"],
        "numbers in stored JSON": [f"{sys.int_info.default_max_str_digits:,} digits"],
        "stored times": [
            time.strftime("%Y-%m-%d", time.gmtime(MAX_TIMESTAMP)),
        ],
        "record header": [_size(_records.MAX_HEADER_BYTES)],
        "a sleep or wait timeout": [f"{Limits().max_sleep / 86400:g} days"],
        "signals pending per thread": [f"{Limits().max_pending_signals:,}"],
        "a signal / an activity journal entry": [
            _size(Limits().max_signal_bytes),
            _size(Limits().max_activity_bytes),
            _size(MAX_VALUE_BYTES),
        ],
        "hand-off intent": [
            _size(_intents.MAX_INTENT_BYTES),
            f"{_intents._MAX_DEPTH} levels",
        ],
        "a worker's stored error text": [f"{_outbox.MAX_ERROR_CHARS:,} characters"],
        "record size": [f"DynamoDB {MAX_ITEM_BYTES // 1024} KB"],
        "steps per run": [f"default {steps:,}"],
    }
    for what, numbers in expected.items():
        row = _row(what)
        for number in numbers:
            assert number in row, (what, number, row)
    # Every row of the table is checked above.
    table = PAGE.split("## Limits", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\| ([^|]+?) \|", table, re.M)
    rows = [w for w in listed if w != "What"]
    assert len(rows) == len(expected)
    assert all(any(w.startswith(what) for what in expected) for w in rows), rows
