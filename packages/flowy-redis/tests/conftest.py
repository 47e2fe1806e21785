"""Fixtures of the flowy-redis tests: find (or start) a standalone Redis and a Redis
Cluster, and give each test its own namespace, deleted afterwards. The conformance suite
(``flowy_url``, ``flowy_corrupt``) runs on both; the plugin ``flowy.testing.plugin`` is
loaded by the root pytest configuration (``-p flowy.testing.plugin``).

Standalone: ``FLOWY_REDIS_URL``; else a server on 127.0.0.1:6379; else a testcontainers
Redis when Docker answers. Cluster: ``FLOWY_REDIS_CLUSTER_URL``; else three local
``redis-server --cluster-enabled yes`` nodes started for the session and joined with
``redis-cli --cluster create``. A backend that cannot be found skips the tests (fails
them under ``FLOWY_REQUIRE_BACKENDS=1``).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# The tests import their shared code (redis_support.py) by plain module name; pytest
# runs with --import-mode=importlib, which does not put test directories on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from redis_support import BackendFactory, RedisTarget, client_for, corrupt_head, new_namespace

from flowy.storage import Backend
from flowy.storage.dialect import StoreURL
from flowy.testing import Dump
from flowy.testing.backends import backend_missing, docker_available, port_open
from flowy.testing.hooks import SetSchemaVersion
from flowy_redis import RedisBackend, purge_namespace
from flowy_redis._backend import open_backend


@pytest.fixture(scope="session")
def standalone_url() -> Iterator[str]:
    env = os.environ.get("FLOWY_REDIS_URL")
    if env:
        yield env
        return
    if port_open("127.0.0.1", 6379):
        yield "redis://127.0.0.1:6379/0"
        return
    if docker_available():
        from testcontainers.redis import RedisContainer

        with RedisContainer("redis:7") as container:
            host = container.get_container_host_ip()
            port = container.get_exposed_port(6379)
            yield f"redis://{host}:{port}/0"
        return
    backend_missing(
        "no Redis server found: set FLOWY_REDIS_URL, run redis-server on 127.0.0.1:6379, "
        "or install Docker for testcontainers"
    )


def _free_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free too."""
    for _ in range(200):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port + 10000 > 65535:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair for a Redis Cluster node")


def _cluster_ok(port: int) -> bool:
    out = subprocess.run(
        ["redis-cli", "-p", str(port), "cluster", "info"],
        capture_output=True,
        text=True,
        timeout=5,
        check=False,
    ).stdout
    return "cluster_state:ok" in out


