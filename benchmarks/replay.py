"""Replay throughput as a cold instance pays it: Avro decoding plus the executor, per core.

``replay_bench.py`` measures the executor on in-memory events. A processor that loads a cold
instance does more: it reads the encoded history rows and decodes them
(``engine.codec.decode_histories``, all rows in one call) before replaying. This script runs
replay_bench's measurements (wall clock) and then measures, in process CPU time, executor
only, decode only and decode + executor on the same histories sealed exactly as the processor stores
them (``seal_history``, hash-chained). Everything runs in one thread: events per
CPU-second is events/s per core.

    .venv/bin/python benchmarks/replay.py [--activities 1000] [--seconds 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

import replay_bench
from common import emit, git_commit, host_info, progress

from engine.codec import decode_histories, seal_history
from engine.core.history import HistoryEvent, RuntimeStatus
from engine.runtime.executor import WorkflowExecution

WORKLOADS = ("chain", "fan_out")


def seal(history: list[HistoryEvent]) -> list[bytes]:
    """The history rows as the processor writes them: each event sealed onto the last."""
    rows: list[bytes] = []
    previous = b""
    for event in history:
        sealed, data = seal_history(event, previous)
        previous = sealed.hash
        rows.append(data)
    return rows


def cpu_timings(fn: Callable[[], Any], seconds: float) -> list[float]:
    """Process CPU seconds of repeated runs of ``fn`` (at least 5, for about ``seconds``).

    CPU time, not wall time: on a shared machine another process taking the core would
    otherwise count as slow replay; events per CPU-second is what "per core" means.
    """
    fn()  # warm-up
    out: list[float] = []
    deadline = time.process_time() + seconds
    while len(out) < 5 or time.process_time() < deadline:
        started = time.process_time()
        fn()
        out.append(time.process_time() - started)
    return out


def per_core(name: str, n: int, seconds: float) -> list[dict[str, Any]]:
    """Executor only, decode only, and decode + executor on one workload, in CPU time."""
    history = replay_bench.run_live(name, n)
    rows = seal(history)
    workload = f"{name}_{n}"

    def executor_only() -> None:
        execution = WorkflowExecution(replay_bench.registry, f"bench-{name}")
        execution.replay(history)
        assert execution.status is RuntimeStatus.COMPLETED

    def decode() -> None:
        decode_histories(rows)

    def decode_replay() -> None:
        execution = WorkflowExecution(replay_bench.registry, f"bench-{name}")
        execution.replay(decode_histories(rows))
        assert execution.status is RuntimeStatus.COMPLETED

    lines = []
    for measure, fn in (
        ("executor.replay", executor_only),
        ("codec.decode", decode),
        ("decode+executor.replay", decode_replay),
    ):
        line = replay_bench._line(measure, workload, len(history), cpu_timings(fn, seconds))
        lines.append({**line, "clock": "process_cpu"})
    return lines


def run(activities: int, seconds: float) -> dict[str, Any]:
    """Every line of replay_bench plus the decode variants; a summary per workload."""
    lines: list[dict[str, Any]] = []
    for name in WORKLOADS:
        progress(f"replay: {name}_{activities}")
        lines += [
            {**line, "clock": "wall"} for line in replay_bench.bench(name, activities, seconds)
        ]
        lines += per_core(name, activities, seconds)
    lines.append({**replay_bench.bench_inline(seconds), "clock": "wall"})
    for line in lines:
        emit({"benchmark": "replay", "measure": line["benchmark"], **_without(line, "benchmark")})
    result = {
        "benchmark": "replay",
        "params": {"activities": activities, "seconds": seconds},
        "host": host_info(),
        "commit": git_commit(),
        "lines": lines,
        "workloads": _summary(lines),
    }
    emit({k: v for k, v in result.items() if k != "lines"})
    return result


def _without(line: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in line.items() if k != key}


def _summary(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Median events/s per workload for executor only, decode only, decode + executor."""
    columns = {
        "executor.replay": "executor_events_per_s",
        "codec.decode": "decode_events_per_s",
        "decode+executor.replay": "decode_replay_events_per_s",
    }
    out: dict[str, dict[str, Any]] = {}
    for line in lines:
        column = columns.get(line["benchmark"])
        if column is None or line["clock"] != "process_cpu":
            continue
        row = out.setdefault(
            line["workload"],
            {"workload": line["workload"], "history_events": line["history_events"]},
        )
        row[column] = line["events_per_second"]
        row[column.replace("_events_per_s", "_best_events_per_s")] = line["best_events_per_second"]
    return list(out.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--activities", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--no-results-md", action="store_true", help="do not touch RESULTS.md")
    args = parser.parse_args(argv)
    result = run(args.activities, args.seconds)
    if not args.no_results_md:
        import results_md

        results_md.add_replay(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
