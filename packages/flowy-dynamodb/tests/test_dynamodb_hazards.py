"""The hazards of a DynamoDB backend, each provoked for real over HTTP.

- Transient errors and throttling mid-transaction, injected with botocore's event hooks:
  a request that reached the table but whose response was lost (ambiguous outcome), a
  request that never arrived, throttling answered for the service, a transaction
  cancelled by a concurrent one. The save's own landed write is never reported as a
  conflict and is never applied twice; ``flowy.storage.dialect.confirmed_save`` resolves the
  outcomes the checkpointer cannot. A signal whose answer was lost is stored once.
- Two OS processes racing on one thread: a single history chain, no lost update.
- Oversized state: ``SnapshotTooLargeError`` naming the size, and nothing written.
- The blocking client never blocks the event loop, and the pool bounds the calls.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.awsrequest import AWSPreparedRequest, AWSResponse
from botocore.exceptions import ConnectionClosedError, ReadTimeoutError
from botocore.httpsession import URLLib3Session

import flowy
from flowy.errors import (
    ConcurrencyConflictError,
    SnapshotTooLargeError,
    StorageUnavailableError,
    ThreadNotFoundError,
)
from flowy.storage import (
    ActivityRecord,
    ActivityStatus,
    HandoffIntent,
    HandoffStatus,
    ResumeToken,
    Signal,
    Snapshot,
)
from flowy.storage.dialect import confirmed_save, new_write_id
from flowy_dynamodb import MAX_ITEM_BYTES, DynamoBackend, make_client

pytestmark = pytest.mark.anyio

WORKER = Path(__file__).with_name("dynamo_race_worker.py")


def snap(thread_id: str, state: Any = None) -> Snapshot[Any]:
    return Snapshot(
        thread_id=thread_id,
        state={"n": 1} if state is None else state,
        execution_pointer="step",
        write_id=new_write_id(),
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


class _Body:
    def __init__(self, data: bytes) -> None:
        self._data = data

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self._data


def service_error(code: str, message: str, **fields: Any) -> AWSResponse:
    """An HTTP 400 answer of DynamoDB with error ``code`` (as the service sends it)."""
    body = json.dumps(
        {"__type": f"com.amazonaws.dynamodb.v20120810#{code}", "message": message, **fields}
    ).encode()
    headers = {
        "x-amzn-RequestId": uuid.uuid4().hex,
        "Content-Type": "application/x-amz-json-1.0",
        "Content-Length": str(len(body)),
    }
    return AWSResponse("http://injected", 400, headers, _Body(body))


class Injector:
    """Hooks ``before-send`` of one operation: the first ``times`` requests get
    ``action(request)``; later ones go out untouched. Counts every attempt."""

    def __init__(self, client: Any, operation: str, action: Any, times: int = 1) -> None:
        self.action = action
        self.remaining = times
        self.attempts = 0
        self._lock = threading.Lock()
        client.meta.events.register(f"before-send.dynamodb.{operation}", self)

    def __call__(self, request: AWSPreparedRequest, **_: Any) -> AWSResponse | None:
        with self._lock:
            self.attempts += 1
            if self.remaining <= 0:
                return None
            self.remaining -= 1
        result: AWSResponse | None = self.action(request)
        return result


def url_of(request: Any) -> str:
    return str(request.url)


def send_for_real(request: AWSPreparedRequest) -> None:
    """Send ``request`` on a connection of our own and read the whole answer."""
    session: Any = URLLib3Session()
    try:
        response: Any = session.send(request)
        assert response.content is not None
    finally:
        session.close()


def deliver_then_drop(request: AWSPreparedRequest) -> None:
    """Send the request (the write lands), then lose the response."""
    send_for_real(request)
    raise ConnectionClosedError(endpoint_url=url_of(request))


def drop_before_sending(request: AWSPreparedRequest) -> None:
    raise ConnectionClosedError(endpoint_url=url_of(request))


def throttle(_: AWSPreparedRequest) -> AWSResponse:
    return service_error("ThrottlingException", "Rate of requests exceeds the allowed throughput.")


def transaction_conflict(_: AWSPreparedRequest) -> AWSResponse:
    return service_error(
        "TransactionCanceledException",
        "Transaction cancelled, please refer cancellation reasons for specific reasons "
        "[TransactionConflict, None]",
        CancellationReasons=[
            {"Code": "TransactionConflict", "Message": "Transaction is ongoing for the item"},
            {"Code": "None"},
        ],
    )


async def make_backend(endpoint: Any, table: str, **client_options: Any) -> DynamoBackend[Any]:
    """An opened store on ``table`` with a client of its own (made with ``client_options``)."""
    url = endpoint.store_url(table, clock_skew=0, **client_options)
    backend = await flowy.connect(url)
    assert isinstance(backend, DynamoBackend)
    return backend


def client_of(backend: DynamoBackend[Any]) -> Any:
    return backend.table.client


async def assert_single_chain(cp: Any, thread_id: str, head: int) -> None:
    history = await cp.get_history(thread_id, 1000)
    assert [s.revision for s in history] == list(range(head, 0, -1))
    assert len({s.write_id for s in history}) == head


# -- ambiguous outcomes -------------------------------------------------------------------


async def test_lost_response_retried_by_botocore_is_reported_as_success(
    dynamo_endpoint: Any, table_name: str
) -> None:
    """The transaction landed, its response was lost, botocore sent it again and the
    second attempt's condition failed: the save returns its revision, once."""
    backend = await make_backend(dynamo_endpoint, table_name, retry_attempts=3)
    try:
        cp = backend.checkpointer
        tid = f"ambiguous-{uuid.uuid4().hex}"
        assert await cp.save(0, snap(tid)) == 1
        injector = Injector(client_of(backend), "TransactWriteItems", deliver_then_drop)
        second = snap(tid, {"n": 2})
        assert await cp.save(1, second) == 2
        assert injector.attempts == 2  # the lost one and botocore's retry
        loaded, revision = await cp.load(tid)
        assert (revision, loaded.write_id) == (2, second.write_id)
        await assert_single_chain(cp, tid, 2)
    finally:
        await backend.aclose()


