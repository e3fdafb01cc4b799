"""NVIDIA GPUs: detect them, advertise them, wire the requested ones into a container.

Rules:
- Detection asks ``nvidia-smi --query-gpu=index,name,memory.total,uuid,pci.bus_id
  --format=csv,noheader,nounits``; no nvidia-smi, or an error, means no GPUs (logged).
- Wiring follows nvidia-container-toolkit's approach, kept small: the GPU's device node plus
  the control nodes (nvidiactl, nvidia-uvm, nvidia-uvm-tools, nvidia-modeset) as OCI devices
  (which also allows them in the device cgroup), the driver's user-space libraries and
  ``nvidia-smi`` bind-mounted read-only under /usr/local/nvidia (the root is read-only, so
  no ldconfig: ``LD_LIBRARY_PATH`` points there), and ``NVIDIA_VISIBLE_DEVICES``.
- Sharing by time-slicing (``share_gpus``): each GPU is offered as N shares, each a
  GpuDevice of the same device with ``shares = N``; a share is advertised as the model
  with "(1/N time-sliced)" and a 1/N of its memory. Jobs on shares of one GPU see the same
  device and the driver time-slices their contexts; their memory is not fenced off from
  each other (MIG would fence it; it is not wired yet).
- Metering: while a job holds GPUs, ``gpu_memory_used`` asks ``nvidia-smi
  --query-compute-apps=pid,used_memory`` every ``GPU_SAMPLE_S`` and sums the memory of the
  processes in the job's cgroup; the executor keeps the peak (``usage.gpu_memory_peak_bytes``).
  GPU time is the reservation's: GPUs reserved x wall time, billed per GPU-hour.
- Parsers are pure functions of recorded text so they are unit-tested without a GPU.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import trio

from node.exec.ocispec import Bind, Device
from protocol.messages import Gpu

__all__ = [
    "GpuDevice",
    "GpuWiring",
    "detect_gpus",
    "gpu_memory_used",
    "parse_compute_apps",
    "parse_ldconfig",
    "parse_nvidia_smi",
    "provider_gpus",
    "share_gpus",
    "wire_gpus",
]

log = logging.getLogger(__name__)

QUERY = "index,name,memory.total,uuid,pci.bus_id"
NVIDIA_SMI_ARGS = ("--query-gpu=" + QUERY, "--format=csv,noheader,nounits")
CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
DRIVER_LIBS = (
    "libcuda.so.1",
    "libnvidia-ml.so.1",
    "libnvidia-ptxjitcompiler.so.1",
    "libnvidia-nvvm.so.4",
    "libnvidia-gpucomp.so",
)
IN_CONTAINER = "/usr/local/nvidia"


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuDevice:
    index: int
    model: str
    memory_bytes: int
    uuid: str
    bus_id: str
    shares: int = 1  # > 1: one time-sliced share of ``shares`` of this GPU

    def advertised(self) -> Gpu:
        if self.shares == 1:
            return Gpu(model=self.model, memory_bytes=self.memory_bytes)
        return Gpu(
            model=f"{self.model} (1/{self.shares} time-sliced)",
            memory_bytes=self.memory_bytes // self.shares,
        )


def share_gpus(gpus: Sequence[GpuDevice], shares: int) -> tuple[GpuDevice, ...]:
    """Each GPU as ``shares`` time-sliced shares (1: whole GPUs), spread so that jobs
    taking shares in order land on different GPUs first.

    Raises:
        ValueError: ``shares`` below 1 or above 64.
    """
    if not 1 <= shares <= 64:
        raise ValueError(f"gpu_shares {shares} is outside 1..64")
    return tuple(replace(g, shares=shares) for _ in range(shares) for g in gpus)


def parse_nvidia_smi(text: str) -> list[GpuDevice]:
    """GPUs from ``nvidia-smi`` CSV (noheader, nounits; memory.total in MiB).

    Raises:
        ValueError: a line that is not five fields with an integer index and memory.
    """
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 5:
            raise ValueError(f"nvidia-smi line has {len(fields)} fields, expected 5: {line!r}")
        index, name, mem_mib, uuid, bus = fields
        gpus.append(
            GpuDevice(
                index=int(index),
                model=name,
                memory_bytes=int(mem_mib) * 1024 * 1024,
                uuid=uuid,
                bus_id=bus,
            )
        )
    return gpus


async def detect_gpus(nvidia_smi: str | None = None) -> list[GpuDevice]:
    """The host's NVIDIA GPUs; [] when there are none or nvidia-smi fails."""
    exe = nvidia_smi or shutil.which("nvidia-smi")
    if exe is None:
        log.info("no nvidia-smi on PATH: advertising no GPUs")
        return []
    proc = await trio.run_process(
        [exe, *NVIDIA_SMI_ARGS], capture_stdout=True, capture_stderr=True, check=False
    )
    if proc.returncode != 0:
        log.warning("nvidia-smi failed (%d): %s", proc.returncode, proc.stderr.decode().strip())
        return []
    try:
        gpus = parse_nvidia_smi(proc.stdout.decode())
    except ValueError:
        log.warning("could not parse nvidia-smi output", exc_info=True)
        return []
    log.info("detected %d GPU(s): %s", len(gpus), ", ".join(g.model for g in gpus))
    return gpus


