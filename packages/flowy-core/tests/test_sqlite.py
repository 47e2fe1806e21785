"""Tests of the embedded SQLite store beyond the conformance suite: the file (WAL,
schema version, setup, foreign files), reopening, closing, locking across connections
and OS processes, the transaction handle, and the event loop staying free.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import flowy
from flowy.errors import (
    ConcurrencyConflictError,
    SchemaVersionError,
    SnapshotEnvelopeInvalidError,
    SnapshotTooLargeError,
    SQLiteFileError,
    StorageError,
    StorageUnavailableError,
    ThreadNotFoundError,
)
from flowy.memory import MemoryLeaseManager
from flowy.sqlite import SQLiteBackend, SQLiteDatabase
from flowy.sqlite import _db as sqlite_db
from flowy.storage import (
    HandoffIntent,
    HandoffStatus,
    OutboxTransaction,
    ResumeToken,
    Route,
    Snapshot,
    recent_key,
)
from flowy.storage.dialect import OutboxRow, new_write_id
from flowy.testing import corrupt_head

pytestmark = pytest.mark.anyio


def snap(thread_id: str, state: Any = None, pointer: str = "start") -> Snapshot[Any]:
    return Snapshot(
        thread_id=thread_id,
        state={"n": 0} if state is None else state,
        execution_pointer=pointer,
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
        reason="handoff_requested",
        execution_pointer="worker",
        created_at=1_700_000_000.0,
    )


def raw(path: Path) -> sqlite3.Connection:
    """A plain sqlite3 connection in autocommit mode, standing for another program."""
    return sqlite3.connect(path, isolation_level=None)


def pragma(path: Path, name: str) -> Any:
    conn = raw(path)
    try:
        return conn.execute(f"PRAGMA {name}").fetchone()[0]
    finally:
        conn.close()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "flowy.db"


@pytest.fixture
async def backend(db_path: Path) -> Any:
    async with SQLiteBackend[Any](db_path) as opened:
        yield opened


# -- the file -------------------------------------------------------------------------


async def test_new_file_gets_wal_and_the_schema(db_path: Path) -> None:
    async with SQLiteBackend[Any](db_path) as backend:
        await backend.checkpointer.save(0, snap("t"))
    assert pragma(db_path, "journal_mode") == "wal"
    assert pragma(db_path, "application_id") == sqlite_db.APPLICATION_ID
    assert pragma(db_path, "user_version") == sqlite_db.SCHEMA_VERSION
    conn = raw(db_path)
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    conn.close()
    assert {"flowy_threads", "flowy_history", "flowy_leases", "flowy_outbox"} <= tables


async def test_reopened_file_keeps_everything(db_path: Path) -> None:
    first = snap("t", {"step": 1})
    second = snap("t", {"step": 2}, pointer="next")
    async with SQLiteBackend[Any](db_path) as backend:
        await backend.checkpointer.save(0, first)
        await backend.checkpointer.save(1, second)
        lease = await backend.leases.acquire("t", "a", 30)
        await backend.leases.release(lease)
        await backend.outbox.enqueue_intent(intent("t", 2))
    async with SQLiteBackend[Any](db_path) as backend:
        assert await backend.checkpointer.load("t") == (second.at_revision(2), 2)
        history = await backend.checkpointer.get_history("t")
        assert [s.write_id for s in history] == [second.write_id, first.write_id]
        # Tokens never go back, across processes and with the released record gone.
        assert (await backend.leases.acquire("t", "b", 30)).fencing_token > lease.fencing_token
        [message] = await backend.consumer.claim(10, 30)
        assert message.intent == intent("t", 2)


async def test_newer_schema_is_refused(db_path: Path) -> None:
    async with SQLiteBackend[Any](db_path) as backend:
        await backend.checkpointer.save(0, snap("t"))
    conn = raw(db_path)
    conn.execute(f"PRAGMA user_version = {sqlite_db.SCHEMA_VERSION + 1}")
    conn.close()
    backend = SQLiteBackend[Any](db_path)
    try:
        with pytest.raises(SchemaVersionError, match="newer") as info:
            await backend.checkpointer.load("t")
        assert str(db_path) in str(info.value)
        assert "upgrade flowy-core" in str(info.value)
        with pytest.raises(SchemaVersionError, match="newer"):
            await backend.setup()
    finally:
        await backend.aclose()
    with pytest.raises(SchemaVersionError):
        async with SQLiteBackend[Any](db_path):
            pass


async def test_older_schema_needs_an_explicit_setup(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    saved = snap("t")
    async with SQLiteBackend[Any](db_path) as backend:
        await backend.checkpointer.save(0, saved)
    old_version = sqlite_db.SCHEMA_VERSION
    # This code now knows one more schema step than the file has.
    monkeypatch.setattr(
        sqlite_db,
        "MIGRATIONS",
        [
            *sqlite_db.MIGRATIONS,
            ("CREATE INDEX flowy_history_by_revision ON flowy_history (revision)",),
        ],
    )
    backend = SQLiteBackend[Any](db_path)
    try:
        with pytest.raises(SchemaVersionError, match=r"older .*setup\(\)") as info:
            await backend.checkpointer.load("t")
        assert str(db_path) in str(info.value)
        assert pragma(db_path, "user_version") == old_version  # nothing changed
        assert await backend.setup() == old_version + 1
        assert await backend.setup() == old_version + 1  # idempotent
        assert await backend.checkpointer.load("t") == (saved.at_revision(1), 1)
    finally:
        await backend.aclose()
    assert pragma(db_path, "user_version") == old_version + 1
    conn = raw(db_path)
    names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    conn.close()
    assert "flowy_history_by_revision" in names
    # Code that stops at the old version now finds the file newer than itself.
    monkeypatch.undo()
    with pytest.raises(SchemaVersionError, match="newer"):
        async with SQLiteBackend[Any](db_path):
            pass


async def test_a_file_of_schema_3_upgrades_to_queues(db_path: Path) -> None:
    # The file as the code before queues wrote it: a message in flight, one waiting and
    # a dead letter.
    conn = raw(db_path)
    for step in sqlite_db.MIGRATIONS[:3]:
        for statement in step:
            conn.execute(statement)
    conn.execute(f"PRAGMA application_id = {sqlite_db.APPLICATION_ID}")
    conn.execute("PRAGMA user_version = 3")
    now = time.time()
    conn.executemany(
        "INSERT INTO flowy_outbox (id, thread_id, committed_revision, payload, attempts, "
        "visible_at, dead, error, created_at) VALUES (?, 'old', ?, ?, ?, ?, ?, ?, ?)",
        [
            (1, 1, OutboxRow.of(intent("old", 1)).payload, 1, now + 600, 0, "", now),
            (2, 2, OutboxRow.of(intent("old", 2)).payload, 1, 0, 1, "boom", now),
            (3, 3, OutboxRow.of(intent("old", 3)).payload, 0, 0, 0, "", now),
        ],
    )
    conn.close()
    assert pragma(db_path, "user_version") == 3
    backend = SQLiteBackend[Any](db_path)
    try:
        with pytest.raises(SchemaVersionError, match=r"older .*setup\(\)"):
            await backend.consumer.claim(1, 60)
        assert await backend.setup() == sqlite_db.SCHEMA_VERSION
        # The old messages are in the default queue; the hidden one was claimed
        # before the upgrade, so it holds no slot.
        [stats] = await backend.queues.list()
        assert (stats.queue, stats.in_flight, stats.pending) == ("default", 0, 2)
        [waiting] = await backend.consumer.claim(5, 60)
        assert waiting.intent == intent("old", 3)
        assert waiting.attempts == 1
        await backend.consumer.retry_dead_letter("2")
        [back] = await backend.consumer.claim(5, 60)
        assert (back.message_id, back.intent) == ("2", intent("old", 2))
        routed = dataclasses.replace(intent("new", 1), route=Route("billing", "acme", 2))
        await backend.outbox.enqueue_intent(routed)
        assert await backend.consumer.claim(5, 60) == []
        [message] = await backend.consumer.claim(5, 60, queue="billing")
        assert message.intent == routed
    finally:
        await backend.aclose()
    conn = raw(db_path)
    indexes = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    conn.close()
    assert "flowy_outbox_ready" not in indexes
    assert {"flowy_outbox_order", "flowy_outbox_visible", "flowy_outbox_flight"} <= indexes


async def test_a_file_of_schema_4_upgrades_to_the_recency_index(db_path: Path) -> None:
    # Heads saved by the code before the recency index: setup() fills it from updated_at.
    conn = raw(db_path)
    for step in sqlite_db.MIGRATIONS[:4]:
        for statement in step:
            conn.execute(statement)
    conn.execute(f"PRAGMA application_id = {sqlite_db.APPLICATION_ID}")
    conn.execute("PRAGMA user_version = 4")
    conn.executemany(
        "INSERT INTO flowy_threads (thread_id, revision, pointer, status, reason, "
        "handoff_status, updated_at, record) VALUES (?, 1, 'n', 'running', '', 'none', ?, x'00')",
        [("a", 1_700_000_005.5), ("b", 1_700_000_009.25), ("c", 1_700_000_005.75)],
    )
    conn.close()
    backend = SQLiteBackend[Any](db_path)
    try:
        assert await backend.setup() == sqlite_db.SCHEMA_VERSION
        recent = await backend.checkpointer.recent_threads(limit=10)
        assert [(s.thread_id, recent_key(s)[0]) for s in recent] == [
            ("b", 1_700_000_009),
            ("c", 1_700_000_005),
            ("a", 1_700_000_005),
        ]
    finally:
        await backend.aclose()
    conn = raw(db_path)
    plan = " ".join(
        str(row[3])
        for row in conn.execute(
            "EXPLAIN QUERY PLAN SELECT thread_id FROM flowy_threads "
            "WHERE (recent_second, thread_id) < (?, ?) "
            "ORDER BY recent_second DESC, thread_id DESC LIMIT 5",
            (1_700_000_009, "b"),
        )
    )
    conn.close()
    assert "flowy_threads_recent" in plan and "TEMP B-TREE" not in plan, plan


async def test_the_recency_index_is_written_only_in_a_new_second(db_path: Path) -> None:
    # SQLite rewrites an index entry whenever its column is assigned: a save in the same
    # second as the head's leaves the column out (counted by a trigger on it).
    async with SQLiteBackend[Any](db_path) as backend:
        await backend.setup()
        conn = raw(db_path)
        conn.execute("CREATE TABLE seen (n INTEGER)")
        conn.execute(
            "CREATE TRIGGER recent_written AFTER UPDATE OF recent_second ON flowy_threads "
            "BEGIN INSERT INTO seen VALUES (1); END"
        )
        conn.commit()
        cp = backend.checkpointer
        at = 1_700_000_000.0
        for revision, offset in enumerate((0.1, 0.5, 0.9, 1.2, 1.3, 3.0)):
            stamped = dataclasses.replace(snap("t"), updated_at=at + offset)
            assert await cp.save(revision, stamped) == revision + 1
        writes = conn.execute("SELECT count(*) FROM seen").fetchone()[0]
        conn.close()
        assert writes == 2  # into second +1 and second +3; the first save inserted
        [head] = await cp.recent_threads(limit=1)
        assert recent_key(head) == (1_700_000_003, "t")


async def test_many_connections_opening_a_new_file_at_once(db_path: Path) -> None:
    backends = [SQLiteBackend[Any](db_path) for _ in range(6)]
    try:
        saves = [b.checkpointer.save(0, snap(f"t{i}")) for i, b in enumerate(backends)]
        assert await asyncio.gather(*saves) == [1] * len(backends)
        listed = await backends[0].checkpointer.list_threads()
        assert sorted(t.thread_id for t in listed) == [f"t{i}" for i in range(len(backends))]
    finally:
        for b in backends:
            await b.aclose()
    assert pragma(db_path, "journal_mode") == "wal"


async def test_setup_creates_a_new_file(db_path: Path) -> None:
    backend = SQLiteBackend[Any](db_path)
    try:
        assert await backend.setup() == sqlite_db.SCHEMA_VERSION
        assert await backend.checkpointer.save(0, snap("t")) == 1
        with pytest.warns(DeprecationWarning, match=r"migrate\(\) is deprecated; use setup"):
            assert await backend.migrate() == sqlite_db.SCHEMA_VERSION
        with pytest.warns(DeprecationWarning, match=r"migrate\(\) is deprecated; use setup"):
            assert await backend.database.migrate() == sqlite_db.SCHEMA_VERSION
    finally:
        await backend.aclose()


async def test_foreign_sqlite_database_is_refused(db_path: Path) -> None:
    conn = raw(db_path)
    conn.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY)")
    conn.close()
    backend = SQLiteBackend[Any](db_path)
    try:
        with pytest.raises(SQLiteFileError, match="not a flowy one") as info:
            await backend.checkpointer.load("t")
        assert info.value.path == str(db_path)
        assert isinstance(info.value, StorageError)
        with pytest.raises(SQLiteFileError):
            await backend.setup()
    finally:
        await backend.aclose()
    # Untouched: not marked, not switched to WAL.
    assert pragma(db_path, "application_id") == 0
    assert pragma(db_path, "journal_mode") == "delete"


async def test_file_that_is_not_sqlite_is_refused(db_path: Path) -> None:
    await asyncio.to_thread(db_path.write_bytes, b"these are not the bytes of a database\n" * 99)
    backend = SQLiteBackend[Any](db_path)
    try:
        with pytest.raises(SQLiteFileError, match="not a flowy database") as info:
            await backend.checkpointer.save(0, snap("t"))
        assert info.value.path == str(db_path)
    finally:
        await backend.aclose()


async def test_unopenable_path_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "no-such-directory" / "flowy.db"
    with pytest.raises(SQLiteFileError, match="cannot open") as info:
        async with SQLiteBackend[Any](path):
            pass
    assert info.value.path == str(path)


async def test_in_memory_database(tmp_path: Path) -> None:
    async with SQLiteBackend[Any](":memory:") as backend:
        assert await backend.checkpointer.save(0, snap("t")) == 1
        assert (await backend.checkpointer.load("t"))[1] == 1
        assert backend.checkpointer.fences(backend.leases)
        async with SQLiteBackend[Any](":memory:") as other:
            assert not backend.checkpointer.fences(other.leases)


async def test_lease_records_of_released_and_deleted_threads_go_away(db_path: Path) -> None:
    def lease_rows() -> list[Any]:
        conn = raw(db_path)
        try:
            return conn.execute("SELECT thread_id FROM flowy_leases ORDER BY 1").fetchall()
        finally:
            conn.close()

    now = [1_000_000.0]
    async with SQLiteBackend[Any](db_path, clock=lambda: now[0]) as backend:
        first = await backend.leases.acquire("released", "a", 30)
        await backend.checkpointer.save(0, snap("released"), lease=first)
        await backend.leases.release(first)
        held = await backend.leases.acquire("deleted", "a", 5)
        await backend.checkpointer.save(0, snap("deleted"), lease=held)
        crashed = await backend.leases.acquire("crashed", "a", 5)
        assert lease_rows() == [("crashed",), ("deleted",)]  # released: gone at once
        now[0] += 10  # both expired
        await backend.checkpointer.delete("deleted")
        assert lease_rows() == [("crashed",)]  # deleted: gone with its thread
        now[0] += 3600  # an hour after it expired, the crashed owner's record is swept
        again = await backend.leases.acquire("released", "b", 30)
        assert lease_rows() == [("released",)]
        assert again.fencing_token > first.fencing_token
        fresh = await backend.leases.acquire("crashed", "b", 30)
        assert fresh.fencing_token > crashed.fencing_token


# -- corruption, columns, sizes ----------------------------------------------------------


async def test_corrupt_hits_load_and_history_but_not_listing(backend: SQLiteBackend[Any]) -> None:
    cp = backend.checkpointer
    await cp.save(0, snap("bad"))
    await cp.save(0, snap("good"))
    await corrupt_head(backend, "bad")
    with pytest.raises(SnapshotEnvelopeInvalidError):
        await cp.load("bad")
    with pytest.raises(SnapshotEnvelopeInvalidError):
        await cp.get_history("bad")
    assert (await cp.load("good"))[1] == 1
    # list_threads reads columns only, so a damaged record does not hide its thread.
    assert sorted(t.thread_id for t in await cp.list_threads()) == ["bad", "good"]
    with pytest.raises(ThreadNotFoundError):
        await corrupt_head(backend, "missing")


async def test_record_over_the_length_limit_is_too_large(backend: SQLiteBackend[Any]) -> None:
    await backend.database.run(
        lambda conn: conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 2000), "lower the limit"
    )
    assert await backend.checkpointer.save(0, snap("t", {"small": 1})) == 1
    with pytest.raises(SnapshotTooLargeError) as info:
        await backend.checkpointer.save(1, snap("t", {"big": "x" * 5000}))
    assert info.value.size > info.value.limit == 2000
    assert (await backend.checkpointer.load("t"))[1] == 1


# -- locking across connections ----------------------------------------------------------


async def test_locked_file_is_unavailable_and_writes_nothing(db_path: Path) -> None:
    async with SQLiteBackend[Any](db_path, busy_timeout=0.2) as backend:
        await backend.checkpointer.save(0, snap("t"))
        other = raw(db_path)
        other.execute("BEGIN IMMEDIATE")  # another program holds the write lock
        try:
            with pytest.raises(StorageUnavailableError, match="locked") as info:
                await backend.checkpointer.save(1, snap("t"))
            assert str(db_path) in str(info.value)
            with pytest.raises(StorageUnavailableError):
                await backend.leases.acquire("t", "a", 10)
            # WAL: reads go on while another connection writes.
            assert (await backend.checkpointer.load("t"))[1] == 1
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert await backend.checkpointer.save(1, snap("t")) == 2


async def test_event_loop_runs_while_a_save_waits_for_the_lock(db_path: Path) -> None:
    async with SQLiteBackend[Any](db_path, busy_timeout=5.0) as backend:
        await backend.open()
        other = raw(db_path)
        other.execute("BEGIN IMMEDIATE")
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticking = asyncio.create_task(ticker())
        saving = asyncio.create_task(backend.checkpointer.save(0, snap("t")))
        await asyncio.sleep(0.3)
        assert not saving.done()
        assert ticks >= 10, f"the event loop ticked only {ticks} times in 0.3s"
        other.execute("COMMIT")
        other.close()
        assert await saving == 1
        ticking.cancel()
        with pytest.raises(asyncio.CancelledError):
            await ticking


async def test_backends_on_one_file_fence_each_other(db_path: Path) -> None:
    async with (
        SQLiteBackend[Any](db_path) as backend,
        SQLiteBackend[Any](db_path) as peer,
        SQLiteBackend[Any](db_path.with_name("other.db")) as elsewhere,
    ):
        cp = backend.checkpointer
        assert cp.fences(peer.leases)
        assert not cp.fences(elsewhere.leases)
        assert not cp.fences(MemoryLeaseManager())
        await cp.save(0, snap("t"))
        lease = await peer.leases.acquire("t", "a", 30)
        with pytest.raises(flowy.ThreadLeaseBusyError, match="leased by 'a'"):
            await cp.save(1, snap("t"))
        assert await cp.save(1, snap("t"), lease=lease) == 2


CHILD = r"""
import asyncio, json, sys
from flowy.sqlite import SQLiteBackend
from flowy.storage import Snapshot, new_write_id
from flowy import ConcurrencyConflictError, ThreadLeaseBusyError, ThreadNotFoundError

