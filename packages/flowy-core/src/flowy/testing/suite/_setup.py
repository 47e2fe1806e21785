"""Setting a store up: ``await backend.setup()`` creates what a new store needs and is
idempotent, and every store refuses a schema of older or newer code with the same
message (``BaseBackend.check_schema_version``).
"""

from __future__ import annotations

import re
import uuid
from typing import Any, cast

import pytest

from ..._errors import SchemaVersionError
from ...storage import Backend, connect
from ...storage._connect import _opener, parse_url  # pyright: ignore[reportPrivateUsage]
from ...storage._scratch import SCRATCH_PREFIX
from ...storage.dialect import BaseBackend
from ..hooks import SetSchemaVersion
from ._support import Suite, make_intent, make_snapshot, new_thread_id

__all__ = ["SetupSuite"]

SCHEMA_VERSION_MESSAGE = re.compile(
    r"(?P<where>.+) has schema version (?P<found>\d+), (?P<side>newer|older) than version "
    r"(?P<known>\d+) that this (?P<package>flowy-[a-z]+) (knows|uses); (?P<advice>.+)"
)
"""The shape of every store's ``SchemaVersionError`` for a recorded version it does not
use."""


async def _unopened_scratch(url: str) -> tuple[BaseBackend[Any], str]:
    """A backend (not opened, nothing created) on a new scratch namespace next to the
    store at ``url``, and that namespace's URL; skips a store that has none."""
    parsed = parse_url(url)
    live = await _opener(parsed)(parsed, codec=None)
    try:
        scratch = live.scratch_url(f"{SCRATCH_PREFIX}{uuid.uuid4().hex[:12]}")
    finally:
        await live.aclose()
    if scratch is None:
        pytest.skip(f"{type(live).__name__} has no scratch stores to set up")
    parsed = parse_url(scratch)
    backend = await _opener(parsed)(parsed, codec=None)
    backend._scratch = True  # pyright: ignore[reportPrivateUsage]
    return backend, scratch


class SetupSuite(Suite):
    """``setup()`` on a fresh store, twice, then the store works; schema versions."""

    async def test_setup_twice_on_a_fresh_store_then_it_works(self, flowy_url: str) -> None:
        backend, _ = await _unopened_scratch(flowy_url)
        try:
            version = await backend.setup()
            assert isinstance(version, int) and version >= 1
            assert await backend.setup() == version  # idempotent
            store = cast(Backend[Any], await backend.open())
            thread_id = new_thread_id("setup")
            assert await store.checkpointer.save(0, make_snapshot(thread_id)) == 1
            assert (await store.checkpointer.load(thread_id))[1] == 1
            await store.outbox.enqueue_intent(make_intent(thread_id, 1))
            (message,) = await store.consumer.claim(10, 60.0, 0.0)
            assert message.intent.thread_id == thread_id
        finally:
            await backend.drop_scratch()

    async def test_older_and_newer_schema_versions_are_refused_alike(
        self, flowy_url: str, flowy_schema_version: SetSchemaVersion | None
    ) -> None:
        if flowy_schema_version is None:
            pytest.skip(
                "this store's tests define no flowy_schema_version fixture: a store that "
                "keeps nothing past its process (memory://) records no schema version; a "
                "store that records one defines the fixture to write a given version"
            )
        backend, scratch = await _unopened_scratch(flowy_url)
        try:
            known = await backend.setup()
            await backend.aclose()
            for found, side in ((known + 1, "newer"), (known - 1, "older")):
                await flowy_schema_version(scratch, found)
                with pytest.raises(SchemaVersionError) as info:
                    await connect(scratch)
                shape = SCHEMA_VERSION_MESSAGE.fullmatch(str(info.value))
                assert shape is not None, str(info.value)
                assert (shape["found"], shape["side"], shape["known"]) == (
                    str(found),
                    side,
                    str(known),
                )
                if side == "older":
                    assert "`await backend.setup()`" in shape["advice"]
        finally:
            parsed = parse_url(scratch)
            leftover = await _opener(parsed)(parsed, codec=None)
            leftover._scratch = True  # pyright: ignore[reportPrivateUsage]
            await leftover.drop_scratch()