async def provider_gpus(shares: int) -> tuple[GpuDevice, ...]:
    """What a provider with ``[provider] gpu_shares = shares`` offers: nothing for 0, else
    every detected GPU as ``shares`` time-sliced shares."""
    if shares == 0:
        return ()
    return share_gpus(await detect_gpus(), shares)


COMPUTE_APPS_ARGS = ("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
GPU_SAMPLE_S = 1.0


def parse_compute_apps(text: str) -> dict[int, int]:
    """pid -> GPU memory bytes from ``nvidia-smi --query-compute-apps=pid,used_memory``
    (noheader, nounits: MiB); lines that do not read are skipped (``[N/A]``)."""
    used: dict[int, int] = {}
    for line in text.splitlines():
        pid, _, mib = (f.strip() for f in line.partition(","))
        if pid.isdigit() and mib.isdigit():
            used[int(pid)] = used.get(int(pid), 0) + int(mib) * 1024 * 1024
    return used


async def gpu_memory_used(pids: set[int], nvidia_smi: str | None = None) -> int:
    """GPU memory (bytes) the processes ``pids`` hold now; 0 when nvidia-smi cannot say."""
    exe = nvidia_smi or shutil.which("nvidia-smi")
    if exe is None or not pids:
        return 0
    proc = await trio.run_process(
        [exe, *COMPUTE_APPS_ARGS], capture_stdout=True, capture_stderr=True, check=False
    )
    if proc.returncode != 0:
        return 0
    return sum(b for pid, b in parse_compute_apps(proc.stdout.decode()).items() if pid in pids)


def parse_ldconfig(text: str, arch_tag: str = "x86-64") -> dict[str, str]:
    """soname -> path from ``ldconfig -p``, for the host's architecture."""
    libs: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, path = line.strip().partition(" => ")
        if not sep:
            continue
        soname, _, flags = name.partition(" (")
        if arch_tag in flags or "," not in flags:
            libs.setdefault(soname.strip(), path.strip())
    return libs


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuWiring:
    devices: tuple[Device, ...] = ()
    binds: tuple[Bind, ...] = ()
    env: dict[str, str] = field(default_factory=dict)


def _device(path: Path) -> Device | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return Device(path=str(path), major=os.major(st.st_rdev), minor=os.minor(st.st_rdev))


def wire_gpus(
    gpus: Sequence[GpuDevice],
    *,
    dev: Path = Path("/dev"),
    ldconfig: str | None = None,
    nvidia_smi: str | None = None,
) -> GpuWiring:
    """Devices, mounts and environment that give a container exactly ``gpus``."""
    if not gpus:
        return GpuWiring()
    devices = []
    indexes = sorted({g.index for g in gpus})  # shares of one GPU: its device once
    for name in [f"nvidia{i}" for i in indexes] + list(CONTROL_NODES):
        d = _device(dev / name)
        if d is not None:
            devices.append(Device(path=f"/dev/{name}", major=d.major, minor=d.minor))
    if ldconfig is None:
        ldconfig = subprocess.run(
            ["ldconfig", "-p"], capture_output=True, text=True, check=False
        ).stdout
    libs = parse_ldconfig(ldconfig)
    binds = [
        Bind(source=libs[n], destination=f"{IN_CONTAINER}/lib64/{n}")
        for n in DRIVER_LIBS
        if n in libs
    ]
    smi = nvidia_smi or shutil.which("nvidia-smi")
    if smi:
        binds.append(Bind(source=smi, destination=f"{IN_CONTAINER}/bin/nvidia-smi"))
    env = {
        "NVIDIA_VISIBLE_DEVICES": ",".join(dict.fromkeys(g.uuid for g in gpus)),
        "LD_LIBRARY_PATH": f"{IN_CONTAINER}/lib64",
    }
    return GpuWiring(devices=tuple(devices), binds=tuple(binds), env=env)
