"""Cold-load replay, this tree against another checkout, interleaved in one run.

A shared machine's load changes from one minute to the next, so two separate runs cannot be
compared. This script starts one long-lived worker process per variant (``--base DIR``, a
checkout of the commit to compare with, e.g. ``git worktree add /tmp/base main``; and this
tree), then asks them in turn, A B A B ..., to time one round: for each workload (a chain
and a fan-out of 1,000 activities, 3,003 events each) executor only, decode only and
decode + executor (a cold load, decoding the way that variant's processor does). Each time
is process CPU time (events per CPU-second is events/s per core) plus wall time. Medians
of the rounds (and the best round, the least disturbed by other work); ``after / before``
ratios come from the same run. Prints JSON lines; with ``--results-md`` also writes rows
to RESULTS.md.

    .venv/bin/python benchmarks/replay_ab.py --base /tmp/base [--rounds 15]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MEASURES = ("executor", "decode", "decode_replay")


def _worker(root: Path) -> None:
    """One variant: build the workloads with its own code, then time a round per request."""
    sys.path[:0] = [str(root / "benchmarks"), str(root)]
    import replay  # the variant's own: its seal() writes rows as its processor does
    import replay_bench

    from engine import codec
    from engine.runtime.executor import WorkflowExecution

    decode_all = getattr(codec, "decode_histories", None) or (
        lambda rows: [codec.decode_history(row) for row in rows]
    )
    workloads = {}
    for name in replay.WORKLOADS:
        history = replay_bench.run_live(name, 1000)
        workloads[f"{name}_1000"] = (name, history, replay.seal(history))

    def timed(fn: Any) -> list[float]:
        cpu, wall = time.process_time(), time.perf_counter()
        fn()
        return [time.process_time() - cpu, time.perf_counter() - wall]

    for _ in sys.stdin:
        out: dict[str, Any] = {}
        for workload, (name, history, rows) in workloads.items():

            def executor(events: Any = history, name: str = name) -> None:
                WorkflowExecution(replay_bench.registry, f"bench-{name}").replay(events)

            out[workload] = {
                "events": len(rows),
                "executor": timed(executor),
                "decode": timed(lambda rows=rows: decode_all(rows)),
                "decode_replay": timed(lambda rows=rows, ex=executor: ex(decode_all(rows))),
            }
        print(json.dumps(out), flush=True)


def _start(root: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--worker", str(root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=root,
    )


def _ask(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("round\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"the worker for {proc.args[-1]} ended; see its error output above")
    result: dict[str, Any] = json.loads(line)
    return result


def run(base: Path, rounds: int) -> dict[str, Any]:
    variants = {"before": _start(base), "after": _start(ROOT)}
    samples: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    try:
        for _ in range(2):  # warm-up rounds, not counted
            for proc in variants.values():
                _ask(proc)
        for i in range(rounds):
            order = list(variants) if i % 2 == 0 else list(reversed(variants))
            for variant in order:
                samples[variant].append(_ask(variants[variant]))
            print(f"replay_ab: round {i + 1}/{rounds}", file=sys.stderr, flush=True)
    finally:
        for proc in variants.values():
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(timeout=60)
    return _summary(samples, base, rounds)


def _summary(samples: dict[str, list[dict[str, Any]]], base: Path, rounds: int) -> dict[str, Any]:
    from common import git_commit, host_info

    lines = []
    for workload, first in samples["after"][0].items():
        row: dict[str, Any] = {"workload": workload, "history_events": first["events"]}
        for variant, runs in samples.items():
            for measure in MEASURES:
                cpu = statistics.median(r[workload][measure][0] for r in runs)
                wall = statistics.median(r[workload][measure][1] for r in runs)
                best = min(r[workload][measure][0] for r in runs)
                row[f"{variant}_{measure}_cpu_ev_s"] = round(first["events"] / cpu)
                row[f"{variant}_{measure}_best_cpu_ev_s"] = round(first["events"] / best)
                row[f"{variant}_{measure}_wall_ev_s"] = round(first["events"] / wall)
        for measure in MEASURES:
            after, before = row[f"after_{measure}_cpu_ev_s"], row[f"before_{measure}_cpu_ev_s"]
            row[f"{measure}_cpu_ratio"] = round(after / before, 2)
        lines.append(row)
    return {
        "benchmark": "replay_ab",
        "params": {"rounds": rounds, "base": str(base)},
        "base_commit": _commit_of(base),
        "commit": git_commit(),
        "host": host_info(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "workloads": lines,
    }


def _commit_of(root: Path) -> str:
    found = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return found.stdout.strip() or root.name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, help="checkout of the commit to compare with")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--base-commit", help="the base's commit, when it is not a git tree")
    parser.add_argument("--results-md", action="store_true", help="add rows to RESULTS.md")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        _worker(args.worker)
        return 0
    if args.base is None:
        parser.error("--base DIR is required (a checkout of the commit to compare with)")
    result = run(args.base.resolve(), args.rounds)
    if args.base_commit:
        result["base_commit"] = args.base_commit
    print(json.dumps(result), flush=True)
    if args.results_md:
        import results_md

        results_md.add_replay_ab(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
