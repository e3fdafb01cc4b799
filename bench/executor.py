"""Executor benchmark: a trivial job by hand vs through our executor, podman, image import.

Measures, in one run on this host:
- bare: the runtime lifecycle by hand (run --detach, wait, delete) for crun and runc, with
  the executor's own config.json and a fresh overlay root per run made beforehand, from a
  small process already inside the private mount namespace on a hybrid host (``BARE``):
  the runtime's own cost and nothing else;
- ours: ``Executor.run_job`` for the same trivial job, the full path (overlay over the
  unpacked image from the store, tmpfs areas, limits, metering, outputs), until the result
  and until its cleanup is done too;
- podman: ``podman run --rm`` of the same image, if podman is installed;
- throughput: jobs per second with 1, 4 and 16 trivial jobs in flight, until the last one
  is cleaned up too;
- import: ``cx image import`` throughput for a generated 200 MB image (layout dir and OCI
  archive).

Goals (issue 14): ours <= 1.2x bare; ours >= 5x faster than podman. Bare, ours and podman
run in interleaved rounds so that they see the same load. Ends with one JSON line.
Usage: .venv/bin/python bench/executor.py [--runs 20] [--jobs 64] [--mb 200]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import trio

from node.exec import mounts
from node.exec.cgroups import CgroupMode
from node.exec.executor import Executor, ExecutorConfig
from node.exec.ocispec import Bind, JobConfig, build_config
from node.exec.runtime import choose_runtime
from node.storage.image import ID_MAP_BASE, MT_LAYER_TAR, build_rootfs, import_image, write_layout
from node.storage.store import BlobStore
from protocol.messages import JobSpec, Resources

MiB = 1 << 20
ROUNDS = 5
CONCURRENCY = (1, 4, 16)


# The bare lifecycle, run by a small process that is already where the runtime must run
# (inside the namespace helper's private namespace on a hybrid host): no node, no fork of a
# big process, only the runtime's own cost. It is the subreaper, so init is its child.
BARE = """
import ctypes, json, os, subprocess, sys, time
binary, root, bundles = sys.argv[1], sys.argv[2], sys.argv[3:]
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)
times = []
for i, bundle in enumerate(bundles):
    cid = "bare-%d-%d" % (os.getpid(), i)
    t0 = time.perf_counter()
    subprocess.run([binary, "--root", root, "run", "--detach", "--bundle", bundle,
                    "--pid-file", bundle + "/pid", cid], check=True)
    os.waitpid(int(open(bundle + "/pid").read()), 0)
    t1 = time.perf_counter()
    subprocess.run([binary, "--root", root, "delete", "--force", cid], check=True)
    times.append([(t1 - t0) * 1000, (time.perf_counter() - t0) * 1000])
