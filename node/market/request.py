"""A user's job request and the bid made from it.

:class:`JobRequest` is the one typed form of "run this for me": the control API parses its
``POST /v1/jobs`` body into it (:func:`parse_request`), ``cx run`` builds one from its flags
with the same validation, and the buyer stores it with the job. Past the edge nobody handles
a dict: a request is checked once, when it is made.

:func:`resolve` brings what a request names into the node's store (an image given as a
path is imported, input files are stored), after which it names only digests and can be
turned into the same bid again after a fault (:func:`bid_from_request`). Errors are
:class:`RequestError`, one line naming the field and what to do.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Literal

import pydantic
import pydantic_core
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic.fields import FieldInfo

from node.storage.fetching import FetchError
from node.storage.image import ImageError, import_image
from node.storage.jobdata import Credentials
from node.storage.objects import S3Keys as storage_keys
from node.storage.objects import parse_url
from node.storage.registry import Login, looks_like_registry_ref, parse_ref
from node.storage.store import BlobStore
from protocol.elastic import ceiling, check_elastic, elastic_of
from protocol.envelope import check_sealable
from protocol.errors import DecodeError, InvalidMessage
from protocol.identity import PublicKey
from protocol.limits import LIMITS, OutOfBounds, check_limits
from protocol.messages import (
    Arch,
    Bid,
    Checkpoint,
    Constraints,
    DataRef,
    DataSite,
    HardwareRequirement,
    JobSpec,
    Prices,
    Resources,
    TrustLevel,
    TrustRequirement,
)
from protocol.settlement import quote

__all__ = [
    "Input",
    "JobRequest",
    "MaxPrices",
    "RequestError",
    "Secrets",
    "bid_from_request",
    "build_request",
    "parse_request",
    "resolve",
]

_INT_MAX = 2**63 - 1  # what every integer field of a message can hold
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


class RequestError(ValueError):
    """The request cannot become a bid; the message says which field and why. ``code`` is
    ``bad-json`` when the text is not JSON at all, else ``bad-request``."""

    def __init__(self, message: str, code: str = "bad-request") -> None:
        super().__init__(message)
        self.code = code


def _utf8(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("is not valid text (it holds a lone surrogate)") from None
    return text


def _registry_image(text: str) -> str:
    if text.startswith(("sha256:", "/")):
        return text
    try:
        parse_ref(text)
    except FetchError as exc:
        raise ValueError(str(exc)) from None
    return text


def _url(text: str) -> str:
    try:
        parse_url(text)
    except FetchError as exc:
        raise ValueError(str(exc)) from None
    return text


def _prefix(text: str) -> str:
    if not _url(text).startswith("s3://") or not parse_url(text).is_prefix:
        raise ValueError(f"must be an s3://bucket/prefix/ ending in /, not {text!r}")
    return text


Text = Annotated[str, Field(min_length=1), AfterValidator(_utf8)]
# The JSON Schema states these rules too, so the OpenAPI document says what is accepted.
AbsPath = Annotated[str, Field(pattern=r"^/[^\x00]*$"), AfterValidator(_utf8)]
ImageRef = Annotated[
    str,
    # a digest in the store, an OCI path, or a registry image HOST[:PORT]/REPO@sha256:<hex>
    # (checked in full by _registry_image, which says how to pin a tagged one)
    Field(pattern=r"^(sha256:[0-9a-f]{64}|/[^\x00]*|[A-Za-z0-9.\[\]:-]+/[^\s\x00]+)$"),
    AfterValidator(_utf8),
    AfterValidator(_registry_image),
]
Url = Annotated[str, Field(pattern=r"^(https?|s3)://[^\s\x00]+$"), AfterValidator(_url)]
Digest = Annotated[str, Field(pattern=_DIGEST.pattern)]
Count = Annotated[int, Field(ge=0, le=_INT_MAX)]


def _within(limit: str) -> FieldInfo:
    """The bounds protocol/limits.py sets for ``limit``, for the schema and the parser."""
    bounds = LIMITS[limit]
    field: FieldInfo = Field(ge=bounds.minimum, le=bounds.maximum)
    return field


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class MaxPrices(_Frozen):
    """The most the buyer pays per unit, in micro-credits (see protocol.messages.Prices)."""

    cpu_core_hour: Count
    memory_gib_hour: Count = 0
    disk_gib_hour: Count = 0
    gpu_hour: Count = 0


class Input(_Frozen):
    """Content readable at ``path`` in the job: a local ``file`` on the node's machine
    (stored when the request is resolved), a blob in the node's store (``digest`` and
    ``size``), or a ``url`` the provider fetches (``https://``, ``http://``,
    ``s3://bucket/key``; ``s3://bucket/prefix/`` for every object under it, placed under
    ``path``), pinned by ``digest`` and ``size`` when the node resolves it."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        strict=True,
        json_schema_extra={
            "oneOf": [
                {"required": ["path", "file"], "not": {"required": ["digest"]}},
                {
                    "required": ["path", "digest", "size"],
                    "not": {"anyOf": [{"required": ["file"]}, {"required": ["url"]}]},
                },
                {"required": ["path", "url"], "not": {"required": ["file"]}},
            ]
        },
    )

    path: AbsPath
    file: AbsPath | None = None
    url: Url | None = None
    digest: Digest | None = None
    size: Count | None = None

    @model_validator(mode="after")
    def _one_source(self) -> Input:
        if (self.digest is None) != (self.size is None):
            raise ValueError("give digest and size together")
        if self.url is not None:
            if self.file is not None:
                raise ValueError("give either file or url")
            return self
        if (self.file is None) == (self.digest is None):
            raise ValueError("give either file, url, or digest and size")
        return self


