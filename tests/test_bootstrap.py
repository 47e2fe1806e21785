"""A fresh clone bootstraps on Debian's externally managed Python.

The test clones the repository's committed HEAD into a temporary directory and runs the
README's commands there with a clean environment whose PATH holds ``/usr/bin`` and ``/bin``
only: ``python3`` is Debian's ``/usr/bin/python3`` (which refuses ``pip install`` under
PEP 668) and there is no ``uv``. ``make demo`` must install uv privately, run the demo on
flowy-core alone, and print follow-up commands that work as printed; ``make setup`` must
then build the full dev environment, and a later ``make demo`` must leave it whole.

It skips, with the reason, where ``/usr/bin/python3`` is absent or not externally managed —
unless ``FLOWY_REQUIRE_BOOTSTRAP=1`` (set by ``.ci/run``), where that fails instead. uv's and
pip's caches (under ``HOME``) are shared with the caller, so only a first run downloads.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SYSTEM_PYTHON = Path("/usr/bin/python3")
CLEAN_PATH = "/usr/bin:/bin"
TIMEOUT = 900
# Passed through to the clean environment: where caches and configuration live, and what
# the network needs (certificates, proxies, index settings). Nothing else leaks in: no
# VIRTUAL_ENV, no UV_* of an outer `uv run`, no MAKEFLAGS, no pyenv.
PASS_THROUGH = {
    "HOME", "USER", "LOGNAME", "TMPDIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY",
    "http_proxy", "https_proxy", "no_proxy", "all_proxy",
    "UV_CACHE_DIR", "UV_INDEX_URL", "UV_DEFAULT_INDEX", "UV_INDEX", "UV_EXTRA_INDEX_URL",
    "UV_NATIVE_TLS", "UV_HTTP_TIMEOUT",
}  # fmt: skip
DEV_IMPORTS = "import pytest, hypothesis, anyio, moto, testcontainers, msgspec"
ADAPTER_IMPORTS = "import flowy_postgres, flowy_redis, flowy_dynamodb"


@dataclass(frozen=True)
class Clone:
    path: Path
    env: dict[str, str]

    def run(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv,
            cwd=self.path,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )

    def make(self, *args: str) -> str:
        proc = self.run(["make", *args])
        assert proc.returncode == 0, (
            f"make {' '.join(args)} failed ({proc.returncode}):\n"
            f"{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"
        )
        return proc.stdout

    def python(self, code: str) -> subprocess.CompletedProcess[str]:
        return self.run([str(self.path / ".venv" / "bin" / "python"), "-c", code])


def not_managed_reason() -> str | None:
    """Why this machine cannot run the test, or None."""
    if not SYSTEM_PYTHON.is_file():
        return f"{SYSTEM_PYTHON} is absent"
    stdlib = subprocess.run(
        [str(SYSTEM_PYTHON), "-c", "import sysconfig; print(sysconfig.get_path('stdlib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not (Path(stdlib) / "EXTERNALLY-MANAGED").is_file():
        return f"{SYSTEM_PYTHON} is not externally managed (no {stdlib}/EXTERNALLY-MANAGED)"
    if shutil.which("uv", path=CLEAN_PATH) is not None:
        return f"a uv is installed in {CLEAN_PATH}, so PATH cannot be made free of uv"
    return None


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in PASS_THROUGH or k.startswith("PIP_")}
    env.update(
        PATH=CLEAN_PATH,
        LANG="C.UTF-8",
        NO_COLOR="1",
        # Build .venv on /usr/bin/python3 even if uv-managed interpreters exist here.
        UV_PYTHON_PREFERENCE="only-system",
    )
    return env


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clone]:
    reason = not_managed_reason()
    if reason is not None:
        if os.environ.get("FLOWY_REQUIRE_BOOTSTRAP") == "1":
            pytest.fail(f"{reason}; FLOWY_REQUIRE_BOOTSTRAP=1 requires this test to run")
        pytest.skip(reason)
    env = clean_env()
    assert shutil.which("python3", path=env["PATH"]) == str(SYSTEM_PYTHON)
    assert shutil.which("uv", path=env["PATH"]) is None
    # The guard against a false pass: this python3 really refuses a system-wide install.
    refused = subprocess.run(
        [str(SYSTEM_PYTHON), "-m", "pip", "install", "--dry-run", "uv"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert refused.returncode != 0, refused.stdout
    assert (
        "externally-managed-environment" in refused.stderr
        or "No module named pip" in refused.stderr
    ), refused.stderr

    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    path = tmp_path_factory.mktemp("clone") / "flowy"
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(ROOT), str(path)], check=True)
    subprocess.run(["git", "checkout", "--quiet", "--detach", head], cwd=path, check=True)
    yield Clone(path, env)
    # The full dev environment is ~500 MB when uv cannot hardlink from its cache.
    shutil.rmtree(path, ignore_errors=True)


def test_make_demo_on_an_externally_managed_python(clone: Clone) -> None:
    out = clone.make("demo", "DEMO_ARGS=--fast")
    assert (clone.path / ".tools" / "uv-venv" / "bin" / "uv").is_file(), out[:2000]
    cfg = (clone.path / ".venv" / "pyvenv.cfg").read_text()
    assert re.search(r"^home = /usr/bin$", cfg, re.M), cfg
    # The demo's environment holds flowy-core and nothing else.
    names = "sorted({d.metadata['Name'] for d in m.distributions()})"
    listed = clone.python(f"import importlib.metadata as m; print({names})")
    assert listed.stdout.strip() == "['flowy-core']", listed

    # The Makefile's follow-up commands work exactly as printed, from the repository root ...
    printed = [line.strip() for line in out.splitlines() if line.strip().startswith(".venv/bin/")]
    assert printed, out[-3000:]
    for command in printed:
        proc = clone.run(shlex.split(command))
        assert proc.returncode == 0 and proc.stdout.strip(), (command, proc.stderr)
    # ... and so do the demo's own `flowy ...` lines once .venv is activated, as it says.
    assert ". .venv/bin/activate" in out
    for command in re.findall(r"^ +(flowy [a-z-]+ .*)$", out, re.M):
        proc = clone.run(["bash", "-c", f". .venv/bin/activate && {command}"])
        assert proc.returncode == 0, (command, proc.stderr)


def test_make_setup_then_demo_keeps_the_dev_environment(clone: Clone) -> None:
    clone.make("setup")
    for tool in ("pytest", "ruff", "pyright"):
        assert (clone.path / ".venv" / "bin" / tool).is_file(), tool
    check = f"{DEV_IMPORTS}; {ADAPTER_IMPORTS}"
    assert clone.python(check).returncode == 0, clone.python(check).stderr
    clone.make("demo", "DEMO_ARGS=--fast")
    after = clone.python(check)
    assert after.returncode == 0, f"make demo broke the dev environment:\n{after.stderr}"
    assert (clone.path / ".venv" / "bin" / "ruff").is_file()
