"""GPU sharing without a GPU: the host is the recorded ``nvidia-smi`` output of a two-H100
machine (tests/node/data), put on PATH as a fake ``nvidia-smi``; what runs for real is
detection, sharing, the offer, matching, allocation and the container's wiring. The GPU
itself (device nodes, driver libraries, metering on the device) is proven by
bench/gpu_proof.py on a GPU machine."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from market_support import PRICE, MiB, cluster, finished, market, until

from node.api import views
from node.exec.gpu import parse_compute_apps, parse_nvidia_smi, share_gpus, wire_gpus
from node.market.request import build_request
from node.storage.home import NodeConfig, ProviderConfig, init_home
from protocol.envelope import open_signed
from protocol.messages import Arch, Prices, Resources, UsageReceipt

DATA = Path(__file__).parent / "data"
H100 = "NVIDIA H100 80GB HBM3"


def test_shares_are_spread_over_the_gpus_and_advertised_as_fractions() -> None:
    gpus = parse_nvidia_smi((DATA / "nvidia-smi-h100x2.csv").read_text())
    shares = share_gpus(gpus, 2)
    assert [g.index for g in shares] == [0, 1, 0, 1]
    gpu = shares[0].advertised()
    assert gpu.model == f"{H100} (1/2 time-sliced)"
    assert gpu.memory_bytes == 81559 * MiB // 2
    assert share_gpus(gpus, 1)[0].advertised().model == H100
    with pytest.raises(ValueError, match="gpu_shares 0"):
        share_gpus(gpus, 0)


def test_gpu_memory_of_the_jobs_processes_is_read_from_nvidia_smi() -> None:
    text = "4242, 1024\n4243, 512\n99, [N/A]\n4242, 1\n"
    assert parse_compute_apps(text) == {4242: 1025 * MiB, 4243: 512 * MiB}


def test_two_shares_of_one_gpu_wire_its_device_once(tmp_path: Path) -> None:
    gpus = parse_nvidia_smi((DATA / "nvidia-smi-h100x2.csv").read_text())
    for name in ["nvidia0", "nvidiactl"]:
        (tmp_path / name).touch()
    shares = share_gpus(gpus, 2)
    wiring = wire_gpus([shares[0], shares[2]], dev=tmp_path, ldconfig="", nvidia_smi=None)
    assert [d.path for d in wiring.devices] == ["/dev/nvidia0", "/dev/nvidiactl"]
    assert wiring.env["NVIDIA_VISIBLE_DEVICES"] == gpus[0].uuid


@pytest.mark.integration
async def test_a_provider_offers_gpu_shares_and_a_gpu_job_gets_one(
    image_layout: Path, tmp_path: Path, monkeypatch: Any
) -> None:
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    # As the driver would: the GPUs, or every job process holding 512 MiB on the device.
    fake.write_text(
        "#!/bin/sh\n"
        'case "$1" in --query-compute-apps*)\n'
        "  cat /sys/fs/cgroup/pids/cx/*/cgroup.procs /sys/fs/cgroup/cx/*/cgroup.procs "
        "2>/dev/null | sed 's/$/, 512/'; exit 0;;\n"
        "esac\n"
        f"cat {DATA / 'nvidia-smi-h100x2.csv'}\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    async with cluster(image_layout) as c:
        config = ProviderConfig(
            capacity=Resources(cpu_milli=2000, memory_bytes=1024 * MiB),
            prices=Prices(cpu_core_hour=PRICE, memory_gib_hour=0, gpu_hour=2_000_000),
            arch=Arch.AMD64,
            gpu_shares=2,
        )
        provider = await c.start(init_home(c.root / "gpu", NodeConfig(provider=config)))
        buyer = await c.buyer("buyer")
        await buyer.peer.join(provider.addr)
        classes = await until(lambda: market(buyer)["classes"], buyer)
        assert [k["class"] for k in classes] == [f"amd64/gpu:{H100} (1/2 time-sliced)/any"]

        request = build_request(
            image=c.image,
            command=("sh", "-c", "echo $NVIDIA_VISIBLE_DEVICES > /out/gpu; sleep 1"),
            max_prices={"cpu_core_hour": 100_000_000, "gpu_hour": 3_000_000},
            cpu_milli=500,
            memory_bytes=64 * MiB,
            wall_ms=60_000,
            gpus=1,
        )
        jobs = [views.job(await buyer.peer.submit(request)) for _ in range(2)]
        seen = set()
        for job in jobs:
            done = await finished(buyer, job["id"])
            assert done["state"] == "succeeded", done
            (out,) = done["outputs"]
            seen.add(buyer.peer.market.store.read_bytes(out["digest"]).decode().strip())
            assert done["cost"] > 0
            row = buyer.peer.db.job(job["id"])
            assert row is not None
            assert row.agreement_id is not None
            stored = buyer.peer.db.receipt(row.agreement_id)
            assert stored is not None
            usage = open_signed(stored[0], UsageReceipt).payload.usage
            peak = usage.gpu_memory_peak_bytes or 0
            assert peak >= 512 * MiB
            assert peak % (512 * MiB) == 0
        uuids = {g.uuid for g in parse_nvidia_smi((DATA / "nvidia-smi-h100x2.csv").read_text())}
        assert seen <= uuids
