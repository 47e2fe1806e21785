"""Fixtures of the flowy-langgraph tests: one flowy store URL per test, on each of the
five stores (memory, SQLite, PostgreSQL, Redis, DynamoDB), each in a namespace of its own
that is removed afterwards.

PostgreSQL: ``FLOWY_POSTGRES_DSN`` or 127.0.0.1:5432 (user ``postgres``), a fresh
schema. Redis: ``FLOWY_REDIS_URL`` or 127.0.0.1:6379, a fresh key namespace. DynamoDB:
``FLOWY_DYNAMODB_ENDPOINT`` or moto's server in this process, a fresh table. A store
that is not there skips the test (fails under ``FLOWY_REQUIRE_BACKENDS=1``).
"""

from __future__ import annotations

import os
import sys
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from flowy.testing.backends import backend_missing, port_open

sys.path.insert(0, str(Path(__file__).resolve().parent))


def postgres_dsn() -> str:
    """The PostgreSQL server the tests use."""
    dsn = os.environ.get("FLOWY_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
    parts = urllib.parse.urlsplit(dsn)
    if not port_open(parts.hostname or "127.0.0.1", parts.port or 5432):
        backend_missing(f"no PostgreSQL server at {parts.hostname}:{parts.port}")
    return dsn


def redis_url() -> str:
    """The Redis server the tests use."""
    url = os.environ.get("FLOWY_REDIS_URL", "redis://127.0.0.1:6379/0")
    parts = urllib.parse.urlsplit(url)
    if not port_open(parts.hostname or "127.0.0.1", parts.port or 6379):
        backend_missing(f"no Redis server at {parts.hostname}:{parts.port}")
    return url


def with_query(url: str, **options: object) -> str:
    """``url`` with ``options`` added to its query."""
    return url + ("&" if "?" in url else "?") + urllib.parse.urlencode(options)


@pytest.fixture(scope="session")
def dynamo_endpoint() -> Iterator[str]:
    """A DynamoDB endpoint: ``FLOWY_DYNAMODB_ENDPOINT`` or moto's server, started here."""
    explicit = os.environ.get("FLOWY_DYNAMODB_ENDPOINT")
    if explicit:
        yield explicit
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AWS_ACCESS_KEY_ID", "testing")
        patch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        patch.delenv("AWS_SESSION_TOKEN", raising=False)
        patch.delenv("AWS_PROFILE", raising=False)
        try:
            from moto_server import SerializedMotoServer
        except ImportError as exc:  # pragma: no cover - moto is a dev dependency
            backend_missing(f"no DynamoDB endpoint (FLOWY_DYNAMODB_ENDPOINT, moto): {exc}")
        server = SerializedMotoServer()
        url = server.start()
        try:
            yield url
        finally:
            server.stop()


async def _drop_schema(dsn: str, schema: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


async def _purge_redis(url: str, namespace: str) -> None:
    from redis.asyncio import Redis

    client = Redis.from_url(url)
    try:
        keys = [k async for k in client.scan_iter(match=f"*{namespace}*", count=1000)]
        for start in range(0, len(keys), 500):
            await client.delete(*keys[start : start + 500])
    finally:
        await client.aclose()


@pytest.fixture
async def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """A flowy store URL on the store the test is parametrised with (``store``)."""
    store = request.param if hasattr(request, "param") else "memory"
    name = f"flowy_lg_{uuid.uuid4().hex[:12]}"
    if store == "memory":
        yield f"memory://{name}"
    elif store == "sqlite":
        yield f"sqlite:///{tmp_path / 'langgraph.db'}"
    elif store == "postgres":
        dsn = postgres_dsn()
        try:
            yield with_query(dsn, schema=name)
        finally:
            await _drop_schema(dsn, name)
    elif store == "redis":
        url = redis_url()
        try:
            yield with_query(url, namespace=name)
        finally:
            await _purge_redis(url, name)
    elif store == "dynamodb":
        endpoint: str = request.getfixturevalue("dynamo_endpoint")
        table = name.replace("_", "-")
        try:
            yield f"dynamodb://{table}?" + urllib.parse.urlencode(
                {"region": "us-east-1", "endpoint_url": endpoint}
            )
        finally:
            import boto3

            client = boto3.client("dynamodb", region_name="us-east-1", endpoint_url=endpoint)
            try:
                client.delete_table(TableName=table)
            except client.exceptions.ResourceNotFoundException:
                pass
            finally:
                client.close()
    else:  # pragma: no cover
        raise AssertionError(store)
