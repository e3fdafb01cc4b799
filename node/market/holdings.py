"""What a provider's offer says it holds (spec/matching.md, "Transfer cost"): the blobs of
the images it holds whole, then its other large blobs, most recently used first, as the
sorted prefix list of protocol/transfer.py; and the offer re-posted when that list changes.

The store has no change events, so the list is recomputed once per re-post interval
(spec/pricing.md's, 10 s: the same throttle as a price move) and the offer re-posted only
when the list differs from the posted one. A scan lists the blob directory and stats each
blob, off the event loop.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

from node.storage.store import BlobStore
from protocol.pricing import REPOST_INTERVAL_MS
from protocol.transfer import holds_filter

__all__ = ["LARGE_BLOB_BYTES", "follow_holdings", "held_now"]

log = logging.getLogger(__name__)

LARGE_BLOB_BYTES = 1 << 20  # smaller blobs cost too little to move to be worth a slot


def held_now(store: BlobStore) -> bytes | None:
    """The ``holds`` of an offer made now from ``store``."""
    images = [
        digest
        for name, digests in store.refs().items()
        if name.startswith("image/")
        for digest in ["sha256:" + name.removeprefix("image/"), *digests]
    ]
    return holds_filter([*images, *store.recently_used(min_bytes=LARGE_BLOB_BYTES)])


async def follow_holdings(
    store: BlobStore,
    posted: Callable[[], bytes | None],
    post: Callable[[bytes | None], Awaitable[None]],
    *,
    interval_ms: int = REPOST_INTERVAL_MS,
) -> None:
    """Re-post through ``post`` whenever what the store holds differs from ``posted()``;
    runs until cancelled."""
    while True:
        await trio.sleep(interval_ms / 1000)
        now = await trio.to_thread.run_sync(held_now, store)
        if now != posted():
            log.info("held blobs changed: %d listed", len(now or b"") // 4)
            await post(now)