async def test_lost_response_without_retries_is_resolved_by_durable_save(
    dynamo_endpoint: Any, table_name: str
) -> None:
    backend = await make_backend(dynamo_endpoint, table_name, retry_attempts=1)
    try:
        cp = backend.checkpointer
        tid = f"unknown-{uuid.uuid4().hex}"
        Injector(client_of(backend), "TransactWriteItems", deliver_then_drop)
        first = snap(tid)
        with pytest.raises(StorageUnavailableError):
            await cp.save(0, first)
        assert (await cp.load(tid))[0].write_id == first.write_id  # it did land

        Injector(client_of(backend), "TransactWriteItems", deliver_then_drop)
        second = snap(tid, {"n": 2})
        assert await confirmed_save(cp, 1, second) == 2
        assert (await cp.load(tid))[0].write_id == second.write_id
        await assert_single_chain(cp, tid, 2)
    finally:
        await backend.aclose()


async def test_request_that_never_arrived_is_applied_once_by_durable_save(
    dynamo_endpoint: Any, table_name: str
) -> None:
    backend = await make_backend(dynamo_endpoint, table_name, retry_attempts=1)
    try:
        cp = backend.checkpointer
        tid = f"not-sent-{uuid.uuid4().hex}"
        injector = Injector(client_of(backend), "TransactWriteItems", drop_before_sending)
        first = snap(tid)
        assert await confirmed_save(cp, 0, first, backoff=0.01) == 1
        assert injector.attempts == 2
        assert (await cp.load(tid))[0].write_id == first.write_id
        await assert_single_chain(cp, tid, 1)
    finally:
        await backend.aclose()


