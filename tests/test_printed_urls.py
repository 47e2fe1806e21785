"""No code shown or shipped prints a store URL as given: a URL may carry a password, so
whatever prints or logs one shows ``redact_url(url)`` (or a label made from it).

The scan covers the guides and the README (their code blocks are what users copy), the
examples and every package's source. A process-level check of the same promise runs the
example worker and the CLI on a URL with a planted password (``test_first_app.py``,
``packages/flowy-core/tests/test_cli_stores.py``).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# A call that prints or logs, and a URL among what it shows.
OUTPUT_CALL = re.compile(
    r"\b(print|echo|line|write|debug|info|warning|warn|error|exception|critical|log)\("
)
URL_SHOWN = re.compile(r"\{[^{}]*\burl\b[^{}]*\}|,\s*[\w.]*\burl\b\s*[,)]", re.I)
SAFE = re.compile(r"redact|label|\.path\b")


def _files() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    files += sorted((ROOT / "examples").rglob("*.py"))
    files += sorted(ROOT.glob("packages/*/src/**/*.py"))
    return [f for f in files if f.name != "api.md"]  # api.md: docstrings, scanned at source


def unredacted_urls(text: str) -> list[str]:
    """The lines of ``text`` that print or log a URL without redacting it."""
    return [
        line.strip()
        for line in text.splitlines()
        if OUTPUT_CALL.search(line) and URL_SHOWN.search(line) and not SAFE.search(line)
    ]


def test_the_scan_finds_a_printed_url() -> None:
    assert unredacted_urls('    print(f"worker on {backend.url}: waiting")')
    assert unredacted_urls('log.info("opened %s", backend.url)')
    assert not unredacted_urls('    print(f"worker on {redact_url(backend.url)}")')
    assert not unredacted_urls('print(f"worker on {where}")')


def test_nothing_prints_or_logs_a_url_unredacted() -> None:
    found = {
        f"{path.relative_to(ROOT)}: {line}"
        for path in _files()
        for line in unredacted_urls(path.read_text(encoding="utf-8"))
    }
    assert not found, "\n".join(sorted(found))
