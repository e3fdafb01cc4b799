"""Pull images from OCI registries (the Distribution API) into the content store.

Rules:
- A job names a registry image as ``HOST[:PORT]/REPO@sha256:<hex>``: pinned by the digest of
  a manifest or of an index (a multi-arch image). A tag alone is refused, because a bid
  names exact content; ``REPO:TAG@sha256:...`` is accepted and the tag ignored.
- Every byte is checked: the manifest (or index) against the reference's digest, the chosen
  manifest against the index entry, each config and layer against its descriptor's digest
  and size, before it becomes a blob. An index resolves to the one manifest for
  ``linux/<arch>`` (spec/content.md rule 10). A blob already in the store is not fetched
  again, and an image whose reference resolves to a pinned image needs no network at all.
- The pulled image is pinned like an imported one (``image/<hex>``, with the index), so the
  executor runs it and ``/cx/blob/1`` serves its blobs to other peers like any blob.
- Authentication is what registries do: try anonymously; on 401 answer the challenge, either
  ``Basic`` (the login, if any) or ``Bearer`` (fetch a token from the challenge's realm for
  its service and scope, with the login as basic credentials if any, and retry). Tokens are
  kept per scope for the client's lifetime. A login never appears in logs or errors.
- Loopback registries (127.0.0.0/8, ``localhost``, ``[::1]``) are spoken to over plain
  HTTP, as docker does; every other host over HTTPS.

Errors: :class:`RegistryError` (node.storage.fetching); ``buyer_fault`` tells the provider
whether the job's reference (or its login) is to blame or the registry's service.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import ipaddress
import json
import logging
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from node.storage.fetching import FetchError, FetchReason
from node.storage.image import (
    MT_DOCKER_LIST,
    MT_DOCKER_MANIFEST,
    MT_INDEX,
    MT_MANIFEST,
    ImageError,
    ImportedImage,
    host_arch,
    platform_matches,
    record_image,
)
from node.storage.store import BlobStore, CorruptBlob

__all__ = [
    "ImageRef",
    "Login",
    "RegistryError",
    "looks_like_registry_ref",
    "parse_ref",
    "pull_image",
]

log = logging.getLogger(__name__)

_MAX_MANIFEST = 4 * 1024 * 1024
_INDEXES = (MT_INDEX, MT_DOCKER_LIST)
_ACCEPT = ", ".join((MT_MANIFEST, MT_INDEX, MT_DOCKER_MANIFEST, MT_DOCKER_LIST))
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REF = re.compile(
    rf"(?P<host>(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:]+\])(?::\d{{1,5}})?)"
    rf"/(?P<repo>{_COMPONENT}(?:/{_COMPONENT})*)"
    rf"(?::(?P<tag>[\w][\w.-]{{0,127}}))?"
    rf"(?:@(?P<digest>sha256:[0-9a-f]{{64}}))?\Z"
)
_CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')


class RegistryError(FetchError):
    """An image could not be pulled."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Login:
    """Registry credentials. Never logged: the repr hides the password."""

    username: str
    password: str = field(repr=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Login | None:
        """``CX_REGISTRY_USERNAME`` and ``CX_REGISTRY_PASSWORD``, if the first is set."""
        user = environ.get("CX_REGISTRY_USERNAME")
        if not user:
            return None
        return cls(username=user, password=environ.get("CX_REGISTRY_PASSWORD", ""))


@dataclass(frozen=True, slots=True, kw_only=True)
class ImageRef:
    host: str  # host[:port]
    repository: str
    digest: str

    def __str__(self) -> str:
        return f"{self.host}/{self.repository}@{self.digest}"

    @property
    def base_url(self) -> str:
        return f"{_scheme(self.host)}://{self.host}/v2/{self.repository}"


def looks_like_registry_ref(text: str) -> bool:
    """Is ``text`` meant as a registry reference (its first component names a host), rather
    than an image name, a digest or a relative path? Docker's rule: a host has a dot or a
    port, or is ``localhost``."""
    first, slash, _ = text.partition("/")
    return (
        bool(slash)
        and ("." in first or ":" in first or first == "localhost")
        and (not first.startswith("."))
    )


def parse_ref(text: str) -> ImageRef:
    """``HOST[:PORT]/REPO@sha256:<hex>`` as an ImageRef.

    Raises:
        RegistryError: BAD_REFERENCE, saying what is wrong (a tag alone, a bad name).
    """
    m = _REF.match(text.strip())
    if m is None:
        raise RegistryError(
            FetchReason.BAD_REFERENCE,
            f"{text!r} is not a registry reference like registry.example:5000/repo@sha256:<hex>",
        )
    if m["digest"] is None:
        raise RegistryError(
            FetchReason.BAD_REFERENCE,
            f"{text!r} names no digest: pin the image as {m['host']}/{m['repo']}@sha256:<hex> "
            "(a bid names exact content; `skopeo inspect` shows the digest)",
        )
    return ImageRef(host=m["host"], repository=m["repo"], digest=m["digest"])


def _scheme(host: str) -> str:
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    name = name.strip("[]")
    if name == "localhost":
        return "http"
    try:
        return "http" if ipaddress.ip_address(name).is_loopback else "https"
    except ValueError:
        return "https"


async def pull_image(
    store: BlobStore,
    ref: ImageRef,
    *,
    login: Login | None = None,
    arch: str | None = None,
    client: httpx.AsyncClient | None = None,
) -> ImportedImage:
    """Pull ``ref`` into ``store`` (or find it there) and pin it; return the image.

    Raises:
        RegistryError: see FetchReason; ``buyer_fault`` says whose fault it is.
    """
    arch = arch or host_arch()
    if (cached := _cached(store, ref, arch)) is not None:
        log.info("image %s is in the store already", ref)
        return cached
    async with _client(client) as http:
        session = _Session(http, ref, login)
        top = await session.manifest(ref.digest)
        keep: tuple[str, ...] = ()
        data, doc = top
        if doc.get("mediaType") in _INDEXES or "manifests" in doc:
            store.put_bytes(data)  # verified against the reference already
            keep = (ref.digest,)
            entry = _choose(doc, ref, arch)
            data, doc = await session.manifest(entry)
        manifest_digest = _digest_of(data)
        for desc in _descriptors(doc, ref):
            if not store.lookup(desc["digest"]):
                await session.blob(store, desc["digest"], desc["size"])
            elif store.size(desc["digest"]) != desc["size"]:
                raise _bad_image(ref, f"blob {desc['digest']} is not {desc['size']} bytes")
        config = json.loads(store.read_bytes(doc["config"]["digest"]))
        if isinstance(config, dict) and config.get("architecture", arch) != arch:
            raise RegistryError(
                FetchReason.NO_PLATFORM,
                f"{ref} is a {config.get('architecture')} image; this node runs linux/{arch}",
            )
    try:
        image = record_image(store, data, doc, arch, (str(ref),), keep=keep)
    except ImageError as exc:
        raise _bad_image(ref, str(exc)) from exc
    log.info("pulled %s as %s", ref, manifest_digest)
    return image


def _cached(store: BlobStore, ref: ImageRef, arch: str) -> ImportedImage | None:
    """The image ``ref`` names, if the store holds all of it (no network needed)."""
    if not store.has(ref.digest):
        return None
    try:
        doc = json.loads(store.read_bytes(ref.digest))
        manifest = _choose(doc, ref, arch) if "manifests" in doc else ref.digest
        if not store.has(manifest):
            return None
        m_bytes = store.read_bytes(manifest)
        m_doc = json.loads(m_bytes)
        descs = _descriptors(m_doc, ref)
    except (ValueError, RegistryError, CorruptBlob):
        return None
    if not all(store.has(d["digest"]) for d in descs):
        return None
    for d in descs:
        store.lookup(d["digest"])  # hits, and uses for the LRU
    keep = (ref.digest,) if manifest != ref.digest else ()
    return record_image(store, m_bytes, m_doc, arch, (str(ref),), keep=keep)


def _choose(index: dict[str, Any], ref: ImageRef, arch: str) -> str:
    for desc in index.get("manifests") or []:
        if (
            isinstance(desc, dict)
            and desc.get("mediaType", MT_MANIFEST) in (MT_MANIFEST, MT_DOCKER_MANIFEST)
            and isinstance(desc.get("platform"), dict)
            and platform_matches(desc, arch)
            and isinstance(desc.get("digest"), str)
        ):
            digest: str = desc["digest"]
            return digest
    raise RegistryError(
        FetchReason.NO_PLATFORM, f"{ref} has no image for linux/{arch}; pick another image"
    )


def _descriptors(doc: dict[str, Any], ref: ImageRef) -> list[dict[str, Any]]:
    try:
        descs = [doc["config"], *doc["layers"]]
        for d in descs:
            if not (
                isinstance(d["digest"], str)
                and re.fullmatch(r"sha256:[0-9a-f]{64}", d["digest"])
                and type(d["size"]) is int
                and d["size"] >= 0
            ):
                raise _bad_image(ref, f"descriptor {d!r} is malformed")
    except (KeyError, TypeError) as exc:
        raise _bad_image(ref, f"not an image manifest (missing {exc})") from exc
    return descs


def _bad_image(ref: ImageRef, why: str) -> RegistryError:
    return RegistryError(FetchReason.BAD_CONTENT, f"{ref}: {why}")


def _digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@contextlib.asynccontextmanager
async def _client(given: httpx.AsyncClient | None) -> AsyncIterator[httpx.AsyncClient]:
    """The caller's client, or one of our own, closed on exit."""
    if given is not None:
        yield given
        return
    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0), follow_redirects=True) as own:
        yield own


