"""DynamoDB-specific checkpointer tests: the single-table layout, thread keys, one
transaction per save, placeholders in every expression, stored-id checks, the index
behind ``list_threads`` (thread-id order, ``after``), history left over from a deleted
thread, time to live, the table itself; and durable time: the wake-up time written by the
save's own ``Update`` of the head, the sparse ``timers`` index read shard by shard, exact
numbers, the items of the signal inbox and the activity journal, deleted with the
thread."""

from __future__ import annotations

import asyncio
import hashlib
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest

import flowy
import flowy_dynamodb
from flowy.errors import (
    ConcurrencyConflictError,
    SnapshotEnvelopeInvalidError,
    ThreadLeaseBusyError,
    ThreadNotFoundError,
)
from flowy.memory import MemoryLeaseManager
from flowy.storage import (
    ActivityRecord,
    ActivityStatus,
    HandoffIntent,
    HandoffStatus,
    ResumeToken,
    RunStatus,
    Signal,
    Snapshot,
    Timer,
)
from flowy.storage.dialect import MAX_TIMESTAMP, new_write_id
from flowy_dynamodb import DynamoBackend, thread_key

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


async def test_the_applications_actions_commit_in_the_saves_transaction(
    backend: DynamoBackend[Any], raw_client: Any, table_name: str
) -> None:
    """``add_action`` puts an action of the application into the save's own
    ``TransactWriteItems``: it commits with the snapshot, or nothing does."""
    cp, outbox = backend.checkpointer, backend.outbox
    tid = f"app-{uuid.uuid4().hex}"
    item = {"pk": {"S": f"app#{tid}"}, "sk": {"S": "order"}}
    put = {"Put": {"TableName": table_name, "Item": item}}
    handles: list[object] = []

    async def enqueue(tx: object, revision: int) -> None:
        handles.append(tx)
        with pytest.raises(ValueError, match="an action is one of"):
            cp.add_action(tx, {"Scan": {}})
        cp.add_action(tx, put)
        await outbox.enqueue_intent_tx(tx, intent(tid, revision))

    calls = record_calls(backend)
    assert await cp.save_with_outbox(0, snap(tid), enqueue) == 1
    assert [next(iter(a)) for a in calls[0]["params"]["TransactItems"]] == [
        "Update",
        "Put",
        "Update",
        "Put",
    ]
    key = {"pk": item["pk"], "sk": item["sk"]}
    assert "Item" in raw_client.get_item(TableName=table_name, Key=key)
    with pytest.raises(RuntimeError, match="transaction is over"):
        cp.add_action(handles[0], put)
    # A refused save writes none of the application's actions either.
    other = {"pk": {"S": f"app#{tid}"}, "sk": {"S": "refused"}}

    async def enqueue_refused(tx: object, revision: int) -> None:
        cp.add_action(tx, {"Put": {"TableName": table_name, "Item": other}})

    with pytest.raises(ConcurrencyConflictError):
        await cp.save_with_outbox(0, snap(tid), enqueue_refused)
    assert "Item" not in raw_client.get_item(TableName=table_name, Key=other)


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
    await cp.save(0, replace(snap(tid), wake_at=5.0))
    await cp.timers(before=10)
    await cp.append_signal(Signal(tid, "n", None, tid))
    await cp.append_signal(Signal(tid, "n", None, tid))
    await cp.signals(tid, after=0)
    await cp.put_activity(tid, ActivityRecord(tid, ActivityStatus.STARTED))
    await cp.get_activity(tid, tid)
    await cp.journal(tid)
    await cp.delete(tid)
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
                    "BETWEEN",
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
    with pytest.warns(
        DeprecationWarning, match="create_table is deprecated; use `await backend.setup"
    ):
        create_table = flowy_dynamodb.create_table
    create_table(client, table_name)
    create_table(client, table_name)
    table = client.describe_table(TableName=table_name)["Table"]
    assert table["TableStatus"] == "ACTIVE"
    assert table["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    assert sorted(i["IndexName"] for i in table["GlobalSecondaryIndexes"]) == [
        "dead_letters",
        "heads",
        "outbox",
        "queues",
        "timers",
    ]
    version = client.get_item(
        TableName=table_name, Key={"pk": {"S": "flowy#schema"}, "sk": {"S": "version"}}
    )["Item"]["version"]["N"]
    assert version == "4"
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


