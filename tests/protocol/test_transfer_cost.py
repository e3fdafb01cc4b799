"""Transfer cost (spec/matching.md revision 6): what moving a bid's data to a provider
costs, the provider's held-blob filter, and how both rank and rule out offers."""

from __future__ import annotations

from dataclasses import replace

import pytest
from factories import GIB, HOUR_MS, IMAGE, T0, Nonces, bid, key, offer
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.book import OrderBook
from protocol.envelope import seal
from protocol.explain import why_not, why_ranked
from protocol.messages import MAX_HOLDS, DataRef, DataSite, Offer, check_holds
from protocol.settlement import quote
from protocol.transfer import holds, holds_filter, transfer_cost

nonce = Nonces("transfer")
INPUT = "sha256:" + "11" * 32
EGRESS = 90_000  # what the data's region charges per GiB sent out: 0.09 credits


def signed(payload, who="p"):
    return seal(key(who), payload, nonce=nonce(), issued_ms=T0, expires_ms=T0 + HOUR_MS)


def data_bid(size, *, region="eu", budget=None, output_bytes=0, **changes):
    b = bid(**changes)
    return replace(
        b,
        job=replace(b.job, inputs=(DataRef(digest=INPUT, path="/in/x", size=GIB),)),
        data=DataSite(
            region=region,
            bytes=size,
            egress_gib=EGRESS,
            output_bytes=output_bytes,
            budget=budget,
        ),
    )


def far_and_near():
    """A provider across the world asking 20 % less, and one beside the data."""
    return offer(cpu_price=80_000, region="us"), offer(cpu_price=100_000, region="eu")


digests = st.binary(min_size=32, max_size=32).map(lambda b: "sha256:" + b.hex())


@given(st.lists(digests, max_size=50))
def test_every_listed_blob_is_held(listed):
    """The filter never says "not held" of a blob it lists; its encoding is canonical."""
    table = holds_filter(listed)
    o = replace(offer(), holds=table)
    assert all(holds(o, d) for d in listed)
    if table is not None:
        check_holds(table)


def test_a_blob_not_listed_is_not_held_and_the_list_is_capped():
    many = [f"sha256:{i:08x}" + "0" * 56 for i in range(MAX_HOLDS + 10)]
    o = replace(offer(), holds=holds_filter(many))
    assert holds(o, many[0])
    assert holds(o, many[MAX_HOLDS - 1])
    assert not holds(o, many[MAX_HOLDS])  # past the cap: the most wanted come first
    assert not holds(offer(), INPUT)


def test_unsorted_or_partial_prefixes_are_refused():
    with pytest.raises(ValueError, match="ascending"):
        Offer(**{**_fields(offer()), "holds": b"\x02\x00\x00\x00\x01\x00\x00\x00"})
    with pytest.raises(ValueError, match="prefixes of 4 bytes"):
        Offer(**{**_fields(offer()), "holds": b"\x01\x00\x00"})


def _fields(o):
    return {name: getattr(o, name) for name in o.__dataclass_fields__}


