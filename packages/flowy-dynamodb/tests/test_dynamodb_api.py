"""The public facade: exported names, their module, and the protocols they implement."""

from __future__ import annotations

from typing import Any

import pytest

import flowy_dynamodb
from flowy.checkpoint import (
    FencingCheckpointer,
    LeaseManager,
    OutboxConsumer,
    TransactionalCheckpointer,
    TransactionalHandoffOutbox,
)
from flowy_dynamodb import DynamoBackend

pytestmark = pytest.mark.anyio


def test_exports() -> None:
    assert sorted(flowy_dynamodb.__all__) == sorted(set(flowy_dynamodb.__all__))
    for name in flowy_dynamodb.__all__:
        obj = getattr(flowy_dynamodb, name)
        if isinstance(obj, type):
            assert obj.__module__ == "flowy_dynamodb", name
            assert obj.__doc__, f"{name} has no docstring"


async def test_components_implement_the_protocols(dynamo_endpoint: Any, table_name: str) -> None:
    backend = DynamoBackend[Any].create(dynamo_endpoint.client(), table_name)
    try:
        assert isinstance(backend.checkpointer, FencingCheckpointer)
        assert isinstance(backend.checkpointer, TransactionalCheckpointer)
        assert isinstance(backend.leases, LeaseManager)
        assert isinstance(backend.outbox, TransactionalHandoffOutbox)
        assert isinstance(backend.consumer, OutboxConsumer)
        assert backend.consumer.max_attempts == 5
        assert backend.checkpointer.fences(backend.leases)
    finally:
        await backend.close()


async def test_connect_builds_a_client(
    dynamo_endpoint: Any, table_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from flowy import Snapshot

    if dynamo_endpoint.kind != "env" or not os.environ.get("AWS_ACCESS_KEY_ID"):
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    backend = DynamoBackend[Any].connect(
        table_name,
        endpoint_url=dynamo_endpoint.url,
        region_name=dynamo_endpoint.region,
        max_workers=3,
    )
    try:
        assert backend.executor.max_workers == 3
        snap: Snapshot[Any] = Snapshot(thread_id="c", state={"x": 1}, execution_pointer="p")
        assert await backend.checkpointer.save(0, snap) == 1
        assert (await backend.checkpointer.load("c"))[0].state == {"x": 1}
    finally:
        await backend.close()
