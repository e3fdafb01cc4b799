"""Execution: run one agreed job in a real OCI container with enforced limits, and meter it.

- ``executor``: admission against capacity, the job's lifecycle, outputs and usage.
- ``runtime``: crun or runc; ``cgroups``: v1/v2 detection and usage counters;
  ``mounts``: namespaces and mounts; ``ocispec``: the container's config.json;
  ``gpu``: NVIDIA GPU detection and wiring.
"""

from node.exec.executor import CapacityExceeded, Executor, ExecutorConfig, JobResult
from node.exec.gpu import GpuDevice, detect_gpus

__all__ = [
    "CapacityExceeded",
    "Executor",
    "ExecutorConfig",
    "GpuDevice",
    "JobResult",
    "detect_gpus",
]
