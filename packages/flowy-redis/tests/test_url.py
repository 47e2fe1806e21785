"""``flowy.connect`` on Redis URLs: the entry points, flowy's and redis-py's options,
refused options and values, and passwords kept out of errors and reprs."""

from __future__ import annotations

import importlib.metadata
from typing import Any

import pytest
from redis.asyncio import Redis, RedisCluster
from redis_support import RedisTarget, client_for

import flowy
from flowy.errors import BackendURLError, StorageError
from flowy_redis import CLIENT_OPTIONS, OPTIONS, RedisBackend, open_backend

pytestmark = pytest.mark.anyio

SCHEMES = {"redis", "rediss", "redis+cluster", "rediss+cluster"}


def test_the_schemes_are_registered_entry_points() -> None:
    points = importlib.metadata.entry_points(group="flowy.backends")
    mine = {p.name: p for p in points if p.value.startswith("flowy_redis")}
    assert set(mine) == SCHEMES
    assert {p.load() for p in mine.values()} == {open_backend}


async def test_connect_opens_a_redis_backend_with_its_options(
    standalone: RedisTarget, standalone_namespace: str
) -> None:
    namespace = standalone_namespace
    url = (
        f"{standalone.url}?namespace={namespace}&shards=4&max_attempts=2&completed_ttl=1.5"
        "&group=g&consumer=me&poll_interval=0.25&max_record_bytes=1000&socket_timeout=5"
        "&client_name=flowy-test"
    )
    async with flowy.connect(url) as backend:
        assert isinstance(backend, RedisBackend)
        assert backend.url == url
        assert (backend.namespace, backend.store.layout.shards) == (namespace, 4)
        assert backend.checkpointer.completed_ttl == 1.5
        assert backend.checkpointer.max_record_bytes == 1000
        consumer = backend.consumer
        assert (consumer.max_attempts, consumer.group, consumer.consumer) == (2, "g", "me")
        assert consumer.poll_interval == 0.25
        client = backend.client
        assert isinstance(client, Redis)
        kwargs = client.connection_pool.connection_kwargs
        assert (kwargs["socket_timeout"], kwargs["client_name"]) == (5.0, "flowy-test")
        assert await backend.checkpointer.list_threads() == []
    assert backend.closed


async def test_connect_opens_a_cluster_backend(cluster_url: str, cluster_namespace: str) -> None:
    url = RedisTarget(cluster_url, True).store_url(namespace=cluster_namespace)
    assert url.startswith("redis+cluster://")
    async with flowy.connect(url) as backend:
        assert isinstance(backend.client, RedisCluster)  # type: ignore[attr-defined]
        async with flowy.connect(backend.url) as peer:  # the URL reaches the store again
            assert isinstance(peer, RedisBackend)
            assert peer.checkpointer.fences(backend.leases)
    with pytest.raises(BackendURLError, match="database 0"):
        await flowy.connect(url.replace("?", "/3?"))


async def test_from_client_gives_a_url_to_the_same_store(
    redis_target: RedisTarget, namespace: str
) -> None:
    client = client_for(redis_target)
    try:
        backend = RedisBackend[Any].from_client(client, namespace=namespace, shards=3)
        async with backend, flowy.connect(backend.url) as peer:
            assert isinstance(peer, RedisBackend)
            assert peer.checkpointer.fences(backend.leases)
            assert (peer.namespace, peer.store.layout.shards) == (namespace, 3)
        assert await client.ping()  # pyright: ignore[reportUnknownMemberType]  # aclose left the application's client open
    finally:
        await client.aclose()


async def test_unknown_options_are_refused_with_the_known_ones() -> None:
    with pytest.raises(BackendURLError) as info:
        await flowy.connect("redis://localhost/0?namspace=x&decode_responses=true")
    message = str(info.value)
    assert "unknown option(s) decode_responses, namspace" in message
    for name in (*OPTIONS, *CLIENT_OPTIONS):
        assert name in message


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("shards=0", "shards"),
        ("shards=many", "shards"),
        ("max_attempts=0", "max_attempts"),
        ("completed_ttl=-1", "completed_ttl"),
        ("completed_ttl=0.0001", "completed_ttl"),
        ("poll_interval=0", "poll_interval"),
        ("namespace=a%7Bb", "namespace"),
        ("max_attempts=1&max_attempts=2", "max_attempts"),
        ("socket_timeout=soon", "socket_timeout"),
    ],
)
async def test_bad_option_values_name_the_option(query: str, named: str) -> None:
    with pytest.raises(BackendURLError, match=named) as info:
        await flowy.connect(f"redis://:hunter2@localhost:6379/0?{query}")
    assert "hunter2" not in str(info.value)


async def test_passwords_stay_out_of_errors_and_reprs(standalone: RedisTarget) -> None:
    host = standalone.url.split("://", 1)[1].split("/", 1)[0].rsplit("@", 1)[-1]
    url = f"redis://someone:hunter2@{host}/0?namespace=secret-test"
    backend = await open_backend(flowy.storage.dialect.StoreURL.parse(url), codec=None)
    try:
        assert "hunter2" not in repr(backend)
        assert "***" in repr(backend)
        with pytest.raises(StorageError) as info:  # the server has no such user
            await backend.open()
        assert "hunter2" not in str(info.value)
        assert "hunter2" not in repr(info.value)
    finally:
        await backend.aclose()
    assert backend.closed
