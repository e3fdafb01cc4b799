"""Building, importing and unpacking OCI images with no registry."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile

import pytest

from node.storage.image import (
    ID_MAP_BASE,
    Entry,
    ImageError,
    RootfsCache,
    build_rootfs,
    image_config,
    import_image,
    list_images,
    pack_layer,
    write_layout,
)
from node.storage.store import BlobStore


@pytest.fixture
def store(tmp_path):
    return BlobStore(tmp_path / "store")


def _tar_dir(src, dest):
    with tarfile.open(dest, "w") as tar:
        for p in sorted(src.rglob("*")):
            tar.add(p, arcname=str(p.relative_to(src)), recursive=False)


def test_build_is_reproducible(tmp_path):
    a = build_rootfs(tmp_path / "a")
    b = build_rootfs(tmp_path / "b")
    assert a == b
    assert (tmp_path / "a" / "blobs" / "sha256" / a[7:]).read_bytes() == (
        tmp_path / "b" / "blobs" / "sha256" / b[7:]
    ).read_bytes()
    assert json.loads((tmp_path / "a" / "oci-layout").read_text()) == {
        "imageLayoutVersion": "1.0.0"
    }


def test_layer_entries_are_sorted_and_zeroed():
    blob, diff_id = pack_layer([Entry(path="b", data=b"2"), Entry(path="a", data=b"1")])
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as raw:
        members = raw.getmembers()
    assert [m.name for m in members] == ["a", "b"]
    assert all(m.mtime == 0 and m.uid == 0 for m in members)
    assert blob[4:8] == b"\0\0\0\0"  # gzip header mtime
    import gzip

    assert diff_id == "sha256:" + hashlib.sha256(gzip.decompress(blob)).hexdigest()


def test_import_layout_dir_pins_every_blob(tmp_path, store):
    digest = build_rootfs(tmp_path / "layout", tag="busybox")
    img = import_image(store, tmp_path / "layout")
    assert img.manifest == digest
    assert img.names == ("busybox",)
    assert store.refs()[f"image/{digest[7:]}"] == sorted([digest, img.config, *img.layers])
    assert [i.manifest for i in list_images(store)] == [digest]
    assert image_config(store, digest)["Cmd"] == ["/bin/sh"]


def test_import_oci_archive_gives_the_same_digest(tmp_path, store):
    digest = build_rootfs(tmp_path / "layout")
    _tar_dir(tmp_path / "layout", tmp_path / "image.tar")
    assert import_image(store, tmp_path / "image.tar").manifest == digest


def test_import_docker_save_archive(tmp_path, store):
    layer, diff_id = pack_layer([Entry(path="hello", data=b"world", mode=0o644)])
    import gzip

    layer_tar = gzip.decompress(layer)
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Env": ["A=1"]},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        }
    ).encode()
    cfg_name = hashlib.sha256(config).hexdigest() + ".json"
    with tarfile.open(tmp_path / "docker.tar", "w") as tar:
        for name, data in [
            (
                "manifest.json",
                json.dumps(
                    [{"Config": cfg_name, "RepoTags": ["hello:1"], "Layers": ["abc/layer.tar"]}]
                ).encode(),
            ),
            (cfg_name, config),
            ("abc/layer.tar", layer_tar),
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    img = import_image(store, tmp_path / "docker.tar")
    assert img.names == ("hello:1",)
    assert img.layers == ("sha256:" + hashlib.sha256(layer_tar).hexdigest(),)
    assert image_config(store, img.manifest)["Env"] == ["A=1"]
    manifest = json.loads(store.read_bytes(img.manifest))
    assert manifest["layers"][0]["mediaType"].endswith("layer.v1.tar")


def test_multi_arch_index_resolves_to_requested_arch(tmp_path, store):
    amd = write_layout(tmp_path / "amd", [[Entry(path="f", data=b"amd64")]], arch="amd64")
    arm = write_layout(tmp_path / "arm", [[Entry(path="f", data=b"arm64")]], arch="arm64")
    multi = tmp_path / "multi"
    shutil.copytree(tmp_path / "amd", multi)
    shutil.copytree(tmp_path / "arm" / "blobs", multi / "blobs", dirs_exist_ok=True)
    descs = [
        json.loads((tmp_path / d / "index.json").read_text())["manifests"][0]
        for d in ("amd", "arm")
    ]
    nested = json.dumps({"schemaVersion": 2, "manifests": descs}).encode()
    nd = hashlib.sha256(nested).hexdigest()
    (multi / "blobs" / "sha256" / nd).write_bytes(nested)
    (multi / "index.json").write_text(
        json.dumps(
            {
                "schemaVersion": 2,
                "manifests": [
                    {
                        "mediaType": "application/vnd.oci.image.index.v1+json",
                        "digest": "sha256:" + nd,
                        "size": len(nested),
                    }
                ],
            }
        )
    )
    assert import_image(store, multi, arch="arm64").manifest == arm
    assert import_image(store, multi, arch="amd64").manifest == amd
    with pytest.raises(ImageError, match=r"linux/riscv64"):
        import_image(store, multi, arch="riscv64")


def test_tampered_layer_is_refused(tmp_path, store):
    digest = build_rootfs(tmp_path / "layout")
    manifest = json.loads((tmp_path / "layout/blobs/sha256" / digest[7:]).read_text())
    layer = tmp_path / "layout/blobs/sha256" / manifest["layers"][0]["digest"][7:]
    data = bytearray(layer.read_bytes())
    data[100] ^= 0xFF
    layer.write_bytes(bytes(data))
    with pytest.raises(ImageError, match="does not match"):
        import_image(store, tmp_path / "layout")


def test_not_an_image(tmp_path, store):
    (tmp_path / "junk").write_bytes(b"not a tar")
    with pytest.raises(ImageError):
        import_image(store, tmp_path / "junk")
    with pytest.raises(ImageError, match=r"no index\.json"):
        import_image(store, tmp_path)


@pytest.mark.integration
def test_unpack_applies_whiteouts_and_shifts_ownership(tmp_path, store):
    lower = [
        Entry(path="a", is_dir=True),
        Entry(path="a/keep", data=b"k"),
        Entry(path="a/gone", data=b"g"),
        Entry(path="b", is_dir=True),
        Entry(path="b/old", data=b"o"),
        Entry(path="abs", target="/a/keep"),
    ]
    upper = [
        Entry(path="a", is_dir=True),
        Entry(path="a/.wh.gone", data=b""),
        Entry(path="b", is_dir=True),
        Entry(path="b/.wh..wh..opq", data=b""),
        Entry(path="b/new", data=b"n"),
    ]
    write_layout(tmp_path / "layout", [lower, upper])
    img = import_image(store, tmp_path / "layout")
    root = RootfsCache(store).unpack(img.manifest)
    assert sorted(p.name for p in (root / "a").iterdir()) == ["keep"]
    assert sorted(p.name for p in (root / "b").iterdir()) == ["new"]
    assert (root / "abs").readlink().as_posix() == "/a/keep"  # absolute symlink kept as is
    assert (root / "a" / "keep").stat().st_uid == ID_MAP_BASE
    assert RootfsCache(store).unpack(img.manifest) == root  # cached
