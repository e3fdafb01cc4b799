"""The OCI runtime spec (config.json) for one job: every limit and confinement in one place.

Rules (what every job gets, whatever it asks for):
- read-only root, ``noNewPrivileges``, a small capability set (no NET_RAW, MKNOD, SYS_*),
  the seccomp profile below, masked and read-only /proc paths;
- its own user namespace: container uid/gid 0..65535 are host 100000..165535;
- its own pid, ipc, uts, mount and cgroup namespaces; its own network namespace (loopback
  only) unless the agreement allows the network;
- memory limit with swap equal to it (no swap beyond the limit), CPU quota per 100 ms
  period from millicores, a pids limit, and a device allow-list (runtime defaults + GPUs);
- writable places are only the bind mounts the executor prepares (output, checkpoint),
  the scratch /tmp (a tmpfs of ``scratch_bytes``, or the job's scratch disk bound there)
  and /dev/shm; /dev is a read-only tmpfs
  holding the runtime's default devices; inputs are bind-mounted read-only.
"""

from __future__ import annotations

import platform
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from node.storage.image import ID_MAP_BASE, ID_MAP_SIZE

__all__ = ["Bind", "Device", "JobConfig", "build_config", "seccomp_profile"]

CPU_PERIOD_US = 100_000

# Docker's default set minus NET_RAW (raw sockets) and MKNOD; inside a user namespace these
# only reach objects the namespace owns.
CAPABILITIES = (
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_AUDIT_WRITE",
)

# Denied outright (EPERM): namespace and mount games, tracing, kernel modules and keys,
# BPF and perf, clock and reboot. A deny-list keeps the profile short and legible; the
# user namespace and dropped capabilities are the second wall behind it.
DENIED_SYSCALLS = (
    "acct",
    "add_key",
    "bpf",
    "clock_adjtime",
    "clock_settime",
    "create_module",
    "delete_module",
    "finit_module",
    "fsconfig",
    "fsmount",
    "fsopen",
    "fspick",
    "get_kernel_syms",
    "init_module",
    "io_uring_enter",
    "io_uring_register",
    "io_uring_setup",
    "kcmp",
    "kexec_file_load",
    "kexec_load",
    "keyctl",
    "lookup_dcookie",
    "mount",
    "mount_setattr",
    "move_mount",
    "name_to_handle_at",
    "nfsservctl",
    "open_by_handle_at",
    "open_tree",
    "perf_event_open",
    "pivot_root",
    "process_vm_readv",
    "process_vm_writev",
    "ptrace",
    "quotactl",
    "reboot",
    "request_key",
    "setns",
    "settimeofday",
    "swapoff",
    "swapon",
    "sysfs",
    "umount",
    "umount2",
    "unshare",
    "uselib",
    "userfaultfd",
    "vhangup",
)
# clone() may not create namespaces: CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID,
# NEWNET.
_CLONE_NS_FLAGS = (
    0x00020000,
    0x02000000,
    0x04000000,
    0x08000000,
    0x10000000,
    0x20000000,
    0x40000000,
)


