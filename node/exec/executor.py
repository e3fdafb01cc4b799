"""The provider's executor: run one agreed job in an OCI container, meter it, return outputs.

Rules:
- Capacity: a job is admitted only if its resources fit in what is left of the offered
  capacity (GPUs by index); otherwise :class:`CapacityExceeded` and nothing runs.
- Limits: every job's limits are checked by protocol.limits before admission (the same rule
  a provider applies to proposed terms); a job outside them raises InvalidMessage and
  nothing runs.
- Layout of a job (``<work>/jobs/<id>``): ``root`` is an overlay of the unpacked image
  (read-only in the container), ``out`` a tmpfs capped at ``max_output_bytes`` (+ one page so
  that "more than the cap" is observable), ``ckpt`` a tmpfs for the checkpoint directory,
  ``stdout`` and ``stderr`` a tmpfs each, capped at ``LOG_CAP_BYTES`` (+ one page): a log
  past its cap is cut there and named in ``JobResult.truncated_logs``. Inputs are verified
  and bind-mounted read-only from the store. /tmp is the job's scratch disk when it reserves
  ``disk_bytes`` (``scratch``: an ext4 image of that size on the provider's disk,
  loop-mounted, node/exec/scratch.py; what it used at the end is ``JobResult.scratch_bytes``),
  else a small container tmpfs. tmpfs pages are charged to the job's memory cgroup, so no
  write escapes the memory limit either. Every path is absolute (a relative home is
  resolved first).
- Elastic jobs (``elastic``): a small tmpfs ``elastic`` is the container's /cx (its request
  file); while the job runs, node/exec/elastic.py raises its memory limit and CPU quota in
  place within its ceilings and this executor's free capacity, which the growth takes
  until the job ends; the grants are in ``usage.grants``. A job with a checkpoint contract
  that needs memory the provider has not got is stopped as preempted.
- Wall clock: from the moment the runtime has started the job until init exits. At
  ``wall_ms`` the job is killed (timeout).
  On preemption the declared signal goes to the job's init, then after ``grace_ms`` SIGKILL;
  a PID-1 without a handler ignores the first signal, which is the job's contract to keep.
- Usage is read from the job's cgroup after init exits and before ``delete``; the exit
  reason is protocol.usage.classify of what was observed.
- Outputs: every regular file under the output area becomes a blob and a DataRef at its
  container path; symlinks, devices and fifos are skipped, files are opened with
  O_NOFOLLOW|O_NONBLOCK (the job controls that tree). The checkpoint directory, if not
  empty, becomes one reproducible tar blob; ``resume_from`` unpacks one into it.
- Anything that goes wrong on the provider's side after admission yields a result with
  ``provider-fault`` (logged with the traceback). Cleanup always runs and does not depend
  on how far the job got: the container is deleted, the job's cgroup (``/cx/<id>``) is
  removed from every hierarchy even if the runtime failed half-way, the areas unmounted.
  It runs after the result is returned, on the janitor's thread (``settled`` waits for
  it); the job's capacity is free at once, its container having exited.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import logging
import os
import re
import select
import shutil
import signal
import stat
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any

import trio

from node.exec import mounts
from node.exec.cgroups import (
    CgroupMode,
    Counters,
    detect_hierarchies,
    read_counters,
    read_pids,
)
from node.exec.elastic import IN_CONTAINER as ELASTIC_DIR
from node.exec.elastic import ElasticWatch
from node.exec.gpu import GPU_SAMPLE_S, GpuDevice, gpu_memory_used, wire_gpus
from node.exec.janitor import Janitor
from node.exec.jobsdir import JobsDir
from node.exec.ocispec import Bind, JobConfig, build_config
from node.exec.runtime import Runtime, RuntimeFault, choose_runtime
from node.exec.scratch import make_scratch, remove_image, used_bytes
from node.storage.image import ID_MAP_BASE, RootfsCache, image_config
from node.storage.store import BlobStore
from protocol.elastic import check_elastic
from protocol.limits import check_limits, check_pids_limit
from protocol.messages import (
    LOG_CAP_BYTES,
    LOG_PATHS,
    Checkpoint,
    DataRef,
    Elastic,
    ExitReason,
    Grant,
    JobSpec,
    Resources,
    Usage,
)
from protocol.usage import Observation, classify, exit_code_of

__all__ = ["CapacityExceeded", "Executor", "ExecutorConfig", "JobResult"]

log = logging.getLogger(__name__)

_PAGE = 4096
_LOGS = tuple(PurePosixPath(p).name for p in LOG_PATHS)  # "stdout", "stderr"
_DEFAULT_SCRATCH = 64 * 1024 * 1024
_CKPT_BYTES = 256 * 1024 * 1024
# A job id names its directory, cgroup and container: nothing that could leave them.
_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
# How crun and runc say the job's executable is missing from the image.
_COMMAND_MISSING = re.compile(
    r"executable file .* not found|exec: .*(no such file or directory|not found)", re.I
)


class CapacityExceeded(Exception):
    """The job does not fit in what is left of the offered capacity."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutorConfig:
    store_root: Path
    work_root: Path
    capacity: Resources
    gpus: tuple[GpuDevice, ...] = ()
    pids_limit: int = 512
    runtime: str | None = None  # "crun" / "runc"; None: choose for the host


