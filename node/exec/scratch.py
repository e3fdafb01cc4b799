"""A job's scratch disk: ``disk_bytes`` of real disk with an enforced quota, not memory.

Rules:
- Each job that reserves ``disk_bytes`` gets its own ext4 filesystem in a sparse file of
  that size on the provider's disk (``<work>/scratch/<job>.img``; at least ``MIN_BYTES``,
  mke2fs's smallest usable size), made with mke2fs (no journal, no reserved blocks, root
  owned by the container's mapped root) and loop-mounted nosuid,nodev at the job's
  ``scratch`` directory, which the container sees as /tmp. The filesystem's size is the
  quota: a write past it fails with ENOSPC inside the job, and nothing is charged to the
  job's memory (the tmpfs /tmp of a job without ``disk_bytes`` is).
- The loop device is attached with LO_FLAGS_AUTOCLEAR: it detaches itself when the last
  mount of it goes, so cleanup is the usual lazy unmount plus removing the image file,
  and a crash leaves at most image files, which :func:`sweep` removes.
- Usage is the filesystem's used blocks when the job ended, less what the empty
  filesystem used (:func:`used_bytes`); the reservation itself is billed per GiB-hour
  like memory (protocol/settlement.py).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import struct
import subprocess
from pathlib import Path

from node.exec import mounts

__all__ = ["MIN_BYTES", "ScratchError", "make_scratch", "remove_image", "sweep", "used_bytes"]

MIN_BYTES = 1 << 20
# <linux/loop.h>
_LOOP_SET_FD = 0x4C00
_LOOP_CLR_FD = 0x4C01
_LOOP_SET_STATUS64 = 0x4C04
_LOOP_CTL_GET_FREE = 0x4C82
_LO_FLAGS_AUTOCLEAR = 4
_LOOP_INFO64_SIZE = 232
_LO_FLAGS_OFFSET = 52  # five u64, then lo_number, lo_encrypt_type, lo_encrypt_key_size


class ScratchError(OSError):
    """The scratch disk could not be made (a provider fault)."""


def _attach_loop(image: Path, attempts: int = 8) -> tuple[int, Path]:
    """A free loop device backed by ``image``, set to clear itself on last close:
    (its open fd, its path). Another process may take the same free device between asking
    and attaching (EBUSY): ask again."""
    backing = os.open(image, os.O_RDWR | os.O_CLOEXEC)
    try:
        ctl = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
        try:
            for _ in range(attempts):
                number = fcntl.ioctl(ctl, _LOOP_CTL_GET_FREE)
                dev = Path(f"/dev/loop{number}")
                fd = os.open(dev, os.O_RDWR | os.O_CLOEXEC)
                try:
                    fcntl.ioctl(fd, _LOOP_SET_FD, backing)
                except OSError as exc:
                    os.close(fd)
                    if exc.errno == errno.EBUSY:
                        continue
                    raise
                info = bytearray(_LOOP_INFO64_SIZE)
                struct.pack_into("=I", info, _LO_FLAGS_OFFSET, _LO_FLAGS_AUTOCLEAR)
                try:
                    fcntl.ioctl(fd, _LOOP_SET_STATUS64, bytes(info))
                except OSError:
                    with contextlib.suppress(OSError):
                        fcntl.ioctl(fd, _LOOP_CLR_FD)
                    os.close(fd)
                    raise
                return fd, dev
        finally:
            os.close(ctl)
    finally:
        os.close(backing)
    raise ScratchError(errno.EBUSY, "no free loop device after several attempts")


def make_scratch(image: Path, target: Path, *, size_bytes: int, uid: int, gid: int) -> int:
    """Make and mount the scratch filesystem; return the bytes the empty filesystem uses
    (the baseline of :func:`used_bytes`). Blocks (a worker thread).

    Raises:
        ScratchError: mke2fs failed, or no loop device could be attached.
    """
    image.parent.mkdir(mode=0o700, exist_ok=True)
    with open(image, "xb") as f:
        f.truncate(max(size_bytes, MIN_BYTES))  # sparse: disk is used only as it is written
    made = subprocess.run(
        [
            "mke2fs",
            "-q",
            "-F",
            "-t",
            "ext4",
            "-O",
            "^has_journal",
            "-m",
            "0",
            "-E",
            f"root_owner={uid}:{gid},lazy_itable_init=1",
            str(image),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if made.returncode != 0:
        raise ScratchError(errno.EIO, f"mke2fs {image}: {made.stderr.strip()}")
    try:
        fd, dev = _attach_loop(image)
    except OSError as exc:
        raise ScratchError(
            exc.errno or errno.EIO, f"attach {image} to a loop device: {exc}"
        ) from exc
    try:
        mounts.mount_device(dev, target, fstype="ext4")
    finally:
        os.close(fd)  # the mount holds the device now; AUTOCLEAR detaches it after umount
    (target / "lost+found").rmdir()  # the job's /tmp starts empty
    target.chmod(0o1777)
    return _used(target)


def _used(target: Path) -> int:
    vfs = os.statvfs(target)
    return (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize


def used_bytes(target: Path, baseline: int) -> int:
    """Bytes the job's files take on its scratch disk now."""
    return max(0, _used(target) - baseline)


def remove_image(image: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        image.unlink()


def sweep(directory: Path) -> None:
    """Remove scratch images left by a crash (their loop devices went with the mounts)."""
    if directory.is_dir():
        for image in directory.glob("*.img"):
            remove_image(image)
