"""The content store as a cache: a byte budget, least-recently-used eviction of blobs
nothing needs, hit counts, and ``cx store``."""

from __future__ import annotations

import json
import os

import trio

from node.cli import main
from node.peer import save_store_counts
from node.storage.home import NodeConfig, init_home
from node.storage.image import build_rootfs, import_image, list_images
from node.storage.store import BlobStore

KiB = 1024


def _age(store, digest, seconds_ago):
    """Make ``digest`` look last used ``seconds_ago`` (the LRU clock is the access time)."""
    p = store.path(digest)
    st = p.stat()
    os.utime(p, ns=(st.st_atime_ns - seconds_ago * 10**9, st.st_mtime_ns))


def test_over_budget_the_least_recently_used_blob_goes(tmp_path):
    store = BlobStore(tmp_path / "store", budget_bytes=3 * KiB)
    old = store.put_bytes(b"o" * KiB)
    used = store.put_bytes(b"u" * KiB)
    _age(store, old, 100)
    _age(store, used, 200)
    store.read_bytes(used)  # a use makes it the most recent
    store.put_bytes(b"n" * KiB)
    assert store.has(old)  # still fits: 3 KiB
    newest = store.put_bytes(b"x" * KiB)
    assert not store.has(old)
    assert store.has(used)
    assert store.has(newest)
    stats = store.stats()
    assert (stats.bytes, stats.evicted_blobs, stats.evicted_bytes) == (3 * KiB, 1, KiB)


def test_pinned_outputs_and_held_blobs_are_never_evicted(tmp_path):
    store = BlobStore(tmp_path / "store", budget_bytes=2 * KiB)
    output = store.put_bytes(b"o" * KiB)
    store.pin("job/abc", [output])
    held = store.put_bytes(b"h" * KiB)
    _age(store, output, 500)
    _age(store, held, 400)
    with store.holding([held]), store.holding([held]):
        store.put_bytes(b"n" * KiB)
    assert store.has(output)
    assert store.has(held)  # over budget: nothing else could go but the newest
    store.put_bytes(b"m" * KiB)  # released: now it may go
    assert not store.has(held)
    assert store.has(output)


def test_an_image_that_loses_a_blob_is_no_longer_listed(tmp_path):
    store = BlobStore(tmp_path / "store")
    image = import_image(store, _layout(tmp_path))
    budget = store.stats().bytes
    store = BlobStore(tmp_path / "store", budget_bytes=budget)
    for digest in (image.manifest, image.config, *image.layers):
        _age(store, digest, 1000)
    store.put_bytes(b"new" * 100)
    assert list_images(store) == []
    assert f"image/{image.manifest[7:]}" not in store.refs()


def test_lookups_count_hits_and_misses(tmp_path):
    store = BlobStore(tmp_path / "store")
    digest = store.put_bytes(b"data")
    assert store.lookup(digest)
    assert not store.lookup("sha256:" + "0" * 64)
    assert store.lookup(digest)
    assert (store.stats().hits, store.stats().misses) == (2, 1)
    del store  # dropped, as at the process's exit: counts kept in memory are written
    stats = BlobStore(tmp_path / "store").stats()
    assert (stats.hits, stats.misses) == (2, 1)


def test_cx_store_shows_usage_budget_and_hits(tmp_path, capsys):
    home = tmp_path / "home"
    init_home(home, NodeConfig(store_budget_bytes=10 * KiB))
    store = BlobStore(home / "store")
    digest = store.put_bytes(b"x" * (12 * KiB))
    store.lookup(digest)
    store.save_counts()  # as a node does every second; `cx store` reads what is saved
    assert main(["store", "--home", str(home), "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["budget_bytes"] == 10 * KiB
    assert (figures["blobs"], figures["hits"], figures["misses"]) == (1, 1, 0)
    assert main(["store", "--home", str(home), "--evict"]) == 0
    out = capsys.readouterr().out
    assert "hits" in out
    assert "1 of 1 (100%)" in out
    assert "evicted now  1" in out
    assert not store.has(digest)


def _layout(tmp_path):
    out = tmp_path / "layout"
    build_rootfs(out)
    return out


async def test_a_node_writes_its_store_counts_within_a_second(tmp_path, autojump_clock):
    store = BlobStore(tmp_path / "store")
    digest = store.put_bytes(b"data")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(save_store_counts, store)
        store.lookup(digest)
        assert BlobStore(tmp_path / "store").stats().hits == 0  # in memory only, for now
        await trio.sleep(1.5)  # virtual time (MockClock): past the node's next save
        assert BlobStore(tmp_path / "store").stats().hits == 1
        nursery.cancel_scope.cancel()
