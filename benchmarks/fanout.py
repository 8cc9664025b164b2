"""Fan-out on the engine: one instance starts n activities at once (when_all) and sums them.

Where chain3 measures many small instances, this measures one instance with many tasks in
flight: scheduling a burst of activity tasks in one turn, the worker draining them, and
the processor folding a stream of results into few turns of one growing history.

Wall time = start -> completion seen by the client; activities/s = n / wall. One warm-up
instance (n / 10), then ``repeats`` measured ones; medians reported.

    .venv/bin/python benchmarks/fanout.py [--n 1000] [--bootstrap-servers HOST:PORT]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import harness
from common import CpuSpan, emit, git_commit, host_info, median, progress

from engine.client import Client
from engine.core.errors import WaitTimeoutError

WORKFLOW = "fanout.fan"
MODULE = "engine.examples.fanout"


@dataclass(frozen=True)
class Params:
    n: int = 1000
    repeats: int = 3
    partitions: int = 8
    worker_concurrency: int = 16
    timeout_s: float = 600.0


def one_run(client: Client, eng: harness.Engine, n: int, timeout_s: float) -> dict[str, Any]:
    """Start one fan-out instance of ``n`` activities and wait for its sum."""
    with CpuSpan(eng.pids) as cpu:
        t0 = time.perf_counter()
        instance = client.start(WORKFLOW, n)
        try:
            state = client.wait_for_completion(instance, timeout=timeout_s)
        except WaitTimeoutError as exc:
            raise RuntimeError(f"{exc}\n{eng.describe()}") from None
        wall = time.perf_counter() - t0
    eng.check_alive()
    expected = n * (n - 1) // 2
    if state.output != expected:
        raise AssertionError(
            f"fan-out {instance} ended {state.status.value} with {state.output!r}, "
            f"expected {expected} (failure: {state.failure})"
        )
    return {
        "n": n,
        "wall_s": round(wall, 4),
        "activities_per_s": round(n / wall, 1),
        "cpu_s": cpu.seconds(),
        "machine_avg_busy_cores": round(cpu.machine_busy_s / wall, 3),
    }


def run(broker: harness.Broker, params: Params) -> dict[str, Any]:
    with (
        harness.engine(
            broker,
            "fanout",
            MODULE,
            params.partitions,
            with_worker=True,
            worker_concurrency=params.worker_concurrency,
        ) as eng,
        Client(settings=eng.settings, timeout=60) as client,
    ):
        progress(f"fanout: warm-up with n={max(params.n // 10, 1)}")
        one_run(client, eng, max(params.n // 10, 1), params.timeout_s)
        runs = []
        for i in range(params.repeats):
            rec = {"run": i, **one_run(client, eng, params.n, params.timeout_s)}
            emit({"benchmark": "fanout", **rec})
            progress(f"fanout run {i}: {rec['wall_s']} s, {rec['activities_per_s']} act/s")
            runs.append(rec)
    med = {
        "wall_s": round(median(r["wall_s"] for r in runs), 3),
        "activities_per_s": round(median(r["activities_per_s"] for r in runs), 1),
        "cpu_s": {
            name: round(median(r["cpu_s"][name] for r in runs), 3) for name in runs[0]["cpu_s"]
        },
    }
    result = {
        "benchmark": "fanout",
        "workflow": WORKFLOW,
        "params": asdict(params),
        "host": host_info(),
        "commit": git_commit(),
        "runs": runs,
        "median": med,
        "processor_progress": eng.processor_progress,
    }
    emit({k: v for k, v in result.items() if k != "runs"})
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--worker-concurrency", type=int, default=16)
    parser.add_argument("--bootstrap-servers", help="use this broker instead of a private one")
    parser.add_argument("--no-results-md", action="store_true", help="do not touch RESULTS.md")
    args = parser.parse_args(argv)
    params = Params(args.n, args.repeats, args.partitions, args.worker_concurrency)
    import results_md

    with harness.kafka(args.bootstrap_servers) as broker:
        result = run(broker, params)
    if not args.no_results_md:
        results_md.add_fanout(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
