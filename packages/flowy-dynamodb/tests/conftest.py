"""Fixtures: a DynamoDB endpoint for the session and a fresh table per test.

The endpoint is found in this order: ``FLOWY_DYNAMODB_ENDPOINT``; DynamoDB Local in a
container when a Docker engine answers; moto's server mode in this process (real HTTP
through boto3). Against an emulator, dummy credentials come from the environment, as
boto3's chain would find real ones. Each test's ``flowy_url`` names its own table
(created when the store opens it), deleted afterwards.
"""

from __future__ import annotations

import asyncio
import os
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from moto_server import SerializedMotoServer

from flowy.errors import ThreadNotFoundError
from flowy.storage import Backend
from flowy.testing import Dump
from flowy.testing.backends import backend_missing, docker_available
from flowy.testing.hooks import SetSchemaVersion
from flowy_dynamodb import DynamoBackend, make_client, thread_key
from flowy_dynamodb._layout import SCHEMA_KEY


@dataclass(frozen=True)
class Endpoint:
    """Where the tests talk to DynamoDB."""

    url: str
    kind: str
    region: str = "us-east-1"
    after_test: Callable[[], None] | None = None

    def client(self, **options: Any) -> Any:
        """A new boto3 client for this endpoint."""
        options.setdefault("retry_attempts", 3)
        return make_client(region=self.region, endpoint_url=self.url, **options)

    def store_url(self, table: str, **options: object) -> str:
        """A ``dynamodb://`` URL of ``table`` on this endpoint."""
        query = {"region": self.region, "endpoint_url": self.url, **options}
        return f"dynamodb://{table}?{urllib.parse.urlencode(query)}"


def _dynamodb_local() -> tuple[Any, str]:
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.waiting_utils import wait_for_logs

    container: Any = DockerContainer("amazon/dynamodb-local:latest").with_exposed_ports(8000)
    container.start()
    wait_for_logs(container, "CorsParams", timeout=60)
    url = f"http://{container.get_container_host_ip()}:{container.get_exposed_port(8000)}"
    return container, url


def _docker_configured() -> bool:
    # Ask for a Docker engine only when one could answer: a failed probe leaves an
    # unclosed socket behind, which pytest (warnings as errors) reports.
    return bool(os.environ.get("DOCKER_HOST")) or os.path.exists("/var/run/docker.sock")


@pytest.fixture(scope="session")
def dynamo_endpoint() -> Iterator[Endpoint]:
    """The session's DynamoDB endpoint (env -> Docker DynamoDB Local -> moto)."""
    with pytest.MonkeyPatch.context() as patch:
        explicit = os.environ.get("FLOWY_DYNAMODB_ENDPOINT")
        if explicit:
            yield Endpoint(explicit, "env", os.environ.get("AWS_DEFAULT_REGION", "us-east-1"))
            return
        patch.setenv("AWS_ACCESS_KEY_ID", "testing")  # an emulator takes any credentials
        patch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        patch.delenv("AWS_SESSION_TOKEN", raising=False)
        patch.delenv("AWS_PROFILE", raising=False)
        if _docker_configured() and docker_available():
            container, url = _dynamodb_local()
            try:
                yield Endpoint(url, "dynamodb-local")
            finally:
                container.stop()
            return
        try:
            server = SerializedMotoServer()
        except ImportError as exc:  # pragma: no cover - moto is a dev dependency
            backend_missing(f"no DynamoDB endpoint (FLOWY_DYNAMODB_ENDPOINT, Docker, moto): {exc}")
        url = server.start()
        try:
            yield Endpoint(url, "moto", after_test=server.forget_tracked_instances)
        finally:
            server.stop()


@pytest.fixture
def table_name(dynamo_endpoint: Endpoint) -> Iterator[str]:
    """A table name for this test; the table (if made) is deleted afterwards."""
    name = f"flowy-test-{uuid.uuid4().hex[:16]}"
    yield name
    client = dynamo_endpoint.client()
    try:
        client.delete_table(TableName=name)
    except client.exceptions.ResourceNotFoundException:
        pass
    finally:
        client.close()
        if dynamo_endpoint.after_test is not None:
            dynamo_endpoint.after_test()


