"""A user's job request (the control API's ``POST /v1/jobs`` body) and the bid made from it.

:func:`resolve` checks a request and brings what it names into the node's store: an image
given as a path is imported, input files are stored; afterwards the request names only
digests and can be stored with the job and turned into the same bid again after a fault
(:func:`bid_from_request`). Errors are :class:`RequestError` with a message for the user.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from node.storage.image import ImageError, import_image
from node.storage.store import BlobStore
from protocol.messages import (
    Arch,
    Bid,
    Checkpoint,
    Constraints,
    DataRef,
    JobSpec,
    Prices,
    Resources,
    TrustLevel,
    TrustRequirement,
)

__all__ = ["DEFAULTS", "REQUIRED", "RequestError", "bid_from_request", "resolve"]

REQUIRED = ("image", "command", "max_prices")
DEFAULTS: dict[str, Any] = {  # the control API fills these in too
    "env": {},
    "cpu_milli": 1000,
    "memory_bytes": 256 << 20,
    "disk_bytes": 0,
    "gpus": 0,
    "wall_ms": 3_600_000,
    "arch": None,
    "regions": [],
    "trust": "none",
    "inputs": [],
    "preemptible": False,
    "checkpoint_path": None,
    "name": None,
}


class RequestError(ValueError):
    """The request cannot become a bid; the message says which field and why."""


def resolve(request: dict[str, Any], store: BlobStore) -> dict[str, Any]:
    """A checked copy of ``request`` that names only digests (imports what it must)."""
    out = {**DEFAULTS, **request}
    unknown = set(out) - set(DEFAULTS) - set(REQUIRED)
    if unknown:
        raise RequestError(f"unknown request fields: {', '.join(sorted(unknown))}")
    for name in REQUIRED:
        if name not in request:
            raise RequestError(f"the request needs {name!r}")
    image = str(out["image"])
    if not image.startswith("sha256:"):
        try:
            image = import_image(store, Path(image)).manifest
        except ImageError as exc:
            raise RequestError(f"image {out['image']}: {exc}") from exc
    elif not store.has(image):
        raise RequestError(f"image {image} is not in this node's store; `cx image import` it")
    out["image"] = image
    out["inputs"] = [_input(item, store) for item in out["inputs"]]
    bid_from_request(out)  # every other field is checked by building the bid once
    return out


def _input(item: dict[str, Any], store: BlobStore) -> dict[str, Any]:
    path = item.get("path")
    if "file" in item:
        local = Path(item["file"])
        if not local.is_file():
            raise RequestError(f"input file {local} does not exist")
        digest = store.put_file(local)
        return {"path": path, "digest": digest, "size": store.size(digest)}
    if not store.has(str(item.get("digest"))):
        raise RequestError(f"input {path}: blob {item.get('digest')} is not in this node's store")
    return {"path": path, "digest": item["digest"], "size": int(item["size"])}


def bid_from_request(request: dict[str, Any]) -> Bid:
    """The bid for a resolved request. Raises RequestError naming the bad field."""
    try:
        prices = request["max_prices"]
        checkpoint = request.get("checkpoint_path")
        return Bid(
            job=JobSpec(
                image=request["image"],
                command=tuple(str(c) for c in request["command"]),
                env={str(k): str(v) for k, v in request.get("env", {}).items()},
                inputs=tuple(
                    DataRef(digest=i["digest"], path=i["path"], size=int(i["size"]))
                    for i in request.get("inputs", [])
                ),
                wall_ms=int(request.get("wall_ms", DEFAULTS["wall_ms"])),
            ),
            resources=Resources(
                cpu_milli=int(request.get("cpu_milli", DEFAULTS["cpu_milli"])),
                memory_bytes=int(request.get("memory_bytes", DEFAULTS["memory_bytes"])),
                disk_bytes=int(request.get("disk_bytes", 0)),
                gpus=int(request.get("gpus", 0)),
            ),
            max_prices=Prices(
                cpu_core_hour=int(prices["cpu_core_hour"]),
                memory_gib_hour=int(prices.get("memory_gib_hour", 0)),
                disk_gib_hour=int(prices.get("disk_gib_hour", 0)),
                gpu_hour=int(prices.get("gpu_hour", 0)),
            ),
            constraints=Constraints(
                arch=Arch(request["arch"]) if request.get("arch") else None,
                regions=tuple(request.get("regions", ())),
                trust=TrustRequirement(level=TrustLevel(request.get("trust", "none"))),
            ),
            preemptible=bool(request.get("preemptible", False)),
            checkpoint=Checkpoint(path=checkpoint) if checkpoint else None,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise RequestError(f"bad job request: {exc}") from exc
