"""The connection to Redis shared by a backend's components: the client, the key
layout, script execution (EVALSHA, reloaded on NOSCRIPT), the translation of driver
errors into flowy errors, and the namespace's recorded layout (checked once, upgraded by
``backend.setup()``).
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Protocol, TypeAlias, cast

from redis import exceptions as rexc
from redis.asyncio import Redis, RedisCluster

from flowy.errors import SchemaVersionError, StorageError, StorageUnavailableError
from flowy.storage.dialect import BaseBackend, show_id

from ._keys import STATUS_DIGITS, KeyLayout, ThreadKeys
from ._scripts import LAYOUT, READS, LuaScript

__all__ = ["LAYOUT_VERSION", "RedisClient", "Store", "purge_namespace"]

RedisClient: TypeAlias = "Redis | RedisCluster"
"""A ``redis.asyncio.Redis`` or ``redis.asyncio.RedisCluster`` client (bytes responses)."""

LAYOUT_VERSION = 2
"""The key layout this version writes (recorded in ``<namespace>:meta``); 1 was 0.1's."""

Arg: TypeAlias = bytes | str | int | float
Action: TypeAlias = "str | Callable[[], str]"
"""What a call does, for error messages (a callable is called only on an error)."""


class _Commands(Protocol):
    async def execute_command(self, *args: Any, **options: Any) -> Any: ...


_UNAVAILABLE: tuple[type[BaseException], ...] = (
    rexc.ConnectionError,
    rexc.TimeoutError,
    rexc.ClusterDownError,
    rexc.TryAgainError,
    rexc.ReadOnlyError,
    rexc.ClusterError,
    rexc.RedisClusterException,
    OSError,
)
_DRIVER_ERRORS = (rexc.RedisError, rexc.RedisClusterException, OSError)


_READ_COMMANDS = frozenset({"HGET", "HGETALL", "HMGET", "HVALS", "XREAD", "ZRANGE"})
"""The commands ``Store.execute`` runs that change nothing."""


def translate(exc: BaseException, action: Action, *, reads: bool = False) -> StorageError:
    """The flowy error for a driver error raised while doing ``action``; ``reads``: the
    action changes nothing, so no outcome is in doubt."""
    what = action if isinstance(action, str) else action()
    detail = f"({type(exc).__name__}: {exc})"
    if not (isinstance(exc, _UNAVAILABLE) or str(exc).startswith("BUSY")):
        return StorageError(f"Redis refused {what} {detail}.")
    if reads:
        return StorageUnavailableError(
            f"Redis was unavailable while {what} {detail}; nothing was read and nothing "
            "changed, so nothing is in doubt. Check that the server is running and that the "
            "URL (host, port, database) is right, then try again."
        )
    return StorageUnavailableError(
        f"Redis was unavailable while {what} {detail}; the outcome may be unknown. Check "
        "that the server is reachable; a save's outcome is resolved by "
        "flowy.storage.dialect.confirmed_save, which compares write ids."
    )


