"""Market roles of a running node, over the sans-IO core in ``protocol/``.

- ``gossip``: the market core: gossip admission, the order book's upkeep, peers.
- ``buyer``: from a job request to a countersigned receipt.
- ``provider``: selling capacity, running agreed jobs, receipts through a durable outbox.
- ``request``: a user's job request and the bid made from it.
"""

from node.market.buyer import Buyer
from node.market.gossip import Market
from node.market.provider import Provider
from node.market.request import RequestError, bid_from_request, resolve

__all__ = ["Buyer", "Market", "Provider", "RequestError", "bid_from_request", "resolve"]
