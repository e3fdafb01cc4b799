"""A job's data, wherever it lives: bring the image and inputs into the store before the
run, send the outputs to the job's prefix after it (spec/messages.md, "Data in registries
and object stores").

Rules:
- The image comes from the job's registry (``JobSpec.registry``, pulled and verified by
  node.storage.registry) or else from the buyer peer; inputs with a ``url`` from there
  (node.storage.objects), the others and a checkpoint to resume from from the buyer peer.
  Everything lands in the store under its digest, verified, before the job runs.
- :class:`ContentError` says whose fault a failure is: ``buyer_fault`` when the job named
  something that does not exist, is refused to the credentials it gave, or is other content
  (the job ends ``bad-input``); otherwise the provider's (a registry, store or peer that
  cannot be reached), and the buyer may try elsewhere.
- Outputs go to ``output_to`` + their path under ``output_path``. An upload that fails is
  logged and the output keeps no ``url``: it stays in the store, to travel peer to peer.
"""

from __future__ import annotations

import dataclasses
import logging
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import httpx

from node.net.transport import Network, NetworkError, PeerId
from node.storage import transfer
from node.storage.fetching import FetchError
from node.storage.home import S3Config
from node.storage.image import host_arch
from node.storage.objects import ObjectError, S3Keys, fetch_object, put_object
from node.storage.registry import Login, parse_ref, pull_image
from node.storage.store import BlobStore
from protocol.messages import DataRef, JobSpec

__all__ = [
    "ContentError",
    "Credentials",
    "Sources",
    "fetch_job_content",
    "job_blobs",
    "upload_outputs",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class Credentials:
    """What a job may use to reach its data: a registry login, S3 keys. Never logged."""

    registry: Login | None = None
    s3: S3Keys | None = None

    def names(self) -> tuple[str, ...]:
        """The names a JobSpec's ``secrets`` lists for these, sorted."""
        return tuple(n for n, v in (("registry", self.registry), ("s3", self.s3)) if v)


class ContentError(Exception):
    """The job's content could not be had; ``buyer_fault`` says whose fault that is."""

    def __init__(self, message: str, *, buyer_fault: bool) -> None:
        super().__init__(message)
        self.buyer_fault = buyer_fault


@dataclass(frozen=True, slots=True, kw_only=True)
class Sources:
    """Where a provider finds what a job does not carry a URL for, and how it signs."""

    net: Network
    buyer: PeerId
    s3: S3Config | None = None
    arch: str = dataclasses.field(default_factory=host_arch)


async def fetch_job_content(
    store: BlobStore,
    job: JobSpec,
    sources: Sources,
    *,
    resume_from: str | None = None,
    credentials: Credentials = Credentials(),
    now: datetime,
    client: httpx.AsyncClient | None = None,
) -> JobSpec:
    """Bring everything ``job`` needs into ``store``; return the job as the executor runs
    it (``image`` is the manifest digest, resolved from an index for this architecture).

    Raises:
        ContentError: see the module docstring.
    """
    try:
        if job.registry is not None:
            ref = parse_ref(f"{job.registry}@{job.image}")
            image = await pull_image(
                store, ref, login=credentials.registry, arch=sources.arch, client=client
            )
            job = dataclasses.replace(job, image=image.manifest)
        elif not (store.lookup(job.image) and _pinned(store, job.image)):
            await transfer.fetch_image(sources.net, store, job.image, [sources.buyer])
        for ref_ in job.inputs:
            if ref_.url is not None:
                await fetch_object(
                    store, ref_.url, digest=ref_.digest, size=ref_.size, s3=sources.s3,
                    keys=credentials.s3, now=now, client=client,
                )  # fmt: skip
            elif not store.lookup(ref_.digest):
                await transfer.fetch_blob(sources.net, store, ref_.digest, [sources.buyer])
        if resume_from is not None and not store.lookup(resume_from):
            await transfer.fetch_blob(sources.net, store, resume_from, [sources.buyer])
    except FetchError as exc:
        raise ContentError(str(exc), buyer_fault=exc.buyer_fault) from exc
    except (transfer.TransferError, NetworkError) as exc:
        raise ContentError(f"from the buyer: {exc}", buyer_fault=False) from exc
    return job


def job_blobs(store: BlobStore, job: JobSpec, resume_from: str | None = None) -> set[str]:
    """Every blob a fetched job runs on: its image (as pinned) and inputs, its checkpoint."""
    image = store.refs().get(f"image/{job.image.removeprefix('sha256:')}", [job.image])
    extra = [resume_from] if resume_from is not None else []
    return {*image, *(i.digest for i in job.inputs), *extra}


def _pinned(store: BlobStore, manifest: str) -> bool:
    """Is the image complete in the store (pinned, every blob present)?"""
    blobs = store.refs().get(f"image/{manifest.removeprefix('sha256:')}")
    return blobs is not None and all(store.has(d) for d in blobs)


async def upload_outputs(
    store: BlobStore,
    outputs: Sequence[DataRef],
    *,
    output_path: str,
    output_to: str,
    s3: S3Config | None,
    keys: S3Keys | None,
    now: datetime,
    client: httpx.AsyncClient | None = None,
) -> tuple[DataRef, ...]:
    """Upload each output under ``output_to``; the outputs, each with the ``url`` it was
    uploaded to, or without one where the upload failed (logged)."""
    done = []
    for ref in outputs:
        try:
            uploaded = dataclasses.replace(
                ref, url=output_to + posixpath.relpath(ref.path, output_path)
            )
            assert uploaded.url is not None
            await put_object(
                store, ref.digest, uploaded.url, s3=s3, keys=keys, now=now, client=client
            )
        except (ObjectError, ValueError) as exc:  # ValueError: a name no URL can carry
            log.warning("output %s stays with the provider, not uploaded: %s", ref.path, exc)
            done.append(ref)
            continue
        done.append(uploaded)
    return tuple(done)
