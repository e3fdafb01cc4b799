"""A node's home directory: its key, its configuration and where its state lives.

Layout (``cx init`` creates it; everything a node owns is under one directory)::

    key             the node's Ed25519 key, mode 0600, in libp2p's protobuf form (68
                    bytes: a type header, the seed, and the public key, which must match
                    the seed, so a damaged or foreign file is refused)
    config.toml     how it joins the network and, for a provider, what it sells
    node.db         SQLite (WAL): orders, jobs, agreements, receipts, ledger
    store/          content-addressed blobs (images, inputs, outputs, logs)
    work/           per-job scratch areas of the executor
    tpm/            this node's swtpm, when it attests with a software TPM
    ([provider.pricing] and [provider.cost] in config.toml: the pricing policy of each
    resource and the machine's running cost, spec/pricing.md)
    ([s3] endpoint and region in config.toml: where s3:// inputs and outputs go;
    [store] budget_bytes: the content store's cache budget, least recently used evicted)
    api.json        where the running node's control API listens (written by the node)

Errors: :class:`HomeError` says what is wrong with the directory and how to fix it.
"""

from __future__ import annotations

import fcntl
import os
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from node.storage.config_rules import config_problems
from node.storage.quota_config import parse_quotas, render_quotas
from protocol.errors import ProtocolError
from protocol.identity import PrivateKey
from protocol.messages import Arch, Gpu, Hardware, Prices, Resources, TrustLevel
from protocol.pricing import (
    MARKET_WINDOW_MS,
    NO_CEILING,
    PRICE_FIELDS,
    REPOST_INTERVAL_MS,
    REPOST_STEP_PPM,
    Policy,
    Pricing,
    ResourcePricing,
    cost_floor,
)
from protocol.quotas import Quotas

__all__ = [
    "DEFAULT_LISTEN",
    "DEFAULT_PRICES",
    "Home",
    "HomeError",
    "HomeLock",
    "MachineCost",
    "NodeConfig",
    "ProviderConfig",
    "S3Config",
    "default_home",
    "init_home",
]

DEFAULT_LISTEN = ("/ip4/127.0.0.1/tcp/0",)
# What `cx init --provider` asks unless told otherwise (micro-credits): priced so that a
# buyer's `cx run --max-price 1.5` with its defaults (memory and disk caps at the same
# figure) trades with it out of the box.
DEFAULT_PRICES = Prices(cpu_core_hour=1_000_000, memory_gib_hour=100_000, disk_gib_hour=10_000)
LEGACY_KEY_SIZE = 32  # cx 0.1 stored the bare seed


def default_home() -> Path:
    """``$CX_HOME``; else /var/lib/cx for root (a provider's containers run as a mapped uid
    and must traverse every directory above the home, which /root does not allow); else
    ~/.cx."""
    if env := os.environ.get("CX_HOME"):
        return Path(env).expanduser()
    return Path("/var/lib/cx") if os.geteuid() == 0 else Path.home() / ".cx"


