"""A fast path for opening signed messages: typed decoding in C (msgspec).

Rules (it never changes what a receiver accepts):
- It may only *accept* a body the strict path in ``protocol.envelope`` accepts, with the
  same result; anything it is unsure of, it hands back (``None``) and the strict path
  decides, with its precise reason. So every canonical-form rule still holds.
- Canonical form is proved by a byte comparison: the body decodes into mirror structs
  built from the message dataclasses' type hints (unknown fields forbidden, ``X | None``
  omitted when None, ints non-negative unless ``SignedInt``, lists and maps within the
  limits) and must re-encode, keys sorted and ints in their shortest form, to exactly the
  bytes that arrived.
- Lengths of strings and bytes are bounded by the body's own length: bodies longer than
  the string or bytes limit take the strict path. Nesting depth is fixed by the schema.
- The payload is then built as the message dataclass itself (its ``__post_init__`` rules
  run); a rule it breaks sends the body to the strict path for the reason.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Mapping
from typing import Annotated, Any, TypeAlias

import msgspec

from protocol.encoding import Limits
from protocol.schema import SignedInt

__all__ = ["FastBody", "FastCodec"]

_UINT = Annotated[int, msgspec.Meta(ge=0)]
# What msgspec raises for input it refuses (bad UTF-8 is a ValueError): the strict path
# then says why, with its reason.
_UNSURE = (msgspec.MsgspecError, ValueError, TypeError, OverflowError)
_BODY_KEYS = 6  # type, from, nonce, iat, exp, data


# type name, signer, nonce, iat, exp, payload: what ``protocol.envelope.Signed`` holds.
FastBody: TypeAlias = tuple[str, bytes, bytes, int, int, Any]


class FastCodec:
    """Opens the bodies of the given message types under one set of limits."""

    __slots__ = ("_classes", "_decoder", "_encoder", "_max_len")

    def __init__(self, message_types: Mapping[str, type], limits: Limits, nonce_size: int) -> None:
        mirror = _Mirror(limits)
        bodies = []
        self._classes: dict[type, tuple[str, type]] = {}
        for name, cls in message_types.items():
            mirrored = mirror.of(cls)
            if mirrored is None:
                continue  # a type the mirror cannot state exactly: always the strict path
            data, height = mirrored
            if 1 + height > limits.max_depth:  # the body map is one level more
                continue
            body = _struct(
                f"{cls.__name__}Body",
                [
                    ("data", data),
                    ("exp", int),
                    ("from", Annotated[bytes, msgspec.Meta(min_length=32, max_length=32)]),
                    ("iat", _UINT),
                    (
                        "nonce",
                        Annotated[
                            bytes, msgspec.Meta(min_length=nonce_size, max_length=nonce_size)
                        ],
                    ),
                ],
                tag=name,
            )
            bodies.append(body)
            self._classes[body] = name, cls
        # Strings and bytes are no longer than the body they are in.
        self._max_len = min(limits.max_str, limits.max_bin, limits.max_size)
        if limits.max_map < _BODY_KEYS:
            bodies.clear()
        union = typing.Union[tuple(bodies)] if bodies else None  # noqa: UP007 - built at run time
        self._decoder = msgspec.msgpack.Decoder(union) if union is not None else None
        self._encoder = msgspec.msgpack.Encoder(order="sorted")

    def open(self, body: bytes) -> FastBody | None:
        """The body's head and payload, or None: let the strict path decide."""
        if len(body) > self._max_len or self._decoder is None:
            return None
        try:
            head = self._decoder.decode(body)
        except _UNSURE:
            return None
        if head.exp <= head.iat or self._encoder.encode(head) != body:
            return None
        name, cls = self._classes[type(head)]
        try:
            payload: Any = msgspec.convert(head.data, cls, from_attributes=True)
        except _UNSURE:
            return None
        return name, getattr(head, "from"), head.nonce, head.iat, head.exp, payload


class _Mirror:
    """Builds msgspec structs that state exactly what ``protocol.schema`` accepts, and the
    height of each (containers nested, counting its own map)."""

    def __init__(self, limits: Limits) -> None:
        self._limits = limits
        self._structs: dict[type, tuple[Any, int] | None] = {}

    def of(self, cls: type) -> tuple[Any, int] | None:
        if cls in self._structs:
            return self._structs[cls]
        self._structs[cls] = None  # recursion guard: a recursive type takes the strict path
        hints = typing.get_type_hints(cls)
        names = [f.name for f in dataclasses.fields(cls)]
        if len(names) > self._limits.max_map:
            return None
        fields: list[tuple[str, Any, Any] | tuple[str, Any]] = []
        height = 1
        for name in names:
            hint = hints[name]
            optional = isinstance(hint, types.UnionType) and type(None) in typing.get_args(hint)
            inner = self._field(_strip_optional(hint))
            if inner is None:
                return None
            kind, inner_height = inner
            height = max(height, 1 + inner_height)
            fields.append((name, kind | None, None) if optional else (name, kind))
        struct = _struct(f"{cls.__name__}Mirror", fields)
        self._structs[cls] = struct, height
        return struct, height

    def _field(self, hint: Any) -> tuple[Any, int] | None:  # noqa: ANN401 - a type expression
        if hint is SignedInt:
            return int, 0
        if hint is int:
            return _UINT, 0
        if hint in (bool, str, bytes):
            return hint, 0
        if isinstance(hint, type) and issubclass(hint, enum.StrEnum):
            return hint, 0
        if dataclasses.is_dataclass(hint) and isinstance(hint, type):
            return self.of(hint)
        origin = typing.get_origin(hint)
        supertype = getattr(hint, "__supertype__", None)
        if origin is tuple:
            item_hint, ellipsis = typing.get_args(hint)
            item = self._field(item_hint)
            if ellipsis is not Ellipsis or item is None:
                return None
            limit = msgspec.Meta(max_length=self._limits.max_array)
            return Annotated[tuple[item[0], ...], limit], 1 + item[1]  # type: ignore[valid-type]
        if origin is dict:
            key_hint, item_hint = typing.get_args(hint)
            item = self._field(item_hint)
            if key_hint is not str or item is None:
                return None
            limit = msgspec.Meta(max_length=self._limits.max_map)
            return Annotated[dict[str, item[0]], limit], 1 + item[1]  # type: ignore[valid-type]
        if supertype is not None:
            return self._field(supertype)
        return None


def _struct(name: str, fields: list[Any], tag: str | None = None) -> type[msgspec.Struct]:
    # Unknown fields refused; only None (an absent ``X | None``) left out when encoding.
    return msgspec.defstruct(
        name,
        fields,
        tag_field="type" if tag is not None else None,
        tag=tag,
        forbid_unknown_fields=True,
        omit_defaults=True,
        frozen=True,
        kw_only=True,
    )


def _strip_optional(hint: Any) -> Any:  # noqa: ANN401 - a type expression
    if isinstance(hint, types.UnionType):
        (inner,) = (a for a in typing.get_args(hint) if a is not type(None))
        return inner
    return hint