@dataclass(frozen=True, slots=True, kw_only=True)
class JobResult:
    job_id: str
    exit_reason: ExitReason
    exit_code: int
    usage: Usage
    outputs: tuple[DataRef, ...] = ()
    checkpoint: str | None = None
    stdout: str | None = None  # blob digests of the job's logs
    stderr: str | None = None
    truncated_logs: tuple[str, ...] = ()  # LOG_PATHS cut at LOG_CAP_BYTES
    scratch_bytes: int = 0  # used on the scratch disk when the job ended
    detail: str = ""
    start_s: float | None = None  # run_job until the runtime had started the container


@dataclass(frozen=True, slots=True, kw_only=True)
class _Gathered:
    counters: Counters
    output_bytes: int
    outputs: tuple[DataRef, ...]
    checkpoint: str | None
    logs: tuple[str | None, ...]  # stdout, stderr
    truncated_logs: tuple[str, ...]
    scratch_bytes: int


@dataclass(slots=True)
class _Running:
    stop: trio.Event = field(default_factory=trio.Event)
    extra: Resources = field(default_factory=lambda: Resources(cpu_milli=0, memory_bytes=0))
    grants: list[Grant] = field(default_factory=list)
    gpu_memory_peak: int | None = None  # sampled while a GPU job runs


def _block_device(path: Path) -> tuple[int, int] | None:
    """The whole disk under ``path`` (v1 blkio throttles only whole disks)."""
    dev = path.stat().st_dev
    major, minor = os.major(dev), os.minor(dev)
    if major == 0:
        return None  # tmpfs, overlay, ...
    sys_dev = Path(f"/sys/dev/block/{major}:{minor}")
    if (sys_dev / "partition").exists():
        parent = (sys_dev.resolve().parent / "dev").read_text().strip()
        a, _, b = parent.partition(":")
        return int(a), int(b)
    return major, minor


