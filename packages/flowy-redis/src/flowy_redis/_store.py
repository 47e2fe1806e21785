"""The connection to Redis shared by the backend's classes: the client, the key layout,
script execution (EVALSHA with a transparent reload on NOSCRIPT), the translation of
driver errors into flowy errors, and the one-time check of the namespace's layout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Protocol, Self, TypeAlias, cast

from redis import exceptions as rexc
from redis.asyncio import Redis, RedisCluster

from flowy import SchemaVersionError, StorageError, StorageUnavailableError

from ._keys import KeyLayout
from ._scripts import LAYOUT, LuaScript

__all__ = [
    "LAYOUT_VERSION",
    "RedisClient",
    "Store",
    "StoreUser",
    "connect",
    "purge_namespace",
]

RedisClient: TypeAlias = "Redis | RedisCluster"
"""A ``redis.asyncio.Redis`` or ``redis.asyncio.RedisCluster`` client (bytes responses)."""

LAYOUT_VERSION = "1"
"""Version of the key layout written to ``<namespace>:meta``."""

Arg: TypeAlias = bytes | str | int | float

Action: TypeAlias = "str | Callable[[], str]"
"""What a call does, for error messages; a callable is only called when one is raised."""


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


def translate(exc: BaseException, action: Action) -> StorageError:
    """The flowy error for a driver error raised while doing ``action``."""
    if not isinstance(action, str):
        action = action()
    if isinstance(exc, _UNAVAILABLE) or (
        isinstance(exc, rexc.ResponseError) and str(exc).startswith("BUSY")
    ):
        return StorageUnavailableError(
            f"Redis was unavailable while {action} ({type(exc).__name__}: {exc}); the "
            f"outcome may be unknown. Check that the server is reachable; a save's outcome "
            f"is resolved by flowy.checkpoint.durable_save, which compares write ids."
        )
    return StorageError(f"Redis refused {action} ({type(exc).__name__}: {exc}).")


def _decodes_responses(client: RedisClient) -> bool:
    encoder = client.get_encoder()
    return bool(getattr(encoder, "decode_responses", False))


class Store:
    """A Redis client plus the key layout of one namespace; runs commands and scripts.

    ``owns_client`` means ``aclose`` closes the client (clients made by ``from_url``).
    """

    __slots__ = (
        "_checked",
        "_commands",
        "_setup_lock",
        "client",
        "cluster",
        "layout",
        "owns_client",
    )

    def __init__(self, client: RedisClient, layout: KeyLayout, *, owns_client: bool = False):
        if not isinstance(client, Redis | RedisCluster):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(
                f"flowy-redis needs a redis.asyncio.Redis or redis.asyncio.RedisCluster "
                f"client, got {type(client).__name__}"
            )
        if _decodes_responses(client):
            raise ValueError(
                "the Redis client was created with decode_responses=True; flowy stores "
                "binary records and needs raw bytes. Create the client with "
                "decode_responses=False (the default)."
            )
        self.client = client
        self.cluster = isinstance(client, RedisCluster)
        self.layout = layout
        self.owns_client = owns_client
        self._commands = cast(_Commands, client)
        self._checked = False
        self._setup_lock = asyncio.Lock()

    def same_domain(self, other: Store) -> bool:
        """True if ``other`` addresses the same keys on the same Redis deployment."""
        if self.layout != other.layout:
            return False
        if self.client is other.client:
            return True
        return _address(self.client) == _address(other.client)

    async def execute(self, action: Action, *args: Arg, **options: Any) -> Any:
        """Run one command; driver errors become flowy errors."""
        if not self._checked:
            await self._check_layout()
        try:
            return await self._commands.execute_command(*args, **options)
        except asyncio.CancelledError:
            raise
        except (rexc.RedisError, rexc.RedisClusterException, OSError) as exc:
            raise translate(exc, action) from exc

    async def run(
        self, script: LuaScript, keys: Sequence[bytes], args: Sequence[Arg], action: Action
    ) -> Any:
        """EVALSHA ``script``; on NOSCRIPT load it and run it again (it was not run)."""
        if not self._checked:
            await self._check_layout()
        return await self._run(script, keys, args, action)

    async def _run(
        self, script: LuaScript, keys: Sequence[bytes], args: Sequence[Arg], action: Action
    ) -> Any:
        """:meth:`run` without the layout check (the check itself runs a script)."""
        try:
            return await self._commands.execute_command(
                "EVALSHA", script.sha, len(keys), *keys, *args
            )
        except rexc.NoScriptError:
            return await self._reload_and_run(script, keys, args, action)
        except asyncio.CancelledError:
            raise
        except (rexc.RedisError, rexc.RedisClusterException, OSError) as exc:
            raise translate(exc, action) from exc

    async def _reload_and_run(
        self, script: LuaScript, keys: Sequence[bytes], args: Sequence[Arg], action: Action
    ) -> Any:
        # The server does not know the script (SCRIPT FLUSH, a restart, a failover to a
        # replica that never loaded it): nothing ran, so loading it and running again is
        # safe.
        call = self._commands.execute_command
        try:
            if self.cluster:
                await call("SCRIPT LOAD", script.source, target_nodes=RedisCluster.PRIMARIES)
            else:
                await call("SCRIPT LOAD", script.source)
            return await call("EVALSHA", script.sha, len(keys), *keys, *args)
        except asyncio.CancelledError:
            raise
        except (rexc.RedisError, rexc.RedisClusterException, OSError) as exc:
            raise translate(exc, action) from exc

    async def run_sharded(
        self,
        script: LuaScript,
        key_groups: Sequence[Sequence[bytes]],
        args: Sequence[Arg],
        action: Action,
    ) -> list[Any]:
        """Run ``script`` over groups of same-slot keys; one answer per call made.

        On a standalone server all groups go into one call (one round trip); on a
        cluster each group is its own call, run concurrently. The script must treat its
        keys as a concatenation of groups.
        """
        if not key_groups:
            return []
        if not self._checked:
            await self._check_layout()
        if not self.cluster:
            flat = [key for group in key_groups for key in group]
            return [await self._run(script, flat, args, action)]
        return list(await asyncio.gather(*(self._run(script, g, args, action) for g in key_groups)))

    async def _check_layout(self) -> None:
        # Once per store, before any other command: concurrent first commands on a
        # cluster client that has not loaded its slot map yet can trip over each other.
        async with self._setup_lock:
            if self._checked:
                return
            if isinstance(self.client, RedisCluster):
                try:
                    await self.client.initialize()
                except asyncio.CancelledError:
                    raise
                except (rexc.RedisError, rexc.RedisClusterException, OSError) as exc:
                    raise translate(exc, "connecting to the Redis Cluster") from exc
            await self._verify_layout()
            self._checked = True

    async def _verify_layout(self) -> None:
        layout = self.layout
        got = await self._run(
            LAYOUT,
            [layout.meta],
            [layout.shards, LAYOUT_VERSION],
            f"checking the layout of namespace {layout.namespace!r}",
        )
        shards, version = (int(got[0]), got[1].decode())
        if version != LAYOUT_VERSION:
            raise SchemaVersionError(
                f"namespace {layout.namespace!r} uses key layout version {version!r}; this "
                f"flowy-redis writes version {LAYOUT_VERSION!r}. Upgrade or downgrade "
                f"flowy-redis to match, or use another namespace."
            )
        if shards != layout.shards:
            raise SchemaVersionError(
                f"namespace {layout.namespace!r} was created with shards={shards}, but this "
                f"client is configured with shards={layout.shards}; a thread's keys depend "
                f"on the shard count, so every client of a namespace must use shards={shards}."
            )

    async def aclose(self) -> None:
        """Close the client if this store created it."""
        if self.owns_client:
            await self.client.aclose()


class StoreUser:
    """What the checkpointer, lease manager, outbox and consumer share: a :class:`Store`
    for one namespace, and ``aclose`` closing the client only if ``from_url`` made it."""

    def __init__(self, client: RedisClient, *, namespace: str, shards: int) -> None:
        self._store = Store(client, KeyLayout(namespace, shards))

    def _owning_client(self) -> Self:
        """This object, now responsible for closing its client (for ``from_url``)."""
        self._store.owns_client = True
        return self

    @property
    def layout(self) -> KeyLayout:
        """The key layout (namespace and shard count)."""
        return self._store.layout

    async def aclose(self) -> None:
        """Close the client if ``from_url`` created it."""
        await self._store.aclose()


def connect(url: str, *, cluster: bool = False, **options: Any) -> RedisClient:
    """A new client for ``url``: a ``RedisCluster`` if ``cluster``, else a ``Redis``."""
    if options.get("decode_responses"):
        raise ValueError("flowy-redis needs decode_responses=False (raw bytes)")
    if cluster:
        return RedisCluster.from_url(url, **options)
    return Redis.from_url(url, **options)  # pyright: ignore[reportUnknownMemberType]


def _address(client: RedisClient) -> object:
    if isinstance(client, RedisCluster):
        return ("cluster", frozenset(n.name for n in client.get_nodes()))
    kwargs = client.connection_pool.connection_kwargs
    return (
        "standalone",
        kwargs.get("host"),
        kwargs.get("port"),
        kwargs.get("path"),
        kwargs.get("db", 0),
    )


async def purge_namespace(client: RedisClient, namespace: str) -> int:
    """Delete every key of ``namespace`` (all threads, leases, outbox and its layout
    record); return how many keys were deleted. Meant for tests and decommissioning:
    it scans the whole keyspace of every primary."""
    layout = KeyLayout(namespace, 1)
    commands = cast(_Commands, client)
    deleted = 0
    nodes: list[Any] = client.get_primaries() if isinstance(client, RedisCluster) else [None]
    for node in nodes:
        cursor = 0
        while True:
            options: dict[str, Any] = {} if node is None else {"target_nodes": node}
            reply = await commands.execute_command(
                "SCAN", cursor, "MATCH", layout.pattern, "COUNT", 1000, **options
            )
            cursor, keys = _scan_reply(reply)
            for key in keys:
                deleted += int(await commands.execute_command("UNLINK", key))
            if cursor == 0:
                break
    deleted += int(await commands.execute_command("UNLINK", layout.meta))
    return deleted


def _scan_reply(reply: Any) -> tuple[int, list[bytes]]:
    # A cluster client answers ({node name: cursor}, keys) even for one target node.
    cursor, keys = cast(tuple[Any, list[bytes]], reply)
    if isinstance(cursor, dict):
        cursor = next(iter(cast(dict[Any, Any], cursor).values()))
    return int(cursor), list(keys)
