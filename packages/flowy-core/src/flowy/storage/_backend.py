"""The base of a store object, and the parsed form of the URLs ``flowy.connect`` opens.

A store's ``Backend`` holds its four components and owns their shared resources (a
connection, a pool, a client): :class:`BaseBackend` gives every store the same
lifecycle (``open`` on connect, ``setup``, ``aclose``, ``async with``), one check of
the schema version a store records (one message on every store), and a repr that never
shows a password. :class:`StoreURL` parses ``scheme://…?option=value`` and
checks options the same way for every store.
"""

from __future__ import annotations

import abc
import asyncio
import functools
import logging
import urllib.parse
import warnings
from collections import deque
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Hashable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ClassVar, Generic, Self, TypeVar, cast

from .._errors import BackendURLError, SchemaVersionError
from .._types import S
from ._capabilities import Capabilities, RoundTrips
from ._derive import derive_capabilities
from ._limits import Limits
from ._queue_admin import Queues, queues_of
from ._watch import HUB, Inbox, WatchEvent, encode_progress, follow_thread, subscribe_hub

_log = logging.getLogger("flowy")

_LIVE_QUEUE = 1024
"""Progress events a backend holds for its channel before it drops the oldest."""

__all__ = ["BaseBackend", "StoreURL", "redact_url"]

V = TypeVar("V")


