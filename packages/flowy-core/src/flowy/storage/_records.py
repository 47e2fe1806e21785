"""The checkpoint record envelope: the bytes every backend stores for a snapshot.

Layout (all integers big-endian)::

    b"FLWY" | u8 format version | u32 header length | header (UTF-8 JSON)
           | u32 state length | state bytes (the codec's) | 16-byte BLAKE2b of all before

The header carries the snapshot's address and run metadata; the digest detects any
corrupted byte. Decoding never executes code: it is JSON plus the state codec.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from .._errors import LimitError, SnapshotEnvelopeInvalidError
from .._types import JSON, S
from ._codecs import JSON_CODEC_NAMES, JSON_ENCODER, JSONCodec, StateCodec
from ._intents import json_depth, loads_bounded, route_json, route_of
from ._limits import MAX_DEPTH, MAX_TIMESTAMP, check_depth, check_time
from ._model import DEFAULT_ROUTE, HandoffStatus, Route, RunStatus, Snapshot

__all__ = [
    "FORMAT_VERSION",
    "MAX_HEADER_BYTES",
    "DecodeRecordOptions",
    "Record",
    "decode_record",
    "decode_snapshot",
    "encode_record",
    "encode_snapshot",
]

FORMAT_VERSION = 1
"""The envelope format this code writes and reads (a record's fifth byte)."""
_JSON_CODECS = JSON_CODEC_NAMES
_JSON: JSONCodec[Any] = JSONCodec()
"""The codec of plain JSON states (``codec=None``): one instance, it holds no state."""
MAX_HEADER_BYTES = 1024 * 1024
"""The largest record header written and read (thread id, pointer, metadata, effects)."""
# The header object holds the effects list, which holds each effect (of at most
# MAX_DEPTH levels): two levels of envelope.
_HEADER_DEPTH = MAX_DEPTH + 2
_MAGIC = b"FLWY"
_DIGEST = 16
_U32 = struct.Struct(">I")


def _digest(data: bytes | memoryview) -> bytes:
    return hashlib.blake2b(data, digest_size=_DIGEST).digest()


@dataclass(frozen=True, slots=True)
class Record:
    """A snapshot as stored: header fields plus the codec-encoded state bytes."""

    thread_id: str
    """The thread the record belongs to."""
    revision: int
    """The revision it is stored at (>= 1)."""
    execution_pointer: str
    """The node a run resumed from it continues at."""
    status: RunStatus
    """The run's status."""
    codec: str
    """The ``name`` of the codec that encoded ``state``; it must decode it too."""
    state: bytes
    """The state, encoded by that codec."""
    reason: str = ""
    """The run's reason."""
    step_count: int = 0
    """Steps of the segment that saved it."""
    segment: int = 0
    """The segment that saved it: 0 for the start, one more for each resume."""
    total_steps: int = 0
    """Steps of every segment of the thread."""
    budget_counts: Mapping[str, int] = field(default_factory=lambda: {})
    """Budget used by the thread, by name."""
    metadata: Mapping[str, JSON] = field(default_factory=lambda: {})
    """The run's metadata."""
    handoff_status: HandoffStatus = HandoffStatus.NONE
    """The state of its hand-off outbox message."""
    handoff_pending_at: float | None = None
    """When its hand-off began, in seconds since the epoch (``None`` without one)."""
    updated_at: float = 0.0
    """When it was saved, in seconds since the epoch."""
    write_id: str = ""
    """The random id of the write that stored it."""
    effects: tuple[JSON, ...] = ()
    """The effects the segment emitted up to this point."""
    retry_counts: Mapping[str, int] = field(default_factory=lambda: {})
    """The ``retry()`` attempts each node has used."""
    wake_at: float | None = None
    """When a waiting run wakes up (``None``: no timer)."""
    waiting_for: str = ""
    """The signal a waiting run waits for."""
    on_timeout: str = ""
    """The node a wait resumes at when ``wake_at`` passes first."""
    signal_cursors: Mapping[str, int] = field(default_factory=lambda: {})
    """The ``seq`` of the last signal of each name delivered to the run."""
    graph_version: str = ""
    """The version of the graph that saved it."""
    parent_thread_id: str = ""
    """The thread it was forked from (``""``: none)."""
    parent_revision: int = 0
    """The revision of the parent it was forked at."""
    route: Route = DEFAULT_ROUTE
    """Where its hand-off's message goes (the snapshot's ``route``)."""
    nested: Mapping[str, JSON] = field(default_factory=lambda: {})
    """Where the run paused inside a subgraph (empty: not inside one)."""
    format_version: int = FORMAT_VERSION
    """The envelope format (``FORMAT_VERSION``)."""

    @classmethod
    def from_snapshot(
        cls, snapshot: Snapshot[S], revision: int, codec: StateCodec[S] | None = None
    ) -> Record:
        """Encode ``snapshot`` as stored at ``revision`` with ``codec`` (JSON by default)."""
        name, state = _encode_state(snapshot, codec)
        return cls(
            thread_id=snapshot.thread_id,
            revision=revision,
            execution_pointer=snapshot.execution_pointer,
            status=snapshot.status,
            codec=name,
            state=state,
            reason=snapshot.reason,
            step_count=snapshot.step_count,
            segment=snapshot.segment,
            total_steps=snapshot.total_steps,
            budget_counts=dict(snapshot.budget_counts),
            metadata=dict(snapshot.metadata),
            handoff_status=snapshot.handoff_status,
            handoff_pending_at=snapshot.handoff_pending_at,
            updated_at=snapshot.updated_at,
            write_id=snapshot.write_id,
            effects=tuple(snapshot.effects),
            retry_counts=dict(snapshot.retry_counts),
            wake_at=snapshot.wake_at,
            waiting_for=snapshot.waiting_for,
            on_timeout=snapshot.on_timeout,
            signal_cursors=dict(snapshot.signal_cursors),
            graph_version=snapshot.graph_version,
            parent_thread_id=snapshot.parent_thread_id,
            parent_revision=snapshot.parent_revision,
            route=snapshot.route,
            nested=dict(snapshot.nested),
        )

    def to_snapshot(self, codec: StateCodec[S] | None = None) -> Snapshot[S]:
        """Decode the state with ``codec``; a codec mismatch or bad state bytes raise
        ``SnapshotEnvelopeInvalidError``."""
        c: StateCodec[Any] = codec if codec is not None else _JSON
        if c.name != self.codec:
            raise SnapshotEnvelopeInvalidError(
                f"record of thread {self.thread_id!r} rev {self.revision} was written with "
                f"codec {self.codec!r} but is read with {c.name!r}; configure the same codec"
            )
        if c.name in _JSON_CODECS and json_depth(self.state, MAX_DEPTH) > MAX_DEPTH:
            raise SnapshotEnvelopeInvalidError(
                f"state of thread {self.thread_id!r:.200} rev {self.revision} is nested more "
                f"than {MAX_DEPTH} levels deep"
            )
        try:
            state = c.decode(self.state)
        except RecursionError:
            raise SnapshotEnvelopeInvalidError(
                f"state of thread {self.thread_id!r:.200} rev {self.revision} is nested too "
                "deeply to decode"
            ) from None
        except (TypeError, ValueError) as exc:
            raise SnapshotEnvelopeInvalidError(
                f"state of thread {self.thread_id!r:.200} rev {self.revision} does not "
                f"decode with {c!r}: {exc}"
            ) from exc
        return Snapshot(
            thread_id=self.thread_id,
            state=cast(S, state),
            execution_pointer=self.execution_pointer,
            status=self.status,
            reason=self.reason,
            revision=self.revision,
            step_count=self.step_count,
            segment=self.segment,
            total_steps=self.total_steps,
            budget_counts=dict(self.budget_counts),
            metadata=dict(self.metadata),
            handoff_status=self.handoff_status,
            handoff_pending_at=self.handoff_pending_at,
            updated_at=self.updated_at,
            write_id=self.write_id,
            effects=self.effects,
            retry_counts=dict(self.retry_counts),
            wake_at=self.wake_at,
            waiting_for=self.waiting_for,
            on_timeout=self.on_timeout,
            signal_cursors=dict(self.signal_cursors),
            graph_version=self.graph_version,
            parent_thread_id=self.parent_thread_id,
            parent_revision=self.parent_revision,
            route=self.route,
            nested=dict(self.nested),
        )


@dataclass(frozen=True, slots=True)
class DecodeRecordOptions:
    """The address a record is expected to have (from storage columns); ``None`` = any."""

    thread_id: str | None = None
    """The thread the record must name."""
    revision: int | None = None
    """The revision the record must name."""
    execution_pointer: str | None = None
    """The execution pointer the record must name."""


def encode_record(record: Record) -> bytes:
    """Encode ``record`` into envelope bytes.

    Raises ``TypeError`` if its metadata or effects are not JSON-encodable, and
    :class:`flowy.errors.LimitError` if one is past a limit (``flowy.storage.Limits``:
    nesting, size, NaN, a time out of range).
    """
    return _envelope(record, record.revision, record.codec, record.state, record.format_version)


def _encode_state(snapshot: Snapshot[S], codec: StateCodec[S] | None) -> tuple[str, bytes]:
    """``(codec name, encoded state)`` of ``snapshot``; ``TypeError`` if the codec cannot
    encode it, :class:`LimitError` if it holds a value that would not load back (NaN, an
    infinity, an integer too long) or a JSON state is nested too deeply to load back."""
    c: StateCodec[Any] = codec if codec is not None else _JSON
    try:
        state = c.encode(snapshot.state)
    except RecursionError:
        raise LimitError(
            f"the state of thread {snapshot.thread_id!r:.200} is nested too deeply to encode; "
            f"flowy stores at most {MAX_DEPTH} levels"
        ) from None
    except TypeError as exc:
        raise TypeError(
            f"cannot encode the state of thread {snapshot.thread_id!r:.200} with {c!r}: {exc}"
        ) from exc
    except ValueError as exc:
        raise LimitError(
            f"cannot store the state of thread {snapshot.thread_id!r:.200} with {c!r}: {exc}"
        ) from None
    if c.name in _JSON_CODECS and json_depth(state, MAX_DEPTH) > MAX_DEPTH:
        raise LimitError(
            f"the state of thread {snapshot.thread_id!r:.200} is nested more than "
            f"{MAX_DEPTH} levels deep; it could not be loaded back reliably. "
            "Flatten it, or keep the deep part outside the state"
        )
    return c.name, state


def _envelope(
    source: Record | Snapshot[Any], revision: int, codec: str, state: bytes, version: int
) -> bytes:
    """The record bytes of ``source``'s header fields (those a :class:`Record` and a
    :class:`Snapshot` share) at ``revision``, with ``state`` encoded by ``codec``."""
    if not _plain_times(source):
        _check_times(source)
    fields: dict[str, object] = {
        "thread_id": source.thread_id,
        "revision": revision,
        "execution_pointer": source.execution_pointer,
        "status": source.status.value,
        "codec": codec,
        "reason": source.reason,
        "step_count": source.step_count,
        "segment": source.segment,
        "total_steps": source.total_steps,
        "budget_counts": dict(source.budget_counts),
        "metadata": dict(source.metadata),
        "handoff_status": source.handoff_status.value,
        "handoff_pending_at": source.handoff_pending_at,
        "updated_at": source.updated_at,
        "write_id": source.write_id,
    }
    effects, retry_counts = source.effects, source.retry_counts
    if effects:
        fields["effects"] = list(effects)
    if retry_counts:
        fields["retry_counts"] = dict(retry_counts)
    if source.wake_at is not None:
        fields["wake_at"] = source.wake_at
    if source.waiting_for:
        fields["waiting_for"] = source.waiting_for
    if source.on_timeout:
        fields["on_timeout"] = source.on_timeout
    if source.signal_cursors:
        fields["signal_cursors"] = dict(source.signal_cursors)
    if source.graph_version:
        fields["graph_version"] = source.graph_version
    if source.parent_thread_id:
        fields["parent_thread_id"] = source.parent_thread_id
        fields["parent_revision"] = source.parent_revision
    if source.nested:
        fields["nested"] = dict(source.nested)
    if source.route is not DEFAULT_ROUTE and source.route != DEFAULT_ROUTE:
        fields["route"] = route_json(source.route)
    try:
        header = JSON_ENCODER.encode(fields).encode("utf-8")
    except (TypeError, RecursionError) as exc:
        thread = _thread(source)
        _check_header_depth(source, thread)
        raise TypeError(
            f"cannot encode the run metadata or effects of {thread} as JSON: {exc}"
        ) from exc
    except ValueError as exc:  # NaN, an infinity, an integer too long to read back
        raise LimitError(
            f"cannot store the run metadata or effects of {_thread(source)}: {exc}"
        ) from None
    if header.count(b"[") + header.count(b"{") > MAX_DEPTH:  # only then can one be too deep
        _check_header_depth(source, _thread(source))
    if len(header) > MAX_HEADER_BYTES:
        raise LimitError(
            f"the run metadata and effects of {_thread(source)} are {len(header)} bytes encoded; "
            f"a record stores at most {MAX_HEADER_BYTES} (keep large data outside)"
        )
    body = b"".join(
        (_MAGIC, bytes((version,)), _U32.pack(len(header)), header, _U32.pack(len(state)), state)
    )
    return body + _digest(body)


def _thread(source: Record | Snapshot[Any]) -> str:
    """How error messages name ``source``'s thread (built only when one is raised)."""
    return f"thread {source.thread_id!r:.200}"


def _plain_times(source: Record | Snapshot[Any]) -> bool:
    """True if ``source``'s times are floats in range: the common case, checked without
    building a message. Anything else goes through :func:`_check_times`."""
    pending_at, wake_at = source.handoff_pending_at, source.wake_at
    return (
        _plain_time(source.updated_at)
        and (pending_at is None or _plain_time(pending_at))
        and (wake_at is None or _plain_time(wake_at))
    )


def _plain_time(value: float) -> bool:
    return type(value) is float and 0.0 <= value <= MAX_TIMESTAMP


def _check_times(source: Record | Snapshot[Any]) -> None:
    """``TypeError`` or :class:`LimitError` naming the first of ``source``'s times that
    is not a number in 0 .. ``MAX_TIMESTAMP`` (an ``int`` in range passes)."""
    thread = _thread(source)
    check_time(f"the updated_at of {thread}", source.updated_at)
    if source.handoff_pending_at is not None:
        check_time(f"the handoff_pending_at of {thread}", source.handoff_pending_at)
    if source.wake_at is not None:
        check_time(f"the wake_at of {thread}", source.wake_at)


def _check_header_depth(source: Record | Snapshot[Any], thread: str) -> None:
    """``LimitError`` naming the header value nested more than ``MAX_DEPTH`` levels."""
    check_depth(f"the run metadata of {thread}", dict(source.metadata))
    for effect in source.effects:
        check_depth(f"an effect of {thread}", effect)
    check_depth(f"the subgraph position of {thread}", dict(source.nested))


def _invalid(msg: str) -> SnapshotEnvelopeInvalidError:
    return SnapshotEnvelopeInvalidError(f"invalid checkpoint record: {msg}")


def _field(header: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = header.get(name)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise _invalid(f"header field {name!r} is missing or has the wrong type ({value!r})")
    return value


def _time(header: dict[str, Any], name: str, *, optional: bool = True) -> float | None:
    value = header.get(name)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _invalid(f"{name} must be a number{' or null' if optional else ''}")
    if not 0 <= value <= MAX_TIMESTAMP:
        raise _invalid(f"{name} {value!r} is not a time between 0 and {MAX_TIMESTAMP:.0f}")
    return float(value)


def decode_record(
    data: bytes | bytearray | memoryview, options: DecodeRecordOptions | None = None
) -> Record:
    """Validate and decode the envelope bytes ``data``.

    Raises ``SnapshotEnvelopeInvalidError`` for an unknown format version, a truncated or
    corrupted envelope (digest mismatch), an invalid header (empty thread id or pointer,
    revision < 1, unknown status) or an address that differs from ``options``.
    """
    opts = options or DecodeRecordOptions()
    buf = bytes(data)
    if len(buf) < 4 + 1 + 4 + 4 + _DIGEST or buf[:4] != _MAGIC:
        raise _invalid("not a flowy record (bad magic or too short)")
    version = buf[4]
    if version != FORMAT_VERSION:
        raise _invalid(f"unknown format version {version} (this code reads {FORMAT_VERSION})")
    if _digest(memoryview(buf)[:-_DIGEST]) != buf[-_DIGEST:]:
        raise _invalid("integrity digest mismatch: the stored bytes are corrupted")
    (hlen,) = _U32.unpack_from(buf, 5)
    hend = 9 + hlen
    if hend + 4 > len(buf) - _DIGEST:
        raise _invalid("header length runs past the end of the record")
    (slen,) = _U32.unpack_from(buf, hend)
    if hend + 4 + slen != len(buf) - _DIGEST:
        raise _invalid("state length does not match the record size")
    try:
        header = loads_bounded(
            buf[9:hend], max_bytes=MAX_HEADER_BYTES, max_depth=_HEADER_DEPTH, what="header"
        )
    except ValueError as exc:
        raise _invalid(str(exc)) from None
    if not isinstance(header, dict):
        raise _invalid("header is not an object")
    h = cast(dict[str, Any], header)
    thread_id = _field(h, "thread_id", str)
    pointer = _field(h, "execution_pointer", str)
    revision = _field(h, "revision", int)
    if not thread_id:
        raise _invalid("empty thread id")
    if not pointer:
        raise _invalid(f"empty execution pointer (thread {thread_id!r})")
    if revision < 1:
        raise _invalid(f"revision {revision} < 1 (thread {thread_id!r})")
    try:
        status = RunStatus(_field(h, "status", str))
        handoff_status = HandoffStatus(_field(h, "handoff_status", str))
    except ValueError as exc:
        raise _invalid(str(exc)) from exc
    budget_counts = _field(h, "budget_counts", dict)
    if not all(isinstance(v, int) for v in cast(dict[str, Any], budget_counts).values()):
        raise _invalid("budget_counts values must be integers")
    effects = h.get("effects", [])
    if not isinstance(effects, list):
        raise _invalid("effects must be a list")
    retry_counts = h.get("retry_counts", {})
    if not isinstance(retry_counts, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool)
        for v in cast(dict[str, Any], retry_counts).values()
    ):
        raise _invalid("retry_counts must map node names to integers")
    pending_at = _time(h, "handoff_pending_at")
    wake_at = _time(h, "wake_at")
    updated_at = _time(h, "updated_at", optional=False)
    waiting_for = h.get("waiting_for", "")
    on_timeout = h.get("on_timeout", "")
    if not isinstance(waiting_for, str) or not isinstance(on_timeout, str):
        raise _invalid("waiting_for and on_timeout must be strings")
    graph_version = h.get("graph_version", "")
    parent_thread = h.get("parent_thread_id", "")
    parent_revision = h.get("parent_revision", 0)
    if (
        not isinstance(graph_version, str)
        or not isinstance(parent_thread, str)
        or not isinstance(parent_revision, int)
        or isinstance(parent_revision, bool)
    ):
        raise _invalid("graph_version, parent_thread_id and parent_revision have wrong types")
    nested = h.get("nested", {})
    if not isinstance(nested, dict):
        raise _invalid("nested must be an object")
    try:
        route = route_of(h.get("route"))
    except (TypeError, ValueError) as exc:
        raise _invalid(f"route: {exc}") from None
    cursors = h.get("signal_cursors", {})
    if not isinstance(cursors, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool)
        for v in cast(dict[str, Any], cursors).values()
    ):
        raise _invalid("signal_cursors must map signal names to integers")
    if opts.thread_id is not None and opts.thread_id != thread_id:
        raise _invalid(f"stored under thread {opts.thread_id!r} but names thread {thread_id!r}")
    if opts.revision is not None and opts.revision != revision:
        raise _invalid(
            f"thread {thread_id!r}: stored at revision {opts.revision} but names {revision}"
        )
    if opts.execution_pointer is not None and opts.execution_pointer != pointer:
        raise _invalid(
            f"thread {thread_id!r}: stored pointer {opts.execution_pointer!r} "
            f"but the record names {pointer!r}"
        )
    return Record(
        thread_id=thread_id,
        revision=revision,
        execution_pointer=pointer,
        status=status,
        codec=_field(h, "codec", str),
        state=buf[hend + 4 : hend + 4 + slen],
        reason=_field(h, "reason", str),
        step_count=_field(h, "step_count", int),
        segment=_field(h, "segment", int),
        total_steps=_field(h, "total_steps", int),
        budget_counts=cast(dict[str, int], budget_counts),
        metadata=_field(h, "metadata", dict),
        handoff_status=handoff_status,
        handoff_pending_at=pending_at,
        updated_at=updated_at if updated_at is not None else 0.0,
        write_id=_field(h, "write_id", str),
        effects=tuple(cast(list[JSON], effects)),
        retry_counts=cast(dict[str, int], retry_counts),
        wake_at=wake_at,
        waiting_for=waiting_for,
        on_timeout=on_timeout,
        signal_cursors=cast(dict[str, int], cursors),
        graph_version=graph_version,
        parent_thread_id=parent_thread,
        parent_revision=parent_revision,
        route=route,
        nested=cast(dict[str, JSON], nested),
        format_version=version,
    )