class Store:
    """A Redis client and the key layout of one namespace; runs commands and scripts.

    ``owns_client``: the backend closes the client (one it made from a URL).
    """

    __slots__ = ("_checked", "_commands", "_lock", "client", "cluster", "layout", "owns_client")

    def __init__(self, client: RedisClient, layout: KeyLayout, *, owns_client: bool) -> None:
        if not isinstance(client, Redis | RedisCluster):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(
                "flowy-redis needs a redis.asyncio.Redis or redis.asyncio.RedisCluster "
                f"client, got {type(client).__name__}"
            )
        if getattr(client.get_encoder(), "decode_responses", False):
            raise ValueError(
                "the Redis client was created with decode_responses=True; flowy stores "
                "binary records and needs raw bytes. Create the client with "
                "decode_responses=False (the default)."
            )
        self.client: RedisClient = client
        self.cluster: bool = isinstance(client, RedisCluster)
        self.layout: KeyLayout = layout
        self.owns_client: bool = owns_client
        self._commands = cast(_Commands, client)
        self._checked = False
        self._lock = asyncio.Lock()

    @property
    def domain(self) -> tuple[object, ...]:
        """The coordination domain: the deployment (as addressed) and the layout."""
        client = self.client
        if isinstance(client, RedisCluster):
            nodes = client.nodes_manager.startup_nodes
            return ("redis-cluster", frozenset(nodes), self.layout)
        kwargs = client.connection_pool.connection_kwargs
        where = (kwargs.get("host"), kwargs.get("port"), kwargs.get("path"), kwargs.get("db", 0))
        return ("redis", *where, self.layout)

    async def execute(self, action: Action, *args: Arg, **options: Any) -> Any:
        """Run one command; driver errors become flowy errors."""
        if not self._checked:
            await self.check_layout()
        try:
            return await self._commands.execute_command(*args, **options)
        except _DRIVER_ERRORS as exc:
            raise translate(exc, action, reads=str(args[0]).upper() in _READ_COMMANDS) from exc

    async def run(
        self, script: LuaScript, keys: Sequence[bytes], args: Sequence[Arg], action: Action
    ) -> Any:
        """EVALSHA ``script``; on NOSCRIPT load it and run it again (it did not run)."""
        if not self._checked:
            await self.check_layout()
        call = self._commands.execute_command
        try:
            try:
                return await call("EVALSHA", script.sha, len(keys), *keys, *args)
            except rexc.NoScriptError:
                # A flushed script cache, a restart, a failover to a replica that never
                # loaded it: nothing ran, so loading it and running again is safe.
                if self.cluster:
                    await call("SCRIPT LOAD", script.source, target_nodes=RedisCluster.PRIMARIES)
                else:
                    await call("SCRIPT LOAD", script.source)
                return await call("EVALSHA", script.sha, len(keys), *keys, *args)
        except _DRIVER_ERRORS as exc:
            raise translate(exc, action, reads=script in READS) from exc

    async def call(
        self,
        script: LuaScript,
        thread_id: str,
        keys: Callable[[ThreadKeys], Sequence[bytes] | bytes],
        args: Sequence[Arg],
        what: str,
    ) -> Any:
        """Run ``script`` on ``keys`` (picked from the thread's) of ``thread_id``; ``what``
        it does to the thread (``"loading"``) names the call in errors."""
        picked = keys(self.layout.thread(thread_id))
        return await self.run(
            script,
            (picked,) if isinstance(picked, bytes) else picked,
            args,
            lambda: f"{what} thread {show_id(thread_id)}",
        )

    async def run_sharded(
        self,
        script: LuaScript,
        groups: Sequence[Sequence[bytes]],
        args: Sequence[Arg],
        action: Action,
    ) -> list[Any]:
        """Run ``script`` over groups of same-slot keys; one answer per call made.

        On a standalone server all groups go into one call; on a cluster each group is
        its own call, run concurrently. The script treats its keys as a concatenation.
        """
        if not groups:
            return []
        if not self.cluster:
            return [await self.run(script, [key for g in groups for key in g], args, action)]
        return list(await asyncio.gather(*(self.run(script, g, args, action) for g in groups)))

    async def check_layout(self) -> int:
        """Record the layout of a new namespace, or check the recorded one; return its
        version. ``SchemaVersionError`` for another shard count or layout version."""
        async with self._lock:  # concurrent first calls on a cluster client trip over
            recorded = await self._recorded()  # each other while it maps the slots
            where = f"the Redis namespace {self.layout.namespace!r}"
            BaseBackend.check_schema_version(
                recorded, known=LAYOUT_VERSION, where=where, package="flowy-redis"
            )
            self._checked = True
            return recorded

    async def _recorded(self) -> int:
        layout = self.layout
        try:
            if isinstance(self.client, RedisCluster):
                await self.client.initialize()
            got = await self._commands.execute_command(
                "EVAL", LAYOUT.source, 1, layout.meta, layout.shards, LAYOUT_VERSION
            )
        except _DRIVER_ERRORS as exc:
            # Recording a new namespace's layout is idempotent: nothing is in doubt.
            raise translate(
                exc, f"checking the layout of namespace {layout.namespace!r}", reads=True
            ) from exc
        shards, version = int(got[0]), int(got[1])
        if shards != layout.shards:
            raise SchemaVersionError(
                f"namespace {layout.namespace!r} was created with shards={shards}, but this "
                f"client is configured with shards={layout.shards}; a thread's keys depend on "
                f"the shard count, so every client of a namespace must use shards={shards}."
            )
        return version

    async def migrate(self) -> int:
        """Upgrade the namespace's layout to this version's; return it. Idempotent."""
        version = await self._recorded()
        if version > LAYOUT_VERSION:
            return await self.check_layout()  # raises: a newer layout
        if version == 1:
            self._checked = True  # the shard count matches; the calls below may run
            try:
                await self._migrate_from_1()
            except BaseException:
                self._checked = False
                raise
        self._checked = True
        return LAYOUT_VERSION

    async def _migrate_from_1(self) -> None:
        # Layout 1 indexed threads by base64 id in a score-ordered `ix` set (hand-off
        # status * 2**48 + expiry ms, 2**48 - 1 for never) and kept lease records forever.
        digits, what = list(STATUS_DIGITS.values()), "migrating the layout"
        for shard in self.layout.all_shards():
            ix = shard.threads[: -len(b"threads")] + b"ix"
            rows = await self.execute(what, "ZRANGE", ix, 0, -1, "WITHSCORES", withscores=True)
            for member, score in rows:
                position, expiry = divmod(int(float(score)), 2**48)
                thread_id = base64.urlsafe_b64decode(member)
                await self.execute(what, "ZADD", shard.threads, 0, digits[position] + thread_id)
                if expiry < 2**48 - 1:
                    await self.execute(what, "ZADD", shard.exp, expiry, thread_id)
            await self.execute(what, "DEL", ix)
        async for key in self.scan(self.layout.pattern(b"lease:")):
            exp, token = await self.execute("reading a lease", "HMGET", key, "exp", "token")
            expires_ms = max(int(exp or 0), int(token or 0)) // 1000 + 1
            await self.execute("expiring a lease record", "PEXPIREAT", key, expires_ms)
        await self.execute(
            "recording the layout", "HSET", self.layout.meta, "layout", LAYOUT_VERSION
        )

    async def scan(self, pattern: bytes) -> AsyncIterator[bytes]:
        """Every key matching ``pattern``, on every primary."""
        client = self.client
        nodes: list[Any] = client.get_primaries() if isinstance(client, RedisCluster) else [None]
        for node in nodes:
            options: dict[str, Any] = {} if node is None else {"target_nodes": node}
            cursor = 0
            while True:
                reply = await self._commands.execute_command(
                    "SCAN", cursor, "MATCH", pattern, "COUNT", 1000, **options
                )
                # A cluster client answers ({node: cursor}, keys) even for one node.
                cursor, keys = cast(tuple[Any, list[bytes]], reply)
                if isinstance(cursor, dict):
                    cursor = next(iter(cast(dict[Any, Any], cursor).values()))
                for key in keys:
                    yield key
                if int(cursor) == 0:
                    break

    async def aclose(self) -> None:
        """Close the client if this store owns it."""
        if self.owns_client:
            await self.client.aclose()


async def purge_namespace(client: RedisClient, namespace: str) -> int:
    """Delete every key of ``namespace`` (threads, leases, outbox, its layout record);
    return how many were deleted. For tests and decommissioning: it scans the keyspace
    of every primary."""
    store = Store(client, KeyLayout(namespace, 1), owns_client=False)
    commands = cast(_Commands, client)
    deleted = 0
    async for key in store.scan(store.layout.pattern()):
        deleted += int(await commands.execute_command("UNLINK", key))
    return deleted + int(await commands.execute_command("UNLINK", store.layout.meta))
