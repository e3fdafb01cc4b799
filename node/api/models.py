"""The control API's answers as pydantic models: the shapes ``node/api/views.py`` builds,
the schemas of ``/openapi.json``, and what the server checks every answer against before it
leaves. Money is integer micro-credits, time integer milliseconds since the Unix epoch.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ErrorBody",
    "EventView",
    "JobView",
    "LedgerView",
    "LogsView",
    "MarketView",
    "NodeView",
    "OutputsRequest",
    "PeerView",
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


class NodeView(_View):
    peer_id: str
    addrs: list[str]
    provider: bool
    offer: OfferView | None
    version: str


class PeerView(_View):
    peer_id: str
    score: float
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
    explanation: str


class LogsView(_View):
    stdout: str
    stderr: str


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
    bids: int
    best_cpu_core_hour: int | None
    last_prices: list[int]


class TradeView(_View):
    at_ms: int
    class_: str = Field(alias="class")
    cpu_core_hour: int
    memory_gib_hour: int


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


class LedgerView(_View):
    balance: int
    entries: list[LedgerEntryView]


class ErrorDetail(_View):
    code: str
    message: str


class ErrorBody(_View):
    """Every refusal: the HTTP status says what kind, ``code`` which rule."""

    error: ErrorDetail
