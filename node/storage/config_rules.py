"""What a node's config.toml may hold: every section and key, its type and range. A
misspelt key, a value of the wrong type or out of range is a problem named on one line
(``[provider] cpu_mili: unknown key; did you mean cpu_milli?``), all of them at once, before
the node starts; a provider selling more than this host has is warned about.

Pure checks over the parsed TOML document; node/storage/home.py turns problems into a
HomeError.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Mapping
from typing import Any

from protocol.messages import Arch, Resources
from protocol.units import cores, size

__all__ = ["config_problems", "host_shortfall"]

Check = Callable[[Any], str | None]  # None: fine; else what is wrong


def _int(low: int, high: int | None = None) -> Check:
    def check(v: Any) -> str | None:  # noqa: ANN401 - any TOML value
        if isinstance(v, bool) or not isinstance(v, int):
            return f"must be a whole number, not {v!r}"
        if v < low or (high is not None and v > high):
            return f"{v} is outside {low}..{high}" if high is not None else f"must be >= {low}"
        return None

    return check


def _bool(v: Any) -> str | None:  # noqa: ANN401 - any TOML value
    return None if isinstance(v, bool) else f"must be true or false, not {v!r}"


def _str(v: Any) -> str | None:  # noqa: ANN401 - any TOML value
    return None if isinstance(v, str) else f"must be a string, not {v!r}"


def _strings(v: Any) -> str | None:  # noqa: ANN401 - any TOML value
    ok = isinstance(v, list) and all(isinstance(x, str) for x in v)
    return None if ok else f"must be a list of strings, not {v!r}"


def _arch(v: Any) -> str | None:  # noqa: ANN401 - any TOML value
    names = [a.value for a in Arch]
    return None if v in names else f"must be one of {', '.join(names)}, not {v!r}"


def _url(v: Any) -> str | None:  # noqa: ANN401 - any TOML value
    ok = isinstance(v, str) and v.startswith(("http://", "https://"))
    return None if ok else f"must be an http(s):// URL, not {v!r}"


def _table(keys: dict[str, Check] | None) -> Check:
    """A sub-table; with ``keys``, its keys checked as a section's are (first problem)."""

    def check(v: Any) -> str | None:  # noqa: ANN401 - any TOML value
        if not isinstance(v, dict):
            return f"must be a table, not {v!r}"
        if keys is None:
            return None
        for key, value in v.items():
            if key not in keys:
                return _unknown(key, "", list(keys)).replace("section", "key")
            if (wrong := keys[key](value)) is not None:
                return f"{key}: {wrong}"
        return None

    return check


_MONEY = _int(0)
# section -> key -> (check, required)
_SCHEMA: dict[str, dict[str, tuple[Check, bool]]] = {
    "network": {
        "listen": (_strings, False),
        "bootstrap": (_strings, False),
        "dht": (_bool, False),
        "mdns": (_bool, False),
        "api_port": (_int(0, 65535), False),
    },
    "buyer": {"ek_roots": (_strings, False)},
    "provider": {
        "cpu_milli": (_int(1), True),
        "memory_bytes": (_int(1), True),
        "disk_bytes": (_int(0), False),
        "cpu_core_hour": (_MONEY, True),
        "memory_gib_hour": (_MONEY, False),
        "disk_gib_hour": (_MONEY, False),
        "gpu_hour": (_MONEY, False),
        "arch": (_arch, False),
        "region": (_str, False),
        "tpm": (_bool, False),
        "tcti": (_str, False),
        "offer_ttl_ms": (_int(1), False),
        "max_share_ppm": (_int(0, 1_000_000), False),
        "benchmark": (_bool, False),
        "gpu_shares": (_int(0, 64), False),
        "pricing": (_table(None), False),  # its keys: node/storage/home.py _parse_pricing
        "cost": (
            _table({"watts": _int(0), "kwh_price": _MONEY, "depreciation_per_hour": _MONEY}),
            False,
        ),
    },
    "s3": {"endpoint": (_url, True), "region": (_str, False)},
    "store": {"budget_bytes": (_int(0), False)},
}


def config_problems(doc: Mapping[str, Any]) -> list[str]:
    """Every problem of a parsed config.toml, one line each; empty when it is usable."""
    problems = []
    for name, section in doc.items():
        if name not in _SCHEMA:
            problems.append(_unknown(name, "", list(_SCHEMA)))
            continue
        if not isinstance(section, dict):
            problems.append(f"[{name}]: must be a table")
            continue
        keys = _SCHEMA[name]
        for key, value in section.items():
            if key not in keys:
                problems.append(_unknown(key, f"[{name}] ", list(keys)))
            elif (wrong := keys[key][0](value)) is not None:
                problems.append(f"[{name}] {key}: {wrong}")
        problems += [
            f"[{name}] {key}: missing"
            for key, (_, required) in keys.items()
            if required and key not in section
        ]
    return problems


def _unknown(key: str, where: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else f" (known: {', '.join(known)})"
    return f"{where}{key}: unknown {'key' if where else 'section'}{hint}"


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
