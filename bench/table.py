"""A Markdown table from the JSON of one or more ``bench/run.py --json FILE`` runs.

One file: the table ``make bench`` printed. Several: one line per row id, with each
run's flowy and baseline figures, its ratio and its verdict side by side; with
``--ratios``, each run's ratio (or figure, for a row without one) and verdict only (the
README's table across runs).

    uv run --frozen --all-packages python bench/table.py [--ratios] run1.json [run2.json ...]
"""

from __future__ import annotations

import json
import sys
from dataclasses import fields
from pathlib import Path

import _common as c


def load(path: Path) -> list[c.Row]:
    known = {f.name for f in fields(c.Row)}
    rows = json.loads(path.read_text())["rows"]
    return [c.Row(**{k: v for k, v in row.items() if k in known}) for row in rows]


def across(runs: list[list[c.Row]], ratios: bool) -> str:
    order: list[str] = []
    by_id: list[dict[str, c.Row]] = []
    for rows in runs:
        by_id.append({r.id: r for r in rows})
        order += [r.id for r in rows if r.id not in order]
    head = "| what | budget | " + " | ".join(f"run {i + 1}" for i in range(len(runs))) + " |"
    lines = [head, "|---|---|" + "---|" * len(runs)]
    for key in order:
        present = [run[key] for run in by_id if key in run]
        first = present[0]
        cells = []
        for run in by_id:
            row = run.get(key)
            if row is None:
                cells.append("")
            elif row.verdict.startswith(("skipped", "error")):
                cells.append(row.verdict)
            elif ratios:
                figure = row.flowy if row.ratio is None else f"{row.ratio:.2f}×"
                cells.append(f"{figure} {row.verdict}")
            else:
                ratio = "" if row.ratio is None else f" = {row.ratio:.2f}×"
                versus = f" vs {row.baseline}" if row.baseline else ""
                cells.append(f"{row.flowy}{versus}{ratio} ({row.verdict})")
        budget = next((r.budget for r in present if r.budget != "—"), "—")
        line = f"| {first.what} | {budget} | " + " | ".join(cells) + " |"
        lines.append(line.replace("\n", " "))
    return "\n".join(lines)


def main() -> None:
    ratios = "--ratios" in sys.argv[1:]
    paths = [Path(p) for p in sys.argv[1:] if p != "--ratios"]
    if not paths:
        raise SystemExit(__doc__)
    runs = [load(p) for p in paths]
    print(c.table(runs[0]) if len(runs) == 1 else across(runs, ratios))


if __name__ == "__main__":
    main()
