"""The control API: HTTP/JSON on loopback for the CLI and other tools (``server``), and
its client (``client``)."""

from node.api.client import ApiClient, ClientError, NodeNotRunning
from node.api.server import FINAL_STATES, ApiError, Controller, serve_api

__all__ = [
    "FINAL_STATES",
    "ApiClient",
    "ApiError",
    "ClientError",
    "Controller",
    "NodeNotRunning",
    "serve_api",
]