class RegistryLogin(_Frozen):
    username: Text
    password: pydantic.SecretStr


class S3Keys(_Frozen):
    access_key: Text
    secret_key: pydantic.SecretStr
    session_token: pydantic.SecretStr | None = None


class Secrets(_Frozen):
    """What the job's data needs: a registry login, S3 keys (for its prefixes only,
    ideally). Sealed to the provider after the agreement; never stored, shown or logged."""

    registry: RegistryLogin | None = None
    s3: S3Keys | None = None

    def revealed(self) -> dict[str, dict[str, str]]:
        """The plain JSON value, for the one request that carries it to the node."""
        out: dict[str, dict[str, str]] = {}
        if (login := self.registry) is not None:
            out["registry"] = {
                "username": login.username,
                "password": login.password.get_secret_value(),
            }
        if (keys := self.s3) is not None:
            out["s3"] = {
                "access_key": keys.access_key,
                "secret_key": keys.secret_key.get_secret_value(),
            }
            if keys.session_token is not None:
                out["s3"]["session_token"] = keys.session_token.get_secret_value()
        return out

    def credentials(self) -> Credentials:
        login, keys = self.registry, self.s3
        return Credentials(
            registry=None
            if login is None
            else Login(username=login.username, password=login.password.get_secret_value()),
            s3=None
            if keys is None
            else storage_keys(
                access_key=keys.access_key,
                secret_key=keys.secret_key.get_secret_value(),
                session_token=(
                    None if keys.session_token is None else keys.session_token.get_secret_value()
                ),
            ),
        )


def _peer_id(text: str) -> str:
    try:
        PublicKey.from_peer_id(text)
    except InvalidMessage:
        raise ValueError("must be a peer id like 12D3KooW... (see `cx peers`)") from None
    return text


