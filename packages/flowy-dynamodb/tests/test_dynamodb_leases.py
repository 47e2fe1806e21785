"""DynamoDB-specific lease tests: the lease on the head item, the clock-skew allowance,
fencing tokens that never go back (time to live and clean-up included), and the check
of this client's clock against DynamoDB's."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

import flowy
from flowy.errors import LeaseLostError, ThreadLeaseBusyError
from flowy.storage import RunStatus, Snapshot
from flowy.storage.dialect import new_write_id
from flowy_dynamodb import ClockSkewError, DynamoBackend, thread_key
from flowy_dynamodb._table import ClockWatch

pytestmark = pytest.mark.anyio


def snap(thread_id: str, status: RunStatus = RunStatus.RUNNING) -> Snapshot[Any]:
    return Snapshot(
        thread_id=thread_id, state={}, execution_pointer="p", status=status, write_id=new_write_id()
    )


def items_of(client: Any, table: str, thread_id: str) -> dict[str, dict[str, Any]]:
    """Every item of the thread's partition, by sort key."""
    found = client.query(
        TableName=table,
        KeyConditionExpression="#pk = :pk",
        ExpressionAttributeNames={"#pk": "pk"},
        ExpressionAttributeValues={":pk": {"S": thread_key(thread_id)}},
        ConsistentRead=True,
    )["Items"]
    return {item["sk"]["S"]: item for item in found}


@pytest.fixture
async def backend(dynamo_endpoint: Any, table_name: str) -> AsyncIterator[DynamoBackend[Any]]:
    """A store on a fresh table, one machine's clock (no skew allowance)."""
    async with flowy.connect(dynamo_endpoint.store_url(table_name, clock_skew=0)) as opened:
        assert isinstance(opened, DynamoBackend)
        yield opened


async def test_the_lease_lives_on_the_head_item(
    backend: DynamoBackend[Any], raw_client: Any, table_name: str
) -> None:
    tid = f"attrs-{uuid.uuid4().hex}"
    before = time.time()
    lease = await backend.leases.acquire(tid, "owner-1", 30)
    await backend.checkpointer.save(0, snap(tid), lease=lease)
    head = items_of(raw_client, table_name, tid)["head"]
    assert head["lease_owner"]["S"] == "owner-1"
    assert int(head["lease_token"]["N"]) == lease.fencing_token
    assert float(head["lease_expires_at"]["N"]) == pytest.approx(lease.expires_at)
    # The token is the time of the acquisition in microseconds (or one more than the last).
    assert before * 1e6 <= lease.fencing_token <= time.time() * 1e6


async def test_takeover_waits_for_the_skew_allowance(dynamo_endpoint: Any, table_name: str) -> None:
    url = dynamo_endpoint.store_url(table_name, clock_skew=3.0)
    async with flowy.connect(url) as backend:
        leases, cp = backend.leases, backend.checkpointer
        tid = f"skew-{uuid.uuid4().hex}"
        first = await leases.acquire(tid, "a", 0.2)
        await asyncio.sleep(0.4)  # expired by its holder's clock, inside the 3 s allowance
        with pytest.raises(ThreadLeaseBusyError):
            await leases.acquire(tid, "b", 10)
        held = await leases.holder(tid)
        assert held is not None and (held.owner, held.fencing_token) == ("a", first.fencing_token)
        # Its holder no longer trusts it...
        with pytest.raises(LeaseLostError):
            await leases.renew(first, 10)
        with pytest.raises(LeaseLostError):
            await cp.save(0, snap(tid), lease=first)
        # ...and nobody may write without it inside the allowance either.
        with pytest.raises(ThreadLeaseBusyError):
            await cp.save(0, snap(tid))
        with pytest.raises(ThreadLeaseBusyError):
            await cp.delete_if_idle(tid)
        await asyncio.sleep(max(0.0, first.expires_at + 3.05 - time.time()))  # past it
        assert await leases.holder(tid) is None
        second = await leases.acquire(tid, "b", 10)
        assert second.fencing_token > first.fencing_token
        assert await cp.save(0, snap(tid), lease=second) == 1


# -- fencing tokens and time to live ----------------------------------------------------