def redact_url(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``.

    A URL too malformed to parse still loses everything between the first ``:`` of its
    authority and its last ``@``: over-masking is fine, printing a password is not.
    """
    try:
        parts = urllib.parse.urlsplit(url)
        password = parts.password
    except ValueError:
        return _mask_userinfo(url)
    if not parts.scheme:
        return _mask_userinfo(url)
    if password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    netloc = f"{user}:***@{host}" + (f":{port}" if port is not None else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def _mask_userinfo(url: str) -> str:
    start = url.find("//") + 2 if "//" in url else 0
    at = url.rfind("@")
    colon = url.find(":", start)
    if at < start or colon < 0 or colon > at:
        return url
    return f"{url[: colon + 1]}***{url[at:]}"


def _flag(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true/false, got {text!r}")


MAX_OPTION_SECONDS = 366 * 24 * 3600.0
"""The largest number of seconds a URL option takes (366 days)."""
MAX_OPTION_COUNT = 2**31 - 1
"""The largest whole number a URL option takes."""


MAX_RETENTION_SECONDS = 100 * 365.25 * 24 * 3600
"""The largest number of seconds a retention option (how long a finished thread is
kept) takes: 100 years."""


def _seconds(text: str, maximum: float, minimum: float | None) -> float:
    value = float(text)
    low = value > 0 if minimum is None else value >= minimum
    if not (low and value <= maximum):  # NaN and infinities fail too
        least = "a positive number" if minimum is None else f"a number from {minimum:g}"
        raise ValueError(f"expected {least} of seconds up to {maximum:.0f}, got {text[:40]!r}")
    return value


def _count(text: str, maximum: int = MAX_OPTION_COUNT) -> int:
    stripped = text.strip()
    if len(stripped) > 12 or not (stripped.isdecimal() and 1 <= int(stripped) <= maximum):
        raise ValueError(f"expected a whole number from 1 to {maximum}, got {text[:40]!r}")
    return int(stripped)


def _check_ports(url: str, netloc: str) -> None:
    """``BackendURLError`` unless every host's port (``host:port``, comma-separated for
    several hosts) is a number from 1 to 65535."""
    hosts = netloc.rpartition("@")[2]
    for host in hosts.split(","):
        port = host.rpartition("]")[2] if host.startswith("[") else host
        if ":" not in port:
            continue
        text = port.rpartition(":")[2]
        if text == "":
            continue
        if not (text.isdecimal() and len(text) <= 5 and 1 <= int(text) <= 65535):
            raise BackendURLError(
                f"{redact_url(url)!r:.200} has the port {text[:20]!r}; a port is a number "
                "from 1 to 65535"
            )


@dataclass(frozen=True)
class StoreURL:
    """A store URL split into its parts, with its query options checked.

    ``options`` holds each query option once (a repeated option is an error).
    """

    raw: str
    """The URL as given, password included (show :attr:`redacted` instead)."""
    scheme: str
    """The scheme, lowercased (``sqlite``, ``postgresql``, …)."""
    netloc: str
    """What follows ``//`` up to the path: user, password, host and port."""
    path: str
    """The path, still percent-encoded (``/flowy.db``)."""
    options: Mapping[str, str]

    MAX_SECONDS: ClassVar[float] = MAX_OPTION_SECONDS
    """The largest number of seconds :meth:`seconds` takes unless told (366 days)."""
    MAX_RETENTION_SECONDS: ClassVar[float] = MAX_RETENTION_SECONDS
    """The bound of an option saying how long a finished thread is kept (100 years)."""
    MAX_COUNT: ClassVar[int] = MAX_OPTION_COUNT
    """The largest whole number :meth:`count` takes (2**31 - 1)."""

    @classmethod
    def parse(cls, url: str) -> StoreURL:
        """Split ``url``; ``BackendURLError`` if it is not ``scheme://…``."""
        if not isinstance(url, str):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise BackendURLError(f"a store URL must be a str, got {type(url).__name__}")
        try:
            parts = urllib.parse.urlsplit(url)
            query = urllib.parse.parse_qsl(
                parts.query, keep_blank_values=True, strict_parsing=False
            )
        except ValueError as exc:
            raise BackendURLError(
                f"cannot parse the store URL {redact_url(url)!r}: {exc}"
            ) from None
        if not parts.scheme or "://" not in url:
            raise BackendURLError(
                f"{redact_url(url)!r} is not a store URL; expected scheme://..., e.g. "
                "memory://, sqlite:///flowy.db, postgresql://host/db, redis://host, "
                "dynamodb://TABLE?region=..."
            )
        _check_ports(url, parts.netloc)
        options: dict[str, str] = {}
        for name, value in query:
            if name in options:
                raise BackendURLError(f"option {name!r} is given twice in {redact_url(url)!r}")
            options[name] = value
        if "port" in options:  # a driver's own option (PostgreSQL): host:port pairs too
            _check_ports(url, ",".join(":" + p for p in options["port"].split(",")))
        return cls(url, parts.scheme.lower(), parts.netloc, parts.path, options)

    @staticmethod
    def mask_password(text: str, url: str) -> str:
        """``text`` (say, a driver's message about ``url``) with ``url``'s password, if
        any, replaced by ``***`` wherever it appears."""
        try:
            password = urllib.parse.urlsplit(url).password
        except ValueError:
            return text
        return text.replace(password, "***") if password else text

    @property
    def redacted(self) -> str:
        """The URL with its password masked (what errors, logs and reprs show)."""
        return redact_url(self.raw)

    def without_options(self) -> str:
        """The URL without its query string (password kept: for the driver only)."""
        return self.driver_url()

    def driver_url(self, keep: Collection[str] = (), *, scheme: str | None = None) -> str:
        """The URL a driver connects with: password kept, only the query options named
        in ``keep`` (the driver's own), and ``scheme`` instead of the URL's if given."""
        parts = urllib.parse.urlsplit(self.raw)
        query = urllib.parse.urlencode({k: v for k, v in self.options.items() if k in keep})
        return urllib.parse.urlunsplit(
            parts._replace(scheme=scheme or parts.scheme, query=query, fragment="")
        )

    def check_options(self, known: Mapping[str, str]) -> None:
        """``BackendURLError`` naming the unknown options and the known ones
        (``known`` maps each option to a one-line description)."""
        unknown = sorted(set(self.options) - set(known))
        if unknown:
            listing = ", ".join(f"{name} ({what})" for name, what in sorted(known.items()))
            raise BackendURLError(
                f"unknown option(s) {', '.join(unknown)} in {self.redacted!r}; "
                f"{self.scheme}:// accepts: {listing or 'no options'}"
            )

    def option(self, name: str, convert: Callable[[str], V], default: V) -> V:
        """The converted value of option ``name``, or ``default``.

        Args:
            name: the query option.
            convert: turns its text into the value; raises ``ValueError`` for a bad one.
            default: the value when the URL does not give the option.

        Raises:
            BackendURLError: ``convert`` refused the text (the message names the option).
        """
        text = self.options.get(name)
        if text is None:
            return default
        try:
            return convert(text)
        except ValueError as exc:
            raise BackendURLError(f"option {name}={text!r} in {self.redacted!r}: {exc}") from None

    def flag(self, name: str, default: bool) -> bool:
        """The boolean option ``name`` (1/0, true/false, yes/no, on/off), or ``default``;
        any other text is a ``BackendURLError``."""
        return self.option(name, _flag, default)

    def seconds(
        self,
        name: str,
        default: V,
        *,
        maximum: float = MAX_OPTION_SECONDS,
        minimum: float | None = None,
    ) -> float | V:
        """The option ``name`` as a positive number of seconds (at least ``minimum`` if
        given) up to ``maximum`` (366 days unless given), or ``default``; any other text
        is a ``BackendURLError``."""
        return self.option(name, lambda text: _seconds(text, maximum, minimum), default)

    def count(self, name: str, default: int, *, maximum: int = MAX_OPTION_COUNT) -> int:
        """The option ``name`` as a whole number from 1 to ``maximum`` (2**31 - 1 unless
        given), or ``default``; any other text is a ``BackendURLError``."""
        return self.option(name, lambda text: _count(text, maximum), default)