class JobRequest(_Frozen):
    """What to run, with what, for how much, and where it may run."""

    image: ImageRef
    command: tuple[Text, ...] = Field(min_length=1)
    max_prices: MaxPrices
    env: dict[Annotated[Text, Field(pattern=r"^[^=]+$")], Annotated[str, AfterValidator(_utf8)]] = (
        Field(default_factory=dict)
    )
    cpu_milli: Annotated[int, _within("resources.cpu_milli")] = 1000
    memory_bytes: Annotated[int, _within("resources.memory_bytes")] = 256 << 20
    disk_bytes: Annotated[int, _within("resources.disk_bytes")] = 0
    gpus: Annotated[int, _within("resources.gpus")] = 0
    wall_ms: Annotated[int, _within("job.wall_ms")] = 3_600_000
    # Elastic ceilings (spec/workloads.md "Elastic jobs"); 0: that resource stays as reserved.
    elastic_memory_bytes: Count = 0
    elastic_cpu_milli: Count = 0
    # Hardware the machine must have (spec/workloads.md "Hardware"): model text, flags,
    # the least kernel release.
    cpu_model: Text | None = None
    cpu_flags: tuple[Annotated[Text, Field(pattern=r"^[a-z0-9_.]+$")], ...] = ()
    min_kernel: Annotated[Text, Field(pattern=r"^[0-9]+(\.[0-9]+)*$")] | None = None
    arch: Arch | None = None
    regions: tuple[Text, ...] = ()
    trust: TrustLevel = TrustLevel.NONE
    # Parts per million of the buyer node's trust (spec/reputation.md); 0 takes anyone.
    min_reputation: Annotated[int, Field(ge=0, le=1_000_000)] = 0
    inputs: tuple[Input, ...] = ()
    preemptible: bool = False
    checkpoint_path: AbsPath | None = None
    name: Text | None = None
    # Trade with this provider only (its peer id, 12D3KooW...)
    provider: Annotated[Text, AfterValidator(_peer_id)] | None = None
    # The most to pay per unit of work (spec/work.md): only offers stating a score fit
    max_work_price: Annotated[int, Field(ge=1, le=2**53)] | None = None
    # Trade within this long: the bid starts lower and climbs to max_prices (spec/pricing.md)
    deadline_ms: Annotated[int, Field(ge=1000, le=30 * 86_400_000)] | None = None
    output_to: Annotated[Text, AfterValidator(_prefix)] | None = None  # s3://bucket/prefix/
    # The secrets the job has (set by the node from ``credentials``; the bid names them).
    secrets: tuple[Literal["registry", "s3"], ...] | None = None
    # Never serialised: not stored with the job, not in any view (see node.market.remote).
    credentials: Secrets | None = Field(default=None, exclude=True)
    # Where the job's data lives (spec/matching.md "Transfer cost"): its region, its size
    # (unset: the image and inputs as this node knows them), what the region charges per
    # GiB sent out, the outputs expected back, and the most moving it may cost (micro-
    # credits). Matching then counts the cost of moving it to each provider.
    data_region: Text | None = None
    data_bytes: Count | None = None
    data_egress_gib: Count = 0
    output_bytes: Count = 0
    egress_budget: Count | None = None

    @model_validator(mode="after")
    def _data_site(self) -> JobRequest:
        stated = [
            name
            for name in ("data_bytes", "data_egress_gib", "output_bytes", "egress_budget")
            if getattr(self, name)
        ]
        if stated and self.data_region is None:
            raise ValueError(f"{stated[0]} needs data_region: the region the data lives in")
        return self

    def to_json(self) -> str:
        return self.model_dump_json(exclude_none=True)

    def wire_json(self) -> str:
        """What a client sends: :meth:`to_json` with the credentials, for the node only."""
        if self.credentials is None:
            return self.to_json()
        body = json.loads(self.to_json())
        body["credentials"] = self.credentials.revealed()
        return json.dumps(body)


def parse_request(data: bytes | str) -> JobRequest:
    """Parse a job request from JSON (the API's body, the database's row).

    Raises:
        RequestError: naming the first field that is wrong.
    """
    try:
        pydantic_core.from_json(data, allow_inf_nan=False)  # RFC 8259: no NaN or Infinity
    except ValueError as exc:
        raise RequestError(f"the request is not JSON: {exc}", "bad-json") from None
    try:
        return JobRequest.model_validate_json(data)
    except pydantic.ValidationError as exc:
        raise _refusal(exc) from None


