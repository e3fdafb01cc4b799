"""OCI images: build one with no registry, import one into the store, unpack it to a rootfs.

Rules:
- An image is named by its manifest digest (what a bid's ``JobSpec.image`` holds). Import
  resolves an index (multi-arch or tagged) to exactly one manifest for the host's
  architecture, stores the manifest, config and layers, checks every digest and size against
  its descriptor, and pins them under ``image/<hex>``.
- Accepted inputs: an OCI image layout directory, an OCI archive (a tar of such a layout),
  a ``docker save`` archive (converted to an OCI manifest over the same config and layers).
- Built images are reproducible: entries sorted, mtime 0, uid/gid 0, gzip mtime 0, JSON with
  sorted keys; the same busybox gives the same digest.
- Unpacking uses umoci (whiteouts, opaque directories, hard links, absolute symlinks)
  with ownership shifted into the containers' user-namespace range, once per image; jobs
  share the result read-only.

Errors: :class:`ImageError` (one line, what to do).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import hashlib
import io
import json
import logging
import os
import platform
import shutil
import subprocess
import tarfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from node.storage.store import BlobStore, StoreError

__all__ = [
    "Entry",
    "ImageError",
    "ImportedImage",
    "RootfsCache",
    "build_rootfs",
    "busybox_entries",
    "host_arch",
    "image_command",
    "image_config",
    "import_image",
    "list_images",
    "platform_matches",
    "record_image",
    "write_layout",
]

log = logging.getLogger(__name__)

MT_INDEX = "application/vnd.oci.image.index.v1+json"
MT_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MT_CONFIG = "application/vnd.oci.image.config.v1+json"
MT_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
MT_LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
MT_DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
MT_DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
_INDEXES = {MT_INDEX, MT_DOCKER_LIST}
_MANIFESTS = {MT_MANIFEST, MT_DOCKER_MANIFEST}
_REF_NAME = "org.opencontainers.image.ref.name"
_MAX_JSON = 4 * 1024 * 1024

# Container uid/gid 0..65535 are host 100000..165535 (see node.exec.runtime).
ID_MAP_BASE = 100_000
ID_MAP_SIZE = 65_536


class ImageError(Exception):
    """An image could not be built, imported or unpacked; the message says why."""


def host_arch() -> str:
    machine = platform.machine().lower()
    return {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)


def _json_bytes(value: Any) -> bytes:  # noqa: ANN401 - any JSON tree
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


# -- building --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Entry:
    """One layer entry: a file (``data``), a directory, a symlink (``target``) or, with
    ``data=None`` and ``target=None`` and ``whiteout=True``, an OCI whiteout."""

    path: str
    mode: int = 0o755
    data: bytes | None = None
    target: str | None = None
    is_dir: bool = False


def pack_layer(entries: list[Entry]) -> tuple[bytes, str]:
    """A reproducible gzip tar of ``entries``; returns (gzip bytes, diff_id)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for e in sorted(entries, key=lambda e: e.path):
            info = tarfile.TarInfo(e.path.strip("/"))
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mode = e.mode
            if e.is_dir:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif e.target is not None:
                info.type = tarfile.SYMTYPE
                info.linkname = e.target
                tar.addfile(info)
            else:
                data = e.data or b""
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    tar_bytes = raw.getvalue()
    gz = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=gz, mtime=0, compresslevel=6) as f:
        f.write(tar_bytes)
    return gz.getvalue(), _digest(tar_bytes)


def write_layout(
    out_dir: Path | str,
    layers: list[list[Entry]],
    *,
    config: dict[str, Any] | None = None,
    arch: str | None = None,
    tag: str = "latest",
) -> str:
    """Write an OCI image layout of ``layers`` (bottom first); return the manifest digest."""
    out = Path(out_dir)
    blobs = out / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)

    def put(data: bytes) -> str:
        d = _digest(data)
        (blobs / d[7:]).write_bytes(data)
        return d

    layer_descs, diff_ids = [], []
    for entries in layers:
        blob, diff_id = pack_layer(entries)
        layer_descs.append({"mediaType": MT_LAYER_GZIP, "digest": put(blob), "size": len(blob)})
        diff_ids.append(diff_id)
    cfg = {
        "architecture": arch or host_arch(),
        "os": "linux",
        "config": config or {"Env": ["PATH=/bin:/usr/bin"], "Cmd": ["/bin/sh"]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }
    cfg_bytes = _json_bytes(cfg)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MT_MANIFEST,
        "config": {"mediaType": MT_CONFIG, "digest": put(cfg_bytes), "size": len(cfg_bytes)},
        "layers": layer_descs,
    }
    m_bytes = _json_bytes(manifest)
    m_digest = put(m_bytes)
    index = {
        "schemaVersion": 2,
        "mediaType": MT_INDEX,
        "manifests": [
            {
                "mediaType": MT_MANIFEST,
                "digest": m_digest,
                "size": len(m_bytes),
                "annotations": {_REF_NAME: tag},
                "platform": {"architecture": cfg["architecture"], "os": "linux"},
            }
        ],
    }
    (out / "index.json").write_bytes(_json_bytes(index))
    (out / "oci-layout").write_bytes(_json_bytes({"imageLayoutVersion": "1.0.0"}))
    return m_digest