async def head(cp, thread_id):
    try:
        return (await cp.load(thread_id))[1]
    except ThreadNotFoundError:
        return 0

async def main(path, name, wins_wanted):
    async with SQLiteBackend(path, busy_timeout=30) as backend:
        cp, leases = backend.checkpointer, backend.leases
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        races, lost = [], 0
        while len(races) < wins_wanted:
            write_id = new_write_id()
            expected = await head(cp, "race")
            try:
                got = await cp.save(
                    expected, Snapshot("race", {"by": name}, "n", write_id=write_id)
                )
            except ConcurrencyConflictError:
                lost += 1
                continue
            races.append([got, write_id])
        leased, busy = [], 0
        while len(leased) < wins_wanted:
            try:
                lease = await leases.acquire("leased", name, 30)
            except ThreadLeaseBusyError:
                busy += 1
                await asyncio.sleep(0.001)
                continue
            try:
                write_id = new_write_id()
                expected = await head(cp, "leased")
                # Under the lease no other process may write: no conflict is possible.
                got = await cp.save(
                    expected, Snapshot("leased", {"by": name}, "n", write_id=write_id), lease=lease
                )
                leased.append([lease.fencing_token, got, write_id])
            finally:
                await leases.release(lease)
        print(json.dumps({"races": races, "leased": leased, "lost": lost, "busy": busy}))

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


