"""Canonical encoding: one byte string per value (spec/encoding.md).

Rules:
- The value model is: int (-2**63 .. 2**64-1), str (UTF-8), bytes, bool, list, and maps with
  str keys. No nil, no floats, no extension types: an absent field is omitted, money and time
  are integers.
- Encoding is msgpack with the shortest form of every int and length, bytes as bin, str as
  str, and map keys sorted by their UTF-8 bytes.
- Decoding is strict: bounded total size, nesting depth and lengths; one value, nothing after
  it; and the input must be exactly the canonical encoding of what it decodes to. Anything
  else raises :class:`DecodeError` and nothing but that.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

import msgpack

from protocol.errors import DecodeError, Reason

__all__ = ["DEFAULT_LIMITS", "Limits", "Value", "decode", "encode"]

Value: TypeAlias = int | str | bytes | bool | list["Value"] | dict[str, "Value"]

_INT_MIN = -(2**63)
_INT_MAX = 2**64 - 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """Bounds a decoder enforces before trusting anything in the input."""

    max_size: int = 256 * 1024
    max_depth: int = 16
    max_str: int = 16 * 1024
    max_bin: int = 128 * 1024
    max_array: int = 4096
    max_map: int = 256


DEFAULT_LIMITS = Limits()


def encode(value: Value) -> bytes:
    """Return the canonical encoding of ``value``.

    Raises:
        TypeError or ValueError for a value outside the model: a bug in the caller, not a
        peer's misbehaviour, so not a ProtocolError.
    """
    return msgpack.packb(_canonical(value), use_bin_type=True)  # type: ignore[no-any-return]


def _canonical(value: Value) -> Any:  # noqa: ANN401 - msgpack takes any tree
    # bool first: it is a subclass of int.
    if isinstance(value, bool | str | bytes):
        return value
    if isinstance(value, int):
        if not _INT_MIN <= value <= _INT_MAX:
            raise ValueError(f"integer {value} outside the encodable range")
        return value
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    if isinstance(value, Mapping):
        for key in value:
            if not isinstance(key, str):
                raise TypeError(f"map key {key!r} is not a str")
        return {k: _canonical(value[k]) for k in sorted(value, key=_key_order)}
    raise TypeError(f"{type(value).__name__} is not part of the canonical value model")


def _key_order(key: str) -> bytes:
    return key.encode("utf-8")


def _pairs_in_order(pairs: list[tuple[Any, Any]]) -> dict[str, Any]:
    previous: bytes | None = None
    for key, _ in pairs:
        if not isinstance(key, str):
            raise DecodeError(Reason.NON_STRING_KEY, f"map key of type {type(key).__name__}")
        raw = key.encode("utf-8")
        if previous is not None:
            if raw == previous:
                raise DecodeError(Reason.DUPLICATE_KEY, f"map key {key!r} appears twice")
            if raw < previous:
                raise DecodeError(Reason.NON_CANONICAL, "map keys are not sorted")
        previous = raw
    return dict(pairs)


_SCALARS = frozenset({bool, str, bytes, int})


def _check_tree(value: Any, depth: int, limits: Limits) -> None:  # noqa: ANN401
    # Leaves are checked by their container, so the recursion only visits containers.
    if depth >= limits.max_depth:  # depth counts containers from 0
        raise DecodeError(Reason.TOO_DEEP, f"more than {limits.max_depth} nested containers")
    kind = type(value)
    if kind is dict:
        items = value.values()
    elif kind is list:
        items = value
    elif kind in _SCALARS:
        return
    else:
        raise DecodeError(Reason.FORBIDDEN_TYPE, f"{kind.__name__} is not allowed")
    for item in items:
        kind = type(item)
        if kind is dict or kind is list:
            _check_tree(item, depth + 1, limits)
        elif kind not in _SCALARS:
            raise DecodeError(Reason.FORBIDDEN_TYPE, f"{kind.__name__} is not allowed")


def decode(data: bytes, limits: Limits = DEFAULT_LIMITS) -> Value:
    """Decode exactly one canonical value from ``data``.

    Raises:
        DecodeError: with the reason (truncated, too large, non-canonical, ...).
    """
    if len(data) > limits.max_size:
        raise DecodeError(Reason.TOO_LARGE, f"{len(data)} bytes exceeds {limits.max_size}")
    try:
        value = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=False,  # keys are checked, with a clearer reason, in the hook
            use_list=True,
            object_pairs_hook=_pairs_in_order,
            max_str_len=limits.max_str,
            max_bin_len=limits.max_bin,
            max_array_len=limits.max_array,
            max_map_len=limits.max_map,
            max_ext_len=0,
        )
    except DecodeError:
        raise
    except msgpack.ExtraData as exc:
        raise DecodeError(Reason.TRAILING_BYTES, "bytes after the value") from exc
    except msgpack.StackError as exc:
        raise DecodeError(Reason.TOO_DEEP, "nesting too deep") from exc
    except msgpack.FormatError as exc:
        raise DecodeError(Reason.MALFORMED, "invalid msgpack type byte") from exc
    except UnicodeDecodeError as exc:
        raise DecodeError(Reason.INVALID_UTF8, "string is not valid UTF-8") from exc
    except ValueError as exc:
        raise DecodeError(_reason_of(str(exc)), str(exc)) from exc
    _check_tree(value, 0, limits)
    # Shortest-form ints and lengths, str vs bin: only a byte comparison proves them.
    if msgpack.packb(value, use_bin_type=True) != data:
        raise DecodeError(Reason.NON_CANONICAL, "not the canonical encoding of its value")
    return value  # type: ignore[no-any-return]


def _reason_of(message: str) -> Reason:
    if "incomplete input" in message:
        return Reason.TRUNCATED
    if "max_ext_len" in message:
        return Reason.FORBIDDEN_TYPE
    if "exceeds max_" in message:
        return Reason.TOO_LONG
    return Reason.MALFORMED
