"""``cx image``: build, import, list and collect OCI images in the node's content store.

The store lives in the node's home (``node.storage.home.default_home``): containers run as
a mapped uid, so every directory above it must be searchable by others.

Exit status: 0 done (the manifest digest alone on stdout for build-rootfs and import),
2 unusable input (one line on stderr saying what to do).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from node.cli.common import add_common, print_json, table
from node.storage.image import (
    ImageError,
    RootfsCache,
    build_rootfs,
    import_image,
    list_images,
)
from node.storage.store import BlobStore
from protocol.units import size

__all__ = ["register", "resolve_image"]

EXIT_INPUT = 2


def register(commands: Any) -> None:  # noqa: ANN401 - argparse's private subparsers type
    group = commands.add_parser("image", help="build, import and list OCI images")
    sub = group.add_subparsers(dest="image_command", metavar="ACTION", required=True)

    build = sub.add_parser(
        "build-rootfs",
        help="pack a static busybox as a reproducible OCI image layout (no registry needed)",
    )
    build.add_argument("dir", type=Path, help="output directory for the OCI layout")
    build.add_argument("--busybox", default="/bin/busybox", help="static busybox binary")
    build.add_argument("--tag", default="busybox", help="ref name in index.json")
    build.add_argument("--import", dest="do_import", action="store_true", help="also import it")
    add_common(build)
    build.set_defaults(run=_build)

    imp = sub.add_parser(
        "import", help="import an OCI layout dir, OCI archive or docker-save archive"
    )
    imp.add_argument(
        "path", type=Path, help="an OCI layout directory, OCI archive or `docker save` archive"
    )
    imp.add_argument("--ref", help="tag to pick when the image holds several")
    imp.add_argument("--arch", help="architecture to resolve a multi-arch index to")
    imp.add_argument("--unpack", action="store_true", help="unpack now rather than on first run")
    add_common(imp)
    imp.set_defaults(run=_import)

    ls = sub.add_parser("ls", help="list imported images")
    ls.add_argument("--json", action="store_true", help="print the images as JSON")
    add_common(ls)
    ls.set_defaults(run=_ls)

    gc = sub.add_parser("gc", help="delete blobs and unpacked trees nothing refers to")
    gc.add_argument("--grace", type=float, default=3600.0, help="keep blobs younger (seconds)")
    add_common(gc)
    gc.set_defaults(run=_gc)


def _store(args: argparse.Namespace) -> BlobStore:
    return BlobStore(args.home / "store")


def _build(args: argparse.Namespace) -> int:
    try:
        digest = build_rootfs(args.dir, busybox=args.busybox, tag=args.tag)
        if args.do_import:
            import_image(_store(args), args.dir)
    except ImageError as exc:
        print(f"cx image build-rootfs: {exc}", file=sys.stderr)
        return EXIT_INPUT
    print(digest)
    return 0


def _import(args: argparse.Namespace) -> int:
    try:
        store = _store(args)
        img = import_image(store, args.path, ref=args.ref, arch=args.arch)
        if args.unpack:
            RootfsCache(store).unpack(img.manifest)
    except (ImageError, OSError) as exc:
        print(f"cx image import: {exc}", file=sys.stderr)
        return EXIT_INPUT
    names = ", ".join(img.names) or "-"
    print(
        f"imported {names}: {len(img.layers)} layer(s), {img.size / 1e6:.1f} MB, {img.arch}",
        file=sys.stderr,
    )
    print(img.manifest)
    return 0


def _ls(args: argparse.Namespace) -> int:
    images = list_images(_store(args))
    if args.json:
        print_json(
            [
                {
                    "manifest": i.manifest,
                    "names": list(i.names),
                    "size": i.size,
                    "layers": len(i.layers),
                    "arch": i.arch,
                }
                for i in images
            ]
        )
        return 0
    rows = [
        (i.manifest[7:19], ",".join(i.names) or "-", len(i.layers), size(i.size), i.arch)
        for i in images
    ]
    print(table(("IMAGE ID", "NAMES", "LAYERS", "SIZE", "ARCH"), rows, right=(2, 3)))
    return 0


def _gc(args: argparse.Namespace) -> int:
    store = _store(args)
    removed = store.gc(grace_s=args.grace)
    trees = RootfsCache(store).gc()
    print(f"removed {len(removed)} blob(s) and {len(trees)} unpacked tree(s)")
    return 0


def resolve_image(store: BlobStore, name: str) -> str:
    """A manifest digest from a digest, a unique digest prefix or an image name.

    Raises:
        ImageError: nothing or more than one image matches.
    """
    images = list_images(store)
    full = name if name.startswith("sha256:") else "sha256:" + name
    also = name.removesuffix(":latest")  # docker's default tag: `busybox:latest` is `busybox`
    matches = [
        i.manifest
        for i in images
        if name in i.names or also in i.names or i.manifest.startswith(full)
    ]
    if len(set(matches)) == 1:
        return matches[0]
    if matches:
        raise ImageError(f"{name!r} matches {len(set(matches))} images: give more of the digest")
    if name.startswith(("/", "./", "../")) or name.endswith(".tar"):
        raise ImageError(f"{name} does not exist (no such file or directory)")
    known = sorted({n for i in images for n in i.names})
    held = f"the store holds {', '.join(known[:6])}" if known else "no image is imported yet"
    raise ImageError(
        f"no imported image is named {name!r} ({held}); import one with "
        "`cx image import PATH`, or see cx image ls"
    )
