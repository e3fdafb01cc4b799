"""Drive an OCI runtime (crun or runc) through one container's lifecycle.

Rules:
- Lifecycle is ``run --detach`` -> wait for init -> read cgroup -> ``delete``: a detached
  run leaves the stopped container and its cgroup in place until ``delete``, so usage can
  be read after the job ends, and costs one runtime call less than ``create`` + ``start``.
  ``delete`` blocks (the executor runs it on its janitor's thread, after the result).
- Which runtime, decided once at start-up from the cgroup mode and what is installed:
  pure v2 and pure v1: crun, else runc. Hybrid (v1 + a cgroup2 mount, our CI machines):
  crun 1.8 refuses it, so crun's ``run`` goes to the namespace helper (``mountns``), whose
  private mount namespace hides ``/sys/fs/cgroup/unified/cgroup.controllers``; ``delete``,
  ``kill`` and ``list`` do not look at the controllers and run directly. runc works as is.
  ``CX_RUNTIME=runc|crun`` overrides the choice.
- No call forks the node: commands are spawned (vfork) with nothing to run in the child
  before ``exec``. A failing call raises :class:`RuntimeFault` with the runtime's own words.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import trio

from node.exec.cgroups import CgroupMode
from node.exec.mountns import MountNamespace, NamespaceFault

__all__ = ["Runtime", "RuntimeFault", "choose_runtime"]

log = logging.getLogger(__name__)


class RuntimeFault(Exception):
    """The OCI runtime failed to do what we asked (a provider fault, not the job's)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Runtime:
    name: str  # "crun" or "runc"
    binary: str
    # This executor's own container state (``--root``): a provider lists and cleans up only
    # its own containers, never those of another node on the same machine.
    state_root: Path
    namespace: MountNamespace | None = None  # where ``run`` must happen (hybrid crun)

    def describe(self) -> str:
        how = " in a private mount namespace (hybrid workaround)" if self.namespace else ""
        return f"{self.name} ({self.binary}){how}"

    def _argv(self, *args: str) -> list[str]:
        return [self.binary, "--root", str(self.state_root), *args]

    async def run_detached(
        self, cid: str, bundle: Path, pid_file: Path, stdout: Path, stderr: Path
    ) -> None:
        """Create and start the container; return once it runs. Its init writes to the two
        files (the runtime's own complaints go to ``stderr`` too).

        Raises:
            RuntimeFault: the runtime failed (its words are at the end of ``stderr``).
        """
        argv = self._argv(
            "run", "--detach", "--bundle", str(bundle), "--pid-file", str(pid_file), cid
        )
        if self.namespace is not None:
            try:
                rc = await trio.to_thread.run_sync(self.namespace.run, argv, stdout, stderr)
            except NamespaceFault as exc:
                raise RuntimeFault(str(exc)) from exc
        else:
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
            out, err = os.open(stdout, flags, 0o644), os.open(stderr, flags, 0o644)
            try:
                proc = await trio.run_process(
                    argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, check=False
                )
            finally:
                os.close(out)
                os.close(err)
            rc = proc.returncode
        if rc != 0:
            raise RuntimeFault(f"{self.name} run failed ({rc})")

    def delete(self, cid: str) -> None:
        """Delete the container, stopped or not. Blocks: call it from a worker thread.

        Raises:
            RuntimeFault: the runtime failed.
        """
        try:
            proc = subprocess.run(
                self._argv("delete", "--force", cid),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                check=False,
            )
        except OSError as exc:  # it did not even start (seen: EFAULT from exec under load)
            raise RuntimeFault(f"{self.name} delete could not start: {exc}") from exc
        if proc.returncode != 0:
            err = proc.stderr.decode(errors="replace").strip()
            raise RuntimeFault(f"{self.name} delete failed ({proc.returncode}): {err}")

    async def list_ids(self) -> list[str]:
        proc = await trio.run_process(
            self._argv("list", "-q"), capture_stdout=True, capture_stderr=True, check=False
        )
        return proc.stdout.decode().split() if proc.returncode == 0 else []

    async def ready(self) -> None:
        """Start the namespace helper, if any and not running.

        Raises:
            RuntimeFault: it could not set up the namespace.
        """
        if self.namespace is not None and not self.namespace.started:
            try:
                await trio.to_thread.run_sync(self.namespace.start)
            except NamespaceFault as exc:
                raise RuntimeFault(str(exc)) from exc

    def close(self) -> None:
        """End the namespace helper, if any (it starts again on the next ``run``)."""
        if self.namespace is not None:
            self.namespace.close()


def choose_runtime(mode: CgroupMode, state_dir: Path, prefer: str | None = None) -> Runtime:
    """Pick the runtime for this host (see the module rules); log which path is in use.
    The namespace helper, if any, sees job areas mounted under a shared mount
    (``jobsdir``).

    Raises:
        RuntimeFault: no usable runtime is installed.
    """
    prefer = prefer or os.environ.get("CX_RUNTIME") or None
    crun, runc = shutil.which("crun"), shutil.which("runc")
    order = [prefer] if prefer else ["crun", "runc"]
    for name in order:
        binary = crun if name == "crun" else runc if name == "runc" else None
        if binary is None:
            continue
        namespace = None
        state_root = state_dir / "runtime-state"
        state_root.mkdir(parents=True, exist_ok=True)
        if name == "crun" and mode is CgroupMode.HYBRID:
            empty = state_dir / "empty-cgroup.controllers"
            empty.touch()
            namespace = MountNamespace(empty)
        rt = Runtime(name=name, binary=binary, state_root=state_root, namespace=namespace)
        log.info("cgroup mode %s: running jobs with %s", mode.value, rt.describe())
        return rt
    raise RuntimeFault(
        f"no OCI runtime found ({prefer or 'crun or runc'}): apt-get install crun runc"
    )
