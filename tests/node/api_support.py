"""A fake Controller for the control API tests: canned jobs, events a test adds (or a script
that releases one step per poll), and a switch that makes a route raise like a bug would."""

from __future__ import annotations

from pathlib import Path

import trio

from node.api.common import ApiError
from node.market.request import JobRequest
from protocol.identity import PrivateKey

TOKEN = "test-token-0123456789"
PEER_A = "12D3KooWProviderAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
PEER_B = PrivateKey.from_seed(bytes(32)).peer_id  # a well-formed one, for path patterns
NOW_MS = 1_800_000_000_000


def job_view(job_id: str, **fields) -> dict:
    view = {
        "id": job_id,
        "name": None,
        "image": "sha256:" + "ab" * 32,
        "command": ["echo", "hi"],
        "cpu_milli": 500,
        "memory_bytes": 128 << 20,
        "state": "waiting",
        "detail": "",
        "created_ms": NOW_MS,
        "updated_ms": NOW_MS,
        "provider": None,
        "attempts": 0,
        "price": None,
        "max_cost": None,
        "cost": None,
        "exit_reason": None,
        "exit_code": None,
        "outputs": [],
        "logs": [],
    }
    view.update(fields)
    return view


class FakeController:
    """Implements node.api.server.Controller with in-memory jobs."""

    def __init__(self) -> None:
        self.views: dict[str, dict] = {}
        self.job_events: dict[str, list[dict]] = {}
        self.stdout: dict[str, str] = {}
        self.submitted: list[dict] = []
        self.script: list[tuple[str, dict]] = []  # applied to the next submitted job
        self.scripts: dict[str, list[tuple[str, dict]]] = {}
        self.broken = False
        self.polling = trio.Event()  # set when events() starts waiting
        self.last_wait_s: float | None = None
        self._changed = trio.Event()
        self._next_id = 0xA1B2C300
        self.quotas: list[dict] | None = None  # a provider's quota groups; None: a buyer

    # -- test controls ---------------------------------------------------------------------

    def add_job(self, job_id: str, stdout: str = "", **fields) -> dict:
        self.views[job_id] = job_view(job_id, **fields)
        self.job_events[job_id] = []
        self.stdout[job_id] = stdout
        self.advance(job_id, self.views[job_id]["state"])
        return self.views[job_id]

    def advance(self, job_id: str, state: str, detail: str = "", **fields) -> None:
        events = self.job_events[job_id]
        at_ms = NOW_MS + 1000 * len(events)
        events.append({"seq": len(events) + 1, "at_ms": at_ms, "state": state, "detail": detail})
        self.views[job_id].update(state=state, detail=detail, updated_ms=at_ms, **fields)
        self._changed.set()
        self._changed = trio.Event()

    # -- the Controller protocol -----------------------------------------------------------

    def node_info(self) -> dict:
        return {
            "peer_id": "12D3KooWBuyer",
            "addrs": ["/ip4/127.0.0.1/tcp/4001"],
            "provider": self.quotas is not None,
            "offer": None,
            "version": "0.1.0",
            "quotas": self.quotas or [],
        }

    def peers(self) -> list[dict]:
        if self.broken:
            raise RuntimeError("peer table corrupted")
        return [
            {
                "peer_id": PEER_A,
                "score": 12.5,
                "reputation": 439_320,
                "addrs": ["/ip4/10.0.0.2/tcp/4001"],
            },
            {"peer_id": "12D3KooWOther", "score": -3, "addrs": []},
        ]

    async def submit(self, request: JobRequest) -> dict:
        self.submitted.append(request)
        job_id = f"{self._next_id:x}"
        self._next_id += 1
        created_ms = NOW_MS + 60_000 * len(self.submitted)  # newer than the canned jobs
        self.add_job(
            job_id, name=request.name, stdout="hello from the job\n", created_ms=created_ms
        )
        self.scripts[job_id], self.script = self.script, []
        return self.views[job_id]

    def reload_quotas(self) -> list[dict]:
        if self.quotas is None:
            raise ApiError(409, "not-provider", "this node sells nothing, so it has no quotas")
        return self.quotas

    def sold(self) -> list[dict]:
        return [
            {
                "id": "5a1d000000000001",
                "agreement_id": "5a1d000000000001" + "00" * 24,
                "state": "settled",
                "buyer": "12D3KooWBuyer",
                "image": "sha256:" + "ab" * 32,
                "command": ["echo", "hi"],
                "cpu_milli": 1000,
                "memory_bytes": 256 << 20,
                "prices": {"cpu_core_hour": 1_000_000},
                "max_cost": 2_000_000,
                "earned": 250_000,
                "created_ms": NOW_MS - 60_000,
                "started_ms": NOW_MS - 59_000,
            }
        ]

    def jobs(self) -> list[dict]:
        return sorted(self.views.values(), key=lambda v: v["created_ms"], reverse=True)

    def job(self, job_id: str) -> dict:
        return self.views[self._resolve(job_id)]

    async def events(self, job_id: str, after: int, wait_s: float) -> list[dict]:
        full = self._resolve(job_id)
        self.last_wait_s = wait_s
        if not self._after(full, after) and self.scripts.get(full):
            state, fields = self.scripts[full].pop(0)
            self.advance(full, state, **fields)
        if not self._after(full, after):
            self.polling.set()
            with trio.move_on_after(wait_s):
                await self._changed.wait()
        return self._after(full, after)

    def why(self, job_id: str) -> dict:
        view = self.job(job_id)
        return {
            "bid_id": "b1d" + view["id"],
            "state": view["state"],
            "offers_seen": 4,
            "ruled_out": {"price": 3, "region": 1, "arch": 0},
            "best_price": 1_250_000,
            "limit": 1_000_000,
            "explanation": "none of 4 offers fits (price rules out 3, region rules out 1): "
            "CPU costs at least 1.25 credits per core-hour, your limit is 1.00",
        }

    async def logs(self, job_id: str) -> dict:
        return {"stdout": self.stdout[self._resolve(job_id)], "stderr": "a warning\n"}

    async def live_logs(self, job_id: str, stdout_from: int, stderr_from: int) -> dict:
        out = self.stdout[self._resolve(job_id)].encode()[stdout_from:]
        return {
            "stdout": out.decode(),
            "stderr": "",
            "stdout_next": stdout_from + len(out),
            "stderr_next": stderr_from,
            "ended": True,
        }

    async def outputs(self, job_id: str, dest: str) -> list[dict]:
        view = self.job(job_id)
        written = []
        for out in view["outputs"]:
            target = Path(dest) / out["path"].lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(b"x" * out["size"])
            written.append({"path": out["path"], "file": str(target), "size": out["size"]})
        return written

    async def cancel(self, job_id: str, *, waiting_only: bool = False) -> dict:
        view = self.job(job_id)
        if waiting_only and view["state"] not in ("waiting", "negotiating"):
            raise ApiError(409, "too-late", f"job {view['id']} is {view['state']}")
        if view["state"] in ("succeeded", "failed", "settled", "receipted", "cancelled"):
            raise ApiError(409, "job-ended", f"job {view['id']} has already ended")
        self.advance(view["id"], "cancelled", "cancelled by the user")
        return view

    def market(self) -> dict:
        return {
            "offers": 5,
            "bids": 2,
            "classes": [
                {
                    "class": "amd64-small",
                    "offers": 4,
                    "bids": 2,
                    "best_cpu_core_hour": 900_000,
                    "best_memory_gib_hour": 100_000,
                    "best_bid_cpu_core_hour": 1_200_000,
                    "best_work_price": 3_000,
                    "best_work_per_kwh": 2_400,
                    "last_cpu_core_hour": 950_000,
                    "last_memory_gib_hour": 100_000,
                    "volume": 3,
                    "volume_cpu_milli": 2500,
                    "last_prices": [900_000, 1_000_000, 950_000],
                },
                {
                    "class": "arm64-gpu",
                    "offers": 1,
                    "bids": 0,
                    "best_cpu_core_hour": None,
                    "best_memory_gib_hour": None,
                    "best_bid_cpu_core_hour": None,
                    "best_work_price": None,
                    "best_work_per_kwh": None,
                    "last_cpu_core_hour": None,
                    "last_memory_gib_hour": None,
                    "volume": 0,
                    "volume_cpu_milli": 0,
                    "last_prices": [],
                },
            ],
            "recent_trades": [
                {
                    "at_ms": NOW_MS,
                    "class": "amd64-small",
                    "cpu_core_hour": 950_000,
                    "memory_gib_hour": 100_000,
                    "cpu_milli": 500,
                    "memory_bytes": 1 << 27,
                    "buyer": "12D3KooWBuyer",
                    "provider": PEER_A,
                }
            ],
            "rejected_gossip": {},
        }

    async def check_score(self, provider: str) -> dict:
        if provider != PEER_B:
            raise ApiError(400, "bad-request", f"cannot check {provider}'s work score")
        return {"provider": provider, "job_id": "cccc0003", "stated": 900, "measured": 880,
                "honest": True, "detail": "stated 900, measured 880: within tolerance"}  # fmt: skip

    def offers(self) -> list[dict]:
        base = {"class": "amd64/cpu/eu", "cpu_milli": 4000, "memory_bytes": 8 << 30,
                "memory_gib_hour": 100_000, "trust": ["none"], "work_score": 900,
                "work_price": 1_000, "region": "eu", "arch": "amd64", "gpus": [],
                "disk_gib_hour": 10_000, "gpu_hour": 0, "free_memory_bytes": 4 << 30,
                "free_gpus": 0, "mine": False, "expires_ms": NOW_MS + 3_600_000}  # fmt: skip
        return [
            {**base, "id": "aa" * 32, "provider": PEER_A, "cpu_core_hour": 900_000,
             "free_cpu_milli": 4000, "reputation": 250_000},
            {**base, "id": "bb" * 32, "provider": PEER_B, "cpu_core_hour": 1_500_000,
             "free_cpu_milli": 500, "reputation": 0, "region": "us", "ingress_gib": 20_000,
             "egress_gib": 90_000, "holds": "cdcdcdcd"},
        ]  # fmt: skip

    def trades(self, since_ms: int) -> list[dict]:
        return self.market()["recent_trades"] if since_ms <= NOW_MS else []

    def history(self, interval_ms: int, since_ms: int, price_field: str) -> dict:
        start = NOW_MS - NOW_MS % interval_ms
        candle = {"start_ms": start, "open": 900_000, "high": 1_000_000, "low": 900_000,
                  "close": 950_000, "trades": 3, "cpu_milli": 2500}  # fmt: skip
        return {
            "interval_ms": interval_ms,
            "field": price_field,
            "classes": [
                {"class": "amd64-small", "candles": [candle] if since_ms <= NOW_MS else []}
            ],
        }

    def ledger(self) -> dict:
        return {
            "balance": -1_500_000,
            "entries": [
                {
                    "agreement_id": "ag9999999999ffff0000",
                    "at_ms": NOW_MS - 60_000,
                    "payer": "12D3KooWBuyer",
                    "payee": PEER_A,
                    "amount": 0,
                    "role": "buyer",
                },
                {
                    "agreement_id": "ag0123456789abcdef0123",
                    "at_ms": NOW_MS,
                    "payer": "12D3KooWBuyer",
                    "payee": PEER_A,
                    "amount": 1_500_000,
                    "role": "buyer",
                },
            ],
        }

    def metrics(self) -> bytes:
        return b"# TYPE cx_peers gauge\ncx_peers 0.0\n"

    def snapshot(self) -> dict:
        return {"node": self.node_info(), "jobs": list(self.views.values())}

    def version(self) -> int:
        return sum(len(events) for events in self.job_events.values())

    async def changed(self) -> None:
        await self._changed.wait()

    def ticking(self) -> bool:
        return False

    # -- helpers ----------------------------------------------------------------------------

    def _resolve(self, job_id: str) -> str:
        matches = [j for j in self.views if j.startswith(job_id)]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise ApiError(404, "unknown-job", f"no job {job_id}; see cx jobs")
        raise ApiError(400, "ambiguous-job", f"{job_id} matches {len(matches)} jobs")

    def _after(self, job_id: str, after: int) -> list[dict]:
        return [e for e in self.job_events[job_id] if e["seq"] > after]
