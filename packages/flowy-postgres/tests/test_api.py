"""The public surface of ``flowy_postgres``: exports, lazy imports, deprecated names."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

import flowy_postgres
from flowy.storage import (
    Backend,
    LeaseManager,
    OutboxConsumer,
    TransactionalCheckpointer,
    TransactionalOutbox,
)
from flowy.storage.dialect import FencingCheckpointer
from flowy_postgres import PostgresBackend

pytestmark = pytest.mark.anyio


def test_exports() -> None:
    assert flowy_postgres.__all__ == sorted(flowy_postgres.__all__)
    for name in flowy_postgres.__all__:
        obj = getattr(flowy_postgres, name)
        if isinstance(obj, type) or callable(obj):
            assert obj.__module__ == "flowy_postgres", name
            assert obj.__doc__, f"{name} has no docstring"


def test_import_does_not_load_sqlalchemy() -> None:
    code = "import sys, flowy_postgres; print('sqlalchemy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_0_1_consumer_name_still_works_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match="PostgresConsumer"):
        old = flowy_postgres.PostgresOutboxConsumer
    assert old is flowy_postgres.PostgresConsumer
    with pytest.raises(AttributeError):
        _ = flowy_postgres.NoSuchName


async def test_the_backend_implements_the_protocols(backend: PostgresBackend[Any]) -> None:
    assert isinstance(backend, Backend)
    assert isinstance(backend.checkpointer, FencingCheckpointer)
    assert isinstance(backend.checkpointer, TransactionalCheckpointer)
    assert isinstance(backend.leases, LeaseManager)
    assert isinstance(backend.outbox, TransactionalOutbox)
    assert isinstance(backend.consumer, OutboxConsumer)
    parts = (backend.checkpointer, backend.leases, backend.outbox, backend.consumer)
    assert len({part.domain for part in parts}) == 1


async def test_close_is_a_deprecated_alias_of_aclose(postgres_dsn: str, pg_schema: str) -> None:
    backend = await PostgresBackend[Any].from_dsn(postgres_dsn, schema=pg_schema)
    with pytest.warns(DeprecationWarning, match="aclose"):
        await backend.close()
    assert backend.closed and backend.pool is None


async def test_from_dsn_keeps_the_0_1_pool_options_with_a_warning(
    postgres_dsn: str, pg_schema: str
) -> None:
    with pytest.warns(DeprecationWarning, match="max_size"):
        backend = await PostgresBackend[Any].from_dsn(postgres_dsn, schema=pg_schema, max_size=3)
    try:
        assert backend.pool is not None and backend.pool.get_max_size() == 3
    finally:
        await backend.aclose()