def busybox_entries(busybox: Path | str = "/bin/busybox") -> list[Entry]:
    """A minimal root filesystem: a static busybox, one symlink per applet, the usual dirs."""
    exe = Path(busybox)
    if not exe.is_file():
        raise ImageError(f"{exe} not found: install busybox-static or pass --busybox PATH")
    applets = subprocess.run(
        [str(exe), "--list"], check=True, capture_output=True, text=True
    ).stdout.split()
    entries = [Entry(path=d, is_dir=True) for d in ("bin", "dev", "etc", "proc", "sys", "root")]
    entries += [Entry(path="tmp", is_dir=True, mode=0o1777)]
    entries.append(Entry(path="bin/busybox", data=exe.read_bytes()))
    entries += [Entry(path=f"bin/{a}", target="busybox") for a in applets if a != "busybox"]
    entries.append(Entry(path="etc/passwd", mode=0o644, data=b"root:x:0:0:root:/root:/bin/sh\n"))
    entries.append(Entry(path="etc/group", mode=0o644, data=b"root:x:0:\n"))
    return entries


def build_rootfs(
    out_dir: Path | str, *, busybox: Path | str = "/bin/busybox", tag: str = "latest"
) -> str:
    """Build the busybox image as an OCI layout in ``out_dir``; return its manifest digest."""
    return write_layout(out_dir, [busybox_entries(busybox)], tag=tag)


# -- importing -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ImportedImage:
    manifest: str
    config: str
    layers: tuple[str, ...]
    size: int  # bytes of all stored blobs
    arch: str
    names: tuple[str, ...] = ()


class _Source:
    """Blobs by digest, from a layout directory or a tar archive."""

    def __init__(self, opener: Callable[[str], IO[bytes] | None], names: list[str]) -> None:
        self._open = opener
        self.names = names

    def open(self, name: str) -> IO[bytes]:
        f = self._open(name)
        if f is None:
            raise ImageError(f"the image has no {name}; is the archive complete?")
        return f

    def read_json(self, name: str) -> Any:  # noqa: ANN401 - any JSON tree
        with self.open(name) as f:
            data = f.read(_MAX_JSON + 1)
        if len(data) > _MAX_JSON:
            raise ImageError(f"{name} is larger than {_MAX_JSON} bytes")
        try:
            return json.loads(data)
        except ValueError as exc:
            raise ImageError(f"{name} is not JSON: {exc}") from exc

    def read_blob(self, digest: str) -> bytes:
        with self.open(_blob_name(digest)) as f:
            data = f.read(_MAX_JSON + 1)
        if len(data) > _MAX_JSON or _digest(data) != digest:
            raise ImageError(f"blob {digest} does not match its digest")
        return data


def _blob_name(digest: str) -> str:
    algo, _, hexpart = digest.partition(":")
    if algo != "sha256" or len(hexpart) != 64:
        raise ImageError(f"unsupported digest {digest!r}: only sha256 is supported")
    return f"blobs/sha256/{hexpart}"


def _dir_source(root: Path) -> _Source:
    def opener(name: str) -> IO[bytes] | None:
        p = root / name
        return open(p, "rb") if p.is_file() else None

    return _Source(opener, [])


@contextlib.contextmanager
def _tar_source(path: Path) -> Iterator[_Source]:
    try:
        tar = tarfile.open(path, "r:*")  # noqa: SIM115 - closed below
    except (tarfile.TarError, OSError) as exc:
        # tarfile's own message lists every compression it tried, over several lines.
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not a tar archive"
        raise ImageError(
            f"{path} is not an image: neither an OCI layout directory nor an OCI or "
            f"`docker save` archive ({why})"
        ) from exc
    with tar:
        members = {m.name.removeprefix("./"): m for m in tar.getmembers() if m.isfile()}

        def opener(name: str) -> IO[bytes] | None:
            m = members.get(name)
            return tar.extractfile(m) if m is not None else None

        yield _Source(opener, list(members))


