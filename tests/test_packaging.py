"""The five distributions are ready for an index.

``uv build`` makes every wheel and sdist of the working tree; then, with no network
(``pip --no-index`` over the build directory), the tests check what an index and an
installer would see: valid core metadata whose long description is the package README,
the LICENSE in every wheel and sdist, ``py.typed`` in every wheel, a flowy-core that
installs and imports with nothing else, and extras that resolve to the adapter wheels
built here.

The adapters' own dependencies (asyncpg, redis, boto3, msgspec) are not available offline.
Rather than skip the resolution of ``flowy-core[postgres]`` and friends, the test gives pip
a second directory of stub wheels, one per third-party requirement, each carrying only a
name and the lowest version its requirement allows. pip's resolver then runs on the real
metadata of the built wheels, and the report says which file satisfied each requirement:
every flowy distribution must come from the build directory. Classifiers are checked by
the build itself (hatchling refuses one not in trove-classifiers).
"""

from __future__ import annotations

import email.parser
import importlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlparse
from urllib.request import url2pathname

import pytest
from packaging.metadata import Metadata
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
HOME = "https://github.com/flowy-dev/flowy"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)
RELATIVE_LINK = re.compile(r"\]\((?!https://|http://|#)([^)]*)\)")

# distribution -> its import package
PACKAGES = {
    "flowy-core": "flowy",
    "flowy-postgres": "flowy_postgres",
    "flowy-redis": "flowy_redis",
    "flowy-dynamodb": "flowy_dynamodb",
    "flowy-langgraph": "flowy_langgraph",
}
ADAPTER_OF_EXTRA = {
    "postgres": "flowy-postgres",
    "redis": "flowy-redis",
    "dynamodb": "flowy-dynamodb",
}
REQUIRED_CLASSIFIERS = {
    "Development Status :: 3 - Alpha",
    "Framework :: AsyncIO",
    "Typing :: Typed",
    "Programming Language :: Python :: 3.11",
    "Programming Language :: Python :: 3.12",
    "Programming Language :: Python :: 3.13",
}
PROJECT_URLS = {"Homepage", "Documentation", "Source", "Issues", "Changelog"}


@dataclass(frozen=True)
class Built:
    """One distribution's wheel and sdist, as uv built them."""

    name: str
    version: str
    wheel: Path
    sdist: Path

    @property
    def stem(self) -> str:
        return f"{self.name.replace('-', '_')}-{self.version}"


@dataclass(frozen=True)
class Dists:
    directory: Path
    built: dict[str, Built]


def find_uv() -> str:
    # `uv run` exports UV (the uv running the tests); else PATH; else the Makefile's copy.
    for candidate in (
        os.environ.get("UV"),
        shutil.which("uv"),
        str(ROOT / ".tools" / "uv-venv" / "bin" / "uv"),
    ):
        if candidate and Path(candidate).is_file():
            return candidate
    pytest.fail("no uv found (UV, PATH or .tools/uv-venv); run the tests with `make test`")


def run(argv: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=300, env=env, cwd=cwd, check=False
    )
    assert proc.returncode == 0, f"{' '.join(argv)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def offline_env() -> dict[str, str]:
    """The caller's environment without pip configuration (indexes, find-links)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PIP_") and k not in {"PYTHONPATH", "VIRTUAL_ENV"}
    }
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", NO_COLOR="1")
    return env


def project_version(name: str) -> str:
    text = (ROOT / "packages" / name / "pyproject.toml").read_text()
    found = re.search(r'^version = "([^"]+)"$', text, re.M)
    assert found is not None, f"no version in packages/{name}/pyproject.toml"
    return found.group(1)


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Dists:
    out = tmp_path_factory.mktemp("dist")
    run([find_uv(), "build", "--all-packages", "--out-dir", str(out), "--quiet"], cwd=ROOT)
    built: dict[str, Built] = {}
    for name in PACKAGES:
        version = project_version(name)
        stem = f"{name.replace('-', '_')}-{version}"
        wheel, sdist = out / f"{stem}-py3-none-any.whl", out / f"{stem}.tar.gz"
        assert wheel.is_file() and sdist.is_file(), sorted(p.name for p in out.iterdir())
        built[name] = Built(name, version, wheel, sdist)
    return Dists(out, built)


def make_venv(directory: Path) -> Path:
    """A fresh venv with pip (stdlib venv + ensurepip: no network); returns its python."""
    run([sys.executable, "-m", "venv", str(directory)], env=offline_env())
    return directory / "bin" / "python"


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """flowy-core's venv: the tests sharing it install flowy-core and nothing else."""
    return make_venv(tmp_path_factory.mktemp("venv") / "env")


