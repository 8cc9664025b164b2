"""What the query and update benchmarks share: one processor serving ``chain3.queried``,
starts timed one at a time (start-to-outcome), then ``--n`` round trips of one verb timed the
same way, round robin over the instances, and the row beside the start's numbers.

A verb is a :class:`Verb`: its benchmark name, the word for its round trips, and the
function that runs ``n`` of them (checking every answer) and returns their latencies.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import harness
from common import emit, git_commit, host_info, latency_summary, machine_line, progress

from engine.client import Client

MODULE = "engine.examples.chain3"
WORKFLOW = "chain3.queried"

#: (client, instance ids, how many, the instances' start offset) -> latencies in ms
Measure = Callable[[Client, list[str], int, int], list[float]]


@dataclass(frozen=True)
class Verb:
    benchmark: str  # "queries": the results file and RESULTS.md table
    key: str  # "query": the result's key for its latencies
    plural: str  # "queries": for the progress lines
    measure: Measure


def timed_starts(client: Client, n: int, offset: int) -> tuple[list[str], list[float]]:
    handles, lat_ms = [], []
    for i in range(n):
        t0 = time.perf_counter()
        handle = client.start(WORKFLOW, offset + i)
        lat_ms.append((time.perf_counter() - t0) * 1000.0)
        handles.append(handle)
    return handles, lat_ms


def run(verb: Verb, broker: harness.Broker, args: argparse.Namespace) -> dict[str, Any]:
    with (
        harness.engine(broker, verb.benchmark, MODULE, args.partitions, with_worker=False) as eng,
        Client(settings=eng.settings, timeout=60) as client,
    ):
        progress(f"warm-up: 50 starts and 100 {verb.plural}")
        warm, _ = timed_starts(client, 50, 0)
        verb.measure(client, warm, 100, 0)
        progress(f"{args.instances} starts, then {args.n} {verb.plural}, one at a time")
        handles, start_ms = timed_starts(client, args.instances, 1000)
        verb_ms = verb.measure(client, handles, args.n, 1000)
        eng.check_alive()
        for handle in [*warm, *handles]:
            client.raise_event(handle, "done", wait=False, flush=False)
        client.flush()
    start, measured = latency_summary(start_ms), latency_summary(verb_ms)
    return {
        "benchmark": verb.benchmark,
        "commit": git_commit(),
        "host": host_info(),
        "params": {"instances": args.instances, "n": args.n, "partitions": args.partitions},
        "start_to_outcome": start,
        verb.key: measured,
        f"{verb.key}_p50_vs_start_p50": round(measured["p50_ms"] / start["p50_ms"], 3),
    }


def add_row(verb: Verb, result: dict[str, Any], extra: list[Any]) -> None:
    """The run's row in ``benchmarks/results/<benchmark>.jsonl`` (and RESULTS.md)."""
    import results_md

    start, measured, params = result["start_to_outcome"], result[verb.key], result["params"]
    cells = [
        str(result["host"]["date_utc"]).replace("T", " ").rstrip("Z"),
        result["commit"],
        machine_line(result["host"]),
        " / ".join(f"{x:.2f}" for x in os.getloadavg()),
        ", ".join(f"{k}={v}" for k, v in params.items()),
        f"{start['p50_ms']} / {start['p99_ms']}",
        f"{measured['p50_ms']} / {measured['p99_ms']}",
        result[f"{verb.key}_p50_vs_start_p50"],
        *extra,
    ]
    results_md.append_record(results_md.make_record(verb.benchmark, cells))


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--bootstrap-servers", help="use this broker instead of a private one")
    p.add_argument("--instances", type=int, default=20)
    p.add_argument("--n", type=int, default=300)
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--no-record", action="store_true", help="do not add a results row")
    return p


def main(verb: Verb, args: argparse.Namespace, extra: list[Any]) -> int:
    with harness.kafka(args.bootstrap_servers) as broker:
        result = run(verb, broker, args)
    emit(result)
    if not args.no_record:
        add_row(verb, result, extra)
    ratio = result[f"{verb.key}_p50_vs_start_p50"]
    progress(
        f"{machine_line(result['host'])}: start p50 {result['start_to_outcome']['p50_ms']} ms, "
        f"{verb.key} p50 {result[verb.key]['p50_ms']} ms ({ratio}x)"
    )
    return 0