class HomeError(Exception):
    """The home directory is missing, incomplete or holds a bad configuration."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MachineCost:
    """What running the machine costs: power at full load and wear (micro-credits)."""

    watts: int
    kwh_price: int  # micro-credits per kWh
    depreciation_per_hour: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ProviderConfig:
    """What a provider offers: capacity, unit prices (micro-credits) and its trust.

    ``prices`` are the configured prices; ``pricing`` says how each moves (every one
    fixed at ``prices`` when None), and ``cost`` gives the CPU floor a policy may not go
    under when ``pricing`` states none.
    """

    capacity: Resources
    prices: Prices
    arch: Arch
    region: str = ""
    tpm: bool = False  # attest with a TPM: ``tcti``, or a swtpm under the home when unset
    tcti: str | None = None
    offer_ttl_ms: int = 3_600_000
    pricing: Pricing | None = None
    cost: MachineCost | None = None
    max_share_ppm: int = 1_000_000  # the most of the offer one buyer may hold (fair share)
    benchmark: bool = False  # measure and state a work score at start (protocol/work.py)
    # GPUs: 0 offers none; N >= 1 detects the host's NVIDIA GPUs at start (nvidia-smi) and
    # offers each as N time-sliced shares (1: whole GPUs). ``gpus`` is what was detected.
    gpu_shares: int = 0
    gpus: tuple[Gpu, ...] = ()
    hardware: Hardware | None = None  # detected at start: CPU model, flags, kernel
    # Per GiB a job's data brings in and its outputs send out (spec/matching.md, "Transfer
    # cost"); None: not stated in the offer (free).
    ingress_gib: int | None = None
    egress_gib: int | None = None
    quotas: Quotas = field(default_factory=Quotas)  # [[provider.quota]] (quota_config.py)

    def with_gpus(self, gpus: tuple[Gpu, ...]) -> ProviderConfig:
        """This config offering ``gpus`` (what detection found, as shares)."""
        return replace(self, gpus=gpus, capacity=replace(self.capacity, gpus=len(gpus)))

    @property
    def trust(self) -> tuple[TrustLevel, ...]:
        return (TrustLevel.NONE, TrustLevel.TPM) if self.tpm else (TrustLevel.NONE,)

    def effective_pricing(self) -> Pricing:
        """The pricing in force: fixed at ``prices`` unless configured, with the CPU floor
        derived from ``cost`` where no floor is stated."""
        pricing = self.pricing or Pricing.fixed(self.prices)
        cpu = pricing.rule("cpu_core_hour")
        if self.cost is None or cpu.floor:
            return pricing
        floor = cost_floor(
            watts=self.cost.watts,
            kwh_price=self.cost.kwh_price,
            depreciation_per_hour=self.cost.depreciation_per_hour,
            cpu_milli=self.capacity.cpu_milli,
        )
        floored = ResourcePricing(
            policy=cpu.policy,
            price=cpu.price,
            floor=min(floor, cpu.ceiling),
            ceiling=cpu.ceiling,
            undercut_ppm=cpu.undercut_ppm,
        )
        return Pricing(
            resources={**pricing.resources, "cpu_core_hour": floored},
            step_ppm=pricing.step_ppm,
            min_interval_ms=pricing.min_interval_ms,
            window_ms=pricing.window_ms,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class S3Config:
    """Where ``s3://`` URLs go: an S3-compatible endpoint, addressed path-style."""

    endpoint: str  # e.g. https://s3.eu-west-1.amazonaws.com or http://127.0.0.1:9000
    region: str = "us-east-1"

    def __post_init__(self) -> None:
        if not self.endpoint.startswith(("http://", "https://")):
            raise ValueError(f"[s3] endpoint {self.endpoint!r} must be an http(s):// URL")


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeConfig:
    listen: tuple[str, ...] = DEFAULT_LISTEN
    bootstrap: tuple[str, ...] = ()
    dht: bool = False
    mdns: bool = False
    api_port: int = 0  # 0: any free port, published in api.json
    ek_roots: tuple[str, ...] = ()  # PEM files of the TPM EK CAs this node trusts as buyer
    provider: ProviderConfig | None = None
    s3: S3Config | None = None
    store_budget_bytes: int | None = None  # the content store's cache budget


@dataclass(frozen=True, slots=True)
class Home:
    root: Path

    @property
    def key_path(self) -> Path:
        return self.root / "key"

    @property
    def config_path(self) -> Path:
        return self.root / "config.toml"

    @property
    def db_path(self) -> Path:
        return self.root / "node.db"

    @property
    def store_root(self) -> Path:
        return self.root / "store"

    @property
    def work_root(self) -> Path:
        return self.root / "work"

    @property
    def tpm_dir(self) -> Path:
        return self.root / "tpm"

    def key(self) -> PrivateKey:
        """The node's key.

        Raises:
            HomeError: no key file, or one that is not a whole, self-consistent key.
        """
        try:
            data = self.key_path.read_bytes()
        except FileNotFoundError:
            raise HomeError(f"{self.root} has no key; run `cx init --home {self.root}`") from None
        except OSError as exc:
            raise HomeError(f"cannot read {self.key_path}: {exc.strerror}") from None
        if len(data) == LEGACY_KEY_SIZE:
            raise HomeError(
                f"{self.key_path} is a bare 32-byte seed, the unchecked key format of cx 0.1; "
                f"if it is this node's key, convert it: cx init --home {self.root} --convert-key"
            )
        try:
            return PrivateKey.from_libp2p_bytes(data)
        except ProtocolError:
            raise HomeError(
                f"{self.key_path} is not a node key ({len(data)} bytes, damaged or from "
                "elsewhere); restore it from a backup, or move it aside and `cx init` a new "
                "identity"
            ) from None

    def lock(self) -> HomeLock:
        """Hold this home for one running node until :meth:`HomeLock.release` (or the
        process ends, even by ``kill -9``: the kernel drops the lock with the file).

        Raises:
            HomeError: another process holds it; the message names its pid.
        """
        path = self.root / "lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise HomeError(f"cannot open {path}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise HomeError(
                f"{self.root} is in use by another node (pid {holder}); stop that one first, "
                "or give this one another --home"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return HomeLock(fd)

    def convert_legacy_key(self) -> PrivateKey:
        """Rewrite a cx 0.1 key file (a bare 32-byte seed) in the checked form.

        Raises:
            HomeError: there is no such file to convert.
        """
        try:
            seed = self.key_path.read_bytes()
        except OSError as exc:
            raise HomeError(f"cannot read {self.key_path}: {exc.strerror}") from None
        if len(seed) != LEGACY_KEY_SIZE:
            raise HomeError(f"{self.key_path} is not a 32-byte seed; nothing to convert")
        key = PrivateKey.from_seed(seed)
        _write_key(self.key_path, key, replace=True)
        return key

    def config(self) -> NodeConfig:
        try:
            text = self.config_path.read_text()
        except FileNotFoundError:
            raise HomeError(
                f"{self.root} has no config.toml; make it a node's home with "
                f"`cx init --home {self.root}`"
            ) from None
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise HomeError(f"{self.config_path}: {exc}") from None
        if problems := config_problems(doc):
            raise HomeError("\n".join(f"{self.config_path}: {p}" for p in problems))
        try:
            return _parse(doc)
        except (KeyError, TypeError, ValueError) as exc:
            raise HomeError(f"{self.config_path}: {exc}") from exc

    def save_config(self, config: NodeConfig) -> None:
        tmp = self.config_path.with_suffix(".tmp")
        tmp.write_text(_render(config))
        os.replace(tmp, self.config_path)


@dataclass(slots=True)
class HomeLock:
    """A home held by this process (:meth:`Home.lock`)."""

    fd: int | None

    def release(self) -> None:
        if self.fd is not None:
            # Unlocked before closing: a process being spawned meanwhile (by any thread)
            # holds a copy of every descriptor until it execs, and a flock lives as long
            # as any copy does, so closing ours alone could leave the home held a while.
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def init_home(root: Path, config: NodeConfig, *, force: bool = False) -> Home:
    """Create ``root`` with a fresh key (kept if present) and ``config``.

    Raises HomeError if a configuration exists and ``force`` is not set.
    """
    home = Home(root)
    if home.config_path.exists() and not force:
        raise HomeError(f"{root} is already initialised; pass --force to rewrite its config")
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o711)  # containers run under a mapped uid and must traverse the work dir
    if not home.key_path.exists():
        _write_key(home.key_path, PrivateKey.from_seed(os.urandom(32)), replace=False)
    home.save_config(config)
    return home


