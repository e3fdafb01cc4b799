"""A provider's quotas in the node: :mod:`protocol.quotas` decides, and
:class:`protocol.selling.Selling` applies it; this module feeds the selling core what each
buyer's receipts paid this UTC day (the node's ledger) and reports each group's use.
"""

from __future__ import annotations

from node.storage.db import Database
from protocol.quotas import GroupUse, Quota, day_start
from protocol.selling import Selling

__all__ = ["feed_spend", "group_uses"]


def feed_spend(selling: Selling, db: Database, now_ms: int) -> None:
    """Set what each buyer paid us since 00:00 UTC, before the core screens or invites."""
    if selling.quotas.groups:
        selling.spent_today = db.paid_to(selling.trader.me.raw, day_start(now_ms))


def group_uses(selling: Selling) -> list[tuple[Quota, GroupUse]]:
    """Each group with what it holds and spent now (after :func:`feed_spend`)."""
    uses = selling.uses()
    return [(group, selling.quotas.use(group, uses)) for group in selling.quotas.groups]
