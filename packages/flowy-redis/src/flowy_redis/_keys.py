"""The key layout: how a namespace, a thread id and an outbox shard become Redis keys.

Every thread belongs to one of ``shards`` outbox shards, chosen by a stable hash (CRC-32)
of its UTF-8 id. All keys of a thread and the keys of its shard share the shard's hash tag
``{<namespace>:<shard>}``, so one Lua script may touch all of them on Redis Cluster::

    <ns>:{<ns>:<shard>}:head:<b64>      hash: revision, pointer, status, reason,
                                        handoff_status, handoff_pending_at, updated_at,
                                        oldest (the oldest history entry kept)
    <ns>:{<ns>:<shard>}:hist:<b64>      hash: revision -> record bytes (the head's record
                                        is the entry at the head's revision)
    <ns>:{<ns>:<shard>}:lease:<b64>     hash: owner, token, exp (µs, server clock), nonces
    <ns>:{<ns>:<shard>}:ix              sorted set of <b64>: the thread index (see below)
    <ns>:{<ns>:<shard>}:outbox          stream of hand-off intents (consumer group)
    <ns>:{<ns>:<shard>}:vis             sorted set: entry id -> visible-again time (ms)
    <ns>:{<ns>:<shard>}:dead            stream of dead letters
    <ns>:{<ns>:<shard>}:deadix          hash: message id -> dead-letter entry id
    <ns>:{<ns>:<shard>}:errs            hash: message id -> last release error
    <ns>:{<ns>:<shard>}:alias           hash: message id -> current entry id (retried)
    <ns>:meta                           hash: the layout (shard count) of the namespace

The index scores a thread ``status * 2**48 + expiry``: ``status`` is the position of its
head's hand-off status in (none, pending, enqueued, orphaned) and ``expiry`` the time in
ms its keys expire (``2**48 - 1`` for never), so one ``ZADD`` moves a thread between
statuses and a score range lists the live threads of one status.

``<b64>`` is the URL-safe base64 of the thread id's UTF-8 bytes (with padding): an
injective encoding whose alphabet has no ``{``, ``}`` or ``:``, so no id can alias another
or escape its prefix or hash tag. The namespace may not contain ``{`` or ``}``, so the
shard's tag is always the first braces of every key.
"""

from __future__ import annotations

import base64
import binascii
import re
import zlib
from dataclasses import dataclass

from flowy.checkpoint import HandoffStatus

__all__ = [
    "DEFAULT_NAMESPACE",
    "DEFAULT_SHARDS",
    "KeyLayout",
    "ShardKeys",
    "ThreadKeys",
    "describe",
]

DEFAULT_NAMESPACE = "flowy"
"""The namespace prefix used when none is given."""

DEFAULT_SHARDS = 16
"""The number of outbox shards (and hash tags) of a namespace when none is given."""

MAX_SHARDS = 16384
"""More shards than Redis Cluster has slots would buy nothing."""

_HANDOFF_ORDER: tuple[HandoffStatus, ...] = (
    HandoffStatus.NONE,
    HandoffStatus.PENDING,
    HandoffStatus.ENQUEUED,
    HandoffStatus.ORPHANED,
)
_CACHE_SIZE = 4096
_ENTRY_ID = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")
_SHARD = re.compile(r"0|[1-9][0-9]{0,4}")


@dataclass(frozen=True, slots=True)
class ThreadKeys:
    """The keys of one thread (all in one hash slot)."""

    shard: int
    member: bytes
    head: bytes
    hist: bytes
    lease: bytes
    index: bytes
    stream: bytes
    checkpoint_keys: tuple[bytes, ...]
    """The keys the save and delete scripts take, in their order."""


@dataclass(frozen=True, slots=True)
class ShardKeys:
    """The keys of one outbox shard (all in one hash slot)."""

    shard: int
    stream: bytes
    vis: bytes
    dead: bytes
    deadix: bytes
    errs: bytes
    alias: bytes
    index: bytes

    @property
    def consumer_keys(self) -> list[bytes]:
        """The keys the consumer scripts take per shard, in their order."""
        return [self.stream, self.vis, self.dead, self.deadix, self.errs, self.alias]