def _write_key(path: Path, key: PrivateKey, *, replace: bool) -> None:
    """Write ``key`` (mode 0600) durably; with ``replace``, atomically over the old file."""
    target = path.with_suffix(".new") if replace else path
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key.to_libp2p_bytes())
        f.flush()
        os.fsync(f.fileno())
    if replace:
        os.replace(target, path)


# -- TOML: the config is flat enough to write by hand (tomllib only reads) ---------------


def _parse(doc: dict[str, Any]) -> NodeConfig:
    net = doc.get("network", {})
    buyer = doc.get("buyer", {})
    provider = doc.get("provider")
    s3 = doc.get("s3")
    budget = doc.get("store", {}).get("budget_bytes")
    return NodeConfig(
        listen=tuple(net.get("listen", DEFAULT_LISTEN)),
        bootstrap=tuple(net.get("bootstrap", ())),
        dht=bool(net.get("dht", False)),
        mdns=bool(net.get("mdns", False)),
        api_port=int(net.get("api_port", 0)),
        ek_roots=tuple(buyer.get("ek_roots", ())),
        provider=None if provider is None else _parse_provider(provider),
        s3=None
        if s3 is None
        else S3Config(endpoint=s3["endpoint"], region=s3.get("region", "us-east-1")),
        store_budget_bytes=None if budget is None else int(budget),
    )


def _prices(p: dict[str, Any]) -> Prices:
    return Prices(
        cpu_core_hour=int(p["cpu_core_hour"]),
        memory_gib_hour=int(p.get("memory_gib_hour", 0)),
        disk_gib_hour=int(p.get("disk_gib_hour", 0)),
        gpu_hour=int(p.get("gpu_hour", 0)),
    )


def _parse_provider(p: dict[str, Any]) -> ProviderConfig:
    return ProviderConfig(
        capacity=Resources(
            cpu_milli=int(p["cpu_milli"]),
            memory_bytes=int(p["memory_bytes"]),
            disk_bytes=int(p.get("disk_bytes", 0)),
        ),
        prices=(prices := _prices(p)),
        arch=Arch(p.get("arch", "amd64")),
        region=str(p.get("region", "")),
        tpm=bool(p.get("tpm", False)),
        tcti=p.get("tcti"),
        offer_ttl_ms=int(p.get("offer_ttl_ms", 3_600_000)),
        pricing=_parse_pricing(p["pricing"], prices) if "pricing" in p else None,
        max_share_ppm=int(p.get("max_share_ppm", 1_000_000)),
        benchmark=bool(p.get("benchmark", False)),
        gpu_shares=int(p.get("gpu_shares", 0)),
        ingress_gib=int(p["ingress_gib"]) if "ingress_gib" in p else None,
        egress_gib=int(p["egress_gib"]) if "egress_gib" in p else None,
        cost=MachineCost(**{k: int(v) for k, v in p["cost"].items()}) if "cost" in p else None,
        quotas=parse_quotas(p.get("quota", [])),
    )


