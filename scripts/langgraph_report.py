"""The flowy-langgraph README's conformance table, from the JSON lines the conformance
test writes (one per store) when ``FLOWY_LANGGRAPH_REPORT`` names a file:

    FLOWY_LANGGRAPH_REPORT=report.jsonl FLOWY_REQUIRE_BACKENDS=1 \\
        .venv/bin/pytest packages/flowy-langgraph/tests/test_conformance.py
    .venv/bin/python scripts/langgraph_report.py report.jsonl
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

NAMES = {
    "memory": "memory",
    "sqlite": "SQLite",
    "postgres": "PostgreSQL",
    "redis": "Redis",
    "dynamodb": "DynamoDB",
}
CAPABILITIES = (
    "put",
    "put_writes",
    "get_tuple",
    "list",
    "delete_thread",
    "copy_thread",
    "delete_for_runs",
    "prune",
)


def cell(result: dict[str, Any] | None) -> str:
    if result is None or not result["detected"]:
        return "not detected"
    ran = result["tests_passed"] + result["tests_failed"]
    mark = "✅" if result["passed"] is True else "❌"
    return f"{mark} {result['tests_passed']}/{ran}"


def table(lines: list[dict[str, Any]]) -> str:
    out = [
        "| store | " + " | ".join(CAPABILITIES) + " | spec tests | level |",
        "| --- | " + " | ".join("---" for _ in CAPABILITIES) + " | --- | --- |",
    ]
    for line in lines:
        results: dict[str, Any] = line["results"]
        passed = sum(r["tests_passed"] for r in results.values())
        total = passed + sum(r["tests_failed"] for r in results.values())
        cells = " | ".join(cell(results.get(c)) for c in CAPABILITIES)
        name = NAMES.get(line["store"], line["store"])
        out.append(f"| {name} | {cells} | {passed}/{total} | {line['conformance_level']} |")
    return "\n".join(out)


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: langgraph_report.py REPORT.jsonl", file=sys.stderr)
        return 2
    path = Path(sys.argv[1])
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        print(f"langgraph_report.py: cannot read {path}: {exc.strerror}", file=sys.stderr)
        return 2
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    print(table(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
