"""DynamoDB-specific outbox tests: one message item per (thread, committed revision),
claims by conditional update, dead letters and their revival (also inside a save's
transaction), the application's own actions in a save's transaction, and waiting."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

import flowy
from flowy.errors import StorageError
from flowy.storage import HandoffIntent, HandoffStatus, OutboxMessage, ResumeToken, Snapshot
from flowy.storage.dialect import decode_intent, new_write_id
from flowy_dynamodb import DynamoBackend, thread_key

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


def message_item(client: Any, table: str, thread_id: str, revision: int) -> dict[str, Any] | None:
    key = {"pk": {"S": thread_key(thread_id)}, "sk": {"S": f"outbox#{revision:020d}"}}
    item: dict[str, Any] | None = client.get_item(
        TableName=table, Key=key, ConsistentRead=True
    ).get("Item")
    return item


@pytest.fixture
async def backend(dynamo_endpoint: Any, table_name: str) -> AsyncIterator[DynamoBackend[Any]]:
    url = dynamo_endpoint.store_url(table_name, clock_skew=0, max_attempts=2)
    async with flowy.connect(url) as opened:
        assert isinstance(opened, DynamoBackend)
        yield opened


async def test_a_message_lives_in_its_threads_partition(
    backend: DynamoBackend[Any], raw_client: Any, table_name: str
) -> None:
    tid = f"layout-{uuid.uuid4().hex}"
    await backend.outbox.enqueue_intent(intent(tid, 3))
    [message] = await backend.consumer.claim(1, 60)
    item = message_item(raw_client, table_name, tid, 3)
    assert item is not None
    assert message.message_id == f"outbox#{3:020d}|{thread_key(tid)}"
    assert item["attempts"]["N"] == "1" and item["live_key"]["S"].startswith("live#")
    assert float(item["visible_at"]["N"]) > 0
    assert decode_intent(item["payload"]["B"]) == intent(tid, 3)


async def test_messages_of_every_shard_are_claimed_oldest_first(
    backend: DynamoBackend[Any], raw_client: Any, table_name: str
) -> None:
    threads = [f"shard-{i}-{uuid.uuid4().hex[:6]}" for i in range(24)]
    for tid in threads:
        await backend.outbox.enqueue_intent(intent(tid))
    used = {(message_item(raw_client, table_name, t, 1) or {})["live_key"]["S"] for t in threads}
    assert len(used) > 1
    first = await backend.consumer.claim(5, 30)
    assert [m.intent.thread_id for m in first] == threads[:5]
    rest = await backend.consumer.claim(100, 30)
    assert sorted(m.intent.thread_id for m in first + rest) == sorted(threads)
    for message in first + rest:
        await backend.consumer.ack(message)
    assert await backend.consumer.claim(100, 30) == []


async def test_a_dead_letter_and_its_revival(
    backend: DynamoBackend[Any], raw_client: Any, table_name: str
) -> None:
    consumer = backend.consumer
    tid = f"dead-{uuid.uuid4().hex}"
    await backend.outbox.enqueue_intent(intent(tid))
    for attempt in (1, 2):
        [message] = await consumer.claim(1, 30)
        assert message.attempts == attempt
        await consumer.release(message, error=f"boom {attempt}")
    item = message_item(raw_client, table_name, tid, 1)
    assert item is not None
    assert (item["dead_key"]["S"], item["error"]["S"], item["attempts"]["N"]) == (
        "dead",
        "boom 2",
        "2",
    )
    assert "live_key" not in item and "visible_at" not in item
    [dead] = await consumer.dead_letters()
    # Enqueueing the intent again brings it back with its attempts and error reset.
    await backend.outbox.enqueue_intent(intent(tid))
    assert await consumer.dead_letters() == []
    [again] = await consumer.claim(1, 30)
    assert (again.message_id, again.attempts, again.last_error) == (dead.message_id, 1, "")
    for message_id in ("not-an-id", "outbox#1|elsewhere#x", again.message_id):
        with pytest.raises(KeyError):
            await consumer.retry_dead_letter(message_id)
    await consumer.ack(OutboxMessage("outbox#x|not-a-thread", again.intent, 1))  # no error
    await consumer.ack(again)
    assert message_item(raw_client, table_name, tid, 1) is None


async def test_a_save_revives_a_dead_message_of_its_revision(
    backend: DynamoBackend[Any], raw_client: Any, table_name: str
) -> None:
    """A deleted thread starts again at revision 1; a dead message of the old revision 1
    comes back to life inside the save's transaction instead of cancelling it."""
    cp, outbox, consumer = backend.checkpointer, backend.outbox, backend.consumer
    tid = f"revive-{uuid.uuid4().hex}"

    async def enqueue(tx: object, revision: int) -> None:
        await outbox.enqueue_intent_tx(tx, intent(tid, revision))

    await cp.save_with_outbox(0, snap(tid), enqueue)
    for _ in range(2):
        await consumer.release((await consumer.claim(1, 30))[0], error="x")
    assert len(await consumer.dead_letters()) == 1
    await cp.delete(tid)
    assert await cp.save_with_outbox(0, snap(tid), enqueue) == 1
    assert await consumer.dead_letters() == []
    [message] = await consumer.claim(1, 30)
    assert (message.intent.thread_id, message.attempts) == (tid, 1)
    # And a live message of the revision is left as it is.
    await cp.delete(tid)
    assert await cp.save_with_outbox(0, snap(tid), enqueue) == 1
    assert await consumer.claim(1, 30) == []  # still hidden by the claim above
    assert (message_item(raw_client, table_name, tid, 1) or {})["attempts"]["N"] == "1"


