"""Invitations (spec/matching.md): when a provider's capacity frees, it invites the resting
bids its offer fits, as :meth:`protocol.selling.Selling.invitations` chooses them, so a bid
refused for capacity earlier does not wait for a new offer to be matched again.

Sent on ``/cx/invite/1``: → Invitation; ← ``{"ok": true}`` when the buyer proposes, or an
error frame saying why not. Best effort: a buyer that cannot be reached is skipped, and its
bid still matches the next offer it sees.
"""

from __future__ import annotations

import logging

import trio

from node.market.gossip import Market
from node.net.transport import NetworkError
from node.net.wire import INVITE, PeerRefused, read_control, request
from protocol.selling import Selling

__all__ = ["send_invitations"]

log = logging.getLogger(__name__)


async def send_invitations(market: Market, selling: Selling) -> int:
    """Invite the bids our offer fits now; returns how many buyers said they propose."""
    taken = 0
    for bid in selling.invitations(now_ms=market.now_ms()):
        invitation = selling.invite(bid, nonce=market.nonce(), now_ms=market.now_ms())
        buyer = bid.signer.peer_id
        try:
            with trio.fail_after(market.timings.hello_timeout_s):
                read_control(await request(market.net, buyer, INVITE, invitation.wire))
            taken += 1
        except (NetworkError, PeerRefused, trio.TooSlowError) as exc:
            log.info("invitation of bid %s not taken: %s", bid.id.hex()[:12], exc or "no answer")
    return taken
