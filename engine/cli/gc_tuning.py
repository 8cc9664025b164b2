"""The garbage collector's thresholds for the long-running engine processes.

A processor keeps thousands of instances in its cache (their executions, journals and
rows: a large, growing heap of objects), and CPython's default thresholds (700, 10, 10)
make it scan all of them again and again: in a chain3 throughput run the default
collections took 3.4-3.9 s of the processor's 16-19.5 CPU-s, 19 of them full collections
of ~130 ms each (the young objects of one turn are far more than 700). With (10,000, 20,
100) the same run spent 1.35-1.5 s collecting, with no full collection, and the young
collections stay short (~4 ms). Reference cycles are still collected, only less often; a
user module that sets its own thresholds after import wins, since this runs first.
"""

from __future__ import annotations

import gc

__all__ = ["ENGINE_GC_THRESHOLDS", "tune_gc"]

#: Collect the youngest generation every 10,000 net allocations, the middle one every 20
#: young collections and consider a full collection every 100 middle ones.
ENGINE_GC_THRESHOLDS = (10_000, 20, 100)


def tune_gc() -> None:
    """Set :data:`ENGINE_GC_THRESHOLDS` for this process (``run processor``, ``run worker``)."""
    gc.set_threshold(*ENGINE_GC_THRESHOLDS)
