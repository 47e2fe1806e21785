"""The conformance suite can fail: deliberately broken backends must fail the suite tests
that guard the broken contract (and pass them when the bug is absent).

Each broken backend is the memory reference backend with one realistic bug: no OCC, a
check-then-write race, corruption read as "missing", truncated keys, fencing tokens that
restart after release, re-entrant leases, a ``holder()`` that extends the lease, a save
that ignores its lease, an outbox without visibility timeout, a non-atomic
``save_with_outbox``, history in the wrong order, a prune that drops the head. The suite
test methods are called directly with the broken bundle; one more test runs the suite
through pytest in a subprocess the way an adapter does (``import *``, skips, overrides).
"""

from __future__ import annotations

import asyncio
import importlib
import pkgutil
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from flowy import (
    ConcurrencyConflictError,
    Lease,
    MemoryCheckpointer,
    MemoryLeaseManager,
    MemoryOutbox,
    Snapshot,
    SnapshotEnvelopeInvalidError,
    ThreadNotFoundError,
)
from flowy.checkpoint import EnqueueCallback, OutboxMessage, encode_snapshot

# The suite is imported as a module: a suite class bound to a name in a test module is
# collected and run there (that is how adapters opt in), which is not wanted here.
from flowy.testing import BackendBundle, suite

SuiteTest = Callable[[BackendBundle], Awaitable[None]]


# --- broken checkpointers ---------------------------------------------------------------


class LastWriteWinsCheckpointer(MemoryCheckpointer[Any]):
    """Ignores ``expected_revision``: every save lands on top of whatever is stored."""

    async def save(
        self, expected_revision: int, snapshot: Snapshot[Any], *, lease: Lease | None = None
    ) -> int:
        thread = self._threads.get(snapshot.thread_id)
        return self._commit(thread.head if thread else 0, snapshot, lease)


class RacyCheckpointer(MemoryCheckpointer[Any]):
    """Checks the revision, yields to the event loop, then writes: racers all win."""

    async def save(
        self, expected_revision: int, snapshot: Snapshot[Any], *, lease: Lease | None = None
    ) -> int:
        thread = self._threads.get(snapshot.thread_id)
        actual = thread.head if thread else 0
        if actual != expected_revision:
            raise ConcurrencyConflictError(
                "conflict", thread_id=snapshot.thread_id, expected=expected_revision, actual=actual
            )
        await asyncio.sleep(0)  # a network round trip between the check and the write
        thread = self._threads.get(snapshot.thread_id)
        if thread is None:
            self._commit(0, snapshot, lease)
            return 1
        revision = expected_revision + 1
        thread.history[revision] = encode_snapshot(snapshot, revision)
        thread.head = revision
        return revision


class CorruptIsMissingCheckpointer(MemoryCheckpointer[Any]):
    """Reports a corrupted head as a missing thread instead of an invalid envelope."""

    async def load(self, thread_id: str) -> tuple[Snapshot[Any], int]:
        try:
            return await super().load(thread_id)
        except SnapshotEnvelopeInvalidError as exc:
            raise ThreadNotFoundError(f"thread {thread_id!r} is unreadable") from exc


class TruncatingCheckpointer(MemoryCheckpointer[Any]):
    """Keys threads by the first 255 characters of their id (a column size limit)."""

    @staticmethod
    def _key(thread_id: object) -> Any:
        # Invalid (non-str) ids pass through so validation still rejects them.
        return thread_id[:255] if isinstance(thread_id, str) else thread_id

    async def save(
        self, expected_revision: int, snapshot: Snapshot[Any], *, lease: Lease | None = None
    ) -> int:
        keyed = replace(snapshot, thread_id=self._key(snapshot.thread_id))
        return await super().save(expected_revision, keyed, lease=lease)

    async def load(self, thread_id: str) -> tuple[Snapshot[Any], int]:
        snap, revision = await super().load(self._key(thread_id))
        return replace(snap, thread_id=thread_id), revision


class OldestFirstCheckpointer(MemoryCheckpointer[Any]):
    """Returns history oldest first."""

    async def get_history(self, thread_id: str, limit: int = 100) -> list[Snapshot[Any]]:
        return list(reversed(await super().get_history(thread_id, 10_000)))[:limit]


class PruneDropsHeadCheckpointer(MemoryCheckpointer[Any]):
    """``prune(thread, 0)`` keeps nothing, head included."""

    async def prune(self, thread_id: str, retain: int) -> None:
        thread = self._threads.get(thread_id)
        if thread is not None and retain <= 0:
            thread.history.clear()
            return
        await super().prune(thread_id, retain)


