"""DynamoDB-specific checkpointer tests: the single-table layout, thread keys, one
transaction per save, placeholders in every expression, stored-id checks, the index
behind ``list_threads`` (thread-id order, ``after``), history left over from a deleted
thread, time to live, and the table itself."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

import flowy
from flowy.errors import ConcurrencyConflictError, SnapshotEnvelopeInvalidError, ThreadNotFoundError
from flowy.memory import MemoryLeaseManager
from flowy.storage import (
    HandoffIntent,
    HandoffStatus,
    ResumeToken,
    RunStatus,
    Snapshot,
    new_write_id,
)
from flowy_dynamodb import DynamoBackend, create_table, thread_key

pytestmark = pytest.mark.anyio


def snap(thread_id: str, state: Any = None, **kw: Any) -> Snapshot[Any]:
    return Snapshot(
        thread_id=thread_id,
        state={"n": 0} if state is None else state,
        execution_pointer=kw.pop("pointer", "start"),
        write_id=new_write_id(),
        **kw,
    )


def intent(thread_id: str, revision: int) -> HandoffIntent:
    return HandoffIntent(
        thread_id=thread_id,
        pending_snapshot_revision=revision,
        committed_snapshot_revision=revision,
        snapshot_revision=revision,
        resume_token=ResumeToken(thread_id, revision),
        handoff_status=HandoffStatus.ENQUEUED,
        reason="handoff",
        execution_pointer="worker",
    )


def thread_items(client: Any, table: str, thread_id: str) -> dict[str, dict[str, Any]]:
    items = client.query(
        TableName=table,
        KeyConditionExpression="#pk = :pk",
        ExpressionAttributeNames={"#pk": "pk"},
        ExpressionAttributeValues={":pk": {"S": thread_key(thread_id)}},
        ConsistentRead=True,
    )["Items"]
    return {item["sk"]["S"]: item for item in items}


def record_calls(backend: DynamoBackend[Any]) -> list[dict[str, Any]]:
    """Every API call the backend's client makes from now on (operation, parameters)."""
    calls: list[dict[str, Any]] = []

    def hook(model: Any, params: dict[str, Any], **_: Any) -> None:
        calls.append({"operation": model.name, "params": params})

    backend.table.client.meta.events.register("provide-client-params.dynamodb", hook)
    return calls


@pytest.fixture
async def backend(dynamo_endpoint: Any, table_name: str) -> AsyncIterator[DynamoBackend[Any]]:
    async with flowy.connect(dynamo_endpoint.store_url(table_name, clock_skew=0)) as opened:
        assert isinstance(opened, DynamoBackend)
        yield opened


def test_thread_keys_are_verbatim_or_hashed() -> None:
    assert thread_key("abc") == "thread#abc"
    assert thread_key("k" * 1024) == "thread#" + "k" * 1024
    long_a, long_b = "k" * 10_239 + "a", "k" * 10_239 + "b"
    assert thread_key(long_a).startswith("thread-sha256#")
    assert len(thread_key(long_a).encode()) < 2048
    assert thread_key(long_a) != thread_key(long_b)
    fake = "-sha256#" + "0" * 64  # looks like a hashed key: stays in the verbatim namespace
    assert thread_key(fake) == "thread#" + fake


async def test_save_is_one_transaction_of_head_and_history(
    backend: DynamoBackend[Any], raw_client: Any, table_name: str
) -> None:
    cp = backend.checkpointer
    calls = record_calls(backend)
    tid = f"layout-{uuid.uuid4().hex}"
    assert await cp.save(0, snap(tid, {"a": 1})) == 1
    assert [c["operation"] for c in calls] == ["TransactWriteItems"]
    actions = calls[0]["params"]["TransactItems"]
    assert [next(iter(a)) for a in actions] == ["Update", "Put"]
    assert actions[0]["Update"]["ReturnValuesOnConditionCheckFailure"] == "ALL_OLD"
    assert await cp.save(1, snap(tid, {"a": 2}, status=RunStatus.SUSPENDED)) == 2
    items = thread_items(raw_client, table_name, tid)
    assert sorted(items) == ["head", f"rev#{1:020d}", f"rev#{2:020d}"]
    head = items["head"]
    assert (head["thread_id"]["S"], head["revision"]["N"]) == (tid, "2")
    assert (head["status"]["S"], head["handoff_status"]["S"]) == ("suspended", "none")
    assert head["list_key"]["S"].startswith("none#") and head["list_sort"]["S"] == tid