@pytest.fixture(scope="session")
def cluster_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    env = os.environ.get("FLOWY_REDIS_CLUSTER_URL")
    if env:
        yield env
        return
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server is None or cli is None:
        backend_missing(
            "no Redis Cluster: set FLOWY_REDIS_CLUSTER_URL, or install redis-server and "
            "redis-cli so the tests can start a local three-node cluster"
        )
    workdir: Path = tmp_path_factory.mktemp("redis-cluster")
    ports: list[int] = []
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(3):
            port = _free_port()
            ports.append(port)
            with (workdir / f"node-{port}.log").open("wb") as log:
                procs.append(
                    subprocess.Popen(
                        [
                            server,
                            *("--port", str(port), "--bind", "127.0.0.1"),
                            *("--cluster-enabled", "yes"),
                            *("--cluster-config-file", str(workdir / f"nodes-{port}.conf")),
                            *("--cluster-node-timeout", "5000"),
                            *("--save", "", "--appendonly", "no", "--daemonize", "no"),
                            *("--dir", str(workdir)),
                        ],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
        for port in ports:
            deadline = time.monotonic() + 10
            while not port_open("127.0.0.1", port):
                if time.monotonic() > deadline:
                    backend_missing(f"redis-server on port {port} did not start (see {workdir})")
                time.sleep(0.05)
        created = subprocess.run(
            [
                cli,
                "--cluster",
                "create",
                *(f"127.0.0.1:{p}" for p in ports),
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if created.returncode != 0:
            backend_missing(f"redis-cli --cluster create failed: {created.stdout}{created.stderr}")
        deadline = time.monotonic() + 30
        while not all(_cluster_ok(p) for p in ports):
            if time.monotonic() > deadline:
                backend_missing(
                    f"the local Redis Cluster did not reach cluster_state:ok ({workdir})"
                )
            time.sleep(0.1)
        yield f"redis://127.0.0.1:{ports[0]}"
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


@pytest.fixture(params=["standalone", "cluster"])
def redis_target(request: pytest.FixtureRequest) -> RedisTarget:
    """Each test that uses it runs against a standalone server and against a cluster."""
    cluster = request.param == "cluster"
    url: str = request.getfixturevalue("cluster_url" if cluster else "standalone_url")
    return RedisTarget(url, cluster)


@pytest.fixture
def standalone(standalone_url: str) -> RedisTarget:
    """The standalone server only."""
    return RedisTarget(standalone_url, False)


@pytest.fixture
async def namespace(redis_target: RedisTarget) -> AsyncIterator[str]:
    """A namespace of the test's own, every key of it deleted afterwards."""
    async for name in _namespace(redis_target):
        yield name


@pytest.fixture
async def standalone_namespace(standalone: RedisTarget) -> AsyncIterator[str]:
    """``namespace`` on the standalone server only."""
    async for name in _namespace(standalone):
        yield name


@pytest.fixture
async def cluster_namespace(cluster_url: str) -> AsyncIterator[str]:
    """``namespace`` on the cluster only."""
    async for name in _namespace(RedisTarget(cluster_url, True)):
        yield name


async def _namespace(target: RedisTarget) -> AsyncIterator[str]:
    name = new_namespace()
    try:
        yield name
    finally:
        cleaner = client_for(target)
        try:
            await purge_namespace(cleaner, name)
        finally:
            await cleaner.aclose()


@pytest.fixture
def flowy_url(redis_target: RedisTarget, namespace: str) -> str:
    """The conformance suite's store: a fresh namespace on standalone Redis, then on a
    Redis Cluster."""
    return redis_target.store_url(namespace=namespace, max_attempts=3)


@pytest.fixture
def flowy_corrupt() -> Callable[[Backend[Any], str], Awaitable[None]]:
    """Flips a byte of a thread's head record (its history entry at the head revision)."""

    async def corrupt(backend: Backend[Any], thread_id: str) -> None:
        assert isinstance(backend, RedisBackend)
        await corrupt_head(backend, thread_id)

    return corrupt


@pytest.fixture
async def make_backend(redis_target: RedisTarget) -> AsyncIterator[BackendFactory]:
    """Build ``RedisBackend``s (own client each) on the test's namespace; every key of
    the namespace is deleted and every client closed afterwards."""
    async for factory in _factory(redis_target):
        yield factory


@pytest.fixture
async def make_standalone_backend(standalone: RedisTarget) -> AsyncIterator[BackendFactory]:
    """``make_backend`` on the standalone server only."""
    async for factory in _factory(standalone):
        yield factory


async def _factory(target: RedisTarget) -> AsyncIterator[BackendFactory]:
    made: list[RedisBackend[Any]] = []
    async for name in _namespace(target):

        def factory(namespace: str = name, **options: Any) -> RedisBackend[Any]:
            client = client_for(target, **options.pop("client_options", {}))
            backend: RedisBackend[Any] = RedisBackend(
                client, namespace=namespace, owns_client=True, **options
            )
            made.append(backend)
            return backend

        try:
            yield factory
        finally:
            for backend in made:
                await backend.aclose()


async def dump_store(url: str) -> object:
    """Every key of the URL's namespace with its ``DUMP`` (the value as stored)."""
    backend = await open_backend(StoreURL.parse(url), codec=None)  # not opened: no writes
    store = backend.store
    try:
        keys = [key async for key in store.scan(store.layout.pattern())]
        keys.append(store.layout.meta)
        dumped: dict[bytes, bytes] = {}
        for key in keys:
            client: Any = backend.client
            value: bytes | None = await client.execute_command("DUMP", key)
            if value is not None:
                dumped[key] = value
        return dumped
    finally:
        await store.aclose()


@pytest.fixture
def flowy_dump() -> Dump:
    """Everything a Redis store holds in its namespace, as stored."""
    return dump_store


async def record_schema_version(url: str, version: int) -> None:
    """Record ``version`` as the key layout of the URL's namespace."""
    backend = await open_backend(StoreURL.parse(url), codec=None)  # not opened
    try:
        client: Any = backend.client
        await client.hset(backend.store.layout.meta, "layout", version)
    finally:
        await backend.store.aclose()


@pytest.fixture
def flowy_schema_version() -> SetSchemaVersion:
    """Records a key layout version in a Redis namespace."""
    return record_schema_version