class UnfencedCheckpointer(MemoryCheckpointer[Any]):
    """Claims to fence its lease manager but never looks at the lease."""

    def _fence(self, thread_id: str, lease: Lease | None) -> None:
        return None


class NonAtomicOutboxCheckpointer(MemoryCheckpointer[Any]):
    """``save_with_outbox`` commits the snapshot first, then runs the callback."""

    async def save_with_outbox(
        self,
        expected_revision: int,
        snapshot: Snapshot[Any],
        enqueue: EnqueueCallback,
        *,
        lease: Lease | None = None,
    ) -> int:
        revision = await self.save(expected_revision, snapshot, lease=lease)
        tx = _memory_tx()
        await enqueue(tx, revision)
        for outbox, intent in tx.pending:
            outbox._append(intent)
        return revision


def _memory_tx() -> Any:
    from flowy._memory import _MemoryTx  # the memory outbox accepts only its own handle

    return _MemoryTx()


# --- broken lease managers ------------------------------------------------------------------


class TokenResetLeases(MemoryLeaseManager):
    """Forgets the fencing counter on release: the next lease reuses token 1."""

    async def release(self, lease: Lease) -> None:
        await super().release(lease)
        self._tokens.pop(lease.thread_id, None)


class ReentrantLeases(MemoryLeaseManager):
    """Lets the current owner acquire its own live lease again."""

    async def acquire(self, thread_id: str, owner: str, ttl: float) -> Lease:
        live = self._live(thread_id)
        if live is not None and live.owner == owner:
            return await self.renew(live, ttl)
        return await super().acquire(thread_id, owner, ttl)


class SlidingHolderLeases(MemoryLeaseManager):
    """``holder()`` renews the lease it reports (a read that writes)."""

    async def holder(self, thread_id: str) -> Lease | None:
        live = self._live(thread_id)
        if live is None:
            return None
        return await self.renew(live, 1.0)


# --- broken outboxes ------------------------------------------------------------------------


class NoVisibilityOutbox(MemoryOutbox):
    """Ignores the visibility timeout: a claimed message is claimable again at once."""

    async def claim(
        self, limit: int, visibility_timeout: float, wait: float = 0.0
    ) -> list[OutboxMessage]:
        return await super().claim(limit, 0.0, wait)


class StickyAttemptsOutbox(MemoryOutbox):
    """``retry_dead_letter`` keeps the attempt count."""

    async def retry_dead_letter(self, message_id: str) -> None:
        attempts = self._dead[message_id].attempts if message_id in self._dead else 0
        await super().retry_dead_letter(message_id)
        self._entries[message_id].attempts = attempts


# --- bundles --------------------------------------------------------------------------------


def bundle_with(
    *,
    checkpointer: type[MemoryCheckpointer[Any]] = MemoryCheckpointer,
    leases: type[MemoryLeaseManager] = MemoryLeaseManager,
    outbox: type[MemoryOutbox] = MemoryOutbox,
) -> BackendBundle:
    """A memory bundle with some of its parts replaced by broken subclasses."""
    lm = leases()
    cp = checkpointer(leases=lm)
    ob = outbox(max_attempts=3)

    async def corrupt(thread_id: str) -> None:
        cp.corrupt(thread_id)

    return BackendBundle(
        checkpointer=cp,
        leases=lm,
        outbox=ob,
        consumer=ob,
        corrupt=corrupt,
        name=f"broken-{checkpointer.__name__}-{leases.__name__}-{outbox.__name__}",
    )


@dataclass(frozen=True)
class Case:
    """One broken backend and the suite tests that must catch it."""

    bug: str
    make: Callable[[], BackendBundle]
    tests: tuple[tuple[type[Any], str], ...]