async def test_a_head_deleted_by_time_to_live_does_not_bring_tokens_back(
    dynamo_endpoint: Any, table_name: str, raw_client: Any
) -> None:
    """A completed head carries both its time to live and the lease token. When DynamoDB
    deletes it, a counter would start again at 1 and the same owner's next lease would
    equal a stale one of the deleted incarnation."""
    url = dynamo_endpoint.store_url(table_name, clock_skew=0, expire_after=3600)
    async with flowy.connect(url) as backend:
        leases, cp = backend.leases, backend.checkpointer
        tid = f"ttl-token-{uuid.uuid4().hex}"
        stale = await leases.acquire(tid, "worker-1", 30)
        assert await cp.save(0, snap(tid, RunStatus.COMPLETED), lease=stale) == 1
        items = items_of(raw_client, table_name, tid)
        assert {"expires", "lease_token"} <= set(items["head"])
        # What DynamoDB's time to live does (moto never expires items).
        for item in items.values():
            if "expires" in item:
                raw_client.delete_item(
                    TableName=table_name, Key={"pk": item["pk"], "sk": item["sk"]}
                )
        assert items_of(raw_client, table_name, tid) == {}
        with pytest.raises(LeaseLostError):
            await cp.save(0, snap(tid), lease=stale)
        fresh = await leases.acquire(tid, "worker-1", 30)  # the same owner name again
        assert fresh.fencing_token > stale.fencing_token
        for action in (
            cp.save(0, snap(tid), lease=stale),
            leases.renew(stale, 30),
            leases.release(stale),
        ):
            with pytest.raises(LeaseLostError):
                await action
        assert await cp.save(0, snap(tid), lease=fresh) == 1


async def test_a_completed_head_outlives_a_lease_taken_on_it(
    dynamo_endpoint: Any, table_name: str, raw_client: Any
) -> None:
    url = dynamo_endpoint.store_url(table_name, clock_skew=0, expire_after=1)
    async with flowy.connect(url) as backend:
        tid = f"ttl-lease-{uuid.uuid4().hex}"
        await backend.checkpointer.save(0, snap(tid, RunStatus.COMPLETED))
        expires = int(items_of(raw_client, table_name, tid)["head"]["expires"]["N"])
        assert expires <= time.time() + 2
        lease = await backend.leases.acquire(tid, "w", 60)
        assert int(items_of(raw_client, table_name, tid)["head"]["expires"]["N"]) > lease.expires_at
        renewed = await backend.leases.renew(lease, 120)
        assert (
            int(items_of(raw_client, table_name, tid)["head"]["expires"]["N"]) > renewed.expires_at
        )


# -- clean-up ---------------------------------------------------------------------------


async def test_released_and_deleted_threads_leave_no_lease_record(
    backend: DynamoBackend[Any], raw_client: Any, table_name: str
) -> None:
    leases, cp = backend.leases, backend.checkpointer
    tid = f"cleanup-{uuid.uuid4().hex}"
    first = await leases.acquire(tid, "a", 30)
    assert set(items_of(raw_client, table_name, tid)) == {"head"}  # a lease-only item
    await leases.release(first)
    assert items_of(raw_client, table_name, tid) == {}

    second = await leases.acquire(tid, "a", 30)
    assert second.fencing_token > first.fencing_token
    await cp.save(0, snap(tid), lease=second)
    await leases.release(second)
    head = items_of(raw_client, table_name, tid)["head"]
    assert not {"lease_owner", "lease_expires_at", "lease_token"} & set(head)

    await cp.delete(tid)
    assert items_of(raw_client, table_name, tid) == {}
    third = await leases.acquire(tid, "b", 30)
    assert third.fencing_token > second.fencing_token

    # An expired lease is removed by the delete of its thread, too.
    await cp.save(0, snap(tid), lease=third)
    await leases.release(third)
    fourth = await leases.acquire(tid, "c", 0.2)
    await asyncio.sleep(0.3)
    await cp.delete_if_idle(tid)
    assert items_of(raw_client, table_name, tid) == {}
    assert (await leases.acquire(tid, "d", 30)).fencing_token > fourth.fencing_token


async def test_an_abandoned_lease_only_item_expires(
    backend: DynamoBackend[Any], raw_client: Any, table_name: str
) -> None:
    """A lease on a thread that was never saved, whose holder vanished, is deleted by
    DynamoDB's time to live once it is over (plus the skew allowance)."""
    tid = f"abandoned-{uuid.uuid4().hex}"
    lease = await backend.leases.acquire(tid, "crashed", 30)
    head = items_of(raw_client, table_name, tid)["head"]
    assert lease.expires_at < int(head["expires"]["N"]) <= lease.expires_at + 2
    renewed = await backend.leases.renew(lease, 60)
    head = items_of(raw_client, table_name, tid)["head"]
    assert renewed.expires_at < int(head["expires"]["N"]) <= renewed.expires_at + 2
    await backend.checkpointer.save(0, snap(tid), lease=renewed)  # now a thread: kept
    assert "expires" not in items_of(raw_client, table_name, tid)["head"]


