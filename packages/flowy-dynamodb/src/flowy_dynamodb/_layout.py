"""The layout of the table every component of a store shares: its keys, attribute names
and indexes, the marshalling of values, and the placeholders of expressions.

Items, keyed by the string partition key ``pk`` and sort key ``sk``::

    pk                                  sk                  item
    thread#<id> or thread-sha256#<hex>  head                a thread's head and its lease
    (same)                              rev#<20 digits>     one history entry
    (same)                              outbox#<20 digits>  the hand-off message of that
                                                            committed revision, with its
                                                            route
    (same)                              sig#<20 digits>     one signal of the inbox
    (same)                              sigid#<signal id>   the number of the signal sent
                                                            with that id
    (same)                              act#<key>           one activity journal entry
    flowy#schema                        version             the schema version
    flowy#schedules                     sched#<name>        one durable schedule
    flowy#queues                        queue#<name>        a queue's limits, its claims in
                                                            flight and its recent starts

A signal id or activity key whose sort key would pass 1 KiB is hashed instead:
``sigid-sha256#<hex>``, ``act-sha256#<hex>`` (the item keeps it in full).

Five sparse global secondary indexes: ``heads`` (``list_key``: hand-off status and
shard; ``list_sort``: the thread id) lists heads in thread-id order; ``outbox``
(``live_key``: shard; ``visible_at``) lists the live messages; ``queues``
(``queue_key``: queue and shard; ``queue_order``: priority, then enqueue time) holds
each queue's live messages in claim order;
``dead_letters`` (``dead_key``, ``dead_at``) lists dead letters oldest first;
``timers`` (``timer_shard``: shard; ``wake_at``) finds the heads due to wake up.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any, cast

from flowy.errors import SnapshotEnvelopeInvalidError
from flowy.storage.dialect import show_id

__all__ = ["MAX_ITEM_BYTES", "A", "Expression", "thread_key"]

Item = dict[str, Any]

PK, SK, HEAD_SK, HISTORY, MESSAGE = "pk", "sk", "head", "rev#", "outbox#"
SIGNAL, SIGNAL_IDS, ACTIVITIES = "sig#", "sigid", "act"
"""Sort key prefixes: a signal, and every signal id and journal entry (whose keys are
``sigid#<id>`` / ``sigid-sha256#<hex>`` and ``act#<key>`` / ``act-sha256#<hex>``)."""
SCHEMA_KEY: Item = {PK: {"S": "flowy#schema"}, SK: {"S": "version"}}
TTL = "expires"
THREADS_INDEX, OUTBOX_INDEX, DEAD_INDEX = "heads", "outbox", "dead_letters"
TIMERS_INDEX, QUEUES_INDEX = "timers", "queues"
QUEUES_PK = "flowy#queues"
"""The partition of the queue items (``queue#<name>``)."""
SHARDS = 8
MAX_ITEM_BYTES = 400 * 1024
"""DynamoDB's item size limit (attribute names included)."""
MAX_KEY_BYTES = 1024
"""DynamoDB's limit on a sort key (and on an index's sort key), in UTF-8 bytes."""
MAX_NUMBER, MIN_NUMBER = 1e38, 1e-129
"""The magnitudes of the floats :func:`n` writes as DynamoDB numbers exactly: zero, or at
least ``MIN_NUMBER`` (DynamoDB's smallest is 1E-130) and below ``MAX_NUMBER`` (in plain
notation a larger float has more than DynamoDB's 38 significant digits)."""
MAX_SEQ = 10**20 - 1
"""The largest signal number a 20-digit sort key holds."""


class A:
    """Attribute names: of heads and history entries, leases, messages."""

    THREAD_ID, REVISION, RECORD, WRITE_TX = "thread_id", "revision", "record", "write_tx"
    POINTER, STATUS, REASON, UPDATED = "pointer", "status", "reason", "updated_at"
    HANDOFF, HANDOFF_AT = "handoff_status", "handoff_pending_at"
    LIST_KEY, LIST_SORT = "list_key", "list_sort"
    OWNER, EXPIRES, TOKEN = "lease_owner", "lease_expires_at", "lease_token"
    PAYLOAD, ATTEMPTS, ERROR, ENQUEUED = "payload", "attempts", "error", "enqueued_at"
    LIVE, VISIBLE, DEAD, DEAD_AT = "live_key", "visible_at", "dead_key", "dead_at"
    TIMER, WAKE, GRAPH_VERSION = "timer_shard", "wake_at", "graph_version"
    SEQ, SIGNAL_ID, KEY, DATA = "seq", "signal_id", "activity_key", "data"
    QUEUE, PARTITION, PRIORITY = "queue", "partition", "priority"
    QUEUE_KEY, QUEUE_ORDER = "queue_key", "queue_order"
    IN_FLIGHT, COUNTED_IN = "in_flight_until", "counted_in"
    LIMITS, FLYING, STARTS, VERSION = "limits", "flying", "starts", "version"
    SUMMARY = (
        *(THREAD_ID, REVISION, POINTER, STATUS, REASON, HANDOFF, HANDOFF_AT, UPDATED, WAKE),
        GRAPH_VERSION,
    )
    """The head attributes a listing reads (the ``heads`` index carries them), in the
    order of ``BaseCheckpointer.summary``'s arguments."""


def thread_key(thread_id: str) -> str:
    """The partition key of a thread: ``thread#`` + the id up to 1 KiB of UTF-8, else
    ``thread-sha256#`` + the SHA-256 of the id (every item keeps the full id too)."""
    raw = thread_id.encode("utf-8")
    if len(raw) <= 1024:
        return "thread#" + thread_id
    return "thread-sha256#" + hashlib.sha256(raw).hexdigest()


def sort_key(thread_id: str) -> str:
    """The id cut to the 1 KiB an index sort key holds. UTF-8 order is code point order
    and a cut never swaps two ids, so the index order is the id order up to ties."""
    return thread_id.encode("utf-8")[:1024].decode("utf-8", "ignore")


def shard_of(text: str) -> int:
    """A stable shard in ``range(SHARDS)``."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:4], "big") % SHARDS


def head_key(thread_id: str) -> Item:
    """The key of a thread's head item."""
    return {PK: {"S": thread_key(thread_id)}, SK: {"S": HEAD_SK}}


def entry_key(thread_id: str, prefix: str, revision: int) -> Item:
    """The key of a thread's history entry (``HISTORY``) or message (``MESSAGE``)."""
    return {PK: {"S": thread_key(thread_id)}, SK: {"S": f"{prefix}{revision:020d}"}}


def named_key(thread_id: str, prefix: str, name: str) -> Item:
    """The key of a thread's item named ``name`` (a signal id, an activity key):
    ``<prefix>#<name>`` when that fits a sort key, else ``<prefix>-sha256#`` + the SHA-256
    of the name (the item keeps the full name). The two forms never alias."""
    sk = f"{prefix}#{name}"
    if len(sk.encode("utf-8")) > MAX_KEY_BYTES:
        sk = f"{prefix}-sha256#{hashlib.sha256(name.encode('utf-8')).hexdigest()}"
    return {PK: {"S": thread_key(thread_id)}, SK: {"S": sk}}


def queue_key(queue: str, pk: str) -> str:
    """The ``queue_key`` of a message of ``queue`` in the partition ``pk``: the queue and
    the shard of ``pk`` (a queue name never holds ``#``)."""
    return f"{queue}#{shard_of(pk)}"


def queue_order(priority: int, enqueued_at: float) -> str:
    """The ``queue_order`` of a message: its priority, then its enqueue time, both fixed
    width, so string order is claim order."""
    return f"{priority:010d}#{enqueued_at:020.6f}"


def message_id(item: Item) -> str:
    """The message id of a message item: its sort key, ``|``, its partition key."""
    return f"{item[SK]['S']}|{item[PK]['S']}"  # a sort key never holds "|"


def message_key(message_id: str) -> Item | None:
    """The key of the message ``message_id`` names (``None``: no id of ours)."""
    sk, sep, pk = message_id.partition("|")
    if not sep or not sk.startswith(MESSAGE) or not pk.startswith(("thread", "legacy#")):
        return None
    return {PK: s(pk), SK: s(sk)}


def key_of(item: Item) -> Item:
    """The key (``pk`` and ``sk``) of ``item``."""
    return {PK: item[PK], SK: item[SK]}


def storable(value: float) -> bool:
    """True if :func:`n` writes ``value`` as a DynamoDB number exactly."""
    return math.isfinite(value) and (value == 0 or MIN_NUMBER <= abs(value) < MAX_NUMBER)


def n(value: float) -> dict[str, str]:
    """A number attribute value (plain decimal notation)."""
    if isinstance(value, int):
        return {"N": str(value)}
    if not math.isfinite(value):
        raise ValueError(f"DynamoDB cannot store the number {value!r}")
    return {"N": format(Decimal(repr(value)), "f")}


def s(value: str) -> dict[str, str]:
    """A string attribute value."""
    return {"S": value}


def _raw(item: Mapping[str, Any] | None, name: str, kind: str) -> Any:
    value = (item or {}).get(name)
    return cast(Mapping[str, Any], value).get(kind) if isinstance(value, dict) else None


def get_s(item: Mapping[str, Any] | None, name: str) -> str | None:
    """String attribute ``name``, or ``None``."""
    raw = _raw(item, name, "S")
    return None if raw is None else str(raw)


def get_text(item: Mapping[str, Any] | None, name: str) -> str | None:
    """String or number attribute ``name`` as text, or ``None``."""
    raw = _raw(item, name, "S")
    raw = _raw(item, name, "N") if raw is None else raw
    return None if raw is None else str(raw)


def get_n(item: Mapping[str, Any] | None, name: str) -> Decimal | None:
    """Number attribute ``name``, or ``None``."""
    raw = _raw(item, name, "N")
    return None if raw is None else Decimal(str(raw))


def get_int(item: Mapping[str, Any] | None, name: str) -> int | None:
    """Number attribute ``name`` as an int, or ``None``."""
    raw = get_n(item, name)
    return None if raw is None else int(raw)


def get_b(item: Mapping[str, Any] | None, name: str) -> bytes | None:
    """Binary attribute ``name``, or ``None``."""
    raw = _raw(item, name, "B")
    return None if raw is None else bytes(raw)


def item_size(item: Mapping[str, Any]) -> int:
    """A never smaller estimate of an item's size as DynamoDB counts it (names and
    values, every number at its 21-byte maximum)."""
    total = 0
    for name, value in item.items():
        ((kind, raw),) = cast(Mapping[str, Any], value).items()
        size = 21 if kind == "N" else len(raw) if kind == "B" else len(str(raw).encode())
        total += len(name.encode()) + size
    return total


def check_stored_id(thread_id: str, item: Mapping[str, Any] | None) -> None:
    """``SnapshotEnvelopeInvalidError`` if ``item`` is stored for another thread id."""
    stored = get_s(item, A.THREAD_ID)
    if stored is not None and stored != thread_id:
        raise SnapshotEnvelopeInvalidError(
            f"the item for thread {show_id(thread_id)} names thread {show_id(stored)}: it "
            "does not match its key (written by something else, or corrupt)"
        )


def number_in(item: Item, prefix: str) -> int:
    """The number in ``item``'s sort key after ``prefix`` (a history entry's revision, a
    signal's number); ``SnapshotEnvelopeInvalidError`` if there is none."""
    sk = get_s(item, SK) or ""
    try:
        return int(sk.removeprefix(prefix))
    except ValueError:
        raise SnapshotEnvelopeInvalidError(
            f"the item {sk!r} has no number after {prefix!r}"
        ) from None


class Expression:
    """The placeholders of one request: names as ``#name``, values as ``:v0``, ``:v1``…;
    nothing is spliced into the expression text."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.values: dict[str, Any] = {}

    def __call__(self, attribute: str) -> str:
        """The placeholder of an attribute name (all of ours are identifiers)."""
        self.names["#" + attribute] = attribute
        return "#" + attribute

    def key(self, name: str) -> str:
        """A new placeholder for a name that need not be an identifier (a map key)."""
        label = f"#k{len(self.names)}"
        self.names[label] = name
        return label

    def v(self, value: Mapping[str, Any]) -> str:
        """A new placeholder bound to the attribute value ``value``."""
        label = f":v{len(self.values)}"
        self.values[label] = dict(value)
        return label

    def sets(self, fields: Mapping[str, Mapping[str, Any]]) -> str:
        """``SET #a = :v…, …`` of ``fields``."""
        return "SET " + ", ".join(f"{self(k)} = {self.v(v)}" for k, v in fields.items())

    def removes(self, attributes: Iterable[str]) -> str:
        """`` REMOVE #a, …`` of ``attributes`` (empty when there are none)."""
        names = [self(a) for a in attributes]
        return f" REMOVE {', '.join(names)}" if names else ""

    def all_absent(self, *attributes: str) -> str:
        """Condition: none of ``attributes`` exists."""
        return " AND ".join(f"attribute_not_exists({self(a)})" for a in attributes)

    def params(self) -> dict[str, Any]:
        """``ExpressionAttributeNames`` and ``ExpressionAttributeValues``."""
        out: dict[str, Any] = {"ExpressionAttributeNames": dict(self.names)}
        if self.values:
            out["ExpressionAttributeValues"] = dict(self.values)
        return out
