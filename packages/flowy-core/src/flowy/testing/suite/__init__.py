"""The flowy conformance suite: contract tests every store must pass.

A store opts in with one fixture and one test module (the plugin
``flowy.testing.plugin`` must be loaded: ``pytest_plugins`` in the rootdir conftest, or
``-p flowy.testing.plugin`` in ``addopts``)::

    # conftest.py
    @pytest.fixture
    def flowy_url() -> str:               # a fresh, isolated store for each test
        return f"mystore://localhost/?prefix=t{uuid.uuid4().hex}&max_attempts=3"

    # test_conformance.py
    from flowy.testing.suite import *  # noqa: F403

Every name exported here is a test class; pytest collects them whatever their names.
Only the corruption tests need more (a ``flowy_corrupt`` fixture); without it they skip
with the reason, or fail under ``FLOWY_REQUIRE_BACKENDS=1``. To override one test,
subclass its class under the same name in that module. See ``docs/adapters.md``.
"""

# ruff: noqa: F405 - the names below come from the star imports, on purpose
from __future__ import annotations

from ._arguments import *  # noqa: F403
from ._backlog import *  # noqa: F403
from ._cancel import *  # noqa: F403
from ._checkpointer import *  # noqa: F403
from ._concurrency import *  # noqa: F403
from ._cost import *  # noqa: F403
from ._delivery import *  # noqa: F403
from ._durable import *  # noqa: F403
from ._fanout import *  # noqa: F403
from ._fork import *  # noqa: F403
from ._integrity import *  # noqa: F403
from ._leases import *  # noqa: F403
from ._limits import *  # noqa: F403
from ._outbox import *  # noqa: F403
from ._queues import *  # noqa: F403
from ._recent import *  # noqa: F403
from ._round_trips import *  # noqa: F403
from ._runs import *  # noqa: F403
from ._schedules import *  # noqa: F403
from ._scratch import *  # noqa: F403
from ._setup import *  # noqa: F403
from ._subgraph import *  # noqa: F403
from ._waits import *  # noqa: F403
from ._watch import *  # noqa: F403

__all__ = [
    "AckingSaveSuite",
    "AcquireAndLoadSuite",
    "ActivitySuite",
    "ArgumentSuite",
    "BacklogSuite",
    "CancelSuite",
    "CheckpointerSuite",
    "ConcurrencySuite",
    "CorruptionSuite",
    "CostSuite",
    "DeliverySuite",
    "FanOutSuite",
    "FaultSuite",
    "FencingSuite",
    "ForkSuite",
    "HistorySuite",
    "JournalSuite",
    "LeaseSuite",
    "LimitsSuite",
    "LineageSuite",
    "OutboxSuite",
    "QueueSuite",
    "RecentThreadsSuite",
    "ReleasingSaveSuite",
    "RoundTripSuite",
    "ScheduleSuite",
    "ScratchSuite",
    "SetupSuite",
    "SignalSuite",
    "SubgraphSuite",
    "ThreadIdSuite",
    "TimerSuite",
    "TransactionalOutboxSuite",
    "VersionSuite",
    "WaitSuite",
    "WatchSuite",
    "WriteOwnershipSuite",
]
