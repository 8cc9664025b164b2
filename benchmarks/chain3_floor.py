"""Where one chain3.inline instance's start-to-result time goes: the floor of one turn.

Sequential instances, as in chain3's latency runs, each one timed on the client at three
points (start called, the command acknowledged by the broker, the completed status seen by
the client's status reader) and stamped by the processor (``last_updated_ms`` of the
status: the clock of the turn that completed it, read right after its fetch returned). The
processor serves its Prometheus metrics (``--metrics-port``); the turn and transaction-phase
histograms (``turnstile_turn_duration_seconds``, ``turnstile_transaction_phase_seconds``)
are read before and after each run, so their sums over the run give the time per instance
of the turn and of each transaction phase. Segments, as means per instance:

- ``client_produce``: start called -> the broker acknowledged the command (acks=all);
- ``fetch_wakeup``: acknowledged -> the processor's turn began (processor clock, 1 ms
  resolution, so +0.5 ms; it can overlap the acknowledgement);
- ``turn``, ``txn_produce``, ``txn_send_offsets``, ``txn_commit``: the processor's own
  measurements of protocol steps 4-7;
- ``status_read``: the rest: commit returned -> the client has the status (the broker
  writing the commit markers, the status reader's fetch, decoding, waking the waiter).

The start is sent with ``wait=False`` (chain3's latency runs also wait for the command's
answer on the outcomes topic, which comes from the same transaction as the status).
Timings live here, never in tests. Runs on one machine, so the client's and the
processor's wall clocks are the same clock.

    .venv/bin/python benchmarks/chain3_floor.py [--n 300] [--repeats 3] [--bootstrap-servers ...]
"""

from __future__ import annotations

import argparse
import contextlib
import re
import socket
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import chain3
import harness
import results_md
from common import CpuSpan, emit, git_commit, host_info, latency_summary, median, progress

from engine.client import Client

#: Metric sample names -> the segment they measure (sums in seconds).
PHASE_METRICS = {
    "turnstile_turn_duration_seconds_sum": "turn",
    'turnstile_transaction_phase_seconds_sum{phase="produce"}': "txn_produce",
    'turnstile_transaction_phase_seconds_sum{phase="offsets"}': "txn_send_offsets",
    'turnstile_transaction_phase_seconds_sum{phase="commit"}': "txn_commit",
}
TRANSACTIONS = "turnstile_transactions_total"
SEGMENTS = results_md.FLOOR_SEGMENTS
_SAMPLE = re.compile(r"^([a-z_]+(?:\{[^}]*\})?) ([0-9.eE+-]+)$")
#: A transaction phase's histogram bucket (labels in either order).
_BUCKET = "turnstile_transaction_phase_seconds_bucket{"
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[str, float]:
    """The processor's metric samples (name with labels -> value)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match:
            out[match.group(1)] = float(match.group(2))
    return out


@contextlib.contextmanager
def floor_engine(
    broker: harness.Broker, partitions: int, port: int, kafka: list[str]
) -> Iterator[harness.Engine]:
    """A fresh namespace and one processor serving its metrics on ``port``, with the
    librdkafka settings ``kafka`` (``KEY=VALUE``) on top of the engine's own."""
    settings = harness.create_topics(
        broker.bootstrap, harness.fresh_namespace("chain3-floor"), partitions
    )
    work_dir = Path(tempfile.mkdtemp(prefix="turnstile-bench-floor-"))
    extra = ["--metrics-port", str(port), *(a for kv in kafka for a in ("--kafka", kv))]
    process = harness.spawn("processor", settings, chain3.MODULE, work_dir, extra)
    with harness.kept_if_failed(work_dir, "the processor's log"):
        try:
            yield harness.Engine(settings, work_dir, [process], broker.pid)
        finally:
            process.stop()


def _one(client: Client, i: int, timeout_s: float) -> dict[str, float]:
    """One instance: client-side marks (ms) and the processor's turn stamp."""
    w0, p0 = time.time(), time.perf_counter()
    instance = client.start(chain3.WORKFLOWS["inline"], i, wait=False)
    p1 = time.perf_counter()
    state = client.wait_for_completion(instance, timeout=timeout_s)
    p2 = time.perf_counter()
    chain3._check(state, i + chain3.STEPS)
    turn_at_ms = state.raw.last_updated_ms + 0.5 - w0 * 1000.0  # ms after the start call
    return {
        "total": (p2 - p0) * 1000.0,
        "client_produce": (p1 - p0) * 1000.0,
        "turn_at": turn_at_ms,
    }