def build_request(**fields: object) -> JobRequest:
    """A job request from Python values (``cx run``'s flags, an embedding program), checked
    exactly as :func:`parse_request` checks JSON.

    Raises:
        RequestError: naming the first field that is wrong.
    """
    try:
        return JobRequest.model_validate_json(json.dumps(fields, default=_plain))
    except pydantic.ValidationError as exc:
        raise _refusal(exc) from None


def _plain(value: object) -> object:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, tuple | frozenset):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not part of a job request")


_LIMIT_FIELDS = {
    "checkpoint.path": "checkpoint_path",
    "checkpoint.grace_ms": "checkpoint",
    "elastic.memory_bytes": "elastic_memory_bytes",
    "elastic.cpu_milli": "elastic_cpu_milli",
}
_PATTERN_HINTS = {
    "image": "must be a manifest digest sha256:<64 hex> or an absolute path to an OCI layout",
    "digest": "must be a digest sha256:<64 hex>",
}


def _refusal(exc: pydantic.ValidationError) -> RequestError:
    """The first error, as one line that names the field: ``inputs[0].path: ...``."""
    error = exc.errors(include_url=False, include_input=False)[0]
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"])
    where = where.lstrip(".") or "the request"
    message = str(error["msg"]).removeprefix("Value error, ")
    kind = error["type"]
    if kind == "missing":
        return RequestError(f"the request needs {where!r}")
    if kind == "extra_forbidden":
        return RequestError(f"unknown field {where!r}")
    if kind == "model_type" and where == "the request":
        return RequestError("the job request must be a JSON object")
    if kind == "string_pattern_mismatch":
        field = str(error["loc"][-1])
        hint = _PATTERN_HINTS.get(field, "must be an absolute path")
        return RequestError(f"{where}: {hint}")
    return RequestError(f"{where}: {message[0].lower()}{message[1:]}")


def resolve(request: JobRequest, store: BlobStore) -> JobRequest:
    """The same request naming only digests: a path image is imported, input files stored.

    Raises:
        RequestError: an image or input that cannot be found or read.
    """
    image = request.image
    if looks_like_registry_ref(image):
        pass  # the provider pulls it
    elif not image.startswith("sha256:"):
        try:
            image = import_image(store, Path(image)).manifest
        except ImageError as exc:
            raise RequestError(f"image {request.image}: {exc}") from exc
    elif not store.has(image):
        raise RequestError(f"image {image} is not in this node's store; `cx image import` it")
    inputs = tuple(_stored(item, store) for item in request.inputs)
    resolved = request.model_copy(update={"image": image, "inputs": inputs})
    resolved = resolved.model_copy(update={"data_bytes": _data_bytes(resolved, store)})
    bid_from_request(resolved)  # the bid must be one a provider can take
    return resolved


def _stored(item: Input, store: BlobStore) -> Input:
    if item.url is not None:
        if item.digest is None:
            raise RequestError(f"input {item.url} is not pinned by its digest yet")
        return item
    if item.file is None:
        if item.digest is None or not store.has(item.digest):
            raise RequestError(f"input {item.path}: blob {item.digest} is not in this node's store")
        return item
    local = Path(item.file)
    if not local.is_file():
        raise RequestError(f"input file {local} does not exist")
    digest = store.put_file(local)
    return Input(path=item.path, digest=digest, size=store.size(digest))


def _hardware(request: JobRequest) -> HardwareRequirement | None:
    if request.cpu_model is None and not request.cpu_flags and request.min_kernel is None:
        return None
    return HardwareRequirement(
        cpu_model=request.cpu_model,
        cpu_flags=tuple(sorted(set(request.cpu_flags))) or None,
        min_kernel=request.min_kernel,
    )