async def test_save_with_outbox_is_one_transaction(
    backend: DynamoBackend[Any], raw_client: Any, table_name: str
) -> None:
    cp, outbox = backend.checkpointer, backend.outbox
    calls = record_calls(backend)
    tid = f"tx-{uuid.uuid4().hex}"

    async def enqueue(tx: object, revision: int) -> None:
        await outbox.enqueue_intent_tx(tx, intent(tid, revision))

    assert await cp.save_with_outbox(0, snap(tid), enqueue) == 1
    assert [c["operation"] for c in calls] == ["TransactWriteItems"]
    actions = calls[0]["params"]["TransactItems"]
    assert [next(iter(a)) for a in actions] == ["Update", "Put", "Update"]
    assert sorted(thread_items(raw_client, table_name, tid)) == [
        "head",
        f"outbox#{1:020d}",
        f"rev#{1:020d}",
    ]


async def test_every_expression_uses_placeholders(backend: DynamoBackend[Any]) -> None:
    """No attribute name or value is spliced into an expression, whatever the id."""
    cp, leases = backend.checkpointer, backend.leases
    calls = record_calls(backend)
    tid = "x'; #pk = :pk OR revision > 0 --" + uuid.uuid4().hex
    lease = await leases.acquire(tid, "owner", 30)
    await cp.save(0, snap(tid), lease=lease)

    async def enqueue(tx: object, revision: int) -> None:
        await backend.outbox.enqueue_intent_tx(tx, intent(tid, revision))

    await cp.save_with_outbox(1, snap(tid), enqueue, lease=lease)
    await leases.renew(lease, 30)
    with pytest.raises(ConcurrencyConflictError):
        await cp.save(0, snap(tid), lease=lease)
    await cp.load(tid)
    await cp.get_history(tid)
    await cp.prune(tid, 1)
    await leases.release(lease)
    await cp.delete_if_idle(tid)
    await cp.list_threads(after="a")
    [message] = await backend.consumer.claim(10, 30)
    await backend.consumer.release(message, error="x", delay=0)
    expressions = 0
    for call in calls:
        bodies = [call["params"]]
        bodies += [next(iter(a.values())) for a in call["params"].get("TransactItems", [])]
        for body in bodies:
            names = body.get("ExpressionAttributeNames", {})
            values = body.get("ExpressionAttributeValues", {})
            for field in (
                "UpdateExpression",
                "ConditionExpression",
                "KeyConditionExpression",
                "ProjectionExpression",
            ):
                text = body.get(field)
                if text is None:
                    continue
                expressions += 1
                assert tid not in text
                words = set(re.findall(r"[A-Za-z_]\w*", re.sub(r"[#:]\w+", "", text)))
                assert words <= {
                    "SET",
                    "REMOVE",
                    "AND",
                    "OR",
                    "attribute_not_exists",
                    "attribute_exists",
                    "if_not_exists",
                    "begins_with",
                }, (field, text)
                assert all(token in names for token in re.findall(r"#\w+", text)), text
                assert all(token in values for token in re.findall(r":\w+", text)), text
    assert expressions > 20


async def test_load_and_writes_check_the_stored_thread_id(
    backend: DynamoBackend[Any], raw_client: Any, table_name: str
) -> None:
    cp = backend.checkpointer
    tid = f"stored-id-{uuid.uuid4().hex}"
    await cp.save(0, snap(tid))
    for sk in ("head", f"rev#{1:020d}"):
        raw_client.update_item(
            TableName=table_name,
            Key={"pk": {"S": thread_key(tid)}, "sk": {"S": sk}},
            UpdateExpression="SET #t = :t",
            ExpressionAttributeNames={"#t": "thread_id"},
            ExpressionAttributeValues={":t": {"S": tid + "-other"}},
        )
    for action in (
        cp.load(tid),
        cp.get_history(tid),
        cp.save(1, snap(tid)),
        backend.leases.acquire(tid, "owner", 30),
        backend.leases.holder(tid),
        cp.delete(tid),
    ):
        with pytest.raises(SnapshotEnvelopeInvalidError):
            await action
    assert len(thread_items(raw_client, table_name, tid)) == 2  # nothing written


