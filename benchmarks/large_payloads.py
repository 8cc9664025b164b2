"""What a large payload costs: one workflow whose input, activity input, activity result and
output are each a value of ``--size`` bytes (20 MB by default), kept as chunks on the
payloads topic.

    .venv/bin/python benchmarks/large_payloads.py [--bootstrap-servers HOST:PORT]
        [--size 20000000] [--runs 5] [--partitions 4]

A processor and a worker (``python -m engine run``) on fresh topics; the client starts one
workflow at a time and waits for its output, decoded and checked. The round trip is from
the ``start`` call (the client writes the input's chunks) to the output's value in the
client (read back from the payloads topic): eight chunk sets written or read on the way
(the input by client and processor, the activity's input by processor and worker, its
result by worker and processor, the output by processor and client). Reported: the median,
fastest and slowest of ``--runs`` runs after one warm-up, and the payload bytes moved per
second of round trip (4 x size / median). The row goes to
``benchmarks/results/large-payloads.jsonl``.
"""

from __future__ import annotations

import argparse
import time

import harness
import results_md
from common import emit, git_commit, host_info, machine_line, median, progress
from large_payload_workload import value_of

from engine.client import Client

MODULE = "benchmarks.large_payload_workload"


def one_round_trip(client: Client, eng: harness.Engine, size: int, seed: str) -> float:
    text = value_of(size, seed)
    t0 = time.perf_counter()
    run = client.start("large.round_trip", text)
    state = client.wait_for_completion(run, timeout=600)
    took = time.perf_counter() - t0
    eng.check_alive()
    if state.output != text[::-1]:
        raise AssertionError(f"instance {run} gave back another value")
    return took


def measure(args: argparse.Namespace, broker: harness.Broker) -> list[float]:
    engine = harness.engine(broker, "large", MODULE, args.partitions, with_worker=True)
    with engine as eng, Client(settings=eng.settings) as client:
        one_round_trip(client, eng, args.size, "warm-up")
        times = []
        for n in range(args.runs):
            took = one_round_trip(client, eng, args.size, f"run {n}")
            progress(f"run {n}: {took:.2f} s")
            emit({"benchmark": "large_payloads", "run": n, "seconds": round(took, 3)})
            times.append(took)
    return times


def row(args: argparse.Namespace, times: list[float]) -> list[str]:
    host = host_info()
    date = host["date_utc"].replace("T", " ").rstrip("Z")
    mid = median(times)
    return [
        date,
        git_commit(),
        machine_line(host),
        str(args.runs),
        f"{args.size / 1e6:g} MB",
        f"{mid:.2f}",
        f"{min(times):.2f} / {max(times):.2f}",
        f"{4 * args.size / 1e6 / mid:.1f}",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers", help="an existing broker (default: start one)")
    parser.add_argument("--size", type=int, default=20_000_000, help="bytes (20000000)")
    parser.add_argument("--runs", type=int, default=5, help="measured runs (5)")
    parser.add_argument("--partitions", type=int, default=4, help="partitions (4)")
    parser.add_argument("--no-record", action="store_true", help="do not add the row")
    args = parser.parse_args(argv)
    with harness.kafka(args.bootstrap_servers) as broker:
        times = measure(args, broker)
    cells = row(args, times)
    emit({"benchmark": "large_payloads", "row": cells})
    if not args.no_record:
        results_md.append_record(results_md.make_record("large-payloads", cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