async def test_processes_racing_on_one_file_keep_one_history(db_path: Path) -> None:
    processes, wins_each = 3, 20
    async with SQLiteBackend[Any](db_path) as backend:
        await backend.open()  # the schema exists before the children start
    children = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            CHILD,
            str(db_path),
            f"p{i}",
            str(wins_each),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for i in range(processes)
    ]
    try:
        for child in children:
            assert child.stdout is not None
            line = await asyncio.wait_for(child.stdout.readline(), 60)
            assert line == b"ready\n", line
        for child in children:  # start them together
            assert child.stdin is not None
            child.stdin.write(b"go\n")
            await child.stdin.drain()
        outputs = [await asyncio.wait_for(child.communicate(), 120) for child in children]
    finally:
        for child in children:
            if child.returncode is None:
                child.kill()
                await child.wait()
    reports: list[dict[str, Any]] = []
    for child, (out, err) in zip(children, outputs, strict=True):
        assert child.returncode == 0, err.decode()
        reports.append(json.loads(out))
    total = processes * wins_each
    async with SQLiteBackend[Any](db_path) as backend:
        cp = backend.checkpointer
        for thread_id, key in (("race", "races"), ("leased", "leased")):
            won = {rev: wid for r in reports for *_, rev, wid in r[key]}
            # Exactly one winner per revision, and the revisions form one chain.
            assert sum(len(r[key]) for r in reports) == total == len(won)
            assert sorted(won) == list(range(1, total + 1))
            history = await cp.get_history(thread_id, limit=total + 10)
            assert [s.revision for s in history] == list(range(total, 0, -1))
            assert {s.revision: s.write_id for s in history} == won
        # Fencing tokens: one per lease, growing with the revisions they wrote.
        by_revision = sorted((rev, token) for r in reports for token, rev, _ in r["leased"])
        tokens = [token for _, token in by_revision]
        assert len(set(tokens)) == total and tokens == sorted(tokens)