def test_cost_counts_what_is_not_held_each_part_rounded_up():
    """Held input counts its size, a held image the rest; moved bytes cross regions at
    the data's egress price and come in at the provider's ingress price."""
    b = data_bid(10 * GIB, output_bytes=GIB // 2)
    far = replace(offer(region="us"), ingress_gib=3, egress_gib=50_000)
    assert transfer_cost(b, far).moved_bytes == 10 * GIB
    holding_input = replace(far, holds=holds_filter([INPUT]))
    t = transfer_cost(b, holding_input)
    assert (t.moved_bytes, t.held_bytes, t.cross_region) == (9 * GIB, GIB, True)
    assert (t.ingress, t.egress, t.outputs) == (27, 9 * EGRESS, 25_000)
    holding_all = replace(far, holds=holds_filter([INPUT, IMAGE]))
    assert transfer_cost(b, holding_all).moved_bytes == 0
    one_byte = transfer_cost(data_bid(1), replace(far, ingress_gib=1))
    assert (one_byte.ingress, one_byte.egress) == (1, 1)  # rounded up, never to nothing
    assert transfer_cost(bid(), far).total == 0  # a bid without data moves nothing


def _match(b, *offers):
    book = OrderBook()
    ids = []
    for i, o in enumerate(offers):
        s = signed(o, f"p{i}")
        ids.append(s.id)
        book.add_offer(s, now_ms=T0)
    matches = book.add_bid(signed(b, "buyer"), now_ms=T0, active=True)
    return book, ids, matches


def test_a_cheap_far_provider_loses_when_the_data_is_large_and_wins_when_it_is_small():
    far, near = far_and_near()
    _, ids, [large] = _match(data_bid(50 * GIB), far, near)
    assert large.offer.id == ids[1]
    assert large.transfer.total == 0
    _, ids, [small] = _match(data_bid(10 << 20), far, near)
    assert small.offer.id == ids[0]
    assert small.transfer.egress == -(-(10 << 20) * EGRESS // GIB)
    assert small.max_cost == quote(far.prices, small.resources, HOUR_MS)  # not billed


def test_among_equal_totals_the_provider_holding_the_data_wins():
    plain = offer()
    holder = replace(offer(), holds=holds_filter([INPUT, IMAGE]))
    _, ids, [m] = _match(data_bid(5 * GIB), plain, holder)
    assert m.offer.id == ids[1]
    assert m.transfer.held_bytes == 5 * GIB


def test_over_the_budget_no_match_and_why_names_the_figures():
    far, _ = far_and_near()
    b = data_bid(50 * GIB, budget=1_000_000)
    book, _, matches = _match(b, far)
    assert matches == []
    e = book.explain(b, now_ms=T0)
    assert e.ruled_out["transfer"] == 1
    assert why_not(e, b) == (
        "none of 1 offers fits (transfer rules out 1): moving 50 GiB costs 4.50 credits "
        "(egress 4.50) to the cheapest of them, over the egress budget of 1.00 credits"
    )


def test_why_ranked_names_the_cheaper_offer_that_lost_on_transfer():
    far, near = far_and_near()
    b = data_bid(50 * GIB)
    book, ids, [m] = _match(b, far, near)
    ranking = book.ranking(b, now_ms=T0)
    assert [r.offer.id for r in ranking] == [ids[1], ids[0]]
    far_peer = ranking[1].offer.signer.peer_id
    assert why_ranked(ranking, m.offer.signer.peer_id, b) == (
        "it asked 0.11 credits and moving 50 GiB costs nothing, 0.11 in all; "
        f"{far_peer} (region us) asked 0.09 but moving 50 GiB costs 4.50 credits "
        "(egress 4.50), 4.59 in all"
    )


offers_st = st.lists(
    st.builds(
        lambda price, region, ingress, held: replace(
            offer(cpu_price=price, region=region),
            ingress_gib=ingress,
            holds=holds_filter([INPUT]) if held else None,
        ),
        st.integers(1, 200_000),
        st.sampled_from(["eu", "us", "ap"]),
        st.integers(0, 100_000),
        st.booleans(),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=60, deadline=None)
@given(offers_st, st.integers(0, 100 * GIB), st.none() | st.integers(0, 5_000_000))
def test_the_match_is_the_least_total_of_every_fitting_offer(offers, size, budget):
    """The early stop of the CPU-price search never skips an offer dearer in CPU that
    wins on transfer; over-budget offers never match."""
    b = data_bid(size, budget=budget)
    _book, _, matches = _match(b, *offers)
    totals = [
        quote(o.prices, b.resources, HOUR_MS) + transfer_cost(b, o).total
        for o in offers
        if budget is None or transfer_cost(b, o).total <= budget
    ]
    if not totals:
        assert matches == []
        return
    [m] = matches
    assert quote(m.prices, m.resources, HOUR_MS) + m.transfer.total == min(totals)


def test_why_ranked_names_an_offer_over_the_budget():
    far, near = far_and_near()
    b = data_bid(50 * GIB, budget=1_000_000)
    book, _, [m] = _match(b, far, near)
    ranking = book.ranking(b, now_ms=T0)
    assert [r.within_budget for r in ranking] == [True, False]
    assert why_ranked(ranking, m.offer.signer.peer_id, b).endswith(
        "(region us) asked 0.09 but moving 50 GiB costs 4.50 credits (egress 4.50), over "
        "the egress budget of 1.00 credits"
    )
