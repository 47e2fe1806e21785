"""The flowy conformance suite: contract tests every storage backend must pass.

An adapter opts in from its own test package::

    # conftest.py
    pytest_plugins = ["flowy.testing.plugin"]

    @pytest.fixture
    async def flowy_backend():          # one fresh, isolated backend per test
        ...
        yield BackendBundle(checkpointer=..., leases=..., outbox=..., consumer=...)

    # test_conformance.py
    from flowy.testing.suite import *  # noqa: F403

See ``docs/adapters.md``.
"""

from __future__ import annotations

from ._bundle import BackendBundle as BackendBundle

__all__ = ["BackendBundle"]