# -- the transaction handle -------------------------------------------------------------


async def test_foreign_transaction_handles_are_refused(db_path: Path) -> None:
    async with (
        SQLiteBackend[Any](db_path) as backend,
        SQLiteBackend[Any](db_path.with_name("other.db")) as elsewhere,
    ):
        with pytest.raises(TypeError, match="save_with_outbox"):
            await backend.outbox.enqueue_intent_tx(object(), intent("t", 1))

        async def via_other_file(tx: object, revision: int) -> None:
            await elsewhere.outbox.enqueue_intent_tx(tx, intent("t", revision))

        with pytest.raises(ValueError, match="not in one store"):
            await backend.checkpointer.save_with_outbox(0, snap("t"), via_other_file)
        kept: list[object] = []

        async def keep(tx: object, revision: int) -> None:
            assert isinstance(tx, OutboxTransaction) and tx.revision == revision
            kept.append(tx)

        assert await backend.checkpointer.save_with_outbox(0, snap("t"), keep) == 1
        with pytest.raises(RuntimeError, match="transaction is over"):
            await backend.outbox.enqueue_intent_tx(kept[0], intent("t", 1))
        assert await backend.consumer.claim(10, 30) == []


async def test_a_store_without_native_actions_refuses_add_action(
    backend: SQLiteBackend[Any],
) -> None:
    cp = backend.checkpointer

    async def add(tx: object, revision: int) -> None:
        with pytest.raises(NotImplementedError, match="takes no actions of the application"):
            cp.add_action(tx, {"Put": {}})
        await backend.outbox.enqueue_intent_tx(tx, intent("t", revision))

    with pytest.raises(RuntimeError, match="enqueue callback of save_with_outbox"):
        cp.add_action(object(), {"Put": {}})
    assert await cp.save_with_outbox(0, snap("t"), add) == 1
    assert len(await backend.consumer.claim(10, 30)) == 1


