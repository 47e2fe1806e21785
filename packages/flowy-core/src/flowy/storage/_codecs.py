"""State codecs: turn an application's state into bytes and back, without running code.

``JSONCodec`` uses only the standard library. Without a type it stores and returns plain
JSON values; with ``state_type`` it encodes dataclasses, enums, datetimes, tuples and sets
and decodes back into the declared types (TypedDicts are plain dicts). ``MsgspecCodec``
(extra ``flowy-core[msgspec]``) does the same with msgspec's typed decoder, and
``PydanticCodec`` (extra ``flowy-core[pydantic]``) with a pydantic v2 ``TypeAdapter``;
:func:`codec_for_type` picks it for a ``BaseModel`` state. Neither extra is imported
unless its codec is made.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import datetime as dt
import enum
import functools
import json
import re
import sys
import types
import typing
from typing import Any, Generic, Protocol, cast, runtime_checkable

from .._types import S

__all__ = [
    "JSONCodec",
    "MsgspecCodec",
    "PydanticCodec",
    "StateCodec",
    "codec_for_type",
    "json_default",
    "merge_fields",
]


@runtime_checkable
class StateCodec(Protocol[S]):
    """Encodes states to bytes and back. ``name`` is stored in every record.

    A codec may also define ``merge(state, overlay) -> state | None``: the fields of the
    mapping ``overlay`` merged into ``state`` and the result validated (``ValueError``
    naming the field that does not fit), or ``None`` if it does not know the state's
    fields. ``state_overlay`` and signal payloads are merged with it (``JSONCodec``,
    ``MsgspecCodec`` and ``PydanticCodec`` define it).
    """

    name: str

    def encode(self, state: S) -> bytes:
        """Encode ``state``; raise ``TypeError`` or ``ValueError`` if it cannot be."""
        ...

    def decode(self, data: bytes) -> S:
        """Decode ``data`` made by ``encode``; raise ``ValueError`` if it is malformed."""
        ...


def json_default(value: Any) -> Any:
    """``json.dumps`` hook for the types JSON lacks (called only for those)."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {name: getattr(value, name) for name in _field_names(type(value))}
    if isinstance(value, set | frozenset):
        return sorted(cast("set[Any]", value), key=repr)
    if is_pydantic_model(cast(object, type(value))):
        return cast(Any, value).model_dump(mode="json", round_trip=True)
    raise TypeError(
        f"JSONCodec cannot encode {type(value).__name__} {value!r}; use dataclasses, dicts, "
        "lists, enums, datetimes and JSON scalars, or pass another codec"
    )


@functools.lru_cache(maxsize=1024)
def _field_names(cls: type) -> tuple[str, ...]:
    """The field names of the dataclass ``cls``, in order: looked up once per class, not
    on every save of a state of that class."""
    return tuple(f.name for f in dataclasses.fields(cls))


JSON_CODEC_NAMES = frozenset({"json", "msgspec-json", "pydantic-json"})
"""The names of the codecs whose state bytes are JSON text."""

JSON_ENCODER = json.JSONEncoder(
    default=json_default, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)
"""Compact JSON with :func:`json_default` (one instance: ``json.dumps`` with arguments
builds a new encoder on every call). NaN and infinities are refused (``ValueError``):
standard JSON has no such numbers, so they would not load back as they were given."""


def is_pydantic_model(tp: object) -> bool:
    """True if ``tp`` is a pydantic v2 ``BaseModel`` class. Nothing is imported: a class
    can only be one once pydantic is loaded."""
    pydantic = sys.modules.get("pydantic")
    base = getattr(pydantic, "BaseModel", None)
    return base is not None and isinstance(tp, type) and issubclass(tp, base)


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number")


def _check_finite(value: object) -> None:
    """``ValueError`` if the plain value ``value`` holds a NaN or an infinity."""
    stack: list[object] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            if item != item or item in (float("inf"), float("-inf")):
                raise ValueError(f"{item!r} is not a JSON number; store only finite numbers")
        elif isinstance(item, dict):
            stack.extend(cast(dict[object, object], item).values())
        elif isinstance(item, list | tuple):
            stack.extend(cast(list[object], item))