print(json.dumps(times))
"""


def bare_lifecycle(executor: Executor, rootfs: Path, work: Path, name: str, runs: int) -> float:
    """Median ms of ``run --detach`` / wait / ``delete`` by hand with ``name`` (crun or
    runc), the same confinement as the executor's, on the unpacked image itself. ``work``
    is a directory of its own (the namespace helper shares it)."""
    return float(statistics.median(d for _, d in bare_samples(executor, rootfs, work, name, runs)))


def bare_samples(
    executor: Executor, rootfs: Path, work: Path, name: str, runs: int
) -> list[tuple[float, float]]:
    """(ms until the job exited, ms until it was deleted) of each bare run. Each run gets
    the executor's confinement (the same config.json but for paths) and a fresh root as
    its jobs do (an overlay of the unpacked image, upper layer on a tmpfs), made
    beforehand: only the runtime is timed."""
    rt = choose_runtime(executor.mode, work, name)
    area = work / f"areas-{name}"
    area.mkdir(exist_ok=True)
    mounts.mount_tmpfs(area, size_bytes=64 * MiB, uid=0, gid=0, mode=0o711)
    bundles = [area / str(i) for i in range(runs)]
    try:
        for bundle in bundles:
            for sub in ("root", "upper", "work", "out"):
                (bundle / sub).mkdir(parents=True)
            os.chown(bundle / "upper", ID_MAP_BASE, ID_MAP_BASE)
            mounts.mount_overlay(
                bundle / "root", lower=rootfs, upper=bundle / "upper", work=bundle / "work"
            )
            cfg = build_config(
                JobConfig(
                    rootfs=str(bundle / "root"),
                    args=["/bin/true"],
                    env=["PATH=/bin"],
                    cgroups_path=f"/cx/bench-{name}",
                    cpu_milli=1000,
                    memory_bytes=64 * MiB,
                    pids_limit=executor.config.pids_limit,
                    swap_accounting=executor.swap_accounting,
                    binds=[Bind(source=str(bundle / "out"), destination="/out", readonly=False)],
                    block_device=executor.block_device,
                )
            )
            (bundle / "config.json").write_text(json.dumps(cfg))
        argv = [sys.executable, "-I", "-S", "-c", BARE, rt.binary, str(rt.state_root)]
        argv += [str(b) for b in bundles]
        out, err = work / f"times-{name}", work / f"errors-{name}"
        try:
            if rt.namespace is not None:  # started now: its namespace has the roots
                rc = rt.namespace.run(argv, out, err)
            else:
                with out.open("w") as o, err.open("w") as e:
                    rc = subprocess.run(argv, stdout=o, stderr=e, check=False).returncode
        finally:
            rt.close()
    finally:
        for bundle in bundles:
            mounts.unmount(bundle / "root")
        mounts.unmount(area)
    if rc != 0:
        raise RuntimeError(f"bare {name} lifecycle failed: {err.read_text()[-2000:]}")
    times = [(a, b) for a, b in json.loads(out.read_text().splitlines()[-1])]
    out.unlink()
    return times


async def ours(executor: Executor, image: str, runs: int) -> list[tuple[float, float]]:
    """(ms until the result, ms until the job was also cleaned up) of each run."""
    spec = JobSpec(image=image, command=("/bin/true",), wall_ms=10_000)
    res = Resources(cpu_milli=1000, memory_bytes=64 * MiB)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        result = await executor.run_job(spec, res)
        t1 = time.perf_counter()
        await executor.settled()
        times.append(((t1 - t0) * 1000, (time.perf_counter() - t0) * 1000))
        assert result.exit_reason.value == "success", result
    return times


async def throughput(executor: Executor, image: str, concurrency: int, jobs: int) -> float:
    """Jobs per second with ``concurrency`` jobs in flight, ``jobs`` in all, counted until
    the last one is also cleaned up."""
    spec = JobSpec(image=image, command=("/bin/true",), wall_ms=10_000)
    res = Resources(cpu_milli=100, memory_bytes=32 * MiB)

    async def worker(n: int) -> None:
        for _ in range(n):
            result = await executor.run_job(spec, res)
            assert result.exit_reason.value == "success", result

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(concurrency):
            nursery.start_soon(worker, jobs // concurrency + (i < jobs % concurrency))
    await executor.settled()
    return jobs / (time.perf_counter() - t0)


def podman_image(layout: Path) -> str | None:
    """The image pulled into podman from the OCI layout; None if podman is not installed."""
    if shutil.which("podman") is None:
        return None
    pulled = subprocess.run(
        ["podman", "pull", f"oci:{layout}"], check=True, capture_output=True, text=True
    )
    return pulled.stdout.split()[-1]


def podman_samples(image_id: str, runs: int, hybrid: bool) -> list[float]:
    """ms of ``podman run --rm`` of /bin/true until it returns (container removed)."""
    # As measured here: podman's crun refuses hybrid hosts, and root lacks CAP_SYS_RESOURCE,
    # so podman's default rlimits (raised to the hard limits) fail; give it what works.
    extra = ["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=1024:1024"]
    if hybrid:
        extra += ["--runtime", "runc"]
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(
            ["podman", "run", "--rm", "--pull=never", "--network=none", *extra, image_id, "true"],
            check=True,
            capture_output=True,
        )
        times.append((time.perf_counter() - t0) * 1000)
    return times


def import_throughput(work: Path, mb: int) -> dict[str, float]:
    """MB/s importing a generated ``mb`` MB image (random, so nothing compresses)."""
    layout = work / "big-layout"
    write_layout(layout, [])  # index, config, manifest skeleton; the big layer is added below
    raw = io.BytesIO()
    data = os.urandom(mb * MiB)
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo("data.bin")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    layer = raw.getvalue()
    del data
    digest = "sha256:" + hashlib.sha256(layer).hexdigest()
    (layout / "blobs/sha256" / digest[7:]).write_bytes(layer)
    index = json.loads((layout / "index.json").read_text())
    m_desc = index["manifests"][0]
    manifest = json.loads((layout / "blobs/sha256" / m_desc["digest"][7:]).read_text())
    config = json.loads((layout / "blobs/sha256" / manifest["config"]["digest"][7:]).read_text())
    config["rootfs"]["diff_ids"] = [digest]
    cfg = json.dumps(config, sort_keys=True).encode()
    cfg_d = "sha256:" + hashlib.sha256(cfg).hexdigest()
    (layout / "blobs/sha256" / cfg_d[7:]).write_bytes(cfg)
    manifest["config"] = {**manifest["config"], "digest": cfg_d, "size": len(cfg)}
    manifest["layers"] = [{"mediaType": MT_LAYER_TAR, "digest": digest, "size": len(layer)}]
    mb_ = json.dumps(manifest, sort_keys=True).encode()
    m_d = "sha256:" + hashlib.sha256(mb_).hexdigest()
    (layout / "blobs/sha256" / m_d[7:]).write_bytes(mb_)
    index["manifests"][0] = {**m_desc, "digest": m_d, "size": len(mb_)}
    (layout / "index.json").write_text(json.dumps(index))
    archive = work / "big.tar"
    with tarfile.open(archive, "w") as tar:
        for p in sorted(layout.rglob("*")):
            tar.add(p, arcname=str(p.relative_to(layout)), recursive=False)
    size_mb = len(layer) / 1e6
    out = {}
    for kind, src in (("layout", layout), ("archive", archive)):
        store_dir = work / f"import-{kind}"
        store = BlobStore(store_dir)
        t0 = time.perf_counter()
        import_image(store, src)
        out[kind] = size_mb / (time.perf_counter() - t0)
        shutil.rmtree(store_dir)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=64, help="jobs per throughput figure")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cx-bench-"))
    work.chmod(0o711)
    try:
        executor = Executor(
            ExecutorConfig(
                store_root=work / "store",
                work_root=work / "work",
                capacity=Resources(cpu_milli=16_000, memory_bytes=4 << 30),
            )
        )
        layout = work / "layout"
        build_rootfs(layout)
        image = import_image(executor.store, layout).manifest
        rootfs = executor.rootfs.unpack(image)
        (work / "bare").mkdir()
        trio.run(ours, executor, image, 3)  # warm caches
        pod_image = podman_image(layout)
        hybrid = executor.mode is CgroupMode.HYBRID
        # Interleaved rounds, so that the baselines and ours see the same load.
        samples: dict[str, list[tuple[float, float]]] = {"crun": [], "runc": [], "ours": []}
        pod_times: list[float] = []
        load = [os.getloadavg()[0]]
        per_round = max(1, args.runs // ROUNDS)
        for _ in range(ROUNDS):
            for name in ("crun", "runc"):
                samples[name] += bare_samples(executor, rootfs, work / "bare", name, per_round)
            samples["ours"] += trio.run(ours, executor, image, per_round)
            if pod_image is not None:
                pod_times += podman_samples(pod_image, max(1, per_round // 2), hybrid)
        load.append(os.getloadavg()[0])
        rates = {c: trio.run(throughput, executor, image, c, args.jobs) for c in CONCURRENCY}
        load.append(os.getloadavg()[0])
        if pod_image is not None:
            subprocess.run(["podman", "rmi", "-f", pod_image], check=False, capture_output=True)
        # [0]: until the result (exit status, usage; ours: outputs too), [1]: also cleaned up
        med = {n: [statistics.median(x[i] for x in v) for i in (0, 1)] for n, v in samples.items()}
        chosen = executor.runtime.name
        pod = statistics.median(pod_times) if pod_times else None
        imp = import_throughput(work, args.mb)
    finally:
        executor.close()
        shutil.rmtree(work, ignore_errors=True)
    how = " (hybrid workaround)" if executor.mode is CgroupMode.HYBRID else ""
    print(f"cgroup mode {executor.mode.value}; executor runtime {chosen}{how}")
    print(f"load average {load[0]:.2f} before, {load[1]:.2f} after ({os.cpu_count()} CPUs)")
    print("medians, ms:                     until the result   until cleaned up too")
    for name in ("crun", "runc"):
        print(
            f"  bare {name} (run -d, wait, delete)  {med[name][0]:7.1f}        {med[name][1]:7.1f}"
        )
    ratios = [med["ours"][i] / med[chosen][i] for i in (0, 1)]
    print(
        f"  ours, full path ({chosen})          {med['ours'][0]:7.1f} = {ratios[0]:.2f}x bare"
        f"   {med['ours'][1]:7.1f} = {ratios[1]:.2f}x bare"
    )
    print(f"  goal <= 1.2x bare: {'met' if max(ratios) <= 1.2 else 'NOT met'}")
    if pod is None:
        print("podman run --rm: podman is not installed (not in quickstart's APT_PACKAGES)")
    else:
        print(f"  podman run --rm (until it returns)    {pod:7.1f} = "
              f"{pod / med['ours'][0]:.1f}x ours to the result, "
              f"{pod / med['ours'][1]:.1f}x ours cleaned up (goal >= 5x)")  # fmt: skip
    print(
        f"throughput, {args.jobs} jobs, until cleaned up: "
        + ", ".join(f"{r:.1f} jobs/s with {c} in flight" for c, r in rates.items())
        + f" (load {load[2]:.2f} after)"
    )
    print(
        f"import {args.mb} MB image: layout dir {imp['layout']:.0f} MB/s, "
        f"OCI archive {imp['archive']:.0f} MB/s"
    )
    print(
        json.dumps(
            {
                "cgroup_mode": executor.mode.value,
                "runtime": chosen,
                "runs": args.runs,
                "bare_crun_result_ms": round(med["crun"][0], 2),
                "bare_crun_ms": round(med["crun"][1], 2),
                "bare_runc_ms": round(med["runc"][1], 2),
                "ours_result_ms": round(med["ours"][0], 2),
                "ours_ms": round(med["ours"][1], 2),
                "ours_result_over_bare": round(ratios[0], 3),
                "ours_over_bare": round(ratios[1], 3),
                "podman_ms": round(pod, 2) if pod is not None else None,
                "podman_over_ours_result": round(pod / med["ours"][0], 2) if pod else None,
                "podman_over_ours": round(pod / med["ours"][1], 2) if pod else None,
                "load_avg": [round(x, 2) for x in load],
                "jobs_per_s": {str(c): round(r, 1) for c, r in rates.items()},
                "import_layout_mb_s": round(imp["layout"], 1),
                "import_archive_mb_s": round(imp["archive"], 1),
                "image_mb": args.mb,
            }
        )
    )


if __name__ == "__main__":
    main()
