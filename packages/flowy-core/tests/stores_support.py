"""Every store, by URL, fresh for each test: what the tests of the ``flowy`` command
(``test_cli_stores.py``) and of its inspector (``test_ui.py``) run on.

Stores: memory (a store of its own name, so only this process sees it); SQLite always;
PostgreSQL (``FLOWY_POSTGRES_DSN``, else 127.0.0.1:5432 database ``test``), each test in
a schema of its own; Redis (``FLOWY_REDIS_URL``, else 127.0.0.1:6379), each test in a
namespace of its own; DynamoDB (``FLOWY_DYNAMODB_ENDPOINT``, else moto's server mode
started here), each test with a table of its own. A server that cannot be found skips
(fails under ``FLOWY_REQUIRE_BACKENDS=1``).

A test module imports the fixture ``dynamodb_endpoint`` (pytest finds fixtures among a
module's names; each module that imports it starts one moto server for its tests) and
makes its own ``store`` fixture from :func:`fresh_store`, over the stores it runs on::

    from stores_support import dynamodb_endpoint as dynamodb_endpoint  # a fixture

    @pytest.fixture(params=SHARED_STORES)
    def store(request: pytest.FixtureRequest) -> Iterator[Store]:
        with fresh_store(request, "cli") as made:
            yield made
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import shlex
import urllib.parse
import uuid
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from cli_support import run_flowy

import flowy
from flowy.testing.backends import backend_missing, port_open

SHARED_STORES = ["sqlite", "postgres", "redis", "dynamodb"]
"""The stores another process can open too (a ``flowy`` command run as a process)."""

ALL_STORES = ["memory", *SHARED_STORES]
"""Every store; a memory store lives only in this process."""


@dataclass(frozen=True)
class Store:
    """A store under test: its URL and what a process needs to reach it."""

    name: str
    url: str
    env: dict[str, str] = field(default_factory=lambda: {})

    @property
    def option(self) -> str:
        """How the command prints this store in the commands it suggests."""
        return f"--backend {shlex.quote(self.url)}"

    def flowy(self, *args: str, **kw: Any) -> Any:
        """Run ``flowy ARGS --backend URL``."""
        env = {**self.env, **kw.pop("env", {})}
        return run_flowy(*args, "--backend", self.url, env=env, **kw)


@contextlib.contextmanager
def environment(store: Store) -> Generator[None]:
    """``store.env`` set in this process (for ``flowy.connect`` here)."""
    saved = {k: os.environ.get(k) for k in store.env}
    os.environ.update(store.env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def fresh_store(request: pytest.FixtureRequest, tag: str) -> Generator[Store]:
    """A new, empty store of the kind ``request.param`` names (its schema, namespace or
    table named after ``tag`` and a random suffix), removed afterwards."""
    kind: str = request.param
    suffix = f"{tag}-{uuid.uuid4().hex[:12]}"
    if kind == "memory":
        yield Store("memory", f"memory://flowy-{suffix}")
    elif kind == "sqlite":
        tmp_path: Path = request.getfixturevalue("tmp_path")
        yield Store("sqlite", f"sqlite:///{tmp_path / 'flowy.db'}")
    elif kind == "postgres":
        yield from _postgres(f"flowy_{suffix.replace('-', '_')}")
    elif kind == "redis":
        yield from _redis(f"flowy-{suffix}")
    elif kind == "dynamodb":
        yield from _dynamodb(request.getfixturevalue("dynamodb_endpoint"), f"flowy-{suffix}")
    else:
        raise ValueError(f"no store {kind!r}: expected one of {ALL_STORES}")


def _with_option(url: str, name: str, value: str) -> str:
    joiner = "&" if "?" in url else "?"
    return f"{url}{joiner}{name}={urllib.parse.quote(value, safe='')}"


def _skip_without_adapter(scheme: str, name: str) -> None:
    if scheme not in flowy.storage.schemes():
        backend_missing(f"{name}: no adapter for {scheme}:// is installed")


def _postgres_dsn() -> str:
    explicit = os.environ.get("FLOWY_POSTGRES_DSN")
    if explicit:
        return explicit
    if not port_open("127.0.0.1", 5432):
        backend_missing("no PostgreSQL server: set FLOWY_POSTGRES_DSN or run one on :5432")
    return "postgresql://postgres@127.0.0.1:5432/test"


def _postgres(schema: str) -> Iterator[Store]:
    _skip_without_adapter("postgresql", "postgres")
    dsn = _postgres_dsn()
    try:
        yield Store("postgres", _with_option(dsn, "schema", schema))
    finally:
        asyncpg: Any = importlib.import_module("asyncpg")  # a dependency of flowy-postgres

        async def drop() -> None:
            conn = await asyncpg.connect(dsn)
            try:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            finally:
                await conn.close()

        asyncio.run(drop())


def _redis(namespace: str) -> Iterator[Store]:
    _skip_without_adapter("redis", "redis")
    base = os.environ.get("FLOWY_REDIS_URL")
    if not base:
        if not port_open("127.0.0.1", 6379):
            backend_missing("no Redis server: set FLOWY_REDIS_URL or run one on :6379")
        base = "redis://127.0.0.1:6379/0"
    try:
        yield Store("redis", _with_option(base, "namespace", namespace))
    finally:
        redis: Any = importlib.import_module("redis")  # a dependency of flowy-redis

        client = redis.Redis.from_url(base)
        try:
            for key in client.scan_iter(match=f"*{namespace}*"):
                client.delete(key)
        finally:
            client.close()


@pytest.fixture(scope="session")
def dynamodb_endpoint() -> Iterator[str]:
    """A DynamoDB endpoint: ``FLOWY_DYNAMODB_ENDPOINT``, else moto in server mode."""
    explicit = os.environ.get("FLOWY_DYNAMODB_ENDPOINT")
    if explicit:
        yield explicit
        return
    try:
        from moto.server import ThreadedMotoServer
    except ImportError as exc:
        backend_missing(f"no DynamoDB endpoint: FLOWY_DYNAMODB_ENDPOINT unset and {exc}")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def _dynamodb(endpoint: str, table: str) -> Iterator[Store]:
    _skip_without_adapter("dynamodb", "dynamodb")
    region = os.environ.get("AWS_DEFAULT_REGION", "us-east-1")
    env = {"AWS_DEFAULT_REGION": region}
    if not os.environ.get("AWS_ACCESS_KEY_ID"):
        env |= {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    url = _with_option(f"dynamodb://{table}?region={region}", "endpoint_url", endpoint)
    try:
        yield Store("dynamodb", url, env)
    finally:
        boto3: Any = importlib.import_module("boto3")  # a dependency of flowy-dynamodb

        client = boto3.client(
            "dynamodb",
            endpoint_url=endpoint,
            region_name=region,
            aws_access_key_id=env.get("AWS_ACCESS_KEY_ID", os.environ.get("AWS_ACCESS_KEY_ID")),
            aws_secret_access_key=env.get(
                "AWS_SECRET_ACCESS_KEY", os.environ.get("AWS_SECRET_ACCESS_KEY")
            ),
        )
        with contextlib.suppress(client.exceptions.ResourceNotFoundException):
            client.delete_table(TableName=table)
