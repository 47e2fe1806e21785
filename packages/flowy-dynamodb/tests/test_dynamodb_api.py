"""The public face of flowy-dynamodb: exported names, ``flowy.connect`` through the
entry point, URL options (and their errors), credentials kept out of URLs and messages,
client ownership, the deprecated ``close()``, schema versions, the 0.1 upgrade and the
upgrade of a schema 2 table."""

from __future__ import annotations

import importlib.metadata
import time
import urllib.parse
import uuid
from dataclasses import replace
from typing import Any

import pytest

import flowy
import flowy_dynamodb
from flowy.errors import BackendURLError, SchemaVersionError, StorageError
from flowy.storage import (
    ActivityRecord,
    ActivityStatus,
    HandoffIntent,
    HandoffStatus,
    LeaseManager,
    OutboxConsumer,
    ResumeToken,
    RunStatus,
    Signal,
    Snapshot,
    Timer,
    TransactionalCheckpointer,
    TransactionalOutbox,
)
from flowy.storage.dialect import FencingCheckpointer, encode_intent, encode_snapshot, new_write_id
from flowy_dynamodb import DynamoBackend, thread_key

pytestmark = pytest.mark.anyio


def test_exports() -> None:
    assert sorted(flowy_dynamodb.__all__) == sorted(set(flowy_dynamodb.__all__))
    for name in flowy_dynamodb.__all__:
        obj = getattr(flowy_dynamodb, name)
        if isinstance(obj, type) or callable(obj):
            assert obj.__module__ == "flowy_dynamodb", name
            assert obj.__doc__, f"{name} has no docstring"


def test_the_entry_point_names_the_opener() -> None:
    [entry] = [
        e for e in importlib.metadata.entry_points(group="flowy.backends") if e.name == "dynamodb"
    ]
    assert entry.value == "flowy_dynamodb:open_backend"
    assert entry.load() is flowy_dynamodb.open_backend


async def test_connect_opens_a_store_with_every_option(
    dynamo_endpoint: Any, table_name: str
) -> None:
    url = dynamo_endpoint.store_url(
        table_name,
        create_table="yes",
        max_attempts=7,
        max_workers=3,
        retry_attempts=2,
        retry_mode="adaptive",
        clock_skew=1.5,
        expire_after=60,
        poll_interval=0.25,
    )
    async with flowy.connect(url) as backend:
        assert isinstance(backend, DynamoBackend)
        assert backend.url == url
        table = backend.table
        assert (table.name, table.clock_skew, table.expire_after) == (table_name, 1.5, 60.0)
        assert table.pool._max_workers == 3
        config = table.client.meta.config
        assert config.retries == {"mode": "adaptive", "total_max_attempts": 2}
        assert config.max_pool_connections == 3
        assert table.client.meta.region_name == dynamo_endpoint.region
        assert (backend.consumer.max_attempts, backend.consumer.poll_interval) == (7, 0.25)
        assert isinstance(backend.checkpointer, FencingCheckpointer)
        assert isinstance(backend.checkpointer, TransactionalCheckpointer)
        assert isinstance(backend.leases, LeaseManager)
        assert isinstance(backend.outbox, TransactionalOutbox)
        assert isinstance(backend.consumer, OutboxConsumer)
        domains = {c.domain for c in (backend.checkpointer, backend.leases, backend.outbox)}
        assert domains == {backend.consumer.domain}
        snap: Snapshot[Any] = Snapshot(thread_id="t", state={"x": 1}, execution_pointer="p")
        assert await backend.checkpointer.save(0, snap) == 1
    assert backend.closed


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("max_attempts", "0"),
        ("max_workers", "many"),
        ("retry_attempts", "-1"),
        ("retry_mode", "legacy"),
        ("clock_skew", "-1"),
        ("clock_skew", "nan"),
        ("expire_after", "0"),
        ("poll_interval", "soon"),
        ("create_table", "maybe"),
    ],
)
async def test_bad_option_values_name_the_option(
    dynamo_endpoint: Any, option: str, value: str
) -> None:
    with pytest.raises(BackendURLError, match=option):
        await flowy.connect(dynamo_endpoint.store_url("flowy-never-made", **{option: value}))


