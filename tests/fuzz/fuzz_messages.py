"""Fuzz the decoder and message opener: anything but DecodeError/InvalidMessage is a bug.

    .venv/bin/python tests/fuzz/fuzz_messages.py [COUNT] [SEED]

Inputs: random bytes, and valid signed offers, bids and encoded values with random byte
flips, insertions, deletions, truncations and splices. Prints the count, how the inputs
ended, and exits non-zero on the first unexpected exception. The test suite runs a short
run of it; the issue's million-input run is the same script with COUNT=1000000.
"""

from __future__ import annotations

import random
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from factories import HOUR_MS, T0, Nonces, bid, key, offer

from protocol.encoding import decode, encode
from protocol.envelope import open_signed, seal
from protocol.errors import DecodeError, InvalidMessage


def corpora() -> tuple[list[bytes], list[bytes]]:
    """Signed wires (for open_signed) and bare encodings (for decode)."""
    nonce = Nonces("fuzz")
    signer = key("fuzz")
    wires = [
        seal(signer, payload, nonce=nonce(), issued_ms=T0, expires_ms=T0 + HOUR_MS).wire
        for payload in (offer(), bid(), offer(region="us"), bid(cpu_milli=250))
    ]
    values = [encode({"a": [1, -1, 2**40, b"x" * 40, "é" * 10, {"n": [True, False]}]})]
    return wires, [wire[64:] for wire in wires] + values


def mutate(rng: random.Random, seed: bytes, corpus: list[bytes]) -> bytes:
    data = bytearray(seed)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(5)
        pos = rng.randrange(len(data) + 1)
        if op == 0 and data:
            data[min(pos, len(data) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1:
            data[pos:pos] = bytes([rng.randrange(256)])
        elif op == 2:
            del data[pos : pos + rng.randint(1, 8)]
        elif op == 3:
            del data[pos:]
        else:
            other = rng.choice(corpus)
            start = rng.randrange(len(other))
            data[pos:pos] = other[start : start + rng.randint(1, 32)]
    return bytes(data)


def run(count: int, seed: int = 0) -> Counter[str]:
    rng = random.Random(seed)
    wires, bodies = corpora()
    outcomes: Counter[str] = Counter()
    for i in range(count):
        fn, seeds = (open_signed, wires) if i % 2 else (decode, bodies)
        if i % 4 < 2:
            data = rng.randbytes(rng.randint(0, 300))
        else:
            data = mutate(rng, rng.choice(seeds), seeds)
        try:
            fn(data)
            outcomes["accepted"] += 1
        except (DecodeError, InvalidMessage) as exc:
            outcomes[exc.reason.value] += 1
    return outcomes


def main() -> int:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    outcomes = run(count, seed)
    print(f"{count} inputs, seed {seed}, no unexpected exception")
    for reason, n in outcomes.most_common():
        print(f"  {reason:<20}{n:>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
