"""A provider's quotas and priorities for groups of buyers (spec/matching.md, "Quotas and
priorities"), sans-IO: the provider feeds in what each buyer uses now.

Rules:
- A group names its buyers by key; a buyer belongs to the first group that names it, else
  to the default group (the one that names nobody), else to no group: no quota limits it
  and its priority is 0.
- A group's use is the sum over its buyers: the CPU, memory and GPUs that their accepted
  proposals and live agreements hold, how many those are (jobs at once), and credits: what
  they paid this provider in the current UTC day (receipts settled since 00:00 UTC) plus the
  ``max_cost`` of their agreements not settled yet.
- A request is refused when its group's use plus the request would pass a limit; limits
  are checked in the order of :class:`QuotaKind` and the first passed is named. A limit of
  None is no limit; 0 refuses everything of that kind.
- Priority: among bids a provider invites, the higher group priority goes first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from protocol.identity import PublicKey
from protocol.messages import QuotaKind, QuotaRefusal, Reject, Resources
from protocol.units import cores, credits, size

__all__ = [
    "DAY_MS",
    "GroupUse",
    "Quota",
    "Quotas",
    "day_start",
    "describe",
    "held_back",
    "refusal",
    "why_rejected",
]

DAY_MS = 86_400_000


def day_start(now_ms: int) -> int:
    """00:00 UTC of the day ``now_ms`` falls in (Unix time has no leap seconds)."""
    return now_ms - now_ms % DAY_MS


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupUse:
    """What a group holds or spent, in the quotas' units."""

    cpu_milli: int = 0
    memory_bytes: int = 0
    gpus: int = 0
    jobs: int = 0
    credits: int = 0  # micro-credits, this UTC day

    @classmethod
    def of(cls, resources: Resources, max_cost: int) -> GroupUse:
        """The use of one job holding ``resources`` at most ``max_cost``."""
        return cls(
            cpu_milli=resources.cpu_milli,
            memory_bytes=resources.memory_bytes,
            gpus=resources.gpus,
            jobs=1,
            credits=max_cost,
        )

    def plus(self, other: GroupUse) -> GroupUse:
        return GroupUse(
            cpu_milli=self.cpu_milli + other.cpu_milli,
            memory_bytes=self.memory_bytes + other.memory_bytes,
            gpus=self.gpus + other.gpus,
            jobs=self.jobs + other.jobs,
            credits=self.credits + other.credits,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Quota:
    """One group's limits (None: none) and priority; ``members`` empty: the default group."""

    name: str
    members: frozenset[bytes] = frozenset()  # buyers' 32-byte keys
    cpu_milli: int | None = None
    memory_bytes: int | None = None
    gpus: int | None = None
    jobs: int | None = None
    credits_per_day: int | None = None  # micro-credits
    priority: int = 0

    def limit(self, kind: QuotaKind) -> int | None:
        return {
            QuotaKind.CORES: self.cpu_milli,
            QuotaKind.MEMORY: self.memory_bytes,
            QuotaKind.GPUS: self.gpus,
            QuotaKind.JOBS: self.jobs,
            QuotaKind.CREDITS_PER_DAY: self.credits_per_day,
        }[kind]


@dataclass(frozen=True, slots=True, kw_only=True)
class Quotas:
    """A provider's groups, in the order its config lists them."""

    groups: tuple[Quota, ...] = ()

    def group_of(self, buyer: bytes) -> Quota | None:
        named = next((g for g in self.groups if buyer in g.members), None)
        return named or next((g for g in self.groups if not g.members), None)

    def priority(self, buyer: bytes) -> int:
        group = self.group_of(buyer)
        return group.priority if group is not None else 0

    def use(self, group: Quota, jobs: Iterable[tuple[bytes, GroupUse]]) -> GroupUse:
        """The sum of the ``(buyer, use)`` items whose buyer is in ``group``."""
        total = GroupUse()
        for buyer, use in jobs:
            if self.group_of(buyer) is group:
                total = total.plus(use)
        return total


_USED: dict[QuotaKind, Callable[[GroupUse], int]] = {
    QuotaKind.CORES: lambda u: u.cpu_milli,
    QuotaKind.MEMORY: lambda u: u.memory_bytes,
    QuotaKind.GPUS: lambda u: u.gpus,
    QuotaKind.JOBS: lambda u: u.jobs,
    QuotaKind.CREDITS_PER_DAY: lambda u: u.credits,
}


def refusal(group: Quota, used: GroupUse, more: GroupUse) -> QuotaRefusal | None:
    """The first quota of ``group`` that ``more`` on top of ``used`` would pass, or None."""
    for kind, of in _USED.items():
        limit = group.limit(kind)
        if limit is not None and of(used) + of(more) > limit:
            return QuotaRefusal(quota=kind, group=group.name, limit=limit, used=of(used))
    return None


_SAY: dict[QuotaKind, Callable[[int, int], str]] = {
    QuotaKind.CORES: lambda limit, used: f"may hold {cores(limit)}; it has {cores(used)}",
    QuotaKind.MEMORY: lambda limit, used: f"may hold {size(limit)} of memory; it has {size(used)}",
    QuotaKind.GPUS: lambda limit, used: f"may hold {limit} GPU(s); it has {used}",
    QuotaKind.JOBS: lambda limit, used: f"may run {limit} job(s) at once; it runs {used}",
    QuotaKind.CREDITS_PER_DAY: lambda limit, used: (
        f"may spend {credits(limit)} credits per UTC day; it has spent {credits(used)}"
    ),
}


def describe(r: QuotaRefusal) -> str:
    """One line: ``quota:cores: group 'students' may hold 2 cores; it has 1.5 cores``."""
    return f"quota:{r.quota}: group {r.group!r} {_SAY[r.quota](r.limit, r.used)}"


def why_rejected(reject: Reject) -> str:
    """A reject in one line: the quota it names, else its reason and detail."""
    if reject.quota is not None:
        return describe(reject.quota)
    return f"{reject.reason} {reject.detail}".strip()


def held_back(over: Mapping[bytes, QuotaRefusal]) -> str | None:
    """Why a buyer's bid waits on providers' quotas (provider key -> refusal), in one line;
    None when none refused it for a quota."""
    if not over:
        return None
    said = "; ".join(f"{PublicKey(p).peer_id} refused it, {describe(r)}" for p, r in over.items())
    return f"{said}; it waits for an invitation or another offer"
