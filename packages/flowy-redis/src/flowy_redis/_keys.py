"""The key layout: how a namespace, a thread id and an outbox shard become Redis keys.

Every thread belongs to one of ``shards`` shards, chosen by a stable hash (CRC-32) of
its UTF-8 id. All keys of a thread and the keys of its shard share the shard's hash tag
``{<namespace>:<shard>}``, so one Lua script may touch all of them on Redis Cluster. A
thread's keys end in ``<b64>``, the URL-safe base64 of its id's UTF-8 bytes: an
injective encoding without ``{``, ``}`` or ``:``. The namespace may not contain ``{`` or
``}``, so the shard's tag is always the first braces of every key. Each key and what it
holds (``<ns>:{<ns>:<shard>}:head:<b64>``, ``…:outbox``, ``<ns>:meta``, …): the README's
"Key layout".
"""

from __future__ import annotations

import base64
import re
import zlib
from dataclasses import dataclass

from flowy.storage import HandoffStatus

__all__ = ["DEFAULT_NAMESPACE", "DEFAULT_SHARDS", "KeyLayout", "ShardKeys", "ThreadKeys"]

DEFAULT_NAMESPACE = "flowy"
"""The namespace prefix used when none is given."""

DEFAULT_SHARDS = 16
"""The number of shards (hash tags) of a namespace when none is given."""

MAX_SHARDS = 16384
"""More shards than Redis Cluster has slots would buy nothing."""

STATUS_DIGITS: dict[HandoffStatus, bytes] = {
    status: str(position).encode() for position, status in enumerate(HandoffStatus)
}
"""The first byte of a thread's index member, by hand-off status."""

_CACHE_SIZE = 4096
_ENTRY_ID = re.compile(r"(0|[1-9][0-9]{0,19})-(0|[1-9][0-9]{0,19})")  # canonical only
_SHARD = re.compile(r"0|[1-9][0-9]{0,4}")


@dataclass(frozen=True, slots=True)
class ShardKeys:
    """The keys of one shard (all in one hash slot)."""

    shard: int
    threads: bytes
    exp: bytes
    timers: bytes
    outbox: tuple[bytes, ...]
    """stream, vis, dead, deadix, errs, alias, ids: the outbox scripts' keys."""

    @property
    def stream(self) -> bytes:
        """The outbox stream."""
        return self.outbox[0]


@dataclass(frozen=True, slots=True)
class ThreadKeys:
    """The keys of one thread (all in its shard's hash slot)."""

    shard: ShardKeys
    head: bytes
    hist: bytes
    lease: bytes
    inbox: bytes
    sigids: bytes
    journal: bytes
    checkpoint: tuple[bytes, ...]
    """head, hist, lease, threads, exp, timers, inbox, sigids, journal: the save and
    delete scripts' keys."""