async def test_an_unknown_option_lists_the_known_ones() -> None:
    with pytest.raises(BackendURLError) as info:
        await flowy.connect("dynamodb://my-table?region=us-east-1&shards=4&colour=blue")
    message = str(info.value)
    assert "colour, shards" in message
    for option in flowy_dynamodb.OPTIONS:
        assert option in message


@pytest.mark.parametrize(
    "url",
    [
        "dynamodb://key:s3cret@my-table?region=us-east-1",
        "dynamodb://:s3cret@my-table?region=us-east-1",
        "dynamodb://key:s3cret@my-table?region=us-east-1&unknown=1",
        "dynamodb://my-table?endpoint_url=http://key:s3cret@localhost:8000&unknown=1",
    ],
)
async def test_credentials_stay_out_of_urls_and_messages(url: str) -> None:
    with pytest.raises(BackendURLError) as info:
        await flowy.connect(url)
    assert "s3cret" not in str(info.value)
    assert "@my-table" not in url or "***" in str(info.value)


@pytest.mark.parametrize(
    "url",
    ["dynamodb://?region=us-east-1", "dynamodb://ab", "dynamodb://a/b", "dynamodb://bad name"],
)
async def test_a_url_must_name_a_table(url: str) -> None:
    with pytest.raises(BackendURLError, match="table"):
        await flowy.connect(url)


async def test_no_region_and_an_unknown_profile_are_url_errors(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    with pytest.raises(BackendURLError, match="region"):
        await flowy.connect("dynamodb://my-table")
    with pytest.raises(BackendURLError, match="no-such-profile"):
        await flowy.connect("dynamodb://my-table?region=us-east-1&profile=no-such-profile")


async def test_a_missing_table_without_create_table(dynamo_endpoint: Any, table_name: str) -> None:
    url = dynamo_endpoint.store_url(table_name, create_table="false")
    with pytest.raises(StorageError, match=r"does not exist.*backend.setup\(\)"):
        await flowy.connect(url)
    backend = await flowy_dynamodb.open_backend(
        flowy.storage.dialect.StoreURL.parse(url), codec=None
    )
    try:  # setup() creates what open() refuses to create
        assert await backend.setup() == flowy_dynamodb.SCHEMA_VERSION
        await backend.open()
        created: Snapshot[Any] = Snapshot(thread_id="t", state={}, execution_pointer="p")
        assert await backend.checkpointer.save(0, created) == 1
    finally:
        await backend.aclose()


async def test_from_client_leaves_the_client_open(dynamo_endpoint: Any, table_name: str) -> None:
    client = dynamo_endpoint.client()
    closed: list[bool] = []
    client.close = lambda: closed.append(True)
    backend: DynamoBackend[Any] = DynamoBackend[Any].from_client(client, table_name, clock_skew=0)
    async with backend:
        # Its URL reaches the same table again (credentials from the environment).
        params = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(backend.url).query))
        assert params["endpoint_url"] == dynamo_endpoint.url and params["clock_skew"] == "0"
        async with flowy.connect(backend.url) as peer:
            snap: Snapshot[Any] = Snapshot(thread_id="p", state=1, execution_pointer="p")
            await peer.checkpointer.save(0, snap)
        assert (await backend.checkpointer.load("p"))[1] == 1
    assert closed == []
    assert repr(backend) == f"DynamoBackend({backend.url!r})"
    owned = await flowy.connect(dynamo_endpoint.store_url(table_name))
    assert isinstance(owned, DynamoBackend)
    owned_client = owned.table.client
    owned_closed: list[bool] = []
    owned_client.close = lambda: owned_closed.append(True)
    await owned.aclose()
    await owned.aclose()  # idempotent
    assert owned_closed == [True]
    with pytest.raises(StorageError, match="closed"):
        await owned.checkpointer.load("p")


