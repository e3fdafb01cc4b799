"""``GET /metrics``: what a node counts and shows, read back as Prometheus reads it.

A provider and a buyer (whole nodes on the in-memory network, real containers) trade one
job and take a forged order; every figure the issue names is then checked in each node's
exposition, parsed by prometheus_client's own parser. Separately, a real ``cx node``
process is scraped by the real Prometheus server (Debian's ``prometheus``) with the node's
bearer token, and a PromQL query answers with the node's figures.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import trio
from market_support import BOUND, cluster, finished, submit, until
from process_support import free_port, wait_for_log
from prometheus_client.parser import text_string_to_metric_families

from node.api.scrape import exposition
from node.net.memnet import serve_memory_network
from node.net.wire import OFFERS_TOPIC
from protocol.identity import PrivateKey

pytestmark = pytest.mark.integration

CX = str(Path(__file__).parents[2] / ".venv" / "bin" / "cx")


def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition: (name, sorted labels) -> value."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


async def test_a_trade_shows_in_both_nodes_metrics(image_layout: Path) -> None:
    async with cluster(image_layout) as c:
        provider = await c.provider("provider")
        buyer = await c.buyer("buyer")
        await buyer.peer.join(provider.addr)
        done = await finished(buyer, (await submit(buyer, c.image, "sleep 0.1"))["id"])
        assert done["state"] == "succeeded"
        await until(lambda: provider.peer.market.trader.ledger.entries, provider)

        # A forged copy of the provider's offer, and the offer itself again.
        forger_key = PrivateKey.from_seed(b"\x09" * 32)
        forger = await c.nursery.start(serve_memory_network, c.hub, forger_key.peer_id)
        await forger.connect(buyer.addr)
        with trio.fail_after(BOUND):
            await forger.wait_subscribed(buyer.peer_id, OFFERS_TOPIC)
        offer = provider.peer.provider.offer.wire  # type: ignore[union-attr]
        await forger.publish(OFFERS_TOPIC, bytes([offer[0] ^ 1]) + offer[1:])
        await forger.publish(OFFERS_TOPIC, offer)

        bought = samples(exposition(buyer.peer))
        sold = samples(exposition(provider.peer))

    assert bought["cx_orders_total", (("outcome", "admitted"), ("reason", ""))] >= 1
    assert bought["cx_orders_total", (("outcome", "refused"), ("reason", "bad-signature"))] == 1
    assert bought["cx_orders_total", (("outcome", "refused"), ("reason", "replayed"))] >= 1
    assert bought["cx_matches_total", ()] >= 1
    assert bought["cx_negotiations_total", (("outcome", "agreed"), ("role", "buyer"))] == 1
    assert sold["cx_negotiations_total", (("outcome", "agreed"), ("role", "provider"))] == 1
    assert bought["cx_jobs", (("state", "succeeded"),)] == 1
    assert bought["cx_jobs", (("state", "waiting"),)] == 0
    assert sum(v for (name, _), v in sold.items() if name == "cx_provider_jobs") == 1
    assert bought["cx_book_orders", (("side", "offer"),)] == 1
    assert sold["cx_container_start_seconds_count", ()] == 1
    assert 0 < sold["cx_container_start_seconds_sum", ()] < BOUND
    assert sold["cx_usage_wall_seconds_total", ()] > 0
    assert bought["cx_receipts_total", (("role", "buyer"),)] == 1
    assert sold["cx_receipts_total", (("role", "provider"),)] == 1
    cost = done["cost"] / 1e6
    assert bought["cx_ledger_balance_credits", ()] == pytest.approx(-cost)
    assert sold["cx_ledger_balance_credits", ()] == pytest.approx(cost)
    # The provider fetched the image from the buyer.
    assert bought["cx_transfer_bytes_total", (("direction", "sent"),)] > 0
    assert (
        sold["cx_transfer_bytes_total", (("direction", "received"),)]
        == (bought["cx_transfer_bytes_total", (("direction", "sent"),)])
    )
    # In memory there is no TCP path: the provider fetched over streams, counted as such.
    assert sold["cx_direct_channels_total", (("outcome", "fell-back"), ("role", "requester"))] >= 1
    assert sold["cx_direct_channels_total", (("outcome", "opened"), ("role", "requester"))] == 0
    assert bought["cx_direct_channels_total", (("outcome", "opened"), ("role", "server"))] == 0
    assert bought["cx_peers", ()] == 2  # the provider and the forger
    assert bought["cx_peer_score", (("peer", provider.peer_id),)] == 0
    assert bought["cx_peer_score", (("peer", forger.peer_id),)] < 0
    assert ("cx_gossip_queue_depth", (("queue", "outbox"),)) in bought


@pytest.fixture
def running_node(tmp_path: Path):
    """A ``cx node`` process of a fresh buyer home, logging JSON lines; yields the home."""
    home = tmp_path / "home"
    subprocess.run([CX, "init", "--home", str(home)], check=True, capture_output=True)
    proc = subprocess.Popen(
        [CX, "node", "--home", str(home), "--log-format", "json"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_for_log(proc, '"message": "control API published in')
        yield home
    finally:
        proc.terminate()
        proc.wait(30)


def test_prometheus_scrapes_a_running_node_and_answers_a_query(
    running_node: Path, tmp_path: Path
) -> None:
    api = json.loads((running_node / "api.json").read_text())
    target = urllib.parse.urlsplit(api["url"]).netloc
    config = tmp_path / "prometheus.yml"
    config.write_text(
        json.dumps(  # YAML is a superset of JSON
            {
                "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
                "scrape_configs": [
                    {
                        "job_name": "cx",
                        "authorization": {"credentials_file": api["token_file"]},
                        "static_configs": [{"targets": [target]}],
                    }
                ],
            }
        )
    )
    port = free_port()
    prometheus = subprocess.Popen(
        [
            shutil.which("prometheus") or "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_for_log(prometheus, "Server is ready to receive web requests")
        result = _query_until_answered(port, 'cx_jobs{state="waiting"}')
    finally:
        prometheus.terminate()
        prometheus.wait(30)
    assert result[0]["metric"]["job"] == "cx"
    assert result[0]["metric"]["instance"] == target
    assert result[0]["value"][1] == "0"


def _query_until_answered(port: int, promql: str) -> list[dict]:
    """Ask Prometheus until its first scrape has landed. Prometheus is a process of its
    own with no event to wait on, so this polls, bounded, and fails with what it saw."""
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    deadline = time.monotonic() + BOUND
    answer: dict = {}
    while time.monotonic() < deadline:
        with urllib.request.urlopen(url, timeout=10) as response:
            answer = json.load(response)
        if answer["data"]["result"]:
            return list(answer["data"]["result"])
        time.sleep(0.2)
    targets = f"http://127.0.0.1:{port}/api/v1/targets"
    with urllib.request.urlopen(targets, timeout=10) as response:
        raise AssertionError(f"no answer to {promql}: {answer}; targets: {response.read()!r}")
