"""The few host-side mount operations a job needs, as direct syscalls (no mount(8) fork).

Rules:
- Writable job areas are size-capped tmpfs mounts (a scratch disk, node/exec/scratch.py,
  is an ext4 image on a loop device) owned by the container's mapped root, so
  the kernel enforces the cap (ENOSPC) and the provider can read them after the job ends.
- Each job's root is an overlay over the shared, unpacked image: mount points the runtime
  creates land in the job's upper layer, never in the shared tree.
- ``unmount`` detaches lazily, so a file still held open cannot keep a job from cleaning up.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path

__all__ = [
    "make_shared",
    "mount_device",
    "mount_overlay",
    "mount_points",
    "mount_sources",
    "mount_tmpfs",
    "prctl_subreaper",
    "unmount",
]

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mount.argtypes = [
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_char_p,
]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]

MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_SHARED = 1 << 20
MNT_DETACH = 0x2
PR_SET_CHILD_SUBREAPER = 36


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str, target: str | Path, fstype: str | None, flags: int, data: str) -> None:
    rc = _libc.mount(
        source.encode(),
        str(target).encode(),
        fstype.encode() if fstype else None,
        flags,
        data.encode() if data else None,
    )
    _check(rc, f"mount {fstype or 'bind'} on {target}")


def mount_tmpfs(
    target: Path, *, size_bytes: int, uid: int, gid: int, mode: int = 0o755, source: str = "tmpfs"
) -> None:
    """A tmpfs of at most ``size_bytes`` (rounded up to pages) at ``target``; ``source``
    names it in the mount table."""
    data = f"size={max(size_bytes, 4096)},uid={uid},gid={gid},mode={mode:o}"
    _mount(source, target, "tmpfs", MS_NOSUID | MS_NODEV, data)


def mount_overlay(target: Path, *, lower: Path, upper: Path, work: Path) -> None:
    _mount("overlay", target, "overlay", 0, f"lowerdir={lower},upperdir={upper},workdir={work}")


def mount_device(device: Path, target: Path, *, fstype: str) -> None:
    """Mount the filesystem on block ``device`` at ``target``, nosuid and nodev."""
    _mount(str(device), target, fstype, MS_NOSUID | MS_NODEV, "")


def make_shared(target: Path) -> None:
    """Mounts made under ``target`` from now on propagate to the namespaces copied from it."""
    _check(_libc.mount(None, str(target).encode(), None, MS_SHARED, None), f"make {target} shared")


def mount_sources() -> list[tuple[str, str]]:
    """(mount point, source) of every mount this process sees, in mount order."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rfields = left.split(), right.split()
            if len(fields) >= 5 and len(rfields) >= 2:
                out.append((fields[4], rfields[1]))
    return out


def mount_points() -> list[str]:
    return [point for point, _ in mount_sources()]


def unmount(target: Path) -> None:
    """Detach ``target``; a path that is not mounted is fine."""
    rc = _libc.umount2(str(target).encode(), MNT_DETACH)
    if rc != 0 and ctypes.get_errno() not in (22, 2):  # EINVAL: not a mount; ENOENT
        _check(rc, f"umount {target}")


def prctl_subreaper() -> None:
    """Orphaned descendants (a container's init after ``create`` exits) become our children,
    so we can wait for them and read their exit status."""
    _check(_libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "prctl(PR_SET_CHILD_SUBREAPER)")
