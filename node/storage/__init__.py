"""Storage and transfer: everything a node keeps on disk, and moving content between peers.

- ``home``: the home directory, its key and ``config.toml``.
- ``db``: the node's SQLite state (orders, jobs, agreements, receipts, ledger, outbox).
- ``store``: content-addressed blobs; ``image``: OCI images in the store.
- ``transfer``: chunked, verified, resumable blob transfer over ``/cx/blob/1``.
"""

from node.storage.db import AgreementRow, Database, JobRow
from node.storage.home import Home, HomeError, NodeConfig, ProviderConfig, default_home, init_home
from node.storage.image import ImageError, import_image
from node.storage.store import BlobStore, StoreError
from node.storage.transfer import TransferError, fetch_blob, fetch_image, serve_blobs

__all__ = [
    "AgreementRow",
    "BlobStore",
    "Database",
    "Home",
    "HomeError",
    "ImageError",
    "JobRow",
    "NodeConfig",
    "ProviderConfig",
    "StoreError",
    "TransferError",
    "default_home",
    "fetch_blob",
    "fetch_image",
    "import_image",
    "init_home",
    "serve_blobs",
]