async def test_lost_response_of_save_with_outbox_enqueues_once(
    dynamo_endpoint: Any, table_name: str
) -> None:
    backend = await make_backend(dynamo_endpoint, table_name, retry_attempts=3)
    try:
        cp, outbox, consumer = backend.checkpointer, backend.outbox, backend.consumer
        tid = f"ambiguous-outbox-{uuid.uuid4().hex}"
        Injector(client_of(backend), "TransactWriteItems", deliver_then_drop)

        async def enqueue(tx: object, revision: int) -> None:
            await outbox.enqueue_intent_tx(tx, intent(tid, revision))

        assert await cp.save_with_outbox(0, snap(tid), enqueue) == 1
        messages = await consumer.claim(10, 30)
        assert [m.intent.committed_snapshot_revision for m in messages] == [1]
        await assert_single_chain(cp, tid, 1)
    finally:
        await backend.aclose()


@pytest.mark.parametrize("call", ["acquire", "acquire_and_load"])
async def test_a_lease_whose_answer_was_lost_and_retried_is_taken(
    dynamo_endpoint: Any, table_name: str, call: str
) -> None:
    """The lease's UpdateItem landed, its answer was lost and botocore sent it again: the
    retry's condition fails on the lease the first attempt wrote. That lease is ours
    (same owner, same fencing token), so the take succeeds instead of finding the thread
    busy until the lease runs out."""
    backend = await make_backend(dynamo_endpoint, table_name, retry_attempts=3)
    try:
        tid = f"lease-retried-{uuid.uuid4().hex}"
        await backend.checkpointer.save(0, snap(tid))
        injector = Injector(client_of(backend), "UpdateItem", deliver_then_drop)
        if call == "acquire":
            lease = await backend.leases.acquire(tid, "me", 30.0)
        else:
            lease, (head, revision) = await backend.checkpointer.acquire_and_load(tid, "me", 30)
            assert (head.thread_id, revision) == (tid, 1)
        assert injector.attempts == 2  # the lost one and botocore's retry
        assert await backend.leases.holder(tid) == lease
        assert await backend.leases.release(lease) is None
        assert await backend.leases.holder(tid) is None
    finally:
        await backend.aclose()


async def test_own_write_landed_and_was_overtaken_before_the_retry(
    dynamo_endpoint: Any, table_name: str
) -> None:
    """Our write landed, another writer saved on top, then botocore's retry failed: the
    history entry at our revision carries our write, so the save reports success."""
    backend = await make_backend(dynamo_endpoint, table_name, retry_attempts=3)
    other = await make_backend(dynamo_endpoint, table_name)
    try:
        cp = backend.checkpointer
        tid = f"overtaken-{uuid.uuid4().hex}"
        overtaking = snap(tid, {"n": "other"})

        def deliver_overtake_drop(request: AWSPreparedRequest) -> None:
            send_for_real(request)
            asyncio.run(other.checkpointer.save(1, overtaking))
            raise ConnectionClosedError(endpoint_url=url_of(request))

        Injector(client_of(backend), "TransactWriteItems", deliver_overtake_drop)
        mine = snap(tid)
        assert await cp.save(0, mine) == 1
        history = await cp.get_history(tid)
        assert [(s.revision, s.write_id) for s in history] == [
            (2, overtaking.write_id),
            (1, mine.write_id),
        ]
    finally:
        await backend.aclose()
        await other.aclose()


async def test_real_conflict_after_a_lost_response_is_still_a_conflict(
    dynamo_endpoint: Any, table_name: str
) -> None:
    backend = await make_backend(dynamo_endpoint, table_name, retry_attempts=3)
    try:
        cp = backend.checkpointer
        tid = f"real-conflict-{uuid.uuid4().hex}"
        await cp.save(0, snap(tid))
        await cp.save(1, snap(tid))
        Injector(client_of(backend), "TransactWriteItems", drop_before_sending)
        with pytest.raises(ConcurrencyConflictError) as info:
            await cp.save(1, snap(tid))
        assert (info.value.expected, info.value.actual) == (1, 2)
        await assert_single_chain(cp, tid, 2)
    finally:
        await backend.aclose()


