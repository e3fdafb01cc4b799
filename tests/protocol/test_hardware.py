"""The hardware constraint: CPU model, flags and kernel release against what an offer states."""

from __future__ import annotations

import pytest

from protocol.hardware import hardware_fits, kernel_version, parse_cpuinfo
from protocol.messages import Hardware, HardwareRequirement

EPYC = Hardware(
    cpu_model="AMD EPYC 9654 96-Core Processor",
    cpu_flags=("avx2", "avx512f", "sse4_2"),
    kernel="6.1.0-18-amd64",
)


@pytest.mark.parametrize(
    ("need", "fits"),
    [
        (None, True),
        (HardwareRequirement(), True),
        (HardwareRequirement(cpu_model="epyc"), True),
        (HardwareRequirement(cpu_model="Xeon"), False),
        (HardwareRequirement(cpu_flags=("avx512f", "avx2")), True),
        (HardwareRequirement(cpu_flags=("avx512f", "amx_tile")), False),
        (HardwareRequirement(min_kernel="6.1"), True),
        (HardwareRequirement(min_kernel="6.1.0"), True),
        (HardwareRequirement(min_kernel="6.1.1"), False),
        (HardwareRequirement(min_kernel="5.15"), True),
        (HardwareRequirement(min_kernel="6.10"), False),  # numbers, not text: 10 > 1
    ],
)
def test_requirements_against_an_offer(need: HardwareRequirement | None, fits: bool) -> None:
    assert hardware_fits(need, EPYC) is fits


def test_an_offer_that_states_no_hardware_meets_only_bids_that_need_none() -> None:
    assert hardware_fits(None, None)
    assert not hardware_fits(HardwareRequirement(min_kernel="4.0"), None)


def test_kernel_versions_and_cpuinfo() -> None:
    assert kernel_version("6.18.44-fc-v782") == (6, 18, 44)
    with pytest.raises(ValueError, match="version number"):
        kernel_version("linux")
    text = (
        "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Gold 6338\nflags\t\t: sse2 avx2 avx2 fpu\n"
        "\nprocessor\t: 1\nmodel name\t: other\nflags\t\t: x\n"
    )
    assert parse_cpuinfo(text) == ("Intel(R) Xeon(R) Gold 6338", ("avx2", "fpu", "sse2"))
    arm = "processor\t: 0\nFeatures\t: fp asimd sve\nCPU part\t: 0xd40\n"
    assert parse_cpuinfo(arm) == ("unknown", ("asimd", "fp", "sve"))
