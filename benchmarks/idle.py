"""What an idle engine costs, and how fast it wakes: broker + one processor + one worker with
nothing to do, then the first workflow after the silence.

    .venv/bin/python benchmarks/idle.py [--idle-s 60] [--partitions 8] [--n-busy 100]

One run, a private broker (its CPU is part of the figure; with ``--bootstrap-servers`` the
broker's share is not measured):

1. warm-up: 100 chain3.activities workflows (assignment, restore, JIT of the broker);
2. busy latency: ``--n-busy`` workflows one after the other, start to completion (p50);
3. idle: nothing sent for ``--idle-s`` seconds; the CPU of the broker, the processor and
   the worker over that span, as a share of one core (target: at most 2 % together). The
   benchmark's client stays open, as an application's would: the broker's share includes
   answering its readers, and its own share is reported beside (``client``);
4. wake-up: one workflow started right after the silence, start to completion, as a ratio
   to the busy p50 (target: at most 1.5x). Repeated ``--wakeups`` times, each after its own
   silence of ``--idle-s``; the median is reported.

Every result is checked. Why it matters: an engine that costs a core while nothing happens
is a cost paid on every replica of every deployment, all day.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import harness
from chain3 import MODULE, STEPS, Params, latency_run
from common import CpuSpan, emit, git_commit, host_info, machine_line, progress

from engine.client import Client


def idle_span(eng: harness.Engine, seconds: float) -> dict[str, float]:
    """Share of one core each process used while nothing was sent."""
    progress(f"idle for {seconds:.0f}s")
    with CpuSpan(eng.pids) as cpu:
        time.sleep(seconds)
    eng.check_alive()
    shares = {n: round(s / cpu.wall, 4) for n, s in cpu.process_s.items()}
    shares["engine_total"] = round(sum(shares.values()), 4)
    shares["client"] = round(cpu.client_s / cpu.wall, 4)
    return shares


def wake_up_ms(client: Client, eng: harness.Engine, n: int) -> float:
    """Start to completion of the first workflow after a silence (checked)."""
    t0 = time.perf_counter()
    instance = client.start("chain3.activities", n)
    state = client.wait_for_completion(instance, timeout=120)
    took = (time.perf_counter() - t0) * 1000.0
    if state.output != n + STEPS:
        raise RuntimeError(f"wrong result {state.output!r} for {n}\n{eng.describe()}")
    return took


def run(broker: harness.Broker, args: argparse.Namespace) -> dict[str, Any]:
    params = Params(variant="activities", partitions=args.partitions)
    with (
        harness.engine(broker, "idle", MODULE, args.partitions, with_worker=True) as eng,
        Client(settings=eng.settings, timeout=60) as client,
    ):
        progress("warm-up: 100 chain3.activities")
        latency_run(client, eng, params, 100, "warmup")
        progress(f"busy latency: {args.n_busy} chain3.activities one after the other")
        busy = latency_run(client, eng, params, args.n_busy, "busy")
        idles, wakes = [], []
        for i in range(args.wakeups):
            idles.append(idle_span(eng, args.idle_s))
            wakes.append(wake_up_ms(client, eng, 1000 + i))
            progress(f"wake-up {i + 1}: {wakes[-1]:.1f} ms (busy p50 {busy['p50_ms']:.1f} ms)")
    total = statistics.median(s["engine_total"] for s in idles)
    return {
        "benchmark": "idle",
        "commit": git_commit(),
        "host": host_info(),
        "partitions": args.partitions,
        "idle_s": args.idle_s,
        "broker_measured": broker.pid is not None,
        "idle_core_share": {k: statistics.median(s[k] for s in idles) for k in idles[0]},
        "idle_engine_total_core_share": total,
        "busy_p50_ms": busy["p50_ms"],
        "wake_up_ms": [round(w, 2) for w in wakes],
        "wake_up_vs_busy_p50": round(statistics.median(wakes) / busy["p50_ms"], 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers", help="use this broker instead of a private one")
    parser.add_argument("--idle-s", type=float, default=60.0)
    parser.add_argument("--wakeups", type=int, default=1)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--n-busy", type=int, default=100)
    args = parser.parse_args(argv)
    with harness.kafka(args.bootstrap_servers) as broker:
        result = run(broker, args)
    emit(result)
    host = result["host"]
    progress(f"{machine_line(host)}: idle {result['idle_core_share']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