CASES = [
    Case(
        "no optimistic concurrency (last write wins)",
        lambda: bundle_with(checkpointer=LastWriteWinsCheckpointer),
        (
            (suite.CheckpointerSuite, "test_create_over_existing_conflicts"),
            (suite.CheckpointerSuite, "test_stale_update_conflicts"),
            (suite.CheckpointerSuite, "test_update_of_missing_thread_conflicts"),
            (suite.CheckpointerSuite, "test_failed_saves_leave_the_record_unchanged"),
            (suite.ConcurrencySuite, "test_racing_updates_have_one_winner"),
        ),
    ),
    Case(
        "check-then-write race",
        lambda: bundle_with(checkpointer=RacyCheckpointer),
        (
            (suite.ConcurrencySuite, "test_racing_updates_have_one_winner"),
            (suite.ConcurrencySuite, "test_racing_creates_have_one_winner"),
            (suite.ConcurrencySuite, "test_racing_updates_across_peers"),
        ),
    ),
    Case(
        "corrupted record read as a missing thread",
        lambda: bundle_with(checkpointer=CorruptIsMissingCheckpointer),
        ((suite.CorruptionSuite, "test_load_of_corrupt_record_raises"),),
    ),
    Case(
        "thread ids truncated to 255 characters",
        lambda: bundle_with(checkpointer=TruncatingCheckpointer),
        (
            (suite.ThreadIdSuite, "test_special_ids_round_trip"),
            (suite.ThreadIdSuite, "test_special_ids_are_isolated"),
        ),
    ),
    Case(
        "history oldest first",
        lambda: bundle_with(checkpointer=OldestFirstCheckpointer),
        (
            (suite.HistorySuite, "test_history_is_newest_first"),
            (suite.HistorySuite, "test_history_limit"),
        ),
    ),
    Case(
        "prune(0) drops the head",
        lambda: bundle_with(checkpointer=PruneDropsHeadCheckpointer),
        ((suite.HistorySuite, "test_prune_zero_keeps_the_head"),),
    ),
    Case(
        "fencing token restarts after release",
        lambda: bundle_with(leases=TokenResetLeases),
        (
            (suite.LeaseSuite, "test_tokens_increase_across_release"),
            (suite.LeaseSuite, "test_release_frees_the_thread"),
        ),
    ),
    Case(
        "re-entrant lease for the same owner",
        lambda: bundle_with(leases=ReentrantLeases),
        ((suite.LeaseSuite, "test_same_owner_is_refused"),),
    ),
    Case(
        "holder() extends the lease",
        lambda: bundle_with(leases=SlidingHolderLeases),
        ((suite.LeaseSuite, "test_holder_is_read_only"),),
    ),
    Case(
        "save ignores the lease (no fencing)",
        lambda: bundle_with(checkpointer=UnfencedCheckpointer),
        (
            (suite.FencingSuite, "test_save_with_a_taken_over_lease_is_lost"),
            (suite.FencingSuite, "test_save_without_lease_while_leased_is_busy"),
        ),
    ),
    Case(
        "outbox without visibility timeout",
        lambda: bundle_with(outbox=NoVisibilityOutbox),
        (
            (suite.OutboxSuite, "test_claimed_message_is_hidden"),
            (suite.ConcurrencySuite, "test_racing_claims_deliver_once"),
        ),
    ),
    Case(
        "dead-letter retry keeps the attempts",
        lambda: bundle_with(outbox=StickyAttemptsOutbox),
        ((suite.OutboxSuite, "test_retry_dead_letter_resets_attempts"),),
    ),
    Case(
        "save_with_outbox commits the snapshot before the callback",
        lambda: bundle_with(checkpointer=NonAtomicOutboxCheckpointer),
        ((suite.TransactionalOutboxSuite, "test_failing_callback_commits_nothing"),),
    ),
]


def _suite_test(cls: type[Any], name: str) -> SuiteTest:
    test: SuiteTest = getattr(cls(), name)
    return test


async def _outcome(test: SuiteTest, bundle: BackendBundle) -> BaseException | None:
    """Run one suite test; the exception it failed with, or ``None`` if it passed."""
    try:
        await test(bundle)
    except pytest.skip.Exception as exc:
        pytest.fail(f"the suite test skipped instead of running: {exc}")
    except (Exception, pytest.fail.Exception) as exc:
        return exc
    return None


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("case", "cls", "name"),
    [
        pytest.param(case, cls, name, id=f"{case.bug}-{cls.__name__}.{name}")
        for case in CASES
        for cls, name in case.tests
    ],
)
async def test_broken_backend_fails_the_suite(case: Case, cls: type[Any], name: str) -> None:
    error = await _outcome(_suite_test(cls, name), case.make())
    assert error is not None, f"{cls.__name__}.{name} passed against a backend with: {case.bug}"


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("cls", "name"),
    sorted({(cls, name) for case in CASES for cls, name in case.tests}, key=repr),
    ids=lambda v: v.__name__ if isinstance(v, type) else str(v),
)
async def test_same_tests_pass_on_the_reference_backend(cls: type[Any], name: str) -> None:
    """Control: the tests above fail because of the bug, not on their own."""
    error = await _outcome(_suite_test(cls, name), bundle_with())
    assert error is None, f"{cls.__name__}.{name} fails on the memory backend: {error!r}"