class KeyLayout:
    """Maps thread ids and shards of one namespace to Redis keys.

    Args:
        namespace: the prefix of every key; non-empty, without ``{`` or ``}``.
        shards: the number of outbox shards (1 to 16384). Every client of a namespace
            must use the same number: it decides which keys a thread lives under.
    """

    __slots__ = ("_cache", "_shard_keys", "_tag_prefix", "namespace", "shards")

    def __init__(self, namespace: str = DEFAULT_NAMESPACE, shards: int = DEFAULT_SHARDS) -> None:
        if not isinstance(namespace, str) or not namespace:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f"the Redis namespace must be a non-empty str, got {namespace!r}")
        if "{" in namespace or "}" in namespace or "\x00" in namespace:
            raise ValueError(
                f"the Redis namespace {namespace!r} contains '{{', '}}' or NUL; these would "
                f"change the hash tag of every key. Choose a namespace without them."
            )
        if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= MAX_SHARDS:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(
                f"shards must be an int from 1 to {MAX_SHARDS}, got {shards!r}; every client "
                f"of a namespace must use the same value"
            )
        self.namespace = namespace
        self.shards = shards
        ns = namespace.encode("utf-8")
        self._tag_prefix = ns + b":{" + ns + b":"
        self._shard_keys = tuple(self._build_shard(i) for i in range(shards))
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
    def pattern(self) -> bytes:
        """A ``SCAN MATCH`` pattern for every key of the namespace but ``meta`` (and no
        key of another namespace, even one that starts with this one)."""
        return _glob_escape(self._tag_prefix) + b"*"

    def _base(self, shard: int) -> bytes:
        return self._tag_prefix + str(shard).encode() + b"}:"

    def _build_shard(self, shard: int) -> ShardKeys:
        base = self._base(shard)
        return ShardKeys(
            shard=shard,
            stream=base + b"outbox",
            vis=base + b"vis",
            dead=base + b"dead",
            deadix=base + b"deadix",
            errs=base + b"errs",
            alias=base + b"alias",
            index=base + b"ix",
        )

    def shard_of(self, thread_id: str) -> int:
        """The outbox shard of ``thread_id`` (stable across processes and versions)."""
        return zlib.crc32(thread_id.encode("utf-8")) % self.shards

    def shard(self, shard: int) -> ShardKeys:
        """The keys of outbox shard ``shard``."""
        return self._shard_keys[shard]

    def all_shards(self) -> tuple[ShardKeys, ...]:
        """The keys of every shard, in shard order."""
        return self._shard_keys

    def thread(self, thread_id: str) -> ThreadKeys:
        """The keys of ``thread_id`` (which must already be validated)."""
        keys = self._cache.get(thread_id)
        if keys is None:
            if len(self._cache) >= _CACHE_SIZE:
                self._cache.clear()  # a run saves one thread many times: recent ids win
            keys = self._cache[thread_id] = self._build_thread(thread_id)
        return keys

    def _build_thread(self, thread_id: str) -> ThreadKeys:
        raw = thread_id.encode("utf-8")
        shard = zlib.crc32(raw) % self.shards
        member = base64.urlsafe_b64encode(raw)
        base = self._base(shard)
        keys = self._shard_keys[shard]
        head, hist, lease = (
            base + b"head:" + member,
            base + b"hist:" + member,
            base + b"lease:" + member,
        )
        return ThreadKeys(
            shard=shard,
            member=member,
            head=head,
            hist=hist,
            lease=lease,
            index=keys.index,
            stream=keys.stream,
            checkpoint_keys=(head, hist, lease, keys.index),
        )

    @staticmethod
    def decode_member(member: bytes) -> str:
        """The thread id a sorted-set member names (inverse of the key encoding)."""
        try:
            return base64.urlsafe_b64decode(member).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
            raise ValueError(f"{member!r} is not an encoded thread id") from exc

    @staticmethod
    def index_position(status: HandoffStatus) -> int:
        """The position of ``status`` in the index score (0 to 3)."""
        return _HANDOFF_ORDER.index(status)

    def message_id(self, shard: int, entry_id: bytes | str) -> str:
        """The public id of an outbox message: ``"<shard>:<first stream entry id>"``."""
        entry = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
        return f"{shard}:{entry}"

    def parse_message_id(self, message_id: object) -> tuple[int, str] | None:
        """``(shard, entry id)`` of a message id this layout made, else ``None``."""
        if not isinstance(message_id, str):
            return None
        shard_text, sep, entry = message_id.partition(":")
        if not sep or not _SHARD.fullmatch(shard_text) or not _ENTRY_ID.fullmatch(entry):
            return None
        shard = int(shard_text)
        if shard >= self.shards:
            return None
        return shard, entry


def describe(thread_id: str) -> str:
    """``repr`` of a thread id for messages, shortened when it is very long."""
    if len(thread_id) <= 120:
        return repr(thread_id)
    return f"{thread_id[:100]!r}... ({len(thread_id)} characters)"


def _glob_escape(raw: bytes) -> bytes:
    out = bytearray()
    for byte in raw:
        if byte in b"*?[]\\":
            out += b"\\"
        out.append(byte)
    return bytes(out)
