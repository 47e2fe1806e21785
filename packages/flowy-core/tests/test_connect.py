"""``flowy.connect``: URLs, options, adapters, registration and password redaction."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import flowy
from flowy.errors import BackendURLError
from flowy.memory import MemoryBackend
from flowy.sqlite import SQLiteBackend
from flowy.storage import redact_url, schemes
from flowy.storage.dialect import StoreURL, register_backend

pytestmark = pytest.mark.anyio


async def test_memory_urls_share_a_store_by_name() -> None:
    async with flowy.connect("memory://shared-a") as a, flowy.connect("memory://shared-a") as b:
        assert isinstance(a, MemoryBackend)
        await a.checkpointer.save(
            0, flowy.storage.Snapshot("t", {"n": 1}, "start", flowy.RunStatus.RUNNING)
        )
        snapshot, revision = await b.checkpointer.load("t")
        assert (snapshot.state, revision) == ({"n": 1}, 1)
    async with flowy.connect("memory://") as c, flowy.connect("memory://") as d:
        await c.checkpointer.save(
            0, flowy.storage.Snapshot("t", {}, "start", flowy.RunStatus.RUNNING)
        )
        with pytest.raises(flowy.ThreadNotFoundError):
            await d.checkpointer.load("t")  # anonymous stores are private


async def test_sqlite_url_and_bare_path(tmp_path: Path) -> None:
    path = tmp_path / "a.db"
    async with flowy.connect(f"sqlite:///{path}") as backend:
        assert isinstance(backend, SQLiteBackend)
    assert path.exists()
    async with flowy.connect(str(tmp_path / "b.db")) as backend:
        assert isinstance(backend, SQLiteBackend)
    assert (tmp_path / "b.db").exists()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("nosuch://host", "unknown store scheme 'nosuch'"),
        ("", "is not a store URL"),
        ("sqlite:///x.db?bogus=1", "unknown option(s) bogus"),
        ("sqlite:///x.db?busy_timeout=1&busy_timeout=2", "given twice"),
        ("sqlite:///x.db?busy_timeout=-1", "busy_timeout"),
        ("sqlite:///x.db?busy_timeout=nan", "busy_timeout"),
        ("sqlite://host/x.db", "names a local file"),
        ("memory://a?x=1", "unknown option(s) x"),
    ],
)
async def test_bad_urls_are_backend_url_errors(url: str, message: str, tmp_path: Path) -> None:
    with pytest.raises(BackendURLError) as caught:
        await flowy.connect(url.replace("x.db", str(tmp_path / "x.db")))
    assert message in str(caught.value)
    assert isinstance(caught.value, ValueError)


async def test_unknown_scheme_lists_the_known_ones() -> None:
    with pytest.raises(BackendURLError) as caught:
        await flowy.connect("nosuch://host")
    for scheme in ("memory://", "sqlite://"):
        assert scheme in str(caught.value)


async def test_unknown_option_lists_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(BackendURLError) as caught:
        await flowy.connect(f"sqlite:///{tmp_path / 'x.db'}?bogus=1")
    assert "sqlite:// accepts: " in str(caught.value)
    assert "busy_timeout (" in str(caught.value)


async def test_a_missing_adapter_names_its_pip_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import flowy.storage._connect as connect_module

    monkeypatch.setattr(connect_module, "_registered", dict)  # as if none were installed
    with pytest.raises(BackendURLError) as caught:
        await flowy.connect("postgresql://app:s3cret@db.example/app")
    text = str(caught.value)
    assert 'pip install "flowy-core[postgres]"' in text
    assert "s3cret" not in text and "app:***@db.example" in text


async def test_register_backend_opens_a_scheme_and_refuses_builtins() -> None:
    opened: list[StoreURL] = []

    async def opener(url: StoreURL, *, codec: Any) -> MemoryBackend[Any]:
        opened.append(url)
        return MemoryBackend(url.raw)

    register_backend("mystore", opener)
    assert "mystore" in schemes()
    async with flowy.connect("mystore://somewhere?a=1") as backend:
        assert isinstance(backend, MemoryBackend)
    assert opened[0].options == {"a": "1"}
    for builtin in ("memory", "sqlite"):
        with pytest.raises(ValueError, match="cannot be replaced"):
            register_backend(builtin, opener)
    for bad in ("", "My", "a b", "x/y"):
        with pytest.raises(ValueError, match="lowercase"):
            register_backend(bad, opener)


def test_installed_adapters_are_entry_points() -> None:
    """Every adapter installed in this environment registers its schemes."""
    import importlib.metadata

    names = {ep.name for ep in importlib.metadata.entry_points(group="flowy.backends")}
    assert names <= set(schemes())


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:secret@h:5432/db", "postgresql://u:***@h:5432/db"),
        ("redis://:secret@h/0", "redis://:***@h/0"),
        ("postgresql://u:pa@ss@h/db", "postgresql://u:***@h/db"),
        ("post%gres://u:secret@[::1", "post%gres://u:***@[::1"),
        ("redis://h:6379/0", "redis://h:6379/0"),
        ("sqlite:///a:b@c.db", "sqlite:///a:b@c.db"),
    ],
)
def test_redact_url_masks_passwords_even_in_malformed_urls(url: str, shown: str) -> None:
    assert redact_url(url) == shown


async def test_a_malformed_url_never_shows_its_password() -> None:
    for url in ("post%gres://u:secret@[::1", "postgresql://u:secret@[::1/db"):
        with pytest.raises(BackendURLError) as caught:
            await flowy.connect(url)
        assert "secret" not in str(caught.value)


def test_store_url_option_helpers() -> None:
    url = StoreURL.parse("x://h/p?on=yes&off=0&s=2.5&n=3&bad=maybe&huge=" + "9" * 5000)
    assert url.flag("on", False) is True
    assert url.flag("off", True) is False
    assert url.flag("absent", True) is True
    assert url.seconds("s", 1.0) == 2.5
    assert url.count("n", 1) == 3
    with pytest.raises(BackendURLError, match="bad"):
        url.flag("bad", False)
    with pytest.raises(BackendURLError, match="huge"):
        url.count("huge", 1)
    with pytest.raises(BackendURLError, match="positive"):
        StoreURL.parse("x://h?s=0").seconds("s", 1.0)
    with pytest.raises(BackendURLError, match="from 1 to"):
        StoreURL.parse("x://h?n=0").count("n", 1)
    short = StoreURL.parse("x://h?s=0.0001")
    with pytest.raises(BackendURLError, match=r"from 0\.001"):
        short.seconds("s", None, minimum=0.001)
    assert short.seconds("s", None) == 0.0001
    assert StoreURL.parse("x://h").seconds("s", None, minimum=0.001) is None


def test_store_url_driver_url_keeps_the_drivers_options_only() -> None:
    url = StoreURL.parse("a+b://u:pw@h:1/0?mine=1&theirs=2&also=3")
    assert url.driver_url({"theirs", "also"}, scheme="a") == "a://u:pw@h:1/0?theirs=2&also=3"
    assert url.driver_url() == "a+b://u:pw@h:1/0"


@pytest.mark.parametrize(
    "url",
    [
        "redis:6379",
        "localhost",
        "flowy",
        "data/notes.txt",
        "sqlite:flowy.db",
        "postgresql:app.db",
    ],
)
async def test_a_string_that_is_not_a_url_opens_nothing(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BackendURLError, match="is not a store URL") as caught:
        await flowy.connect(url)
    assert "scheme://" in str(caught.value)
    assert "\n" not in str(caught.value)
    assert os.listdir(tmp_path) == []  # no SQLite file named after the typo


async def test_a_bare_path_ending_in_db_or_sqlite_is_a_sqlite_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("a.db", "b.sqlite", str(tmp_path / "c.DB")):
        async with flowy.connect(name) as backend:
            assert isinstance(backend, SQLiteBackend)
    assert sorted(name for name in os.listdir(tmp_path) if "-" not in name) == [
        "a.db",
        "b.sqlite",
        "c.DB",
    ]


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://app:s3cr3t-pw@127.0.0.1:99999/app",
        "postgres://app:s3cr3t-pw@h1:5432,h2:70000/app",
        "redis://:s3cr3t-pw@127.0.0.1:65536/0",
        "rediss://127.0.0.1:0",
        "redis://127.0.0.1:" + "9" * 5000,
        "redis://127.0.0.1:port",
        "redis+cluster://[::1]:99999",
        "postgresql://app:s3cr3t-pw@127.0.0.1/app?port=99999",
        "postgresql://app@/app?host=h1,h2&port=5432,0",
    ],
)
async def test_an_out_of_range_port_is_a_backend_url_error(url: str) -> None:
    with pytest.raises(BackendURLError, match="a port is a number from 1 to 65535") as caught:
        await flowy.connect(url)
    assert "s3cr3t-pw" not in str(caught.value)
    assert len(str(caught.value)) < 400


async def test_ports_in_range_parse() -> None:
    for url in ("redis://h:1", "redis://h:65535/0", "postgresql://u:p@h1:5432,h2/app", "redis://h"):
        StoreURL.parse(url)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("busy_timeout", "1e300"),
        ("busy_timeout", "inf"),
        ("poll_interval", "31622401"),
        ("max_attempts", "9" * 30),
        ("max_attempts", "2147483648"),
        ("max_attempts", "1e3"),
    ],
)
async def test_numeric_options_are_bounded(option: str, value: str, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}?{option}={value}"
    with pytest.raises(BackendURLError, match=option):
        await flowy.connect(url)
    assert not (tmp_path / "x.db").exists()


def test_resume_token_parse_bounds_the_revision() -> None:
    assert flowy.ResumeToken.parse(f"t@{2**63 - 1}").snapshot_revision == 2**63 - 1
    for text in (f"t@{2**63}", "t@99999999999999999999", "t@0", "t@-1", "t@", "@3", "t3"):
        with pytest.raises(ValueError):
            flowy.ResumeToken.parse(text)


def test_contention_errors_share_a_base() -> None:
    for error in (
        flowy.ConcurrencyConflictError,
        flowy.ThreadAlreadyRunningError,
        flowy.ThreadLeaseBusyError,
    ):
        assert issubclass(error, flowy.ThreadContentionError)
    assert issubclass(flowy.ThreadLeaseBusyError, flowy.LeaseError)
    assert issubclass(flowy.errors.InvalidThreadIdError, ValueError)


@pytest.mark.parametrize(
    ("url", "option"),
    [
        ("postgresql://postgres@127.0.0.1:5432/test?pool_size=1001", "pool_size"),
        ("postgresql://postgres@127.0.0.1:5432/test?pool_size=2147483647", "pool_size"),
        ("dynamodb://jobs?region=eu-west-1&max_workers=1001", "max_workers"),
        ("dynamodb://jobs?region=eu-west-1&clock_skew=1e300", "clock_skew"),
        ("dynamodb://jobs?region=eu-west-1&expire_after=1e300", "expire_after"),
        ("redis://127.0.0.1:6379/0?completed_ttl=1e300", "completed_ttl"),
    ],
)
async def test_adapter_options_are_bounded(url: str, option: str) -> None:
    # Refused while parsing the URL: nothing is opened (a pool of 2**31 connections was).
    with pytest.raises(BackendURLError, match=f"option {option}="):
        await flowy.connect(url)


def test_driver_url_keeps_the_password_and_only_the_drivers_options() -> None:
    url = StoreURL.parse("postgresql://app:s3cret@db:5432/app?schema=flowy&sslmode=require#x")
    assert url.driver_url({"sslmode"}) == "postgresql://app:s3cret@db:5432/app?sslmode=require"
    assert url.driver_url() == url.without_options() == "postgresql://app:s3cret@db:5432/app"
    redis = StoreURL.parse("redis+cluster://h:7000/0?namespace=n&ssl_cert_reqs=none")
    assert redis.driver_url({"ssl_cert_reqs"}, scheme="redis") == (
        "redis://h:7000/0?ssl_cert_reqs=none"
    )


def test_mask_password_hides_the_urls_password_in_any_text() -> None:
    text = "invalid DSN: user=app password=s3cret host=db"
    masked = StoreURL.mask_password(text, "postgresql://app:s3cret@db/app")
    assert masked == "invalid DSN: user=app password=*** host=db"
    assert StoreURL.mask_password(text, "postgresql://app@db/app") == text


def test_sibling_url_replaces_the_netloc_and_keeps_other_options() -> None:
    sibling = flowy.storage.dialect.sibling_url(
        "dynamodb://orders?region=eu-west-1", netloc="flowy_scratch_1", options={"a": "b"}
    )
    assert sibling == "dynamodb://flowy_scratch_1?region=eu-west-1&a=b"


async def test_a_store_written_for_0_2_still_sets_up_through_its_migrate() -> None:
    with pytest.warns(DeprecationWarning, match=r"_migrate is deprecated; name it _setup"):

        class OldStore(MemoryBackend[Any]):
            async def _migrate(self) -> int:
                return 7

    assert await OldStore().setup() == 7