async def test_list_threads_reads_the_index_in_thread_id_order(
    backend: DynamoBackend[Any], raw_client: Any, table_name: str
) -> None:
    cp = backend.checkpointer
    prefix = uuid.uuid4().hex[:6]
    ids = [f"{prefix}-{c}" for c in "fbdaec"] + ["k" * 2000 + "b", "k" * 2000 + "a", "é", "e"]
    for index, tid in enumerate(ids):
        handoff = HandoffStatus.PENDING if index % 2 else HandoffStatus.NONE
        await cp.save(
            0, snap(tid, handoff_status=handoff, handoff_pending_at=5.5 if index % 2 else None)
        )
    raw_client.update_item(  # the listing reads the index's columns, never a record
        TableName=table_name,
        Key={"pk": {"S": thread_key(ids[0])}, "sk": {"S": "head"}},
        UpdateExpression="SET #r = :r",
        ExpressionAttributeNames={"#r": "record"},
        ExpressionAttributeValues={":r": {"B": b"garbage"}},
    )
    listed = [t.thread_id for t in await cp.list_threads(limit=100)]
    assert listed == sorted(ids)
    assert [t.thread_id for t in await cp.list_threads(limit=3)] == sorted(ids)[:3]
    pages: list[str] = []
    after: str | None = None
    while page := await cp.list_threads(limit=3, after=after):
        pages += [t.thread_id for t in page]
        after = page[-1].thread_id
    assert pages == sorted(ids)
    pending = await cp.list_threads(handoff_statuses=frozenset({HandoffStatus.PENDING}))
    assert [t.thread_id for t in pending] == sorted(ids[1::2])
    assert {t.handoff_pending_at for t in pending} == {5.5}
    long_after = await cp.list_threads(after="k" * 2000 + "a")
    assert [t.thread_id for t in long_after] == ["k" * 2000 + "b", "é"]


async def test_a_lease_only_item_is_not_a_thread(backend: DynamoBackend[Any]) -> None:
    cp, leases = backend.checkpointer, backend.leases
    tid = f"lease-only-{uuid.uuid4().hex}"
    lease = await leases.acquire(tid, "owner", 30)
    with pytest.raises(ThreadNotFoundError):
        await cp.load(tid)
    assert await cp.get_history(tid) == []
    assert await cp.list_threads() == []
    assert await cp.save(0, snap(tid), lease=lease) == 1


async def test_delete_of_a_never_leased_thread_removes_every_item(
    backend: DynamoBackend[Any], raw_client: Any, table_name: str
) -> None:
    cp = backend.checkpointer
    tid = f"delete-all-{uuid.uuid4().hex}"
    for expected in range(3):
        await cp.save(expected, snap(tid))
    await cp.delete(tid)
    assert thread_items(raw_client, table_name, tid) == {}


async def test_delete_under_a_live_lease_keeps_the_lease(
    backend: DynamoBackend[Any], raw_client: Any, table_name: str
) -> None:
    cp, leases = backend.checkpointer, backend.leases
    tid = f"delete-leased-{uuid.uuid4().hex}"
    lease = await leases.acquire(tid, "a", 30)
    await cp.save(0, snap(tid), lease=lease)
    await cp.delete(tid)
    [item] = thread_items(raw_client, table_name, tid).values()
    assert "revision" not in item and "record" not in item and "list_key" not in item
    assert item["lease_owner"]["S"] == "a" and int(item["expires"]["N"]) > lease.expires_at
    holder = await leases.holder(tid)
    assert holder is not None and holder.fencing_token == lease.fencing_token
    assert await cp.save(0, snap(tid), lease=lease) == 1


