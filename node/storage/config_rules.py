"""What a node's config.toml may hold: every table and key, its type, range and whether it
is required. One schema with two callers: the node at start-up (node/storage/home.py refuses
to start on any problem) and ``cx config check`` (node/storage/config_check.py, which adds
the checks that need the filesystem).

A misspelt key, a value of the wrong type or out of range is a :class:`Problem` named on one
line (``[provider] cpu_mili: unknown key; did you mean cpu_milli?``), all of them at once; a
provider selling more than this host has is warned about (:func:`host_shortfall`).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from node.storage.quota_config import check_quotas
from protocol.messages import Arch, Resources
from protocol.pricing import PRICE_FIELDS, Policy
from protocol.units import cores, size

__all__ = ["Problem", "config_problems", "host_shortfall"]

Check = Callable[[Any], str | None]  # None: fine; else what is wrong
Table: TypeAlias = "Mapping[str, Check | Table]"  # a key's check, or a sub-table's keys


@dataclass(frozen=True, slots=True, kw_only=True)
class Problem:
    """One thing wrong: ``where`` is ``[table] key`` (or the file), ``why`` one sentence."""

    where: str
    why: str

    def __str__(self) -> str:
        return f"{self.where}: {self.why}"


def _int(low: int = 0, high: int | None = None) -> Check:
    def check(v: Any) -> str | None:  # noqa: ANN401 - any TOML value
        # bool is an int in Python, not in TOML: true is no port number.
        if isinstance(v, bool) or not isinstance(v, int):
            return f"must be a whole number, not {v!r}"
        if high is not None and not low <= v <= high:
            return f"{v} is outside {low}..{high}"
        return f"must be at least {low}, not {v}" if v < low else None

    return check


def _bool(v: Any) -> str | None:  # noqa: ANN401 - any TOML value
    return None if isinstance(v, bool) else f"must be true or false, not {v!r}"


def _str(v: Any) -> str | None:  # noqa: ANN401 - any TOML value
    return None if isinstance(v, str) else f"must be a string, not {v!r}"


def _strings(v: Any) -> str | None:  # noqa: ANN401 - any TOML value
    ok = isinstance(v, list) and all(isinstance(x, str) for x in v)
    return None if ok else f"must be a list of strings, not {v!r}"


def _one_of(*names: str) -> Check:
    def check(v: Any) -> str | None:  # noqa: ANN401 - any TOML value
        return None if v in names else f"{v!r} is not one of {', '.join(names)}"

    return check


def _url(v: Any) -> str | None:  # noqa: ANN401 - any TOML value
    ok = isinstance(v, str) and v.startswith(("http://", "https://"))
    return None if ok else f"must be an http(s):// URL, not {v!r}"


_MONEY = _int(0)  # micro-credits
_PRICE_RULE: Table = {  # how one price moves (protocol/pricing.py)
    "policy": _one_of(*(p.value for p in Policy)),
    "price": _MONEY,
    "floor": _MONEY,
    "ceiling": _MONEY,
    "undercut_ppm": _int(0, 1_000_000),
}
SCHEMA: Table = {
    "network": {
        "listen": _strings,
        "bootstrap": _strings,
        "dht": _bool,
        "mdns": _bool,
        "api_port": _int(0, 65535),
    },
    "buyer": {"ek_roots": _strings},
    "provider": {
        "cpu_milli": _int(1),
        "memory_bytes": _int(1),
        "disk_bytes": _int(0),
        "cpu_core_hour": _MONEY,
        "memory_gib_hour": _MONEY,
        "disk_gib_hour": _MONEY,
        "gpu_hour": _MONEY,
        "ingress_gib": _MONEY,  # per GiB brought in for a job (spec/matching.md)
        "egress_gib": _MONEY,  # per GiB of a job's outputs sent out
        "arch": _one_of(*(a.value for a in Arch)),
        "region": _str,
        "tpm": _bool,
        "tcti": _str,
        "offer_ttl_ms": _int(1),
        "max_share_ppm": _int(0, 1_000_000),
        "benchmark": _bool,
        "gpu_shares": _int(0, 64),
        "pricing": {
            "step_ppm": _int(0, 1_000_000),
            "min_interval_ms": _int(0),
            "window_ms": _int(1),
            **{name: _PRICE_RULE for name, _ in PRICE_FIELDS},
        },
        "cost": {"watts": _int(0), "kwh_price": _MONEY, "depreciation_per_hour": _MONEY},
        "quota": check_quotas,  # [[provider.quota]]: node/storage/quota_config.py
    },
    "s3": {"endpoint": _url, "region": _str},
    "store": {"budget_bytes": _int(0)},
}
# Keys a table must have when it is there at all (a node without [provider] only buys).
REQUIRED: Mapping[str, tuple[str, ...]] = {
    "provider": ("cpu_milli", "memory_bytes", "cpu_core_hour"),
    "provider.cost": ("watts", "kwh_price"),
    "s3": ("endpoint",),
}


def config_problems(doc: Mapping[str, Any]) -> list[Problem]:
    """Every problem of a parsed config.toml; empty when the schema allows it."""
    return _table("", doc, SCHEMA)


def _table(name: str, table: Mapping[str, Any], known: Table) -> list[Problem]:
    problems = []
    for key, value in table.items():
        path = f"{name}.{key}" if name else key
        where = f"[{name}] {key}" if name else f"[{key}]"
        rule = known.get(key)
        if rule is None:
            kind = "key" if name else "table"
            guess = difflib.get_close_matches(key, list(known), n=1)
            hint = f"did you mean {guess[0]}?" if guess else f"known: {', '.join(known)}"
            problems.append(Problem(where=where, why=f"unknown {kind}; {hint}"))
        elif isinstance(rule, Mapping):
            if isinstance(value, dict):
                problems += _table(path, value, rule)
            else:
                problems.append(Problem(where=where, why=f"must be a table, not {value!r}"))
        elif (wrong := rule(value)) is not None:
            problems.append(Problem(where=where, why=wrong))
    problems += [
        Problem(where=f"[{name}] {key}", why="missing; it is required")
        for key in REQUIRED.get(name, ())
        if key not in table
    ]
    return problems


def host_shortfall(capacity: Resources) -> list[str]:
    """What a provider offers beyond this host, one line each (jobs would be squeezed or
    killed for memory: a warning, since the host may be meant to overcommit)."""
    out = []
    cpus = os.cpu_count() or 1
    if capacity.cpu_milli > cpus * 1000:
        out.append(f"sells {cores(capacity.cpu_milli)}; this host has {cores(cpus * 1000)}")
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if capacity.memory_bytes > memory:
        out.append(f"sells {size(capacity.memory_bytes)} of memory; this host has {size(memory)}")
    return out
