"""The control API: a JSON view onto a running :class:`~node.peer.Peer`, served over HTTP on
loopback for the CLI and other tools.

- ``server``: the HTTP server over a :class:`Controller`, its rules and routes;
  ``controller``: the Controller of a running peer and :func:`serve_control`;
  ``views``: the JSON shapes; ``client``: the client the CLI uses."""

from node.api.client import ApiClient, ClientError, NodeNotRunning
from node.api.controller import NodeController, serve_control
from node.api.server import ApiError, Controller, serve_api

__all__ = [
    "ApiClient",
    "ApiError",
    "ClientError",
    "Controller",
    "NodeController",
    "NodeNotRunning",
    "serve_api",
    "serve_control",
]