class _Session:
    """One pull: requests to one repository, answering auth challenges as they come."""

    def __init__(self, http: httpx.AsyncClient, ref: ImageRef, login: Login | None) -> None:
        self.http = http
        self.ref = ref
        self.login = login
        self._auth: dict[str, str] = {}

    async def manifest(self, digest: str) -> tuple[bytes, dict[str, Any]]:
        url = f"{self.ref.base_url}/manifests/{digest}"
        async with self._get(url, {"Accept": _ACCEPT}, what=f"manifest {digest}") as resp:
            data = await _read_bounded(resp, _MAX_MANIFEST, self.ref)
        if _digest_of(data) != digest:
            raise RegistryError(
                FetchReason.DIGEST_MISMATCH,
                f"{self.ref}: the registry's manifest {digest} hashes to {_digest_of(data)}",
            )
        try:
            doc = json.loads(data)
        except ValueError as exc:
            raise _bad_image(self.ref, f"manifest {digest} is not JSON") from exc
        if not isinstance(doc, dict):
            raise _bad_image(self.ref, f"manifest {digest} is not a JSON object")
        return data, doc

    async def blob(self, store: BlobStore, digest: str, size: int) -> None:
        url = f"{self.ref.base_url}/blobs/{digest}"
        async with self._get(url, {}, what=f"blob {digest}") as resp:
            with store.writer(expect=digest) as w:
                async for part in resp.aiter_bytes():
                    w.write(part)
                    if w.size > size:
                        raise _bad_image(self.ref, f"blob {digest} is larger than {size} bytes")
                if w.size != size:
                    raise _bad_image(self.ref, f"blob {digest} is {w.size} bytes, not {size}")
                try:
                    w.commit()
                except CorruptBlob as exc:
                    raise RegistryError(
                        FetchReason.DIGEST_MISMATCH,
                        f"{self.ref}: blob {digest} is {exc.actual} at the registry",
                    ) from exc

    @contextlib.asynccontextmanager
    async def _get(
        self, url: str, headers: dict[str, str], *, what: str
    ) -> AsyncIterator[httpx.Response]:
        resp = await self._open(url, headers, what)
        try:
            yield resp
        finally:
            await resp.aclose()

    async def _open(self, url: str, headers: dict[str, str], what: str) -> httpx.Response:
        """GET ``url``, answering one auth challenge; the caller closes the response."""
        resp = await self._send(url, headers)
        if resp.status_code == 401:
            challenge = resp.headers.get("www-authenticate", "")
            await resp.aclose()
            await self._answer(challenge)
            resp = await self._send(url, headers)
        if resp.status_code == 200:
            return resp
        await resp.aclose()
        raise _status_error(self.ref, resp.status_code, what, self.login is not None)

    async def _send(self, url: str, headers: dict[str, str]) -> httpx.Response:
        request = self.http.build_request("GET", url, headers={**headers, **self._auth})
        try:
            return await self.http.send(request, stream=True, follow_redirects=True)
        except httpx.HTTPError as exc:
            raise RegistryError(
                FetchReason.UNREACHABLE, f"registry {self.ref.host} unreachable: {exc}"
            ) from exc

    async def _answer(self, challenge: str) -> None:
        scheme, _, rest = challenge.strip().partition(" ")
        if scheme.lower() == "basic":
            if self.login is None:
                raise _unauthorized(self.ref, False)
            self._auth = {"Authorization": _basic(self.login)}
            return
        if scheme.lower() != "bearer":
            raise RegistryError(
                FetchReason.SERVER_FAILED,
                f"registry {self.ref.host} asks for unsupported auth {scheme or '(none)'!r}",
            )
        params = dict(_CHALLENGE_PARAM.findall(rest))
        realm = params.pop("realm", "")
        if not realm.startswith(("https://", "http://")):
            raise RegistryError(
                FetchReason.SERVER_FAILED, f"registry {self.ref.host} gave no token realm"
            )
        params.setdefault("scope", f"repository:{self.ref.repository}:pull")
        headers = {"Authorization": _basic(self.login)} if self.login is not None else {}
        try:
            resp = await self.http.get(realm, params=params, headers=headers)
        except httpx.HTTPError as exc:
            raise RegistryError(
                FetchReason.UNREACHABLE, f"token service of {self.ref.host}: {exc}"
            ) from exc
        if resp.status_code in (401, 403):
            raise _unauthorized(self.ref, self.login is not None)
        try:
            body = resp.json()
            token = body.get("token") or body.get("access_token")
        except ValueError:
            token = None
        if resp.status_code != 200 or not isinstance(token, str) or not token:
            raise RegistryError(
                FetchReason.SERVER_FAILED,
                f"token service of {self.ref.host} answered {resp.status_code} without a token",
            )
        self._auth = {"Authorization": f"Bearer {token}"}