async def test_a_failing_callback_writes_nothing(backend: SQLiteBackend[Any]) -> None:
    async def enqueue_then_fail(tx: object, revision: int) -> None:
        await backend.outbox.enqueue_intent_tx(tx, intent("t", revision))
        raise LookupError("the application failed after enqueueing")

    with pytest.raises(LookupError):
        await backend.checkpointer.save_with_outbox(0, snap("t"), enqueue_then_fail)
    with pytest.raises(ThreadNotFoundError):
        await backend.checkpointer.load("t")
    assert await backend.consumer.pending_count() == 0


async def test_cancelled_save_with_outbox_writes_nothing(db_path: Path) -> None:
    async with (
        SQLiteBackend[Any](db_path) as backend,
        SQLiteBackend[Any](db_path, busy_timeout=1.0) as peer,
    ):
        inside = asyncio.Event()

        async def hang(tx: object, revision: int) -> None:
            await backend.outbox.enqueue_intent_tx(tx, intent("t", revision))
            inside.set()
            await asyncio.Event().wait()

        saving = asyncio.create_task(backend.checkpointer.save_with_outbox(0, snap("t"), hang))
        await inside.wait()
        saving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await saving
        # Nothing landed, and the write lock is free for this connection and another.
        with pytest.raises(ThreadNotFoundError):
            await backend.checkpointer.load("t")
        assert await backend.consumer.pending_count() == 0
        assert await peer.checkpointer.save(0, snap("t")) == 1
        assert await backend.checkpointer.save(1, snap("t")) == 2