async def test_a_fresh_token_outlives_its_lease_for_the_skew_allowance(
    dynamo_endpoint: Any, table_name: str, raw_client: Any
) -> None:
    """With clock_skew > 0 a client whose clock is behind could issue a smaller token for
    clock_skew seconds after a token was issued: until then release and delete keep it
    (on a lease-only item with a time to live); afterwards they remove it."""
    async with flowy.connect(dynamo_endpoint.store_url(table_name, clock_skew=3)) as backend:
        leases, cp = backend.leases, backend.checkpointer
        tid = f"floor-{uuid.uuid4().hex}"
        lease = await leases.acquire(tid, "a", 30)
        await cp.save(0, snap(tid), lease=lease)
        await leases.release(lease)
        head = items_of(raw_client, table_name, tid)["head"]
        assert int(head["lease_token"]["N"]) == lease.fencing_token
        assert "lease_owner" not in head and "lease_expires_at" not in head
        await cp.delete(tid)
        [floor] = items_of(raw_client, table_name, tid).values()
        assert set(floor) == {"pk", "sk", "thread_id", "lease_token", "expires"}
        assert int(floor["expires"]["N"]) <= lease.fencing_token / 1e6 + 3 + 2
        again = await leases.acquire(tid, "b", 30)
        assert again.fencing_token > lease.fencing_token
        await asyncio.sleep(max(0.0, again.fencing_token / 1e6 + 3.05 - time.time()))
        await leases.release(again)
        assert items_of(raw_client, table_name, tid) == {}


# -- the clock check ---------------------------------------------------------------------


async def test_a_client_clock_far_ahead_refuses_to_take_leases(
    dynamo_endpoint: Any, table_name: str
) -> None:
    """A client whose clock is ahead by more than ttl + clock_skew would see every live
    lease as expired and take it over; it measures its clock against DynamoDB's (the Date
    of moto's answers here) and refuses instead."""
    url = dynamo_endpoint.store_url(table_name, clock_skew=2)
    async with flowy.connect(url) as honest:
        assert isinstance(honest, DynamoBackend)
        tid = f"clock-{uuid.uuid4().hex}"
        lease = await honest.leases.acquire(tid, "honest", 5)
        client = dynamo_endpoint.client()
        ahead: DynamoBackend[Any] = DynamoBackend[Any].from_client(
            client, table_name, clock_skew=2, clock=lambda: time.time() + 5 + 2 + 1
        )
        async with ahead:
            with pytest.raises(ClockSkewError, match="clock") as info:
                await ahead.leases.acquire(tid, "ahead", 5)
            assert isinstance(info.value, LeaseLostError)
            with pytest.raises(ClockSkewError):
                await ahead.leases.renew(lease, 5)
            assert ahead.table.watch.skew > 7
        client.close()
        holder = await honest.leases.holder(tid)
        assert holder is not None and holder.fencing_token == lease.fencing_token
        assert honest.table.watch.skew <= 1


async def test_a_clock_within_the_bound_takes_leases(dynamo_endpoint: Any, table_name: str) -> None:
    client = dynamo_endpoint.client()
    skewed: DynamoBackend[Any] = DynamoBackend[Any].from_client(
        client, table_name, clock_skew=4, clock=lambda: time.time() + 0.5
    )
    async with skewed:
        lease = await skewed.leases.acquire(f"near-{uuid.uuid4().hex}", "w", 5)
        await skewed.leases.renew(lease, 5)
    client.close()


def test_clock_watch_narrows_to_the_offset_and_starts_over_when_stepped() -> None:
    watch = ClockWatch()
    assert watch.skew == 0.0
    watch.sample(100.0, 100.1, None)  # no Date: nothing learnt
    assert (watch.low, watch.high) == (float("-inf"), float("inf"))
    date = "Thu, 01 Jan 1970 00:01:50 GMT"  # 110 s: the server is about 10 s ahead
    watch.sample(100.2, 100.3, date)
    assert watch.low == pytest.approx(9.7) and watch.high == pytest.approx(10.8)
    watch.sample(100.8, 100.9, date)  # a later moment of the same second narrows it
    assert watch.low == pytest.approx(9.7, abs=1e-3) and watch.high == pytest.approx(10.2, abs=1e-3)
    assert watch.skew == pytest.approx(9.7, abs=1e-3)
    watch.sample(200.0, 200.1, "Thu, 01 Jan 1970 00:03:20 GMT")  # stepped: agrees now
    assert watch.low <= 0 <= watch.high and watch.skew == 0.0
    watch.sample(300.0, 300.1, "not a date")
    assert watch.skew == 0.0