class Executor:
    """Runs jobs; one per provider process. Create it, then ``await run_job(...)``."""

    def __init__(self, config: ExecutorConfig) -> None:
        """Raises:
        InvalidMessage: the pids limit is out of bounds (protocol.limits).
        PermissionError: a directory above the store or work area is not searchable.
        """
        check_pids_limit(config.pids_limit)
        # The runtime resolves relative paths against the bundle, not our working directory.
        config = replace(
            config, store_root=config.store_root.resolve(), work_root=config.work_root.resolve()
        )
        self.config = config
        self.store = BlobStore(config.store_root)
        self.rootfs = RootfsCache(self.store)
        self._unpacking = trio.Lock()  # one unpack at a time: concurrent jobs share it
        config.work_root.mkdir(parents=True, exist_ok=True)
        config.work_root.chmod(0o711)
        for root in (config.store_root, config.work_root):
            _check_searchable(root)
        self.cgroups = detect_hierarchies()
        self.mode = self.cgroups.mode
        self.runtime: Runtime = choose_runtime(self.mode, config.work_root, config.runtime)
        self.jobs_dir = config.work_root / "jobs"
        self.scratch_dir = config.work_root / "scratch"  # on disk, unlike jobs_dir
        self._scratch_base: dict[str, int] = {}  # job id -> bytes its empty scratch used
        self._jobs = JobsDir(self.jobs_dir)  # a shared tmpfs, until close()
        self._jobs.open()
        self._in_use = Resources(cpu_milli=0, memory_bytes=0, disk_bytes=0, gpus=0)
        self._free_gpus = list(config.gpus)
        self._running: dict[str, _Running] = {}
        self._janitor = Janitor()
        self._image_configs: dict[str, dict[str, Any]] = {}
        # What every job's config.json says about this host (bench/executor.py uses the same).
        self.swap_accounting = self._swap_accounting()
        v2 = self.mode is CgroupMode.V2
        self.block_device = None if v2 else _block_device(config.store_root)
        mounts.prctl_subreaper()
        log.info(
            "executor: cgroup %s, runtime %s, capacity %s",
            self.mode.value,
            self.runtime.describe(),
            config.capacity,
        )

    def _swap_accounting(self) -> bool:
        if self.mode is CgroupMode.V2:
            return Path("/sys/fs/cgroup/cgroup.controllers").exists()
        return Path("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes").exists()

    @property
    def free(self) -> Resources:
        return self.config.capacity.minus(self._in_use)

    async def recover(self) -> None:
        """Clean up after a crash: delete our leftover containers, their cgroups and job
        areas."""
        for cid in await self.runtime.list_ids():
            if cid.startswith("cx-") and len(cid) > 3:
                job_id = cid.removeprefix("cx-")
                self._janitor.submit(job_id, functools.partial(self._clean_up, job_id, cid, None))
        for job in self.jobs_dir.iterdir():
            self._janitor.submit(job.name, functools.partial(self._clean_up, job.name, None, job))
        left = self.scratch_dir.glob("*.img") if self.scratch_dir.is_dir() else ()
        for image in left:
            self._janitor.submit(
                image.stem, functools.partial(self._clean_up, image.stem, None, None)
            )
        await self.settled()
        await self.runtime.ready()  # the first job need not wait for the namespace helper

    async def settled(self) -> None:
        """Wait until every job that has ended is cleaned up."""
        await trio.to_thread.run_sync(self._janitor.drain)

    def close(self) -> None:
        """Finish the cleanups under way, stop the runtime's helper process, if any, and
        let go of the jobs tmpfs. Blocks; the executor is not to be used afterwards."""
        self._janitor.drain()
        self.runtime.close()
        self._jobs.close()

    def live_usage(self) -> dict[str, Counters]:
        """What each running job has used so far, from its cgroup (CPU time, peak memory,
        I/O): for the dashboard and ``cx top``. Reads a few small cgroup files per job."""
        return {
            job_id: read_counters(self.cgroups.job(_cgroup_path(job_id)))
            for job_id in self._running
        }

    def preempt(self, job_id: str) -> bool:
        """Ask a running job to stop (declared signal, grace, kill). False if not running."""
        running = self._running.get(job_id)
        if running is None:
            return False
        running.stop.set()
        return True

    def live_log(self, job_id: str, name: str, offset: int, limit: int) -> bytes | None:
        """Up to ``limit`` bytes of a running job's ``stdout`` or ``stderr`` from ``offset``,
        as it writes them; None when the job is not running here."""
        if job_id not in self._running or name not in _LOGS:
            return None
        try:
            with open(self.jobs_dir / job_id / name / "log", "rb") as f:
                f.seek(offset)
                return f.read(limit)
        except FileNotFoundError:
            return b""  # not started yet: nothing written

    async def run_job(
        self,
        spec: JobSpec,
        resources: Resources,
        *,
        job_id: str | None = None,
        checkpoint: Checkpoint | None = None,
        progress: Callable[[str], None] | None = None,
        elastic: Elastic | None = None,
    ) -> JobResult:
        """Run ``spec`` within ``resources`` (growing within ``elastic``); return what
        happened.

        Raises:
            InvalidMessage: a limit is out of bounds (protocol.limits; nothing ran).
            CapacityExceeded: the job does not fit now (nothing ran).
            ValueError: ``job_id`` is not a plain name, or that job is running.
        """
        check_limits(spec, resources, checkpoint)
        check_elastic(resources, elastic)
        job_id = job_id or os.urandom(8).hex()
        if not _JOB_ID.fullmatch(job_id):
            raise ValueError(f"job id {job_id!r}: letters, digits, - and _ only, at most 64")
        if not resources.fits_in(self.free):
            raise CapacityExceeded(
                f"job needs {resources}, free is {self.free}: wait for a job to finish"
            )
        if job_id in self._running:
            raise ValueError(f"job {job_id} is already running")
        gpus = self._free_gpus[: resources.gpus]
        del self._free_gpus[: resources.gpus]
        self._in_use = self._in_use.plus(resources)
        running = self._running[job_id] = _Running()
        try:
            return await self._run(
                job_id, spec, resources, checkpoint, gpus, running, progress, elastic
            )
        finally:
            del self._running[job_id]
            self._scratch_base.pop(job_id, None)
            self._in_use = self._in_use.minus(resources.plus(running.extra))
            self._free_gpus.extend(gpus)

    async def _run(
        self,
        job_id: str,
        spec: JobSpec,
        resources: Resources,
        checkpoint: Checkpoint | None,
        gpus: list[GpuDevice],
        running: _Running,
        progress: Callable[[str], None] | None,
        elastic: Elastic | None = None,
    ) -> JobResult:
        say = progress or (lambda _msg: None)
        cid = f"cx-{job_id}"
        job = self.jobs_dir / job_id
        started = False
        t_start: float | None = None
        t_prepare = time.monotonic()
        try:
            if job.exists():  # the same id ran before and is still being cleaned up
                await self.settled()
            job.mkdir(mode=0o711)
            bundle = await self._prepare(
                job, job_id, spec, resources, checkpoint, gpus, say, elastic is not None
            )
            say("starting container")
            started = True
            out, err = (job / name / "log" for name in _LOGS)
            try:
                await self.runtime.run_detached(cid, bundle, job / "pid", out, err)
            except RuntimeFault as exc:
                # The runtime's own complaint went to the job's stderr file.
                said = err.read_text(errors="replace")[-2000:].strip()
                if _COMMAND_MISSING.search(said):
                    # The buyer's command does not exist in the image: the job's failure.
                    return _not_found(job_id, said)
                raise RuntimeFault(f"{exc}: {said}") from exc
            t_start = time.monotonic()
            pid = int((job / "pid").read_text())
            pidfd = os.pidfd_open(pid)  # init is our child (subreaper): a zombie at worst
            try:
                say(f"running (pid {pid})")
                async with trio.open_nursery() as nursery:
                    if elastic is not None:
                        watch = self._watch(job_id, job, resources, elastic, checkpoint, running)
                        nursery.start_soon(watch.run)
                    if gpus:
                        nursery.start_soon(self._meter_gpus, job_id, running)
                    timed_out, preempted, status = await self._wait(
                        pid, pidfd, spec.wall_ms, checkpoint, running
                    )
                    nursery.cancel_scope.cancel()
            finally:
                os.close(pidfd)
            wall_ms = int((time.monotonic() - t_start) * 1000)
            say("collecting outputs")
            result = await self._collect(
                job_id, job, spec, checkpoint, status, wall_ms, timed_out, preempted
            )
            usage = replace(
                result.usage,
                grants=tuple(running.grants) or None,
                gpu_memory_peak_bytes=running.gpu_memory_peak,
            )
            return replace(result, usage=usage, start_s=t_start - t_prepare)
        except Exception as exc:  # per-job top: a provider fault, never the buyer's job
            log.exception("job %s: provider fault", job_id)
            wall = int((time.monotonic() - t_start) * 1000) if t_start is not None else 0
            return JobResult(
                job_id=job_id,
                exit_reason=ExitReason.PROVIDER_FAULT,
                exit_code=-1,
                usage=Usage(wall_ms=wall, cpu_us=0),
                detail=f"{type(exc).__name__}: {exc}",
            )
        finally:
            self._janitor.submit(
                job_id, functools.partial(self._clean_up, job_id, cid if started else None, job)
            )

    async def _meter_gpus(self, job_id: str, running: _Running) -> None:
        """Keep the peak GPU memory of the job's processes until cancelled."""
        cg = self.cgroups.job(_cgroup_path(job_id))
        running.gpu_memory_peak = 0
        while True:
            used = await gpu_memory_used(read_pids(cg))
            running.gpu_memory_peak = max(running.gpu_memory_peak, used)
            await trio.sleep(GPU_SAMPLE_S)  # a sampling period, not a synchronisation

    def _watch(
        self,
        job_id: str,
        job: Path,
        resources: Resources,
        elastic: Elastic,
        checkpoint: Checkpoint | None,
        running: _Running,
    ) -> ElasticWatch:
        def take(more: Resources) -> None:
            self._in_use = self._in_use.plus(more)
            running.extra = running.extra.plus(more)

        def exhausted() -> None:
            if checkpoint is not None:  # it resumes where there is room (the buyer bids again)
                log.info("job %s: needs memory this provider has not got: preempting", job_id)
                running.stop.set()

        return ElasticWatch(
            cgroup=self.cgroups.job(_cgroup_path(job_id)),
            area=job / "elastic",
            resources=resources,
            elastic=elastic,
            swap_accounting=self.swap_accounting,
            free=lambda: self.free,
            take=take,
            exhausted=exhausted,
            grants=running.grants,
        )

    def _clean_up(self, job_id: str, cid: str | None, job: Path | None) -> None:
        """Whatever the runtime did or failed to do, leave no container ``cid``, cgroup,
        mount or file of the job. Blocks (the janitor's thread)."""
        if not job_id:
            raise ValueError("no job id: refusing to sweep all of /cx")
        if cid is not None:
            try:
                self.runtime.delete(cid)
            except RuntimeFault:
                log.warning("job %s: delete failed", job_id, exc_info=True)
        left = self.cgroups.remove(_cgroup_path(job_id))
        if left:
            log.warning("job %s: cgroups left behind: %s", job_id, left)
        if job is not None:
            _teardown_dir(job)
        remove_image(self._scratch_image(job_id))

    def _scratch_image(self, job_id: str) -> Path:
        return self.scratch_dir / f"{job_id}.img"

    async def _prepare(
        self,
        job: Path,
        job_id: str,
        spec: JobSpec,
        resources: Resources,
        checkpoint: Checkpoint | None,
        gpus: list[GpuDevice],
        say: Callable[[str], None],
        elastic: bool = False,
    ) -> Path:
        async with self._unpacking:
            lower = self.rootfs.path(spec.image)
            if lower is None:
                say(f"unpacking image {spec.image[:19]}")
                lower = await trio.to_thread.run_sync(self.rootfs.unpack, spec.image)
        img = self._image_configs.get(spec.image) or image_config(self.store, spec.image)
        self._image_configs[spec.image] = img  # an image never changes under its digest
        for sub in ("root", "upper", "work", "out", *_LOGS):
            (job / sub).mkdir()
        os.chown(job / "upper", ID_MAP_BASE, ID_MAP_BASE)
        (job / "upper").chmod(0o755)
        mounts.mount_overlay(job / "root", lower=lower, upper=job / "upper", work=job / "work")
        uid = gid = ID_MAP_BASE
        out_cap = -(-spec.max_output_bytes // _PAGE) * _PAGE + _PAGE
        mounts.mount_tmpfs(job / "out", size_bytes=out_cap, uid=uid, gid=gid)
        for name in _LOGS:
            mounts.mount_tmpfs(job / name, size_bytes=LOG_CAP_BYTES + _PAGE, uid=0, gid=0)
        binds = [Bind(source=str(job / "out"), destination=spec.output_path, readonly=False)]
        if checkpoint is not None:
            (job / "ckpt").mkdir()
            mounts.mount_tmpfs(job / "ckpt", size_bytes=_CKPT_BYTES, uid=uid, gid=gid)
            if checkpoint.resume_from is not None:
                say(f"restoring checkpoint {checkpoint.resume_from[:19]}")
                await trio.to_thread.run_sync(
                    _restore_checkpoint, self.store, checkpoint.resume_from, job / "ckpt"
                )
            binds.append(
                Bind(source=str(job / "ckpt"), destination=checkpoint.path, readonly=False)
            )
        if resources.disk_bytes:
            (job / "scratch").mkdir()
            self._scratch_base[job_id] = await trio.to_thread.run_sync(
                functools.partial(
                    make_scratch,
                    self._scratch_image(job_id),
                    job / "scratch",
                    size_bytes=resources.disk_bytes,
                    uid=uid,
                    gid=gid,
                )
            )
            binds.append(Bind(source=str(job / "scratch"), destination="/tmp", readonly=False))  # noqa: S108
        if elastic:  # the job's request file and the answer
            (job / "elastic").mkdir()
            mounts.mount_tmpfs(job / "elastic", size_bytes=_PAGE * 4, uid=uid, gid=gid)
            binds.append(Bind(source=str(job / "elastic"), destination=ELASTIC_DIR, readonly=False))
        for ref in spec.inputs:
            await trio.to_thread.run_sync(self.store.verify, ref.digest)
            binds.append(Bind(source=str(self.store.path(ref.digest)), destination=ref.path))
        wiring = wire_gpus(gpus)
        binds += wiring.binds
        env = dict(e.split("=", 1) for e in img.get("Env") or [] if "=" in e)
        env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        env.update(wiring.env)
        env.update(spec.env)
        cfg = build_config(
            JobConfig(
                rootfs=str(job / "root"),
                args=spec.command,
                env=[f"{k}={v}" for k, v in env.items()],
                cwd=img.get("WorkingDir") or "/",
                cgroups_path=_cgroup_path(job_id),
                cpu_milli=resources.cpu_milli,
                memory_bytes=resources.memory_bytes,
                pids_limit=self.config.pids_limit,
                network=spec.network,
                swap_accounting=self.swap_accounting,
                binds=binds,
                devices=wiring.devices,
                block_device=self.block_device,
                scratch_bytes=None if resources.disk_bytes else _DEFAULT_SCRATCH,
            )
        )
        (job / "config.json").write_text(json.dumps(cfg))
        return job

    async def _wait(
        self,
        pid: int,
        pidfd: int,
        wall_ms: int,
        checkpoint: Checkpoint | None,
        running: _Running,
    ) -> tuple[bool, bool, int]:
        """Wait for init to exit; returns (timed_out, preempted, exit code)."""
        timed_out = preempted = False

        async def stopper() -> None:
            nonlocal preempted
            await running.stop.wait()
            preempted = True
            sig = signal.Signals[checkpoint.signal] if checkpoint else signal.SIGTERM
            grace = checkpoint.grace_ms / 1000 if checkpoint else 0.0
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, sig)
            await trio.sleep(grace)  # the job's grace period, part of its contract
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(stopper)
            with trio.move_on_after(wall_ms / 1000):
                await trio.lowlevel.wait_readable(pidfd)
            if not _exited(pidfd):
                timed_out = not preempted
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                await trio.lowlevel.wait_readable(pidfd)
            nursery.cancel_scope.cancel()
        _, status = os.waitpid(pid, 0)  # noqa: ASYNC222 - pidfd says it exited: no wait
        if os.WIFEXITED(status):
            code = exit_code_of(exited=True, status=os.WEXITSTATUS(status))
        else:
            code = exit_code_of(exited=False, status=os.WTERMSIG(status))
        return timed_out, preempted, code

    async def _collect(
        self,
        job_id: str,
        job: Path,
        spec: JobSpec,
        checkpoint: Checkpoint | None,
        code: int,
        wall_ms: int,
        timed_out: bool,
        preempted: bool,
    ) -> JobResult:
        # All the reading and storing in one trip to a worker thread.
        got = await trio.to_thread.run_sync(self._gather, job_id, job, spec, checkpoint)
        counters = got.counters
        reason = classify(
            Observation(
                exit_code=code,
                oom_kills=counters.oom_kills,
                pids_limit_hits=counters.pids_limit_hits,
                timed_out=timed_out,
                preempted=preempted,
                output_bytes=got.output_bytes,
                max_output_bytes=spec.max_output_bytes,
            )
        )
        usage = Usage(
            wall_ms=wall_ms,
            cpu_us=counters.cpu_us,
            memory_peak_bytes=counters.memory_peak_bytes,
            io_read_bytes=counters.io_read_bytes,
            io_write_bytes=counters.io_write_bytes,
            pids_peak=counters.pids_peak,
            oom_kills=counters.oom_kills,
            checkpoint_ms=wall_ms if got.checkpoint else 0,
        )
        log.info("job %s: %s (exit %d) %s", job_id, reason.value, code, usage)
        return JobResult(
            job_id=job_id,
            exit_reason=reason,
            exit_code=code,
            usage=usage,
            outputs=got.outputs,
            checkpoint=got.checkpoint,
            stdout=got.logs[0],
            stderr=got.logs[1],
            truncated_logs=got.truncated_logs,
            scratch_bytes=got.scratch_bytes,
        )

    def _gather(
        self, job_id: str, job: Path, spec: JobSpec, checkpoint: Checkpoint | None
    ) -> _Gathered:
        """Usage counters, outputs, checkpoint and logs of an ended job, stored and pinned.
        Blocks (a worker thread)."""
        counters = read_counters(self.cgroups.job(_cgroup_path(job_id)))
        out_bytes = _tree_bytes(job / "out", spec.max_output_bytes)
        outputs: tuple[DataRef, ...] = ()
        if out_bytes <= spec.max_output_bytes:
            outputs = _store_outputs(self.store, job / "out", spec.output_path)
        ckpt = _store_checkpoint(self.store, job / "ckpt") if checkpoint is not None else None
        base = self._scratch_base.get(job_id)
        scratch = used_bytes(job / "scratch", base) if base is not None else 0
        kept = [self._store_log(job / name / "log") for name in _LOGS]
        logs = tuple(digest for digest, _ in kept)
        keep = [o.digest for o in outputs] + [d for d in [ckpt, *logs] if d]
        if keep:
            self.store.pin(f"job/{job_id}", keep)
        return _Gathered(
            counters=counters,
            output_bytes=out_bytes,
            outputs=outputs,
            checkpoint=ckpt,
            logs=logs,
            truncated_logs=tuple(p for p, (_, cut) in zip(LOG_PATHS, kept, strict=True) if cut),
            scratch_bytes=scratch,
        )

    def _store_log(self, path: Path) -> tuple[str | None, bool]:
        """The log's blob (None if empty), cut at LOG_CAP_BYTES, and whether it was cut."""
        size = path.stat().st_size if path.exists() else 0
        if size == 0:
            return None, False
        cut = size > LOG_CAP_BYTES
        if cut:
            os.truncate(path, LOG_CAP_BYTES)
        return self.store.put_file(path), cut