# -- outbox -----------------------------------------------------------------------------


async def test_one_message_per_thread_and_committed_revision(db_path: Path) -> None:
    async with SQLiteBackend[Any](db_path, max_attempts=1) as backend:
        outbox, consumer = backend.outbox, backend.consumer
        await outbox.enqueue_intent(intent("t", 1))
        await outbox.enqueue_intent(intent("t", 1))
        await outbox.enqueue_intent(intent("t", 2))
        assert await consumer.pending_count() == 2
        first, second = await consumer.claim(10, 30)
        await consumer.release(first, error="boom")  # max_attempts=1: dead at once
        [dead] = await consumer.dead_letters()
        assert dead.message_id == first.message_id and dead.error == "boom"
        # Enqueueing the same intent again revives its dead letter.
        await outbox.enqueue_intent(intent("t", 1))
        assert await consumer.dead_letters() == []
        [again] = await consumer.claim(10, 30)
        assert (again.message_id, again.attempts) == (first.message_id, 1)
        await consumer.ack(second)
        await consumer.ack(again)
        assert await consumer.pending_count() == 0


async def test_waiting_claim_sees_another_connection_enqueue(db_path: Path) -> None:
    async with (
        SQLiteBackend[Any](db_path) as backend,
        SQLiteBackend[Any](db_path) as peer,
    ):
        await peer.open()

        async def enqueue_later() -> None:
            await asyncio.sleep(0.2)
            await peer.outbox.enqueue_intent(intent("t", 1))

        producer = asyncio.create_task(enqueue_later())
        started = time.monotonic()
        messages = await backend.consumer.claim(1, 30, wait=3.0)
        await producer
        assert [m.intent for m in messages] == [intent("t", 1)]
        assert time.monotonic() - started < 1.0