def _state_fields(state: object, state_type: Any) -> tuple[str, ...] | None:
    """The top-level field names of a dataclass, msgspec Struct or pydantic model state,
    or of a TypedDict ``state_type``; ``None`` for any other state."""
    if dataclasses.is_dataclass(state) and not isinstance(state, type):
        return _field_names(type(state))
    if is_pydantic_model(type(state)):
        return tuple(cast(Any, type(state)).model_fields)
    struct_fields = getattr(type(state), "__struct_fields__", None)
    if isinstance(struct_fields, tuple):
        return cast(tuple[str, ...], struct_fields)
    if (
        isinstance(state, dict)
        and isinstance(state_type, type)
        and typing.is_typeddict(cast(Any, state_type))
    ):
        return tuple(typing.get_type_hints(cast(Any, state_type)))
    return None


def merge_fields(
    state: S,
    overlay: collections.abc.Mapping[str, Any],
    state_type: Any = None,
    validate: collections.abc.Callable[[S], S] | None = None,
) -> S | None:
    """The fields of ``overlay`` merged into ``state``, then validated as a whole.

    A field the overlay names replaces the state's value of it (a nested value is
    replaced, not merged into); the fields it does not name are kept. Works on dataclass,
    msgspec Struct and pydantic model states (``model_copy(update=...)``, which does not
    validate: ``validate`` does), and on dict states of a TypedDict ``state_type``; returns
    ``None`` for any other state. ``validate(merged)`` gives the state to use (a codec
    passes ``decode(encode(merged))``, which also builds nested typed values from plain
    JSON ones).

    Raises:
        ValueError: the overlay names a field the state does not have, or the merged
            state does not fit its type; the message names the field.
    """
    fields = _state_fields(state, state_type)
    if fields is None:
        return None
    kind = type(state).__name__ if not isinstance(state, dict) else _name(state_type)
    unknown = sorted(set(overlay) - set(fields))
    if unknown:
        raise ValueError(
            f"the overlay names {', '.join(map(repr, unknown))}, not fields of {kind} "
            f"(fields: {', '.join(sorted(fields))})"
        )
    updates = dict(overlay)
    if isinstance(state, dict):
        merged = cast(S, {**cast(dict[str, Any], state), **updates})
    elif dataclasses.is_dataclass(state):
        merged = cast(S, dataclasses.replace(cast(Any, state), **updates))
    elif is_pydantic_model(type(state)):
        merged = cast(S, cast(Any, state).model_copy(update=updates))
    else:  # a msgspec Struct: replace() does not validate, the round trip below does
        import msgspec

        merged = cast(S, msgspec.structs.replace(cast(Any, state), **updates))
    if validate is None:
        return merged
    try:
        return validate(merged)
    except (TypeError, ValueError) as exc:
        text = " ".join(str(exc).split())
        raise ValueError(f"the overlay does not fit {kind}: {text:.300}") from None