def _not_found(job_id: str, said: str) -> JobResult:
    return JobResult(
        job_id=job_id,
        exit_reason=ExitReason.NONZERO_EXIT,
        exit_code=127,  # the shell's "command not found"
        usage=Usage(wall_ms=0, cpu_us=0),
        detail=said.splitlines()[-1] if said else "command not found",
    )


def _check_searchable(path: Path) -> None:
    """Containers run as a mapped uid: it must be able to reach the job directories."""
    for p in [path, *path.parents]:
        if not p.stat().st_mode & stat.S_IXOTH:
            raise PermissionError(
                f"{p} is not searchable by other users, so containers cannot reach {path}: "
                f"chmod o+x {p} or choose another directory"
            )


def _exited(pidfd: int) -> bool:
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


def _walk_files(root: Path) -> Iterator[tuple[str, int]]:
    """(relative path, fd) of regular files under ``root``, never following symlinks."""
    for dirpath, _dirs, files in os.walk(root, followlinks=False):
        for name in sorted(files):
            full = os.path.join(dirpath, name)
            try:
                fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                continue  # a symlink (ELOOP) or vanished
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                continue
            yield os.path.relpath(full, root), fd


def _tree_bytes(root: Path, cap: int) -> int:
    """Bytes of regular files in the output area; more than ``cap`` when the area filled up
    (the job met ENOSPC, e.g. with many small files)."""
    total = 0
    for dirpath, _dirs, files in os.walk(root, followlinks=False):
        for name in files:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(dirpath, name))
                total += st.st_size if stat.S_ISREG(st.st_mode) else 0
    vfs = os.statvfs(root)
    return max(total, cap + 1) if vfs.f_bavail == 0 else total


