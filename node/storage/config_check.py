"""``cx config check``: every problem of a home's ``config.toml``, each naming its key.

The node's own reader (:meth:`node.storage.home.Home.config`) stops at the first thing it
cannot use and ignores keys it does not know, so a typo (``cpu_mili``) silently falls back
to a default. This checker reads the same file against :data:`SCHEMA` and says, per key,
what is wrong and what was probably meant; then it runs the node's reader too, so
anything that reader refuses is reported as well. ``tests/node/test_config_check.py``
checks that every key ``cx init`` writes is in the schema.
"""

from __future__ import annotations

import difflib
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from node.storage.home import Home, HomeError, MachineCost
from protocol.messages import Arch
from protocol.pricing import PRICE_FIELDS, Policy

__all__ = ["SCHEMA", "Problem", "check_config"]

_TABLE = "table"
_STRINGS = "list of strings"
_PRICE_RULE = {"policy": str, "price": int, "floor": int, "ceiling": int, "undercut_ppm": int}

# Table -> key -> its type (or _TABLE / _STRINGS). Required keys are in _REQUIRED.
SCHEMA: dict[str, dict[str, Any]] = {
    "network": {"listen": _STRINGS, "bootstrap": _STRINGS, "dht": bool, "mdns": bool,
                "api_port": int},
    "buyer": {"ek_roots": _STRINGS},
    "provider": {
        "cpu_milli": int, "memory_bytes": int, "disk_bytes": int, "cpu_core_hour": int,
        "memory_gib_hour": int, "disk_gib_hour": int, "arch": str, "region": str, "tpm": bool,
        "tcti": str, "offer_ttl_ms": int, "max_share_ppm": int, "benchmark": bool,
        "gpu_hour": int, "gpu_shares": int,
        "pricing": _TABLE, "cost": _TABLE,
    },
    "provider.pricing": {
        "step_ppm": int, "min_interval_ms": int, "window_ms": int,
        **{name: _TABLE for name, _ in PRICE_FIELDS},
    },
    **{f"provider.pricing.{name}": _PRICE_RULE for name, _ in PRICE_FIELDS},
    "provider.cost": {f.name: int for f in fields(MachineCost)},
    "s3": {"endpoint": str, "region": str},
    "store": {"budget_bytes": int},
}  # fmt: skip
_REQUIRED = {
    "provider": ("cpu_milli", "memory_bytes", "cpu_core_hour"),
    "provider.cost": ("watts", "kwh_price"),
    "s3": ("endpoint",),
}
_CHOICES: dict[str, tuple[str, ...]] = {
    "arch": tuple(a.value for a in Arch),
    "policy": tuple(p.value for p in Policy),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Problem:
    """One thing wrong: ``where`` is ``[table] key`` (or the file), ``why`` one sentence."""

    where: str
    why: str

    def __str__(self) -> str:
        return f"{self.where}: {self.why}"


def check_config(home: Home) -> list[Problem]:
    """Every problem of ``home``'s config.toml; empty when the node can use it."""
    path = home.config_path
    try:
        doc = tomllib.loads(path.read_text())
    except FileNotFoundError:
        return [Problem(where=str(path), why="no such file; run `cx init`")]
    except (OSError, UnicodeDecodeError) as exc:
        return [Problem(where=str(path), why=f"cannot be read: {exc}")]
    except tomllib.TOMLDecodeError as exc:
        return [Problem(where=str(path), why=f"not valid TOML: {exc}")]
    problems = _table("", doc)
    problems += _files(doc)
    if not problems:
        try:
            home.config()
        except HomeError as exc:
            problems.append(Problem(where=str(path), why=str(exc).removeprefix(f"{path}: ")))
    return problems


def _table(name: str, table: dict[str, Any]) -> list[Problem]:
    known = SCHEMA.get(name) if name else dict.fromkeys(SCHEMA, _TABLE)
    assert known is not None
    problems = []
    for key, value in table.items():
        where = f"[{name}] {key}" if name else f"[{key}]"
        kind = known.get(key)
        if kind is None:
            guess = difflib.get_close_matches(key, list(known), n=1)
            hint = f"; did you mean {guess[0]}?" if guess else f"; known: {', '.join(known)}"
            problems.append(Problem(where=where, why=f"unknown {'key' if name else 'table'}{hint}"))
        elif kind == _TABLE:
            if isinstance(value, dict):
                problems += _table(f"{name}.{key}" if name else key, value)
            else:
                problems.append(Problem(where=where, why="must be a table"))
        else:
            problems += _value(where, key, value, kind)
    for key in _REQUIRED.get(name, ()):
        if key not in table:
            problems.append(Problem(where=f"[{name}] {key}", why="missing; it is required"))
    return problems


def _value(where: str, key: str, value: object, kind: Any) -> list[Problem]:  # noqa: ANN401
    if kind == _STRINGS:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            return [Problem(where=where, why=f"must be a list of strings, not {value!r}")]
        return []
    # bool is an int in Python, not in TOML: true is no port number.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        return [Problem(where=where, why=f"must be {_NAMES[kind]}, not {value!r}")]
    if kind is int and value < 0:
        return [Problem(where=where, why=f"must not be negative, not {value}")]
    if key == "api_port" and value > 65535:
        return [Problem(where=where, why=f"{value} is not a port (0..65535; 0: any free one)")]
    if key in _CHOICES and value not in _CHOICES[key]:
        return [Problem(where=where, why=f"{value!r} is not one of {', '.join(_CHOICES[key])}")]
    return []


_NAMES = {int: "a whole number", bool: "true or false", str: "a string"}


def _files(doc: dict[str, Any]) -> list[Problem]:
    roots = doc.get("buyer", {}).get("ek_roots", [])
    if not isinstance(roots, list):
        return []
    return [
        Problem(where="[buyer] ek_roots", why=f"{root}: no such file")
        for root in roots
        if isinstance(root, str) and not Path(root).is_file()
    ]