class _Mismatch(ValueError):
    """A stored value that does not fit the declared type, with where it sits."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path or 'state'}: {message}")
        self.path = path


def _name(tp: object) -> str:
    return str(getattr(tp, "__name__", tp))


def _at(path: str, key: object) -> str:
    return f"{path}.{key}" if isinstance(key, str) and key.isidentifier() else f"{path}[{key!r}]"


def _from_json(tp: Any, value: Any, path: str = "") -> Any:
    """Convert the JSON ``value`` into ``tp``; a mismatch raises ``_Mismatch`` naming the
    field (``state.items[2].amount``)."""
    if tp is Any or tp is object:
        return value
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors: list[str] = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _from_json(arg, value, path)
            except (TypeError, ValueError) as exc:
                errors.append(str(exc))
        raise _Mismatch(path, f"{value!r:.80} matches no member of {tp}")
    if origin is typing.Literal:
        if value not in typing.get_args(tp):
            raise _Mismatch(path, f"{value!r:.80} is not one of {typing.get_args(tp)}")
        return value
    if origin in (list, set, frozenset, tuple) or tp in (list, set, frozenset, tuple):
        if not isinstance(value, list):
            raise _Mismatch(path, f"expected a list for {tp}, got {value!r:.80}")
        args = typing.get_args(tp)
        items = cast("list[Any]", value)
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            if len(args) != len(items):
                raise _Mismatch(path, f"expected {len(args)} items for {tp}, got {len(items)}")
            return tuple(
                _from_json(a, v, f"{path}[{i}]")
                for i, (a, v) in enumerate(zip(args, items, strict=True))
            )
        item_tp = args[0] if args else Any
        converted = [_from_json(item_tp, v, f"{path}[{i}]") for i, v in enumerate(items)]
        container: Any = origin or tp
        return converted if container is list else container(converted)
    if origin is dict or tp is dict or origin in (typing.Mapping, dict):
        if not isinstance(value, dict):
            raise _Mismatch(path, f"expected an object for {tp}, got {value!r:.80}")
        args = typing.get_args(tp)
        val_tp = args[1] if len(args) == 2 else Any
        return {
            k: _from_json(val_tp, v, _at(path, k)) for k, v in cast(dict[str, Any], value).items()
        }
    if isinstance(tp, type):
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, dict):
                raise _Mismatch(path, f"expected an object for {tp.__name__}, got {value!r:.80}")
            hints = typing.get_type_hints(tp)
            raw = cast(dict[str, Any], value)
            kwargs: dict[str, Any] = {}
            for f in dataclasses.fields(tp):
                if f.name in raw:
                    kwargs[f.name] = _from_json(
                        hints.get(f.name, Any), raw[f.name], _at(path, f.name)
                    )
                elif (
                    f.init
                    and f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING
                ):
                    raise _Mismatch(
                        _at(path, f.name),
                        f"missing in the stored state, and {tp.__name__}.{f.name} has no default",
                    )
            return tp(**kwargs)
        if issubclass(tp, enum.Enum):
            try:
                return tp(value)
            except ValueError:
                raise _Mismatch(path, f"{value!r:.80} is not a {tp.__name__}") from None
        try:
            if issubclass(tp, dt.datetime):
                return dt.datetime.fromisoformat(value)
            if issubclass(tp, dt.date):
                return dt.date.fromisoformat(value)
            if issubclass(tp, dt.timedelta):
                return dt.timedelta(seconds=value)
        except (TypeError, ValueError, OverflowError) as exc:
            raise _Mismatch(path, f"expected {_name(cast(object, tp))}: {exc}") from None
        if typing.is_typeddict(cast(Any, tp)):
            if not isinstance(value, dict):
                raise _Mismatch(path, f"expected an object for {tp!r}, got {value!r:.80}")
            hints = typing.get_type_hints(cast(Any, tp))
            return {
                k: _from_json(hints.get(k, Any), v, _at(path, k))
                for k, v in cast(dict[str, Any], value).items()
            }
        if tp is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if tp in (int, float, str, bool):
            if type(value) is not tp:
                raise _Mismatch(path, f"expected {tp.__name__}, got {value!r:.80}")
            return value
    return value


_JSON_SCALARS: tuple[Any, ...] = (str, int, float, bool, type(None), None)


def is_plain_json_type(tp: Any) -> bool:
    """True if plain JSON values already are ``tp`` (decoding into it changes nothing):
    ``Any``, ``object``, JSON scalars, ``dict``/``Mapping`` with string keys, ``list``,
    TypedDicts, literals, and unions of these, with plain JSON inside. A dataclass, a
    tuple, a set, an enum or a date is not: plain JSON cannot hand it back."""
    if tp is Any or tp is object or tp in _JSON_SCALARS:
        return True
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union or origin is types.UnionType:
        return all(is_plain_json_type(arg) for arg in args)
    if origin is typing.Literal:
        return all(type(arg) in (str, int, bool) or arg is None for arg in args)
    if origin is list or tp is list:
        return all(is_plain_json_type(arg) for arg in args)
    if origin in (dict, typing.Mapping, collections.abc.Mapping) or tp in (dict, typing.Mapping):
        return not args or (args[0] is str and is_plain_json_type(args[1]))
    if isinstance(tp, type) and typing.is_typeddict(cast(Any, tp)):
        hints = typing.get_type_hints(cast(Any, tp))
        return all(is_plain_json_type(hint) for hint in hints.values())
    return False


class JSONCodec(Generic[S]):
    """Standard-library JSON state codec.

    ``JSONCodec()`` round-trips JSON values (dicts, lists, scalars). ``JSONCodec(MyState)``
    also encodes dataclasses, enums, datetimes, tuples and sets, and decodes into
    ``MyState`` following its type hints. Dict keys should be strings: like ``json``,
    the codec stores other scalar keys as strings.

    Args:
        state_type: the type states decode into (``None``: plain JSON values). A stored
            value that does not fit it is a ``ValueError`` naming the field.
    """

    name = "json"

    def __init__(self, state_type: type[S] | Any = None) -> None:
        self.state_type: Any = state_type

    def encode(self, state: S) -> bytes:
        """Encode ``state`` as compact UTF-8 JSON; ``TypeError`` if a value is not
        encodable, ``ValueError`` for NaN, an infinity or an integer too long to read back."""
        return JSON_ENCODER.encode(state).encode()

    def decode(self, data: bytes) -> S:
        """Decode the JSON ``data`` (into ``state_type`` if given); ``ValueError`` if it is
        malformed or does not fit ``state_type``."""
        try:
            value = json.loads(data, parse_constant=_no_constant)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"state is not valid JSON: {exc}") from exc
        if self.state_type is None:
            return cast(S, value)
        try:
            return cast(S, _from_json(self.state_type, value, "state"))
        except _Mismatch:
            raise
        except (TypeError, KeyError) as exc:
            raise ValueError(f"state does not match {self.state_type!r}: {exc}") from exc

    def merge(self, state: S, overlay: collections.abc.Mapping[str, Any]) -> S | None:
        """The fields of ``overlay`` merged into a dataclass, msgspec Struct, pydantic
        model or TypedDict ``state`` (each one it names replaces the stored value, a
        nested one as a whole) and validated by a round trip through this codec; ``None``
        for a state without known fields. ``ValueError`` names an unknown field or one
        that does not fit."""
        validate = None if self.state_type is None else self._round_trip
        return merge_fields(state, overlay, self.state_type, validate)

    def _round_trip(self, state: S) -> S:
        return self.decode(self.encode(state))

    def __repr__(self) -> str:
        return f"JSONCodec({self.state_type!r})"


class MsgspecCodec(Generic[S]):
    """msgspec JSON codec (``pip install "flowy-core[msgspec]"``): Structs, dataclasses,
    typed decode.

    Args:
        state_type: the type decoding validates against and builds (``Any``: plain
            JSON values).

    Raises:
        ImportError: msgspec is not installed.
    """

    name = "msgspec-json"

    def __init__(self, state_type: type[S] | Any = Any) -> None:
        try:
            import msgspec
        except ImportError as exc:  # pragma: no cover - exercised only without the extra
            raise ImportError(
                'MsgspecCodec needs msgspec: pip install "flowy-core[msgspec]"'
            ) from exc
        self._msgspec: Any = msgspec
        self._encoder: Any = msgspec.json.Encoder()
        self._decoder: Any = msgspec.json.Decoder(state_type)
        self.state_type: Any = state_type

    def encode(self, state: S) -> bytes:
        """Encode ``state`` with msgspec; ``TypeError`` if a value is not encodable,
        ``ValueError`` for NaN, an infinity (msgspec would write ``null``) or an integer
        too long to read back."""
        try:
            data = cast(bytes, self._encoder.encode(state))
            if b"null" in data:  # a NaN or infinity is written as null: look for one
                _check_finite(self._msgspec.to_builtins(state))
        except self._msgspec.EncodeError as exc:
            raise TypeError(str(exc)) from exc
        return data

    def decode(self, data: bytes) -> S:
        """Decode ``data`` and validate it against ``state_type``; ``ValueError`` if it does
        not match."""
        try:
            return cast(S, self._decoder.decode(data))
        except (self._msgspec.DecodeError, self._msgspec.ValidationError) as exc:
            raise ValueError(str(exc)) from exc

    def merge(self, state: S, overlay: collections.abc.Mapping[str, Any]) -> S | None:
        """The fields of ``overlay`` merged into a dataclass, msgspec Struct, pydantic
        model or TypedDict ``state`` (each one it names replaces the stored value, a
        nested one as a whole) and validated by a round trip through this codec; ``None``
        for a state without known fields. ``ValueError`` names an unknown field or one
        that does not fit."""
        validate = None if self.state_type is Any else self._round_trip
        return merge_fields(state, overlay, self.state_type, validate)

    def _round_trip(self, state: S) -> S:
        return self.decode(self.encode(state))

    def __repr__(self) -> str:
        return f"MsgspecCodec({self.state_type!r})"


_MAX_INT_DIGITS = 4300
"""The longest integer pydantic's JSON parser reads back (as Python's own ``int``)."""
_LONG_DIGITS = re.compile(rb"\d{%d}" % (_MAX_INT_DIGITS + 1))
_TOO_LONG = 10**_MAX_INT_DIGITS


def _check_numbers(value: object) -> None:
    """``ValueError`` if the plain value ``value`` holds a NaN, an infinity or an integer
    too long to read back."""
    _check_finite(value)
    stack: list[object] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, int) and not isinstance(item, bool):
            if abs(item) >= _TOO_LONG:
                raise ValueError(
                    f"an integer of more than {_MAX_INT_DIGITS} digits would not load back"
                )
        elif isinstance(item, dict):
            stack.extend(cast(dict[object, object], item).values())
        elif isinstance(item, list | tuple | set | frozenset):
            stack.extend(cast(list[object], item))


def _problems(errors: list[Any]) -> str:
    """Pydantic's validation errors on one line, each at its field: ``state.items[2].amount:
    Input should be a valid integer (got 'a lot')``."""
    parts: list[str] = []
    for error in errors[:3]:
        path = "state"
        for key in error.get("loc", ()):
            path = f"{path}[{key}]" if isinstance(key, int) else _at(path, key)
        text = f"{path}: {error.get('msg', 'invalid')}"
        if error.get("type") not in ("missing", "json_invalid"):
            text += f" (got {error.get('input')!r:.80})"
        parts.append(text)
    if len(errors) > 3:
        parts.append(f"and {len(errors) - 3} more")
    return "; ".join(parts)


class PydanticCodec(Generic[S]):
    """Pydantic v2 JSON codec (``pip install "flowy-core[pydantic]"``): ``BaseModel``
    states, and any type a pydantic ``TypeAdapter`` validates.

    A graph whose state type is a ``BaseModel`` gets this codec without asking (see
    :func:`codec_for_type`). States are stored as the model's JSON by field name (not by
    alias; computed fields are left out) and loaded with the model's own validation:
    its defaults fill fields an older record lacks, and a field the model no longer has
    is ignored unless the model forbids extra fields.

    Args:
        state_type: the type states decode into (a ``BaseModel`` subclass, ``list[Msg]``,
            a dataclass, ``Any``, …).

    Raises:
        ImportError: pydantic is not installed.
    """

    name = "pydantic-json"

    def __init__(self, state_type: type[S] | Any = Any) -> None:
        try:
            import pydantic
        except ImportError as exc:  # pragma: no cover - exercised only without the extra
            raise ImportError(
                'PydanticCodec needs pydantic v2: pip install "flowy-core[pydantic]"'
            ) from exc
        self._adapter: Any = pydantic.TypeAdapter(state_type)
        self._invalid: type[Exception] = pydantic.ValidationError
        self.state_type: Any = state_type

    def _dump(self, state: S, warnings: Any) -> bytes:
        try:
            data = cast(bytes, self._adapter.dump_json(state, round_trip=True, warnings=warnings))
        except ValueError as exc:  # pydantic's serialization error: not this type's value
            text = " ".join(str(exc).split())
            raise TypeError(f"{self!r} cannot encode {type(state).__name__}: {text:.300}") from None
        if b"null" in data or _LONG_DIGITS.search(data):  # NaN and infinities become null
            _check_numbers(self._adapter.dump_python(state, round_trip=True, warnings=False))
        return data

    def encode(self, state: S) -> bytes:
        """Encode ``state`` as the model's compact JSON; ``TypeError`` if it is not a value
        of ``state_type``, ``ValueError`` for NaN, an infinity (pydantic would write
        ``null``) or an integer too long to read back."""
        return self._dump(state, "error")

    def decode(self, data: bytes) -> S:
        """Decode and validate ``data`` into ``state_type``; ``ValueError`` naming each
        field that does not fit (``state.items[0].amount: …``), never pydantic's own."""
        try:
            return cast(S, self._adapter.validate_json(data, by_alias=False, by_name=True))
        except self._invalid as exc:
            raise ValueError(_problems(cast(Any, exc).errors())) from None

    def merge(self, state: S, overlay: collections.abc.Mapping[str, Any]) -> S | None:
        """The fields of ``overlay`` merged into a pydantic model, dataclass, msgspec
        Struct or TypedDict ``state`` (each one it names replaces the stored value, a
        nested one as a whole) and validated by the model through a round trip of this
        codec; ``None`` for a state without known fields. ``ValueError`` names an unknown
        field or one that does not fit."""
        return merge_fields(state, overlay, self.state_type, self._round_trip)

    def _round_trip(self, state: S) -> S:
        # A merged field may hold plain JSON (a dict for a nested model): written as it is.
        return self.decode(self._dump(state, False))

    def __repr__(self) -> str:
        return f"PydanticCodec({_name(self.state_type)})"


def codec_for_type(state_type: Any) -> StateCodec[Any]:
    """The codec a graph of ``state_type`` stores its states with when none is given:
    :class:`PydanticCodec` for a pydantic ``BaseModel``, else :class:`JSONCodec`."""
    if is_pydantic_model(state_type):
        return PydanticCodec(state_type)
    return JSONCodec(state_type)