def import_image(
    store: BlobStore, path: Path | str, *, ref: str | None = None, arch: str | None = None
) -> ImportedImage:
    """Import an OCI layout dir, OCI archive or docker-save archive into ``store``.

    Raises:
        ImageError: unreadable input, no manifest for this architecture, a blob that does not
            match its descriptor.
    """
    p = Path(path)
    arch = arch or host_arch()
    if p.is_dir():
        if not (p / "index.json").is_file():
            raise ImageError(f"{p} has no index.json: not an OCI image layout")
        return _import_layout(store, _dir_source(p), ref, arch, str(p))
    if not p.is_file():
        raise ImageError(f"{p} does not exist")
    with _tar_source(p) as src:
        if "index.json" in src.names:
            return _import_layout(store, src, ref, arch, str(p))
        if "manifest.json" in src.names:
            return _import_docker(store, src, ref, arch)
    raise ImageError(f"{p} has neither index.json (OCI) nor manifest.json (docker save)")


def platform_matches(desc: dict[str, Any], arch: str) -> bool:
    """Does an index entry suit ``linux/<arch>``? One without a platform might: its config
    decides (spec/content.md rule 10)."""
    plat = desc.get("platform")
    if not isinstance(plat, dict):
        return True
    return plat.get("os") == "linux" and plat.get("architecture") == arch


def _candidates(src: _Source, index: Any, ref: str | None, arch: str, depth: int) -> list[Any]:  # noqa: ANN401
    if depth > 4 or not isinstance(index, dict):
        raise ImageError("image index is malformed or nested too deeply")
    found = []
    for desc in index.get("manifests") or []:
        if not isinstance(desc, dict) or not platform_matches(desc, arch):
            continue
        tag = (desc.get("annotations") or {}).get(_REF_NAME)
        if depth == 0 and ref is not None and tag != ref:
            continue
        mt = desc.get("mediaType")
        if mt in _INDEXES:
            nested = json.loads(src.read_blob(desc["digest"]))
            found += _candidates(src, nested, None, arch, depth + 1)
        elif mt in _MANIFESTS:
            found.append(desc)
    return found


def _import_layout(
    store: BlobStore, src: _Source, ref: str | None, arch: str, where: str
) -> ImportedImage:
    index = src.read_json("index.json")
    found = _candidates(src, index, ref, arch, 0)
    for desc in found:
        m_bytes = src.read_blob(desc["digest"])
        manifest = json.loads(m_bytes)
        config = json.loads(src.read_blob(manifest["config"]["digest"]))
        if config.get("architecture", arch) != arch:
            continue
        names = (
            (ref,)
            if ref
            else tuple(n for n in [(desc.get("annotations") or {}).get(_REF_NAME)] if n)
        )
        return _store_image(store, src, m_bytes, manifest, arch, names)
    what = f"tag {ref!r} for " if ref else ""
    raise ImageError(f"{where} has no image {what}linux/{arch}; pick another image or --ref")


def _store_image(
    store: BlobStore,
    src: _Source,
    m_bytes: bytes,
    manifest: dict[str, Any],
    arch: str,
    names: tuple[str, ...],
) -> ImportedImage:
    try:
        for desc in [manifest["config"], *manifest["layers"]]:
            with src.open(_blob_name(desc["digest"])) as f:
                digest = store.put_reader(f, expect=desc["digest"])
            got = store.size(digest)
            if got != desc["size"]:
                raise ImageError(
                    f"blob {digest} is {got} bytes, its descriptor says {desc['size']}"
                )
    except StoreError as exc:
        raise ImageError(f"image blob does not match its digest: {exc}") from exc
    except (KeyError, TypeError) as exc:
        raise ImageError(f"image manifest is malformed: missing {exc}") from exc
    return record_image(store, m_bytes, manifest, arch, names)