async def _read_bounded(resp: httpx.Response, limit: int, ref: ImageRef) -> bytes:
    parts, total = [], 0
    async for part in resp.aiter_bytes():
        total += len(part)
        if total > limit:
            raise _bad_image(ref, f"a manifest is larger than {limit} bytes")
        parts.append(part)
    return b"".join(parts)


def _basic(login: Login) -> str:
    raw = f"{login.username}:{login.password}".encode()
    return "Basic " + base64.b64encode(raw).decode()


def _unauthorized(ref: ImageRef, had_login: bool) -> RegistryError:
    if had_login:
        return RegistryError(FetchReason.DENIED, f"registry {ref.host} refused the login for {ref}")
    return RegistryError(
        FetchReason.DENIED,
        f"registry {ref.host} needs a login for {ref}: set CX_REGISTRY_USERNAME and "
        "CX_REGISTRY_PASSWORD",
    )


def _status_error(ref: ImageRef, status: int, what: str, had_login: bool) -> RegistryError:
    if status in (401, 403):
        return _unauthorized(ref, had_login)
    if status == 404:
        return RegistryError(FetchReason.NOT_FOUND, f"{ref}: the registry has no {what}")
    if status >= 500:
        return RegistryError(
            FetchReason.SERVER_FAILED, f"registry {ref.host} failed ({status}) on {what}"
        )
    return RegistryError(
        FetchReason.SERVER_FAILED, f"registry {ref.host} answered {status} for {what}"
    )
