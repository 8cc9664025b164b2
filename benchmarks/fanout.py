"""Fan-out on the engine: one instance starts n activities at once (when_all) and sums them.

Where chain3 measures many small instances, this measures one instance with many tasks in
flight: scheduling a burst of activity tasks in one turn, the worker draining them, and
the processor folding a stream of results into few turns of one growing history.

Wall time = start -> completion seen by the client; activities/s = n / wall. One warm-up
instance (n / 10), then ``repeats`` measured ones; medians reported.

``--per-turn`` measures instead what one turn of a large fan-out costs the processor, at
its start (n activities open) and at its end (a few open): one instance of
``fanout.paced`` schedules n activities (10,000 per turn), a worker runs them one at a
time, and the first and the last ``window`` results are paced so that each arrives in a
turn of its own; gates (files the activities wait for) hold the worker before each window
while the client reads the processor's CPU (/proc) and its turn counter (the metrics
endpoint). Processor CPU ms per turn = CPU used during the window / turns run in it. A
flat fan-out costs the same at both ends; one whose turns look at every open activity
costs ~n times more per turn at its start.

    .venv/bin/python benchmarks/fanout.py [--n 1000] [--bootstrap-servers HOST:PORT]
    .venv/bin/python benchmarks/fanout.py --per-turn [--n 100000] [--bootstrap-servers ...]
"""

from __future__ import annotations

import argparse
import re
import socket
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import harness
from common import CpuSpan, emit, git_commit, host_info, median, proc_cpu_seconds, progress

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


# --- per turn -----------------------------------------------------------------------------


@dataclass(frozen=True)
class PerTurnParams:
    n: int = 100_000
    chunk: int = 10_000
    window: int = 50
    pace_ms: int = 200
    partitions: int = 8
    timeout_s: float = 1800.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _turns(port: int) -> int:
    """The processor's turn counter, from its metrics endpoint."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    found = re.search(r"^turnstile_turns_total ([0-9.e+]+)$", text, re.MULTILINE)
    if found is None:
        raise RuntimeError("the processor's metrics have no turnstile_turns_total")
    return int(float(found.group(1)))


def _until(what: str, condition: Any, eng: harness.Engine, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        eng.check_alive()
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}\n{eng.describe()}")
        time.sleep(0.05)


def _quiet(port: int, eng: harness.Engine, timeout_s: float, for_s: float = 2.0) -> int:
    """Wait until the processor's turn count stops moving (its backlog is done)."""
    last, since = _turns(port), time.monotonic()
    deadline = since + timeout_s
    while time.monotonic() - since < for_s:
        eng.check_alive()
        if time.monotonic() > deadline:
            raise RuntimeError(f"the processor never went quiet\n{eng.describe()}")
        time.sleep(0.1)
        now = _turns(port)
        if now != last:
            last, since = now, time.monotonic()
    return last


def _window(
    gate: Path, turns: int, port: int, pid: int, eng: harness.Engine, timeout_s: float
) -> dict[str, Any]:
    """Open ``gate`` and measure the processor over the next ``turns`` turns."""
    t0, cpu0, wall0 = _turns(port), proc_cpu_seconds(pid), time.perf_counter()
    gate.touch()
    _until(f"{turns} turns after {gate.name}", lambda: _turns(port) >= t0 + turns, eng, timeout_s)
    cpu, ran = proc_cpu_seconds(pid) - cpu0, _turns(port) - t0
    return {
        "turns": ran,
        "wall_s": round(time.perf_counter() - wall0, 3),
        "processor_cpu_s": round(cpu, 3),
        "processor_cpu_ms_per_turn": round(cpu * 1000 / ran, 3),
    }


def per_turn(broker: harness.Broker, params: PerTurnParams) -> dict[str, Any]:
    port, gates = _free_port(), Path(tempfile.mkdtemp(prefix="turnstile-fanout-gates-"))
    paths = {name: gates / name for name in ("start", "middle", "end")}
    spec = {**asdict(params), "gates": {k: str(v) for k, v in paths.items()}}
    with (
        harness.engine(
            broker, "fanout-turns", MODULE, params.partitions, with_worker=True,
            worker_concurrency=1, processor_args=["--metrics-port", str(port)],
        ) as eng,
        Client(settings=eng.settings, timeout=60) as client,
    ):  # fmt: skip
        pid, t0 = eng.pids["processor"], time.perf_counter()
        instance = client.start("fanout.paced", spec)
        progress(f"fanout --per-turn: scheduling {params.n} activities")
        scheduled = lambda: (s := client.get(instance)) is not None and s.custom_status  # noqa: E731
        _until("every activity to be scheduled", scheduled, eng, params.timeout_s)
        _until("the start gate", Path(f"{paths['start']}.reached").exists, eng, params.timeout_s)
        _quiet(port, eng, params.timeout_s)
        progress(f"fanout --per-turn: {params.n} open; {params.window} results, one per turn")
        start = _window(paths["start"], params.window + 1, port, pid, eng, params.timeout_s)
        progress(f"fanout --per-turn: start window {start}; the middle of the fan-out runs")
        paths["middle"].touch()
        _until("the end gate", Path(f"{paths['end']}.reached").exists, eng, params.timeout_s)
        _quiet(port, eng, params.timeout_s)
        end = _window(paths["end"], params.window, port, pid, eng, params.timeout_s)
        progress(f"fanout --per-turn: end window {end}")
        state = client.wait_for_completion(instance, timeout=params.timeout_s)
        wall = time.perf_counter() - t0
    if state.output != params.n * (params.n - 1) // 2:
        raise AssertionError(f"fanout.paced ended {state.status.value} with {state.output!r}")
    ratio = end["processor_cpu_ms_per_turn"] / start["processor_cpu_ms_per_turn"]
    result = {
        "benchmark": "fanout-turns",
        "params": asdict(params),
        "host": host_info(),
        "commit": git_commit(),
        "open_at_start": params.n,
        "open_at_end": params.window + 1,
        "start": start,
        "end": end,
        "start_over_end": round(1 / ratio, 2),
        "wall_s": round(wall, 1),
    }
    emit(result)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-turn", action="store_true", help="measure one turn's work")
    parser.add_argument("--n", type=int, default=None, help="activities (1000; --per-turn 100000)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--worker-concurrency", type=int, default=16)
    parser.add_argument("--bootstrap-servers", help="use this broker instead of a private one")
    parser.add_argument("--no-results-md", action="store_true", help="do not touch RESULTS.md")
    args = parser.parse_args(argv)
    import results_md

    if args.per_turn:
        turn_params = PerTurnParams(n=args.n or PerTurnParams.n, partitions=args.partitions)
        with harness.kafka(args.bootstrap_servers) as broker:
            turn_result = per_turn(broker, turn_params)
        if not args.no_results_md:
            results_md.add_fanout_turns(turn_result)
        return 0
    params = Params(args.n or 1000, args.repeats, args.partitions, args.worker_concurrency)
    with harness.kafka(args.bootstrap_servers) as broker:
        result = run(broker, params)
    if not args.no_results_md:
        results_md.add_fanout(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
