"""Whether the TCP ports a node is configured to listen on are free, asked before anything
starts: a busy port found after libp2p is up came out as a long traceback, and two nodes
given one port both seemed to start."""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterable

__all__ = ["busy_ports"]


def busy_ports(listen: Iterable[str], api_port: int) -> list[str]:
    """One line for each fixed port (not 0) of ``listen`` (multiaddrs) and of the control
    API on 127.0.0.1 that another program holds."""
    wanted = [(f"[network] listen {addr}", *_host_port(addr)) for addr in listen]
    if api_port:
        wanted.append(("[network] api_port", "127.0.0.1", api_port, socket.AF_INET))
    return [
        f"port {port} ({what}) is in use by another program; stop it, or choose another "
        "port in config.toml"
        for what, host, port, family in wanted
        if port and _in_use(host, port, family)
    ]


def _host_port(addr: str) -> tuple[str, int, socket.AddressFamily]:
    """``/ip4/HOST/tcp/PORT/...`` as its parts; port 0 for anything else (not checked)."""
    parts = addr.split("/")
    if len(parts) >= 5 and parts[1] in ("ip4", "ip6") and parts[3] == "tcp" and parts[4].isdigit():
        family = socket.AF_INET if parts[1] == "ip4" else socket.AF_INET6
        return parts[2], int(parts[4]), family
    return "", 0, socket.AF_INET


def _in_use(host: str, port: int, family: socket.AddressFamily) -> bool:
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False