async def test_close_is_a_deprecated_alias(dynamo_endpoint: Any, table_name: str) -> None:
    backend = await flowy.connect(dynamo_endpoint.store_url(table_name))
    assert isinstance(backend, DynamoBackend)
    with pytest.warns(DeprecationWarning, match="aclose"):
        await backend.close()
    assert backend.closed


async def test_a_newer_schema_is_refused(
    dynamo_endpoint: Any, table_name: str, raw_client: Any
) -> None:
    url = dynamo_endpoint.store_url(table_name)
    async with flowy.connect(url) as backend:
        assert await backend.setup() == 4
    raw_client.put_item(
        TableName=table_name,
        Item={"pk": {"S": "flowy#schema"}, "sk": {"S": "version"}, "version": {"N": "5"}},
    )
    with pytest.raises(SchemaVersionError, match="newer"):
        await flowy.connect(url)


def _v2_table(client: Any, name: str) -> None:
    """A table of schema 2, as flowy-dynamodb made it before durable time."""
    keys = {"pk": "S", "sk": "S", "list_key": "S", "list_sort": "S", "live_key": "S"}
    keys |= {"visible_at": "N", "dead_key": "S", "dead_at": "N"}
    summary = ["thread_id", "revision", "pointer", "status", "reason", "handoff_status"]
    summary += ["handoff_pending_at", "updated_at"]

    def index(name: str, hash_key: str, range_key: str, included: list[str] | None) -> Any:
        projection: dict[str, Any] = {"ProjectionType": "KEYS_ONLY"}
        if included is not None:
            projection = {"ProjectionType": "INCLUDE", "NonKeyAttributes": included}
        schema = [
            {"AttributeName": hash_key, "KeyType": "HASH"},
            {"AttributeName": range_key, "KeyType": "RANGE"},
        ]
        return {"IndexName": name, "KeySchema": schema, "Projection": projection}

    client.create_table(
        TableName=name,
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[{"AttributeName": a, "AttributeType": k} for a, k in keys.items()],
        KeySchema=[
            {"AttributeName": "pk", "KeyType": "HASH"},
            {"AttributeName": "sk", "KeyType": "RANGE"},
        ],
        GlobalSecondaryIndexes=[
            index("by_thread", "list_key", "list_sort", summary),
            index("outbox", "live_key", "visible_at", None),
            index("dead_letters", "dead_key", "dead_at", ["payload", "attempts", "error"]),
        ],
    )
    client.update_time_to_live(
        TableName=name, TimeToLiveSpecification={"Enabled": True, "AttributeName": "expires"}
    )
    client.put_item(
        TableName=name,
        Item={"pk": {"S": "flowy#schema"}, "sk": {"S": "version"}, "version": {"N": "2"}},
    )


