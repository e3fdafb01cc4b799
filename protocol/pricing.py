"""What a provider asks: pricing policies as pure functions (spec/pricing.md).

Rules:
- Each resource (CPU per core-hour; memory, disk per GiB-hour; GPU per GPU-hour) has a
  policy, a floor and a ceiling, in micro-credits:
  - ``fixed``: the configured price, always.
  - ``utilization``: ``floor + (ceiling - floor) * held / capacity`` of that resource,
    floored once; a provider's price rises as its capacity is committed and falls as it
    empties. A resource it does not sell (capacity 0) is at its floor.
  - ``market``: the median of the trade prints of its resource class (the tape) in the
    last ``window_ms``, less ``undercut_ppm`` parts per million; the configured price when
    there are none.
  Every policy's result is clamped into ``[floor, ceiling]``.
- The floor may be derived from cost: a machine drawing ``watts`` at full load, power at
  ``kwh_price`` per kWh and ``depreciation_per_hour``, spread over its cores, gives the
  lowest CPU price per core-hour that pays for itself (:func:`cost_floor`).
- A provider re-posts its offer when a price moves by more than ``step_ppm`` parts per
  million of the current one, and not more often than ``min_interval_ms``
  (:func:`should_repost`), so gossip is not flooded by small moves.
- A buyer's bid with a deadline climbs a *ladder* (:func:`ladder`): it starts at
  ``start_ppm`` of its maximum prices and rises in ``steps`` equal steps, the k-th at
  ``created + ceil(k * deadline / steps)``, reaching the maximum at the deadline.
Integers only: the same inputs give the same prices on every node.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

from protocol.messages import Prices, Resources

__all__ = [
    "LADDER_START_PPM",
    "LADDER_STEPS",
    "MARKET_WINDOW_MS",
    "NO_CEILING",
    "PPM",
    "PRICE_FIELDS",
    "REPOST_INTERVAL_MS",
    "REPOST_STEP_PPM",
    "Policy",
    "Pricing",
    "ResourcePricing",
    "Rung",
    "asking",
    "cost_floor",
    "ladder",
    "should_repost",
]

PPM = 1_000_000
NO_CEILING = 2**63 - 1
REPOST_STEP_PPM = 50_000  # re-post when a price moves by more than 5 %
REPOST_INTERVAL_MS = 10_000  # and not more often than this
MARKET_WINDOW_MS = 600_000  # the market policy follows the prints of the last 10 minutes
LADDER_START_PPM = 500_000  # a deadline's bid starts at half its maximum
LADDER_STEPS = 4
# Each price and the resource whose use it charges for.
PRICE_FIELDS = (
    ("cpu_core_hour", "cpu_milli"),
    ("memory_gib_hour", "memory_bytes"),
    ("disk_gib_hour", "disk_bytes"),
    ("gpu_hour", "gpus"),
)


class Policy(enum.StrEnum):
    FIXED = "fixed"
    UTILIZATION = "utilization"
    MARKET = "market"


@dataclass(frozen=True, slots=True, kw_only=True)
class ResourcePricing:
    """How one resource is priced. ``price`` is the fixed price, and the market policy's
    price while the tape has no prints."""

    policy: Policy = Policy.FIXED
    price: int
    floor: int = 0
    ceiling: int = NO_CEILING
    undercut_ppm: int = 0  # market: ask this much below the median print

    def __post_init__(self) -> None:
        if not 0 <= self.floor <= self.ceiling:
            raise ValueError(f"floor {self.floor} must lie in 0..ceiling {self.ceiling}")
        if not 0 <= self.undercut_ppm < PPM:
            raise ValueError("undercut_ppm must lie in 0..999999")


@dataclass(frozen=True, slots=True, kw_only=True)
class Pricing:
    """A provider's pricing, one entry per price field of :class:`Prices`."""

    resources: Mapping[str, ResourcePricing]
    step_ppm: int = REPOST_STEP_PPM
    min_interval_ms: int = REPOST_INTERVAL_MS
    window_ms: int = MARKET_WINDOW_MS

    @property
    def moves(self) -> bool:
        """Whether any price follows something: else there is nothing to re-post."""
        return any(rule.policy is not Policy.FIXED for rule in self.resources.values())

    @classmethod
    def fixed(cls, prices: Prices) -> Pricing:
        """Today's behaviour: every price as configured, always."""
        return cls(
            resources={f: ResourcePricing(price=getattr(prices, f)) for f, _ in PRICE_FIELDS}
        )

    def rule(self, price_field: str) -> ResourcePricing:
        return self.resources.get(price_field, _FREE)