def _store_outputs(store: BlobStore, root: Path, container_path: str) -> tuple[DataRef, ...]:
    refs = []
    for rel, fd in _walk_files(root):
        with os.fdopen(fd, "rb") as f:
            digest = store.put_reader(f)
        refs.append(
            DataRef(
                digest=digest,
                path=str(PurePosixPath(container_path) / rel),
                size=store.size(digest),
            )
        )
    return tuple(refs)


def _store_checkpoint(store: BlobStore, root: Path) -> str | None:
    """A reproducible tar (sorted, mtime 0, uid 0) of the checkpoint directory, or None."""
    files = list(_walk_files(root))
    if not files:
        return None
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel, fd in files:
            with os.fdopen(fd, "rb") as f:
                data = f.read()
            info = tarfile.TarInfo(rel)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return store.put_bytes(buf.getvalue())


def _restore_checkpoint(store: BlobStore, digest: str, into: Path) -> None:
    """Unpack a checkpoint tar (regular files only, no escaping paths) into ``into``."""
    with tarfile.open(fileobj=io.BytesIO(store.read_bytes(digest)), mode="r:") as tar:
        for member in tar.getmembers():
            if not member.isfile():
                continue
            target = (into / member.name).resolve()
            if not target.is_relative_to(into.resolve()):
                raise ValueError(f"checkpoint entry {member.name!r} escapes its directory")
            target.parent.mkdir(parents=True, exist_ok=True)
            src = tar.extractfile(member)
            if src is None:
                continue
            target.write_bytes(src.read())
            os.chown(target, ID_MAP_BASE, ID_MAP_BASE)
            for parent in target.parents:
                if parent == into.resolve():
                    break
                os.chown(parent, ID_MAP_BASE, ID_MAP_BASE)


def _cgroup_path(job_id: str) -> str:
    # Absolute: crun and runc place it alike, at the root of each hierarchy.
    return f"/cx/{job_id}"


def _teardown_dir(job: Path) -> None:
    for sub in ("root", "out", *_LOGS, "ckpt", "scratch", "elastic"):
        mounts.unmount(job / sub)
    shutil.rmtree(job, ignore_errors=True)