def test_invalid_settings_are_refused(db_path: Path) -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        SQLiteBackend[Any](db_path, max_attempts=0)
    with pytest.raises(ValueError, match="busy_timeout"):
        SQLiteDatabase(db_path, busy_timeout=-1)


# -- closing ----------------------------------------------------------------------------


def _worker_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("flowy-sqlite")}


async def test_close_stops_the_worker_and_refuses_further_use(db_path: Path) -> None:
    before = _worker_threads()
    backend = SQLiteBackend[Any](db_path)
    await backend.checkpointer.save(0, snap("t"))
    workers = _worker_threads() - before
    assert len(workers) == 1
    await backend.aclose()
    await backend.aclose()  # idempotent
    for worker in workers:
        await asyncio.to_thread(worker.join, 5)
        assert not worker.is_alive()
    with pytest.raises(StorageUnavailableError, match="closed"):
        await backend.checkpointer.load("t")
    with pytest.raises(StorageUnavailableError, match="closed"):
        await backend.consumer.claim(1, 30)
    # The file is intact for the next opener.
    async with SQLiteBackend[Any](db_path) as again:
        assert (await again.checkpointer.load("t"))[1] == 1


def test_backend_survives_a_new_event_loop(db_path: Path) -> None:
    backend = SQLiteBackend[Any](db_path)
    assert asyncio.run(backend.checkpointer.save(0, snap("t"))) == 1

    async def second_loop() -> int:
        await backend.outbox.enqueue_intent(intent("t", 1))
        assert len(await backend.consumer.claim(1, 30, wait=0.1)) == 1
        try:
            await backend.checkpointer.save(0, snap("t"))
        except ConcurrencyConflictError as exc:
            return exc.actual
        finally:
            await backend.aclose()
        return -1

    assert asyncio.run(second_loop()) == 1