@pytest.mark.anyio
async def test_racy_backend_passes_sequential_tests() -> None:
    """Only the concurrency tests can see a check-then-write race."""
    bundle = bundle_with(checkpointer=RacyCheckpointer)
    for name in ("test_stale_update_conflicts", "test_create_over_existing_conflicts"):
        assert await _outcome(_suite_test(suite.CheckpointerSuite, name), bundle) is None


_CONFTEST = """
import pytest

from flowy import MemoryCheckpointer
from flowy.testing import BackendBundle


class LastWriteWins(MemoryCheckpointer):
    async def save(self, expected_revision, snapshot, *, lease=None):
        thread = self._threads.get(snapshot.thread_id)
        return self._commit(thread.head if thread else 0, snapshot, lease)


@pytest.fixture
async def flowy_backend():
    yield BackendBundle(checkpointer=LastWriteWins(), name="last-write-wins")
"""

_TEST_MODULE = """
from flowy.testing import suite
from flowy.testing.suite import *  # noqa: F403


class HistorySuite(suite.HistorySuite):
    async def test_history_limit_zero_is_empty(self, flowy_backend):
        assert flowy_backend.name == "last-write-wins"
"""


def test_suite_runs_through_pytest_like_an_adapter(tmp_path: Path) -> None:
    """An adapter's opt-in (``import *``, one fixture, one override) through real pytest:
    a broken backend fails, missing capabilities skip with their reason, and the
    subclass replaces the one test without running the original."""
    (tmp_path / "pytest.ini").write_text("[pytest]\nfilterwarnings = error\n")
    (tmp_path / "conftest.py").write_text(textwrap.dedent(_CONFTEST))
    (tmp_path / "test_adapter.py").write_text(textwrap.dedent(_TEST_MODULE))
    report = tmp_path / "report.xml"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "flowy.testing.plugin",
            "-p",
            "no:cacheprovider",
            "-q",
            "-rs",
            f"--junitxml={report}",
            "test_adapter.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    outcomes: dict[str, str] = {}
    messages: dict[str, str] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        key = f"{case.get('classname', '').rsplit('.', 1)[-1]}.{case.get('name', '')}"
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = child.tag
                messages[key] = child.get("message", "")
        outcomes[key] = outcome
    param = "[asyncio]"
    for name in (
        "test_create_over_existing_conflicts",
        "test_stale_update_conflicts",
        "test_update_of_missing_thread_conflicts",
    ):
        assert outcomes[f"CheckpointerSuite.{name}{param}"] == "failure", name
    assert outcomes[f"CheckpointerSuite.test_load_round_trips_every_field{param}"] == "passed"
    skipped = f"LeaseSuite.test_acquire_returns_a_live_lease{param}"
    assert outcomes[skipped] == "skipped"
    assert "does not provide a lease manager" in messages[skipped]
    assert outcomes[f"OutboxSuite.test_claim_returns_the_intent{param}"] == "skipped"
    assert outcomes[f"CorruptionSuite.test_load_of_corrupt_record_raises{param}"] == "skipped"
    overridden = f"HistorySuite.test_history_limit_zero_is_empty{param}"
    assert outcomes[overridden] == "passed"
    assert sum(1 for key in outcomes if key.startswith("HistorySuite.")) == len(
        [n for n in dir(suite.HistorySuite) if n.startswith("test_")]
    )


def test_every_suite_class_is_exported() -> None:
    """``flowy.testing.suite`` re-exports every suite class of every suite module, so
    ``import *`` runs all of them."""
    from flowy.testing.suite._support import Suite

    defined: set[str] = set()
    for info in pkgutil.iter_modules(suite.__path__):
        module = importlib.import_module(f"{suite.__name__}.{info.name}")
        defined |= {
            name
            for name, value in vars(module).items()
            if isinstance(value, type)
            and issubclass(value, Suite)
            and value is not Suite
            and value.__module__ == module.__name__
        }
    assert sorted(defined) == sorted(suite.__all__)
    assert all(getattr(suite, name).__test__ is True for name in suite.__all__)
