"""Hardware a job may require: CPU model, CPU feature flags, kernel version
(spec/workloads.md, "Hardware").

Rules:
- A bid without a requirement matches any machine. With one, an offer that states no
  hardware does not match (the bid cannot know); otherwise its CPU model must contain the
  required text (case-insensitive), it must have every required flag, and its kernel
  release must be at least ``min_kernel``, compared as numbers (``6.1.0-18-amd64`` is
  6.1.0; a missing part counts as 0: ``6.1`` = ``6.1.0``).
- What a machine has comes from ``/proc/cpuinfo`` (:func:`parse_cpuinfo`, pure) and the
  kernel release; the shell reads them.
"""

from __future__ import annotations

import re

from protocol.messages import Hardware, HardwareRequirement

__all__ = ["hardware_fits", "kernel_version", "parse_cpuinfo"]

_VERSION = re.compile(r"(\d+(?:\.\d+)*)")


def kernel_version(release: str) -> tuple[int, ...]:
    """The leading dotted numbers of a kernel release: ``6.1.0-18-amd64`` -> (6, 1, 0).

    Raises:
        ValueError: no leading number.
    """
    m = _VERSION.match(release.strip())
    if m is None:
        raise ValueError(f"kernel release {release!r} does not start with a version number")
    return tuple(int(p) for p in m.group(1).split("."))


def _at_least(have: tuple[int, ...], want: tuple[int, ...]) -> bool:
    width = max(len(have), len(want))
    return have + (0,) * (width - len(have)) >= want + (0,) * (width - len(want))


def hardware_fits(need: HardwareRequirement | None, have: Hardware | None) -> bool:
    """Does a machine with ``have`` meet ``need``?"""
    if need is None:
        return True
    if have is None:
        return False
    if need.cpu_model and need.cpu_model.lower() not in have.cpu_model.lower():
        return False
    if need.cpu_flags and not set(need.cpu_flags) <= set(have.cpu_flags):
        return False
    if need.min_kernel:
        try:
            return _at_least(kernel_version(have.kernel), kernel_version(need.min_kernel))
        except ValueError:
            return False
    return True


def parse_cpuinfo(text: str) -> tuple[str, tuple[str, ...]]:
    """(model name, sorted flags) of the first processor in ``/proc/cpuinfo`` (x86
    ``model name``/``flags``; arm64 ``Features``, and ``Model`` where the kernel has it)."""
    model, flags = "", ""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        key = key.strip()
        if not sep:
            if model and flags:
                break
            continue
        if key in ("model name", "Model") and not model:
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = value
    return model or "unknown", tuple(sorted(set(flags.split())))
