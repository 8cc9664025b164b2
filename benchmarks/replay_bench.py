"""Replay throughput of the workflow executor on one core.

Builds two histories with the executor itself (a chain of activities, and a fan-out of
activities whose results arrive one per turn), then replays each many times through a fresh
``WorkflowExecution`` and reports history events per second (median and best run). Also
reports the live path (``step``, results fed one turn at a time, including the cost of making
those results) and single-turn instances of three inline steps. Prints one JSON line per
result.

    python benchmarks/replay_bench.py [--activities 1000] [--seconds 2]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.core.history import (
    ExecutionStarted,
    HistoryEvent,
    Inbound,
    RuntimeStatus,
    TaskCompleted,
)
from engine.core.payloads import from_payload, to_payload
from engine.runtime import Registry, ScheduleActivity, WorkflowContext
from engine.runtime.executor import WorkflowExecution

registry = Registry()
START_MS = 1_700_000_000_000


@registry.workflow
async def chain(ctx: WorkflowContext, n: int) -> int:
    x = 0
    for _ in range(n):
        x = await ctx.call_activity("add_one", x)
    return x


@registry.workflow
async def inline3(ctx: WorkflowContext, x: int) -> int:
    for _ in range(3):
        x = await ctx.run("add_one", _add_one, x)
    return x


def _add_one(x: int) -> int:
    return x + 1


@registry.workflow
async def fan_out(ctx: WorkflowContext, n: int) -> int:
    results = await ctx.when_all([ctx.call_activity("square", i) for i in range(n)])
    return sum(results)


def _activity(task: ScheduleActivity) -> Inbound:
    x = from_payload(task.input)
    value = x + 1 if task.name == "add_one" else x * x
    return Inbound(TaskCompleted(task.task_id, to_payload(value), task.attempt), task.generation)


def run_live(name: str, n: int) -> list[HistoryEvent]:
    """Drive one instance to completion; each activity result is its own turn."""
    execution = WorkflowExecution(registry, f"bench-{name}")
    now = START_MS
    history: list[HistoryEvent] = []
    result = execution.step([Inbound(ExecutionStarted(name, to_payload(n)))], now)
    pending = [a for a in result.actions if isinstance(a, ScheduleActivity)]
    history.extend(result.new_events)
    while pending:
        task = pending.pop(0)
        now += 1
        result = execution.step([_activity(task)], now)
        history.extend(result.new_events)
        pending.extend(a for a in result.actions if isinstance(a, ScheduleActivity))
    assert execution.status is RuntimeStatus.COMPLETED, execution.failure
    return history


def _timings(fn: Callable[[], Any], seconds: float) -> list[float]:
    """Durations of repeated runs of ``fn`` (at least 5, for about ``seconds``)."""
    fn()  # warm-up
    out: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(out) < 5 or time.perf_counter() < deadline:
        started = time.perf_counter()
        fn()
        out.append(time.perf_counter() - started)
    return out


def _line(benchmark: str, workload: str, events: int, runs: list[float]) -> dict[str, Any]:
    median = statistics.median(runs)
    return {
        "benchmark": benchmark,
        "workload": workload,
        "history_events": events,
        "runs": len(runs),
        "median_ms": round(median * 1000, 3),
        "events_per_second": round(events / median),
        "best_events_per_second": round(events / min(runs)),
        "python": platform.python_version(),
    }


def bench(name: str, n: int, seconds: float) -> list[dict[str, Any]]:
    """Replay and live throughput of one workload."""
    history = run_live(name, n)

    def replay() -> None:
        execution = WorkflowExecution(registry, f"bench-{name}")
        execution.replay(history)
        assert execution.status is RuntimeStatus.COMPLETED

    workload = f"{name}_{n}"
    return [
        _line("executor.replay", workload, len(history), _timings(replay, seconds)),
        _line(
            "executor.live", workload, len(history), _timings(lambda: run_live(name, n), seconds)
        ),
    ]


def bench_inline(seconds: float, instances: int = 1000) -> dict[str, Any]:
    """Instances of a three-inline-step workflow, each completing in its one turn."""
    started = [Inbound(ExecutionStarted("inline3", to_payload(1)))]

    def run() -> None:
        for i in range(instances):
            execution = WorkflowExecution(registry, f"inline-{i}")
            assert execution.step(started, START_MS).status is RuntimeStatus.COMPLETED

    line = _line("executor.live", f"inline3_x{instances}", 6 * instances, _timings(run, seconds))
    line["turns_per_second"] = round(line["events_per_second"] / 6)
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--activities", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    for name in ("chain", "fan_out"):
        for line in bench(name, args.activities, args.seconds):
            print(json.dumps(line), flush=True)
    print(json.dumps(bench_inline(args.seconds)), flush=True)


if __name__ == "__main__":
    main()
