"""Restart-to-first-turn: how long a processor replica that crashed and restarted under the
same replica id takes to run a turn again, with and without static group membership.

Per repeat: a replica (``python -m engine run processor``, as deployed) owns every partition
and has run a few workflows; it is SIGKILLed, restarted at once with the same replica id and
state folder, and one ``chain3.inline`` workflow is started. Restart-to-first-turn is the
wall time from spawning the new process to that workflow's completion seen by the client
(one turn: the workflow runs its three inline steps in its first turn). Python's start-up
and the imports are part of it; ``up_s`` is the share until the process logged that it
consumes, ``assigned_s`` until its partitions were restored.

Without static membership the new process is a new member: the coordinator waits for the
dead member's session to time out (10 s) before it can rebalance. With it the new process
takes the dead member's place (same ``group.instance.id``) and its partitions at once.

A second measure, ``handover``: two replicas, one stops cleanly (SIGTERM); the wall time
from the signal until workflows on every partition completed (the other replica must own the
stopped one's partitions). A static member that closes does not leave the group by itself;
the engine leaves explicitly, so this stays short with static membership too.

    .venv/bin/python benchmarks/restart.py [--repeats 3] [--bootstrap-servers HOST:PORT]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import harness
from common import REPO, emit, git_commit, host_info, median, progress

from engine.client import Client
from engine.config.settings import Settings

MODULE = "engine.examples.chain3"
WORKFLOW = "chain3.inline"
UP = "consuming"
ASSIGNED = " restored: "


@dataclass(frozen=True)
class Params:
    repeats: int = 3
    partitions: int = 8
    timeout_s: float = 120.0


def _processor(
    settings: Settings, work_dir: Path, replica_id: str, static: bool, run: int
) -> harness.EngineProcess:
    """``run processor`` for ``replica_id``, its log in a file of its own per start."""
    command = [
        harness.PYTHON, "-m", "engine", "run", "processor",
        "--module", MODULE,
        "--bootstrap-servers", settings.bootstrap_servers,
        "--namespace", settings.namespace,
        "--partitions", str(settings.partitions),
        "--replica-id", replica_id,
        "--state-dir", str(work_dir / "state"),
        "--log-level", "INFO",
    ]  # fmt: skip
    log_path = work_dir / f"{replica_id}-{run}.log"
    log = log_path.open("wb")
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "TURNSTILE_STATIC_MEMBERSHIP": "true" if static else "false",
    }
    popen = subprocess.Popen(
        command, cwd=REPO, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env
    )
    return harness.EngineProcess(f"processor {replica_id}", popen, log_path, log)


def _logged_at(proc: harness.EngineProcess, text: str, timeout: float = 5.0) -> float:
    """The wall-clock time (epoch seconds) of the first log line containing ``text``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in proc.log_path.read_text(errors="replace").splitlines():
            if text in line:
                stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
                return stamp.timestamp()
        proc.check_alive()
        time.sleep(0.01)
    raise RuntimeError(f"{text!r} not logged within {timeout:.0f}s\n{proc.describe()}")


def _run_one(client: Client, value: int, timeout: float) -> None:
    state = client.wait_for_completion(client.start(WORKFLOW, value), timeout=timeout)
    if state.output != value + 3:
        raise AssertionError(f"{state.instance_id}: {state.output!r}, expected {value + 3}")


def restart_runs(broker: harness.Broker, params: Params, static: bool) -> list[dict[str, Any]]:
    """``repeats`` x (SIGKILL the replica, restart it, time its first turn)."""
    namespace = harness.fresh_namespace("restart")
    settings = harness.create_topics(broker.bootstrap, namespace, params.partitions)
    work_dir = Path(tempfile.mkdtemp(prefix="turnstile-bench-restart-"))
    runs: list[dict[str, Any]] = []
    proc = _processor(settings, work_dir, "processor-0", static, 0)
    try:
        with Client(settings=settings, timeout=60) as client:
            for i in range(20):  # every partition assigned, restored and warm
                _run_one(client, i, params.timeout_s)
            for run in range(1, params.repeats + 1):
                proc.popen.send_signal(signal.SIGKILL)
                proc.popen.wait(10)
                started, wall = time.perf_counter(), time.time()
                proc = _processor(settings, work_dir, "processor-0", static, run)
                _run_one(client, 1000 + run, params.timeout_s)
                first_turn = time.perf_counter() - started
                record = {
                    "static": static,
                    "run": run,
                    "first_turn_s": round(first_turn, 3),
                    "up_s": round(_logged_at(proc, UP) - wall, 3),
                    "assigned_s": round(_logged_at(proc, ASSIGNED) - wall, 3),
                }
                emit({"benchmark": "restart", "kind": "restart", **record})
                runs.append(record)
    finally:
        proc.stop()
        shutil.rmtree(work_dir, ignore_errors=True)
    return runs


def handover_run(broker: harness.Broker, params: Params, static: bool) -> dict[str, Any]:
    """Two replicas; SIGTERM one; time until workflows on every partition completed."""
    namespace = harness.fresh_namespace("handover")
    settings = harness.create_topics(broker.bootstrap, namespace, params.partitions)
    work_dir = Path(tempfile.mkdtemp(prefix="turnstile-bench-handover-"))
    procs = [_processor(settings, work_dir, f"processor-{r}", static, 0) for r in (0, 1)]
    try:
        for proc in procs:
            _logged_at(proc, ASSIGNED, params.timeout_s)
        with Client(settings=settings, timeout=60) as client:
            for i in range(20):
                _run_one(client, i, params.timeout_s)
            started = time.perf_counter()
            procs[1].popen.send_signal(signal.SIGTERM)
            ids = {client.start(WORKFLOW, 100 + i): 103 + i for i in range(4 * params.partitions)}
            for instance, expected in ids.items():
                state = client.wait_for_completion(instance, timeout=params.timeout_s)
                if state.output != expected:
                    raise AssertionError(f"{instance}: {state.output!r}, expected {expected}")
            handover = time.perf_counter() - started
    finally:
        for proc in procs:
            proc.stop()
        shutil.rmtree(work_dir, ignore_errors=True)
    record = {"static": static, "handover_s": round(handover, 3)}
    emit({"benchmark": "restart", "kind": "handover", **record})
    return record


def run(broker: harness.Broker, params: Params) -> list[dict[str, Any]]:
    results = []
    for static in (False, True):
        progress(f"restart-to-first-turn, static membership {'on' if static else 'off'}")
        runs = restart_runs(broker, params, static)
        handover = handover_run(broker, params, static)
        result = {
            "benchmark": "restart",
            "static": static,
            "params": asdict(params),
            "host": host_info(),
            "commit": git_commit(),
            "median": {
                "first_turn_s": round(median(r["first_turn_s"] for r in runs), 3),
                "up_s": round(median(r["up_s"] for r in runs), 3),
                "assigned_s": round(median(r["assigned_s"] for r in runs), 3),
                "max_first_turn_s": max(r["first_turn_s"] for r in runs),
                "handover_s": handover["handover_s"],
            },
        }
        emit(result)
        results.append(result)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers", help="use this broker instead of a private one")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--no-results-md", action="store_true", help="do not touch RESULTS.md")
    args = parser.parse_args(argv)
    params = Params(repeats=args.repeats, partitions=args.partitions)
    import results_md

    with harness.kafka(args.bootstrap_servers) as broker:
        for result in run(broker, params):
            if not args.no_results_md:
                results_md.add_restart(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