def seccomp_profile() -> dict[str, Any]:
    arches = (
        ["SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"]
        if platform.machine() in ("aarch64", "arm64")
        else ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"]
    )
    return {
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": arches,
        "syscalls": [
            {"names": list(DENIED_SYSCALLS), "action": "SCMP_ACT_ERRNO", "errnoRet": 1},
            # One rule per namespace flag: deny when (flags & flag) == flag.
            *(
                {
                    "names": ["clone"],
                    "action": "SCMP_ACT_ERRNO",
                    "errnoRet": 1,
                    "args": [{"index": 0, "value": f, "valueTwo": f, "op": "SCMP_CMP_MASKED_EQ"}],
                }
                for f in _CLONE_NS_FLAGS
            ),
            # clone3 passes flags in memory seccomp cannot read: ENOSYS makes libc fall back
            # to clone(), which the rule above checks.
            {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38},
        ],
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class Bind:
    source: str
    destination: str
    readonly: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class Device:
    path: str
    major: int
    minor: int
    kind: str = "c"


@dataclass(frozen=True, slots=True, kw_only=True)
class JobConfig:
    rootfs: str
    args: Sequence[str]
    env: Sequence[str]
    cwd: str = "/"
    cgroups_path: str
    cpu_milli: int
    memory_bytes: int
    pids_limit: int
    network: bool = False
    swap_accounting: bool = True
    binds: Sequence[Bind] = ()
    devices: Sequence[Device] = ()
    block_device: tuple[int, int] | None = None  # (major, minor) to meter I/O on (v1)
    scratch_bytes: int | None = 64 * 1024 * 1024  # /tmp's tmpfs; None: /tmp is a bind
    hostname: str = "job"
    annotations: dict[str, str] = field(default_factory=dict)


def build_config(job: JobConfig) -> dict[str, Any]:
    """The config.json for ``job``."""
    caps = list(CAPABILITIES)
    namespaces = [{"type": t} for t in ("pid", "ipc", "uts", "mount", "user", "cgroup")]
    if not job.network:
        namespaces.append({"type": "network"})
    mounts: list[dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {
            "destination": "/dev",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "strictatime", "mode=755", "size=1024k", "ro"],
        },
        {
            "destination": "/dev/pts",
            "type": "devpts",
            "source": "devpts",
            "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"],
        },
        {
            "destination": "/dev/shm",  # noqa: S108 - the container's own
            "type": "tmpfs",
            "source": "shm",
            "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
        },
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue"},
    ]
    if job.scratch_bytes is not None:
        mounts.append(
            {
                "destination": "/tmp",  # noqa: S108 - the container's own tmpfs
                "type": "tmpfs",
                "source": "tmpfs",
                "options": ["nosuid", "nodev", "mode=1777", f"size={job.scratch_bytes}"],
            }
        )
    for b in job.binds:
        opts = ["rbind", "nosuid", "nodev", "ro" if b.readonly else "rw"]
        mounts.append(
            {"destination": b.destination, "type": "bind", "source": b.source, "options": opts}
        )
    memory: dict[str, int] = {"limit": job.memory_bytes}
    if job.swap_accounting:
        memory["swap"] = job.memory_bytes  # OCI swap = memory + swap: no swap beyond
    resources: dict[str, Any] = {
        "devices": [{"allow": False, "access": "rwm"}]
        + [
            {"allow": True, "type": d.kind, "major": d.major, "minor": d.minor, "access": "rwm"}
            for d in job.devices
        ],
        "memory": memory,
        "cpu": {"quota": max(1000, job.cpu_milli * CPU_PERIOD_US // 1000), "period": CPU_PERIOD_US},
        "pids": {"limit": job.pids_limit},
    }
    if job.block_device is not None:
        # cgroup v1 counts blkio bytes only for devices with a throttle rule: a huge one.
        major, minor = job.block_device
        huge = [{"major": major, "minor": minor, "rate": 1 << 50}]
        resources["blockIO"] = {"throttleReadBpsDevice": huge, "throttleWriteBpsDevice": huge}
    idmap = [{"containerID": 0, "hostID": ID_MAP_BASE, "size": ID_MAP_SIZE}]
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": list(job.args),
            "env": list(job.env),
            "cwd": job.cwd,
            "capabilities": {
                "bounding": caps,
                "effective": caps,
                "permitted": caps,
                "inheritable": [],
                "ambient": [],
            },
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 4096, "soft": 4096}],
            "noNewPrivileges": True,
            "oomScoreAdj": 1000,
        },
        "root": {"path": job.rootfs, "readonly": True},
        "hostname": job.hostname,
        "mounts": mounts,
        "annotations": dict(job.annotations),
        "linux": {
            "uidMappings": idmap,
            "gidMappings": idmap,
            "namespaces": namespaces,
            "resources": resources,
            "cgroupsPath": job.cgroups_path,
            "devices": [
                {
                    "path": d.path,
                    "type": d.kind,
                    "major": d.major,
                    "minor": d.minor,
                    "fileMode": 0o666,
                    "uid": 0,
                    "gid": 0,
                }
                for d in job.devices
            ],
            "seccomp": seccomp_profile(),
            "maskedPaths": [
                "/proc/acpi",
                "/proc/asound",
                "/proc/kcore",
                "/proc/keys",
                "/proc/latency_stats",
                "/proc/timer_list",
                "/proc/timer_stats",
                "/proc/sched_debug",
                "/proc/scsi",
                "/sys/firmware",
            ],
            "readonlyPaths": [
                "/proc/bus",
                "/proc/fs",
                "/proc/irq",
                "/proc/sys",
                "/proc/sysrq-trigger",
            ],
        },
    }