def wheel_metadata(built: Built) -> str:
    with zipfile.ZipFile(built.wheel) as whl:
        return whl.read(f"{built.stem}.dist-info/METADATA").decode()


def sdist_metadata(built: Built) -> str:
    with tarfile.open(built.sdist) as tar:
        member = tar.extractfile(f"{built.stem}/PKG-INFO")
        assert member is not None
        return member.read().decode()


def readme(name: str) -> str:
    return (ROOT / "packages" / name / "README.md").read_text()


def check_metadata(name: str, raw: str) -> Metadata:
    metadata = Metadata.from_email(raw, validate=True)  # raises on any invalid field
    assert metadata.name == name
    assert str(metadata.version) == project_version(name)
    assert metadata.summary
    assert metadata.description_content_type == "text/markdown"
    # The long description is the README (the email payload after the headers).
    body = email.parser.Parser().parsestr(raw).get_payload()
    assert isinstance(body, str)
    assert body.strip() == readme(name).strip()
    assert metadata.description is not None and metadata.description.strip() == body.strip()
    assert str(metadata.license_expression) == "MIT"
    assert metadata.license_files == ["LICENSE"]
    assert metadata.author == "the flowy authors"
    assert metadata.keywords
    assert str(metadata.requires_python) == ">=3.11"
    classifiers = set(metadata.classifiers or [])
    assert classifiers >= REQUIRED_CLASSIFIERS, REQUIRED_CLASSIFIERS - classifiers
    # PEP 639: with a License-Expression, License :: classifiers are deprecated and
    # may be rejected; the expression alone states the license.
    assert not [c for c in classifiers if c.startswith("License ::")]
    urls = metadata.project_urls or {}
    assert set(urls) == PROJECT_URLS
    assert all(url.startswith(HOME) for url in urls.values()), urls
    return metadata


@pytest.mark.parametrize("name", list(PACKAGES))
def test_readme_is_an_index_page(name: str) -> None:
    text = readme(name)
    assert len(text.splitlines()) > 20, f"packages/{name}/README.md is too short for a page"
    prose = re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))  # links live outside code
    relative = RELATIVE_LINK.findall(prose)
    assert not relative, f"packages/{name}/README.md: relative links break off the repo: {relative}"
    assert f"{HOME}/blob/main/docs/" in text, f"packages/{name}/README.md links no docs page"
    assert "pip install" in text


@pytest.mark.parametrize("name", list(PACKAGES))
def test_license_file_matches_the_root_one(name: str) -> None:
    root_license = (ROOT / "LICENSE").read_text()
    assert root_license.startswith("MIT License\n")
    assert "Copyright (c) 2026 the flowy authors" in root_license
    assert (ROOT / "packages" / name / "LICENSE").read_text() == root_license


@pytest.mark.parametrize("name", list(PACKAGES))
def test_wheel_contents_and_metadata(dists: Dists, name: str) -> None:
    built = dists.built[name]
    with zipfile.ZipFile(built.wheel) as whl:
        files = set(whl.namelist())
        assert f"{PACKAGES[name]}/py.typed" in files
        license_path = f"{built.stem}.dist-info/licenses/LICENSE"
        assert license_path in files, sorted(f for f in files if "dist-info" in f)
        assert whl.read(license_path).decode() == (ROOT / "LICENSE").read_text()
        # Only the import package and its metadata: no tests, no stray top-level modules.
        tops = {f.split("/", 1)[0] for f in files}
        assert tops == {PACKAGES[name], f"{built.stem}.dist-info"}, tops
    check_metadata(name, wheel_metadata(built))