async def test_a_schema_2_table_is_refused_until_set_up(
    dynamo_endpoint: Any, table_name: str, raw_client: Any
) -> None:
    """Schema 3 adds the ``timers`` index and replaces ``by_thread`` by ``heads`` (its
    projection carries ``wake_at`` and ``graph_version``); the upgrade keeps every
    thread, message and lease."""
    _v2_table(raw_client, table_name)
    tid = f"v2-{uuid.uuid4().hex}"
    snap: Snapshot[Any] = Snapshot(
        thread_id=tid,
        state={"n": 2},
        execution_pointer="p",
        handoff_status=HandoffStatus.ENQUEUED,
        write_id=new_write_id(),
    )
    record = encode_snapshot(snap, 1, None)
    common = {"pk": {"S": thread_key(tid)}, "thread_id": {"S": tid}, "write_tx": {"S": "x"}}
    handoff = HandoffIntent(
        thread_id=tid,
        pending_snapshot_revision=1,
        committed_snapshot_revision=1,
        snapshot_revision=1,
        resume_token=ResumeToken(tid, 1),
        handoff_status=HandoffStatus.ENQUEUED,
        reason="handoff",
        execution_pointer="worker",
    )
    for item in (
        {  # the head, leased
            "sk": {"S": "head"},
            "revision": {"N": "1"},
            "record": {"B": record},
            "pointer": {"S": "p"},
            "status": {"S": "running"},
            "reason": {"S": ""},
            "handoff_status": {"S": "enqueued"},
            "updated_at": {"N": "0"},
            "list_key": {"S": "enqueued#5"},
            "list_sort": {"S": tid},
            "lease_owner": {"S": "old-worker"},
            "lease_expires_at": {"N": "1"},
            "lease_token": {"N": "7"},
        },
        {"sk": {"S": f"rev#{1:020d}"}, "revision": {"N": "1"}, "record": {"B": record}},
        {  # its hand-off message, live
            "sk": {"S": f"outbox#{1:020d}"},
            "payload": {"B": encode_intent(handoff)},
            "attempts": {"N": "0"},
            "error": {"S": ""},
            "live_key": {"S": "live#2"},
            "visible_at": {"N": "0"},
        },
    ):
        raw_client.put_item(TableName=table_name, Item={**common, **item})
    url = dynamo_endpoint.store_url(table_name, clock_skew=0)
    with pytest.raises(SchemaVersionError, match=r"version 2, older.*backend.setup\(\)"):
        await flowy.connect(url)

    client = dynamo_endpoint.client()
    backend: DynamoBackend[Any] = DynamoBackend[Any].from_client(client, table_name, clock_skew=0)
    assert await backend.setup() == 4
    assert await backend.setup() == 4  # idempotent
    indexes = raw_client.describe_table(TableName=table_name)["Table"]["GlobalSecondaryIndexes"]
    assert {i["IndexName"]: i["IndexStatus"] for i in indexes} == dict.fromkeys(
        ("heads", "outbox", "dead_letters", "timers", "queues"), "ACTIVE"
    )
    async with backend:
        cp = backend.checkpointer
        assert await cp.load(tid) == (snap.at_revision(1), 1)
        [listed] = await cp.list_threads(handoff_statuses=frozenset({HandoffStatus.ENQUEUED}))
        assert (listed.thread_id, listed.revision, listed.wake_at) == (tid, 1, None)
        assert listed.graph_version == ""
        [message] = await backend.consumer.claim(10, 30)
        assert (message.intent.thread_id, message.attempts) == (tid, 1)
        assert await cp.timers() == []
        lease = await backend.leases.acquire(tid, "new-worker", 30)
        assert lease.fencing_token > 7
        waiting = replace(
            snap, status=RunStatus.WAITING, wake_at=1_700_000_000.25, graph_version="v3"
        )
        assert await cp.save(1, waiting, lease=lease) == 2
        assert await cp.timers() == [Timer(tid, 1_700_000_000.25)]
        [listed] = await cp.list_threads()
        assert (listed.revision, listed.wake_at, listed.graph_version) == (
            2,
            1_700_000_000.25,
            "v3",
        )
        sent = await cp.append_signal(Signal(tid, "go", {"ok": True}, "s-1"))
        assert [s.seq for s in await cp.signals(tid)] == [sent.seq] == [1]
        await cp.put_activity(tid, ActivityRecord("a", ActivityStatus.STARTED))
        assert [r.key for r in await cp.journal(tid)] == ["a"]
        assert [s.revision for s in await cp.get_history(tid)] == [2, 1]
    client.close()
    async with flowy.connect(url):
        pass


def _v1_table(client: Any, name: str) -> None:
    """A table as flowy-dynamodb 0.1 made it."""
    client.create_table(
        TableName=name,
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[
            {"AttributeName": a, "AttributeType": "S"} for a in ("pk", "sk", "list_key")
        ],
        KeySchema=[
            {"AttributeName": "pk", "KeyType": "HASH"},
            {"AttributeName": "sk", "KeyType": "RANGE"},
        ],
        GlobalSecondaryIndexes=[
            {
                "IndexName": "threads",
                "KeySchema": [{"AttributeName": "list_key", "KeyType": "HASH"}],
                "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": ["thread_id"]},
            }
        ],
    )