# -- durable time: timers, signals, the activity journal --------------------------------

AT = 1_700_000_000.25


def waiting(thread_id: str, wake_at: float | None) -> Snapshot[Any]:
    return replace(snap(thread_id, status=RunStatus.WAITING, reason="sleep"), wake_at=wake_at)


def signal(thread_id: str, signal_id: str, payload: Any = None) -> Signal:
    return Signal(thread_id, "approval", payload, signal_id, sent_at=AT)


def record(key: str) -> ActivityRecord:
    return ActivityRecord(key, ActivityStatus.SUCCEEDED, "charge", 1, {"ok": key[:20]}, "", AT, AT)


async def timers_of(backend: DynamoBackend[Any], *threads: str, **kw: Any) -> list[Timer]:
    got = await backend.checkpointer.timers(limit=10_000, **kw)
    return [t for t in got if t.thread_id in threads]


async def test_the_wake_up_time_is_set_and_removed_by_the_saves_own_update(
    backend: DynamoBackend[Any], raw_client: Any, table_name: str
) -> None:
    cp = backend.checkpointer
    tid = f"wake-{uuid.uuid4().hex}"
    calls = record_calls(backend)
    await cp.save(0, waiting(tid, AT))
    assert [c["operation"] for c in calls] == ["TransactWriteItems"]
    head = thread_items(raw_client, table_name, tid)["head"]
    assert head["wake_at"] == {"N": "1700000000.25"}  # exact, in plain notation
    assert head["timer_shard"]["S"] in {f"timers#{i}" for i in range(8)}
    assert await timers_of(backend, tid) == [Timer(tid, AT)]
    [summary] = [t for t in await cp.list_threads(limit=1000) if t.thread_id == tid]
    assert summary.wake_at == AT

    await cp.save(1, snap(tid, pointer="next"))  # the new head has no wake-up time
    head = thread_items(raw_client, table_name, tid)["head"]
    assert "wake_at" not in head and "timer_shard" not in head
    assert await timers_of(backend, tid) == []
    [summary] = [t for t in await cp.list_threads(limit=1000) if t.thread_id == tid]
    assert summary.wake_at is None


async def test_the_graph_version_is_written_by_the_saves_own_update(
    backend: DynamoBackend[Any], raw_client: Any, table_name: str
) -> None:
    cp = backend.checkpointer
    tid = f"version-{uuid.uuid4().hex}"
    calls = record_calls(backend)
    await cp.save(0, snap(tid, graph_version="v1"))
    assert [c["operation"] for c in calls] == ["TransactWriteItems"]
    assert thread_items(raw_client, table_name, tid)["head"]["graph_version"] == {"S": "v1"}
    [summary] = [t for t in await cp.list_threads(limit=1000) if t.thread_id == tid]
    assert summary.graph_version == "v1"

    await cp.save(1, snap(tid))  # a graph without a version: the attribute goes
    assert "graph_version" not in thread_items(raw_client, table_name, tid)["head"]
    [summary] = [t for t in await cp.list_threads(limit=1000) if t.thread_id == tid]
    assert summary.graph_version == ""


async def test_timers_query_each_shard_of_the_index(backend: DynamoBackend[Any]) -> None:
    cp = backend.checkpointer
    threads = [f"shard-{i}-{uuid.uuid4().hex}" for i in range(24)]
    for i, tid in enumerate(threads):
        await cp.save(0, waiting(tid, AT + i % 3))
    calls = record_calls(backend)
    got = await timers_of(backend, *threads, before=AT + 1)
    assert [(t.wake_at, t.thread_id) for t in got] == sorted(
        (AT + i % 3, tid) for i, tid in enumerate(threads) if i % 3 < 2
    )
    assert [c["operation"] for c in calls] == ["Query"] * 8
    assert {c["params"]["IndexName"] for c in calls} == {"timers"}
    assert {c["params"]["ExpressionAttributeValues"][":v0"]["S"] for c in calls} == {
        f"timers#{i}" for i in range(8)
    }
    assert len(await cp.timers(before=AT + 2, limit=5)) == 5