@functools.cache
def _channel_of(cls: type) -> bool:
    """True if backends of ``cls`` implement the progress channel's two primitives."""
    return all(
        getattr(cls, name) is not getattr(BaseBackend, name) for name in ("_publish", "_subscribe")
    )


class BaseBackend(abc.ABC, Generic[S]):
    """One store: ``checkpointer``, ``leases``, ``outbox`` and ``consumer`` in one
    coordination domain, with their shared resources.

    Subclasses set ``url``, build the four components in ``__init__`` (subclasses of
    the other bases, as attributes of those names) and implement :meth:`_open`,
    :meth:`_setup` and :meth:`_close`. ``flowy.connect`` calls :meth:`open`, which
    creates the schema of a new store (an older schema needs an explicit
    :meth:`setup`); both check the recorded version with :meth:`check_schema_version`.
    """

    url: str

    round_trips: ClassVar[RoundTrips] = RoundTrips()
    """The round trips each operation costs on this store (``RoundTripSuite`` counts
    them); a store whose primitives take more than one declares its own."""

    _closed: bool = False
    _opened: bool = False
    _scratch: bool = False
    _live_queue: deque[tuple[str, bytes]] | None = None
    _live_task: asyncio.Task[None] | None = None
    progress_dropped: int = 0
    """Progress events dropped before they reached the store's channel (it fell
    behind, or a send failed)."""

    @abc.abstractmethod
    async def _open(self) -> None:
        """Connect, and create the schema if the store has none (check its version)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A store written for flowy 0.2 implements _migrate: it still works until 0.4.
        if "_migrate" in vars(cls) and "_setup" not in vars(cls):
            warnings.warn(
                f"{cls.__name__}._migrate is deprecated; name it _setup (flowy 0.4 calls "
                "only _setup)",
                DeprecationWarning,
                stacklevel=2,
            )
            cls._setup = vars(cls)["_migrate"]

    @abc.abstractmethod
    async def _setup(self) -> int:
        """Create or upgrade the schema (idempotent, safe from several processes at
        once); return its version. Called on a backend that may not be open."""

    @abc.abstractmethod
    async def _close(self) -> None:
        """Release the resources this backend opened (not those it was given)."""

    async def open(self) -> Self:
        """Connect and set the store up (``flowy.connect`` and ``async with`` do this);
        returns ``self``. Idempotent; on failure the backend is closed."""
        if self._opened:
            return self
        try:
            await self._open()
        except BaseException:
            await self.aclose()
            raise
        self._opened = True
        return self

    async def setup(self) -> int:
        """Create what the store needs (schema, tables, indexes, key layout), or upgrade
        what an older version of its code left; return the schema version now in place.

        Idempotent and safe from several processes at once. It needs no :meth:`open`,
        and works on a backend whose open failed with ``SchemaVersionError`` (an older
        store). Back the store up before an upgrade: older code cannot read the result.
        A store of newer code raises ``SchemaVersionError``.
        """
        return await self._setup()

    async def migrate(self) -> int:
        """Deprecated alias of :meth:`setup` (removed in 0.4)."""
        warnings.warn(
            f"{type(self).__name__}.migrate() is deprecated; use setup()", DeprecationWarning, 2
        )
        return await self.setup()

    @staticmethod
    def check_schema_version(
        found: int, *, known: int, where: str, package: str, upgrade: bool = False
    ) -> bool:
        """Check the schema version a store records: one rule and one message on every
        store. Returns whether there is something to create or upgrade.

        Args:
            found: the version recorded in the store; 0 for a new store (none recorded).
            known: the version this code reads and writes.
            where: what holds the schema, for the message (``"the SQLite database
                'app.db'"``, ``"the flowy tables in schema 'public' (prefix 'flowy_')"``).
            package: the distribution whose code this is (``"flowy-postgres"``).
            upgrade: an older version may be upgraded now (:meth:`setup`).

        Returns:
            ``False`` when ``found`` is ``known``; ``True`` when the store is new, or
            older and ``upgrade`` is given: create or upgrade it then.

        Raises:
            SchemaVersionError: ``found`` is newer than ``known`` (older code must not
                write to it), or older and ``upgrade`` is not given.
        """
        if found == known:
            return False
        if found > known:
            raise SchemaVersionError(
                f"{where} has schema version {found}, newer than version {known} that this "
                f"{package} knows; upgrade {package} to use it (older code must not write to it)"
            )
        if found > 0 and not upgrade:
            raise SchemaVersionError(
                f"{where} has schema version {found}, older than version {known} that this "
                f"{package} uses; stop the clients of the older {package}, back the store up, "
                "then upgrade it once with `await backend.setup()`"
            )
        return True

    async def aclose(self) -> None:
        """Release the store's resources. Idempotent."""
        if self._closed:
            return
        self._closed = True
        task = self._live_task
        if task is not None:
            try:  # send what is queued, briefly; progress is best effort
                await asyncio.wait_for(asyncio.shield(task), 1.0)
            except (TimeoutError, asyncio.CancelledError, Exception):  # noqa: BLE001
                task.cancel()
        await self._close()

    # -- following a thread ----------------------------------------------------------
    async def _publish(self, thread_id: str, messages: Sequence[bytes]) -> None:
        """Send ``messages`` (progress events, in order) on the thread's channel, to
        every process watching it. A store with a channel (PostgreSQL ``NOTIFY``, Redis
        pub/sub) implements it together with :meth:`_subscribe`; without them, progress
        reaches watchers in this process only."""
        raise NotImplementedError(f"{type(self).__name__} has no progress channel")

    async def _subscribe(self, thread_id: str, inbox: Inbox) -> Callable[[], Awaitable[None]]:
        """Put every message later sent on the thread's channel into ``inbox``
        (``inbox.put_threadsafe``), from any process; return the call that stops it."""
        raise NotImplementedError(f"{type(self).__name__} has no progress channel")

    @property
    def _live_domain(self) -> Hashable:
        cp: Any = cast(Any, self).checkpointer
        domain = getattr(cp, "domain", None)
        return domain if domain is not None else id(cp)

    def _has_channel(self) -> bool:
        return _channel_of(type(self))

    def publish_progress(self, thread_id: str, node: str, revision: int, data: object) -> None:
        """Send a progress event of ``thread_id`` to its watchers (what
        ``flowy.live.progress`` calls; it never waits). Where nobody can be listening
        it costs a lookup; else the event is queued for the store's channel, and the
        oldest queued one is dropped when the channel falls behind
        (:attr:`progress_dropped`).

        Args:
            thread_id: the thread the event belongs to.
            node: the node that sent it.
            revision: the thread's revision when it was sent (a watcher reads the
                snapshots up to there before it yields the event).
            data: what the node sent.

        Raises:
            TypeError: ``data`` is not a JSON value.
            ValueError: it is larger than ``flowy.live.MAX_PROGRESS_BYTES`` as JSON.
        """
        if not self._has_channel():
            domain = self._live_domain
            if HUB.listening(domain, thread_id):
                HUB.deliver(domain, thread_id, encode_progress(node, revision, data))
            return
        message = encode_progress(node, revision, data)
        if self._closed:
            self.progress_dropped += 1
            return
        queue = self._live_queue
        if queue is None:
            queue = self._live_queue = deque()
        if len(queue) >= _LIVE_QUEUE:
            queue.popleft()
            self.progress_dropped += 1
        queue.append((thread_id, message))
        if self._live_task is None or self._live_task.done():
            self._live_task = asyncio.get_running_loop().create_task(self._send_progress())

    async def flush_progress(self, within: float = 1.0) -> None:
        """Wait (up to ``within`` seconds) until the progress queued so far is sent:
        a runner calls it before it saves the next snapshot, so watchers hear a node's
        progress before the snapshot that follows it. Never raises."""
        task = self._live_task
        if task is None or task.done():
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), within)
        except (TimeoutError, Exception):  # noqa: BLE001 - progress is best effort
            return

    async def _send_progress(self) -> None:
        queue = self._live_queue
        assert queue is not None
        while queue:
            thread_id, first = queue.popleft()
            batch = [first]
            while queue and queue[0][0] == thread_id and len(batch) < 100:
                batch.append(queue.popleft()[1])
            try:
                await self._publish(thread_id, batch)
            except Exception as exc:  # noqa: BLE001 - progress is best effort
                self.progress_dropped += len(batch)
                _log.warning("flowy: sending progress of %r failed: %r", thread_id[:200], exc)

    def watch(
        self, thread_id: str, *, after: int | None = None, poll: float = 0.2
    ) -> AsyncIterator[WatchEvent[S]]:
        """Follow ``thread_id`` from any process: every saved snapshot, in order of
        revision and without gaps, and the progress events of the process running it;
        ends after the snapshot of a completed or failed run.

        ``after=None`` starts with the thread's current head; ``after=N`` yields every
        snapshot above revision ``N`` that the store still keeps (``after=0``: its whole
        kept history), so a watcher that lost its connection resumes where it was. A
        thread that does not exist yet is waited for; one deleted while watched ends
        the watch.

        Snapshots are read from the store: at once when a progress event says the run
        moved on, else every ``poll`` seconds. Progress travels on the store's channel
        where it has one (``capabilities.live_progress``: PostgreSQL ``LISTEN/NOTIFY``,
        Redis pub/sub); on other stores only progress of runs in this process arrives.
        Progress is ephemeral: a watcher that falls behind drops the oldest.

        Raises:
            InvalidThreadIdError: the thread id is not usable.
            ValueError: ``after`` is negative or ``poll`` is not a positive number.
        """
        if self._has_channel():
            return follow_thread(
                cast(Any, self).checkpointer,
                thread_id,
                after,
                poll,
                lambda inbox: self._subscribe(thread_id, inbox),
            )
        return follow_thread(
            cast(Any, self).checkpointer,
            thread_id,
            after,
            poll,
            lambda inbox: subscribe_hub(self._live_domain, thread_id, inbox),
        )

    async def close(self) -> None:
        """Deprecated alias of :meth:`aclose` (removed in 0.3)."""
        warnings.warn(
            f"{type(self).__name__}.close() is deprecated; use aclose()", DeprecationWarning, 2
        )
        await self.aclose()

    def scratch_url(self, name: str) -> str | None:
        """The URL of a sibling store in a namespace of its own called ``name`` (a
        schema, key namespace, table or file next to this store's), or ``None`` if this
        store cannot make one. Makes no connection and touches nothing.

        ``name`` is lowercase letters, digits and ``_`` (``flowy.storage.dialect.open_scratch``
        draws it from a random run id). Tools that write test data
        (``flowy check --backend``) run there, never in this store's own namespace.
        """
        return None

    async def drop_scratch(self) -> None:
        """Remove everything of this scratch store's namespace, then close it.

        Refused (``RuntimeError``) on a store not opened by
        ``flowy.storage.dialect.open_scratch``: it never removes a store an application uses.
        """
        if not self._scratch:
            raise RuntimeError(
                f"{redact_url(self.url)!r} is not a scratch store; drop_scratch() removes "
                "only stores opened by flowy.storage.dialect.open_scratch"
            )
        try:
            await self._drop_scratch()
        finally:
            await self.aclose()

    async def _drop_scratch(self) -> None:
        """Remove everything of this (scratch) store's namespace: a store whose
        :meth:`scratch_url` gives a URL implements it."""
        raise NotImplementedError(f"{type(self).__name__} has no scratch stores")

    @property
    def capabilities(self) -> Capabilities:
        """What this store can do, derived from the primitives its components implement
        (:class:`flowy.storage.Capabilities`). Runners and workers read it once, when
        they are built."""
        parts: Any = self
        return derive_capabilities(
            parts.checkpointer,
            parts.leases,
            parts.outbox,
            parts.consumer,
            live_progress=self._has_channel(),
            schedules=getattr(self, "schedules", None),  # a store of flowy 0.3 keeps none
        )

    @property
    def closed(self) -> bool:
        """True once :meth:`aclose` was called."""
        return self._closed

    @property
    def queues(self) -> Queues:
        """The store's queues: their limits, changed at run time, and their backlog
        (:class:`flowy.queues.Queues`); ``TypeError`` if the store keeps none
        (``capabilities.queues``)."""
        return queues_of(self)

    @property
    def limits(self) -> Limits:
        """The limits of what the store keeps (``flowy.storage.Limits``): its
        checkpointer's. Pass ``flowy.connect(url, limits=...)``, or set it before
        building runners and workers on the backend (they use the limits it had then)."""
        return cast(Any, self).checkpointer.limits

    @limits.setter
    def limits(self, limits: Limits) -> None:
        if not isinstance(limits, Limits):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"limits must be a flowy.storage.Limits, got {limits!r:.80}")
        cast(Any, self).checkpointer.limits = limits

    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({redact_url(self.url)!r})"
