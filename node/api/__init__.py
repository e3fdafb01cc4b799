"""The control API: a JSON view onto a running :class:`~node.peer.Peer`, served over HTTP on
loopback for the CLI and other tools.

- ``server``: the FastAPI application over a :class:`~node.api.server.Controller`, its rules
  and routes, served by hypercorn; ``controller``: the Controller of a running peer and
  ``serve_control``; ``models``: the answers' schemas; ``views``: building them.
- ``client``: the synchronous client the CLI uses; ``common``: what both sides share (the
  error type, the limits, ``api.json``).

Only the client side is re-exported here: importing the server costs the web framework's
0.6 s, which no ``cx`` command but ``cx node`` should pay.
"""

from node.api.client import ApiClient, BadResponse, ClientError, NodeNotRunning
from node.api.common import ApiError, read_api_info

__all__ = ["ApiClient", "ApiError", "BadResponse", "ClientError", "NodeNotRunning", "read_api_info"]
