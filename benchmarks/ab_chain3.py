"""Interleaved A/B of chain3 between two checkouts: A, B, A, B... on one broker, one run.

Each round runs ``benchmarks/chain3.py`` of checkout A, then of checkout B (each with its own
engine code, as subprocesses), so load changes on a shared machine hit both alike; ratios
B/A (throughput, p50 and the processor's CPU per workflow in the throughput runs) are taken
per round and their median reported. The 1-minute load average is recorded
next to every run. Rows go to the chain3 results (variant cell: side and load).

    .venv/bin/python benchmarks/ab_chain3.py --a ../main-copy --b . --bootstrap-servers HOST:PORT
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import chain3
from common import progress


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def run_side(repo: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One chain3 run of ``repo``'s code; returns its result line (with medians)."""
    command = [
        sys.executable, str(repo / "benchmarks" / "chain3.py"),
        "--variant", args.variant, "--no-results-md",
        "--bootstrap-servers", args.bootstrap_servers,
        "--n-throughput", str(args.n_throughput), "--n-latency", str(args.n_latency),
        "--repeats", str(args.repeats), "--warmup", str(args.warmup),
        "--partitions", str(args.partitions),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(repo)}
    before = _load()
    done = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"chain3 of {repo} failed:\n{done.stderr[-3000:]}")
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    [result] = [r for r in lines if "median" in r]
    result["load"] = (before, _load())
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", type=Path, required=True, help="checkout A (the baseline)")
    parser.add_argument("--b", type=Path, required=True, help="checkout B (the change)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variant", choices=list(chain3.WORKFLOWS), default="activities")
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--no-results-md", action="store_true", help="do not touch RESULTS.md")
    parser.add_argument("--note", default="", help="added to each row's variant cell")
    chain3.add_arguments(parser)
    args = parser.parse_args(argv)
    import results_md

    ratios: dict[str, list[float]] = {"wf/s": [], "p50": [], "processor CPU/wf": []}
    for round_ in range(args.rounds):
        pair = {}
        for side, repo in (("A", args.a.resolve()), ("B", args.b.resolve())):
            result = run_side(repo, args)
            med, load = result["median"], result["load"]
            progress(
                f"round {round_} {side}: {med['workflows_per_s']} wf/s, p50 {med['p50_ms']} ms "
                f"(load {load[0]} -> {load[1]})"
            )
            pair[side] = med
            if not args.no_results_md:
                note = f", {args.note}" if args.note else ""
                result["variant"] = f"{result['variant']} ({side}), load {load[0]}-{load[1]}{note}"
                results_md.add_chain3(result, peer=None)
        ratios["wf/s"].append(pair["B"]["workflows_per_s"] / pair["A"]["workflows_per_s"])
        ratios["p50"].append(pair["B"]["p50_ms"] / pair["A"]["p50_ms"])
        # CPU per workflow moves less with the machine's load than wf/s does
        cpu = [pair[s]["cpu_ms_per_workflow_throughput"]["processor"] for s in ("A", "B")]
        ratios["processor CPU/wf"].append(cpu[1] / cpu[0])
    summary = {k: round(statistics.median(v), 3) for k, v in ratios.items()}
    print(json.dumps({"benchmark": "ab_chain3", "ratios_b_over_a": ratios, "median": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
