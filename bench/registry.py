"""Registry pull benchmark: our OCI Distribution client against skopeo, on loopback.

Measures, in one run on this host, for a generated image with one layer of ``--mb`` MB of
incompressible data pushed to a local docker-registry (distribution 2.8):
- ours: ``pull_image`` into an empty content store (manifest, config, layer; every byte
  hashed against its digest, fsynced, renamed into place, the image pinned);
- skopeo: ``skopeo copy docker://... oci:DIR`` of the same image (Go; verifies digests too);
- raw: one streamed HTTP GET of the layer blob with httpx, bytes discarded (the ceiling of
  the HTTP path alone);
- cached: ``pull_image`` again when the store already holds the image (no network).

Each is the median of ``--runs`` runs. Ends with one JSON line of figures.
Usage: .venv/bin/python bench/registry.py [--runs 5] [--mb 200]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "node"))

from registry_support import running_registry

from node.storage.image import Entry, write_layout
from node.storage.registry import parse_ref, pull_image
from node.storage.store import BlobStore


def _median(samples: list[float]) -> float:
    return statistics.median(samples)


async def _raw(url: str) -> int:
    got = 0
    async with httpx.AsyncClient(timeout=60) as client, client.stream("GET", url) as resp:
        async for part in resp.aiter_bytes():
            got += len(part)
    return got


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--mb", type=int, default=200)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cx-bench-registry-"))
    try:
        layout = work / "layout"
        payload = os.urandom(args.mb * 1024 * 1024)
        digest = write_layout(layout, [[Entry(path="data.bin", mode=0o644, data=payload)]])
        manifest = json.loads((layout / "blobs" / "sha256" / digest[7:]).read_bytes())
        layer = manifest["layers"][0]
        size_mb = layer["size"] / 1e6
        with running_registry(work / "registry") as reg:
            reg.push(layout, "bench")
            ref = parse_ref(reg.ref("bench", digest))
            ours, skopeo, raw, cached = [], [], [], []
            for i in range(args.runs):
                store = BlobStore(work / f"store{i}")
                t0 = time.perf_counter()
                trio.run(lambda store=store: pull_image(store, ref))
                ours.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                trio.run(lambda store=store: pull_image(store, ref))
                cached.append(time.perf_counter() - t0)
                shutil.rmtree(work / f"store{i}")

                t0 = time.perf_counter()
                subprocess.run(
                    ["skopeo", "copy", "--quiet", "--src-tls-verify=false",
                     f"docker://{reg.host}/bench@{digest}", f"oci:{work / 'copy'}:x"],
                    check=True,
                )  # fmt: skip
                skopeo.append(time.perf_counter() - t0)
                shutil.rmtree(work / "copy")

                url = f"http://{reg.host}/v2/bench/blobs/{layer['digest']}"
                t0 = time.perf_counter()
                assert trio.run(_raw, url) == layer["size"]
                raw.append(time.perf_counter() - t0)
        figures = {
            "layer_mb": round(size_mb, 1),
            "ours_mb_s": round(size_mb / _median(ours), 1),
            "skopeo_mb_s": round(size_mb / _median(skopeo), 1),
            "raw_http_mb_s": round(size_mb / _median(raw), 1),
            "cached_pull_ms": round(_median(cached) * 1000, 1),
            "ours_vs_skopeo": round(_median(skopeo) / _median(ours), 2),
            "ours_vs_raw_http": round(_median(raw) / _median(ours), 2),
            "load_avg": round(os.getloadavg()[0], 2),
        }
        print(
            f"pull of a {size_mb:.0f} MB layer: ours {figures['ours_mb_s']} MB/s, "
            f"skopeo {figures['skopeo_mb_s']} MB/s ({figures['ours_vs_skopeo']}x), "
            f"raw HTTP {figures['raw_http_mb_s']} MB/s ({figures['ours_vs_raw_http']}x); "
            f"cached pull {figures['cached_pull_ms']} ms"
        )
        print(json.dumps(figures))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