async def test_timers_at_the_edges_of_dynamodbs_numbers(backend: DynamoBackend[Any]) -> None:
    cp = backend.checkpointer
    zero, early, late = (f"{n}-{uuid.uuid4().hex}" for n in ("zero", "early", "late"))
    await cp.save(0, waiting(zero, 0.0))
    await cp.save(0, waiting(early, 5e-100))
    await cp.save(0, waiting(late, MAX_TIMESTAMP))
    assert await timers_of(backend, zero, early, late, before=1e-300) == [Timer(zero, 0.0)]
    assert await timers_of(backend, zero, early, late, before=1e-99) == [
        Timer(zero, 0.0),
        Timer(early, 5e-100),
    ]
    assert await timers_of(backend, zero, early, late, before=-1e-300) == []
    assert await timers_of(backend, zero, early, late, before=-1e300) == []
    everything = [Timer(zero, 0.0), Timer(early, 5e-100), Timer(late, MAX_TIMESTAMP)]
    assert await timers_of(backend, zero, early, late, before=1e300) == everything
    assert await timers_of(backend, zero, early, late) == everything
    # Past flowy's range (any store refuses it), and within it but not a DynamoDB number.
    for unstorable, message in (
        (1e38, "a stored time"),
        (-5e-100, "a stored time"),
        (1e-200, "cannot store"),
    ):
        tid = f"unstorable-{uuid.uuid4().hex}"
        with pytest.raises(ValueError, match=message):
            await cp.save(0, waiting(tid, unstorable))
        with pytest.raises(ThreadNotFoundError):
            await cp.load(tid)
        assert await timers_of(backend, tid) == []


async def test_delete_under_a_live_lease_takes_the_head_out_of_the_index(
    backend: DynamoBackend[Any], raw_client: Any, table_name: str
) -> None:
    cp, leases = backend.checkpointer, backend.leases
    tid = f"leased-wait-{uuid.uuid4().hex}"
    lease = await leases.acquire(tid, "a", 30)
    await cp.save(0, waiting(tid, AT), lease=lease)
    await cp.put_activity(tid, record("k"))
    await cp.append_signal(signal(tid, "s1"))
    with pytest.raises(ThreadLeaseBusyError):
        await cp.delete_if_idle(tid)
    assert len(thread_items(raw_client, table_name, tid)) == 5  # nothing deleted
    await cp.delete(tid)
    [item] = thread_items(raw_client, table_name, tid).values()
    assert "wake_at" not in item and "timer_shard" not in item and "lease_owner" in item
    assert await timers_of(backend, tid) == []
    assert await cp.signals(tid) == [] and await cp.journal(tid) == []


async def test_signal_and_journal_items(
    backend: DynamoBackend[Any], raw_client: Any, table_name: str
) -> None:
    cp = backend.checkpointer
    for tid in (f"items-{uuid.uuid4().hex}", "k" * 2000 + uuid.uuid4().hex):  # hashed pk too
        long_id, long_key = "i" * 1024, "a" * 1020 + "ü"  # the longest: hashed sort keys
        first = await cp.append_signal(signal(tid, "short", {"n": 1}))
        second = await cp.append_signal(signal(tid, long_id, {"n": 2}))
        assert (first.seq, second.seq) == (1, 2)
        assert await cp.append_signal(signal(tid, long_id, "again")) == second
        await cp.put_activity(tid, record("k1"))
        await cp.put_activity(tid, record(long_key))
        items = thread_items(raw_client, table_name, tid)
        digest = hashlib.sha256
        assert sorted(items) == sorted(
            [
                f"sig#{1:020d}",
                f"sig#{2:020d}",
                "sigid#short",
                "sigid-sha256#" + digest(long_id.encode()).hexdigest(),
                "act#k1",
                "act-sha256#" + digest(long_key.encode()).hexdigest(),
            ]
        )
        assert {i["pk"]["S"] for i in items.values()} == {thread_key(tid)}
        assert {i["thread_id"]["S"] for i in items.values()} == {tid}
        assert items["sigid#short"]["seq"] == {"N": "1"}
        assert items[f"sig#{2:020d}"]["signal_id"]["S"] == long_id
        assert [s.payload for s in await cp.signals(tid)] == [{"n": 1}, {"n": 2}]
        assert await cp.get_activity(tid, long_key) == record(long_key)
        assert sorted(r.key for r in await cp.journal(tid)) == sorted(["k1", long_key])
        await cp.delete(tid)  # a thread without a head: its inbox and journal go
        assert thread_items(raw_client, table_name, tid) == {}
        assert await cp.append_signal(signal(tid, "short", {"n": 3})) == replace(
            first, payload={"n": 3}
        )  # numbered from 1 again, the id forgotten


