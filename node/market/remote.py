"""The parts of a job request that live outside the buyer's node: a registry image, inputs
at URLs, an output prefix, and the credentials for them (spec/messages.md, "Data in
registries and object stores").

:func:`resolve_remote` runs before :func:`node.market.request.resolve`. It pins every
``s3://`` input given without a digest by content, reading it once from the node's
configured endpoint and hashing it; an ``s3://bucket/prefix/`` becomes one input per object
under it (at the input's path joined with the object's key below the prefix). Any other URL
must come with its digest and size: the node reads no address a request names but its own
S3 endpoint's. It names the secrets the job has (``secrets``),
whose values travel on in ``credentials``, which a request never serialises: the node keeps
them in memory and stores the request without them. A registry image needs nothing here:
the bid names it by digest and the provider pulls it. Errors are :class:`RequestError`.
"""

from __future__ import annotations

import posixpath
from datetime import datetime

import httpx

from node.market.request import Input, JobRequest, RequestError
from node.storage.fetching import FetchError
from node.storage.home import S3Config
from node.storage.objects import S3Keys, hash_object, list_prefix, parse_url

__all__ = ["resolve_remote"]


async def resolve_remote(
    request: JobRequest,
    *,
    s3: S3Config | None,
    now: datetime,
    client: httpx.AsyncClient | None = None,
) -> JobRequest:
    """The request with its URL inputs pinned and its secrets named.

    Raises:
        RequestError: an input that cannot be read (naming it and why).
    """
    credentials = request.credentials.credentials() if request.credentials else None
    keys = credentials.s3 if credentials is not None else None
    inputs: list[Input] = []
    for item in request.inputs:
        if item.url is not None and item.digest is None:
            inputs += await _pin(item, item.url, s3=s3, keys=keys, now=now, client=client)
        else:
            inputs.append(item)
    names = credentials.names() if credentials is not None else ()
    return request.model_copy(update={"inputs": tuple(inputs), "secrets": names or None})


async def _pin(
    item: Input,
    url: str,
    *,
    s3: S3Config | None,
    keys: S3Keys | None,
    now: datetime,
    client: httpx.AsyncClient | None,
) -> list[Input]:
    """One URL input as inputs pinned by digest (a prefix as one per object)."""
    if not url.startswith("s3://"):
        # Only the node's own S3 endpoint is read at submission: any other URL could point
        # anywhere, so the user pins it (cx run hashes it on the user's machine).
        raise RequestError(f"input {url}: give its digest and size to pin its content")
    try:
        if not parse_url(url).is_prefix:
            digest, size = await hash_object(url, s3=s3, keys=keys, now=now, client=client)
            return [Input(path=item.path, url=url, digest=digest, size=size)]
        pinned = []
        for key, _ in await list_prefix(url, s3=s3, keys=keys, now=now, client=client):
            if ".." in key.split("/"):
                raise RequestError(f"input {url}: object {key!r} would leave {item.path}")
            child = url + key
            digest, size = await hash_object(child, s3=s3, keys=keys, now=now, client=client)
            path = posixpath.join(item.path, key)
            pinned.append(Input(path=path, url=child, digest=digest, size=size))
    except FetchError as exc:
        raise RequestError(f"input {url}: {exc}") from exc
    if not pinned:
        raise RequestError(f"input {url}: no objects under that prefix")
    return pinned