# -- throttling and cancelled transactions ------------------------------------------------


@pytest.mark.parametrize("mode", ["standard", "adaptive"])
async def test_throttled_save_is_retried_with_backoff(
    dynamo_endpoint: Any, table_name: str, mode: str
) -> None:
    backend = await make_backend(dynamo_endpoint, table_name, retry_mode=mode, retry_attempts=4)
    try:
        cp = backend.checkpointer
        tid = f"throttled-{mode}-{uuid.uuid4().hex}"
        injector = Injector(client_of(backend), "TransactWriteItems", throttle)
        assert await cp.save(0, snap(tid)) == 1
        assert injector.attempts == 2
        await assert_single_chain(cp, tid, 1)
    finally:
        await backend.aclose()


async def test_throttling_that_outlasts_the_retries_is_unavailable(
    dynamo_endpoint: Any, table_name: str
) -> None:
    backend = await make_backend(dynamo_endpoint, table_name, retry_attempts=2)
    try:
        cp = backend.checkpointer
        tid = f"throttled-out-{uuid.uuid4().hex}"
        Injector(client_of(backend), "TransactWriteItems", throttle, times=10)
        with pytest.raises(StorageUnavailableError, match="ThrottlingException"):
            await cp.save(0, snap(tid))
        with pytest.raises(ThreadNotFoundError):
            await cp.load(tid)
    finally:
        await backend.aclose()


async def test_transaction_conflict_is_sent_again(dynamo_endpoint: Any, table_name: str) -> None:
    """DynamoDB cancels a transaction that collides with another one in flight; nothing
    was written, so the checkpointer sends it again itself."""
    backend = await make_backend(dynamo_endpoint, table_name)
    try:
        cp = backend.checkpointer
        tid = f"tx-conflict-{uuid.uuid4().hex}"
        injector = Injector(client_of(backend), "TransactWriteItems", transaction_conflict, 2)
        assert await cp.save(0, snap(tid)) == 1
        assert injector.attempts == 3
        await assert_single_chain(cp, tid, 1)
        Injector(client_of(backend), "TransactWriteItems", transaction_conflict, 10)
        with pytest.raises(StorageUnavailableError, match="cancelled"):
            await cp.save(1, snap(tid))
        assert (await cp.load(tid))[1] == 1
    finally:
        await backend.aclose()


# -- a signal's transaction ---------------------------------------------------------------


def signal(thread_id: str, signal_id: str, payload: Any = None) -> Signal:
    return Signal(thread_id, "approval", payload, signal_id, sent_at=1_700_000_000.25)


async def test_a_signal_whose_answer_was_lost_is_stored_once(
    dynamo_endpoint: Any, table_name: str
) -> None:
    """botocore sends the transaction again after its answer was lost; the first copy
    landed, so the second finds the signal id taken: the signal as stored, once."""
    backend = await make_backend(dynamo_endpoint, table_name)
    try:
        cp, tid = backend.checkpointer, f"lost-signal-{uuid.uuid4().hex}"
        injector = Injector(client_of(backend), "TransactWriteItems", deliver_then_drop)
        stored = await cp.append_signal(signal(tid, "once", {"x": 1}))
        assert injector.attempts == 2
        assert (stored.seq, stored.payload) == (1, {"x": 1})
        assert await cp.signals(tid) == [stored]
        assert (await cp.append_signal(signal(tid, "next"))).seq == 2
    finally:
        await backend.aclose()


async def test_a_signal_cancelled_by_a_concurrent_transaction_is_sent_again(
    dynamo_endpoint: Any, table_name: str
) -> None:
    backend = await make_backend(dynamo_endpoint, table_name)
    try:
        cp, tid = backend.checkpointer, f"signal-conflict-{uuid.uuid4().hex}"
        injector = Injector(client_of(backend), "TransactWriteItems", transaction_conflict, 2)
        assert (await cp.append_signal(signal(tid, "s"))).seq == 1
        assert injector.attempts == 3
        assert len(await cp.signals(tid)) == 1
    finally:
        await backend.aclose()