async def test_application_action_commits_with_the_hand_off(
    backend: DynamoBackend[Any], raw_client: Any, table_name: str
) -> None:
    """An application's own item joins the save's transaction; when its condition
    fails, nothing at all is written."""
    cp, outbox = backend.checkpointer, backend.outbox
    tid = f"app-{uuid.uuid4().hex}"
    domain_key = {"pk": {"S": f"order#{tid}"}, "sk": {"S": "order"}}

    async def enqueue(tx: object, revision: int) -> None:
        cp.add_action(
            tx,
            {
                "Put": {
                    "TableName": table_name,
                    "Item": {**domain_key, "state": {"S": "paid"}},
                    "ConditionExpression": "attribute_not_exists(#pk)",
                    "ExpressionAttributeNames": {"#pk": "pk"},
                }
            },
        )
        await outbox.enqueue_intent_tx(tx, intent(tid, revision))

    assert await cp.save_with_outbox(0, snap(tid), enqueue) == 1
    assert "Item" in raw_client.get_item(TableName=table_name, Key=domain_key)
    [message] = await backend.consumer.claim(10, 30)
    await backend.consumer.ack(message)
    with pytest.raises(StorageError, match="enqueue callback"):
        await cp.save_with_outbox(1, snap(tid), enqueue)  # the domain item exists now
    assert (await cp.load(tid))[1] == 1
    assert await backend.consumer.claim(10, 30) == []


async def test_add_action_only_inside_the_callback(backend: DynamoBackend[Any]) -> None:
    cp = backend.checkpointer
    with pytest.raises(RuntimeError, match="enqueue callback"):
        cp.add_action(object(), {"ConditionCheck": {}})
    kept: list[object] = []

    async def enqueue(tx: object, revision: int) -> None:
        kept.append(tx)
        with pytest.raises(ValueError, match="Put, Update"):
            cp.add_action(tx, {"Scan": {}})

    await cp.save_with_outbox(0, snap(f"only-{uuid.uuid4().hex}"), enqueue)
    with pytest.raises(RuntimeError):
        cp.add_action(kept[0], {"ConditionCheck": {}})


async def test_a_waiting_claim_wakes_at_once_for_this_stores_messages(
    dynamo_endpoint: Any, table_name: str
) -> None:
    url = dynamo_endpoint.store_url(table_name, poll_interval=5)
    async with flowy.connect(url) as backend:
        tid = f"wake-{uuid.uuid4().hex}"
        consumer = backend.consumer
        assert await consumer.claim(1, 30, wait=3.0) == []  # its polls back off to 2.5 s+

        async def later() -> None:
            await asyncio.sleep(0.3)
            await backend.outbox.enqueue_intent(intent(tid))

        task = asyncio.create_task(later())
        loop = asyncio.get_running_loop()
        started = loop.time()
        got = await consumer.claim(1, 30, wait=10.0)
        elapsed = loop.time() - started
        await task
        assert [m.intent.thread_id for m in got] == [tid]
        assert 0.25 < elapsed < 2.0  # woken by the enqueue, not by the next poll
