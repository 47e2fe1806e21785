"""``RedisBackend``: one client and the four components of one namespace built on it;
``open_backend``, the opener of ``redis://``, ``rediss://``, ``redis+cluster://`` and
``rediss+cluster://`` URLs for ``flowy.connect``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar, Generic, TypeVar

from redis.asyncio import Redis, RedisCluster

from flowy.errors import BackendURLError
from flowy.storage import StateCodec
from flowy.storage.dialect import (
    SCRATCH_PREFIX,
    BaseBackend,
    Inbox,
    RoundTrips,
    StoreURL,
    sibling_url,
)

from ._checkpointer import DEFAULT_MAX_RECORD_BYTES, ClusterCheckpointer, RedisCheckpointer
from ._keys import DEFAULT_NAMESPACE, DEFAULT_SHARDS, MAX_SHARDS, KeyLayout
from ._lease import RedisLeaseManager
from ._outbox import RedisConsumer, RedisOutbox, RedisQueueConsumer
from ._schedules import RedisScheduleStore
from ._store import RedisClient, Store, purge_namespace

__all__ = ["CLIENT_OPTIONS", "OPTIONS", "RedisBackend", "open_backend"]

S = TypeVar("S")

OPTIONS = {
    "namespace": f"prefix of every key, without {{ or }} (default {DEFAULT_NAMESPACE})",
    "shards": f"hash tags the namespace spreads over; fixed at creation (default {DEFAULT_SHARDS})",
    "max_attempts": "deliveries before a hand-off is dead-lettered (default 5)",
    "completed_ttl": "seconds after which completed or failed threads expire (default: never)",
    "group": "the outbox consumer group (default flowy)",
    "consumer": "this process's consumer name in the group (default host-pid-random)",
    "poll_interval": "seconds between looks for released messages while a claim waits "
    "(default 0.1)",
    "max_record_bytes": f"largest encoded snapshot saved (default {DEFAULT_MAX_RECORD_BYTES})",
}
"""flowy's options of a Redis URL (query parameters)."""

CLIENT_OPTIONS = {
    "socket_timeout": "redis-py: seconds a command may take",
    "socket_connect_timeout": "redis-py: seconds a connection may take",
    "socket_keepalive": "redis-py: TCP keepalive (true/false)",
    "health_check_interval": "redis-py: seconds between connection health checks",
    "max_connections": "redis-py: connection pool size",
    "client_name": "redis-py: CLIENT SETNAME of each connection",
    "ssl_cert_reqs": "redis-py (rediss): none, optional or required",
    "ssl_ca_certs": "redis-py (rediss): CA bundle file",
    "ssl_certfile": "redis-py (rediss): client certificate file",
    "ssl_keyfile": "redis-py (rediss): client key file",
    "ssl_check_hostname": "redis-py (rediss): check the server's host name (true/false)",
}
"""redis-py's options a Redis URL may carry; they go to the client as they are."""


class _LiveChannels:
    """The backend's one pub/sub connection for watchers of its threads: a channel per
    watched thread (the namespace and a hash of the thread id), each fanned out to the
    inboxes of the watchers in this process by one reading task."""

    def __init__(self, client: RedisClient, namespace: str) -> None:
        self._client = client
        self._namespace = namespace
        self._pubsub: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._inboxes: dict[bytes, set[Inbox]] = {}
        self._lock = asyncio.Lock()
        self._pongs: dict[bytes, asyncio.Future[None]] = {}

    def channel(self, thread_id: str) -> bytes:
        digest = hashlib.sha256(thread_id.encode()).hexdigest()[:40]
        return f"{self._namespace}:live:{digest}".encode()

    async def _read(self) -> None:
        pubsub = self._pubsub
        while True:
            try:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the connection dropped: try again shortly
                await asyncio.sleep(0.5)
                continue
            if message is None:
                continue
            if message.get("type") == "pong":
                waiter = self._pongs.pop(message["data"], None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)
                continue
            if message.get("type") != "message":
                continue
            channel, data = message["channel"], message["data"]
            for inbox in tuple(self._inboxes.get(channel, ())):
                inbox.put(data)

    async def subscribe(self, channel: bytes, inbox: Inbox) -> Callable[[], Awaitable[None]]:
        async with self._lock:
            if self._pubsub is None:
                client: Any = self._client
                self._pubsub = client.pubsub()
            inboxes = self._inboxes.setdefault(channel, set())
            if not inboxes:
                try:
                    await self._pubsub.subscribe(channel)
                except BaseException:
                    del self._inboxes[channel]
                    raise
            inboxes.add(inbox)
            if self._reader is None or self._reader.done():
                self._reader = asyncio.get_running_loop().create_task(self._read())
        inbox.sync = self._sync

        async def stop() -> None:
            async with self._lock:
                inboxes = self._inboxes.get(channel)
                if inboxes is None:
                    return
                inboxes.discard(inbox)
                if inboxes:
                    return
                del self._inboxes[channel]
                with contextlib.suppress(Exception):
                    await self._pubsub.unsubscribe(channel)

        return stop

    async def _sync(self) -> None:
        # Redis answers a PING on the subscribed connection after the messages it
        # pushed before: once the reader sees the answer, they are in the inboxes.
        pubsub = self._pubsub
        if pubsub is None:
            return
        token = os.urandom(8).hex().encode()
        waiter = self._pongs[token] = asyncio.get_running_loop().create_future()
        try:
            await pubsub.execute_command("PING", token)
            await asyncio.wait_for(waiter, 5.0)
        except Exception:  # noqa: BLE001 - progress is best effort; snapshots go on
            return
        finally:
            self._pongs.pop(token, None)

    async def aclose(self) -> None:
        async with self._lock:
            reader, self._reader = self._reader, None
            pubsub, self._pubsub = self._pubsub, None
            self._inboxes.clear()
        if reader is not None:
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader
        if pubsub is not None:
            with contextlib.suppress(Exception):
                await pubsub.aclose()