async def test_durable_time_throttled_past_the_retries_is_unavailable(
    dynamo_endpoint: Any, table_name: str
) -> None:
    backend = await make_backend(dynamo_endpoint, table_name, retry_attempts=2)
    try:
        cp, tid = backend.checkpointer, f"throttled-signal-{uuid.uuid4().hex}"
        client = client_of(backend)
        Injector(client, "TransactWriteItems", throttle, times=10)
        with pytest.raises(StorageUnavailableError, match="ThrottlingException"):
            await cp.append_signal(signal(tid, "s"))
        Injector(client, "PutItem", throttle, times=10)
        with pytest.raises(StorageUnavailableError, match="ThrottlingException"):
            await cp.put_activity(tid, ActivityRecord("k", ActivityStatus.STARTED))
        Injector(client, "Query", throttle, times=10)
        with pytest.raises(StorageUnavailableError, match="ThrottlingException"):
            await cp.timers()
    finally:
        await backend.aclose()


# -- broken connections ---------------------------------------------------------------------


async def test_unreachable_endpoint_is_unavailable(dynamo_endpoint: Any, table_name: str) -> None:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = make_client(
        region="us-east-1", endpoint_url=f"http://127.0.0.1:{port}", retry_attempts=1
    )
    backend: DynamoBackend[Any] = DynamoBackend[Any].from_client(client, table_name)
    with pytest.raises(StorageUnavailableError, match="connection"):
        await backend.open()  # opening checks the table
    backend = DynamoBackend[Any].from_client(client, table_name)  # not opened: the calls themselves
    try:
        with pytest.raises(StorageUnavailableError, match="connection"):
            await backend.checkpointer.load("t")
        with pytest.raises(StorageUnavailableError):
            await backend.checkpointer.save(0, snap("t"))
    finally:
        await backend.aclose()
        client.close()


async def test_read_timeout_is_unavailable(dynamo_endpoint: Any, table_name: str) -> None:
    backend = await make_backend(dynamo_endpoint, table_name, retry_attempts=1)
    try:

        def time_out(request: AWSPreparedRequest) -> None:
            raise ReadTimeoutError(endpoint_url=url_of(request))

        Injector(client_of(backend), "GetItem", time_out)
        with pytest.raises(StorageUnavailableError, match="timed out"):
            await backend.checkpointer.load("t")
        with pytest.raises(ThreadNotFoundError):  # the next call goes through
            await backend.checkpointer.load("t")
    finally:
        await backend.aclose()


# -- the executor ---------------------------------------------------------------------------


async def test_calls_run_off_the_loop_in_a_bounded_pool(
    dynamo_endpoint: Any, table_name: str
) -> None:
    backend = await make_backend(dynamo_endpoint, table_name, max_workers=2)
    in_flight = 0
    most = 0
    lock = threading.Lock()

    def slow(_: AWSPreparedRequest) -> None:
        nonlocal in_flight, most
        with lock:
            in_flight += 1
            most = max(most, in_flight)
        time.sleep(0.15)
        with lock:
            in_flight -= 1

    Injector(client_of(backend), "GetItem", slow, times=100)
    ticks = 0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0.01)

    try:
        tick_task = asyncio.create_task(ticker())
        results = await asyncio.gather(
            *(backend.checkpointer.load(f"t{i}") for i in range(6)), return_exceptions=True
        )
        stop.set()
        await tick_task
        assert all(isinstance(r, ThreadNotFoundError) for r in results)
        assert most == 2
        assert ticks >= 20  # ~0.45 s of blocking calls; the loop kept turning
    finally:
        await backend.aclose()


# -- oversized state ------------------------------------------------------------------------


@pytest.fixture
async def backend(dynamo_endpoint: Any, table_name: str) -> Any:
    opened = await make_backend(dynamo_endpoint, table_name)
    yield opened
    await opened.aclose()


