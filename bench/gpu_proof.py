"""The GPU path on a real NVIDIA GPU: detection, the device wired into a container, isolation,
time-sliced sharing, and GPU memory metering, through the executor a provider uses.

Run on a machine with an NVIDIA GPU and its driver, after ``./quickstart.sh setup``:

    .venv/bin/python bench/gpu_proof.py

Each check prints ``PASS``/``FAIL``/``SKIP`` with what it saw; the last line is one JSON
object of figures (``"failed": 0`` when the path works). Exit status 0 when nothing failed.

The container image is busybox plus the host's glibc pieces that ``nvidia-smi`` and a small
CUDA driver-API probe need (copied from the host, as ``ldd`` names them); the driver's own
libraries and ``nvidia-smi`` come from the executor's GPU wiring (node/exec/gpu.py), never
from the image. The probe (``cuprobe``, built here with gcc) allocates and fills 256 MiB on
the GPU and holds it for 3 s, so the executor's sampler has something to see.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from node.exec.executor import Executor, ExecutorConfig, JobResult
from node.exec.gpu import detect_gpus, share_gpus
from node.storage.image import Entry, busybox_entries, import_image, write_layout
from protocol.messages import ExitReason, JobSpec, Resources

MIB = 1 << 20
SMI = "/usr/local/nvidia/bin/nvidia-smi"
PROBE_C = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>
typedef int (*init_t)(unsigned);
typedef int (*dev_t_)(int *, int);
typedef int (*ctx_t)(void **, unsigned, int);
typedef int (*alloc_t)(unsigned long long *, size_t);
typedef int (*set_t)(unsigned long long, unsigned char, size_t);
typedef int (*sync_t)(void);
int main(void) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!cuda) { printf("dlopen: %s\n", dlerror()); return 2; }
    int dev; void *ctx; unsigned long long ptr; size_t size = 256u << 20;
    int rc = ((init_t)dlsym(cuda, "cuInit"))(0);
    if (rc) { printf("cuInit %d\n", rc); return 3; }
    rc = ((dev_t_)dlsym(cuda, "cuDeviceGet"))(&dev, 0);
    if (rc) { printf("cuDeviceGet %d\n", rc); return 4; }
    rc = ((ctx_t)dlsym(cuda, "cuCtxCreate_v2"))(&ctx, 0, dev);
    if (rc) { printf("cuCtxCreate %d\n", rc); return 5; }
    rc = ((alloc_t)dlsym(cuda, "cuMemAlloc_v2"))(&ptr, size);
    if (rc) { printf("cuMemAlloc %d\n", rc); return 6; }
    rc = ((set_t)dlsym(cuda, "cuMemsetD8_v2"))(ptr, 1, size);
    if (rc) { printf("cuMemsetD8 %d\n", rc); return 7; }
    ((sync_t)dlsym(cuda, "cuCtxSynchronize"))();
    printf("allocated %zu bytes on the GPU\n", size);
    fflush(stdout);
    sleep(3);
    return 0;
}
"""

results: list[tuple[str, str, str]] = []


def check(name: str, ok: bool | None, seen: str) -> None:
    verdict = "SKIP" if ok is None else ("PASS" if ok else "FAIL")
    results.append((name, verdict, seen))
    print(f"{verdict:4}  {name}: {seen}", flush=True)


