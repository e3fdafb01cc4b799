"""A software TPM (swtpm) per simulated provider: manufacture, start, stop.

Used by the test fixtures and by ``cx testnet``: one swtpm per node, each with its own state
directory and its own local CA, so several run side by side.

Rules (``../shared/PLATFORM.md``):
- ``swtpm_setup`` gets config files inside the node's directory; the system defaults point
  at shared paths. It makes an RSA-2048 EK (persistent 0x81010001, certificate at NV
  0x01c00002) and an ECC P-384 EK, certified by a local CA whose root lives in ``ca/``.
- The swtpm TCTI uses a command port and the next port for control: both are picked free on
  127.0.0.1. ``--daemon`` returns once both sockets listen, so no polling is needed; if a
  port was taken in between, swtpm exits non-zero and we retry with new ports.
- Stopping waits on a pidfd for the process to be gone, never on a sleep.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Swtpm", "SwtpmError", "manufacture", "start"]

log = logging.getLogger(__name__)

_PORT_TRIES = 20
_STOP_TIMEOUT_S = 5.0


class SwtpmError(RuntimeError):
    """swtpm could not be set up, started or stopped; the message says which and why."""


@dataclass(frozen=True, slots=True)
class Swtpm:
    """A running swtpm. ``tcti`` is what ``attest.producers.tpm`` opens."""

    directory: Path
    port: int
    pid: int

    @property
    def tcti(self) -> str:
        return f"swtpm:host=127.0.0.1,port={self.port}"

    @property
    def ca_root(self) -> Path:
        return self.directory / "ca" / "swtpm-localca-rootca-cert.pem"

    @property
    def ca_intermediate(self) -> Path:
        return self.directory / "ca" / "issuercert.pem"

    def stop(self) -> None:
        """Terminate swtpm and wait until it has exited; idempotent."""
        try:
            pidfd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            return
        try:
            os.kill(self.pid, signal.SIGTERM)
            ready, _, _ = select.select([pidfd], [], [], _STOP_TIMEOUT_S)
            if not ready:
                log.warning("swtpm %d ignored SIGTERM; killing it", self.pid)
                os.kill(self.pid, signal.SIGKILL)
                select.select([pidfd], [], [], _STOP_TIMEOUT_S)
        except ProcessLookupError:
            pass
        finally:
            os.close(pidfd)


def manufacture(directory: Path) -> None:
    """Create a fresh TPM state with EK certificates under ``directory`` (state/, ca/).

    Raises SwtpmError with swtpm_setup's output when it fails.
    """
    state, ca = directory / "state", directory / "ca"
    state.mkdir(parents=True, exist_ok=True)
    ca.mkdir(parents=True, exist_ok=True)
    (ca / "swtpm-localca.conf").write_text(
        f"statedir = {ca}\nsigningkey = {ca}/signkey.pem\n"
        f"issuercert = {ca}/issuercert.pem\ncertserial = {ca}/certserial\n"
    )
    (ca / "swtpm-localca.options").write_text(
        "--platform-manufacturer ComputeExchange\n--platform-version 1\n--platform-model swtpm\n"
    )
    (ca / "swtpm_setup.conf").write_text(
        "create_certs_tool = /usr/bin/swtpm_localca\n"
        f"create_certs_tool_config = {ca}/swtpm-localca.conf\n"
        f"create_certs_tool_options = {ca}/swtpm-localca.options\n"
        "active_pcr_banks = sha256,sha1\n"
    )
    result = subprocess.run(
        [
            "swtpm_setup",
            "--tpm2",
            "--tpmstate",
            str(state),
            "--config",
            str(ca / "swtpm_setup.conf"),
            "--create-ek-cert",
            "--create-platform-cert",
            "--pcr-banks",
            "sha1,sha256",
            "--overwrite",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise SwtpmError(
            f"swtpm_setup failed ({result.returncode}): {result.stdout}{result.stderr}"
        )


def _free_port_pair() -> int:
    """A port P with P and P+1 free on 127.0.0.1 right now."""
    for _ in range(_PORT_TRIES):
        with socket.socket() as first, socket.socket() as second:
            first.bind(("127.0.0.1", 0))
            port: int = first.getsockname()[1]
            with contextlib.suppress(OSError):
                second.bind(("127.0.0.1", port + 1))
                return port
    raise SwtpmError("no two adjacent free TCP ports on 127.0.0.1")


def start(directory: Path) -> Swtpm:
    """Start swtpm on the state in ``directory`` (see :func:`manufacture`).

    Raises SwtpmError when it does not start after several port choices.
    """
    pid_file = directory / "swtpm.pid"
    error = ""
    for _ in range(_PORT_TRIES):
        port = _free_port_pair()
        pid_file.unlink(missing_ok=True)
        result = subprocess.run(
            [
                "swtpm",
                "socket",
                "--tpm2",
                "--tpmstate",
                f"dir={directory / 'state'}",
                "--server",
                f"type=tcp,port={port},bindaddr=127.0.0.1",
                "--ctrl",
                f"type=tcp,port={port + 1},bindaddr=127.0.0.1",
                "--flags",
                "not-need-init,startup-clear",
                "--daemon",
                "--pid",
                f"file={pid_file}",
                "--log",
                f"file={directory / 'swtpm.log'}",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode == 0:
            return Swtpm(directory=directory, port=port, pid=int(pid_file.read_text()))
        error = result.stderr.strip()
        if "lock" in error.lower():
            break  # another swtpm holds this state: new ports will not help
    raise SwtpmError(f"swtpm did not start on {directory}: {error}")