async def test_oversized_state_is_refused_before_anything_is_written(
    backend: DynamoBackend[Any],
) -> None:
    cp = backend.checkpointer
    tid = f"big-{uuid.uuid4().hex}"
    await cp.save(0, snap(tid, {"small": True}))
    calls: list[str] = []

    def record(model: Any, **_: Any) -> None:
        calls.append(str(model.name))

    client_of(backend).meta.events.register("before-call.dynamodb", record)
    with pytest.raises(SnapshotTooLargeError) as info:
        await cp.save(1, snap(tid, {"blob": "x" * 500_000}))
    err = info.value
    assert err.limit == MAX_ITEM_BYTES
    assert err.size > 500_000
    assert str(err.size) in str(err) and str(err.limit) in str(err)
    assert calls == []  # refused before any request

    async def enqueue(tx: object, revision: int) -> None:
        await backend.outbox.enqueue_intent_tx(tx, intent(tid, revision))

    with pytest.raises(SnapshotTooLargeError):
        await cp.save_with_outbox(1, snap(tid, {"blob": "y" * 450_000}), enqueue)
    assert calls == []
    loaded, revision = await cp.load(tid)
    assert (revision, loaded.state) == (1, {"small": True})
    assert [s.revision for s in await cp.get_history(tid)] == [1]
    assert await backend.consumer.claim(10, 30) == []


async def test_long_thread_id_counts_toward_the_item_size(backend: DynamoBackend[Any]) -> None:
    """The id is stored in full on both items: a state that fits alone does not fit
    next to a 16 KiB id."""
    cp = backend.checkpointer
    tid = "é" * 8192
    with pytest.raises(SnapshotTooLargeError):
        await cp.save(0, snap(tid, {"blob": "x" * (MAX_ITEM_BYTES - 20_000)}))
    with pytest.raises(ThreadNotFoundError):
        await cp.load(tid)


async def test_size_refused_by_the_service_is_too_large(backend: DynamoBackend[Any]) -> None:
    """With the local check disabled, the service's own refusal is translated too."""
    backend.table.max_item_bytes = 10**8
    cp = backend.checkpointer
    tid = f"big-remote-{uuid.uuid4().hex}"
    with pytest.raises(SnapshotTooLargeError):
        await cp.save(0, snap(tid, {"blob": "z" * 600_000}))
    with pytest.raises(ThreadNotFoundError):
        await cp.load(tid)
    assert await cp.get_history(tid) == []


# -- two OS processes -----------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["occ", "lease"])
async def test_two_processes_racing_keep_one_history_chain(
    dynamo_endpoint: Any, table_name: str, mode: str
) -> None:
    saves = 25
    tid = f"race-{mode}-{uuid.uuid4().hex}"
    start_at = time.time() + 3.0  # both processes are importing by then
    async with flowy.connect(dynamo_endpoint.store_url(table_name)):
        pass  # the table exists before the racers start
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            str(WORKER),
            dynamo_endpoint.store_url(table_name, clock_skew=0, max_workers=2),
            tid,
            str(saves),
            mode,
            str(start_at),
            name,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for name in ("proc-a", "proc-b")
    ]
    outputs = await asyncio.gather(*(p.communicate() for p in procs))
    summaries: list[dict[str, Any]] = []
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err.decode()
        summaries.append(json.loads(out.decode().strip().splitlines()[-1]))
    assert [s["saves"] for s in summaries] == [saves, saves]
    # They really raced: someone lost a revision or waited for a lease.
    assert sum(s["conflicts"] + s["busy"] for s in summaries) > 0, summaries

    async with flowy.connect(dynamo_endpoint.store_url(table_name)) as backend:
        cp = backend.checkpointer
        head, revision = await cp.load(tid)
        assert revision == 2 * saves
        assert head.state["count"] == 2 * saves  # no lost update
        history = await cp.get_history(tid, 1000)
        assert [s.revision for s in history] == list(range(2 * saves, 0, -1))
        assert [s.state["count"] for s in history] == list(range(2 * saves, 0, -1))
        assert {s.state["by"] for s in history} == {"proc-a", "proc-b"}