class RedisBackend(BaseBackend[S], Generic[S]):
    """A Redis store (standalone or Cluster): ``checkpointer``, ``leases``, ``outbox``
    and ``consumer`` over one client and one namespace.

    ``flowy.connect("redis://...")`` builds one with its own client (closed by
    ``aclose``); :meth:`from_client` uses the application's client (left open). The
    namespace's layout is recorded on first use; every client of a namespace uses the
    same ``shards``.

    Args:
        client: a ``redis.asyncio.Redis`` or ``RedisCluster`` (``decode_responses=False``).
        namespace: the prefix of every key (no ``{`` or ``}``).
        shards: the number of hash tags (and outbox shards) of the namespace.
        codec: the state codec (JSON by default; a runner gives a typed graph's type).
        completed_ttl: seconds after which threads saved completed or failed expire
            (head and history); ``None`` keeps them until deleted.
        max_record_bytes: the largest encoded snapshot a save accepts.
        group: the outbox consumer group.
        consumer: this process's consumer name (unique by default).
        max_attempts: deliveries after which a hand-off message is dead-lettered.
        poll_interval: seconds between looks for released messages while a claim waits.
        url: the URL the backend reaches its store by (default: made from the client).
        owns_client: close the client in ``aclose``.
    """

    round_trips: ClassVar[RoundTrips] = RoundTrips(segment=1, handoff=2)
    """A leased segment takes its lease and reads the head in one script, and its last
    save releases the lease in the save's own script; a hand-off a ``Worker`` resumes is
    also acknowledged there (the message lives in its thread's shard: one hash slot, on
    Redis Cluster too)."""

    def __init__(
        self,
        client: RedisClient,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        shards: int = DEFAULT_SHARDS,
        codec: StateCodec[S] | None = None,
        completed_ttl: float | None = None,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        group: str = "flowy",
        consumer: str | None = None,
        max_attempts: int = 5,
        poll_interval: float = 0.1,
        url: str | None = None,
        owns_client: bool = False,
    ) -> None:
        if completed_ttl is not None and not completed_ttl >= 0.001:
            raise ValueError(
                "completed_ttl must be a number of seconds >= 0.001, or None to keep "
                f"finished threads; got {completed_ttl!r}"
            )
        self.store: Store = Store(client, KeyLayout(namespace, shards), owns_client=owns_client)
        settings = {"namespace": namespace, "shards": shards, "completed_ttl": completed_ttl,
            "max_record_bytes": max_record_bytes, "group": group, "max_attempts": max_attempts,
            "poll_interval": poll_interval}  # fmt: skip
        self.url: str = url or _url_of(client, {k: v for k, v in settings.items() if v is not None})
        # A queue's claim counts across every shard in one script: a standalone server.
        consumer_class = RedisConsumer if self.store.cluster else RedisQueueConsumer
        self.consumer: RedisConsumer = consumer_class(
            self.store,
            group=group,
            consumer=consumer,
            max_attempts=max_attempts,
            poll_interval=poll_interval,
        )
        # A cluster keeps no recency index: its checkpointer says so (Capabilities).
        checkpointer_class = ClusterCheckpointer if self.store.cluster else RedisCheckpointer
        self.checkpointer: RedisCheckpointer[S] = checkpointer_class(
            self.store,
            codec=codec,
            completed_ttl=completed_ttl,
            max_record_bytes=max_record_bytes,
            consumer=self.consumer,  # a resumed run's last save acknowledges its messages
        )
        self.leases: RedisLeaseManager = RedisLeaseManager(self.store)
        self._live = _LiveChannels(client, namespace)
        self.schedules: RedisScheduleStore = RedisScheduleStore(self.store)
        self.outbox: RedisOutbox = RedisOutbox(self.store)

    @classmethod
    def from_client(cls, client: RedisClient, **options: Any) -> RedisBackend[S]:
        """A backend on the application's ``client`` (``aclose`` leaves it open);
        ``options`` are those of the constructor."""
        return cls(client, **options)

    @property
    def client(self) -> RedisClient:
        """The Redis client."""
        return self.store.client

    @property
    def namespace(self) -> str:
        """The prefix of every key."""
        return self.store.layout.namespace

    async def _open(self) -> None:
        await self.store.check_layout()

    async def _setup(self) -> int:
        return await self.store.migrate()

    async def _publish(self, thread_id: str, messages: Sequence[bytes]) -> None:
        channel = self._live.channel(thread_id)
        for message in messages:
            await self.store.execute("send progress", "PUBLISH", channel, message)

    async def _subscribe(self, thread_id: str, inbox: Inbox) -> Callable[[], Awaitable[None]]:
        return await self._live.subscribe(self._live.channel(thread_id), inbox)

    async def _close(self) -> None:
        await self._live.aclose()
        await self.store.aclose()

    def scratch_url(self, name: str) -> str | None:
        """The same server and options with ``namespace=name``."""
        return sibling_url(self.url, options={"namespace": name})

    async def _drop_scratch(self) -> None:
        if not self.namespace.startswith(SCRATCH_PREFIX):  # never an application's keys
            raise RuntimeError(f"namespace {self.namespace!r} is not a scratch namespace")
        await self.purge()

    async def purge(self) -> int:
        """Delete every key of the namespace (tests, decommissioning); the count deleted."""
        return await purge_namespace(self.client, self.namespace)


