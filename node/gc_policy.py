"""The node process's cyclic garbage collector, tuned for a large long-lived order book.

CPython's defaults (700, 10, 10) run a young collection every 700 net new objects and a
full one each time the heap has grown by a quarter; a book of resting orders is ten-odd
objects per order that all survive, so with the defaults every gossiped order paid about
12 µs of collections on this machine (bench/ingest.py), as much as all its other Python.
The node's garbage is nearly all freed by reference counting; cycles (trio's exceptions,
closed connections) are few and small, so collecting them less often costs little memory.
"""

from __future__ import annotations

import gc

__all__ = ["NODE_THRESHOLDS", "tune_gc"]

# A young collection every 100,000 net new objects, a middle one every 20 of those, a full
# one every 100 middle ones (and only once the heap grew by a quarter, as always).
NODE_THRESHOLDS = (100_000, 20, 100)


def tune_gc() -> None:
    """Set the node's thresholds and move what start-up made (modules, classes, config)
    out of every later collection's way: none of it is garbage, nor ever will be."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*NODE_THRESHOLDS)
