"""What the processor's metrics cost per workflow, on the chain3 inline path.

    .venv/bin/python benchmarks/metrics_overhead.py [--batch 100] [--partitions 8]

Replays, without a broker, exactly the metric calls the processor loop makes for one
committed batch of chain3.inline starts (a record counted per input, each partition's
counters with the run tallies chain3 produces, the turn and phase timings, the batch, the
lag of each input partition) plus the services-side tallies (one ``Counters.recorded`` per
history event, eight per chain3 instance), and divides by the workflows in the batch. The
result is compared with the processor CPU per inline workflow measured by
``benchmarks/chain3.py`` (``--cpu-ms-per-wf``, default 0.33 ms from RESULTS.md).
"""

from __future__ import annotations

import argparse
import time

from common import emit, progress

from engine.adapters.metrics import PHASES, ProcessorMetrics
from engine.core.history import (
    ExecutionCompleted,
    ExecutionStarted,
    InlineStepCompleted,
    RuntimeStatus,
    TurnStarted,
)
from engine.services.processor.partition import Counters, InstanceCache

CHAIN3_EVENTS = (
    ExecutionStarted("chain3.inline"),
    TurnStarted(0),
    InlineStepCompleted(1, "add"),
    InlineStepCompleted(2, "add"),
    InlineStepCompleted(3, "add"),
    ExecutionCompleted(RuntimeStatus.COMPLETED),
)


def one_batch(m: ProcessorMetrics, caches: list[InstanceCache], batch: int) -> None:
    partitions = len(caches)
    for _ in range(batch):
        m.record_in("turnstile.commands")
    for p, cache in enumerate(caches):
        counters = Counters(records=batch // partitions, turns=batch // partitions)
        for _ in range(batch // partitions):
            for body in CHAIN3_EVENTS:
                counters.recorded("chain3.inline", "", body)
        m.partition_batch(p, counters, cache)
    m.turn(0.01)
    for name in PHASES:
        m.phase(name, 0.001)
    m.batch(batch * 4)
    for p in range(partitions):
        m.consumer_lag("turnstile.commands", p, 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=100, help="workflows per batch (100)")
    parser.add_argument("--partitions", type=int, default=8, help="partitions (8)")
    parser.add_argument("--batches", type=int, default=2000, help="batches to time (2000)")
    parser.add_argument("--cpu-ms-per-wf", type=float, default=0.33)
    args = parser.parse_args(argv)
    m = ProcessorMetrics()
    caches = [InstanceCache(100) for _ in range(args.partitions)]
    for _ in range(100):
        one_batch(m, caches, args.batch)  # warm up: every label child exists
    progress(f"timing {args.batches} batches of {args.batch} workflows")
    started = time.process_time()
    for _ in range(args.batches):
        one_batch(m, caches, args.batch)
    cpu_s = time.process_time() - started
    us_per_wf = cpu_s / (args.batches * args.batch) * 1e6
    emit(
        {
            "benchmark": "metrics_overhead",
            "batch": args.batch,
            "partitions": args.partitions,
            "metrics_us_per_wf": round(us_per_wf, 3),
            "processor_cpu_ms_per_wf": args.cpu_ms_per_wf,
            "overhead_pct": round(us_per_wf / (args.cpu_ms_per_wf * 1000) * 100, 2),
        }
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
