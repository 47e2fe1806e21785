"""Testing tools: the conformance suite every store passes, fault injection, the stress
run, and hooks for the stores in core.

A store opts in from its own test package (load the plugin with ``pytest_plugins`` in
the rootdir conftest, or ``-p flowy.testing.plugin`` in ``addopts``)::

    # conftest.py

    @pytest.fixture
    def flowy_url() -> str:          # a fresh, isolated store for each test
        return f"mystore://localhost/?prefix=t{uuid.uuid4().hex}"

    # test_conformance.py
    from flowy.testing.suite import *  # noqa: F403

See ``docs/adapters.md``. :class:`FaultyBackend` wraps a store to make its operations
fail where a test says (``flowy.testing.faults``).
"""

from __future__ import annotations

from .checking import CheckReport as CheckReport
from .checking import Scenario as Scenario
from .checking import acheck as acheck
from .checking import check as check
from .faults import Fault as Fault
from .faults import FaultKind as FaultKind
from .faults import FaultyBackend as FaultyBackend
from .hooks import Corrupt as Corrupt
from .hooks import Dump as Dump
from .hooks import corrupt_head as corrupt_head
from .hooks import dump_store as dump_store

__all__ = [
    "CheckReport",
    "Corrupt",
    "Dump",
    "Fault",
    "FaultKind",
    "FaultyBackend",
    "Scenario",
    "acheck",
    "check",
    "corrupt_head",
    "dump_store",
]
