"""Update round trip against start-to-outcome: how long a client waits for an update's
result, next to how long it waits for a start's answer, on the same engine.

    .venv/bin/python benchmarks/updates.py [--instances 20] [--n 300] [--partitions 8]

One processor (no worker: the workload has no activities) serves ``chain3.queried``, whose
update ``add`` adds its argument to a total and returns it in the turn that accepts it. The
benchmark starts ``--instances`` of them one at a time (each start waits for the
processor's ACCEPTED answer: start-to-outcome), then sends update ``add`` ``--n`` times, one
at a time, round robin over the instances (each waits for its result on command-outcomes),
checking every result. An update is a command and an answer like a start, plus the turn
that journals it (``UpdateAccepted`` and ``UpdateCompleted``) before the answer goes out;
a start's answer also waits for one batch, so "at most one turn more" is an update p50 of
at most 2x the start p50. Every run adds its row to ``benchmarks/results/updates.jsonl``
and writes RESULTS.md again.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import harness
from common import emit, git_commit, host_info, latency_summary, machine_line, progress

from engine.client import Client

MODULE = "engine.examples.chain3"
WORKFLOW = "chain3.queried"


def _starts(client: Client, n: int, offset: int) -> tuple[list[str], list[float]]:
    handles, lat_ms = [], []
    for i in range(n):
        t0 = time.perf_counter()
        handle = client.start(WORKFLOW, offset + i)
        lat_ms.append((time.perf_counter() - t0) * 1000.0)
        handles.append(handle)
    return handles, lat_ms


def _updates(client: Client, handles: list[str], n: int, offset: int) -> list[float]:
    """``n`` updates ``add 1`` round robin; each result is the instance's start value plus
    the updates it has taken so far."""
    lat_ms, taken = [], [0] * len(handles)
    for i in range(n):
        k = i % len(handles)
        t0 = time.perf_counter()
        value = client.update(handles[k], "add", 1, timeout=60)
        lat_ms.append((time.perf_counter() - t0) * 1000.0)
        taken[k] += 1
        if value != offset + k + taken[k]:
            raise RuntimeError(
                f"update add of {handles[k]} answered {value!r}, not {offset + k + taken[k]}"
            )
    return lat_ms


def run(broker: harness.Broker, args: argparse.Namespace) -> dict[str, Any]:
    with (
        harness.engine(broker, "updates", MODULE, args.partitions, with_worker=False) as eng,
        Client(settings=eng.settings, timeout=60) as client,
    ):
        progress("warm-up: 50 starts and 100 updates")
        warm, _ = _starts(client, 50, 0)
        _updates(client, warm, 100, 0)
        progress(f"{args.instances} starts, then {args.n} updates, one at a time")
        handles, start_ms = _starts(client, args.instances, 1000)
        update_ms = _updates(client, handles, args.n, 1000)
        eng.check_alive()
        for handle in [*warm, *handles]:
            client.raise_event(handle, "done", wait=False, flush=False)
        client.flush()
    start, update = latency_summary(start_ms), latency_summary(update_ms)
    return {
        "benchmark": "updates",
        "commit": git_commit(),
        "host": host_info(),
        "params": {"instances": args.instances, "n": args.n, "partitions": args.partitions},
        "start_to_outcome": start,
        "update": update,
        "update_p50_vs_start_p50": round(update["p50_ms"] / start["p50_ms"], 3),
    }


def add_row(result: dict[str, Any], note: str) -> None:
    """The run's row in ``benchmarks/results/updates.jsonl`` (and RESULTS.md)."""
    import results_md

    start, update, params = result["start_to_outcome"], result["update"], result["params"]
    cells = [
        str(result["host"]["date_utc"]).replace("T", " ").rstrip("Z"),
        result["commit"],
        machine_line(result["host"]),
        " / ".join(f"{x:.2f}" for x in os.getloadavg()),
        ", ".join(f"{k}={v}" for k, v in params.items()),
        f"{start['p50_ms']} / {start['p99_ms']}",
        f"{update['p50_ms']} / {update['p99_ms']}",
        result["update_p50_vs_start_p50"],
        note,
    ]
    results_md.append_record(results_md.make_record("updates", cells))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers", help="use this broker instead of a private one")
    parser.add_argument("--instances", type=int, default=20)
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--note", default="", help="what else ran on the machine meanwhile")
    parser.add_argument("--no-record", action="store_true", help="do not add a results row")
    args = parser.parse_args(argv)
    with harness.kafka(args.bootstrap_servers) as broker:
        result = run(broker, args)
    emit(result)
    if not args.no_record:
        add_row(result, args.note)
    progress(
        f"{machine_line(result['host'])}: start p50 {result['start_to_outcome']['p50_ms']} ms, "
        f"update p50 {result['update']['p50_ms']} ms ({result['update_p50_vs_start_p50']}x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
