"""DynamoDB-specific checkpointer tests: the single-table layout, thread keys, one
conditional write per save, placeholders in every expression, stored-id checks, the
index behind ``list_threads``, deletion keeping the fencing token, time to live and the
clean-up of history entries left over from a deleted thread."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest

from flowy import (
    ConcurrencyConflictError,
    RunStatus,
    Snapshot,
    SnapshotEnvelopeInvalidError,
    ThreadNotFoundError,
)
from flowy.checkpoint import HandoffStatus, new_write_id
from flowy_dynamodb import (
    INDEX_NAME,
    DynamoBackend,
    DynamoCheckpointer,
    DynamoLeaseManager,
    create_table,
    thread_key,
)

pytestmark = pytest.mark.anyio


def snap(thread_id: str, state: Any = None, **kw: Any) -> Snapshot[Any]:
    return Snapshot(
        thread_id=thread_id,
        state={"n": 0} if state is None else state,
        execution_pointer=kw.pop("pointer", "start"),
        write_id=new_write_id(),
        **kw,
    )


def head(client: Any, table: str, thread_id: str) -> dict[str, Any] | None:
    key = {"pk": {"S": thread_key(thread_id)}, "sk": {"S": "head"}}
    item: dict[str, Any] | None = client.get_item(
        TableName=table, Key=key, ConsistentRead=True
    ).get("Item")
    return item


def thread_items(client: Any, table: str, thread_id: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = client.query(
        TableName=table,
        KeyConditionExpression="#pk = :pk",
        ExpressionAttributeNames={"#pk": "pk"},
        ExpressionAttributeValues={":pk": {"S": thread_key(thread_id)}},
        ConsistentRead=True,
    )["Items"]
    return items


def record_calls(client: Any) -> list[dict[str, Any]]:
    """Every API call the client makes from now on: operation name and parameters."""
    calls: list[dict[str, Any]] = []

    def hook(model: Any, params: dict[str, Any], **_: Any) -> None:
        calls.append({"operation": model.name, "params": params})

    client.meta.events.register("provide-client-params.dynamodb", hook)
    return calls


def test_thread_keys_are_verbatim_or_hashed() -> None:
    assert thread_key("abc") == "thread#abc"
    assert thread_key("k" * 1024) == "thread#" + "k" * 1024
    long_a, long_b = "k" * 10_239 + "a", "k" * 10_239 + "b"
    assert thread_key(long_a).startswith("thread-sha256#")
    assert len(thread_key(long_a).encode()) < 2048
    assert thread_key(long_a) != thread_key(long_b)
    # An id that looks like a hashed key stays in the verbatim namespace.
    fake = "-sha256#" + "0" * 64
    assert thread_key(fake) == "thread#" + fake
    assert thread_key(fake) != thread_key("x" * 2000)


async def test_save_is_one_transaction_of_head_and_history(
    backend: DynamoBackend[Any], raw_client: Any, table_name: str
) -> None:
    cp = backend.checkpointer
    client = cp._table.client  # pyright: ignore[reportPrivateUsage]
    calls = record_calls(client)
    tid = f"layout-{uuid.uuid4().hex}"
    assert await cp.save(0, snap(tid, {"a": 1})) == 1
    assert [c["operation"] for c in calls] == ["TransactWriteItems"]
    actions = calls[0]["params"]["TransactItems"]
    assert [next(iter(a)) for a in actions] == ["Update", "Put"]
    assert actions[0]["Update"]["ReturnValuesOnConditionCheckFailure"] == "ALL_OLD"
    assert await cp.save(1, snap(tid, {"a": 2}, status=RunStatus.SUSPENDED)) == 2
    items = thread_items(raw_client, table_name, tid)
    assert sorted(i["sk"]["S"] for i in items) == [
        "head",
        f"rev#{1:020d}",
        f"rev#{2:020d}",
    ]
    h = head(raw_client, table_name, tid)
    assert h is not None
    assert h["thread_id"]["S"] == tid
    assert h["revision"]["N"] == "2"
    assert h["status"]["S"] == "suspended"
    assert h["handoff_status"]["S"] == "none"
    assert "record" in h
    assert h["list_key"]["S"].startswith("none#")


async def test_every_expression_uses_placeholders(backend: DynamoBackend[Any]) -> None:
    """No attribute name or value is spliced into an expression, whatever the id."""
    cp, leases = backend.checkpointer, backend.leases
    calls = record_calls(cp._table.client)  # pyright: ignore[reportPrivateUsage]
    tid = "x'; #pk = :pk OR revision > 0 --" + uuid.uuid4().hex
    lease = await leases.acquire(tid, "owner", 30)
    await cp.save(0, snap(tid), lease=lease)
    await cp.save(1, snap(tid), lease=lease)
    await leases.renew(lease, 30)
    with pytest.raises(ConcurrencyConflictError):
        await cp.save(0, snap(tid), lease=lease)
    await cp.load(tid)
    await cp.get_history(tid)
    await cp.prune(tid, 1)
    await leases.release(lease)
    await cp.delete_if_idle(tid)
    await cp.list_threads()
    expressions = 0
    for call in calls:
        params = call["params"]
        bodies = [params]
        bodies += [next(iter(a.values())) for a in params.get("TransactItems", [])]
        for body in bodies:
            names = body.get("ExpressionAttributeNames", {})
            values = body.get("ExpressionAttributeValues", {})
            for field in (
                "UpdateExpression",
                "ConditionExpression",
                "KeyConditionExpression",
                "FilterExpression",
                "ProjectionExpression",
            ):
                text = body.get(field)
                if text is None:
                    continue
                expressions += 1
                assert tid not in text
                stripped = re.sub(r"[#:][A-Za-z0-9_]+", "", text)
                words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", stripped))
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
                for token in re.findall(r"#[A-Za-z0-9_]+", text):
                    assert token in names, (token, text)
                for token in re.findall(r":[A-Za-z0-9_]+", text):
                    assert token in values, (token, text)
    assert expressions > 10


async def test_save_with_outbox_is_one_transaction(backend: DynamoBackend[Any]) -> None:
    cp, outbox = backend.checkpointer, backend.outbox
    calls = record_calls(cp._table.client)  # pyright: ignore[reportPrivateUsage]
    tid = f"tx-{uuid.uuid4().hex}"

    async def enqueue(tx: object, revision: int) -> None:
        from flowy.checkpoint import HandoffIntent, ResumeToken

        intent = HandoffIntent(
            thread_id=tid,
            pending_snapshot_revision=revision,
            committed_snapshot_revision=revision,
            snapshot_revision=revision,
            resume_token=ResumeToken(tid, revision),
            handoff_status=HandoffStatus.ENQUEUED,
            reason="handoff",
            execution_pointer="worker",
        )
        await outbox.enqueue_intent_tx(tx, intent)

    assert await cp.save_with_outbox(0, snap(tid), enqueue) == 1
    assert [c["operation"] for c in calls] == ["TransactWriteItems"]
    actions = calls[0]["params"]["TransactItems"]
    assert [next(iter(a)) for a in actions] == ["Update", "Put", "Put"]
    assert actions[2]["Put"]["Item"]["pk"]["S"].startswith("outbox#")


async def test_load_checks_the_stored_thread_id(
    backend: DynamoBackend[Any], raw_client: Any, table_name: str
) -> None:
    cp = backend.checkpointer
    tid = f"stored-id-{uuid.uuid4().hex}"
    await cp.save(0, snap(tid))
    raw_client.update_item(
        TableName=table_name,
        Key={"pk": {"S": thread_key(tid)}, "sk": {"S": "head"}},
        UpdateExpression="SET #t = :t",
        ExpressionAttributeNames={"#t": "thread_id"},
        ExpressionAttributeValues={":t": {"S": tid + "-other"}},
    )
    with pytest.raises(SnapshotEnvelopeInvalidError):
        await cp.load(tid)
    # A save onto an item of another id is refused too, and writes nothing.
    with pytest.raises(SnapshotEnvelopeInvalidError):
        await cp.save(1, snap(tid))
    with pytest.raises(SnapshotEnvelopeInvalidError):
        await backend.leases.acquire(tid, "owner", 30)
    assert len(thread_items(raw_client, table_name, tid)) == 2


async def test_history_checks_the_stored_thread_id(
    backend: DynamoBackend[Any], raw_client: Any, table_name: str
) -> None:
    cp = backend.checkpointer
    tid = f"history-id-{uuid.uuid4().hex}"
    await cp.save(0, snap(tid))
    raw_client.update_item(
        TableName=table_name,
        Key={"pk": {"S": thread_key(tid)}, "sk": {"S": f"rev#{1:020d}"}},
        UpdateExpression="SET #t = :t",
        ExpressionAttributeNames={"#t": "thread_id"},
        ExpressionAttributeValues={":t": {"S": "someone-else"}},
    )
    with pytest.raises(SnapshotEnvelopeInvalidError):
        await cp.get_history(tid)


async def test_list_threads_reads_the_index_not_the_records(
    backend: DynamoBackend[Any], raw_client: Any, table_name: str
) -> None:
    cp = backend.checkpointer
    tid = f"listed-{uuid.uuid4().hex}"
    await cp.save(0, snap(tid, handoff_status=HandoffStatus.PENDING, handoff_pending_at=5.5))
    raw_client.update_item(
        TableName=table_name,
        Key={"pk": {"S": thread_key(tid)}, "sk": {"S": "head"}},
        UpdateExpression="SET #r = :r",
        ExpressionAttributeNames={"#r": "record"},
        ExpressionAttributeValues={":r": {"B": b"garbage"}},
    )
    [summary] = await cp.list_threads(handoff_statuses=frozenset({HandoffStatus.PENDING}))
    assert (summary.thread_id, summary.revision, summary.handoff_pending_at) == (tid, 1, 5.5)
    described = raw_client.describe_table(TableName=table_name)["Table"]
    assert [ix["IndexName"] for ix in described["GlobalSecondaryIndexes"]] == [INDEX_NAME]


async def test_lease_only_head_is_not_a_thread(
    backend: DynamoBackend[Any], raw_client: Any, table_name: str
) -> None:
    cp, leases = backend.checkpointer, backend.leases
    tid = f"lease-only-{uuid.uuid4().hex}"
    lease = await leases.acquire(tid, "owner", 30)
    assert head(raw_client, table_name, tid) is not None
    with pytest.raises(ThreadNotFoundError):
        await cp.load(tid)
    assert await cp.list_threads() == []
    assert await cp.save(0, snap(tid), lease=lease) == 1


async def test_delete_keeps_the_fencing_token(
    backend: DynamoBackend[Any], raw_client: Any, table_name: str
) -> None:
    cp, leases = backend.checkpointer, backend.leases
    tid = f"delete-token-{uuid.uuid4().hex}"
    first = await leases.acquire(tid, "a", 30)
    await cp.save(0, snap(tid), lease=first)
    await leases.release(first)
    await cp.delete_if_idle(tid)
    with pytest.raises(ThreadNotFoundError):
        await cp.load(tid)
    remaining = thread_items(raw_client, table_name, tid)
    assert [i["sk"]["S"] for i in remaining] == ["head"]
    assert "record" not in remaining[0]
    assert "list_key" not in remaining[0]
    second = await leases.acquire(tid, "b", 30)
    assert second.token == first.token + 1


async def test_delete_of_a_never_leased_thread_removes_every_item(
    backend: DynamoBackend[Any], raw_client: Any, table_name: str
) -> None:
    cp = backend.checkpointer
    tid = f"delete-all-{uuid.uuid4().hex}"
    for expected in range(3):
        await cp.save(expected, snap(tid))
    await cp.delete(tid)
    assert thread_items(raw_client, table_name, tid) == []


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
    history = await cp.get_history(tid)
    assert [(s.revision, s.write_id) for s in history] == [
        (2, second.write_id),
        (1, history[1].write_id),
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
    cp = DynamoCheckpointer[Any](dynamo_endpoint.client(), table_name, expire_after=3600)
    try:
        tid = f"ttl-{uuid.uuid4().hex}"
        await cp.save(0, snap(tid))
        assert "expires" not in (head(raw_client, table_name, tid) or {})
        await cp.save(1, snap(tid, status=RunStatus.COMPLETED))
        items = {i["sk"]["S"]: i for i in thread_items(raw_client, table_name, tid)}
        expires = int(items["head"]["expires"]["N"])
        assert int(items[f"rev#{2:020d}"]["expires"]["N"]) == expires
        assert "expires" not in items[f"rev#{1:020d}"]
        await cp.save(2, snap(tid, status=RunStatus.RUNNING))
        assert "expires" not in (head(raw_client, table_name, tid) or {})
        ttl = raw_client.describe_time_to_live(TableName=table_name)["TimeToLiveDescription"]
        assert (ttl["TimeToLiveStatus"], ttl["AttributeName"]) == ("ENABLED", "expires")
    finally:
        await cp.close()


def test_create_table_is_idempotent(dynamo_endpoint: Any) -> None:
    client = dynamo_endpoint.client()
    name = f"flowy-idem-{uuid.uuid4().hex[:12]}"
    try:
        create_table(client, name)
        create_table(client, name)
        table = client.describe_table(TableName=name)["Table"]
        assert table["TableStatus"] == "ACTIVE"
        assert table["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
        assert {k["AttributeName"]: k["KeyType"] for k in table["KeySchema"]} == {
            "pk": "HASH",
            "sk": "RANGE",
        }
    finally:
        client.delete_table(TableName=name)


def test_create_table_refuses_other_objects() -> None:
    with pytest.raises(TypeError):
        create_table(object(), "t")


async def test_fences_only_leases_of_the_same_table(
    dynamo_endpoint: Any, backend: DynamoBackend[Any], table_name: str
) -> None:
    from flowy import MemoryLeaseManager

    cp = backend.checkpointer
    assert cp.fences(backend.leases)
    same = DynamoLeaseManager(dynamo_endpoint.client(), table_name)
    other = DynamoLeaseManager(dynamo_endpoint.client(), table_name + "-other")
    try:
        assert cp.fences(same)
        assert not cp.fences(other)
        assert not cp.fences(MemoryLeaseManager())
    finally:
        await same.close()
        await other.close()


async def test_any_ttl_attribute_name_goes_through_a_placeholder(dynamo_endpoint: Any) -> None:
    from flowy import StorageError

    client = dynamo_endpoint.client()
    name = f"flowy-ttl-{uuid.uuid4().hex[:12]}"
    create_table(client, name, ttl_attribute="expire-at")
    cp = DynamoCheckpointer[Any](client, name, expire_after=60, ttl_attribute="expire-at")
    try:
        with pytest.raises(StorageError, match="already has time to live"):
            create_table(client, name)  # the default attribute differs
        tid = f"ttl-name-{uuid.uuid4().hex}"
        await cp.save(0, snap(tid, status=RunStatus.COMPLETED))
        assert "expire-at" in (head(client, name, tid) or {})
        await cp.save(1, snap(tid))
        assert "expire-at" not in (head(client, name, tid) or {})
        await cp.delete(tid)
        assert thread_items(client, name, tid) == []
    finally:
        await cp.close()
        client.delete_table(TableName=name)
