"""The key layout (``_keys.py``): one hash slot per thread and shard, injective ids,
stable shards, and message ids. No server needed."""

from __future__ import annotations

import fnmatch
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot

from flowy.storage import HandoffStatus
from flowy_redis import KeyLayout
from flowy_redis._keys import STATUS_DIGITS

_TAG = re.compile(rb"\{([^}]*)\}")

thread_ids = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    min_size=1,
    max_size=64,
)


def _tag(key: bytes) -> bytes:
    """The hash tag Redis Cluster hashes: the first ``{...}`` with a non-empty body."""
    match = _TAG.search(key)
    assert match is not None and match.group(1), key
    return match.group(1)


def _thread_keys(layout: KeyLayout, thread_id: str) -> list[bytes]:
    keys = layout.thread(thread_id)
    return [*keys.checkpoint, *keys.shard.outbox]


@given(thread_ids)
def test_every_key_of_a_thread_is_in_its_shard_slot(thread_id: str) -> None:
    layout = KeyLayout("ns", 16)
    keys = layout.thread(thread_id)
    assert len({key_slot(k) for k in _thread_keys(layout, thread_id)}) == 1
    tags = {_tag(k) for k in _thread_keys(layout, thread_id)}
    assert tags == {f"ns:{keys.shard.shard}".encode()}


@given(thread_ids, thread_ids)
def test_distinct_ids_never_share_a_key(first: str, second: str) -> None:
    layout = KeyLayout("ns", 4)
    if first == second:
        assert layout.thread(first) == layout.thread(second)
        return
    one, two = layout.thread(first), layout.thread(second)
    owned = ("head", "hist", "lease", "inbox", "sigids", "journal")
    mine, theirs = ({getattr(k, name) for name in owned} for k in (one, two))
    assert len(mine) == len(owned)
    assert mine.isdisjoint(theirs)


@pytest.mark.parametrize(
    "thread_id",
    ["{", "}", "{tag}", "a}:b{c", ":head:", "x\ny", "k" * 10_240, "🦜" * 2_560, "ns:{ns:0}"],
)
def test_hostile_ids_cannot_move_their_keys(thread_id: str) -> None:
    layout = KeyLayout("ns", 16)
    keys = layout.thread(thread_id)
    prefix = f"ns:{{ns:{keys.shard.shard}}}:".encode()
    for key in _thread_keys(layout, thread_id):
        assert key.startswith(prefix)
        assert _tag(key) == f"ns:{keys.shard.shard}".encode()
        assert b"{" not in key[len(prefix) :] and b"}" not in key[len(prefix) :]


def test_shards_are_stable() -> None:
    """The shard of an id is part of the stored layout: it must never change."""
    layout = KeyLayout("flowy", 16)
    assert [layout.shard_of(t) for t in ("thread-1", "order:42", "🦜")] == [9, 11, 6]
    assert KeyLayout("other", 16).shard_of("thread-1") == 9


def test_shards_spread_threads() -> None:
    layout = KeyLayout("flowy", 16)
    counts = [0] * 16
    for index in range(1600):
        counts[layout.shard_of(f"thread-{index}")] += 1
    assert min(counts) > 50


def test_index_members_sort_by_status_then_id() -> None:
    """A thread's index member is its status digit then its UTF-8 id, so ZRANGEBYLEX
    lists one status in thread-id order (UTF-8 byte order is code point order)."""
    assert [STATUS_DIGITS[s] for s in HandoffStatus] == [b"0", b"1", b"2", b"3"]
    ids = ["b", "a", "é", "e\u0301", "🦜", "a\n", "A", "{"]
    assert sorted(ids) == [i for i in sorted(ids, key=lambda i: i.encode("utf-8"))]


@pytest.mark.parametrize("namespace", ["", "a{b", "a}b", "a\x00b"])
def test_bad_namespaces_are_refused(namespace: str) -> None:
    with pytest.raises(ValueError, match="namespace"):
        KeyLayout(namespace, 16)


@pytest.mark.parametrize("shards", [0, -1, 16385, 1.5, True])
def test_bad_shard_counts_are_refused(shards: object) -> None:
    with pytest.raises(ValueError, match="shards"):
        KeyLayout("ns", shards)  # type: ignore[arg-type]


def test_namespace_pattern_escapes_glob_characters() -> None:
    assert KeyLayout("a*b?[c]", 1).pattern() == rb"a\*b\?\[c\]:{a\*b\?\[c\]:*"
    assert KeyLayout("a", 1).pattern(b"lease:") == b"a:{a:*}:lease:*"


def test_namespace_pattern_matches_only_its_own_keys() -> None:
    layout, nested = KeyLayout("a", 4), KeyLayout("a:b", 4)
    pattern = layout.pattern().decode()
    assert fnmatch.fnmatchcase(layout.thread("t").head.decode(), pattern)
    assert not fnmatch.fnmatchcase(nested.thread("t").head.decode(), pattern)
    leases = layout.pattern(b"lease:").decode()
    assert fnmatch.fnmatchcase(layout.thread("t").lease.decode(), leases)
    assert not fnmatch.fnmatchcase(layout.thread("t").head.decode(), leases)
    keys = layout.thread("t")
    for kind, key in ((b"inbox:", keys.inbox), (b"sigids:", keys.sigids)):
        others = {keys.inbox, keys.sigids, keys.journal, keys.shard.timers} - {key}
        assert fnmatch.fnmatchcase(key.decode(), layout.pattern(kind).decode())
        assert not any(
            fnmatch.fnmatchcase(o.decode(), layout.pattern(kind).decode()) for o in others
        )


def test_message_ids_round_trip() -> None:
    layout = KeyLayout("ns", 16)
    message_id = layout.message_id(15, b"1700000000000-3")
    assert message_id == "15:1700000000000-3"
    assert layout.parse_message_id(message_id) == (layout.shard(15), "1700000000000-3")


@pytest.mark.parametrize(
    "message_id",
    [
        *("", "no-such-message", "16:1-0", "01:1-0", "1:1", "1:a-0", "1:1-0:x", "١:1-0"),
        *("-1:1-0", "1:01-0", "1:1-00", "1:1-0 "),  # another spelling of an entry id
    ],
)
def test_foreign_message_ids_are_not_parsed(message_id: str) -> None:
    assert KeyLayout("ns", 16).parse_message_id(message_id) is None


def test_layouts_compare_by_namespace_and_shards() -> None:
    assert KeyLayout("a", 4) == KeyLayout("a", 4)
    assert KeyLayout("a", 4) != KeyLayout("a", 8)
    assert KeyLayout("a", 4) != KeyLayout("b", 4)
    assert len({KeyLayout("a", 4), KeyLayout("a", 4)}) == 1
