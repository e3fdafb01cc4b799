"""The control API's answers as pydantic models: the shapes ``node/api/views.py`` builds,
the schemas of ``/openapi.json``, and what the server checks every answer against before it
leaves. Money is integer micro-credits, time integer milliseconds since the Unix epoch.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "DashboardLink",
    "ErrorBody",
    "EventView",
    "HistoryView",
    "JobView",
    "LedgerView",
    "LiveLogsView",
    "LogsView",
    "MarketView",
    "NodeView",
    "OfferRowView",
    "OutputsRequest",
    "PeerView",
    "PriceField",
    "QuotaLimits",
    "QuotaView",
    "ScoreCheckView",
    "SoldView",
    "WhyView",
    "WrittenView",
]


class _View(BaseModel):
    # ``class`` is a keyword in Python: fields named so are ``class_`` with that alias.
    model_config = ConfigDict(
        frozen=True, extra="forbid", populate_by_name=True, serialize_by_alias=True
    )


class BlobRef(_View):
    path: str  # where the job saw it
    digest: str  # sha256:<hex>
    size: int
    url: str | None = None  # an output uploaded to the job's output_to prefix


class JobView(_View):
    id: str
    name: str | None
    image: str  # as the request named it: a digest, a registry reference
    command: list[str]
    cpu_milli: int
    memory_bytes: int
    state: str  # node.market.buyer.JOB_STATES
    detail: str
    created_ms: int
    updated_ms: int
    provider: str | None  # peer id
    attempts: int
    price: dict[str, int] | None  # the agreed unit prices
    max_cost: int | None
    cost: int | None
    exit_reason: str | None
    exit_code: int | None
    outputs: list[BlobRef]
    logs: list[BlobRef]


class EventView(_View):
    seq: int
    at_ms: int
    state: str
    detail: str


class OfferView(_View):
    id: str
    class_: str = Field(alias="class")
    cpu_milli: int
    memory_bytes: int
    cpu_core_hour: int
    memory_gib_hour: int
    trust: list[str]
    work_score: int | None = None  # work units per core-hour (spec/work.md)
    work_price: int | None = None  # micro-credits per work unit


class OfferRowView(OfferView):
    """An offer as ``cx offers`` lists it."""

    provider: str
    region: str
    arch: str
    gpus: list[str]
    disk_gib_hour: int
    gpu_hour: int
    ingress_gib: int | None = None  # per GiB brought in for a job (spec/matching.md)
    egress_gib: int | None = None  # per GiB of outputs sent out
    holds: str | None = None  # hex: sorted 4-byte prefixes of the blobs it holds
    free_cpu_milli: int
    free_memory_bytes: int
    free_gpus: int
    reputation: int  # this node's, parts per million (spec/reputation.md)
    mine: bool
    expires_ms: int


class QuotaLimits(_View):
    """A group's limits (None: no limit), or what it uses now, in the limits' units."""

    cpu_milli: int | None
    memory_bytes: int | None
    gpus: int | None
    jobs: int | None
    credits_per_day: int | None  # used: micro-credits this UTC day, unsettled jobs' caps too


class QuotaView(_View):
    """A provider's quota group (config.toml ``[[provider.quota]]``) and its use now."""

    name: str
    peers: list[str]  # empty: the default group
    priority: int
    limits: QuotaLimits
    used: QuotaLimits


class NodeView(_View):
    peer_id: str
    addrs: list[str]
    provider: bool
    offer: OfferView | None
    version: str
    quotas: list[QuotaView] = []  # a provider's, in the order its config lists them


class PeerView(_View):
    peer_id: str
    score: float
    reputation: int = 0  # this node's reputation of the peer, parts per million of its trust
    addrs: list[str] = []