@pytest.fixture
def flowy_url(dynamo_endpoint: Endpoint, table_name: str) -> str:
    """The conformance suite's store: a fresh table, one machine's clock (no skew)."""
    return dynamo_endpoint.store_url(table_name, max_attempts=3, clock_skew=0)


@pytest.fixture
def raw_client(dynamo_endpoint: Endpoint) -> Iterator[Any]:
    """A plain boto3 client on the endpoint (to inspect and damage items)."""
    client = dynamo_endpoint.client()
    yield client
    client.close()


def corrupt_thread(client: Any, table: str, thread_id: str) -> None:
    """Flip one byte of the thread's head record and of its history entry."""
    pk = thread_key(thread_id)
    key = {"pk": {"S": pk}, "sk": {"S": "head"}}
    head = client.get_item(TableName=table, Key=key, ConsistentRead=True).get("Item")
    if head is None or "revision" not in head:
        raise ThreadNotFoundError(f"no checkpoint for thread {thread_id!r}")
    for sk in ("head", f"rev#{int(head['revision']['N']):020d}"):
        key = {"pk": {"S": pk}, "sk": {"S": sk}}
        item = client.get_item(TableName=table, Key=key, ConsistentRead=True)["Item"]
        data = bytearray(item["record"]["B"])
        data[len(data) // 2] ^= 0xFF
        client.update_item(
            TableName=table,
            Key=key,
            UpdateExpression="SET #r = :r",
            ExpressionAttributeNames={"#r": "record"},
            ExpressionAttributeValues={":r": {"B": bytes(data)}},
        )


@pytest.fixture
def flowy_corrupt() -> Callable[[Backend[Any], str], Any]:
    """Flips one byte of a thread's stored head record (and its history entry)."""

    async def corrupt(backend: Backend[Any], thread_id: str) -> None:
        assert isinstance(backend, DynamoBackend)
        table = backend.table
        corrupt_thread(table.client, table.name, thread_id)

    return corrupt


def _scan(url: str) -> object:
    parts = urllib.parse.urlsplit(url)
    options = dict(urllib.parse.parse_qsl(parts.query))
    client: Any = make_client(
        region=options.get("region"), endpoint_url=options.get("endpoint_url")
    )
    try:
        items: list[str] = []
        pages: Any = client.get_paginator("scan").paginate(
            TableName=parts.netloc, ConsistentRead=True
        )
        for page in pages:
            found: list[dict[str, Any]] = page["Items"]
            items.extend(repr(sorted(item.items())) for item in found)
        return sorted(items)
    except client.exceptions.ResourceNotFoundException:
        return []
    finally:
        client.close()


async def dump_store(url: str) -> object:
    """Every item of the URL's table, as stored (none when the table does not exist)."""
    return await asyncio.to_thread(_scan, url)


@pytest.fixture
def flowy_dump() -> Dump:
    """Everything a DynamoDB store holds in its table, as stored."""
    return dump_store


def _record_version(url: str, version: int) -> None:
    parts = urllib.parse.urlsplit(url)
    options = dict(urllib.parse.parse_qsl(parts.query))
    client: Any = make_client(
        region=options.get("region"), endpoint_url=options.get("endpoint_url")
    )
    try:
        item = {**SCHEMA_KEY, "version": {"N": str(version)}}
        client.put_item(TableName=parts.netloc, Item=item)
    finally:
        client.close()


async def record_schema_version(url: str, version: int) -> None:
    """Record ``version`` in the schema item of the URL's table."""
    await asyncio.to_thread(_record_version, url, version)


@pytest.fixture
def flowy_schema_version() -> SetSchemaVersion:
    """Records a schema version in a DynamoDB table."""
    return record_schema_version
