"""Conversion between message dataclasses and canonical values (spec/messages.md).

Rules:
- A dataclass is a map whose keys are its field names. Every field is present, except a field
  typed ``X | None`` whose value is None, which is omitted (the value model has no nil).
- Decoding refuses unknown and missing fields and values of the wrong type; ints are
  non-negative unless the field is declared ``SignedInt``.
- Supported field types: int, SignedInt, bool, str, bytes, StrEnum subclasses, nested
  dataclasses, ``tuple[X, ...]`` (a list on the wire), ``dict[str, X]`` and ``X | None``.

Converters are built once per class from its type hints and cached.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable
from typing import Any, NewType, TypeVar

from protocol.encoding import Value
from protocol.errors import InvalidMessage, Reason

__all__ = ["SignedInt", "bytes_fields", "from_value", "to_value"]

SignedInt = NewType("SignedInt", int)

T = TypeVar("T")
_Decoder = Callable[[Any, str], Any]
_Encoder = Callable[[Any], Value]


def to_value(obj: object) -> dict[str, Value]:
    """The canonical value of a message dataclass."""
    return _codec(type(obj))[0](obj)  # type: ignore[return-value]


def from_value(cls: type[T], value: object) -> T:
    """Build ``cls`` from a decoded value.

    Raises:
        InvalidMessage: MISSING_FIELD, UNKNOWN_FIELD or BAD_FIELD, naming the field path.
    """
    return _codec(cls)[1](value, cls.__name__)  # type: ignore[no-any-return]


def bytes_fields(value: object, keys: tuple[str, ...], what: str) -> tuple[bytes, ...]:
    """Unpack a map of exactly ``keys``, each holding bytes (co-signed containers).

    Raises:
        InvalidMessage: BAD_FIELD.
    """
    if not isinstance(value, dict) or value.keys() != set(keys):
        raise _bad(what, f"expected exactly the fields {', '.join(keys)}")
    items = tuple(value[k] for k in keys)
    if not all(type(item) is bytes for item in items):
        raise _bad(what, "every field is bytes")
    return items


_CODECS: dict[type, tuple[_Encoder, _Decoder]] = {}


def _codec(cls: type) -> tuple[_Encoder, _Decoder]:
    codec = _CODECS.get(cls)
    if codec is None:
        codec = _CODECS[cls] = _dataclass_codec(cls)
    return codec


def _bad(path: str, what: str) -> InvalidMessage:
    return InvalidMessage(Reason.BAD_FIELD, f"{path}: {what}")


def _dataclass_codec(cls: type) -> tuple[_Encoder, _Decoder]:
    hints = typing.get_type_hints(cls)
    fields = [
        (f.name, *_field_codec(hints[f.name]), _is_optional(hints[f.name]))
        for f in dataclasses.fields(cls)
    ]
    required = frozenset(name for name, _, _, optional in fields if not optional)
    names = frozenset(name for name, *_ in fields)

    def encode(obj: Any) -> Value:  # noqa: ANN401
        out: dict[str, Value] = {}
        for name, enc, _, _ in fields:
            item = getattr(obj, name)
            if item is not None:
                out[name] = enc(item)
        return out

    def decode(value: Any, path: str) -> Any:  # noqa: ANN401
        if not isinstance(value, dict):
            raise _bad(path, "expected a map")
        if not required <= value.keys():
            missing = sorted(required - value.keys())
            raise InvalidMessage(Reason.MISSING_FIELD, f"{path}: missing {', '.join(missing)}")
        if not value.keys() <= names:
            unknown = sorted(value.keys() - names)
            raise InvalidMessage(Reason.UNKNOWN_FIELD, f"{path}: unknown {', '.join(unknown)}")
        kwargs = {}
        for name, _, dec, _ in fields:
            item = value.get(name)
            kwargs[name] = None if item is None else dec(item, f"{path}.{name}")
        try:
            return cls(**kwargs)
        except ValueError as exc:  # __post_init__ rules
            raise _bad(path, str(exc)) from exc

    return encode, decode


def _is_optional(hint: Any) -> bool:  # noqa: ANN401
    return isinstance(hint, types.UnionType) and type(None) in typing.get_args(hint)


def _field_codec(hint: Any) -> tuple[_Encoder, _Decoder]:  # noqa: ANN401
    if isinstance(hint, types.UnionType):
        (inner,) = (a for a in typing.get_args(hint) if a is not type(None))
        return _field_codec(inner)
    if hint is SignedInt:
        return _identity, _decode_int(signed=True)
    if hint is int:
        return _identity, _decode_int(signed=False)
    if hint is bool:
        return _identity, _decode_exact(bool, "a bool")
    if hint is str:
        return _identity, _decode_exact(str, "a string")
    if hint is bytes:
        return _identity, _decode_exact(bytes, "bytes")
    if isinstance(hint, type) and issubclass(hint, enum.StrEnum):
        return _encode_enum, _decode_enum(hint)
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return _codec(hint)
    origin = typing.get_origin(hint)
    if origin is tuple:
        item_hint, ellipsis = typing.get_args(hint)
        if ellipsis is not Ellipsis:
            raise TypeError("sequences are declared tuple[X, ...]")
        return _list_codec(*_field_codec(item_hint))
    if origin is dict:
        key_hint, item_hint = typing.get_args(hint)
        if key_hint is not str:
            raise TypeError("map keys must be str")
        return _dict_codec(*_field_codec(item_hint))
    supertype = getattr(hint, "__supertype__", None)  # NewType over a supported type
    if supertype is not None:
        return _field_codec(supertype)
    raise TypeError(f"unsupported field type {hint!r}")


def _identity(value: Any) -> Value:  # noqa: ANN401
    return value  # type: ignore[no-any-return]


def _encode_enum(value: Any) -> Value:  # noqa: ANN401
    return str(value.value)


def _decode_int(*, signed: bool) -> _Decoder:
    def decode(value: Any, path: str) -> int:  # noqa: ANN401
        if type(value) is not int:
            raise _bad(path, "expected an integer")
        if value < 0 and not signed:
            raise _bad(path, "must not be negative")
        return value

    return decode


def _decode_exact(kind: type, what: str) -> _Decoder:
    def decode(value: Any, path: str) -> Any:  # noqa: ANN401
        if type(value) is not kind:
            raise _bad(path, f"expected {what}")
        return value

    return decode


def _decode_enum(kind: type[enum.StrEnum]) -> _Decoder:
    def decode(value: Any, path: str) -> Any:  # noqa: ANN401
        try:
            return kind(value)
        except ValueError:
            allowed = ", ".join(m.value for m in kind)
            raise _bad(path, f"{value!r} is not one of {allowed}") from None

    return decode


def _list_codec(enc: _Encoder, dec: _Decoder) -> tuple[_Encoder, _Decoder]:
    def encode(value: Any) -> Value:  # noqa: ANN401
        return [enc(v) for v in value]

    def decode(value: Any, path: str) -> Any:  # noqa: ANN401
        if type(value) is not list:
            raise _bad(path, "expected a list")
        return tuple(dec(v, f"{path}[{i}]") for i, v in enumerate(value))

    return encode, decode


def _dict_codec(enc: _Encoder, dec: _Decoder) -> tuple[_Encoder, _Decoder]:
    def encode(value: Any) -> Value:  # noqa: ANN401
        return {k: enc(v) for k, v in value.items()}

    def decode(value: Any, path: str) -> Any:  # noqa: ANN401
        if type(value) is not dict:
            raise _bad(path, "expected a map")
        return {k: dec(v, f"{path}.{k}") for k, v in value.items()}

    return encode, decode
