"""Drive an OCI runtime (crun or runc) through one container's lifecycle.

Rules:
- Lifecycle is ``create`` -> ``start`` -> wait for init -> read cgroup -> ``delete``; ``run``
  would delete the cgroup before usage can be read (PLATFORM.md).
- Which runtime, decided once at start-up from the cgroup mode and what is installed:
  pure v2 and pure v1: crun, else runc. Hybrid (v1 + a cgroup2 mount, our CI machines):
  crun 1.8 refuses it, so crun runs inside a private mount namespace where an empty file
  hides ``/sys/fs/cgroup/unified/cgroup.controllers`` (never unmount that hierarchy); runc
  works as is. ``CX_RUNTIME=runc|crun`` overrides the choice.
- Every runtime call is a ``trio.run_process``; a failing call raises :class:`RuntimeFault`
  with the runtime's own words.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import trio

from node.exec.cgroups import CgroupMode
from node.exec.mounts import bind_over, make_private_namespace

__all__ = ["Runtime", "RuntimeFault", "choose_runtime"]

log = logging.getLogger(__name__)

_UNIFIED_CONTROLLERS = Path("/sys/fs/cgroup/unified/cgroup.controllers")


class RuntimeFault(Exception):
    """The OCI runtime failed to do what we asked (a provider fault, not the job's)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Runtime:
    name: str  # "crun" or "runc"
    binary: str
    # This executor's own container state (``--root``): a provider lists and cleans up only
    # its own containers, never those of another node on the same machine.
    state_root: Path
    hide_unified: Path | None = None  # empty file to bind over cgroup.controllers (hybrid)

    def describe(self) -> str:
        how = " in a private mount namespace (hybrid workaround)" if self.hide_unified else ""
        return f"{self.name} ({self.binary}){how}"

    def _preexec(self) -> Callable[[], None] | None:
        empty = self.hide_unified
        if empty is None:
            return None

        def hide() -> None:  # runs in the forked child, before exec
            make_private_namespace()
            bind_over(empty, _UNIFIED_CONTROLLERS)

        return hide

    async def call(self, *args: str, stdout: int | None = None, stderr: int | None = None) -> str:
        """Run ``<runtime> args``; return its stderr text (empty if redirected).

        Raises:
            RuntimeFault: non-zero exit.
        """
        capture = stderr is None
        where = {"capture_stderr": True} if capture else {"stderr": stderr}
        proc = await trio.run_process(
            [self.binary, "--root", str(self.state_root), *args],
            stdin=subprocess.DEVNULL,
            stdout=stdout if stdout is not None else subprocess.DEVNULL,
            check=False,
            preexec_fn=self._preexec(),
            **where,
        )
        err = proc.stderr.decode(errors="replace").strip() if capture and proc.stderr else ""
        if proc.returncode != 0:
            raise RuntimeFault(f"{self.name} {args[0]} failed ({proc.returncode}): {err}")
        return err

    async def create(
        self, cid: str, bundle: Path, pid_file: Path, stdout: int, stderr: int
    ) -> None:
        """Create the container; its init inherits ``stdout``/``stderr`` (files: a pipe
        would keep this call from returning until the job ends)."""
        await self.call(
            "create", "--bundle", str(bundle), "--pid-file", str(pid_file), cid,
            stdout=stdout, stderr=stderr,
        )  # fmt: skip

    async def start(self, cid: str) -> None:
        await self.call("start", cid)

    async def kill(self, cid: str, signal: str) -> None:
        await self.call("kill", cid, signal)

    async def delete(self, cid: str) -> None:
        await self.call("delete", "--force", cid)

    async def list_ids(self) -> list[str]:
        proc = await trio.run_process(
            [self.binary, "--root", str(self.state_root), "list", "-q"],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            preexec_fn=self._preexec(),
        )
        return proc.stdout.decode().split() if proc.returncode == 0 else []


def choose_runtime(mode: CgroupMode, state_dir: Path, prefer: str | None = None) -> Runtime:
    """Pick the runtime for this host (see the module rules); log which path is in use.

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
        hide = None
        state_root = state_dir / "runtime-state"
        state_root.mkdir(parents=True, exist_ok=True)
        if name == "crun" and mode is CgroupMode.HYBRID:
            hide = state_dir / "empty-cgroup.controllers"
            hide.touch()
        rt = Runtime(name=name, binary=binary, state_root=state_root, hide_unified=hide)
        log.info("cgroup mode %s: running jobs with %s", mode.value, rt.describe())
        return rt
    raise RuntimeFault(
        f"no OCI runtime found ({prefer or 'crun or runc'}): apt-get install crun runc"
    )
