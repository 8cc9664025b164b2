"""What the processor's metrics cost per workflow, on the chain3 inline path.

    .venv/bin/python benchmarks/metrics_overhead.py [--batch 100] [--partitions 8]

Replays, without a broker, exactly the metric work the processor does for one committed
batch of chain3.inline starts: the services-side tallies (a topic tally per input record,
one ``Counters.recorded`` per history event, eight per chain3 instance), the loop adding
each partition's batch counters to its progress totals, and the commit protocol's calls of
the ``BatchMetrics`` hook (``ProcessorMetrics.observe``, one per step), then divides by the
workflows in the batch. Scrapes read the totals and cost nothing per batch. The result is
compared with the processor CPU per inline workflow measured by ``benchmarks/chain3.py``
(``--cpu-ms-per-wf``, default 0.33 ms from RESULTS.md).
"""

from __future__ import annotations

import argparse
import time

from common import emit, progress

from engine.adapters.metrics import ProcessorMetrics
from engine.core.history import (
    ExecutionCompleted,
    ExecutionStarted,
    InlineStepCompleted,
    RuntimeStatus,
    TurnStarted,
)
from engine.services.processor.protocol import Step
from engine.services.processor.state import Counters, Progress

CHAIN3_EVENTS = (
    ExecutionStarted("chain3.inline"),
    TurnStarted(0),
    InlineStepCompleted(1, "add"),
    InlineStepCompleted(2, "add"),
    InlineStepCompleted(3, "add"),
    ExecutionCompleted(RuntimeStatus.COMPLETED),
)


#: The hook calls of one committed batch, in protocol order (step, count per workflow).
STEPS = (Step.POLL, Step.ACCEPT, Step.TIMERS, Step.STEP, Step.PRODUCE, Step.OFFSETS)


def one_batch(m: ProcessorMetrics, progress_: Progress, partitions: int, batch: int) -> None:
    for _ in range(partitions):
        counters = Counters(records=batch // partitions, turns=batch // partitions)
        for _ in range(batch // partitions):
            counters.topics["turnstile.commands"] = counters.topics.get("turnstile.commands", 0) + 1
            counters.cache_misses += 1
            for body in CHAIN3_EVENTS:
                counters.recorded("chain3.inline", "", body)
        progress_.add(counters)
    for step in STEPS:
        m.observe(step, 0.001, batch)
    m.observe(Step.COMMIT, 0.001, 1)
    m.observe(Step.APPLY, 0.001, batch * 4)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=100, help="workflows per batch (100)")
    parser.add_argument("--partitions", type=int, default=8, help="partitions (8)")
    parser.add_argument("--batches", type=int, default=2000, help="batches to time (2000)")
    parser.add_argument("--cpu-ms-per-wf", type=float, default=0.33)
    args = parser.parse_args(argv)
    m, totals = ProcessorMetrics(), Progress()
    for _ in range(100):
        one_batch(m, totals, args.partitions, args.batch)  # warm up
    progress(f"timing {args.batches} batches of {args.batch} workflows")
    started = time.process_time()
    for _ in range(args.batches):
        one_batch(m, totals, args.partitions, args.batch)
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