def _url_of(client: RedisClient, options: dict[str, object]) -> str:
    """A URL reaching the store of ``client`` with ``options`` (for peers and reprs)."""
    if isinstance(client, RedisCluster):
        node = next(iter(client.nodes_manager.startup_nodes.values()))
        scheme, kwargs = "redis+cluster", dict(client.nodes_manager.connection_kwargs)
        where, path = f"{node.host}:{node.port}", ""
    else:
        kwargs = client.connection_pool.connection_kwargs
        scheme, where = "redis", f"{kwargs.get('host')}:{kwargs.get('port')}"
        path = f"/{kwargs.get('db', 0)}"
        kwargs = {**kwargs, "connection_class": client.connection_pool.connection_class}
    if kwargs.get("ssl") or "SSL" in str(kwargs.get("connection_class", "")):
        scheme = scheme.replace("redis", "rediss", 1)
    user, password = kwargs.get("username"), kwargs.get("password")
    if password:
        quoted = urllib.parse.quote(str(password), safe="")
        where = f"{urllib.parse.quote(str(user or ''), safe='')}:{quoted}@{where}"
    return f"{scheme}://{where}{path}?{urllib.parse.urlencode(options)}"


async def open_backend(url: StoreURL, *, codec: StateCodec[Any] | None) -> RedisBackend[Any]:
    """The opener of ``redis://``, ``rediss://``, ``redis+cluster://`` and
    ``rediss+cluster://`` URLs (``flowy.connect``).

    ``redis://[[user]:password@]host:port/db?namespace=...&...``; the options are
    :data:`OPTIONS` and redis-py's :data:`CLIENT_OPTIONS`, which go to the client.
    """
    url.check_options({**OPTIONS, **CLIENT_OPTIONS})
    namespace = url.options.get("namespace", DEFAULT_NAMESPACE)
    try:
        KeyLayout(namespace)
    except ValueError as exc:
        raise BackendURLError(f"option namespace in {url.redacted!r}: {exc}") from None
    cluster = url.scheme.endswith("+cluster")
    client_url = url.driver_url(CLIENT_OPTIONS, scheme=url.scheme.removesuffix("+cluster"))
    retention = StoreURL.MAX_RETENTION_SECONDS
    options: dict[str, Any] = {
        "namespace": namespace,
        "shards": url.count("shards", DEFAULT_SHARDS, maximum=MAX_SHARDS),
        "completed_ttl": url.seconds("completed_ttl", None, minimum=0.001, maximum=retention),
        "max_record_bytes": url.count("max_record_bytes", DEFAULT_MAX_RECORD_BYTES),
        "group": url.options.get("group") or "flowy",
        "consumer": url.options.get("consumer") or None,
        "max_attempts": url.count("max_attempts", 5),
        "poll_interval": url.seconds("poll_interval", 0.1),
    }
    try:
        if cluster:
            if url.path.strip("/") not in ("", "0"):
                raise ValueError("a Redis Cluster has database 0 only")
            client: RedisClient = RedisCluster.from_url(client_url)
        else:
            client = Redis.from_url(client_url)  # pyright: ignore[reportUnknownMemberType]
    except (ValueError, TypeError) as exc:
        raise BackendURLError(f"cannot use {url.redacted!r}: {exc}") from None
    return RedisBackend(client, codec=codec, url=url.raw, owns_client=True, **options)
