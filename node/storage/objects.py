"""Job data in object stores: fetch inputs from URLs, list S3 prefixes, upload outputs.

Rules:
- A URL is ``https://...``, ``http://...``, ``s3://BUCKET/KEY`` or ``s3://BUCKET/PREFIX/``
  (every object under the prefix; only where a listing is asked for). ``s3://`` goes to the
  node's configured endpoint (``[s3]`` in config.toml), path-style (``ENDPOINT/BUCKET/KEY``),
  which AWS, MinIO, Ceph and moto all serve.
- Requests to S3 are signed with AWS Signature Version 4 (``sigv4_headers``), when keys
  are given; without keys they go unsigned (public buckets). The payload of an upload is
  named by its sha256, which every output blob already is, so nothing is read twice.
- Content is checked before it is used: an input is streamed into the store under the
  digest the job named and refused (nothing kept) if it hashes to anything else or its size
  is not the one named; a body longer than that is cut off as soon as it is.
- Whose fault: a URL that names nothing, refuses the keys, or serves other content is the
  buyer's (``ObjectError.buyer_fault``); a server that is down or fails (5xx) is not.
- Keys never appear in logs, errors or reprs.

Errors: :class:`ObjectError` (node.storage.fetching).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import urllib.parse
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime

import httpx
import trio

from node.storage.fetching import FetchError, FetchReason
from node.storage.home import S3Config
from node.storage.store import BlobStore, CorruptBlob

__all__ = [
    "ObjectError",
    "ObjectUrl",
    "S3Keys",
    "fetch_object",
    "hash_object",
    "list_prefix",
    "parse_url",
    "put_object",
    "sigv4_headers",
]

log = logging.getLogger(__name__)

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_S3_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
_MAX_LISTING_PAGE = 16 * 1024 * 1024
_MAX_KEYS = 100_000


class ObjectError(FetchError):
    """An object could not be fetched, listed or stored."""


@dataclass(frozen=True, slots=True, kw_only=True)
class S3Keys:
    """S3 credentials (for one prefix, ideally). Never logged: the repr hides the secret."""

    access_key: str
    secret_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> S3Keys | None:
        """The standard ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
        ``AWS_SESSION_TOKEN``, if the first is set."""
        access = environ.get("AWS_ACCESS_KEY_ID")
        if not access:
            return None
        return cls(
            access_key=access,
            secret_key=environ.get("AWS_SECRET_ACCESS_KEY", ""),
            session_token=environ.get("AWS_SESSION_TOKEN") or None,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ObjectUrl:
    """A parsed URL: ``s3`` with bucket and key (a prefix when it ends in ``/``), or
    ``http``/``https`` with the URL itself."""

    scheme: str
    url: str
    bucket: str = ""
    key: str = ""

    @property
    def is_prefix(self) -> bool:
        return self.scheme == "s3" and (self.key == "" or self.key.endswith("/"))

    def child(self, name: str) -> ObjectUrl:
        """The object ``name`` (relative) under this prefix."""
        return parse_url(f"s3://{self.bucket}/{self.key}{name}")


def parse_url(text: str) -> ObjectUrl:
    """Raises ObjectError(BAD_URL) saying what a usable URL looks like."""
    parts = urllib.parse.urlsplit(text)
    if parts.scheme in ("http", "https") and parts.netloc:
        return ObjectUrl(scheme=parts.scheme, url=text)
    if parts.scheme == "s3" and parts.netloc and not parts.query and not parts.fragment:
        key = parts.path.removeprefix("/")
        if any(seg in (".", "..") for seg in key.split("/")):
            raise ObjectError(FetchReason.BAD_REFERENCE, f"{text!r}: a key may not hold . or ..")
        return ObjectUrl(scheme="s3", url=text, bucket=parts.netloc, key=key)
    raise ObjectError(
        FetchReason.BAD_REFERENCE,
        f"{text!r} is not a URL like https://host/file, s3://bucket/key or s3://bucket/prefix/",
    )


# -- AWS Signature Version 4 ------------------------------------------------------------------


def sigv4_headers(
    method: str,
    url: str,
    *,
    keys: S3Keys,
    region: str,
    payload_sha256: str,
    now: datetime,
    service: str = "s3",
    headers: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The headers that sign a request (``Authorization``, ``x-amz-date``,
    ``x-amz-content-sha256``, and ``x-amz-security-token`` with a session token).
    ``url`` must be exactly the URL sent, its path URI-encoded once; ``now`` in UTC."""
    parts = urllib.parse.urlsplit(url)
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    day = amz_date[:8]
    signed: dict[str, str] = {k.lower(): " ".join(v.split()) for k, v in (headers or {}).items()}
    signed["host"] = parts.netloc
    signed["x-amz-date"] = amz_date
    signed["x-amz-content-sha256"] = payload_sha256
    if keys.session_token:
        signed["x-amz-security-token"] = keys.session_token
    names = sorted(signed)
    query = sorted(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    canonical = "\n".join(
        [
            method,
            parts.path or "/",  # S3 signs the path as sent, URI-encoded once
            "&".join(f"{_q(k)}={_q(v)}" for k, v in query),
            "".join(f"{n}:{signed[n]}\n" for n in names),
            ";".join(names),
            payload_sha256,
        ]
    )
    scope = f"{day}/{region}/{service}/aws4_request"
    to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = ("AWS4" + keys.secret_key).encode()
    for part in (day, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    out = {k: v for k, v in signed.items() if k != "host"}
    out["Authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={keys.access_key}/{scope}, "
        f"SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    return out


def _q(text: str) -> str:
    return urllib.parse.quote(text, safe="-_.~")


# -- requests -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class _Target:
    """Where an object lives and how to ask for it."""

    s3: S3Config | None
    keys: S3Keys | None
    now: datetime

    def http_url(self, obj: ObjectUrl, query: str = "") -> str:
        if obj.scheme != "s3":
            return obj.url
        if self.s3 is None:
            raise ObjectError(
                FetchReason.BAD_REFERENCE,
                f"{obj.url}: this node has no S3 endpoint; set [s3] endpoint in config.toml",
            )
        path = urllib.parse.quote(f"/{obj.bucket}/{obj.key}", safe="/-_.~")
        base = self.s3.endpoint.rstrip("/") + path
        return f"{base}?{query}" if query else base

    def headers(self, method: str, url: str, obj: ObjectUrl, payload: str) -> dict[str, str]:
        if obj.scheme != "s3" or self.keys is None or self.s3 is None:
            return {}
        return sigv4_headers(
            method, url, keys=self.keys, region=self.s3.region, payload_sha256=payload,
            now=self.now,
        )  # fmt: skip


@contextlib.asynccontextmanager
async def _client(given: httpx.AsyncClient | None) -> AsyncIterator[httpx.AsyncClient]:
    if given is not None:
        yield given
        return
    async with httpx.AsyncClient(timeout=httpx.Timeout(60.0), follow_redirects=True) as own:
        yield own


@contextlib.asynccontextmanager
async def _get(
    http: httpx.AsyncClient, target: _Target, obj: ObjectUrl, query: str = ""
) -> AsyncIterator[httpx.Response]:
    url = target.http_url(obj, query)
    request = http.build_request("GET", url, headers=target.headers("GET", url, obj, EMPTY_SHA256))
    try:
        resp = await http.send(request, stream=True)
    except httpx.HTTPError as exc:
        raise ObjectError(FetchReason.UNREACHABLE, f"{obj.url}: unreachable: {exc}") from exc
    try:
        if resp.status_code != 200:
            raise _status_error(obj.url, resp.status_code)
        yield resp
    finally:
        await resp.aclose()


def _status_error(url: str, status: int) -> ObjectError:
    if status == 404:
        return ObjectError(FetchReason.NOT_FOUND, f"{url}: no such object (404)")
    if status in (401, 403):
        return ObjectError(FetchReason.DENIED, f"{url}: access denied ({status}); check the keys")
    if status >= 500:
        return ObjectError(FetchReason.SERVER_FAILED, f"{url}: the server failed ({status})")
    return ObjectError(FetchReason.NOT_FOUND, f"{url}: answered {status}")


async def fetch_object(
    store: BlobStore,
    url: str,
    *,
    digest: str,
    size: int,
    s3: S3Config | None = None,
    keys: S3Keys | None = None,
    now: datetime,
    client: httpx.AsyncClient | None = None,
) -> None:
    """Stream the object at ``url`` into ``store`` as ``digest`` (``size`` bytes); a blob
    already in the store is not fetched again.

    Raises:
        ObjectError: DIGEST_MISMATCH when the content is not ``digest`` (nothing is kept),
            NOT_FOUND, DENIED, BAD_URL, UNREACHABLE, SERVER_FAILED.
    """
    if store.lookup(digest):
        return
    obj = parse_url(url)
    target = _Target(s3=s3, keys=keys, now=now)
    async with _client(client) as http, _get(http, target, obj) as resp:
        with store.writer(expect=digest) as w:
            async for part in resp.aiter_bytes():
                w.write(part)
                if w.size > size:
                    raise _mismatch(url, f"is larger than the {size} bytes named")
            if w.size != size:
                raise _mismatch(url, f"is {w.size} bytes, not the {size} named")
            try:
                w.commit()
            except CorruptBlob as exc:
                raise _mismatch(url, f"is {exc.actual}, not the {digest} named") from exc
    log.info("fetched %s (%d bytes) as %s", url, size, digest)


def _mismatch(url: str, what: str) -> ObjectError:
    return ObjectError(FetchReason.DIGEST_MISMATCH, f"{url} {what}")


async def hash_object(
    url: str,
    *,
    s3: S3Config | None = None,
    keys: S3Keys | None = None,
    now: datetime,
    client: httpx.AsyncClient | None = None,
) -> tuple[str, int]:
    """The digest and size of the object at ``url``, read once and not kept (a buyer pins
    its inputs' content this way). Raises ObjectError."""
    obj = parse_url(url)
    h, size = hashlib.sha256(), 0
    async with _client(client) as http, _get(http, _Target(s3=s3, keys=keys, now=now), obj) as r:
        async for part in r.aiter_bytes():
            h.update(part)
            size += len(part)
    return "sha256:" + h.hexdigest(), size


async def list_prefix(
    url: str,
    *,
    s3: S3Config | None,
    keys: S3Keys | None = None,
    now: datetime,
    client: httpx.AsyncClient | None = None,
) -> list[tuple[str, int]]:
    """Every object under an ``s3://BUCKET/PREFIX/`` as (key relative to the prefix, size),
    sorted by key (ListObjectsV2, page by page). Raises ObjectError."""
    prefix = parse_url(url)
    if not prefix.is_prefix:
        raise ObjectError(FetchReason.BAD_REFERENCE, f"{url!r} is not an s3://bucket/prefix/")
    bucket = ObjectUrl(scheme="s3", url=f"s3://{prefix.bucket}/", bucket=prefix.bucket)
    target = _Target(s3=s3, keys=keys, now=now)
    found: list[tuple[str, int]] = []
    token: str | None = None
    async with _client(client) as http:
        while True:
            params = [("list-type", "2"), ("prefix", prefix.key)]
            if token is not None:
                params.append(("continuation-token", token))
            query = "&".join(f"{_q(k)}={_q(v)}" for k, v in sorted(params))
            async with _get(http, target, bucket, query) as resp:
                body = await resp.aread()
            if len(body) > _MAX_LISTING_PAGE:
                raise ObjectError(FetchReason.SERVER_FAILED, f"{url}: listing page too large")
            page, token = _parse_listing(body, url)
            found += [(key.removeprefix(prefix.key), n) for key, n in page]
            if len(found) > _MAX_KEYS:
                raise ObjectError(
                    FetchReason.BAD_REFERENCE, f"{url} holds over {_MAX_KEYS} objects"
                )
            if token is None:
                break
    # "Directory" markers (keys ending in /) are not objects a job can read.
    return sorted((k, n) for k, n in found if k and not k.endswith("/"))


def _parse_listing(body: bytes, url: str) -> tuple[list[tuple[str, int]], str | None]:
    try:
        # The endpoint is the node's own configured S3 service; expat >= 2.4 (checked by
        # CPython's build) bounds entity expansion.
        root = ET.fromstring(body)  # noqa: S314
        page = [
            (item.findtext(f"{_S3_NS}Key") or "", int(item.findtext(f"{_S3_NS}Size") or "0"))
            for item in root.iter(f"{_S3_NS}Contents")
        ]
    except (ET.ParseError, ValueError) as exc:
        raise ObjectError(FetchReason.SERVER_FAILED, f"{url}: unreadable listing: {exc}") from exc
    truncated = (root.findtext(f"{_S3_NS}IsTruncated") or "").lower() == "true"
    token = root.findtext(f"{_S3_NS}NextContinuationToken") if truncated else None
    if truncated and not token:
        raise ObjectError(FetchReason.SERVER_FAILED, f"{url}: truncated listing without token")
    return page, token


async def put_object(
    store: BlobStore,
    digest: str,
    url: str,
    *,
    s3: S3Config | None,
    keys: S3Keys | None,
    now: datetime,
    client: httpx.AsyncClient | None = None,
) -> None:
    """Upload the blob ``digest`` to ``s3://BUCKET/KEY`` (one PUT, up to 5 GiB).

    Raises:
        ObjectError: DENIED (the keys do not allow it), NOT_FOUND (no such bucket),
            BAD_URL, UNREACHABLE, SERVER_FAILED.
    """
    obj = parse_url(url)
    if obj.scheme != "s3" or obj.is_prefix:
        raise ObjectError(FetchReason.BAD_REFERENCE, f"{url!r}: outputs go to s3://bucket/key")
    target = _Target(s3=s3, keys=keys, now=now)
    http_url = target.http_url(obj)
    size = store.size(digest)
    headers = target.headers("PUT", http_url, obj, digest.removeprefix("sha256:"))
    headers["Content-Length"] = str(size)

    async def body() -> AsyncIterator[bytes]:
        async with await trio.open_file(store.path(digest), "rb") as f:
            while block := await f.read(1 << 20):
                yield block

    async with _client(client) as http:
        try:
            resp = await http.put(http_url, headers=headers, content=body())
        except httpx.HTTPError as exc:
            raise ObjectError(FetchReason.UNREACHABLE, f"{url}: unreachable: {exc}") from exc
    if resp.status_code not in (200, 201, 204):
        raise _status_error(url, resp.status_code)
    log.info("uploaded %s (%d bytes) to %s", digest, size, url)