def encode_snapshot(
    snapshot: Snapshot[S], revision: int, codec: StateCodec[S] | None = None
) -> bytes:
    """Shortcut for adapters: ``encode_record(Record.from_snapshot(...))``.

    Args:
        snapshot: the snapshot to store.
        revision: the revision it is stored at (its ``revision`` field is ignored).
        codec: encodes the state (``JSONCodec()`` when ``None``).

    Raises:
        TypeError: the state, metadata or effects cannot be encoded.
        flowy.errors.LimitError: a value is past a limit (also a ``ValueError``): a JSON
            state, the metadata or an effect nested more than ``MAX_DEPTH`` levels
            deep, NaN, an infinity or an integer too long to read back, a time out of
            range, or metadata and effects over ``MAX_HEADER_BYTES``.
    """
    name, state = _encode_state(snapshot, codec)
    return _envelope(snapshot, revision, name, state, FORMAT_VERSION)


def decode_snapshot(
    data: bytes | bytearray | memoryview,
    codec: StateCodec[S] | None = None,
    *,
    thread_id: str | None = None,
    revision: int | None = None,
    execution_pointer: str | None = None,
) -> Snapshot[S]:
    """Shortcut for adapters: validate the envelope against its address and decode state.

    Args:
        data: the stored envelope bytes.
        codec: decodes the state (``JSONCodec()`` when ``None``); it must be the codec
            that wrote the record.
        thread_id: the thread the storage address names (``None``: not checked).
        revision: the revision the storage address names (``None``: not checked).
        execution_pointer: the pointer the storage columns hold (``None``: not checked).

    Raises:
        SnapshotEnvelopeInvalidError: the bytes are not a valid record, do not match the
            address, or the state does not decode with ``codec``.
    """
    record = decode_record(data, DecodeRecordOptions(thread_id, revision, execution_pointer))
    return record.to_snapshot(codec)