class KeyLayout:
    """Maps thread ids and shards of one namespace to Redis keys.

    Args:
        namespace: the prefix of every key; non-empty, without ``{``, ``}`` or NUL.
        shards: the number of shards (1 to 16384). Every client of a namespace uses the
            same number: it decides which keys a thread lives under.
    """

    __slots__ = ("_cache", "_heads", "_shards", "_tag_prefix", "namespace", "shards")

    def __init__(self, namespace: str = DEFAULT_NAMESPACE, shards: int = DEFAULT_SHARDS) -> None:
        if not isinstance(namespace, str) or not namespace:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f"the Redis namespace must be a non-empty str, got {namespace!r}")
        if "{" in namespace or "}" in namespace or "\x00" in namespace:
            raise ValueError(
                f"the Redis namespace {namespace!r} contains '{{', '}}' or NUL; these would "
                "change the hash tag of every key. Choose a namespace without them."
            )
        if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= MAX_SHARDS:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(
                f"shards must be an int from 1 to {MAX_SHARDS}, got {shards!r}; every client "
                "of a namespace must use the same value"
            )
        self.namespace: str = namespace
        self.shards: int = shards
        ns = namespace.encode("utf-8")
        self._tag_prefix = ns + b":{" + ns + b":"
        self._shards = tuple(self._build_shard(i) for i in range(shards))
        self._heads = tuple(self._base(i) + b"head:" for i in range(shards))
        self._cache: dict[str, ThreadKeys] = {}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, KeyLayout):
            return NotImplemented
        return (self.namespace, self.shards) == (other.namespace, other.shards)

    def __hash__(self) -> int:
        return hash((self.namespace, self.shards))

    def __repr__(self) -> str:
        return f"KeyLayout(namespace={self.namespace!r}, shards={self.shards})"

    @property
    def meta(self) -> bytes:
        """The key recording the namespace's layout."""
        return self.namespace.encode("utf-8") + b":meta"

    @property
    def queues(self) -> bytes:
        """The prefix of the keys of the namespace's queues (limits, messages in flight,
        starts), all in the hash slot of the tag ``{<ns>:queues}``."""
        return self._tag_prefix + b"queues}:"

    @property
    def recent(self) -> bytes:
        """The namespace's recency index (standalone only): a sorted set of thread ids
        scored by each head's save second, in the hash slot of ``{<ns>:recent}``."""
        return self._tag_prefix + b"recent}"

    def pattern(self, kind: bytes = b"") -> bytes:
        """A ``SCAN MATCH`` pattern for the namespace's keys of ``kind`` (every key but
        ``meta`` when empty), and no key of another namespace."""
        escaped = bytearray()
        for byte in self._tag_prefix:
            if byte in b"*?[]\\":
                escaped += b"\\"
            escaped.append(byte)
        return bytes(escaped) + (b"*}:" + kind + b"*" if kind else b"*")

    def _base(self, shard: int) -> bytes:
        return self._tag_prefix + str(shard).encode() + b"}:"

    def _build_shard(self, shard: int) -> ShardKeys:
        base = self._base(shard)
        names = (b"outbox", b"vis", b"dead", b"deadix", b"errs", b"alias", b"ids")
        return ShardKeys(
            shard,
            base + b"threads",
            base + b"exp",
            base + b"timers",
            tuple(base + name for name in names),
        )

    def shard_of(self, thread_id: str) -> int:
        """The shard of ``thread_id`` (stable across processes and versions)."""
        return zlib.crc32(thread_id.encode("utf-8")) % self.shards

    def shard(self, shard: int) -> ShardKeys:
        """The keys of shard ``shard``."""
        return self._shards[shard]

    def all_shards(self) -> tuple[ShardKeys, ...]:
        """The keys of every shard, in shard order."""
        return self._shards

    def head_of(self, raw_id: bytes) -> tuple[int, bytes]:
        """The shard and head key of the thread whose id is ``raw_id`` (UTF-8); not
        cached, so a listing does not push the threads being saved out of the cache."""
        shard = zlib.crc32(raw_id) % self.shards
        return shard, self._heads[shard] + base64.urlsafe_b64encode(raw_id)

    def thread(self, thread_id: str) -> ThreadKeys:
        """The keys of ``thread_id`` (already validated)."""
        keys = self._cache.get(thread_id)
        if keys is None:
            if len(self._cache) >= _CACHE_SIZE:
                self._cache.clear()  # a run saves one thread many times: recent ids win
            raw = thread_id.encode("utf-8")
            shard = self._shards[zlib.crc32(raw) % self.shards]
            member = base64.urlsafe_b64encode(raw)
            base = self._base(shard.shard)
            kinds = (b"head:", b"hist:", b"lease:", b"inbox:", b"sigids:", b"journal:")
            head, hist, lease, inbox, sigids, journal = (base + k + member for k in kinds)
            checkpoint = (head, hist, lease, shard.threads, shard.exp, shard.timers)
            keys = ThreadKeys(
                shard,
                head,
                hist,
                lease,
                inbox,
                sigids,
                journal,
                (*checkpoint, inbox, sigids, journal),
            )
            self._cache[thread_id] = keys
        return keys

    @staticmethod
    def message_id(shard: int, entry_id: bytes | str) -> str:
        """The public id of an outbox message: ``"<shard>:<first stream entry id>"``."""
        entry = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
        return f"{shard}:{entry}"

    def parse_message_id(self, message_id: str) -> tuple[ShardKeys, str] | None:
        """The shard and entry id of a message id this layout made, else ``None``."""
        shard_text, sep, entry = message_id.partition(":")
        if not sep or not _SHARD.fullmatch(shard_text) or not _ENTRY_ID.fullmatch(entry):
            return None
        shard = int(shard_text)
        return (self._shards[shard], entry) if shard < self.shards else None