@pytest.mark.parametrize("name", list(PACKAGES))
def test_sdist_contents_and_metadata(dists: Dists, name: str) -> None:
    built = dists.built[name]
    with tarfile.open(built.sdist) as tar:
        names = set(tar.getnames())
        license_member = tar.extractfile(f"{built.stem}/LICENSE")
        assert license_member is not None
        assert license_member.read().decode() == (ROOT / "LICENSE").read_text()
    for required in ("README.md", "pyproject.toml", "PKG-INFO", f"src/{PACKAGES[name]}/py.typed"):
        assert f"{built.stem}/{required}" in names, required
    check_metadata(name, sdist_metadata(built))


def test_versions_fit_the_declared_ranges(dists: Dists) -> None:
    """Each extra of flowy-core accepts the adapter built here, and each adapter accepts
    the flowy-core built here."""
    core = Metadata.from_email(wheel_metadata(dists.built["flowy-core"]), validate=True)
    core_version = Version(dists.built["flowy-core"].version)
    extras = {"msgspec", "otel", "pydantic", "ui", *ADAPTER_OF_EXTRA}
    assert set(core.provides_extra or []) == extras
    for extra, adapter in ADAPTER_OF_EXTRA.items():
        reqs = [
            r
            for r in core.requires_dist or []
            if r.marker is not None and r.marker.evaluate({"extra": extra})
        ]
        assert [canonicalize_name(r.name) for r in reqs] == [adapter], (extra, reqs)
        adapter_version = dists.built[adapter].version
        assert reqs[0].specifier.contains(adapter_version), (extra, reqs[0], adapter_version)
        adapter_meta = Metadata.from_email(wheel_metadata(dists.built[adapter]), validate=True)
        on_core = [r for r in adapter_meta.requires_dist or [] if r.name == "flowy-core"]
        assert len(on_core) == 1 and on_core[0].specifier.contains(core_version), on_core


@pytest.mark.parametrize("name", sorted(PACKAGES))
def test_version_attribute_is_the_installed_version(name: str) -> None:
    """``__version__`` of each package is read from its installed metadata."""
    module = importlib.import_module(PACKAGES[name])
    assert module.__version__ == importlib.metadata.version(name)


def stub_wheel(directory: Path, req: Requirement) -> None:
    """A wheel with nothing but the name and the lowest version ``req`` allows."""
    versions = sorted(Version(s.version) for s in req.specifier)
    version = next((str(v) for v in versions if req.specifier.contains(v)), "0")
    name = canonicalize_name(req.name).replace("-", "_")
    info = f"{name}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {req.name}\nVersion: {version}\n"
    wheel = "Wheel-Version: 1.0\nGenerator: stub\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    with zipfile.ZipFile(directory / f"{name}-{version}-py3-none-any.whl", "w") as whl:
        whl.writestr(f"{info}/METADATA", metadata)
        whl.writestr(f"{info}/WHEEL", wheel)
        whl.writestr(f"{info}/RECORD", "")


def test_extras_resolve_offline_to_the_built_adapters(
    dists: Dists, venv: Path, tmp_path: Path
) -> None:
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    third_party = [
        req
        for built in dists.built.values()
        for req in Metadata.from_email(wheel_metadata(built)).requires_dist or []
        if not canonicalize_name(req.name).startswith("flowy-")
        and (req.marker is None or req.marker.evaluate({"extra": "msgspec"}))
    ]
    for req in third_party:
        stub_wheel(stubs, req)
    report = tmp_path / "report.json"
    run(
        [
            str(venv), "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
            "--no-index", "--find-links", str(dists.directory), "--find-links", str(stubs),
            "--report", str(report), "flowy-core[msgspec,postgres,redis,dynamodb]",
            "flowy-langgraph",
        ],
        env=offline_env(),
    )  # fmt: skip
    installs = cast(list[dict[str, dict[str, object]]], json.loads(report.read_text())["install"])
    origin: dict[str, Path] = {
        canonicalize_name(str(item["metadata"]["name"])): Path(
            url2pathname(urlparse(str(item["download_info"]["url"])).path)
        ).parent
        for item in installs
    }
    expected_third_party: set[str] = {canonicalize_name(r.name) for r in third_party}
    assert set(origin) == set(PACKAGES) | expected_third_party, origin
    for name in PACKAGES:
        assert origin[name] == dists.directory, (name, origin[name])


