"""``[[provider.quota]]`` in config.toml: a provider's quotas and priorities per group of
buyers (protocol/quotas.py, spec/matching.md "Quotas and priorities").

    [[provider.quota]]
    name = "students"              # required, unique; named in refusals
    peers = ["12D3KooW...", ...]   # its buyers' peer ids; none: everyone no group names
    cpu_milli = 2000               # at most, held at once: millicores, bytes, GPUs, jobs
    memory_bytes = 4294967296
    gpus = 0
    jobs = 2
    credits_per_day = 5000000      # micro-credits per UTC day
    priority = 10                  # higher is invited first (default 0)

A limit left out is no limit. node/storage/config_rules.py checks it with
:func:`check_quotas` (at start-up and for ``cx config check``).
"""

from __future__ import annotations

from typing import Any

from protocol.errors import InvalidMessage
from protocol.identity import PublicKey
from protocol.quotas import Quota, Quotas

__all__ = ["QUOTA_LIMITS", "check_quotas", "parse_quotas", "quota_problems", "render_quotas"]

QUOTA_LIMITS = ("cpu_milli", "memory_bytes", "gpus", "jobs", "credits_per_day")
_KEYS = ("name", "peers", *QUOTA_LIMITS, "priority")
_PRIORITY = 1_000_000  # priorities lie within +- this


def check_quotas(value: Any) -> str | None:  # noqa: ANN401 - any TOML value
    """Every problem of ``[[provider.quota]]`` in one line (config_rules' check), or None:
    ``'students' jobs: must be a whole number >= 0, not -1; ...``."""
    return "; ".join(quota_problems(value)) or None


def quota_problems(value: Any) -> list[str]:  # noqa: ANN401 - any TOML value
    """Every problem of ``[[provider.quota]]``, each naming its group and key."""
    if not isinstance(value, list) or not all(isinstance(q, dict) for q in value):
        return ["must be an array of tables, each under its own [[provider.quota]]"]
    problems: list[str] = []
    names: set[str] = set()
    seen: dict[str, str] = {}
    for i, entry in enumerate(value, 1):
        name = entry.get("name")
        where = repr(name) if isinstance(name, str) and name else f"#{i}"
        problems += [f"{where} {k}: unknown key (known: {', '.join(_KEYS)})"
                     for k in entry if k not in _KEYS]  # fmt: skip
        if not isinstance(name, str) or not name:
            problems.append(f"{where} name: missing; every group needs a name")
        elif name in names:
            problems.append(f"{where} name: two groups have this name")
        names.add(str(name))
        for key in QUOTA_LIMITS:
            v = entry.get(key, 0)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                problems.append(f"{where} {key}: must be a whole number >= 0, not {v!r}")
        p = entry.get("priority", 0)
        if isinstance(p, bool) or not isinstance(p, int) or abs(p) > _PRIORITY:
            problems.append(f"{where} priority: must be a whole number within +-{_PRIORITY}")
        peers = entry.get("peers", [])
        if not isinstance(peers, list) or not all(isinstance(x, str) for x in peers):
            problems.append(f"{where} peers: must be a list of peer ids (12D3KooW...)")
            continue
        for peer in peers:
            try:
                PublicKey.from_peer_id(peer)
            except InvalidMessage:
                problems.append(f"{where} peers: {peer!r} is not a peer id (as cx status shows)")
            if peer in seen:
                problems.append(f"{where} peers: {peer} is in group {seen[peer]!r} already")
            seen.setdefault(peer, str(name))
    if sum(not q.get("peers") for q in value) > 1:
        problems.append("more than one group names no peers (the default group)")
    return problems


def parse_quotas(value: Any) -> Quotas:  # noqa: ANN401 - any TOML value
    """The groups of ``[[provider.quota]]``.

    Raises:
        ValueError: the first of :func:`quota_problems`.
    """
    if problems := quota_problems(value):
        raise ValueError(f"[[provider.quota]] {problems[0]}")
    return Quotas(
        groups=tuple(
            Quota(
                name=entry["name"],
                members=frozenset(PublicKey.from_peer_id(p).raw for p in entry.get("peers", [])),
                priority=entry.get("priority", 0),
                **{k: entry[k] for k in QUOTA_LIMITS if k in entry},
            )
            for entry in value
        )
    )


def render_quotas(quotas: Quotas) -> list[dict[str, object]]:
    """The ``[[provider.quota]]`` entries of ``quotas`` (None values left out)."""
    return [
        {
            "name": q.name,
            "peers": sorted(PublicKey(raw).peer_id for raw in q.members),
            **{k: getattr(q, k) for k in QUOTA_LIMITS},
            "priority": q.priority,
        }
        for q in quotas.groups
    ]
