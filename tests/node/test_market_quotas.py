"""A provider's quotas and priorities in a whole market (protocol/quotas.py): real nodes
on the memory network under MockClock, fake job runners (see test_market_clock.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from fake_runner import FakeRunner
from market_support import events, finished, state, submit, until, virtual

from node.api import views
from node.api.common import ApiError
from node.api.controller import NodeController
from node.cli.status import render_status
from protocol.quotas import Quota, Quotas

LIMIT = 100_000_000  # per core-hour: what submit() offers to pay by default


async def test_a_buyer_past_its_jobs_quota_is_refused_naming_it_and_priority_decides_who_goes_next(
    clock: trio.testing.MockClock, image_layout: Path
) -> None:
    """Two cores. Alice's group may run one job at once: her second job is refused with
    the quota named, once, while bob is served. Carol's group has priority: when alice's
    first job ends and frees a core, carol's waiting job is invited before alice's second,
    though alice offers more; alice's runs when bob's job frees a core."""
    runners: dict[Path, FakeRunner] = {}
    async with virtual(image_layout, runners) as c:
        provider = await c.provider("provider", cpu_milli=2000)
        alice, bob, carol = [await c.buyer(name) for name in ("alice", "bob", "carol")]
        for buyer in (alice, bob, carol):
            await buyer.peer.join(provider.addr)
        assert provider.peer.provider is not None
        provider.peer.provider.set_quotas(  # live, as `cx quota --reload` does
            Quotas(
                groups=(
                    Quota(name="guests", members=frozenset({alice.peer.key.public_key.raw}),
                          jobs=1),
                    Quota(name="gold", members=frozenset({carol.peer.key.public_key.raw}),
                          priority=10),
                )
            )
        )  # fmt: skip

        first = (await submit(alice, c.image, "sleep 60", cpu_milli=1000))["id"]
        await state(alice, first, "running")
        second = (await submit(alice, c.image, "sleep 5", cpu_milli=1000, price=2 * LIMIT))["id"]
        line = "quota:jobs: group 'guests' may run 1 job(s) at once; it runs 1"
        await until(lambda: any(e.startswith("waiting: ") and line in e
                                for e in events(alice, second)), alice)  # fmt: skip
        waiting = alice.peer.job(second)
        assert (waiting.state, waiting.detail) == (
            "waiting",
            f"{provider.peer_id} refused it, {line}; it waits for an invitation or another offer",
        )
        assert line in views.why(alice.peer.why(second))["explanation"]
        refusals = provider.peer.market.metrics.registry.get_sample_value(
            "cx_quota_refusals_total", {"group": "guests", "quota": "jobs"}
        )
        assert refusals == 1

        served = (await submit(bob, c.image, "sleep 120", cpu_milli=1000))["id"]
        await state(bob, served, "running")  # bob is in no group: served
        info = NodeController(provider.peer).node_info()
        guests, gold = info["quotas"]
        assert (guests["name"], guests["used"]["jobs"], guests["limits"]["jobs"]) == (
            "guests", 1, 1,
        )  # fmt: skip
        assert gold["used"]["jobs"] == 0
        assert "quota:    guests (1 peer, priority 0): cores 1/-, " in render_status(info)

        late = (await submit(carol, c.image, "sleep 120", cpu_milli=1000))["id"]
        await until(lambda: any("no-capacity" in e for e in events(carol, late)), carol)

        await finished(alice, first)
        done_late, done_second = await finished(carol, late), await finished(alice, second)
        assert (done_late["state"], done_second["state"]) == ("succeeded", "succeeded")

        def started(node, job_id: str) -> int:
            return next(e["at_ms"] for e in node.peer.db.events(job_id) if e["state"] == "running")

        assert started(carol, late) < started(alice, second)
        freed = (await finished(bob, served))["updated_ms"]  # bob's job gave its core back
        assert abs(started(alice, second) - freed) < 10_000
        refusals = [e for e in events(alice, second) if "rejected" in e]
        assert len(refusals) == 1, refusals  # held back, not proposed again and again


async def test_quotas_edited_in_config_toml_apply_without_a_restart(
    clock: trio.testing.MockClock, image_layout: Path
) -> None:
    """`cx quota --reload`: the running provider takes config.toml's quotas; a config with a
    problem changes nothing and names it."""
    runners: dict[Path, FakeRunner] = {}
    async with virtual(image_layout, runners) as c:
        provider = await c.provider("provider")
        controller = NodeController(provider.peer)
        assert controller.node_info()["quotas"] == []
        text = provider.home.config_path.read_text()
        provider.home.config_path.write_text(
            text + '\n[[provider.quota]]\nname = "everyone"\njobs = 1\n'
        )
        [group] = controller.reload_quotas()
        assert (group["name"], group["peers"], group["limits"]["jobs"]) == ("everyone", [], 1)
        provider.home.config_path.write_text(text + '\n[[provider.quota]]\nname = "x"\njobs = -1\n')
        with pytest.raises(ApiError) as refused:
            controller.reload_quotas()
        assert (refused.value.status, refused.value.code) == (400, "bad-request")
        assert "[provider] quota: 'x' jobs: must be a whole number >= 0" in str(refused.value)
        assert [g["name"] for g in controller.node_info()["quotas"]] == ["everyone"]  # kept

        buyer = await c.buyer("buyer")
        with pytest.raises(ApiError) as not_provider:
            NodeController(buyer.peer).reload_quotas()
        assert not_provider.value.code == "not-provider"
