"""Pure parts of the executor: cgroup parsing, exit classification, the OCI config, GPUs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from executor_support import mounts_under, searchable_dir

from node.exec import mounts
from node.exec.cgroups import (
    CgroupMode,
    JobCgroup,
    detect_hierarchies,
    parse_blkio,
    parse_hierarchies,
    parse_io_stat,
    parse_keyed,
    read_counters,
)
from node.exec.gpu import GpuDevice, detect_gpus, parse_ldconfig, parse_nvidia_smi, wire_gpus
from node.exec.janitor import Janitor
from node.exec.jobsdir import JobsDir
from node.exec.mountns import MountNamespace
from node.exec.ocispec import Bind, JobConfig, build_config
from node.exec.runtime import Runtime, RuntimeFault
from protocol.messages import ExitReason
from protocol.usage import Observation, classify, exit_code_of

DATA = Path(__file__).parent / "data"

HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:36 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
V2 = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"


def test_cgroup_mode_and_hierarchies_from_mountinfo():
    hybrid = parse_hierarchies(HYBRID)
    assert hybrid.mode is CgroupMode.HYBRID
    assert parse_hierarchies(V2).mode is CgroupMode.V2
    assert parse_hierarchies("\n".join(HYBRID.splitlines()[:3])).mode is CgroupMode.V1
    assert hybrid.v1["memory"] == Path("/sys/fs/cgroup/memory")
    assert hybrid.v1["systemd"] == Path("/sys/fs/cgroup/systemd")
    assert "rw" not in hybrid.v1
    assert hybrid.unified == Path("/sys/fs/cgroup/unified")
    assert len(hybrid.roots) == 4


def test_job_cgroup_follows_from_its_absolute_path():
    cg = parse_hierarchies(HYBRID).job("/cx/j1")
    assert cg.file("memory", "memory.peak") == Path("/sys/fs/cgroup/memory/cx/j1/memory.peak")
    assert cg.file("pids", "pids.peak") is None  # not mounted in this sample
    v2 = parse_hierarchies(V2).job("/cx/j1")
    assert v2.file("memory", "memory.peak") == Path("/sys/fs/cgroup/cx/j1/memory.peak")


def test_removal_sweeps_every_hierarchy_deepest_first(tmp_path):
    mountinfo = "".join(
        f"3{i} 23 0:2{i} / {tmp_path / name} rw - cgroup cgroup rw,{name}\n"
        for i, name in enumerate(["cpu", "memory", "pids"])
    )
    hier = parse_hierarchies(mountinfo)
    (tmp_path / "cpu" / "cx" / "j1" / "inner").mkdir(parents=True)
    (tmp_path / "memory" / "cx" / "j1").mkdir(parents=True)
    (tmp_path / "pids" / "cx").mkdir(parents=True)  # never made for this job: fine
    (tmp_path / "memory" / "cx" / "j2").mkdir()  # another job's: untouched
    assert hier.remove("/cx/j1") == []
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "cpu", "cpu/cx", "memory", "memory/cx", "memory/cx/j2", "pids", "pids/cx",
    ]  # fmt: skip


def test_counter_parsers():
    assert parse_keyed("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")["oom_kill"] == 3
    assert parse_blkio("254:0 Read 4096\n254:0 Write 8192\n254:0 Sync 1\nTotal 12288\n") == (
        4096,
        8192,
    )
    assert parse_io_stat("254:0 rbytes=10 wbytes=20 rios=1\n8:0 rbytes=1 wbytes=2\n") == (11, 22)


@pytest.mark.parametrize("mode", [CgroupMode.V1, CgroupMode.V2])
def test_read_counters_from_recorded_files(tmp_path, mode):
    files = {
        CgroupMode.V1: {
            "cpuacct.usage": "2500000\n",
            "memory.max_usage_in_bytes": "1048576\n",
            "memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
            "pids.peak": "7\n",
            "pids.events": "max 3\n",
            "blkio.throttle.io_service_bytes_recursive": "254:0 Read 10\n254:0 Write 20\n",
        },
        CgroupMode.V2: {
            "cpu.stat": "usage_usec 2500\nuser_usec 2000\n",
            "memory.peak": "1048576\n",
            "memory.events": "low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n",
            "pids.peak": "7\n",
            "pids.events": "max 3\n",
            "io.stat": "254:0 rbytes=10 wbytes=20\n",
        },
    }[mode]
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    controllers = ["cpuacct", "memory", "pids", "blkio"] if mode is CgroupMode.V1 else [""]
    c = read_counters(JobCgroup(mode=mode, dirs=dict.fromkeys(controllers, tmp_path)))
    assert (c.cpu_us, c.memory_peak_bytes, c.oom_kills) == (2500, 1048576, 1)
    assert (c.pids_peak, c.pids_limit_hits, c.io_read_bytes, c.io_write_bytes) == (7, 3, 10, 20)


def test_missing_counters_read_as_zero(tmp_path):
    c = read_counters(JobCgroup(mode=CgroupMode.V2, dirs={"": tmp_path / "gone"}))
    assert c.cpu_us == c.memory_peak_bytes == c.pids_peak == 0


@pytest.mark.parametrize(
    ("obs", "reason"),
    [
        ({"exit_code": 0}, ExitReason.SUCCESS),
        # a child OOM-killed (dd into the memory-backed /tmp) while the job exits 0: the
        # exit reason says so, not success (issue 17)
        ({"exit_code": 0, "oom_kills": 1}, ExitReason.OOM),
        ({"exit_code": 0, "pids_limit_hits": 1}, ExitReason.SUCCESS),
        ({"exit_code": 3}, ExitReason.NONZERO_EXIT),
        ({"exit_code": 137, "oom_kills": 1}, ExitReason.OOM),
        ({"exit_code": 137, "timed_out": True}, ExitReason.TIMEOUT),
        ({"exit_code": 137, "timed_out": True, "pids_limit_hits": 5}, ExitReason.PIDS_EXHAUSTED),
        ({"exit_code": 1, "pids_limit_hits": 5}, ExitReason.PIDS_EXHAUSTED),
        ({"exit_code": 1, "output_bytes": 11}, ExitReason.OUTPUT_TOO_LARGE),
        ({"exit_code": 0, "output_bytes": 11}, ExitReason.OUTPUT_TOO_LARGE),
        ({"exit_code": 0, "output_bytes": 10}, ExitReason.SUCCESS),
        ({"exit_code": 137, "preempted": True, "oom_kills": 1}, ExitReason.PREEMPTED),
        ({"exit_code": 0, "fault": True}, ExitReason.PROVIDER_FAULT),
    ],
)
def test_classify(obs, reason):
    assert classify(Observation(max_output_bytes=10, **obs)) is reason


def test_exit_code_convention():
    assert exit_code_of(exited=True, status=3) == 3
    assert exit_code_of(exited=False, status=9) == 137


def _config(**kw):
    base = {
        "rootfs": "/r",
        "args": ["/bin/true"],
        "env": ["A=1"],
        "cgroups_path": "cx/j",
        "cpu_milli": 1500,
        "memory_bytes": 64 << 20,
        "pids_limit": 32,
    }
    base.update(kw)
    return build_config(JobConfig(**base))


def test_oci_config_confines_the_job():
    cfg = _config(binds=[Bind(source="/s", destination="/in", readonly=True)])
    linux, proc = cfg["linux"], cfg["process"]
    assert cfg["root"]["readonly"] is True
    assert proc["noNewPrivileges"] is True
    assert "CAP_SYS_ADMIN" not in proc["capabilities"]["bounding"]
    assert "CAP_NET_RAW" not in proc["capabilities"]["bounding"]
    assert {"type": "network"} in linux["namespaces"]
    assert {"type": "user"} in linux["namespaces"]
    assert linux["uidMappings"][0]["hostID"] != 0
    res = linux["resources"]
    assert res["cpu"] == {"quota": 150_000, "period": 100_000}
    assert res["memory"] == {"limit": 64 << 20, "swap": 64 << 20}
    assert res["pids"] == {"limit": 32}
    assert res["devices"][0] == {"allow": False, "access": "rwm"}
    denied = {n for rule in linux["seccomp"]["syscalls"] for n in rule["names"]}
    assert {"ptrace", "mount", "unshare", "setns", "bpf", "clone", "clone3"} <= denied
    bind = next(m for m in cfg["mounts"] if m["destination"] == "/in")
    assert "ro" in bind["options"]
    scratch = next(m for m in cfg["mounts"] if m["destination"] == "/tmp")
    assert "size=67108864" in scratch["options"]


def test_oci_config_network_allowed_shares_host_namespace():
    cfg = _config(network=True, swap_accounting=False, block_device=(254, 0))
    assert {"type": "network"} not in cfg["linux"]["namespaces"]
    assert "swap" not in cfg["linux"]["resources"]["memory"]
    assert cfg["linux"]["resources"]["blockIO"]["throttleReadBpsDevice"][0]["major"] == 254


def test_parse_recorded_nvidia_smi():
    gpus = parse_nvidia_smi((DATA / "nvidia-smi-h100x2.csv").read_text())
    assert [g.index for g in gpus] == [0, 1]
    assert gpus[0].model == "NVIDIA H100 80GB HBM3"
    assert gpus[0].memory_bytes == 81559 * 1024 * 1024
    assert gpus[1].bus_id == "00000000:2A:00.0"
    assert gpus[0].advertised().model == "NVIDIA H100 80GB HBM3"
    with pytest.raises(ValueError, match="fields"):
        parse_nvidia_smi("0, only two\n")


def test_gpu_wiring_from_recorded_host(tmp_path):
    gpus = parse_nvidia_smi((DATA / "nvidia-smi-h100x2.csv").read_text())
    # Device nodes: regular files stand in (their st_rdev is 0) for the wiring logic.
    for name in ["nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"]:
        (tmp_path / name).touch()
    ldconfig = (DATA / "ldconfig-nvidia.txt").read_text()
    assert parse_ldconfig(ldconfig)["libnvidia-ml.so.1"] == (
        "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
    )
    wiring = wire_gpus(gpus[1:], dev=tmp_path, ldconfig=ldconfig, nvidia_smi="/usr/bin/nvidia-smi")
    assert [d.path for d in wiring.devices] == ["/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"]
    assert {b.destination for b in wiring.binds} == {
        "/usr/local/nvidia/lib64/libcuda.so.1",
        "/usr/local/nvidia/lib64/libnvidia-ml.so.1",
        "/usr/local/nvidia/lib64/libnvidia-ptxjitcompiler.so.1",
        "/usr/local/nvidia/bin/nvidia-smi",
    }
    assert all(b.readonly for b in wiring.binds)
    assert wiring.env["NVIDIA_VISIBLE_DEVICES"] == gpus[1].uuid
    cfg = _config(devices=wiring.devices)
    allowed = [d for d in cfg["linux"]["resources"]["devices"] if d["allow"]]
    assert len(allowed) == 3
    assert wire_gpus([]).devices == ()


async def test_detect_gpus_runs_nvidia_smi(tmp_path):
    fake = tmp_path / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\ncat {DATA / 'nvidia-smi-h100x2.csv'}\n")
    fake.chmod(0o755)
    gpus = await detect_gpus(str(fake))
    assert [g.uuid[:8] for g in gpus] == ["GPU-6b1e", "GPU-9c3d"]
    broken = tmp_path / "broken"
    broken.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2; exit 9\n")
    broken.chmod(0o755)
    assert await detect_gpus(str(broken)) == []


def test_gpu_device_is_frozen():
    g = GpuDevice(index=0, model="m", memory_bytes=1, uuid="u", bus_id="b")
    with pytest.raises(AttributeError):
        g.index = 1  # type: ignore[misc]


def test_janitor_runs_cleanups_in_order_past_a_failing_one():
    janitor, done = Janitor(), []

    def fails() -> None:
        raise OSError("umount: busy")

    janitor.submit("a", lambda: done.append("a"))
    janitor.submit("b", fails)
    janitor.submit("c", lambda: done.append("c"))
    janitor.drain()
    assert done == ["a", "c"]
    janitor.drain()  # nothing pending: returns at once


@pytest.mark.integration
def test_jobs_dir_is_one_shared_tmpfs_that_the_last_user_takes_down():
    root = searchable_dir("cx-jobsdir-")
    first, second = JobsDir(root / "jobs"), JobsDir(root / "jobs")
    first.open()
    second.open()  # a node and a `cx exec` on one home: one tmpfs between them
    assert [s for p, s in mounts.mount_sources() if p == str(root / "jobs")] == ["cx-jobs"]
    first.close()
    assert mounts_under(root) == [str(root / "jobs")]  # the second still uses it
    (root / "jobs" / "job1").mkdir()
    mounts.mount_tmpfs(root / "jobs" / "job1", size_bytes=4096, uid=0, gid=0)
    second.close()
    assert len(mounts_under(root)) == 2  # a job's mount is left (a crash): taken over later
    third = JobsDir(root / "jobs")
    third.open()
    mounts.unmount(root / "jobs" / "job1")
    third.close()
    assert mounts_under(root) == []
    shutil.rmtree(root)


@pytest.mark.integration
@pytest.mark.skipif(
    detect_hierarchies().mode is not CgroupMode.HYBRID, reason="the helper is for hybrid hosts"
)
def test_namespace_helper_sees_later_job_mounts_and_hides_the_controllers():
    root = searchable_dir("cx-mountns-")
    (root / "empty").touch()
    jobs, namespace = JobsDir(root / "jobs"), MountNamespace(root / "empty")
    jobs.open()
    area = root / "jobs" / "job1"
    area.mkdir()
    try:
        namespace.start()
        mounts.mount_tmpfs(area, size_bytes=4096, uid=0, gid=0)  # after the helper started
        (area / "f").write_text("seen\n")
        script = f"cat {area}/f; wc -c < /sys/fs/cgroup/unified/cgroup.controllers"
        out, err = root / "out", root / "err"
        assert namespace.run(["sh", "-c", script], out, err) == 0, err.read_text()
        assert out.read_text().split() == ["seen", "0"]
        assert Path("/sys/fs/cgroup/unified/cgroup.controllers").read_text() != ""  # host
    finally:
        mounts.unmount(area)
        namespace.close()
        jobs.close()
    assert mounts_under(root) == []
    shutil.rmtree(root)


def test_a_runtime_that_cannot_start_fails_delete_as_a_runtime_fault(tmp_path):
    # The janitor goes on to the cgroups and mounts only past a RuntimeFault: an OSError
    # from starting the binary (a missing one here; EFAULT from exec was seen under load)
    # must not cut the cleanup short.
    runtime = Runtime(name="crun", binary=str(tmp_path / "no-such-crun"), state_root=tmp_path)
    with pytest.raises(RuntimeFault, match="could not start"):
        runtime.delete("cx-x")