async def test_a_0_1_table_is_refused_until_set_up(
    dynamo_endpoint: Any, table_name: str, raw_client: Any
) -> None:
    _v1_table(raw_client, table_name)
    tid, queued, buried = f"old-{uuid.uuid4().hex}", "queued-thread", "buried-thread"
    snap: Snapshot[Any] = Snapshot(
        thread_id=tid,
        state={"n": 2},
        execution_pointer="p",
        handoff_status=HandoffStatus.ENQUEUED,
        write_id=new_write_id(),
    )
    record = encode_snapshot(snap, 2, None)
    common = {"pk": {"S": thread_key(tid)}, "thread_id": {"S": tid}, "record": {"B": record}}
    raw_client.put_item(
        TableName=table_name,
        Item={
            **common,
            "sk": {"S": "head"},
            "revision": {"N": "2"},
            "pointer": {"S": "p"},
            "status": {"S": "running"},
            "reason": {"S": ""},
            "handoff_status": {"S": "enqueued"},
            "updated_at": {"N": "0"},
            "write_tx": {"S": "x"},
            "list_key": {"S": "enqueued#3"},
            "lease_token": {"N": "4"},
        },
    )
    raw_client.put_item(
        TableName=table_name,
        Item={
            **common,
            "sk": {"S": f"rev#{2:020d}"},
            "revision": {"N": "2"},
            "write_tx": {"S": "x"},
        },
    )
    for pk, thread, error, extra in (
        ("outbox#1", queued, "", {"visible_at": {"N": "0"}}),
        ("dead#5", buried, "it failed", {"dead_at": {"N": str(time.time())}}),
        ("outbox#2", "", "", {"visible_at": {"N": "0"}}),
    ):
        intent = HandoffIntent(
            thread_id=thread,
            pending_snapshot_revision=1,
            committed_snapshot_revision=1,
            snapshot_revision=1,
            resume_token=ResumeToken(thread, 1),
            handoff_status=HandoffStatus.ENQUEUED,
            reason="handoff",
            execution_pointer="worker",
        )
        raw_client.put_item(
            TableName=table_name,
            Item={
                "pk": {"S": pk},
                "sk": {"S": f"{time.time_ns():020d}#{uuid.uuid4().hex}"},
                "payload": {"B": encode_intent(intent) if thread else b"poison"},
                "attempts": {"N": "3" if error else "1"},
                "error": {"S": error},
                "enqueued_at": {"N": "1"},
                **extra,
            },
        )
    url = dynamo_endpoint.store_url(table_name, clock_skew=0)
    with pytest.raises(SchemaVersionError, match=r"version 1, older.*backend.setup\(\)"):
        await flowy.connect(url)

    client = dynamo_endpoint.client()
    backend: DynamoBackend[Any] = DynamoBackend[Any].from_client(client, table_name, clock_skew=0)
    assert await backend.setup() == 4
    assert await backend.setup() == 4  # idempotent
    indexes = raw_client.describe_table(TableName=table_name)["Table"]["GlobalSecondaryIndexes"]
    assert {"heads", "outbox", "dead_letters", "timers", "queues"} <= {
        i["IndexName"] for i in indexes
    }
    async with backend:
        cp, consumer = backend.checkpointer, backend.consumer
        assert await cp.load(tid) == (snap.at_revision(2), 2)
        [listed] = await cp.list_threads(handoff_statuses=frozenset({HandoffStatus.ENQUEUED}))
        assert (listed.thread_id, listed.revision) == (tid, 2)
        [message] = await consumer.claim(10, 30)
        assert (message.intent.thread_id, message.attempts) == (queued, 2)
        dead = {d.thread_id: d for d in await consumer.dead_letters()}
        assert set(dead) == {buried, ""}
        assert (dead[buried].attempts, dead[buried].error) == (3, "it failed")
        assert dead[""].payload == b"poison" and dead[""].intent is None
        lease = await backend.leases.acquire(tid, "new-worker", 30)
        assert lease.fencing_token > 4
        await consumer.retry_dead_letter(dead[buried].message_id)
        [revived] = await consumer.claim(10, 30)
        assert (revived.intent.thread_id, revived.attempts) == (buried, 1)
    client.close()
    async with flowy.connect(url):
        pass
