"""``flowy.connect("postgresql://...")``: the entry point, the options, bad options, and
passwords that never show."""

from __future__ import annotations

import importlib.metadata
import urllib.parse
from typing import Any

import pytest
from pg_support import connect, sql, with_options

import flowy
from flowy.errors import BackendURLError, StorageError, StorageUnavailableError
from flowy_postgres import DRIVER_OPTIONS, OPTIONS, PostgresBackend

pytestmark = pytest.mark.anyio


def with_password(dsn: str, password: str) -> str:
    parts = urllib.parse.urlsplit(dsn)
    user = parts.username or "postgres"
    netloc = f"{user}:{password}@{parts.hostname}:{parts.port or 5432}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def test_the_schemes_are_registered_as_entry_points() -> None:
    entries = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="flowy.backends")}
    assert entries["postgresql"] == entries["postgres"] == "flowy_postgres:open_backend"


@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
async def test_connect_opens_a_postgres_backend(
    postgres_dsn: str, pg_schema: str, scheme: str
) -> None:
    url = with_options(postgres_dsn.replace("postgresql://", f"{scheme}://", 1), schema=pg_schema)
    async with flowy.connect(url) as backend:
        assert isinstance(backend, PostgresBackend)
        assert backend.url == url
        assert backend.names.schema == pg_schema and backend.names.prefix == "flowy_"
        assert await backend.checkpointer.list_threads() == []


async def test_options_are_applied(postgres_dsn: str, pg_schema: str) -> None:
    url = with_options(
        postgres_dsn,
        schema=pg_schema,
        prefix="app_",
        pool_size=3,
        acquire_timeout=2.5,
        max_attempts=7,
        listen="false",
        poll_interval=0.25,
        application_name="flowy-url-test",
    )
    async with flowy.connect(url) as backend:
        assert isinstance(backend, PostgresBackend)
        assert backend.names.prefix == "app_"
        assert backend.pool is not None and backend.pool.get_max_size() == 3
        assert backend.connector.acquire_timeout == 2.5
        assert backend.consumer.max_attempts == 7
        assert backend.consumer.poll_interval == 0.25
        assert await backend.consumer.claim(1, 30, wait=0.3) == []
        assert not backend.consumer.listening
        # A driver option reaches asyncpg (here as a server setting).
        assert await sql(backend.pool).fetchval("SHOW application_name") == "flowy-url-test"
        tables = await sql(backend.pool).fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = $1 ORDER BY 1", pg_schema
        )
        assert [t[0] for t in tables][:3] == ["app_history", "app_journal", "app_leases"]


async def test_an_unknown_option_lists_the_known_ones(postgres_dsn: str) -> None:
    with pytest.raises(BackendURLError) as info:
        await flowy.connect(with_options(postgres_dsn, shema="typo"))
    message = str(info.value)
    assert "shema" in message
    for name in (*OPTIONS, *DRIVER_OPTIONS):
        assert name in message


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("max_attempts", "0"),
        ("pool_size", "many"),
        ("acquire_timeout", "-1"),
        ("poll_interval", "nan"),
        ("pooler_mode", "maybe"),
        ("listen", "2"),
        ("schema", "bad-name"),
        ("schema", 'x"; DROP TABLE t; --'),
        ("prefix", "p" * 45),
        ("prefix", "9_"),
    ],
)
async def test_a_bad_value_names_its_option(postgres_dsn: str, option: str, value: str) -> None:
    with pytest.raises(BackendURLError, match=option):
        await flowy.connect(with_options(postgres_dsn, **{option: value}))


async def test_listen_and_pooler_mode_exclude_each_other(postgres_dsn: str) -> None:
    with pytest.raises(BackendURLError, match="pooler"):
        await flowy.connect(with_options(postgres_dsn, pooler_mode="true", listen="true"))


async def test_passwords_never_show(postgres_dsn: str, pg_schema: str) -> None:
    secret = "s3cr3t-Pa55"
    # The server trusts local connections, so a wrong password still opens.
    url = with_options(with_password(postgres_dsn, secret), schema=pg_schema)
    async with flowy.connect(url) as backend:
        assert secret not in repr(backend)
        assert "***" in repr(backend)
    with pytest.raises(BackendURLError) as info:
        await flowy.connect(url + "&bogus=1")
    assert secret not in str(info.value)
    unreachable = with_password("postgresql://postgres@127.0.0.1:1/test", secret)
    with pytest.raises(StorageUnavailableError) as failed:
        await flowy.connect(with_options(unreachable, schema=pg_schema))
    assert secret not in str(failed.value)
    assert secret not in repr(failed.value.__cause__)


async def test_a_password_in_the_query_is_refused(postgres_dsn: str) -> None:
    with pytest.raises(BackendURLError) as info:
        await flowy.connect(with_options(postgres_dsn, password="s3cr3t"))
    assert "password" in str(info.value)


async def test_peers_reach_the_same_store(backend: PostgresBackend[Any]) -> None:
    async with flowy.connect(backend.url) as peer:
        assert isinstance(peer, PostgresBackend)
        assert peer.checkpointer.fences(backend.leases)  # one database, schema and prefix
        lease = await backend.leases.acquire("shared", "owner", 30)
        assert await peer.leases.holder("shared") == lease


async def test_flowy_check_runs_in_a_scratch_schema_and_masks_the_password(
    postgres_dsn: str, pg_schema: str
) -> None:
    from flowy.testing import Scenario, acheck

    async def work(s: dict[str, Any]) -> Any:
        return {"done": True}, flowy.handoff("finish", resume_at="finish")

    async def finish(s: dict[str, Any]) -> Any:
        return {}, flowy.completed()

    builder: flowy.GraphBuilder[dict[str, Any], Any] = flowy.GraphBuilder(lambda a, b: {**a, **b})
    graph = (
        builder.add_node("work", work)
        .add_node("finish", finish)
        .add_edge("work", "finish")
        .allow_no_outgoing_route("finish")
        .compile()
    )
    url = with_options(with_password(postgres_dsn, "hunter2"), schema=pg_schema)
    report = await acheck(graph, lambda: Scenario(state={}), store=url, seeds=2)
    assert report.ok, str(report)
    assert "hunter2" not in str(report) and "postgres:***@" in str(report)
    assert report.scratch is not None and "hunter2" not in report.scratch
    scratch = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(report.scratch).query))["schema"]
    assert scratch.startswith("flowy_scratch_") and scratch != pg_schema
    conn = await connect(postgres_dsn)
    try:
        schemas = await conn.fetch(
            "SELECT schema_name FROM information_schema.schemata WHERE schema_name = ANY($1)",
            [scratch, pg_schema],
        )
        assert schemas == []  # the scratch schema was dropped; the store's was never made
    finally:
        await conn.close()


async def test_a_missing_database_is_one_line_that_says_how_to_create_it(
    postgres_dsn: str,
) -> None:
    parts = urllib.parse.urlsplit(postgres_dsn)
    url = urllib.parse.urlunsplit(parts._replace(path="/flowy_no_such_database"))
    with pytest.raises(StorageError) as caught:
        await flowy.connect(with_options(url, schema="approvals"))
    message = str(caught.value)
    assert "\n" not in message
    assert 'database "flowy_no_such_database" does not exist' in message, message
    assert "`createdb flowy_no_such_database`" in message, message
    assert """psql -c 'CREATE DATABASE "flowy_no_such_database"'""" in message, message
