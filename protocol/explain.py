"""Why a bid does not match, in one sentence a user can act on (spec/matching.md,
"Explanations").

Rules:
- Counts come first (how many offers each constraint rules out), then what to change.
- Price is compared per unit, as matching does: for each resource the bid uses, the
  cheapest unit price among offers that fit otherwise against the bid's limit. Totals
  (a quote for the whole wall-time) are never compared with unit limits.
- Capacity names what is largest on offer where the bid asks for more.
- Transfer names the cheapest move of the data against the bid's budget, and, for a bid
  that matched, each offer that asked less but lost on the cost of moving the data
  (:func:`why_ranked`), with the figures in credits.
Pure: the same explanation of the same bid always reads the same.
"""

from __future__ import annotations

from protocol.book import Explanation, Ranked
from protocol.messages import Bid, Prices, Resources
from protocol.transfer import TransferCost
from protocol.units import cores, credits, size

__all__ = ["why_not", "why_ranked"]

_PRICE_UNITS = (
    ("cpu_core_hour", "CPU", "core-hour", "cpu_milli"),
    ("memory_gib_hour", "memory", "GiB-hour", "memory_bytes"),
    ("disk_gib_hour", "disk", "GiB-hour", "disk_bytes"),
    ("gpu_hour", "GPU", "GPU-hour", "gpus"),
)


def why_not(e: Explanation, bid: Bid) -> str:
    """The explanation of ``e`` (``OrderBook.explain`` of ``bid``) as one sentence."""
    if e.offers == 0:
        return "no offers are known to this node yet; is it connected (`cx peers`)?"
    if e.matching:
        return f"{e.matching} of {e.offers} offers fit; negotiation is under way or they refused"
    counts = ", ".join(f"{name} rules out {n}" for name, n in e.ruled_out.items() if n)
    advice = [
        *_everywhere(e, bid),
        *_capacity(e, bid.resources),
        *_prices(e, bid),
        *_transfer(e, bid),
    ]
    if not advice:
        advice = ["no offer passes all of them together"]
    return f"none of {e.offers} offers fits ({counts}): {'; '.join(advice)}"


def _everywhere(e: Explanation, bid: Bid) -> list[str]:
    """What each constraint that rules out every offer on its own asks for."""
    c = bid.constraints
    said = {
        "arch": f"no offer runs {c.arch}",
        "region": f"no offer is in {' or '.join(c.regions)}",
        "trust": f"no offer attests {c.trust.level}",
        "reputation": f"no provider has a reputation of {c.min_reputation} here",
        "gpu-model": f"no offer has {bid.resources.gpus} {c.gpu_model} GPUs",
        "network": "no offer lets jobs use the network",
        "wall-time": f"no offer allows {bid.job.wall_ms // 1000} s of wall time",
        "provider": "the provider it names has no live offer here",
    }
    return [text for name, text in said.items() if e.ruled_out.get(name) == e.offers]


def _capacity(e: Explanation, need: Resources) -> list[str]:
    if not e.ruled_out.get("capacity") or e.largest_free is None:
        return []
    most = e.largest_free
    short = [
        (what, f"{fmt(getattr(need, field))} asked, {fmt(getattr(most, field))} free at most")
        for what, field, fmt in (
            ("CPU", "cpu_milli", cores),
            ("memory", "memory_bytes", size),
            ("disk", "disk_bytes", size),
            ("GPUs", "gpus", str),
        )
        if getattr(need, field) > getattr(most, field)
    ]
    return [f"{what}: {detail}" for what, detail in short]


def _prices(e: Explanation, bid: Bid) -> list[str]:
    cheapest: Prices | None = e.cheapest
    if not e.ruled_out.get("price") or cheapest is None:
        return []
    out = []
    for field, what, unit, used in _PRICE_UNITS:
        ask, limit = getattr(cheapest, field), getattr(bid.max_prices, field)
        if getattr(bid.resources, used) and ask > limit:
            out.append(
                f"{what} costs at least {credits(ask)} credits per {unit}, "
                f"your limit is {credits(limit)}"
            )
    return out


def _moving(t: TransferCost) -> str:
    """``t`` in words: "moving 2 GiB costs 0.40 credits (ingress 0.20, egress 0.20)"."""
    parts = [
        f"{name} {credits(amount)}"
        for name, amount in (("ingress", t.ingress), ("egress", t.egress), ("outputs", t.outputs))
        if amount
    ]
    held = f" ({size(t.held_bytes)} held there already)" if t.held_bytes else ""
    if not t.total:
        return f"moving {size(t.moved_bytes)}{held} costs nothing"
    detail = f" ({', '.join(parts)})" if parts else ""
    return f"moving {size(t.moved_bytes)}{held} costs {credits(t.total)} credits{detail}"


def _transfer(e: Explanation, bid: Bid) -> list[str]:
    least = e.least_transfer
    if not e.ruled_out.get("transfer") or least is None or bid.data is None:
        return []
    return [
        f"{_moving(least)} to the cheapest of them, over the egress budget of "
        f"{credits(bid.data.budget)} credits"
    ]


def why_ranked(ranking: list[Ranked], provider: str, bid: Bid) -> str:
    """For ``bid``, which states where its data lives: how the offer of ``provider`` (a
    peer id) it matched compared with those that asked less but cost more once the data is
    moved, or were over the budget. Empty when that provider has no live offer."""
    won = next((r for r in ranking if r.offer.signer.peer_id == provider), None)
    if won is None:
        return ""
    said = [
        f"it asked {credits(won.quote)} credits and {_moving(won.transfer)}, "
        f"{credits(won.total)} in all"
    ]
    for r in ranking:
        if r is won or r.quote >= won.quote:
            continue
        who = f"{r.offer.signer.peer_id} (region {r.offer.payload.region or '-'})"
        if not r.within_budget:
            said.append(
                f"{who} asked {credits(r.quote)} but {_moving(r.transfer)}, over the egress "
                f"budget of {credits(bid.data.budget if bid.data else None)} credits"
            )
        else:
            said.append(
                f"{who} asked {credits(r.quote)} but {_moving(r.transfer)}, "
                f"{credits(r.total)} in all"
            )
    return "; ".join(said)
