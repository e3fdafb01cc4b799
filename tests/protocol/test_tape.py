"""The tape (protocol/tape.py): co-signed trade prints and what a node refuses."""

from __future__ import annotations

from dataclasses import replace

import pytest
from factories import HOUR_MS, T0, Nonces, bid, key, offer

from protocol.buying import Buying
from protocol.encoding import decode, encode
from protocol.envelope import seal
from protocol.errors import InvalidMessage, Reason
from protocol.messages import Accept, Prices, Resources
from protocol.selling import Selling
from protocol.tape import SignedPrint, Tape, TradePrint, candles, sign_print
from protocol.trader import Trader

BUYER, PROVIDER, MALLORY = key("buyer"), key("provider"), key("mallory")


def _trade(at_ms: int = T0, price: int = 100, trade_id: bytes = b"\x01" * 32) -> TradePrint:
    return TradePrint(
        trade_id=trade_id,
        resource_class="amd64/cpu/eu",
        prices=Prices(cpu_core_hour=price),
        resources=Resources(cpu_milli=1000, memory_bytes=1 << 30),
        at_ms=at_ms,
        buyer=BUYER.public_key.raw,
        provider=PROVIDER.public_key.raw,
    )


def _signed(trade: TradePrint) -> SignedPrint:
    return SignedPrint.assemble(trade, sign_print(BUYER, trade), sign_print(PROVIDER, trade))


def _accepted(nonce: Nonces):
    """A buyer and provider, the buyer's proposal and the provider's answer to it."""
    buyer, provider = Buying(Trader(BUYER)), Selling(Trader(PROVIDER))
    posted = provider.post_offer(offer(), nonce=nonce(), now_ms=T0, ttl_ms=HOUR_MS)
    buyer.trader.receive_order(posted.wire, now_ms=T0)
    _, [match] = buyer.trader.post(bid(), nonce=nonce(), now_ms=T0, ttl_ms=HOUR_MS)
    proposal = buyer.propose(match, nonce=nonce(), attestation_nonce=nonce(32), now_ms=T0)
    provider.receive_proposal(proposal.wire, now_ms=T0)
    reply = provider.accept(proposal.id, evidence=None, nonce=nonce(), now_ms=T0)
    return buyer, proposal, reply


def test_an_agreement_yields_a_print_both_parties_signed():
    nonce = Nonces()
    buyer, proposal, reply = _accepted(nonce)
    assert isinstance(reply.payload, Accept)
    buyer.receive_reply(reply.wire, now_ms=T0)
    agreement = buyer.agree(proposal.id)
    signed = buyer.trade_print(proposal.id)
    assert signed is not None
    trade = signed.trade
    assert (trade.prices, trade.resources, trade.at_ms) == (
        agreement.terms.prices,
        agreement.terms.resources,
        agreement.terms.created_ms,
    )
    assert trade.resource_class == "amd64/cpu/eu"
    assert agreement.id not in signed.wire  # the print names the trade, not the terms
    assert Tape().admit(signed.wire, now_ms=T0).trade == trade


def test_a_provider_print_signature_that_does_not_verify_fails_the_accept():
    nonce = Nonces()
    buyer, _, honest = _accepted(nonce)
    lying = seal(
        PROVIDER,
        replace(honest.payload, print_signature=bytes(64)),
        nonce=nonce(),
        issued_ms=T0,
        expires_ms=T0 + 60_000,
    )
    with pytest.raises(InvalidMessage) as info:
        buyer.receive_reply(lying.wire, now_ms=T0)
    assert info.value.reason is Reason.BAD_SIGNATURE


def _tampered(wire: bytes, **changes: bytes) -> bytes:
    fields = decode(wire)
    assert isinstance(fields, dict)
    return encode({**fields, **changes})


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda s: _tampered(s.wire, buyer_sig=bytes(64)), Reason.BAD_SIGNATURE),
        (
            lambda s: _tampered(s.wire, provider_sig=sign_print(MALLORY, s.trade)),
            Reason.BAD_SIGNATURE,
        ),
        (lambda s: _tampered(s.wire, provider_sig=b""), Reason.BAD_SIGNATURE),
        (
            lambda s: _tampered(
                s.wire, buyer_sig=sign_print(BUYER, replace(s.trade, at_ms=T0 + 1))
            ),
            Reason.BAD_SIGNATURE,
        ),
    ],
    ids=["forged-buyer", "provider-signature-from-someone-else", "one-signature", "other-bytes"],
)
def test_a_print_without_both_valid_signatures_is_refused(make, reason):
    with pytest.raises(InvalidMessage) as info:
        Tape().admit(make(_signed(_trade())), now_ms=T0)
    assert info.value.reason is reason


def test_a_print_is_kept_once_and_only_inside_the_window():
    tape = Tape(retention_ms=HOUR_MS)
    signed = _signed(_trade())
    tape.admit(signed.wire, now_ms=T0)
    with pytest.raises(InvalidMessage) as replayed:
        tape.admit(signed.wire, now_ms=T0)
    assert replayed.value.reason is Reason.REPLAYED
    old = _signed(_trade(at_ms=T0 - 2 * HOUR_MS, trade_id=b"\x02" * 32))
    with pytest.raises(InvalidMessage) as expired:
        tape.admit(old.wire, now_ms=T0)
    assert expired.value.reason is Reason.EXPIRED
    future = _signed(_trade(at_ms=T0 + HOUR_MS, trade_id=b"\x03" * 32))
    with pytest.raises(InvalidMessage) as early:
        tape.admit(future.wire, now_ms=T0)
    assert early.value.reason is Reason.NOT_YET_VALID
    assert len(tape) == 1
    tape.forget_before(T0 + 1)
    assert len(tape) == 0
    tape.admit(signed.wire, now_ms=T0)  # forgotten, so no longer a replay


def test_a_trade_with_oneself_is_refused():
    trade = replace(_trade(), provider=BUYER.public_key.raw)
    with pytest.raises(InvalidMessage) as info:
        SignedPrint.assemble(trade, sign_print(BUYER, trade), sign_print(BUYER, trade))
    assert info.value.reason is Reason.SELF_DEALING


def test_candles_open_high_low_close_per_interval():
    prints = [
        _trade(at_ms=T0 + ms, price=price, trade_id=bytes([i]) * 32)
        for i, (ms, price) in enumerate([(0, 100), (10, 130), (20, 90), (60_000, 95)])
    ]
    start = T0 - T0 % 60_000
    got = candles(prints, 60_000)
    assert [(c.start_ms - start, c.open, c.high, c.low, c.close, c.trades) for c in got] == [
        (0, 100, 130, 90, 90, 3),
        (60_000, 95, 95, 95, 95, 1),
    ]
    assert got[0].cpu_milli == 3000
