"""What this machine is, for a provider's offer: CPU model and flags, kernel release
(protocol/hardware.py parses and matches them)."""

from __future__ import annotations

import os
from pathlib import Path

from protocol.hardware import parse_cpuinfo
from protocol.messages import Hardware

__all__ = ["detect_hardware"]


def detect_hardware(cpuinfo: Path = Path("/proc/cpuinfo")) -> Hardware:
    """This machine's CPU model, flags and kernel release."""
    try:
        model, flags = parse_cpuinfo(cpuinfo.read_text())
    except OSError:
        model, flags = "unknown", ()
    return Hardware(cpu_model=model, cpu_flags=flags, kernel=os.uname().release)