async def test_delete_removes_history_signals_and_journal(
    backend: DynamoBackend[Any], raw_client: Any, table_name: str
) -> None:
    cp = backend.checkpointer
    tid = f"delete-all-{uuid.uuid4().hex}"
    for expected in range(3):
        await cp.save(expected, waiting(tid, AT + expected))
    for i in range(30):  # more than one BatchWriteItem
        await cp.append_signal(signal(tid, f"s{i}"))
        await cp.put_activity(tid, record(f"k{i}"))
    assert len(thread_items(raw_client, table_name, tid)) == 1 + 3 + 30 * 3
    calls = record_calls(backend)
    await cp.delete(tid)
    assert thread_items(raw_client, table_name, tid) == {}
    assert await timers_of(backend, tid) == []
    deleted = [
        r["DeleteRequest"]["Key"]["sk"]["S"]
        for c in calls
        if c["operation"] == "BatchWriteItem"
        for r in c["params"]["RequestItems"][table_name]
    ]
    assert len(deleted) == 3 + 30 * 3
    ids, numbers = (
        [i for i, sk in enumerate(deleted) if sk.startswith(p)] for p in ("sigid#", "sig#")
    )
    assert max(ids) < min(numbers)  # a signal id goes before its signal


async def test_racing_senders_on_many_clients(dynamo_endpoint: Any, table_name: str) -> None:
    url = dynamo_endpoint.store_url(table_name, clock_skew=0)
    backends: list[DynamoBackend[Any]] = []
    try:
        for _ in range(4):  # four processes, as it were
            opened = await flowy.connect(url)
            assert isinstance(opened, DynamoBackend)
            backends.append(opened)
        tid = f"crowd-{uuid.uuid4().hex}"
        sends = [
            backends[i % 4].checkpointer.append_signal(signal(tid, f"s{i % 20}", i % 20))
            for i in range(40)  # every id sent twice
        ]
        stored = await asyncio.gather(*sends)
        by_id = {s.signal_id: s.seq for s in stored}
        assert sorted(by_id.values()) == list(range(1, 21))
        assert all(by_id[s.signal_id] == s.seq for s in stored)
        inbox = await backends[0].checkpointer.signals(tid, limit=100)
        assert [(s.seq, s.signal_id) for s in inbox] == sorted((q, i) for i, q in by_id.items())
    finally:
        for opened in backends:
            await opened.aclose()


async def test_a_journal_entry_copied_under_another_key_is_refused(
    backend: DynamoBackend[Any], raw_client: Any, table_name: str
) -> None:
    """The record of a journal entry names its key: one read under another is damaged."""
    cp = backend.checkpointer
    tid = f"journal-key-{uuid.uuid4().hex}"
    await cp.put_activity(tid, record("a"))
    copy = thread_items(raw_client, table_name, tid)["act#a"]
    copy |= {"sk": {"S": "act#b"}, "activity_key": {"S": "b"}}
    raw_client.put_item(TableName=table_name, Item=copy)
    with pytest.raises(SnapshotEnvelopeInvalidError, match="'a'"):
        await cp.get_activity(tid, "b")