def test_flowy_core_installs_offline_with_nothing_else(dists: Dists, venv: Path) -> None:
    env = offline_env()
    pip = [str(venv), "-m", "pip"]
    run(
        [*pip, "install", "--no-index", "--find-links", str(dists.directory), "flowy-core"], env=env
    )
    listed = cast(list[dict[str, str]], json.loads(run([*pip, "list", "--format=json"], env=env)))
    names = {canonicalize_name(p["name"]) for p in listed}
    assert names - {"pip", "setuptools"} == {"flowy-core"}, names
    # Imported from the installed wheel (the venv's site-packages), loading only the stdlib.
    code = (
        "import sys, flowy; "
        "assert 'site-packages' in flowy.__file__, flowy.__file__; "
        "print(flowy.__version__)"
    )
    assert run([str(venv), "-c", code], env=env, cwd=venv.parent).strip() == (
        dists.built["flowy-core"].version
    )
    assert run([str(venv.parent / "flowy"), "--version"], env=env).strip() == (
        f"flowy {dists.built['flowy-core'].version}"
    )


def test_package_page_quick_start_runs_on_the_installed_wheel(dists: Dists, venv: Path) -> None:
    env = offline_env()
    run(
        [str(venv), "-m", "pip", "install", "--no-index", "--find-links", str(dists.directory),
         "flowy-core"],
        env=env,
    )  # fmt: skip
    text = readme("flowy-core")
    section = text[text.index("## Quick start") :]
    code = FENCE.search(section)
    assert code is not None and code.group(1) == "python"
    expected = FENCE.search(section, code.end())
    assert expected is not None and expected.group(1) == "text"
    assert run([str(venv), "-c", code.group(2)], env=env, cwd=venv.parent) == expected.group(2)


def test_adapter_wheels_install_offline_without_their_dependencies(
    dists: Dists, tmp_path: Path
) -> None:
    env = offline_env()
    venv = make_venv(tmp_path / "env")
    adapters = [n for n in PACKAGES if n != "flowy-core"]
    run(
        [str(venv), "-m", "pip", "install", "--no-index", "--find-links", str(dists.directory),
         "--no-deps", "flowy-core", *adapters],
        env=env,
    )  # fmt: skip
    code = (
        "import importlib.metadata as m, importlib.util as u, pathlib, sys\n"
        "for dist, pkg in [a.split(':') for a in sys.argv[1:]]:\n"
        "    spec = u.find_spec(pkg)\n"
        "    assert spec is not None and spec.origin is not None, pkg\n"
        "    assert (pathlib.Path(spec.origin).parent / 'py.typed').is_file(), pkg\n"
        "    print(dist, m.version(dist))\n"
    )
    out = run([str(venv), "-c", code, *(f"{n}:{PACKAGES[n]}" for n in adapters)], env=env)
    assert out.splitlines() == [f"{n} {dists.built[n].version}" for n in adapters]


def test_each_adapter_accepts_the_workspace_core() -> None:
    """The workspace's flowy-core version lies inside every adapter's declared range,
    and core's extras name each adapter's own version."""

    def project(name: str) -> dict[str, Any]:
        path = ROOT / "packages" / name / "pyproject.toml"
        return cast(dict[str, Any], tomllib.loads(path.read_text())["project"])

    core = project("flowy-core")
    extras = cast(dict[str, list[str]], core["optional-dependencies"])
    for adapter, extra in (
        ("flowy-postgres", "postgres"),
        ("flowy-redis", "redis"),
        ("flowy-dynamodb", "dynamodb"),
    ):
        meta = project(adapter)
        needs = [Requirement(r) for r in cast(list[str], meta["dependencies"])]
        [on_core] = [r for r in needs if r.name == "flowy-core"]
        assert core["version"] in on_core.specifier, (adapter, on_core, core["version"])
        [wanted] = [Requirement(r) for r in extras[extra]]
        assert wanted.name == adapter and meta["version"] in wanted.specifier


def test_each_package_has_a_changelog_entry_for_its_version() -> None:
    for name in PACKAGES:
        folder = ROOT / "packages" / name
        version = tomllib.loads((folder / "pyproject.toml").read_text())["project"]["version"]
        changelog = (folder / "CHANGELOG.md").read_text()
        assert f"## {version}" in changelog, f"{name}/CHANGELOG.md has no entry for {version}"