def record_image(
    store: BlobStore,
    m_bytes: bytes,
    manifest: dict[str, Any],
    arch: str,
    names: tuple[str, ...],
    *,
    keep: tuple[str, ...] = (),
) -> ImportedImage:
    """Store the manifest and pin it with its config, layers (already in the store, checked
    against their descriptors) and ``keep`` (e.g. the index it was resolved from), so
    image_config, RootfsCache and ``cx image ls`` see the image."""
    try:
        layers = tuple(d["digest"] for d in manifest["layers"])
        config = manifest["config"]["digest"]
        size = len(m_bytes) + sum(store.size(d) for d in (config, *layers))
    except (KeyError, TypeError) as exc:
        raise ImageError(f"image manifest is malformed: missing {exc}") from exc
    except StoreError as exc:
        raise ImageError(f"image blob missing from the store: {exc}") from exc
    m_digest = store.put_bytes(m_bytes)
    store.pin(f"image/{m_digest[7:]}", [m_digest, config, *layers, *keep])
    meta = store.root / "images"
    meta.mkdir(exist_ok=True)
    info = ImportedImage(
        manifest=m_digest, config=config, layers=layers, size=size, arch=arch, names=names
    )
    _untag_others(meta, m_digest, names)
    (meta / f"{m_digest[7:]}.json").write_bytes(_json_bytes(dataclasses.asdict(info)))
    log.info("imported image %s (%d layers, %d bytes)", m_digest, len(layers), size)
    return info


def _untag_others(meta: Path, m_digest: str, names: tuple[str, ...]) -> None:
    """A name belongs to one image, the latest imported under it (``docker tag`` moves a
    tag the same way); the image it leaves keeps its digest and other names."""
    for path in meta.glob("*.json"):
        if path.stem == m_digest[7:] or not names:
            continue
        d = json.loads(path.read_bytes())
        kept = [n for n in d.get("names", []) if n not in names]
        if kept != d.get("names", []):
            d["names"] = kept
            path.write_bytes(_json_bytes(d))


def _import_docker(store: BlobStore, src: _Source, ref: str | None, arch: str) -> ImportedImage:
    entries = src.read_json("manifest.json")
    if not isinstance(entries, list) or not entries:
        raise ImageError("docker manifest.json lists no images")
    chosen = entries[0]
    if ref is not None:
        matches = [e for e in entries if ref in (e.get("RepoTags") or [])]
        if not matches:
            raise ImageError(f"docker archive has no tag {ref!r}")
        chosen = matches[0]
    try:
        with src.open(chosen["Config"]) as f:
            cfg_bytes = f.read(_MAX_JSON)
        config = json.loads(cfg_bytes)
        if config.get("architecture", arch) != arch:
            raise ImageError(f"docker image is {config.get('architecture')}, host is {arch}")
        cfg_digest = store.put_bytes(cfg_bytes)
        layers, size = [], len(cfg_bytes)
        for name in chosen["Layers"]:
            with src.open(name) as f:
                head = f.read(2)
            with src.open(name) as f:
                digest = store.put_reader(f)
            n = store.size(digest)
            size += n
            mt = MT_LAYER_GZIP if head == b"\x1f\x8b" else MT_LAYER_TAR
            layers.append({"mediaType": mt, "digest": digest, "size": n})
    except (KeyError, TypeError, ValueError) as exc:
        raise ImageError(f"docker manifest.json is malformed: {exc}") from exc
    manifest = {
        "schemaVersion": 2,
        "mediaType": MT_MANIFEST,
        "config": {"mediaType": MT_CONFIG, "digest": cfg_digest, "size": len(cfg_bytes)},
        "layers": layers,
    }
    m_bytes = _json_bytes(manifest)
    names = tuple(chosen.get("RepoTags") or ())
    return _store_image(store, _StoreSource(store), m_bytes, manifest, arch, names)


class _StoreSource(_Source):
    """Blobs already in the store (docker layers are hashed while being stored)."""

    def __init__(self, store: BlobStore) -> None:
        def opener(name: str) -> IO[bytes] | None:
            digest = "sha256:" + name.rsplit("/", 1)[-1]
            return open(store.path(digest), "rb") if store.has(digest) else None

        super().__init__(opener, [])


def list_images(store: BlobStore) -> list[ImportedImage]:
    meta = store.root / "images"
    out = []
    for p in sorted(meta.glob("*.json")) if meta.is_dir() else []:
        d = json.loads(p.read_bytes())
        if store.has(d["manifest"]):
            out.append(
                ImportedImage(
                    manifest=d["manifest"],
                    config=d["config"],
                    layers=tuple(d["layers"]),
                    size=d["size"],
                    arch=d["arch"],
                    names=tuple(d["names"]),
                )
            )
    return out


