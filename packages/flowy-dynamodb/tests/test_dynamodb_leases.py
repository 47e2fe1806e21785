"""DynamoDB-specific lease tests: the client-clock skew allowance, fencing tokens on
the head item, and saves checked against the lease in the same write."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from flowy import LeaseLostError, Snapshot, ThreadLeaseBusyError
from flowy.checkpoint import new_write_id
from flowy_dynamodb import DynamoBackend

pytestmark = pytest.mark.anyio


class FakeClock:
    """A settable epoch clock shared by every component of a backend."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def snap(thread_id: str) -> Snapshot[Any]:
    return Snapshot(thread_id=thread_id, state={}, execution_pointer="p", write_id=new_write_id())


@pytest.fixture
async def skewed(dynamo_endpoint: Any, table_name: str) -> Any:
    clock = FakeClock()
    backend: DynamoBackend[Any] = DynamoBackend[Any].create(
        dynamo_endpoint.client(), table_name, clock_skew=5.0, clock=clock
    )
    try:
        yield backend, clock
    finally:
        await backend.close()


async def test_takeover_waits_for_the_skew_allowance(skewed: Any) -> None:
    backend, clock = skewed
    leases = backend.leases
    tid = f"skew-{uuid.uuid4().hex}"
    first = await leases.acquire(tid, "a", 10)
    clock.now += 12  # expired by 2 s on this clock, but within the 5 s allowance
    with pytest.raises(ThreadLeaseBusyError):
        await leases.acquire(tid, "b", 10)
    held = await leases.holder(tid)
    assert held is not None
    assert (held.owner, held.token) == ("a", first.token)
    # The holder itself no longer trusts its lease once expired by its own clock.
    with pytest.raises(LeaseLostError):
        await leases.renew(first, 10)
    with pytest.raises(LeaseLostError):
        await backend.checkpointer.save(0, snap(tid), lease=first)
    # Nobody may write without the lease inside the allowance either.
    with pytest.raises(ThreadLeaseBusyError):
        await backend.checkpointer.save(0, snap(tid))
    with pytest.raises(ThreadLeaseBusyError):
        await backend.checkpointer.delete_if_idle(tid)
    clock.now += 3.5  # past expiry + allowance
    assert await leases.holder(tid) is None
    second = await leases.acquire(tid, "b", 10)
    assert second.token == first.token + 1
    assert await backend.checkpointer.save(0, snap(tid), lease=second) == 1


async def test_lease_attributes_live_on_the_head_item(
    skewed: Any, raw_client: Any, table_name: str
) -> None:
    from flowy_dynamodb import thread_key

    backend, clock = skewed
    tid = f"attrs-{uuid.uuid4().hex}"
    lease = await backend.leases.acquire(tid, "owner-1", 30)
    await backend.checkpointer.save(0, snap(tid), lease=lease)
    item = raw_client.get_item(
        TableName=table_name,
        Key={"pk": {"S": thread_key(tid)}, "sk": {"S": "head"}},
        ConsistentRead=True,
    )["Item"]
    assert item["lease_owner"]["S"] == "owner-1"
    assert item["lease_token"]["N"] == str(lease.token)
    assert float(item["lease_expires_at"]["N"]) == pytest.approx(clock.now + 30)
    await backend.leases.release(lease)
    item = raw_client.get_item(
        TableName=table_name,
        Key={"pk": {"S": thread_key(tid)}, "sk": {"S": "head"}},
        ConsistentRead=True,
    )["Item"]
    assert "lease_owner" not in item
    assert "lease_expires_at" not in item
    assert item["lease_token"]["N"] == str(lease.token)  # kept: tokens never go back


async def test_invalid_arguments(skewed: Any) -> None:
    backend, _ = skewed
    with pytest.raises(ValueError, match="ttl"):
        await backend.leases.acquire("t", "o", 0)
    lease = await backend.leases.acquire(f"args-{uuid.uuid4().hex}", "o", 5)
    with pytest.raises(ValueError, match="ttl"):
        await backend.leases.renew(lease, -1)
    with pytest.raises(LeaseLostError, match="is for thread"):
        await backend.checkpointer.save(0, snap("another"), lease=lease)