def floor_run(
    client: Client, eng: harness.Engine, port: int, n: int, run: object
) -> dict[str, Any]:
    """``n`` sequential instances; the mean of each segment per instance."""
    before = scrape(port)
    with CpuSpan(eng.pids) as cpu:
        samples = [_one(client, i, 60.0) for i in range(n)]
    after = scrape(port)
    eng.check_alive()
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in (*PHASE_METRICS, TRANSACTIONS)}
    mean = {k: statistics.fmean(s[k] for s in samples) for k in samples[0]}
    seg = {"client_produce": mean["client_produce"]}
    seg["fetch_wakeup"] = mean["turn_at"] - mean["client_produce"]
    for metric, name in PHASE_METRICS.items():
        seg[name] = delta[metric] * 1000.0 / n
    seg["status_read"] = (
        mean["total"] - mean["turn_at"] - sum(seg[name] for name in PHASE_METRICS.values())
    )
    return {
        "run": run,
        "n": n,
        "phase_buckets": phase_buckets(before, after),
        "transactions_per_instance": round(delta[TRANSACTIONS] / n, 3),
        "segments_ms": {k: round(seg[k], 3) for k in SEGMENTS},
        "total_mean_ms": round(mean["total"], 3),
        **latency_summary([s["total"] for s in samples]),
        **cpu.as_dict(per=n),
    }


def phase_buckets(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """Per transaction phase, how many of the run's transactions took at most each bucket's
    bound (cumulative, as Prometheus keeps them): whether a phase is steady or has a tail."""
    out: dict[str, dict[str, int]] = {}
    for name, value in after.items():
        if name.startswith(_BUCKET):
            labels = dict(_LABEL.findall(name))
            count = int(value - before.get(name, 0.0))
            out.setdefault(labels.get("phase", "?"), {})[labels.get("le", "?")] = count
    return out


@dataclass
class Variant:
    """One processor configuration under test, with its engine, client and runs."""

    label: str
    kafka: list[str]
    port: int = 0
    eng: harness.Engine | None = None
    client: Client | None = None
    runs: list[dict[str, Any]] = field(default_factory=list)


def measure(broker: harness.Broker, params: argparse.Namespace) -> list[dict[str, Any]]:
    """Warm-up, then ``repeats`` floor runs per variant, interleaved (A, B, A, B...) so
    load changes hit both alike; medians of the segment means, per variant."""
    variants = [Variant("default", [])]
    if params.ab:
        variants.append(Variant(" ".join(params.ab), list(params.ab)))
    warm = chain3.Params(variant="inline", partitions=params.partitions)
    with contextlib.ExitStack() as stack:
        for v in variants:
            v.port = free_port()
            v.eng = stack.enter_context(floor_engine(broker, params.partitions, v.port, v.kafka))
            # the client takes the variant's settings too: its produce and its status
            # reads are segments of the floor
            extra = dict(kv.split("=", 1) for kv in v.kafka)
            settings = replace(v.eng.settings, extra_kafka={**v.eng.settings.extra_kafka, **extra})
            v.client = stack.enter_context(Client(settings=settings, timeout=60))
        for v in variants:
            assert v.eng is not None and v.client is not None
            progress(f"chain3 floor [{v.label}]: warm-up {params.warmup} + 50")
            chain3.throughput_run(v.client, v.eng, warm, params.warmup, "warmup")
            floor_run(v.client, v.eng, v.port, 50, "warmup")
        for run in range(params.repeats):
            for v in variants:
                assert v.eng is not None and v.client is not None
                record = floor_run(v.client, v.eng, v.port, params.n, run)
                emit({"benchmark": "chain3-floor", "variant": v.label, **record})
                progress(f"chain3 floor [{v.label}] run {run}: {record['segments_ms']}")
                v.runs.append(record)
    return [_result(params, v.label, v.runs) for v in variants]


def _result(params: argparse.Namespace, label: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    med = {k: round(median(r["segments_ms"][k] for r in runs), 3) for k in SEGMENTS}
    kept = {k: v for k, v in vars(params).items() if k not in ("bootstrap_servers", "ab")}
    return {
        "benchmark": "chain3-floor",
        "variant": label,
        "params": {**kept, "kafka": label},
        "host": host_info(),
        "commit": git_commit(),
        "runs": runs,
        "median": {
            "segments_ms": med,
            "total_mean_ms": round(median(r["total_mean_ms"] for r in runs), 3),
            "p50_ms": round(median(r["p50_ms"] for r in runs), 3),
            "transactions_per_instance": median(r["transactions_per_instance"] for r in runs),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300, help="instances per run (300)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=300, help="throughput warm-up (300)")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--bootstrap-servers", help="use this broker instead of a private one")
    parser.add_argument(
        "--ab",
        nargs="+",
        metavar="KEY=VALUE",
        help="also measure a processor and client with these librdkafka settings, interleaved",
    )
    parser.add_argument("--no-results-md", action="store_true", help="do not touch RESULTS.md")
    args = parser.parse_args(argv)
    with harness.kafka(args.bootstrap_servers) as broker:
        if broker.pid is not None:
            chain3.warm_up_broker(broker, args.partitions, rounds=1)
        results = measure(broker, args)
    for result in results:
        emit({k: v for k, v in result.items() if k != "runs"})
        if not args.no_results_md:
            results_md.add_floor(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