def _data_site(request: JobRequest, inputs: list[DataRef]) -> DataSite | None:
    if request.data_region is None:
        return None
    return DataSite(
        region=request.data_region,
        bytes=sum(ref.size for ref in inputs) if request.data_bytes is None else request.data_bytes,
        egress_gib=request.data_egress_gib,
        output_bytes=request.output_bytes,
        budget=request.egress_budget,
    )


def _data_bytes(request: JobRequest, store: BlobStore) -> int | None:
    """The size the bid states for its data: as the request says, else its inputs and the
    image's blobs in this node's store (a registry image is the provider's to pull)."""
    if request.data_region is None or request.data_bytes is not None:
        return request.data_bytes
    image = store.refs().get(f"image/{request.image.removeprefix('sha256:')}", [])
    held = [d for d in image if store.has(d)]
    return sum(item.size or 0 for item in request.inputs) + sum(store.size(d) for d in held)


def bid_from_request(request: JobRequest) -> Bid:
    """The bid for a resolved request (every input a blob).

    Raises:
        RequestError: the request still names a path, or breaks a rule of the bid.
    """
    inputs = []
    for item in request.inputs:
        if item.digest is None or item.size is None:
            raise RequestError(f"input {item.path} is not resolved to a blob yet")
        inputs.append(DataRef(digest=item.digest, path=item.path, size=item.size, url=item.url))
    prices = request.max_prices
    image, registry = request.image, None
    if looks_like_registry_ref(image):
        ref = parse_ref(image)
        image, registry = ref.digest, f"{ref.host}/{ref.repository}"
    try:
        bid = Bid(
            job=JobSpec(
                image=image,
                command=request.command,
                env=dict(request.env),
                inputs=tuple(inputs),
                wall_ms=request.wall_ms,
                registry=registry,
                output_to=request.output_to,
                secrets=request.secrets or None,
            ),
            resources=Resources(
                cpu_milli=request.cpu_milli,
                memory_bytes=request.memory_bytes,
                disk_bytes=request.disk_bytes,
                gpus=request.gpus,
            ),
            max_prices=Prices(
                cpu_core_hour=prices.cpu_core_hour,
                memory_gib_hour=prices.memory_gib_hour,
                disk_gib_hour=prices.disk_gib_hour,
                gpu_hour=prices.gpu_hour,
            ),
            constraints=Constraints(
                arch=request.arch,
                regions=request.regions,
                trust=TrustRequirement(level=request.trust),
                provider=None
                if request.provider is None
                else PublicKey.from_peer_id(request.provider).raw,
                min_reputation=request.min_reputation,
                hardware=_hardware(request),
            ),
            preemptible=request.preemptible,
            max_work_price=request.max_work_price,
            checkpoint=(
                Checkpoint(path=request.checkpoint_path) if request.checkpoint_path else None
            ),
            elastic=elastic_of(request.elastic_memory_bytes, request.elastic_cpu_milli),
            data=_data_site(request, inputs),
        )
    except ValueError as exc:
        raise RequestError(f"bad job request: {exc}") from exc
    try:
        check_limits(bid.job, bid.resources, bid.checkpoint)
        check_elastic(bid.resources, bid.elastic)
    except OutOfBounds as exc:  # named as the request names it: wall_ms, checkpoint_path
        field = _LIMIT_FIELDS.get(exc.field, exc.field.rpartition(".")[2])
        raise RequestError(f"{field}: {exc.why}") from None
    try:
        check_sealable(bid)
    except DecodeError as exc:
        raise RequestError(f"the bid would be refused by every peer: {exc}") from None
    budget = quote(bid.max_prices, ceiling(bid.resources, bid.elastic), bid.job.wall_ms)
    if budget > _INT_MAX:
        raise RequestError(
            "max_prices at these resources and wall time make a budget too large to state "
            f"({budget} micro-credits); lower a price limit, the resources or wall_ms"
        )
    return bid
