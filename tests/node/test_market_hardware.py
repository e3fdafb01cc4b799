"""The hardware constraint across the market: a provider states its real CPU and kernel; a
bid that needs what it has runs there, one that needs what it lacks is told why."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from market_support import cluster, finished, market, submit, until

from node.api import views
from node.exec.machine import detect_hardware

pytestmark = pytest.mark.integration


async def test_a_bid_runs_where_its_cpu_flags_and_kernel_are_and_waits_where_not(
    image_layout: Path,
) -> None:
    here = detect_hardware()
    assert here.kernel == os.uname().release
    assert here.cpu_flags  # this machine's, from /proc/cpuinfo
    async with cluster(image_layout) as c:
        provider = await c.provider("provider")
        buyer = await c.buyer("buyer")
        await buyer.peer.join(provider.addr)
        (offer,) = await until(lambda: buyer.peer.market.trader.book.live_offers(
            buyer.peer.market.now_ms()), buyer)  # fmt: skip
        assert offer.offer.hardware == here

        fits = await submit(
            buyer, c.image, "echo ok", cpu_flags=list(here.cpu_flags[:2]), min_kernel="3.0"
        )
        assert (await finished(buyer, fits["id"]))["state"] == "succeeded"

        lacks = await submit(buyer, c.image, "echo no", cpu_flags=["no_such_flag"])
        why = views.why(buyer.peer.why(lacks["id"]))
        assert why["ruled_out"]["hardware"] == 1
        assert sum(why["ruled_out"].values()) == 1
        assert "hardware rules out 1" in why["explanation"]
        assert market(buyer)["offers"] == 1
