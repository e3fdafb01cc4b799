"""A buyer checks a provider's stated work score (spec/work.md rule 7): it runs the
benchmark kernel as an ordinary job on that provider (a bid naming it, at its offer's
prices), and compares the score the receipt's CPU time gives with the one the offer
states. A provider that overstates its score by more than the tolerance, or whose job did
not hash what the kernel hashes, loses this node's trust: its reputation here becomes -1,
which every bid's ``min_reputation`` (0 at least) rules out.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import trio

from node.market.benchmark import benchmark_image
from node.market.buyer import FINAL_STATES, Buyer
from node.market.request import build_request
from protocol.envelope import open_signed
from protocol.identity import PublicKey
from protocol.messages import UsageReceipt
from protocol.pricing import PPM
from protocol.work import BENCHMARK_BYTES, BENCHMARK_COMMAND, score_of

__all__ = ["TOLERANCE_PPM", "ScoreCheck", "ScoreCheckError", "check_score"]

# A stated score up to 50 % above the measured one is believed: CPU time per hash varies
# with what else the machine runs (caches, frequency), by up to a third on a busy 2-core host.
TOLERANCE_PPM = 500_000
_KERNEL_OUTPUT = hashlib.md5(bytes(BENCHMARK_BYTES)).hexdigest()  # noqa: S324 - the kernel's


class ScoreCheckError(Exception):
    """The check could not be made (no such offer, no score stated, the job did not run)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ScoreCheck:
    provider: str
    job_id: str
    stated: int
    measured: int
    honest: bool  # the kernel's output was right and the score within the tolerance
    detail: str


async def check_score(
    buyer: Buyer, provider: str, *, tolerance_ppm: int = TOLERANCE_PPM
) -> ScoreCheck:
    """Run the benchmark on ``provider`` (a peer id) and judge its stated score.

    Raises:
        ScoreCheckError: see the class.
    """
    market = buyer.market
    key = PublicKey.from_peer_id(provider).raw
    offers = [
        o for o in market.trader.book.live_offers(market.now_ms()) if o.order.signer.raw == key
    ]
    if not offers:
        raise ScoreCheckError(f"{provider} has no live offer here")
    offer = max(offers, key=lambda o: o.order.issued_ms).offer
    if not offer.work_score:
        raise ScoreCheckError(f"{provider}'s offer states no work score")
    image = await trio.to_thread.run_sync(benchmark_image, market.store)
    request = build_request(
        image=image,
        command=BENCHMARK_COMMAND,
        cpu_milli=1000,
        memory_bytes=128 << 20,
        wall_ms=300_000,
        max_prices={
            "cpu_core_hour": offer.prices.cpu_core_hour,
            "memory_gib_hour": offer.prices.memory_gib_hour,
        },
        provider=provider,
        name=f"score check of {provider[-8:]}",
    )
    job = await buyer.submit(request)
    while (job := buyer.db.job(job.id) or job).state not in FINAL_STATES:
        await market.changed()
    stored = buyer.db.receipt(job.agreement_id) if job.agreement_id else None
    if job.state != "succeeded" or stored is None:
        raise ScoreCheckError(f"the benchmark job {job.id} ended {job.state}: {job.detail}")
    receipt = open_signed(stored[0], UsageReceipt).payload
    measured = score_of(BENCHMARK_BYTES, receipt.usage.cpu_us) if receipt.usage.cpu_us else 0
    stdout = next((r["digest"] for r in job.logs or [] if r["path"] == "/dev/stdout"), None)
    output = market.store.read_bytes(stdout).decode(errors="replace") if stdout else ""
    if not output.startswith(_KERNEL_OUTPUT):
        honest, detail = False, "its job did not output the kernel's hash: the work was not done"
    elif offer.work_score * PPM > measured * (PPM + tolerance_ppm):
        honest = False
        detail = f"it states {offer.work_score} work units per core-hour, {measured} were measured"
    else:
        honest, detail = True, f"stated {offer.work_score}, measured {measured}: within tolerance"
    if not honest:
        market.trader.reputation[key] = -1  # not again, with this buyer
        buyer.distrusted.add(key)
    return ScoreCheck(
        provider=provider,
        job_id=job.id,
        stated=offer.work_score,
        measured=measured,
        honest=honest,
        detail=detail,
    )