class WhyView(_View):
    bid_id: str | None
    state: str
    offers_seen: int
    matching: int = 0
    ruled_out: dict[str, int]  # constraint -> offers it ruled out
    best_price: int | None  # the cheapest quote among offers that fail only on price
    limit: int | None  # the bid's budget
    largest_free: dict[str, int] | None = None
    cheapest: dict[str, int] | None = None
    # Among offers over the bid's egress budget only: the cheapest move of its data
    # (moved_bytes, held_bytes, cross_region, ingress, egress, outputs, total; micro-credits)
    least_transfer: dict[str, int | bool] | None = None
    explanation: str
    deadline_limit: dict[str, int] | None = None  # with a deadline: the bid's limit now
    next_rise_ms: int | None = None  # and when it rises next (None: at its maximum)


class LogsView(_View):
    stdout: str
    stderr: str


class LiveLogsView(_View):
    """A job's output since the byte offsets asked; ask again from ``*_next``."""

    stdout: str  # decoded as UTF-8, a broken sequence replaced
    stderr: str
    stdout_next: int
    stderr_next: int
    ended: bool  # nothing more will come


class OutputsRequest(_View):
    dest: str  # an absolute directory on the node's machine


class WrittenView(_View):
    path: str
    file: str | None = None  # None: not here, it went to the job's prefix (``url``)
    size: int
    url: str | None = None


class ClassView(_View):
    class_: str = Field(alias="class")
    offers: int
    bids: int  # live bids that could trade on this class, price and capacity aside
    best_cpu_core_hour: int | None  # the cheapest offer
    best_memory_gib_hour: int | None
    best_bid_cpu_core_hour: int | None  # the highest limit a bid sets
    best_work_price: int | None = None  # the cheapest unit of work on offer (spec/work.md)
    best_work_per_kwh: int | None = None  # the most work per kWh an offer states
    last_cpu_core_hour: int | None  # the tape's last print
    last_memory_gib_hour: int | None
    volume: int  # prints on the tape (its window: a day)
    volume_cpu_milli: int  # CPU those trades reserved
    last_prices: list[int]  # the recent prints' CPU prices, oldest first


class TradeView(_View):
    at_ms: int
    class_: str = Field(alias="class")
    cpu_core_hour: int
    memory_gib_hour: int
    cpu_milli: int
    memory_bytes: int
    buyer: str
    provider: str


class ScoreCheckView(_View):
    provider: str
    job_id: str
    stated: int  # work units per core-hour its offer states
    measured: int  # from the benchmark job's CPU time
    honest: bool  # false: this node no longer trades with it
    detail: str


PriceField = Literal["cpu_core_hour", "memory_gib_hour", "disk_gib_hour", "gpu_hour"]


class CandleView(_View):
    start_ms: int
    open: int
    high: int
    low: int
    close: int
    trades: int
    cpu_milli: int


class ClassHistoryView(_View):
    class_: str = Field(alias="class")
    candles: list[CandleView]


class HistoryView(_View):
    interval_ms: int
    field: PriceField
    classes: list[ClassHistoryView]


class MarketView(_View):
    offers: int
    bids: int
    classes: list[ClassView]
    recent_trades: list[TradeView]
    rejected_gossip: dict[str, int] = {}


class LedgerEntryView(_View):
    agreement_id: str
    at_ms: int
    payer: str
    payee: str
    amount: int
    role: str  # "buyer" or "provider"


class SoldView(_View):
    """A job this node runs or ran as provider (``GET /v1/sold``)."""

    id: str  # the agreement id's first 16 hex digits: the name the provider's log uses
    agreement_id: str
    state: str  # protocol.messages.JobState
    buyer: str  # peer id
    image: str
    command: list[str]
    cpu_milli: int
    memory_bytes: int
    prices: dict[str, int]
    max_cost: int
    earned: int | None  # once the buyer countersigned the receipt
    created_ms: int
    started_ms: int | None


class LedgerView(_View):
    balance: int
    entries: list[LedgerEntryView]


class DashboardLink(_View):
    url: str  # open it in a browser on this machine; good once
    expires_s: float


class ErrorDetail(_View):
    code: str
    message: str


class ErrorBody(_View):
    """Every refusal: the HTTP status says what kind, ``code`` which rule."""

    error: ErrorDetail