def _ldd(paths: list[str]) -> set[str]:
    """Every shared object the given executables and libraries load, as ldd names them."""
    found: set[str] = set()
    for path in paths:
        out = subprocess.run(["ldd", path], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            parts = line.split()
            for word in parts:
                if word.startswith("/") and Path(word).exists():
                    found.add(word)
    return found


def _image(root: Path, executor: Executor, extra: list[str]) -> str:
    """busybox + the host's libraries those ``extra`` files need (+ the probe, if built)."""
    libs = sorted(_ldd(extra))
    entries = busybox_entries()
    have = {e.path for e in entries}
    for lib in libs:
        rel = lib.lstrip("/")
        for parent in Path(rel).parents:
            if str(parent) != "." and str(parent) not in have:
                entries.append(Entry(path=str(parent), is_dir=True))
                have.add(str(parent))
        if rel not in have:
            entries.append(Entry(path=rel, data=Path(lib).read_bytes(), mode=0o755))
            have.add(rel)
    probe = root / "cuprobe"
    if probe.exists():
        entries.append(Entry(path="bin/cuprobe", data=probe.read_bytes(), mode=0o755))
    write_layout(root / "layout", [entries])
    digest = import_image(executor.store, root / "layout").manifest
    executor.rootfs.unpack(digest)
    return digest


def _text(executor: Executor, result: JobResult, path: str) -> str:
    ref = next((o for o in result.outputs if o.path == path), None)
    return executor.store.read_bytes(ref.digest).decode().strip() if ref else ""


def _job(image: str, script: str) -> JobSpec:
    return JobSpec(image=image, command=("/bin/sh", "-c", script), wall_ms=120_000)


def _setup() -> tuple[Path, list[str]]:
    """A work directory the containers can reach, the CUDA probe built in it (with gcc),
    and the files whose libraries the image needs."""
    root = Path(tempfile.mkdtemp(prefix="cx-gpu-proof-"))
    root.chmod(0o711)
    extra = [shutil.which("nvidia-smi") or ""]
    ldconfig = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    extra += [line.split(" => ")[1].strip() for line in ldconfig.splitlines()
              if "libcuda.so.1 " in line or "libnvidia-ml.so.1 " in line]  # fmt: skip
    gcc = shutil.which("gcc")
    if gcc:
        (root / "cuprobe.c").write_text(PROBE_C)
        subprocess.run([gcc, "-O1", "-o", str(root / "cuprobe"), str(root / "cuprobe.c"), "-ldl"],
                       check=True)  # fmt: skip
        extra.append(str(root / "cuprobe"))
    return root, [e for e in extra if e]


async def main() -> int:
    figures: dict[str, Any] = {}
    gpus = await detect_gpus()
    check("detect", bool(gpus), ", ".join(f"{g.index}: {g.model} {g.uuid}" for g in gpus))
    if not gpus:
        print(json.dumps({"gpus": 0, "failed": 1}))
        return 1
    figures.update(gpus=len(gpus), model=gpus[0].model)
    root, extra = await trio.to_thread.run_sync(_setup)
    gcc = (root / "cuprobe").exists()
    shares = share_gpus(gpus[:1], 2)  # GPU 0 as two time-sliced shares
    executor = Executor(
        ExecutorConfig(
            store_root=root / "store",
            work_root=root / "work",
            capacity=Resources(cpu_milli=2000, memory_bytes=2048 * MIB, gpus=len(shares)),
            gpus=shares,
        )
    )
    try:
        await executor.recover()
        image = await trio.to_thread.run_sync(_image, root, executor, extra)
        one = Resources(cpu_milli=1000, memory_bytes=512 * MIB, gpus=1)

        r = await executor.run_job(_job(image, f"{SMI} -L > /out/list"), one)
        listed = _text(executor, r, "/out/list")
        ok = r.exit_reason is ExitReason.SUCCESS and gpus[0].uuid in listed
        ok = ok and listed.count("GPU ") == 1
        check(
            "a job with gpus=1 sees exactly its GPU", ok, listed or r.detail or str(r.exit_reason)
        )
        figures["visible_in_container"] = ok

        r = await executor.run_job(
            _job(image, f"ls /dev/nvidia* > /out/dev 2>&1; {SMI} -L > /out/list 2>&1"),
            Resources(cpu_milli=1000, memory_bytes=512 * MIB),
        )
        ok = r.exit_reason is not ExitReason.SUCCESS and gpus[0].uuid not in _text(
            executor, r, "/out/list"
        )
        check("a job without gpus sees no GPU", ok, _text(executor, r, "/out/dev") or "-")
        figures["isolated_without"] = ok

        both: list[JobResult] = []
        t0 = time.monotonic()
        script = f"{SMI} -L > /out/list; sleep 2"
        async with trio.open_nursery() as nursery:
            for _ in range(2):
                nursery.start_soon(
                    lambda: _append(both, executor.run_job(_job(image, script), one))
                )
        took = time.monotonic() - t0
        lists = [_text(executor, x, "/out/list") for x in both]
        ok = all(x.exit_reason is ExitReason.SUCCESS for x in both) and all(
            gpus[0].uuid in s for s in lists
        )
        ok = ok and took < 4  # two 2 s jobs at once on shares of one GPU, not one after another
        check("two jobs share GPU 0 at once (time-sliced)", ok, f"{took:.1f} s for both")
        figures["shared_concurrently_s"] = round(took, 2)

        if not gcc:
            check("GPU memory metering", None, "no gcc to build the CUDA probe")
        else:
            r = await executor.run_job(_job(image, "/bin/cuprobe > /out/probe 2>&1"), one)
            peak = r.usage.gpu_memory_peak_bytes or 0
            said = _text(executor, r, "/out/probe")
            ok = r.exit_reason is ExitReason.SUCCESS and peak >= 256 * MIB
            check("GPU memory is metered", ok, f"{said}; peak {peak / MIB:.0f} MiB")
            figures["gpu_memory_peak_bytes"] = peak
            figures["probe_wall_ms"] = r.usage.wall_ms
    finally:
        executor.close()
        shutil.rmtree(root, ignore_errors=True)
    failed = sum(1 for _, v, _ in results if v == "FAIL")
    figures.update(passed=sum(1 for _, v, _ in results if v == "PASS"), failed=failed)
    print(json.dumps(figures))
    return 1 if failed else 0


async def _append(into: list[JobResult], job: Any) -> None:
    into.append(await job)


if __name__ == "__main__":
    sys.exit(trio.run(main))