def image_config(store: BlobStore, manifest_digest: str) -> dict[str, Any]:
    """The runtime part (``config``) of the image's config: Env, WorkingDir, ...

    Raises:
        ImageError: the image is not in the store.
    """
    try:
        manifest = json.loads(store.read_bytes(manifest_digest))
        config = json.loads(store.read_bytes(manifest["config"]["digest"]))
    except StoreError as exc:
        raise ImageError(f"image {manifest_digest} is not imported: run cx image import") from exc
    runtime = config.get("config") or {}
    return runtime if isinstance(runtime, dict) else {}


def image_command(config: dict[str, Any], args: Sequence[str]) -> tuple[str, ...]:
    """What runs, as ``docker run IMAGE [ARGS...]`` decides it: the image's Entrypoint,
    then ``args`` if any were given, else the image's Cmd.

    Raises:
        ImageError: neither gives anything to run.
    """
    entrypoint, cmd = config.get("Entrypoint") or [], config.get("Cmd") or []
    if not all(isinstance(x, list) for x in (entrypoint, cmd)):
        raise ImageError("the image's Entrypoint or Cmd is not a list of strings")
    command = (*entrypoint, *(args or cmd))
    if not command:
        raise ImageError("the image names no command (no Entrypoint or Cmd): give one after it")
    return tuple(str(x) for x in command)


# -- unpacking -------------------------------------------------------------------------------


class RootfsCache:
    """Unpacked root filesystems, one per image, under ``<store>/rootfs/<hex>``."""

    def __init__(self, store: BlobStore) -> None:
        self.store = store
        self.root = store.root / "rootfs"
        self.root.mkdir(exist_ok=True)
        self.root.chmod(0o755)

    def path(self, manifest_digest: str) -> Path | None:
        """The unpacked rootfs if it is ready, else None."""
        done = self.root / manifest_digest[7:]
        return done / "rootfs" if (done / "rootfs").is_dir() else None

    def unpack(self, manifest_digest: str) -> Path:
        """Unpack (once) and return the rootfs directory. Blocking: call from a thread.

        Raises:
            ImageError: the image is not in the store, or umoci refused it.
        """
        ready = self.path(manifest_digest)
        if ready is not None:
            return ready
        try:
            manifest = json.loads(self.store.read_bytes(manifest_digest))
        except StoreError as exc:
            raise ImageError(
                f"image {manifest_digest} is not imported: run cx image import"
            ) from exc
        work = self.root / f".tmp-{os.getpid()}-{os.urandom(4).hex()}"
        layout = work / "layout"
        blobs = layout / "blobs" / "sha256"
        blobs.mkdir(parents=True)
        try:
            for desc in [manifest["config"], *manifest["layers"]]:
                self.store.verify(desc["digest"])
                os.link(self.store.path(desc["digest"]), blobs / desc["digest"][7:])
            os.link(self.store.path(manifest_digest), blobs / manifest_digest[7:])
            index = {
                "schemaVersion": 2,
                "manifests": [
                    {
                        "mediaType": MT_MANIFEST,
                        "digest": manifest_digest,
                        "size": self.store.size(manifest_digest),
                        "annotations": {_REF_NAME: "cx"},
                    }
                ],
            }
            (layout / "index.json").write_bytes(_json_bytes(index))
            (layout / "oci-layout").write_bytes(_json_bytes({"imageLayoutVersion": "1.0.0"}))
            idmap = f"0:{ID_MAP_BASE}:{ID_MAP_SIZE}"
            proc = subprocess.run(
                [
                    "umoci",
                    "unpack",
                    "--uid-map",
                    idmap,
                    "--gid-map",
                    idmap,
                    "--image",
                    f"{layout}:cx",
                    str(work / "bundle"),
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            if proc.returncode != 0:
                raise ImageError(f"umoci could not unpack {manifest_digest}: {proc.stderr.strip()}")
            (work / "bundle" / "rootfs").chmod(0o755)
            final = self.root / manifest_digest[7:]
            final.mkdir(exist_ok=True)
            with contextlib.suppress(FileExistsError, OSError):
                # Another unpacker may have won the race; its result is identical.
                os.rename(work / "bundle" / "rootfs", final / "rootfs")
        finally:
            shutil.rmtree(work, ignore_errors=True)
        ready = self.path(manifest_digest)
        if ready is None:
            raise ImageError(f"unpacking {manifest_digest} left no rootfs")
        log.info("unpacked image %s to %s", manifest_digest, ready)
        return ready

    def gc(self) -> list[str]:
        """Remove rootfs trees whose image is no longer pinned."""
        pinned = {
            name.removeprefix("image/") for name in self.store.refs() if name.startswith("image/")
        }
        removed = []
        for p in self.root.iterdir():
            if p.name not in pinned:
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p.name)
        return removed
