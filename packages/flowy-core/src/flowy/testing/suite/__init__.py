"""The flowy conformance suite: contract tests every storage backend must pass.

An adapter opts in with one fixture and one test module::

    # conftest.py  (the plugin flowy.testing.plugin must be loaded: pytest_plugins in the
    # root conftest, or ``-p flowy.testing.plugin``)
    @pytest.fixture
    async def flowy_backend():          # one fresh, isolated backend per test
        ...
        yield Backend[Any](checkpointer=..., leases=..., outbox=..., consumer=...)

    # test_conformance.py
    from flowy.testing.suite import *  # noqa: F403

Every name exported here is a test class; pytest collects them whatever their names.
A capability the bundle lacks (no lease manager, no consumer, no corruption hook, a
checkpointer that is not transactional or not fencing) skips the tests that need it with
the reason. To override one test, subclass its class under the same name in that module.
See ``docs/adapters.md``.
"""

# ruff: noqa: F405 - the names below come from the star imports, on purpose
from __future__ import annotations

from ._arguments import *  # noqa: F403
from ._checkpointer import *  # noqa: F403
from ._concurrency import *  # noqa: F403
from ._leases import *  # noqa: F403
from ._outbox import *  # noqa: F403
from ._runs import *  # noqa: F403

__all__ = [
    "ArgumentSuite",
    "CheckpointerSuite",
    "ConcurrencySuite",
    "CorruptionSuite",
    "FaultSuite",
    "FencingSuite",
    "HistorySuite",
    "LeaseSuite",
    "OutboxSuite",
    "ThreadIdSuite",
    "TransactionalOutboxSuite",
    "WriteOwnershipSuite",
]