def _parse_pricing(doc: dict[str, Any], prices: Prices) -> Pricing:
    """``[provider.pricing]``: ``step_ppm``, ``min_interval_ms``, ``window_ms``, and one
    table per price field (``policy``, ``price``, ``floor``, ``ceiling``,
    ``undercut_ppm``); a field without a table stays fixed at its configured price."""
    unknown = set(doc) - {"step_ppm", "min_interval_ms", "window_ms"} - {f for f, _ in PRICE_FIELDS}
    if unknown:
        raise ValueError(f"[provider.pricing] has unknown keys: {', '.join(sorted(unknown))}")
    resources = {}
    for price_field, _ in PRICE_FIELDS:
        rule = doc.get(price_field, {})
        resources[price_field] = ResourcePricing(
            policy=Policy(rule.get("policy", "fixed")),
            price=int(rule.get("price", getattr(prices, price_field))),
            floor=int(rule.get("floor", 0)),
            ceiling=int(rule.get("ceiling", NO_CEILING)),
            undercut_ppm=int(rule.get("undercut_ppm", 0)),
        )
    return Pricing(
        resources=resources,
        step_ppm=int(doc.get("step_ppm", REPOST_STEP_PPM)),
        min_interval_ms=int(doc.get("min_interval_ms", REPOST_INTERVAL_MS)),
        window_ms=int(doc.get("window_ms", MARKET_WINDOW_MS)),
    )


def _value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, tuple | list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {v!r} to TOML")


def _table(name: str, values: dict[str, object]) -> str:
    lines = [f"[{name}]"] + [f"{k} = {_value(v)}" for k, v in values.items() if v is not None]
    return "\n".join(lines) + "\n"


def _render_pricing(p: ProviderConfig) -> list[str]:
    parts = []
    if p.pricing is not None:
        pricing = p.pricing
        step: dict[str, object] = {"step_ppm": pricing.step_ppm}
        step["min_interval_ms"] = pricing.min_interval_ms
        parts.append(_table("provider.pricing", step | {"window_ms": pricing.window_ms}))
        for price_field, _ in PRICE_FIELDS:
            rule = p.pricing.rule(price_field)
            if rule.policy is not Policy.FIXED or rule.price != getattr(p.prices, price_field):
                values: dict[str, object] = {"policy": rule.policy.value, "price": rule.price}
                values |= {"floor": rule.floor, "undercut_ppm": rule.undercut_ppm}
                if rule.ceiling != NO_CEILING:
                    values["ceiling"] = rule.ceiling
                parts.append(_table(f"provider.pricing.{price_field}", values))
    if (cost := p.cost) is not None:
        values = {"watts": cost.watts, "kwh_price": cost.kwh_price}
        parts.append(
            _table("provider.cost", values | {"depreciation_per_hour": cost.depreciation_per_hour})
        )
    return parts


def _render(c: NodeConfig) -> str:
    parts = [
        "# Compute Exchange node configuration (cx init). Money in micro-credits.\n",
        _table(
            "network",
            {
                "listen": c.listen,
                "bootstrap": c.bootstrap,
                "dht": c.dht,
                "mdns": c.mdns,
                "api_port": c.api_port,
            },
        ),
        _table("buyer", {"ek_roots": c.ek_roots}),
    ]
    if (p := c.provider) is not None:
        parts.append(
            _table(
                "provider",
                {
                    "cpu_milli": p.capacity.cpu_milli,
                    "memory_bytes": p.capacity.memory_bytes,
                    "disk_bytes": p.capacity.disk_bytes,
                    "cpu_core_hour": p.prices.cpu_core_hour,
                    "memory_gib_hour": p.prices.memory_gib_hour,
                    "disk_gib_hour": p.prices.disk_gib_hour,
                    "gpu_hour": p.prices.gpu_hour,
                    "ingress_gib": p.ingress_gib,
                    "egress_gib": p.egress_gib,
                    "arch": p.arch.value,
                    "region": p.region,
                    "tpm": p.tpm,
                    "tcti": p.tcti,
                    "offer_ttl_ms": p.offer_ttl_ms,
                    "max_share_ppm": p.max_share_ppm,
                    "benchmark": p.benchmark,
                    "gpu_shares": p.gpu_shares,
                },
            )
        )
        parts += _render_pricing(p)
        parts += [_table("[provider.quota]", q) for q in render_quotas(p.quotas)]
    if c.store_budget_bytes is not None:
        parts.append(_table("store", {"budget_bytes": c.store_budget_bytes}))
    if c.s3 is not None:
        parts.append(_table("s3", {"endpoint": c.s3.endpoint, "region": c.s3.region}))
    return "\n".join(parts)
