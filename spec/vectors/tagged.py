"""JSON form of canonical values used by the vector files: bytes are {"$hex": "..."}."""

from __future__ import annotations

from typing import Any


def to_json(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"$hex": value.hex()}
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    return value


def from_json(value: Any) -> Any:
    if isinstance(value, dict):
        if value.keys() == {"$hex"}:
            return bytes.fromhex(value["$hex"])
        return {k: from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_json(v) for v in value]
    return value