_FREE = ResourcePricing(price=0)


def cost_floor(*, watts: int, kwh_price: int, depreciation_per_hour: int, cpu_milli: int) -> int:
    """The CPU price per core-hour at which a machine pays for its power and its wear when
    every core is busy: ``(watts / 1000 * kwh_price + depreciation_per_hour) / cores``,
    rounded up (a floor that loses money would not be one)."""
    if cpu_milli <= 0:
        raise ValueError("a machine with no CPU has no CPU floor")
    # per hour: watts / 1000 * kwh_price + depreciation; per core-hour: that / (cpu_milli /
    # 1000). Both divisions by 1000 cancel, so the one division below is exact but for it.
    return -(-(watts * kwh_price + depreciation_per_hour * 1000) // cpu_milli)


def asking(
    pricing: Pricing,
    *,
    held: Resources,
    capacity: Resources,
    prints: Mapping[str, Sequence[int]] = {},
) -> Prices:
    """The prices to ask now: ``held`` of ``capacity`` is committed; ``prints`` holds, per
    price field, the recent trade prices of the provider's resource class (the tape)."""
    out = {}
    for price_field, resource in PRICE_FIELDS:
        rule = pricing.rule(price_field)
        out[price_field] = _clamp(
            rule,
            _policy_price(
                rule,
                getattr(held, resource),
                getattr(capacity, resource),
                prints.get(price_field, ()),
            ),
        )
    return Prices(**out)


def _policy_price(rule: ResourcePricing, held: int, capacity: int, prints: Sequence[int]) -> int:
    if rule.policy is Policy.UTILIZATION:
        if capacity <= 0:
            return rule.floor
        share = min(max(held, 0), capacity)
        return rule.floor + (rule.ceiling - rule.floor) * share // capacity
    if rule.policy is Policy.MARKET:
        if not prints:
            return rule.price
        return _median(prints) * (PPM - rule.undercut_ppm) // PPM
    return rule.price


def _clamp(rule: ResourcePricing, price: int) -> int:
    return min(max(price, rule.floor), rule.ceiling)


def _median(values: Sequence[int]) -> int:
    """The lower median: an integer every node computes alike."""
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2]


def should_repost(
    current: Prices,
    new: Prices,
    *,
    step_ppm: int,
    posted_ms: int,
    now_ms: int,
    min_interval_ms: int,
) -> bool:
    """Whether prices moved enough, and long enough after the last post, to post again."""
    if now_ms - posted_ms < min_interval_ms:
        return False
    for f in fields(Prices):
        old, price = getattr(current, f.name), getattr(new, f.name)
        if old == 0:
            if price != 0:
                return True
        elif abs(price - old) * PPM > step_ppm * old:
            return True
    return False


@dataclass(frozen=True, slots=True, kw_only=True)
class Rung:
    """Where a deadline's bid stands: its limit now, and when it next rises (None: it is
    at its maximum)."""

    limit: Prices
    next_rise_ms: int | None


def ladder(
    max_prices: Prices,
    *,
    created_ms: int,
    deadline_ms: int,
    now_ms: int,
    start_ppm: int = LADDER_START_PPM,
    steps: int = LADDER_STEPS,
) -> Rung:
    """The limit of a bid posted at ``created_ms`` that must trade within ``deadline_ms``."""
    if deadline_ms <= 0 or steps <= 0 or not 0 <= start_ppm <= PPM:
        raise ValueError("a ladder needs a positive deadline and steps, and a start in 0..PPM")
    elapsed = max(0, now_ms - created_ms)
    step = min(steps, elapsed * steps // deadline_ms)
    share = start_ppm + (PPM - start_ppm) * step // steps
    limit = Prices(**{f.name: getattr(max_prices, f.name) * share // PPM for f in fields(Prices)})
    if step >= steps:
        return Rung(limit=limit, next_rise_ms=None)
    return Rung(limit=limit, next_rise_ms=created_ms - (-(step + 1) * deadline_ms // steps))
