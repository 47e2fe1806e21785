"""DynamoDB-specific queue tests: a message's route and its place in the ``queues``
index, the queue item that counts claims against the limits (an ack ends a counted
claim, a claim whose visibility ended is pruned), a claim that loses the race for the
queue item taking nothing past a limit, and the upgrade of a schema 3 table."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

import flowy
from flowy.errors import SchemaVersionError
from flowy.queues import Route
from flowy.storage import HandoffIntent, HandoffStatus, ResumeToken
from flowy.storage.dialect import encode_intent
from flowy_dynamodb import DynamoBackend, thread_key

pytestmark = pytest.mark.anyio


DEFAULT = Route()


def intent(thread_id: str, route: Route = DEFAULT) -> HandoffIntent:
    return HandoffIntent(
        thread_id=thread_id,
        pending_snapshot_revision=1,
        committed_snapshot_revision=1,
        snapshot_revision=1,
        resume_token=ResumeToken(thread_id, 1),
        handoff_status=HandoffStatus.ENQUEUED,
        reason="handoff",
        execution_pointer="worker",
        created_at=1.0,
        route=route,
    )


def get(client: Any, table: str, pk: str, sk: str) -> dict[str, Any]:
    key = {"pk": {"S": pk}, "sk": {"S": sk}}
    item: dict[str, Any] = client.get_item(TableName=table, Key=key, ConsistentRead=True)
    return item.get("Item") or {}


def message(client: Any, table: str, thread_id: str) -> dict[str, Any]:
    return get(client, table, thread_key(thread_id), f"outbox#{1:020d}")


def flying(client: Any, table: str, queue: str) -> dict[str, Any]:
    item = get(client, table, "flowy#queues", f"queue#{queue}")
    entries: dict[str, Any] = item["flying"]["M"]
    return entries


@pytest.fixture
async def backend(dynamo_endpoint: Any, table_name: str) -> AsyncIterator[DynamoBackend[Any]]:
    async with flowy.connect(dynamo_endpoint.store_url(table_name, clock_skew=0)) as opened:
        assert isinstance(opened, DynamoBackend)
        yield opened


async def test_a_message_carries_its_route_and_its_place_in_the_queue(
    backend: DynamoBackend[Any], raw_client: Any, table_name: str
) -> None:
    tid = f"route-{uuid.uuid4().hex}"
    await backend.outbox.enqueue_intent(intent(tid, Route("mail", "customer-1", 3)))
    item = message(raw_client, table_name, tid)
    assert (item["queue"]["S"], item["partition"]["S"], item["priority"]["N"]) == (
        "mail",
        "customer-1",
        "3",
    )
    assert item["queue_key"]["S"].startswith("mail#")
    assert item["queue_order"]["S"].startswith(f"{3:010d}#")
    [claimed] = await backend.consumer.claim(1, 60, queue="mail")
    await backend.consumer.release(claimed, error="no", dead=True)
    assert "queue_key" not in message(raw_client, table_name, tid)  # out of the index
    await backend.consumer.retry_dead_letter(claimed.message_id)
    item = message(raw_client, table_name, tid)
    assert item["queue_key"]["S"].startswith("mail#") and item["priority"]["N"] == "3"


async def test_a_limited_claim_is_counted_in_the_queue_item_until_its_ack(
    backend: DynamoBackend[Any], raw_client: Any, table_name: str
) -> None:
    queue = f"count-{uuid.uuid4().hex[:8]}"
    await backend.queues.configure(queue, global_concurrency=2)
    tids = [f"c{i}-{uuid.uuid4().hex}" for i in range(2)]
    for tid in tids:
        await backend.outbox.enqueue_intent(intent(tid, Route(queue, "p")))
    one, two = await backend.consumer.claim(2, 60, queue=queue)
    entries = flying(raw_client, table_name, queue)
    assert set(entries) == {one.message_id, two.message_id}
    item = message(raw_client, table_name, tids[0])
    assert item["counted_in"]["S"] == queue
    assert entries[one.message_id]["M"]["u"]["N"] == item["in_flight_until"]["N"]
    assert entries[one.message_id]["M"]["p"]["S"] == "p"
    await backend.consumer.ack(one)
    await backend.consumer.release(two, error="later", delay=60)
    assert flying(raw_client, table_name, queue) == {}
    assert "in_flight_until" not in message(raw_client, table_name, tids[1])


async def test_a_claim_whose_visibility_ended_is_pruned_from_the_queue_item(
    backend: DynamoBackend[Any], raw_client: Any, table_name: str
) -> None:
    queue = f"prune-{uuid.uuid4().hex[:8]}"
    await backend.queues.configure(queue, global_concurrency=1)
    await backend.outbox.enqueue_intent(intent(f"late-{uuid.uuid4().hex}", Route(queue, "", 5)))
    [first] = await backend.consumer.claim(2, 1.0, queue=queue)
    urgent = f"urgent-{uuid.uuid4().hex}"
    await backend.outbox.enqueue_intent(intent(urgent, Route(queue, "", 0)))
    assert await backend.consumer.claim(2, 60, queue=queue) == []  # the slot is taken
    await asyncio.sleep(1.2)  # the first claim's visibility ends (one clock here)
    [got] = await backend.consumer.claim(1, 60, queue=queue)
    assert got.intent.thread_id == urgent
    assert set(flying(raw_client, table_name, queue)) == {got.message_id}
    await backend.consumer.ack(first)  # ends nothing counted: its entry is gone
    assert set(flying(raw_client, table_name, queue)) == {got.message_id}


async def test_a_claim_that_loses_the_race_for_the_queue_item_never_exceeds_the_limit(
    backend: DynamoBackend[Any], raw_client: Any, table_name: str
) -> None:
    """Between this claim's read and its transaction another worker takes the queue's
    only slot: the transaction is cancelled, and the claim, reading again, takes
    nothing."""
    queue = f"race-{uuid.uuid4().hex[:8]}"
    await backend.queues.configure(queue, global_concurrency=1)
    tids = [f"r{i}-{uuid.uuid4().hex}" for i in range(2)]
    for tid in tids:
        await backend.outbox.enqueue_intent(intent(tid, Route(queue)))
    sent: list[int] = []

    def other_worker_claims(**_: Any) -> None:
        if sent:
            return
        raw_client.update_item(
            TableName=table_name,
            Key={"pk": {"S": "flowy#queues"}, "sk": {"S": f"queue#{queue}"}},
            UpdateExpression="SET #f.#m = :entry, #v = #v + :one",
            ExpressionAttributeNames={"#f": "flying", "#m": "elsewhere", "#v": "version"},
            ExpressionAttributeValues={
                ":entry": {"M": {"u": {"N": str(time.time() + 600)}, "p": {"S": ""}}},
                ":one": {"N": "1"},
            },
        )
        sent.append(1)

    events = backend.table.client.meta.events
    events.register("before-call.dynamodb.TransactWriteItems", other_worker_claims)
    try:
        assert await backend.consumer.claim(2, 60, queue=queue) == []
    finally:
        events.unregister("before-call.dynamodb.TransactWriteItems", other_worker_claims)
    assert sent == [1]
    assert [message(raw_client, table_name, t)["attempts"]["N"] for t in tids] == ["0", "0"]
    assert set(flying(raw_client, table_name, queue)) == {"elsewhere"}


async def test_a_queue_given_limits_counts_the_claims_already_in_flight(
    backend: DynamoBackend[Any],
) -> None:
    queue = f"late-{uuid.uuid4().hex[:8]}"
    for i in range(3):
        await backend.outbox.enqueue_intent(intent(f"l{i}-{uuid.uuid4().hex}", Route(queue)))
    assert len(await backend.consumer.claim(2, 60, queue=queue)) == 2  # no limits yet
    await backend.queues.configure(queue, global_concurrency=2)
    assert await backend.consumer.claim(2, 60, queue=queue) == []
    [stats] = [s for s in await backend.queues.list() if s.queue == queue]
    assert (stats.in_flight, stats.pending) == (2, 1)


async def test_a_schema_3_table_is_refused_until_set_up(
    dynamo_endpoint: Any, table_name: str, raw_client: Any
) -> None:
    """Schema 4 adds the ``queues`` index; the upgrade puts each live message of an
    older schema in the default queue, in its enqueue order."""
    url = dynamo_endpoint.store_url(table_name, clock_skew=0)
    async with flowy.connect(url) as fresh:
        assert await fresh.setup() == 4
    raw_client.update_table(
        TableName=table_name, GlobalSecondaryIndexUpdates=[{"Delete": {"IndexName": "queues"}}]
    )
    tids = [f"v3-{i}-{uuid.uuid4().hex}" for i in range(2)]
    for at, tid in zip((20, 10), tids, strict=True):  # the second enqueued first
        raw_client.put_item(
            TableName=table_name,
            Item={
                "pk": {"S": thread_key(tid)},
                "sk": {"S": f"outbox#{1:020d}"},
                "thread_id": {"S": tid},
                "payload": {"B": encode_intent(intent(tid))},
                "attempts": {"N": "0"},
                "error": {"S": ""},
                "enqueued_at": {"N": str(at)},
                "live_key": {"S": "live#1"},
                "visible_at": {"N": str(at)},
            },
        )
    raw_client.put_item(
        TableName=table_name,
        Item={"pk": {"S": "flowy#schema"}, "sk": {"S": "version"}, "version": {"N": "3"}},
    )
    with pytest.raises(SchemaVersionError, match=r"version 3, older.*backend.setup\(\)"):
        await flowy.connect(url)
    client = dynamo_endpoint.client()
    backend: DynamoBackend[Any] = DynamoBackend[Any].from_client(client, table_name, clock_skew=0)
    assert await backend.setup() == 4
    assert await backend.setup() == 4  # idempotent
    async with backend:
        listed = await backend.queues.messages("default")
        assert [m.intent.thread_id for m in listed if m.intent] == [tids[1], tids[0]]
        claimed = await backend.consumer.claim(5, 60)
        assert [m.intent.thread_id for m in claimed] == [tids[1], tids[0]]
    assert message(raw_client, table_name, tids[0])["queue"]["S"] == "default"
    client.close()