async def test_leftover_history_entry_is_replaced(
    backend: DynamoBackend[Any], raw_client: Any, table_name: str
) -> None:
    """A history entry left from an earlier life of the thread (its delete was cut
    short) does not block the new life: the save removes it and lands."""
    cp = backend.checkpointer
    tid = f"debris-{uuid.uuid4().hex}"
    await cp.save(0, snap(tid, {"life": 1}))
    raw_client.put_item(
        TableName=table_name,
        Item={
            "pk": {"S": thread_key(tid)},
            "sk": {"S": f"rev#{2:020d}"},
            "thread_id": {"S": tid},
            "revision": {"N": "2"},
            "record": {"B": b"old"},
            "write_tx": {"S": "earlier-life"},
        },
    )
    second = snap(tid, {"life": 2})
    assert await cp.save(1, second) == 2
    assert [(s.revision, s.write_id) for s in await cp.get_history(tid, 1)] == [
        (2, second.write_id)
    ]


async def test_prune_keeps_the_head_entry_and_drops_entries_beyond_it(
    backend: DynamoBackend[Any], raw_client: Any, table_name: str
) -> None:
    cp = backend.checkpointer
    tid = f"prune-{uuid.uuid4().hex}"
    for expected in range(4):
        await cp.save(expected, snap(tid, {"n": expected + 1}))
    raw_client.put_item(  # debris beyond the head
        TableName=table_name,
        Item={
            "pk": {"S": thread_key(tid)},
            "sk": {"S": f"rev#{9:020d}"},
            "thread_id": {"S": tid},
            "revision": {"N": "9"},
        },
    )
    await cp.prune(tid, 2)
    assert [s.revision for s in await cp.get_history(tid)] == [4, 3]


async def test_completed_threads_get_a_time_to_live(
    dynamo_endpoint: Any, table_name: str, raw_client: Any
) -> None:
    url = dynamo_endpoint.store_url(table_name, expire_after=3600)
    async with flowy.connect(url) as backend:
        cp = backend.checkpointer
        tid = f"ttl-{uuid.uuid4().hex}"
        await cp.save(0, snap(tid))
        assert "expires" not in thread_items(raw_client, table_name, tid)["head"]
        await cp.save(1, snap(tid, status=RunStatus.COMPLETED))
        items = thread_items(raw_client, table_name, tid)
        expires = int(items["head"]["expires"]["N"])
        assert int(items[f"rev#{2:020d}"]["expires"]["N"]) == expires
        assert "expires" not in items[f"rev#{1:020d}"]
        await cp.save(2, snap(tid, status=RunStatus.RUNNING))
        assert "expires" not in thread_items(raw_client, table_name, tid)["head"]
    ttl = raw_client.describe_time_to_live(TableName=table_name)["TimeToLiveDescription"]
    assert (ttl["TimeToLiveStatus"], ttl["AttributeName"]) == ("ENABLED", "expires")


def test_create_table_is_idempotent(dynamo_endpoint: Any, table_name: str) -> None:
    client = dynamo_endpoint.client()
    create_table(client, table_name)
    create_table(client, table_name)
    table = client.describe_table(TableName=table_name)["Table"]
    assert table["TableStatus"] == "ACTIVE"
    assert table["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    assert sorted(i["IndexName"] for i in table["GlobalSecondaryIndexes"]) == [
        "by_thread",
        "dead_letters",
        "outbox",
    ]
    version = client.get_item(
        TableName=table_name, Key={"pk": {"S": "flowy#schema"}, "sk": {"S": "version"}}
    )["Item"]["version"]["N"]
    assert version == "2"
    client.close()


async def test_fences_only_leases_of_the_same_table(
    dynamo_endpoint: Any, backend: DynamoBackend[Any], table_name: str
) -> None:
    cp = backend.checkpointer
    assert cp.fences(backend.leases)
    async with flowy.connect(dynamo_endpoint.store_url(table_name)) as same:
        assert cp.fences(same.leases)
    async with flowy.connect(dynamo_endpoint.store_url(table_name + "-other")) as other:
        assert not cp.fences(other.leases)
        other_client = dynamo_endpoint.client()
        other_client.delete_table(TableName=table_name + "-other")
        other_client.close()
    assert not cp.fences(MemoryLeaseManager())
