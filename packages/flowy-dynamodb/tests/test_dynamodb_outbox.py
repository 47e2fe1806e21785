"""DynamoDB-specific outbox tests: sharded partitions, claims by conditional update,
the dead-letter partition, polling claims, and the transaction handle."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from flowy import Snapshot, StorageError
from flowy.checkpoint import (
    HandoffIntent,
    HandoffStatus,
    ResumeToken,
    decode_intent,
    new_write_id,
)
from flowy_dynamodb import DynamoBackend, DynamoOutboxConsumer, DynamoTransaction

pytestmark = pytest.mark.anyio


def intent(thread_id: str, revision: int = 1) -> HandoffIntent:
    return HandoffIntent(
        thread_id=thread_id,
        pending_snapshot_revision=revision,
        committed_snapshot_revision=revision,
        snapshot_revision=revision,
        resume_token=ResumeToken(thread_id, revision),
        handoff_status=HandoffStatus.ENQUEUED,
        reason="handoff",
        execution_pointer="worker",
        created_at=1.0,
    )


def snap(thread_id: str) -> Snapshot[Any]:
    return Snapshot(thread_id=thread_id, state={}, execution_pointer="p", write_id=new_write_id())


def partition(client: Any, table: str, pk: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = client.query(
        TableName=table,
        KeyConditionExpression="#pk = :pk",
        ExpressionAttributeNames={"#pk": "pk"},
        ExpressionAttributeValues={":pk": {"S": pk}},
        ConsistentRead=True,
    )["Items"]
    return items


async def test_messages_spread_over_shards_and_all_are_claimed(
    backend: DynamoBackend[Any], raw_client: Any, table_name: str
) -> None:
    threads = [f"shard-{i}-{uuid.uuid4().hex[:6]}" for i in range(24)]
    for tid in threads:
        await backend.outbox.enqueue_intent(intent(tid))
    used = {
        shard
        for shard in range(backend.outbox.shards)
        if partition(raw_client, table_name, f"outbox#{shard}")
    }
    assert len(used) > 1
    claimed = await backend.consumer.claim(100, 30)
    assert sorted(m.intent.thread_id for m in claimed) == sorted(threads)
    assert all(m.attempts == 1 for m in claimed)
    for message in claimed:
        await backend.consumer.ack(message)
    assert await backend.consumer.claim(100, 30) == []


async def test_claim_marks_the_item_and_counts_the_attempt(
    backend: DynamoBackend[Any], raw_client: Any, table_name: str
) -> None:
    tid = f"claimed-{uuid.uuid4().hex}"
    await backend.outbox.enqueue_intent(intent(tid))
    [message] = await backend.consumer.claim(1, 60)
    shard = message.message_id.split(":", 1)[0]
    [item] = partition(raw_client, table_name, f"outbox#{shard}")
    assert item["attempts"]["N"] == "1"
    assert float(item["visible_at"]["N"]) > 0
    assert decode_intent(item["payload"]["B"]) == intent(tid)


async def test_dead_letters_move_to_their_own_partition(
    dynamo_endpoint: Any, backend: DynamoBackend[Any], raw_client: Any, table_name: str
) -> None:
    consumer = DynamoOutboxConsumer(dynamo_endpoint.client(), table_name, max_attempts=2)
    try:
        tid = f"dead-{uuid.uuid4().hex}"
        await backend.outbox.enqueue_intent(intent(tid))
        [first] = await consumer.claim(1, 30)
        await consumer.release(first, error="boom 1")
        [second] = await consumer.claim(1, 30)
        assert second.attempts == 2
        await consumer.release(second, error="boom 2")
        shard = second.message_id.split(":", 1)[0]
        assert partition(raw_client, table_name, f"outbox#{shard}") == []
        [dead] = partition(raw_client, table_name, f"dead#{shard}")
        assert dead["error"]["S"] == "boom 2"
        assert dead["attempts"]["N"] == "2"
        [listed] = await consumer.dead_letters()
        assert (listed.message_id, listed.attempts) == (second.message_id, 2)
        await consumer.retry_dead_letter(listed.message_id)
        assert partition(raw_client, table_name, f"dead#{shard}") == []
        [again] = await consumer.claim(1, 30)
        assert (again.message_id, again.attempts) == (second.message_id, 1)
        with pytest.raises(KeyError):
            await consumer.retry_dead_letter(second.message_id)
        with pytest.raises(KeyError):
            await consumer.retry_dead_letter("not-an-id")
        with pytest.raises(ValueError, match="not a message id"):
            await consumer.ack(type(again)("99:x", again.intent, 1))
    finally:
        await consumer.close()


async def test_waiting_claim_polls_until_a_message_arrives(
    backend: DynamoBackend[Any],
) -> None:
    tid = f"poll-{uuid.uuid4().hex}"

    async def later() -> None:
        await asyncio.sleep(0.3)
        await backend.outbox.enqueue_intent(intent(tid))

    task = asyncio.create_task(later())
    loop = asyncio.get_running_loop()
    started = loop.time()
    got = await backend.consumer.claim(1, 30, wait=5.0)
    elapsed = loop.time() - started
    await task
    assert [m.intent.thread_id for m in got] == [tid]
    assert 0.25 < elapsed < 2.0


async def test_undecodable_payload_is_dead_lettered(
    backend: DynamoBackend[Any], raw_client: Any, table_name: str
) -> None:
    raw_client.put_item(
        TableName=table_name,
        Item={
            "pk": {"S": "outbox#0"},
            "sk": {"S": f"{1:020d}#bad"},
            "payload": {"B": b"not json"},
            "attempts": {"N": "0"},
            "visible_at": {"N": "0"},
        },
    )
    assert await backend.consumer.claim(10, 30) == []
    [dead] = partition(raw_client, table_name, "dead#0")
    assert "undecodable" in dead["error"]["S"]


async def test_transaction_handle(backend: DynamoBackend[Any]) -> None:
    with pytest.raises(TypeError, match="DynamoTransaction"):
        await backend.outbox.enqueue_intent_tx(object(), intent("t"))
    tx = DynamoTransaction(backend.checkpointer.table_name)
    with pytest.raises(ValueError, match="Put, Update"):
        tx.add({"Scan": {}})
    tx.seal()
    with pytest.raises(RuntimeError, match="already committed"):
        await backend.outbox.enqueue_intent_tx(tx, intent("t"))
    full = DynamoTransaction(backend.checkpointer.table_name)
    for _ in range(98):
        full.add({"ConditionCheck": {}})
    with pytest.raises(ValueError, match="at most 100"):
        full.add({"ConditionCheck": {}})


async def test_application_action_commits_with_the_hand_off(
    backend: DynamoBackend[Any], raw_client: Any, table_name: str
) -> None:
    """An application's own item joins the checkpoint's transaction; when its condition
    fails nothing at all is written."""
    cp, outbox = backend.checkpointer, backend.outbox
    tid = f"app-{uuid.uuid4().hex}"
    domain_key = {"pk": {"S": f"order#{tid}"}, "sk": {"S": "order"}}

    async def enqueue(tx: object, revision: int) -> None:
        assert isinstance(tx, DynamoTransaction)
        tx.add(
            {
                "Put": {
                    "TableName": table_name,
                    "Item": {**domain_key, "state": {"S": "paid"}},
                    "ConditionExpression": "attribute_not_exists(#pk)",
                    "ExpressionAttributeNames": {"#pk": "pk"},
                }
            }
        )
        await outbox.enqueue_intent_tx(tx, intent(tid, revision))

    assert await cp.save_with_outbox(0, snap(tid), enqueue) == 1
    assert "Item" in raw_client.get_item(TableName=table_name, Key=domain_key)
    [message] = await backend.consumer.claim(10, 30)
    await backend.consumer.ack(message)
    # Second time the domain item exists: the whole transaction is cancelled.
    with pytest.raises(StorageError, match="enqueue callback"):
        await cp.save_with_outbox(1, snap(tid), enqueue)
    assert (await cp.load(tid))[1] == 1
    assert await backend.consumer.claim(10, 30) == []
