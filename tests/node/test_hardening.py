"""Defects found by probing a node as an adversary and a careless user would (issue 17):
each test failed before its fix.

- A request that cannot travel is refused before anything is stored (D1).
- A node never refuses to start over one bad row of its own state: the row is set aside
  with its reason, the node logs it and comes up (D1).
- A damaged database or key file is one line that says what to do (D6).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from fake_runner import FakeRunner
from market_support import Cluster, cluster, finished, submit, until

from node.market.request import RequestError, build_request
from node.storage.db import DamagedDatabase, Database
from node.storage.home import Home, HomeError, NodeConfig, init_home
from node.storage.store import BlobStore

DIGEST = "sha256:" + "ab" * 32


def _request(**fields: object):
    base = {"image": DIGEST, "command": ("true",), "max_prices": {"cpu_core_hour": 1}}
    return build_request(**{**base, **fields})


@pytest.mark.parametrize(
    ("fields", "limit"),
    [
        ({"regions": tuple(f"region-{i:06d}" for i in range(50_000))}, "too-large"),
        ({"env": {"BIG": "x" * 900_000}}, "too-large"),
        ({"regions": tuple(f"r{i}" for i in range(5_000))}, "too-long"),
        ({"env": {"BIG": "x" * 20_000}}, "too-long"),
        ({"command": ("echo",) + ("x" * 15_000,) * 20}, "too-large"),
        (
            {
                "max_prices": {"cpu_core_hour": 2**62},
                "cpu_milli": 1_024_000,
                "wall_ms": 2_592_000_000,
            },
            "budget too large",
        ),
    ],
)
def test_a_request_that_cannot_travel_is_refused_naming_the_limit(fields, limit):
    from node.market.request import bid_from_request

    with pytest.raises(RequestError, match=limit):
        bid_from_request(_request(**fields))


async def test_an_oversized_request_stores_nothing_and_the_node_restarts(image_layout: Path):
    async with cluster(image_layout) as c:
        buyer = await c.buyer("buyer")
        with pytest.raises(RequestError, match="refused by every peer"):
            await submit(buyer, c.image, "true", env={"BIG": "x" * 900_000})
        assert buyer.peer.jobs() == []
        assert buyer.peer.db.orders() == []
        await buyer.stop()
        again = await c.start(buyer.home)
        assert again.peer.jobs() == []


# -- one bad row --------------------------------------------------------------------------


def _corrupt(home: Home, sql: str) -> None:
    db = sqlite3.connect(home.db_path)
    with db:
        db.execute(sql)
    db.close()


async def _stopped_buyer_with_a_job(c: Cluster, script: str = "echo ok") -> tuple[Home, str]:
    buyer = await c.buyer("buyer")
    job_id = (await submit(buyer, c.image, script, price=1))["id"]  # no offer: it waits
    await buyer.stop()
    return buyer.home, job_id


@pytest.mark.parametrize(
    "damage",
    [
        "UPDATE orders SET wire = x'00'",
        "UPDATE orders SET wire = substr(wire, 1, 100)",
    ],
)
async def test_an_unreadable_stored_bid_is_set_aside_and_its_job_says_why(
    image_layout: Path, damage: str
):
    async with cluster(image_layout) as c:
        home, job_id = await _stopped_buyer_with_a_job(c)
        _corrupt(home, damage)
        buyer = await c.start(home)  # it comes up
        job = buyer.peer.job(job_id)
        assert job.state == "error"
        assert job.detail.startswith("its stored bid (")
        [aside] = buyer.peer.db.quarantined()
        assert aside["source"] == "orders"
        assert aside["reason"].startswith("unreadable: its stored bid")
        assert buyer.peer.db.orders() == []


async def test_an_unreadable_agreement_and_ledger_entry_are_set_aside(image_layout: Path):
    async with cluster(image_layout) as c:
        home, _ = await _stopped_buyer_with_a_job(c)
        db = sqlite3.connect(home.db_path)
        with db:
            db.execute(
                "INSERT INTO agreements VALUES (x'01', 'buyer', x'c0', 'running', 'p', NULL, "
                "NULL, 0)"
            )
            db.execute("INSERT INTO ledger VALUES (x'02', x'03', x'04', -5, 0)")
        db.close()
        buyer = await c.start(home)
        sources = sorted(a["source"] for a in buyer.peer.db.quarantined())
        assert sources == ["agreements", "ledger"]
        assert buyer.peer.ledger() == []


async def test_a_job_row_with_unreadable_json_is_set_aside(image_layout: Path):
    async with cluster(image_layout) as c:
        home, job_id = await _stopped_buyer_with_a_job(c)
        _corrupt(home, "UPDATE jobs SET outputs = '[{broken'")
        buyer = await c.start(home)
        assert buyer.peer.jobs() == []
        [aside] = buyer.peer.db.quarantined()
        assert (aside["source"], aside["record"]["id"]) == ("jobs", job_id)


# -- damaged files ----------------------------------------------------------------------------


def _cx_node(home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "node.cli", "node", "--home", str(home)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (lambda h: h.db_path.write_bytes(b"this is not sqlite" * 100), "node.db is damaged"),
        (lambda h: h.key_path.write_bytes(h.key_path.read_bytes()[:40]), "is not a node key"),
        (lambda h: h.key_path.write_bytes(bytes(32)), "convert it: cx init"),
        (lambda h: h.config_path.write_text("[network\nlisten = "), "config.toml"),
    ],
    ids=["database", "short-key", "bare-seed", "config"],
)
def test_a_damaged_home_is_one_line_that_says_what_to_do(tmp_path: Path, damage, says):
    home = init_home(tmp_path / "home", NodeConfig())
    Database(home.db_path).close()
    damage(home)
    done = _cx_node(home.root)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("cx node: ")
    assert says in lines[0]


def test_a_damaged_page_is_found_when_the_database_opens(tmp_path: Path):
    path = tmp_path / "node.db"
    db = Database(path)
    for i in range(200):
        db.add_event("job", i, "waiting", "x" * 200)
    db.close()
    data = bytearray(path.read_bytes())
    for page in range(2 * 4096, len(data), 4096):  # past the schema, into the b-tree pages
        data[page + 8 : page + 200] = b"\xff" * 192
    path.write_bytes(bytes(data))
    with pytest.raises(DamagedDatabase, match="is damaged") as damaged:
        Database(path)
    assert "\n" not in str(damaged.value)


def test_a_bare_seed_converts_once_asked_and_keeps_its_identity(tmp_path: Path):
    home = init_home(tmp_path / "home", NodeConfig())
    seed = home.key().seed
    home.key_path.write_bytes(seed)  # as cx 0.1 wrote it
    with pytest.raises(HomeError, match="bare 32-byte seed"):
        home.key()
    converted = home.convert_legacy_key()
    assert converted.seed == seed
    assert home.key().peer_id == converted.peer_id
    assert len(home.key_path.read_bytes()) == 68
    with pytest.raises(HomeError, match="nothing to convert"):
        home.convert_legacy_key()


def test_every_quarantined_record_is_json(tmp_path: Path):
    db = Database(tmp_path / "node.db")
    db.save_order(b"\x01" * 32, "bid", b"\x00\xff", 0, None)
    db.quarantine("orders", b"\x01" * 32, "because", 5)
    [aside] = db.quarantined()
    assert aside == {
        "source": "orders",
        "record": {"id": "01" * 32, "kind": "bid", "wire": "00ff", "expires_ms": 0, "job_id": None},
        "reason": "because",
        "at_ms": 5,
    }
    assert json.loads(json.dumps(aside)) == aside


async def test_a_provider_sets_aside_a_bad_agreement_and_outbox_row_and_still_sells(
    image_layout: Path,
):
    def runner(home: Home) -> FakeRunner:
        return FakeRunner(BlobStore(home.store_root))

    async with cluster(image_layout, runner=runner) as c:
        provider = await c.provider("provider")
        await provider.stop()
        db = sqlite3.connect(provider.home.db_path)
        with db:
            db.execute(
                "INSERT INTO agreements VALUES (x'01', 'provider', x'00', 'running', 'p', NULL, "
                "NULL, 0)"
            )
            db.execute("INSERT INTO outbox (agreement_id, peer, wire) VALUES (x'01', 'p', x'ff')")
        db.close()
        provider = await c.start(provider.home)
        buyer = await c.buyer("buyer")
        await buyer.peer.join(provider.addr)
        job_id = (await submit(buyer, c.image, "sleep 0"))["id"]
        assert (await finished(buyer, job_id))["state"] == "succeeded"
        await until(lambda: provider.peer.db.outbox() == [], provider)
        sources = sorted(a["source"] for a in provider.peer.db.quarantined())
        assert sources == ["agreements", "outbox"]


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"memory_bytes": 1}, "memory_bytes: "),
        ({"cpu_milli": 1}, "cpu_milli: "),
        ({"wall_ms": 10**12}, "wall_ms: "),
        ({"checkpoint_path": "/a/../b"}, "checkpoint_path: "),
    ],
)
def test_a_request_outside_the_limits_providers_enforce_is_refused_at_once(fields, says):
    """Issue 17 D4 from the buyer's side: a bid every provider would refuse as bad terms
    is refused when it is made, naming the field (protocol/limits.py's bounds)."""
    from node.market.request import bid_from_request

    with pytest.raises(RequestError, match=says):
        bid_from_request(_request(**fields))
