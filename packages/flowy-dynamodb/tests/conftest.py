"""Fixtures: a DynamoDB endpoint for the session and a fresh table per test.

The endpoint is found in this order: ``FLOWY_DYNAMODB_ENDPOINT``; DynamoDB Local in a
container when a Docker engine answers; moto's server mode in this process (real HTTP
through boto3). Dummy credentials are passed to the clients
here only. Each test gets its own table, deleted afterwards.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from boto3.session import Session
from moto.core.model_instances import reset_model_data
from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import BaseWSGIServer, make_server

from flowy.testing import BackendBundle
from flowy.testing.backends import backend_missing, docker_available
from flowy_dynamodb import DynamoBackend, create_table, make_client, thread_key

StartResponse = Callable[..., Any]


class _QuietHandler(MotoRequestHandler):
    def log_request(self, *args: Any, **kwargs: Any) -> None:
        pass


class SerializedMotoServer:
    """moto's DynamoDB on ``host`` (port chosen by the OS), one request at a time."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._host = host
        self._server: BaseWSGIServer | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        inner: Any = DomainDispatcherApplication(create_backend_app)
        self._inner = inner

    def _app(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        with self._lock:
            body = b"".join(self._inner(environ, start_response))
        return [body]

    def start(self) -> str:
        """Start serving; return the endpoint URL."""
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        server = make_server(self._host, 0, self._app, threaded=True, request_handler=_QuietHandler)
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name="moto-dynamodb", daemon=True
        )
        self._thread.start()
        return f"http://{self._host}:{server.server_port}"

    def forget_tracked_instances(self) -> None:
        """Drop moto's record of every model object it ever made.

        moto keeps each instance it creates in a class-level list (for its dashboard);
        a transaction deep-copies its table, so without this the process would keep
        every copy alive and garbage collection would stall for seconds.
        """
        with self._lock:
            reset_model_data()

    def stop(self) -> None:
        """Stop serving and wait for the server thread."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)


# One session for every client of the run: it caches the service model, so a new client
# (with its own connection pool) costs milliseconds instead of a model load.
_SESSION = Session()


@dataclass(frozen=True)
class Endpoint:
    """Where the tests talk to DynamoDB."""

    url: str
    kind: str
    region: str = "us-east-1"
    after_test: Callable[[], None] | None = None

    def client(self, **options: Any) -> Any:
        """A new boto3 client for this endpoint (dummy credentials unless the
        environment has real ones for an explicit endpoint)."""
        credentials: dict[str, Any] = {}
        if self.kind != "env" or not os.environ.get("AWS_ACCESS_KEY_ID"):
            credentials = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
        options.setdefault("max_attempts", 3)
        return make_client(
            endpoint_url=self.url,
            region_name=self.region,
            session=_SESSION,
            **credentials,
            **options,
        )


def _dynamodb_local() -> tuple[Any, str]:
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.waiting_utils import wait_for_logs

    container: Any = DockerContainer("amazon/dynamodb-local:latest").with_exposed_ports(8000)
    container.start()
    wait_for_logs(container, "CorsParams", timeout=60)
    url = f"http://{container.get_container_host_ip()}:{container.get_exposed_port(8000)}"
    return container, url


def _docker_configured() -> bool:
    # Only ask for a Docker engine when one could answer: a failed probe leaves an
    # unclosed socket behind, which pytest (warnings as errors) reports.
    return bool(os.environ.get("DOCKER_HOST")) or os.path.exists("/var/run/docker.sock")


@pytest.fixture(scope="session")
def dynamo_endpoint() -> Iterator[Endpoint]:
    """The session's DynamoDB endpoint (env -> Docker DynamoDB Local -> moto)."""
    explicit = os.environ.get("FLOWY_DYNAMODB_ENDPOINT")
    if explicit:
        yield Endpoint(explicit, "env", os.environ.get("AWS_DEFAULT_REGION", "us-east-1"))
        return
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
        backend_missing(f"no DynamoDB endpoint: FLOWY_DYNAMODB_ENDPOINT unset, no Docker, {exc}")
    url = server.start()
    try:
        yield Endpoint(url, "moto", after_test=server.forget_tracked_instances)
    finally:
        server.stop()


@pytest.fixture
def table_name(dynamo_endpoint: Endpoint) -> Iterator[str]:
    """A new table for this test (deleted afterwards)."""
    name = f"flowy-test-{uuid.uuid4().hex[:16]}"
    client = dynamo_endpoint.client()
    create_table(client, name)
    try:
        yield name
    finally:
        try:
            client.delete_table(TableName=name)
        except Exception:
            pass
        if dynamo_endpoint.after_test is not None:
            dynamo_endpoint.after_test()


@pytest.fixture
def raw_client(dynamo_endpoint: Endpoint) -> Any:
    """A plain boto3 client on the endpoint (for inspecting and damaging items)."""
    return dynamo_endpoint.client()


async def corrupt_thread(client: Any, table: str, thread_id: str) -> None:
    """Flip one byte of the thread's head record and of its newest history entry."""
    pk = thread_key(thread_id)
    head = client.get_item(
        TableName=table, Key={"pk": {"S": pk}, "sk": {"S": "head"}}, ConsistentRead=True
    )["Item"]
    revision = int(head["revision"]["N"])
    for sk in ("head", f"rev#{revision:020d}"):
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


def make_bundle(endpoint: Endpoint, table: str, name: str) -> tuple[BackendBundle, Any]:
    """A BackendBundle over ``table`` with its own client and thread pool."""
    client = endpoint.client()
    # One machine, one clock: no skew allowance, so lease expiry is exact.
    backend: DynamoBackend[Any] = DynamoBackend[Any].create(
        client, table, clock_skew=0.0, max_workers=8, max_attempts=3
    )

    async def corrupt(thread_id: str) -> None:
        await corrupt_thread(client, table, thread_id)

    async def open_peer() -> BackendBundle:
        peer, _ = make_bundle(endpoint, table, f"{name}-peer")
        return peer

    bundle = BackendBundle(
        checkpointer=backend.checkpointer,
        leases=backend.leases,
        outbox=backend.outbox,
        consumer=backend.consumer,
        corrupt=corrupt,
        open_peer=open_peer,
        close=backend.close,
        name=name,
    )
    return bundle, backend


@pytest.fixture
async def flowy_backend(dynamo_endpoint: Endpoint, table_name: str) -> AsyncIterator[BackendBundle]:
    """The conformance suite's backend: the four components on a fresh table."""
    bundle, backend = make_bundle(dynamo_endpoint, table_name, f"dynamodb-{dynamo_endpoint.kind}")
    try:
        yield bundle
    finally:
        await backend.close()


@pytest.fixture
async def backend(dynamo_endpoint: Endpoint, table_name: str) -> AsyncIterator[DynamoBackend[Any]]:
    """A DynamoBackend on a fresh table (clock skew 0: one machine, one clock)."""
    b: DynamoBackend[Any] = DynamoBackend[Any].create(
        dynamo_endpoint.client(), table_name, clock_skew=0.0, max_attempts=3
    )
    try:
        yield b
    finally:
        await b.close()


def wait_until(predicate: Any, timeout: float = 5.0) -> None:
    """Poll ``predicate()`` until true (for eventually consistent index reads)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)
