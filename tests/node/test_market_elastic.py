"""An elastic job across the market: the bid's ceilings are signed into the terms, the
provider grows the running job, and the buyer checks and pays the receipt's grants."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from market_support import MiB, cluster, finished, ledger, market, submit, until

from protocol.envelope import open_signed
from protocol.messages import Elastic, UsageReceipt
from protocol.settlement import cost

pytestmark = pytest.mark.integration

# 80 MiB held (40 in each of the job's two tmpfs, /dev/shm and /tmp) against 64 reserved.
GROW = (
    "i=0; while [ $i -lt 40 ]; do i=$((i+1)); for d in /dev/shm /tmp; do "
    "dd if=/dev/zero of=$d/f$i bs=1M count=1 2>/dev/null || exit 9; done; sleep 0.05; done; "
    'echo "cpu 1.5" > /cx/request; until grep -q "cpu_milli 1500" /cx/granted; do sleep 0.02;'
    " done; cat /cx/granted > /out/granted"
)


async def test_an_elastic_job_grows_on_the_provider_and_the_buyer_pays_the_grants(
    image_layout: Path,
) -> None:
    async with cluster(image_layout) as c:
        provider = await c.provider("provider")
        buyer = await c.buyer("buyer")
        await buyer.peer.join(provider.addr)
        await until(lambda: market(buyer)["offers"] == 1, buyer)

        view = await submit(
            buyer, c.image, GROW, elastic_memory_bytes=256 * MiB, elastic_cpu_milli=1500
        )
        done = await finished(buyer, view["id"])
        assert done["state"] == "succeeded", done
        row = buyer.peer.db.job(view["id"])
        assert row is not None
        assert row.agreement_id is not None
        # The terms both signed carry the ceilings.
        terms = buyer.peer.buyer.buying.agreements[row.agreement_id].terms
        assert terms.elastic == Elastic(memory_bytes=256 * MiB, cpu_milli=1500)
        stored = buyer.peer.db.receipt(row.agreement_id)
        assert stored is not None
        usage = open_signed(stored[0], UsageReceipt).payload.usage
        grants = usage.grants or ()
        assert grants[-1].cpu_milli == 1500
        assert grants[-1].memory_bytes > 64 * MiB  # grown past the 64 MiB reserved
        # Paid for the memory held over time, as both sides compute it.
        assert done["cost"] == cost(terms.prices, terms.resources, usage)
        assert done["cost"] > cost(terms.prices, terms.resources, replace(usage, grants=None))
        await until(lambda: ledger(provider)["entries"], provider)
        assert ledger(provider)["balance"] == -ledger(buyer)["balance"] == done["cost"]
